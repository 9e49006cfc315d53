"""The switch agent (`mbalancer switch serve`): this box's data plane driver, served to one controller at a time.

Arbitration is P4Runtime's: a controller opens the Stream with its election id; the highest id an agent has seen
is the primary, the only one whose calls are taken and the only one that gets the events (mirrored writes,
reconnects). A higher id deposes the primary at once (its stream ends with `deposed`, its later calls are refused
by the agent itself, so a controller that lost an election cannot write even if it does not know yet); a lower one
is refused; an equal one from another controller while the primary's stream is open is refused (two controllers
with the same id are a misconfiguration, not a succession). When the primary's stream ends (the controller died or
lost the network), the agent lets its driver go and leaves the lease in the data plane to run out by itself: a
controller that attaches before then (the next leader) reads the switch's hot keys back and adopts them as they are,
and balancing goes on as it went; if none does, every get goes home once it has run out. A controller that stops
(its `close`) ends the lease at once. The agent holds the switch's local ownership lock
(mbalancer/ownership.py) for as long as it serves, so no local controller writes it behind the agent's back.
"""
from __future__ import annotations

import hmac
import logging
import queue
import threading
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any, Iterator

import grpc

from dataplanes import registry
from dataplanes.agent import Settings
from dataplanes.agent.codec import CodecError, dumps, loads
from dataplanes.agent.wire import (ELECTION_KEY, PROTOCOL, PROTOCOL_KEY, SERVICE, SESSION_KEY, TOKEN_KEY, is_loopback,
                                   options, read_token, tls_files)
from dataplanes.driver import Driver, DriverError
from dataplanes.forwarded_driver import answer
from mbalancer.ownership import Ownership
from mbalancer.settings import ConfigError

log = logging.getLogger(__name__)
EVENTS_QUEUED = 65536  # events waiting for a slow controller; past that, mirrors are dropped (their keys stay dirty)
WORKERS = 16  # gRPC threads: each open stream holds one


class AgentError(RuntimeError):
    """The agent cannot start (the port, the ownership lock); the message says why."""


@dataclass
class Session:
    """One controller's open stream."""
    id: str
    election_id: int
    peer: str
    events: queue.Queue = field(default_factory=lambda: queue.Queue(EVENTS_QUEUED))
    dropped: int = 0

    def put(self, event: tuple) -> None:
        try:
            self.events.put_nowait(event)
        except queue.Full:
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 10000 == 0:
                log.warning("controller %s reads events too slowly: %d mirrored writes dropped (their keys stay "
                            "dirty)", self.peer, self.dropped)


class SwitchAgent:
    """Serves the driver of data plane `kind` (its [dataplane.<kind>] settings) as `settings` say."""

    def __init__(self, kind: str, driver_settings: Any, settings: Settings):
        self.kind = registry.get(kind)
        self.driver_settings, self.settings = driver_settings, settings
        self.token = read_token(settings)
        self.cert, self.key, self.ca = tls_files(settings)
        if not is_loopback(settings.listen) and self.token is None and self.ca is None:
            raise ConfigError(f"dataplane.agent.listen: {settings.listen} is reached from other machines: give "
                              f"token_file or tls_ca (anyone who reaches the port would drive the switch)")
        self.driver: Driver = self.kind.make_driver(driver_settings)
        self.attached = self.used = False  # used: attached once (a closed driver is not attached again)
        self.lock = threading.RLock()  # one driver call at a time; arbitration in between
        self.highest = 0  # the highest election id seen
        self.primary: Session | None = None
        self.ownership = Ownership(self.driver.owned_switches(), settings.listen)
        self.server: grpc.Server | None = None
        self.port = 0

    def start(self) -> int:
        """Own the switch and serve; the port served on. AgentError if another controller owns it or the address
        cannot be served."""
        owner = self.ownership.take()
        if owner is not None:
            raise AgentError(owner.describe())
        # no SO_REUSEPORT: a taken port is refused, not shared with the agent already there
        server = grpc.server(futures.ThreadPoolExecutor(WORKERS, thread_name_prefix="mbalancer-agent"),
                             options=options(self.settings) + [("grpc.so_reuseport", 0)])
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {
            "Hello": grpc.unary_unary_rpc_method_handler(self._hello),
            "Call": grpc.unary_unary_rpc_method_handler(self._call),
            "Stream": grpc.unary_stream_rpc_method_handler(self._stream)}),))
        try:
            if self.cert is not None:
                credentials = grpc.ssl_server_credentials([(self.key, self.cert)], root_certificates=self.ca,
                                                          require_client_auth=self.ca is not None)
                self.port = server.add_secure_port(self.settings.listen, credentials)
            else:
                self.port = server.add_insecure_port(self.settings.listen)
        except RuntimeError as err:
            self.port = 0
            log.debug("binding %s: %s", self.settings.listen, err)
        if not self.port:
            self.ownership.release()
            raise AgentError(f"cannot serve on {self.settings.listen} (in use, or not an address of this machine)")
        server.start()
        self.server = server
        log.info("switch agent: serving the %s data plane (%s) on %s, %s", self.kind.name, self.driver.name,
                 self.settings.listen.rpartition(":")[0] + f":{self.port}",
                 "TLS" + (" with client certificates" if self.ca else "") if self.cert else "plain gRPC" +
                 (" with a token" if self.token else " (loopback only)"))
        return self.port

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop(grace=1).wait(5)
        with self.lock:
            if self.attached or not self.used:  # a driver closed already is not closed twice
                self.driver.close()
            self.attached = False
        self.ownership.release()

    # --- the three methods ---------------------------------------------------------------------------------------
    def _hello(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        self._caller(context)
        with self.lock:
            primary = self.primary
            return dumps({"protocol": PROTOCOL, "kind": self.kind.name, "name": self.driver.name,
                          "max_replicas": self.driver.max_replicas, "highest_election_id": self.highest,
                          "primary_election_id": None if primary is None else primary.election_id,
                          "primary": None if primary is None else f"{primary.peer} (election id "
                                                                  f"{primary.election_id})"})

    def _stream(self, request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
        election_id, session_id = self._caller(context)
        session = self._arbitrate(Session(session_id, election_id, context.peer()), context)
        context.add_callback(lambda: session.put(("gone",)))  # cancelled, or the connection broke: end at once
        yield dumps(("primary", election_id))
        try:
            while context.is_active():
                try:
                    event = session.events.get(timeout=0.5)
                except queue.Empty:
                    continue
                if event[0] in ("gone", "closed"):
                    return
                yield dumps(event)
                if event[0] == "deposed":
                    return
        finally:
            self._ended(session)

    def _call(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        election_id, session_id = self._caller(context)
        try:
            message = loads(request)
            method, args = message["method"], message["args"]
            if not isinstance(method, str) or not isinstance(args, tuple):
                raise CodecError("a call is {method: text, args: tuple}")
        except (CodecError, TypeError, KeyError) as err:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"bad call: {err}")
        with self.lock:
            primary = self.primary
            if primary is None or primary.id != session_id:
                context.abort(grpc.StatusCode.PERMISSION_DENIED, self._not_primary(election_id))
            try:
                return dumps({"value": self._run(method, args, primary)})
            except DriverError as err:
                return dumps({"error": str(err)})
            except Exception as err:  # a driver's bug, or arguments of the wrong types: one line, the agent goes on
                log.exception("%s failed", method)
                return dumps({"error": f"{method}: {type(err).__name__}: {err}"})

    # --- inside ----------------------------------------------------------------------------------------------------
    def _caller(self, context: grpc.ServicerContext) -> tuple[int, str]:
        """(election id, session) of a request whose protocol and credentials are right; else the call aborted."""
        metadata = dict(context.invocation_metadata())
        theirs = metadata.get(PROTOCOL_KEY)
        if theirs != str(PROTOCOL):
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          f"the controller speaks agent protocol {theirs or 'none'}, this agent {PROTOCOL}: run the "
                          f"same MBalancer release on both")
        if self.token is not None and not hmac.compare_digest(metadata.get(TOKEN_KEY, "").encode(),
                                                              f"Bearer {self.token}".encode()):
            log.warning("refused %s: no token or a wrong one", context.peer())
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "wrong or missing token (dataplane.agent.token_file)")
        try:
            election_id = int(metadata.get(ELECTION_KEY, ""))
        except ValueError:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "no election id")
        return election_id, metadata.get(SESSION_KEY, "")

    def _arbitrate(self, session: Session, context: grpc.ServicerContext) -> Session:
        with self.lock:
            primary = self.primary
            if session.election_id < self.highest:
                log.info("refused %s: election id %d, below %d", session.peer, session.election_id, self.highest)
                context.abort(grpc.StatusCode.PERMISSION_DENIED, self._not_primary(session.election_id))
            if primary is not None and primary.id != session.id and session.election_id == primary.election_id:
                log.info("refused %s: %s already drives this switch with election id %d", session.peer,
                         primary.peer, primary.election_id)
                context.abort(grpc.StatusCode.ALREADY_EXISTS,
                              f"{primary.peer} drives this switch with election id {primary.election_id}: a second "
                              f"controller needs a higher one (an election), or the first one stopped")
            if primary is None:
                log.info("controller %s (election id %d) is the primary", session.peer, session.election_id)
            else:  # a higher id, or the primary's own session again: the old stream ends (if still served)
                log.info("controller %s (election id %d) %s", session.peer, session.election_id,
                         "opened its stream again" if primary.id == session.id else
                         f"deposes {primary.peer} (election id {primary.election_id})")
                primary.put(("deposed", session.election_id))
            self.primary, self.highest = session, session.election_id
            return session

    def _ended(self, session: Session) -> None:
        with self.lock:
            if self.primary is not session:
                return
            self.primary = None
            log.info("the primary controller %s left: driver let go, its lease left to run out (a controller that "
                     "attaches before then adopts the switch's hot keys as they are)", session.peer)
            self._close_driver(end_lease=False)

    def _run(self, method: str, args: tuple, session: Session) -> Any:
        if method == "attach":  # a new controller: the switch as a fresh driver finds it (its hot keys read back)
            self._close_driver(end_lease=False)
            if self.used:
                self.driver = self.kind.make_driver(self.driver_settings)
            self.used = self.attached = True
        elif method == "close":  # the controller stops: the next one need not wait for its stream to end
            log.info("the primary controller %s stopped: driver closed, lease ended (gets go home until a controller "
                     "attaches)", session.peer)
            self._close_driver()
            self.primary = None
            session.put(("closed",))
            return None
        return answer(self.driver, method, args, lambda frame: self._event(("mirror", frame)),
                      lambda *came_back: self._event(("reconnect", *came_back)))

    def _event(self, event: tuple) -> None:
        primary = self.primary  # read without the lock: a driver's thread must not wait behind a call
        if primary is not None:
            primary.put(event)

    def _close_driver(self, end_lease: bool = True) -> None:
        """Closed (the lease ended: gets go home), or let go with the lease left to run out by itself."""
        if self.attached:
            if end_lease:
                self.driver.close()
            else:
                self.driver.let_go()
            self.attached = False

    def _not_primary(self, election_id: int) -> str:
        primary = self.primary
        who = f"{primary.peer} (election id {primary.election_id})" if primary else "no controller now"
        return (f"election id {election_id} does not drive this switch: the highest seen is {self.highest}, the "
                f"primary {who}")
