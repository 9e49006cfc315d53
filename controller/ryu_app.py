"""MBalancer as a Ryu app: the controller core inside ryu-manager, started the way every Ryu app is.

    mbalancer-ryu-manager --mbalancer-config mbalancer.toml controller/ryu_app.py
    (or: MBALANCER_CONFIG=mbalancer.toml ryu-manager controller/ryu_app.py, on a Python where Ryu runs unpatched)

A thin shim (faucet's way): the core decides and the driver builds the messages; this app only carries them.
- The config's [dataplane] kind picks the driver: `openflow` drives the switches that connect to this ryu-manager
  (dataplanes/openflow/driver.py, through RyuChannel below); any other kind (ebpf, none) is made by the registry
  as `mbalancer controller` makes it, so one controller can run eBPF switches from inside Ryu too. A kind whose
  driver cannot run under eventlet (p4: gRPC blocks in C) runs in a process of its own behind the same interface
  (dataplanes/driver_process.py), started and stopped with the app.
- Monitor reports in and the JSON state out through Ryu's own WSGI server, with the same endpoints, JSON and
  errors as `mbalancer controller` (controller/http_api.py: respond), at the config's controller.listen.
- Decisions go to Ryu's log (the core logs them; ryu-manager's logging prints them).
- With [controller] etcd, this ryu-manager is one candidate of a failover group (controller/ryu_failover.py): it
  leads once elected and the master of every switch (OpenFlow roles, its election id as the generation id); until
  then it is a slave at every switch, and its HTTP API answers 503 (the monitor pushes to the next).
ryu-manager runs everything on eventlet green threads (it monkey-patches threading), so the core's threads and the
driver's blocking waits (barriers, stats) are green too and never stall the OpenFlow event loop for long.
"""
from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path

from controller.ryu_manager import end_ryu_manager, patch_eventlet, register_options

patch_eventlet()

import eventlet  # noqa: E402
from ryu import cfg  # noqa: E402  (after the patch: ryu imports eventlet.wsgi.ALREADY_HANDLED)
from ryu.app.ofctl import exception as ofctl_errors  # noqa: E402  (the errors its api raises)
from ryu.app.ofctl import api as ofctl  # noqa: E402
from ryu.app.wsgi import ControllerBase, Response, WSGIApplication  # noqa: E402
from ryu.base import app_manager  # noqa: E402
from ryu.controller import ofp_event  # noqa: E402
from ryu.controller.handler import DEAD_DISPATCHER, MAIN_DISPATCHER, set_ev_cls  # noqa: E402
from ryu.ofproto import ofproto_v1_5, ofproto_v1_5_parser  # noqa: E402

from controller.core import ControllerCore  # noqa: E402
from controller.ryu_failover import Failover, RoleRefused, error_name, identity  # noqa: E402
from dataplanes.driver import DriverError  # noqa: E402
from dataplanes.driver_process import DriverProcess  # noqa: E402
from dataplanes.openflow.driver import OpenflowDriver  # noqa: E402
from dataplanes.openflow.messages import refusals, role_request  # noqa: E402
from controller.http_api import ENDPOINTS, JSON, encode, respond  # noqa: E402
from mbalancer.ownership import Ownership, OwnershipError  # noqa: E402
from dataplanes import registry  # noqa: E402
from dataplanes.openflow import Settings as OpenflowSettings  # noqa: E402
from controller.access import access_for  # noqa: E402
from mbalancer.config import ConfigError, load_config  # noqa: E402
from mbalancer.memcache.hashing import TableHash  # noqa: E402
from mbalancer.memcache.addresses import parse_server  # noqa: E402

app_manager.require_app("ryu.app.ofctl.service")  # barriers and stats requests with their replies
log = logging.getLogger("mbalancer.ryu")
CONF = cfg.CONF
REPLY_TIMEOUT = 5.0  # seconds a switch may take to answer a message (its barrier) or a stats request
register_options()  # in a Ryu config file; mbalancer-ryu-manager has them on its command line too


class RyuChannel:
    """The OpenFlow driver's way to its switches (dataplanes/openflow/driver.py: Channel) over Ryu: each message
    through Ryu's ofctl service, which follows it with a barrier and returns the switch's error for it, if any.
    Also the failover group's (controller/ryu_failover.py: Switches): in a group the driver writes only the switches
    where this controller's master role was accepted (`drive`), of all those connected (`links`)."""

    def __init__(self, app: "MBalancerApp"):
        self.app = app
        self.datapaths: dict[int, object] = {}  # the switches the driver writes
        self.links: dict[int, object] = {}  # every switch connected

    def switches(self) -> list:
        return list(self.datapaths.values())

    def connected(self) -> list:
        return list(self.links.values())

    def drive(self, dp) -> None:
        if self.links.get(dp.id) is dp:
            self.datapaths[dp.id] = dp
            if isinstance(self.app.driver, OpenflowDriver):
                self.app.driver.switch_connected(dp)

    def ask_role(self, dp, role: int, generation_id: int) -> tuple[int, int]:
        reply = self._call(dp, role_request(dp, role, generation_id), ofproto_v1_5_parser.OFPRoleReply, False,
                           "role request")
        return reply.role, reply.generation_id

    def send(self, dp, messages) -> None:
        """Every message on its way before the first answer is awaited (each followed by its barrier, in order), so
        the switch applies a batch back to back: a batch that empties the tables and fills them again (a switch that
        connects, a new leader taking over under load) leaves no gap of round trips in which packets find no rule
        (one reply in a run was lost in that gap). The first refusal is raised."""
        calls = [eventlet.spawn(self._refusal, dp, message) for message in messages]
        refused = [err for err in (call.wait() for call in calls) if err is not None]
        if refused:
            raise refused[0]

    def _refusal(self, dp, message) -> DriverError | None:
        """One message of a batch sent; its refusal returned, not raised: eventlet's hub prints a traceback for every
        green thread that ends in an exception, even one its waiter catches (a deposed leader's batch did)."""
        try:
            self._call(dp, message, None, False, "message")
        except DriverError as err:
            return err
        return None

    def ask(self, dp, request) -> list:
        return self._call(dp, request, _reply_class(request), True, "stats request") or []

    def close(self) -> None:
        """The connections are Ryu's: they stay with ryu-manager."""

    def _call(self, dp, message, reply_cls, multi: bool, what: str):
        deadline = time.monotonic() + REPLY_TIMEOUT
        while True:
            try:
                with eventlet.Timeout(max(0.01, deadline - time.monotonic())):
                    return ofctl.send_msg(self.app, message, reply_cls=reply_cls, reply_multi=multi)
            except eventlet.Timeout:
                raise DriverError(f"switch {dp.id:016x} did not answer a {what} within {REPLY_TIMEOUT:.0f} s") \
                    from None
            except ofctl_errors.OFError as err:
                refused = RoleRefused if what == "role request" else DriverError
                raise refused(f"switch {dp.id:016x} refused a {what}: {_error_text(err)}") from None
            except ofctl_errors.InvalidDatapath:
                # just connected: Ryu's ofctl service may see the connection a moment after this app does
                if dp.id not in self.links or time.monotonic() > deadline:
                    raise DriverError(f"switch {dp.id:016x} is not connected") from None
                eventlet.sleep(0.05)


class MBalancerApp(app_manager.RyuApp):
    OFP_VERSIONS = [ofproto_v1_5.OFP_VERSION]  # select groups with a selection method, per-bucket weights
    _CONTEXTS = {"wsgi": WSGIApplication}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if not CONF.mbalancer_config:
            raise SystemExit("mbalancer: give --mbalancer-config FILE (or MBALANCER_CONFIG)")
        try:
            self.config = load_config(CONF.mbalancer_config)
        except ConfigError as err:
            raise SystemExit(f"mbalancer: --mbalancer-config: {err}") from None
        self.channel = RyuChannel(self)
        key_hash = self._homes()
        self.driver = self._make_driver()
        self.ownership = Ownership(self.driver.owned_switches(), self.config.controller.listen)
        self.stopping = threading.Event()
        self.core_started = False
        self.failover = self._failover_group()  # None: no etcd, this one drives alone
        if self.failover is None:
            try:
                owner = self.ownership.take()
            except OwnershipError as err:
                raise SystemExit(f"mbalancer: {err}") from None
            if owner is not None:  # one controller per switch; a failover group elects one through etcd
                raise SystemExit(f"mbalancer: {owner.describe()}: stop it first, or give both [controller] etcd")
        try:
            self.core = ControllerCore(self.config, self.driver, key_hash)
        except ValueError as err:  # e.g. a skewed hash without --mbalancer-homes
            raise SystemExit(f"mbalancer: balancing.hash: {err} (give --mbalancer-homes)") from None
        try:  # the same credentials as `mbalancer controller` (controller/access.py); Ryu's WSGI server has no TLS
            access = access_for(self.config.controller, self.config.controller.listen)
        except ConfigError as err:
            raise SystemExit(f"mbalancer: {err}") from None
        if access.tls:
            raise SystemExit("mbalancer: controller.tls_cert: the Ryu app's HTTP server (Ryu's WSGI) serves no "
                             "HTTPS: give token_file instead, or run `mbalancer controller`")
        # Both read when ryu-manager starts its servers, after the apps are made: one config says where.
        host, port = parse_server(self.config.controller.listen)
        CONF.set_override("wsapi_host", host)
        CONF.set_override("wsapi_port", port)
        if isinstance(self.driver, OpenflowDriver):
            host, port = parse_server(self.driver.settings.listen)
            CONF.set_override("ofp_listen_host", host)
            CONF.set_override("ofp_tcp_listen_port", port)
        kwargs["wsgi"].register(StateApi, {"core": self.core, "access": access, "failover": self.failover})

    def _failover_group(self) -> Failover | None:
        """With [controller] etcd: this ryu-manager as a candidate of the group (the election of `mbalancer
        controller`, controller/election.py)."""
        settings = self.config.controller
        if not settings.etcd:
            return None
        if not isinstance(self.driver, OpenflowDriver):
            raise SystemExit("mbalancer: controller.etcd: a Ryu app fails over on OpenFlow switches only (their "
                             "roles refuse a deposed leader); run `mbalancer controller` for the "
                             f"{self.config.dataplane.kind} data plane")
        from controller.election import Election, ElectionError, etcd_login
        me = identity(os.getpid(), settings.listen, self.driver.settings.listen)
        try:
            login = etcd_login(settings)
        except ElectionError as err:
            raise SystemExit(f"mbalancer: {err}") from None
        try:
            election = Election(settings.etcd, settings.election_key, settings.election_ttl, me, None,
                                (settings.etcd_ca, settings.etcd_cert, settings.etcd_key), login)
        except ElectionError as err:
            raise SystemExit(f"mbalancer: controller.etcd: {err}") from None
        return Failover(election, self.ownership, self.channel, self.core_start, end_ryu_manager)

    def _homes(self) -> TableHash | None:
        """The key table of --mbalancer-homes, if given."""
        if not CONF.mbalancer_homes:
            return None
        try:
            table = json.loads(Path(CONF.mbalancer_homes).read_text())
            return TableHash(self.config.balancing.hash, [s.address for s in self.config.servers],
                             {k.encode("latin-1"): int(v) for k, v in table.items()})
        except (OSError, ValueError, AttributeError) as err:
            raise SystemExit(f"mbalancer: --mbalancer-homes: {err}") from None

    def _make_driver(self):
        dataplane = self.config.dataplane
        try:
            if dataplane.kind == "openflow":
                return OpenflowDriver(dataplane.settings or OpenflowSettings(), self.channel)
            if (why := registry.get(dataplane.kind).ryu_process) is not None:
                log.info("mbalancer: the %s driver runs in a process of its own: %s", dataplane.kind, why)
                return DriverProcess(dataplane.kind, dataplane.settings)
            return registry.get(dataplane.kind).make_driver(dataplane.settings)
        except (DriverError, ConfigError) as err:
            raise SystemExit(f"mbalancer: data plane {dataplane.kind}: {err}") from None

    def start(self):
        thread = super().start()
        if self.failover is not None:  # the core starts once this one leads
            eventlet.spawn(self.failover.run, self.stopping)
            return thread
        try:
            self.core_start()
        except DriverError as err:
            raise SystemExit(f"mbalancer: data plane {self.config.dataplane.kind}: {err}") from None
        return thread

    def core_start(self) -> None:
        self.core.start()
        self.core_started = True
        log.info("mbalancer: controller core running (driver %s); state at http://%s/state",
                 self.driver.name, self.config.controller.listen)

    def stop(self):
        self.stopping.set()
        if self.core_started:
            self.core.stop(end_lease=not (self.failover is not None and self.failover.lets_lease_run))
        if self.failover is not None:
            self.failover.election.resign()  # the next candidate need not wait for the lease
        self.ownership.release()
        super().stop()

    @set_ev_cls(ofp_event.EventOFPStateChange, [MAIN_DISPATCHER, DEAD_DISPATCHER])
    def _state_change(self, ev):
        dp = ev.datapath
        if ev.state == MAIN_DISPATCHER:
            self.channel.links[dp.id] = dp
            log.info("mbalancer: switch %016x connected", dp.id)
            if self.failover is not None:  # slave, or master before it is driven (off the event loop: it waits)
                eventlet.spawn(self.failover.connected, dp)
            elif isinstance(self.driver, OpenflowDriver):
                eventlet.spawn(self.channel.drive, dp)
        elif self.channel.links.get(dp.id) is dp:
            del self.channel.links[dp.id]
            self.channel.datapaths.pop(dp.id, None)
            log.warning("mbalancer: switch %016x disconnected", dp.id)

    @set_ev_cls(ofp_event.EventOFPRoleStatus, MAIN_DISPATCHER)
    def _role_status(self, ev):
        if self.failover is not None:
            eventlet.spawn(self.failover.demoted, ev.msg.datapath, ev.msg.role, ev.msg.generation_id)

    @set_ev_cls(ofp_event.EventOFPPacketIn, MAIN_DISPATCHER)
    def _packet_in(self, ev):
        if isinstance(self.driver, OpenflowDriver):
            self.driver.packet_in(bytes(ev.msg.data))


class StateApi(ControllerBase):
    """The HTTP API on Ryu's WSGI server: every path and method goes to controller/http_api.py's respond."""

    def __init__(self, req, link, data, **config):
        super().__init__(req, link, data, **config)
        self.core, self.access, self.failover = data["core"], data["access"], data["failover"]


def _answer(self, req, **_):
    if self.failover is not None and not self.failover.leading:  # a candidate: the monitor pushes to the next
        return Response(status=503, body=encode({"error": f"this ryu-manager does not lead "
                                                          f"({self.failover.standing.value}): ask the leader"}),
                        content_type=JSON, charset=None)
    reply = respond(self.core, req.method, req.path, req.headers.get("Content-Length", ""),
                    lambda n: req.body_file.read(n), req.remote_addr or "?", req.headers.get("Authorization", ""),
                    self.access)
    if reply is None:
        return Response(status=400)
    status, body, headers = reply
    response = Response(status=status, body=body if isinstance(body, bytes) else encode(body),
                        content_type=JSON, charset=None)
    response.headers.update(headers)  # after: webob's headers= would replace the Content-Type
    return response


def _routes() -> None:
    """Every endpoint, and every other path, to _answer (so wrong methods and paths get the same 404/405)."""
    mapper_paths = sorted({route.split()[1] for route in ENDPOINTS})
    for index, path in enumerate(mapper_paths + ["/{anything:.*}"]):
        name = f"route{index}"
        setattr(StateApi, name, _route(path, name))


def _route(path: str, name: str):
    from ryu.app.wsgi import route

    @route("mbalancer", path)
    def handler(self, req, **kwargs):
        return _answer(self, req, **kwargs)
    handler.__name__ = name
    return handler


def _error_text(err) -> str:
    """The switch's errors, as the driver quotes them, with OpenFlow's name for a role's refusal."""
    errors = [m for m in (err.result or []) if hasattr(m, "code")]
    names = [name for m in errors if (name := error_name(m.type, m.code))]
    return (refusals(errors) + "".join(f" ({name})" for name in names)) or str(err)


def _reply_class(request):
    return {ofproto_v1_5_parser.OFPGroupStatsRequest: ofproto_v1_5_parser.OFPGroupStatsReply,
            ofproto_v1_5_parser.OFPGroupDescStatsRequest: ofproto_v1_5_parser.OFPGroupDescStatsReply,
            ofproto_v1_5_parser.OFPFlowDescStatsRequest: ofproto_v1_5_parser.OFPFlowDescStatsReply}[type(request)]


_routes()
