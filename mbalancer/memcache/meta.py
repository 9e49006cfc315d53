"""A blocking TCP client for memcached's meta commands (memcached >= 1.6), used by the controller's replicator.

Why meta commands: `mg <key> v f t c` returns the value, the client flags, the *remaining* TTL and the CAS in one
round trip, so a copy keeps the item's expiry (a classic `get` cannot tell it) and the coherence logic can tell
whether a write has been applied (the CAS changes on every write). Any socket or protocol error raises
MetaError; the connection is then dropped and the next call reconnects.

Every keyed command goes one way, send_many then receive_many: the calls on many keys (get_many, set_many,
delete_many, and the CAS reads the replicator sends as "version") pipeline their commands, all sent, then the replies
read in order, one round trip for them all; the calls on one key (get, set, delete) are that path with one key, its
error raised. Each key gets its own outcome: a refusal (EX, NS, SERVER_ERROR ...) is that key's alone; a connection
that fails fails the keys not answered yet (their outcome is unknown).
"""
from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence, TypeVar

from mbalancer.memcache.addresses import ServerAddress
from mbalancer.memcache.keys import key_problem
from mbalancer.memcache.replies import MetaReply, StatusReply, parse_reply
from mbalancer.memcache.results import NotParsed

NO_EXPIRY = -1  # mg's remaining TTL for an item that never expires
MAX_ITEM = 1024 * 1024 * 1024  # the largest item memcached stores (-I 1024m): a copy reads what the home holds
T = TypeVar("T")


class Connection(Protocol):
    """What a client needs of its connection to a server: a TCP socket's calls (or mbalancer/memcache/memory.py's
    in-memory server, which answers the same commands with the same semantics)."""

    def sendall(self, data: bytes) -> None: ...
    def recv(self, size: int) -> bytes: ...
    def settimeout(self, seconds: float | None) -> None: ...
    def close(self) -> None: ...


Connect = Callable[[ServerAddress, float], Connection]  # (server, timeout) -> a connection; OSError if refused


def tcp_connect(server: ServerAddress, timeout: float) -> socket.socket:
    sock = socket.create_connection(tuple(server), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


class MetaError(RuntimeError):
    """The server could not be reached or answered something a meta command does not."""


@dataclass(frozen=True)
class StoredItem:
    """An item as a server holds it: what a copy must carry over."""

    value: bytes
    flags: int
    ttl: int  # seconds left, or NO_EXPIRY
    cas: int


@dataclass(frozen=True)
class ItemVersion:
    """Which state of an item a server holds, without its value: the CAS changes on every write; gat, touch and
    mg's T flag change only the TTL."""

    cas: int
    ttl: int  # seconds left, or NO_EXPIRY


class MetaClient:
    """One TCP connection to one memcached server; not thread-safe (one per thread or per server)."""

    def __init__(self, server: ServerAddress, timeout: float = 1.0, connect: Connect = tcp_connect):
        self.server = server
        self.timeout = timeout
        self.connect = connect
        self._sock: Connection | None = None
        self._buffer = bytearray()

    def get(self, key: bytes) -> StoredItem | None:
        """The item with its flags, remaining TTL and CAS, or None on a miss."""
        return _only(self.get_many([key]))

    def get_many(self, keys: Sequence[bytes]) -> list[StoredItem | None | Exception]:
        """get of each key, pipelined: the item, None (a miss), or that key's MetaError or ValueError (a bad key)."""
        return self.receive_many(self.send_many("get", keys))

    def set_many(self, items: Sequence[tuple[bytes, StoredItem, int | None]]) -> list[int | Exception]:
        """set of each (key, item, if_cas), pipelined: the copy's CAS, or that key's MetaError or ValueError."""
        return self.receive_many(self.send_many("set", items))

    def delete_many(self, keys: Sequence[tuple[bytes, int | None]]) -> list[bool | Exception]:
        """delete of each (key, if_cas), pipelined: whether it was there, or that key's MetaError or ValueError."""
        return self.receive_many(self.send_many("delete", keys))

    def send_many(self, kind: str, args: Sequence) -> "Pending":
        """Send a command of `kind` (get, set, delete: the calls above; version: mg's CAS and TTL, an ItemVersion) for
        each of `args` at once, without reading the replies: receive_many reads them (another server's can be sent
        meanwhile). A bad key's command is not sent: its ValueError is its outcome."""
        build, outcome = {"get": (_get_command, self._item_of), "set": (lambda a: _set_command(*a), self._stored_cas),
                          "delete": (lambda a: _delete_command(*a), self._deleted),
                          "version": (_version_command, self._version_of)}[kind]
        pending = Pending([None] * len(args), [], outcome)
        commands = []
        for i, arg in enumerate(args):
            try:
                commands.append(build(arg))
                pending.sent.append(i)
            except ValueError as err:
                pending.outcomes[i] = err
        try:
            if commands:
                self._connected().sendall(b"".join(commands))
        except OSError as err:
            self.close()
            pending.error = MetaError(f"{self.server}: {err.strerror or err}")
        return pending

    def receive_many(self, pending: "Pending") -> list:
        """The outcome of each command send_many sent: its reply's meaning, or that command's MetaError (a SERVER_ERROR
        is the command's alone; a connection that fails fails the commands not answered yet)."""
        replies: list[MetaReply | StatusReply] = []
        try:
            if pending.error is not None:
                raise pending.error
            if pending.sent:
                sock = self._connected()
                for _ in pending.sent:
                    replies.append(self._read_reply(sock, True))
        except (OSError, MetaError) as err:
            self.close()
            error = err if isinstance(err, MetaError) else MetaError(f"{self.server}: {err.strerror or err}")
            for i in pending.sent[len(replies):]:
                pending.outcomes[i] = error
        for i, reply in zip(pending.sent, replies):
            try:
                if isinstance(reply, StatusReply):
                    raise MetaError(f"{self.server}: {reply.status} {reply.message}")
                pending.outcomes[i] = pending.outcome(reply)
            except MetaError as err:
                pending.outcomes[i] = err
        return pending.outcomes

    def _item_of(self, reply: MetaReply) -> StoredItem | None:
        if reply.code == "EN":
            return None
        if reply.code != "VA":
            raise MetaError(f"{self.server}: mg answered {reply.code}")
        flags = _flag_values(reply.flags)
        try:
            return StoredItem(reply.value or b"", int(flags[b"f"]), int(flags[b"t"]), int(flags[b"c"]))
        except (KeyError, ValueError):
            raise MetaError(f"{self.server}: mg reply lacks f/t/c: {reply.flags!r}") from None

    def _version_of(self, reply: MetaReply) -> ItemVersion | None:
        if reply.code == "EN":
            return None
        flags = _flag_values(reply.flags)
        try:
            if reply.code == "HD":
                return ItemVersion(int(flags[b"c"]), int(flags[b"t"]))
        except (KeyError, ValueError):
            pass
        raise MetaError(f"{self.server}: mg c t answered {reply.code} {reply.flags!r}")

    def set(self, key: bytes, item: StoredItem, if_cas: int | None = None) -> int:
        """Store a copy with the same flags and remaining TTL; returns the copy's CAS on this server. With `if_cas`,
        only if the item there still has that CAS (MetaError otherwise: it changed, or is gone)."""
        return _only(self.set_many([(key, item, if_cas)]))

    def _stored_cas(self, reply: MetaReply) -> int:
        flags = _flag_values(reply.flags)
        if reply.code != "HD":
            raise MetaError(f"{self.server}: ms answered {reply.code}" + (
                " (the item is not the one expected)" if reply.code in ("EX", "NF") else ""))
        return int(flags.get(b"c", 0))

    def delete(self, key: bytes, if_cas: int | None = None) -> bool:
        """Delete the key; False if it was not there. With `if_cas`, only if the item still has that CAS."""
        return _only(self.delete_many([(key, if_cas)]))

    def _deleted(self, reply: MetaReply) -> bool:
        if reply.code == "EX":
            raise MetaError(f"{self.server}: md answered EX (the item is not the one expected)")
        if reply.code not in ("HD", "NF"):
            raise MetaError(f"{self.server}: md answered {reply.code}")
        return reply.code == "HD"

    def ping(self) -> None:
        """Round trip with the meta no-op; raises MetaError if the server does not answer in time."""
        reply = self._exchange(b"mn\r\n", self._read_reply)
        if reply.code != "MN":
            raise MetaError(f"{self.server}: mn answered {reply.code}")

    def stats(self) -> dict[str, str]:
        """The server's general statistics (`stats`: counts nothing itself); raises MetaError."""
        lines = self._exchange(b"stats\r\n", self._read_stats).splitlines()
        return {parts[1]: parts[2] for parts in (line.split(" ", 2) for line in lines)
                if len(parts) == 3 and parts[0] == "STAT"}

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
        self._sock = None
        self._buffer.clear()

    def _exchange(self, request: bytes, read: Callable[[Connection], T]) -> T:
        """Send `request` and `read` its answer; any failure closes the connection (its state is unknown) and is a
        MetaError."""
        try:
            sock = self._connected()
            sock.sendall(request)
            return read(sock)
        except OSError as err:
            self.close()
            raise MetaError(f"{self.server}: {err.strerror or err}") from None
        except MetaError:
            self.close()
            raise

    def set_timeout(self, seconds: float) -> None:
        """Seconds each later call may wait (the open connection too)."""
        self.timeout = seconds
        if self._sock is not None:
            self._sock.settimeout(seconds)

    def _connected(self) -> Connection:
        if self._sock is None:
            self._sock = self.connect(self.server, self.timeout)
        return self._sock

    def _read_reply(self, sock: Connection, server_errors: bool = False) -> MetaReply | StatusReply:
        """The next reply; with `server_errors`, a SERVER_ERROR too (memcached refused that one command, e.g. a value
        too large, and read past it: the next reply is the next command's)."""
        while True:
            reply = parse_reply(self._buffer, MAX_ITEM)
            if isinstance(reply, NotParsed) and reply.incomplete:
                self._receive(sock)
                continue
            if server_errors and isinstance(reply, StatusReply) and reply.status == "SERVER_ERROR":
                del self._buffer[:reply.size]
                return reply
            if not isinstance(reply, MetaReply):
                what = reply.reason if isinstance(reply, NotParsed) else getattr(reply, "status", type(reply))
                raise MetaError(f"{self.server}: not a meta reply ({what})")
            del self._buffer[:reply.size]
            return reply

    def _read_stats(self, sock: Connection) -> str:
        """The lines of a `stats` answer, up to its END."""
        while (end := self._buffer.find(b"END\r\n")) < 0:
            if self._buffer.startswith((b"ERROR", b"SERVER_ERROR", b"CLIENT_ERROR")) and b"\r\n" in self._buffer:
                raise MetaError(f"{self.server}: stats answered {bytes(self._buffer).splitlines()[0]!r}")
            self._receive(sock)
        text = bytes(self._buffer[:end]).decode("ascii", "replace")
        del self._buffer[:end + 5]
        return text

    def _receive(self, sock: Connection) -> None:
        chunk = sock.recv(256 * 1024)
        if not chunk:
            raise MetaError(f"{self.server}: connection closed")
        self._buffer += chunk


@dataclass
class Pending:
    """Commands sent to one server whose replies are not read yet (MetaClient.send_many, receive_many)."""

    outcomes: list  # per command: its outcome once known (a bad key's ValueError at once)
    sent: list[int]  # the commands sent, by index, in order
    outcome: Callable[[MetaReply], object]  # a reply's meaning (raises MetaError)
    error: MetaError | None = None  # the send failed: every command sent fails with it


def _only(outcomes: list[T | Exception]) -> T:
    """The outcome of a call of one command through the pipelined path (send_many): its value, or its error raised."""
    (outcome,) = outcomes
    if isinstance(outcome, Exception):
        raise outcome
    return outcome


def _version_command(key: bytes) -> bytes:
    return b"mg %s c t\r\n" % _checked(key)


def _get_command(key: bytes) -> bytes:
    return b"mg %s v f t c\r\n" % _checked(key)


def _set_command(key: bytes, item: StoredItem, if_cas: int | None) -> bytes:
    # exptime 0 means "never" to memcached, so an item with less than a second left keeps 1 s.
    exptime = 0 if item.ttl == NO_EXPIRY else max(item.ttl, 1)
    compare = b"" if if_cas is None else b" C%d" % if_cas
    command = b"ms %s %d F%d T%d c%s\r\n" % (_checked(key), len(item.value), item.flags, exptime, compare)
    return command + item.value + b"\r\n"


def _delete_command(key: bytes, if_cas: int | None) -> bytes:
    compare = b"" if if_cas is None else b" C%d" % if_cas
    return b"md %s%s\r\n" % (_checked(key), compare)


def _checked(key: bytes) -> bytes:
    problem = key_problem(key)
    if problem:
        raise ValueError(f"key {key[:40]!r}: {problem}")
    return key


def _flag_values(flags: tuple[bytes, ...]) -> dict[bytes, bytes]:
    """Meta reply flags such as (b"f0", b"t-1", b"c42") as {b"f": b"0", ...}."""
    return {flag[:1]: flag[1:] for flag in flags if flag}


def answers(server: ServerAddress, timeout: float = 0.5) -> bool:
    """True if a memcached answers at `server` (for waiting until one has started)."""
    client = MetaClient(server, timeout=timeout)
    try:
        client.ping()
        return True
    except MetaError:
        return False
    finally:
        client.close()
