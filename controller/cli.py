"""`mbalancer controller`: run the controller core with a driver and its HTTP interface until Ctrl-C.

The data plane is the config's [dataplane] section (kind and its settings), or --driver for the kind. One
controller drives a switch (mbalancer/ownership.py): a second one is refused, naming the owner, or with --standby
waits and takes over the moment the owner stops. With [controller] etcd, controllers on any machines elect one
leader first (controller/election.py) and the others wait as candidates. Exit 2 for a bad config (the message names
the field), a data plane that cannot be driven here, a switch another controller drives, an address that cannot be
bound, or an etcd that cannot be reached; exit 1 for a leader that lost the lead.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import replace
from typing import Callable

from controller.access import Access, access_for, reader_access
from controller.core import ControllerCore
from controller.http_api import HttpServer, serve, start_serving
from mbalancer.ownership import Ownership, OwnershipError
from dataplanes import registry
from dataplanes.driver import DriverError
from mbalancer.config import ConfigError, config_option, host_port
from mbalancer.processes import stop_on_signals

Fail = Callable[[str], None]


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "controller", help="decide hot keys, replicate them and program the data plane",
        description="Take monitor reports (POST /report), choose the hot keys, copy them to their groups, install "
                    "the rules through a driver, keep the copies coherent; state as JSON at GET /state.")
    parser.add_argument("--config", required=True, help="TOML config (see mbalancer/mbalancer.example.toml)")
    parser.add_argument("--driver", choices=registry.names("driver", aliases=True),
                        help="the data plane to drive, overriding the config's dataplane.kind: ebpf = the eBPF "
                             "switches of [dataplane.ebpf] (default: every one loaded on this machine); p4 (or "
                             "p4runtime) = bmv2 switches over P4Runtime; none = decide and replicate without a switch "
                             "(the config's default)")
    parser.add_argument("--switch", help="the switches to drive, comma-separated, overriding the data plane's "
                                         "`switches` setting: HOST:PORT of P4Runtime servers for p4, switch names "
                                         "for ebpf")
    parser.add_argument("--listen", help="host:port for HTTP, overriding the config's controller.listen")
    parser.add_argument("--duration", type=float, help="stop after this many seconds (default: until Ctrl-C)")
    parser.add_argument("--standby", action="store_true",
                        help="if another controller drives the switch, wait and take over the moment it stops "
                             "(without it: exit 2 naming that controller)")
    parser.set_defaults(run=_run_controller, fail=parser.error)


def _run_controller(args: argparse.Namespace, fail: Fail) -> int:
    config = config_option(args.config, fail)
    if args.driver:
        try:
            config = replace(config, dataplane=config.dataplane.choose(args.driver))
        except ConfigError as err:
            fail(f"--driver: {err}")
    if args.switch:
        config = replace(config, dataplane=_with_switches(config.dataplane, args.switch, fail))
    listen = args.listen or config.controller.listen
    try:
        host_port("--listen", listen)
        access = access_for(config.controller, listen)
    except ConfigError as err:
        fail(str(err))
    stop = stop_on_signals()
    election = None
    if config.controller.etcd:
        election = _elect(config, listen, stop, fail)
        if election is None:
            return 0  # stopped while a candidate
        config = replace(config, dataplane=_with_election_id(config.dataplane, election.election_id))
    try:
        driver = registry.get(config.dataplane.kind).make_driver(config.dataplane.settings)
    except (DriverError, ConfigError) as err:
        _resign(election)
        fail(f"{_driver_source(args, config)}: {err}")
    try:
        core = ControllerCore(config, driver)
    except ValueError as err:  # e.g. a skewed hash, which needs the workload's keys
        _resign(election)
        fail(f"balancing.hash: {err}")
    ownership = Ownership(driver.owned_switches(), listen)
    if not _own(ownership, args.standby, stop, fail):
        return 0  # stopped while a standby
    servers = _bind(core, listen, access, config.controller.metrics_listen, fail)
    try:
        core.start()
    except DriverError as err:
        for server in servers:
            server.shutdown()
        _resign(election)
        fail(f"{_driver_source(args, config)}: {err}")
    for server in servers:
        start_serving(server)
    _say_serving(servers, access, config.dataplane.kind)
    lost = _wait(stop, election, args.duration)
    if stop.is_set():
        print("mbalancer controller: stopping on a signal: the switches' lease ends, every get goes home",
              file=sys.stderr, flush=True)
    core.stop()  # first: a leader that lost stops driving before etcd could elect another (the servers take ~1 s)
    for server in servers:
        server.shutdown()
    _resign(election)
    if lost:
        print(f"mbalancer controller: lost the lead ({election.why_lost}): stopped; the switches refuse its writes "
              f"once the next leader reaches them", file=sys.stderr, flush=True)
        return 1
    return 0


def _bind(core: ControllerCore, listen: str, access: Access, metrics_listen: str, fail: Fail) -> list[HttpServer]:
    """The API on `listen` with its credentials, and the read-only one on metrics_listen if given; fail() if an
    address cannot be bound."""
    servers: list[HttpServer] = []
    for option, where, guard, read_only in (("--listen", listen, access, False),
                                            ("controller.metrics_listen", metrics_listen, reader_access(access), True)):
        if not where:
            continue
        try:
            servers.append(serve(core, tuple(host_port(option, where)), access=guard, read_only=read_only))
        except (OSError, ConfigError) as err:
            for server in servers:
                server.shutdown()
            fail(f"{option}: cannot serve on {where}: {err}")
    return servers


def _say_serving(servers: list[HttpServer], access: Access, driver: str) -> None:
    """The line saying where the API serves, how it is guarded, and where reads need no credentials."""
    main, *reads = servers
    host, port = main.server_address[:2]
    url = f"{main.scheme}://{host}:{port}"
    print(f"mbalancer controller: {url}/state, reports to {url}/report, {access.describe()} (driver {driver})"
          + "".join(f"; read-only, no credentials: http://{r.server_address[0]}:{r.server_address[1]}/metrics"
                    for r in reads) + "; Ctrl-C stops", file=sys.stderr, flush=True)


def _driver_source(args: argparse.Namespace, config) -> str:
    """Where the data plane was named: the option, or the config's [dataplane] kind."""
    kind = config.dataplane.kind
    return f"--driver {kind}" if args.driver else f'[dataplane] kind = "{kind}" ({args.config})'


def _elect(config, listen: str, stop, fail: Fail):
    """Lead through etcd, waiting as a candidate while another leads; None if stopped first."""
    from controller.election import Election, ElectionError
    settings = config.controller
    try:
        kind = registry.get(config.dataplane.kind)
        reach = kind.reach_probe(config.dataplane.settings or kind.parse_settings(None))
        election = Election(settings.etcd, settings.election_key, settings.election_ttl,
                            f"controller pid {os.getpid()} (http://{listen})", reach,
                            (settings.etcd_ca, settings.etcd_cert, settings.etcd_key), _etcd_login(settings, fail))
        leader = election.leader()
        if leader is not None:
            print(f"mbalancer controller: standby: {leader} leads ({settings.election_key} in etcd); taking over "
                  f"when it stops", file=sys.stderr, flush=True)
        if election.campaign(stop) is None:
            return None
    except ElectionError as err:
        fail(f"controller.etcd: {err}")
    print(f"mbalancer controller: elected through etcd, election id {election.election_id}", file=sys.stderr,
          flush=True)
    return election


def _etcd_login(settings, fail: Fail) -> tuple[str, str] | None:
    """(etcd_user, its password), None without a user; fail() in one line if the password cannot be read."""
    from controller.election import ElectionError, etcd_login
    try:
        return etcd_login(settings)
    except ElectionError as err:
        fail(str(err))


def _with_election_id(dataplane, election_id: int):
    """The data plane with the elected id where its switches check one: a switch agent's arbitration, P4Runtime's
    (above every id of a controller that ran no election)."""
    if dataplane.kind not in ("agent", "p4"):
        return dataplane
    settings = dataplane.settings or registry.get(dataplane.kind).parse_settings(None)
    if dataplane.kind == "p4":
        from dataplanes.p4.client import elected_election_id  # (grpc: only when driving P4)
        election_id = elected_election_id(election_id)
    return dataplane.with_settings(replace(settings, election_id=election_id))


def _wait(stop, election, duration: float | None) -> bool:
    """Until stopped, the duration is over, or the lead is lost (True)."""
    if election is None:
        stop.wait(duration)
        return False
    deadline = None if duration is None else time.monotonic() + duration
    while not stop.wait(0.05):
        if election.lost.is_set():
            return True
        if deadline is not None and time.monotonic() >= deadline:
            break
    return False


def _resign(election) -> None:
    if election is not None:
        election.resign()


def _own(ownership: Ownership, standby: bool, stop, fail: Fail) -> bool:
    """Take the switches, or wait for them as a standby; False if stopped while waiting."""
    try:
        owner = ownership.take()
    except OwnershipError as err:
        fail(str(err))
    if owner is None:
        return True
    if not standby:
        fail(f"{owner.describe()}: stop it first, or start this one with --standby to take over when it stops")
    print(f"mbalancer controller: standby: {owner.describe()}; taking over the moment it stops", file=sys.stderr,
          flush=True)
    try:
        waited = ownership.wait_take(stop)
    except OwnershipError as err:
        fail(str(err))
    if waited is not None:
        return False
    now = time.time()
    print(f"mbalancer controller: taking over at {time.strftime('%H:%M:%S', time.localtime(now))}"
          f".{int(now * 1000) % 1000:03d}: controller pid {owner.pid} stopped "
          f"driving {', '.join(ownership.switches)}", file=sys.stderr, flush=True)
    return True


def _with_switches(dataplane, switch: str, fail: Fail):
    kind = registry.get(dataplane.kind)
    settings = dataplane.settings or kind.parse_settings(None)
    if settings is None or not hasattr(settings, "switches"):
        fail(f"--switch: the {kind.name} data plane takes no switches")
    switches = tuple(s.strip() for s in switch.split(",") if s.strip())
    if not switches:
        fail("--switch: give at least one switch")
    return dataplane.with_settings(replace(settings, switches=switches))
