"""The controller's driver for a switch agent (`[dataplane] kind = "agent"`): every call of the driver interface
sent to the agent, the agent's events (mirrored writes, reconnects) read from its stream by one thread.

The stream is also the arbitration: attach opens it with the config's election id and fails in one line when the
agent refuses (a newer or an equal controller drives it). An agent that goes away (restarted, the network cut) is
tried again every RETRY seconds; once back it is attached anew, and what the fresh driver there reads back goes to
the core as a new leader's attach hands it over: adopted (controller/adoption.py: what is intact is kept as it is,
nothing written), the keys the switch no longer holds installed again. A deposed controller is not retried: its
calls keep failing, in the agent's words.
"""
from __future__ import annotations

import logging
import threading
import uuid
from typing import Any, Iterator, Sequence

import grpc

from dataplanes.agent import Settings
from dataplanes.agent.codec import CodecError, dumps, loads
from dataplanes.agent.wire import (CALL, ELECTION_KEY, HELLO, PROTOCOL, PROTOCOL_KEY, SESSION_KEY, STREAM, TOKEN_KEY,
                                   options, read_token, tls_files)
from dataplanes.driver import DriverError, FoundKey, MirrorHandler, ReconnectHandler
from dataplanes.forwarded_driver import ForwardedDriver
from mbalancer.settings import ConfigError, Server

log = logging.getLogger(__name__)
REFUSED = (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.ALREADY_EXISTS)  # the agent's arbitration said no
RETRY = 0.5  # seconds between tries to reach an agent that went away


class Refused(DriverError):
    """The agent takes another controller's calls (a higher election id, or the same one from elsewhere)."""


class AgentDriver(ForwardedDriver):
    def __init__(self, settings: Settings):
        self.settings = settings
        self.where = f"switch agent {settings.address}"
        self.channel, self.metadata = _connect(settings, settings.election_id)
        self._closing = threading.Event()
        self._deposed: str | None = None
        self._stream: Any = None
        self._servers: tuple[Server, ...] = ()
        try:
            hello = self._unary(HELLO, b"{}", "hello")
        except DriverError:
            self.channel.close()
            raise
        if settings.kind and hello["kind"] != settings.kind:
            self.channel.close()
            raise DriverError(f"{self.where} runs the {hello['kind']} data plane, not {settings.kind} "
                              f"(dataplane.agent.kind)")
        self.kind, self.name, self.max_replicas = hello["kind"], hello["name"], hello["max_replicas"]
        log.info("%s: the %s data plane (protocol %d; primary now: %s)", self.where, self.kind, hello["protocol"],
                 hello["primary"] or "none")

    def attach(self, servers: Sequence[Server], on_mirror: MirrorHandler,
               on_reconnect: ReconnectHandler | None = None) -> list[FoundKey]:
        self.on_mirror, self.on_reconnect, self._servers = on_mirror, on_reconnect, tuple(servers)
        events = self._open_stream()
        threading.Thread(target=self._read, args=(events,), name="mbalancer-agent-events", daemon=True).start()
        return self._call("attach", (self._servers,))

    def owned_switches(self) -> list[str]:
        return []  # the agent holds its switch's lock, and arbitrates between controllers by election id

    def close(self) -> None:
        if self._closing.is_set():
            return
        try:
            if self._stream is not None and self._deposed is None:
                self._call("close", ())
        except DriverError as err:
            log.info("closing: %s", err)
        finally:
            self._closing.set()
            if self._stream is not None:
                self._stream.cancel()
            self.channel.close()

    # --- inside ----------------------------------------------------------------------------------------------------
    def _call(self, method: str, args: tuple) -> Any:
        if self._deposed is not None:
            raise DriverError(f"{self.where}: {self._deposed}")
        answer = self._unary(CALL, dumps({"method": method, "args": args}), method)
        if "error" in answer:
            raise DriverError(answer["error"])
        return answer["value"]

    def _unary(self, path: str, request: bytes, what: str) -> Any:
        try:
            reply = self.channel.unary_unary(path)(request, metadata=self.metadata, timeout=self.settings.timeout)
            return loads(reply)
        except grpc.RpcError as err:
            raise DriverError(f"{self.where}: {what}: {_said(err)}") from None
        except CodecError as err:
            raise DriverError(f"{self.where}: {what}: {err}") from None

    def _open_stream(self) -> Iterator[bytes]:
        """The agent's event stream, once it has made this controller the primary; DriverError with why not."""
        stream = self.channel.unary_stream(STREAM)(b"{}", metadata=self.metadata)
        try:
            first = loads(next(stream))
        except grpc.RpcError as err:
            raise (Refused if err.code() in REFUSED else DriverError)(f"{self.where}: {_said(err)}") from None
        except (StopIteration, CodecError):
            raise DriverError(f"{self.where}: the event stream ended before it began") from None
        if first != ("primary", self.settings.election_id):
            stream.cancel()
            raise DriverError(f"{self.where}: the event stream began with {first!r}")
        self._stream = stream
        return stream

    def _read(self, events: Iterator[bytes]) -> None:
        while not self._closing.is_set():
            self._deliver(events)
            if self._closing.is_set() or self._deposed is not None:
                return
            log.warning("%s: the event stream ended; reaching it again every %g s", self.where, RETRY)
            events = self._come_back()
            if events is None:
                return

    def _deliver(self, events: Iterator[bytes]) -> None:
        try:
            for data in events:
                event = loads(data)
                if event[0] == "mirror" and self.on_mirror is not None:
                    self.on_mirror(event[1])
                elif event[0] == "reconnect" and self.on_reconnect is not None:
                    self.on_reconnect()
                elif event[0] == "deposed":
                    self._deposed = f"deposed by a controller with election id {event[1]}: calls refused"
                    log.error("%s: %s", self.where, self._deposed)
                    return
        except grpc.RpcError as err:
            if not self._closing.is_set():
                log.warning("%s: %s", self.where, _said(err))
        except CodecError as err:
            log.error("%s: an event that is not one (%s): the stream is read again", self.where, err)

    def _come_back(self) -> Iterator[bytes] | None:
        """The stream again, the agent attached again and the core handed what it read back (to adopt; the keys it
        lost installed again); None if closed."""
        while not self._closing.wait(RETRY):
            try:
                events = self._open_stream()
                found = self._call("attach", (self._servers,))
            except Refused as err:
                self._deposed = str(err)
                log.error("%s", err)
                return None
            except DriverError as err:
                log.debug("%s", err)
                continue
            log.info("%s: back, holding %d hot keys: adopted, the others installed again", self.where, len(found))
            if self.on_reconnect is not None:
                self.on_reconnect(found, None)
            return events
        return None


def _connect(settings: Settings, election_id: int) -> tuple[grpc.Channel, tuple]:
    """A channel to settings.address (TLS when configured) and the metadata every request carries."""
    token = read_token(settings)
    cert, key, ca = tls_files(settings)
    metadata = ((PROTOCOL_KEY, str(PROTOCOL)), (ELECTION_KEY, str(election_id)),
                (SESSION_KEY, uuid.uuid4().hex)) + (((TOKEN_KEY, f"Bearer {token}"),) if token else ())
    if ca is not None or cert is not None:
        credentials = grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)
        return grpc.secure_channel(settings.address, credentials, options=options(settings)), metadata
    return grpc.insecure_channel(settings.address, options=options(settings)), metadata


def answers(settings: Settings, timeout: float) -> bool:
    """Whether the agent at settings.address answers a Hello within `timeout` s (a candidate controller's probe of
    the switches it could drive; a fresh channel each time, so a healed network is seen at once, not after gRPC's
    reconnect backoff). A token file that cannot be read answers False here; the driver says why when it starts."""
    try:
        channel, metadata = _connect(settings, 0)
    except ConfigError:
        return False
    try:
        loads(channel.unary_unary(HELLO)(b"{}", metadata=metadata, timeout=timeout))
        return True
    except (grpc.RpcError, CodecError):
        return False
    finally:
        channel.close()


def _said(err: grpc.RpcError) -> str:
    """A gRPC error in one line: the agent's words, or why it could not be reached."""
    code = err.code() if hasattr(err, "code") else None
    details = (err.details() if hasattr(err, "details") else None) or str(err)
    first = details.strip().splitlines()[0] if details.strip() else "no details"
    if code == grpc.StatusCode.UNAVAILABLE:
        return f"unreachable ({first})"
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return "no answer in time (dataplane.agent.timeout)"
    return f"{code.name if code else 'error'}: {first}"
