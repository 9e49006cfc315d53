"""Memcached in memory: servers that answer the commands the controller sends (meta mg, ms, md, mn, and stats) with
memcached's semantics, reached through the client's connection interface (meta.py Connect), so tests of the
controller's logic need no socket and no process.

What memcached does, and this does too (tests/test_memcache_memory.py runs the same cases against both, so it cannot
drift): every store gives the item a new CAS, unique on the server; a store or delete conditional on a CAS
(`C<cas>`) answers EX when the item has another, NF when there is none; an item keeps its client flags; its TTL
counts down in whole seconds (-1: never expires; 0 in a store: never; over 30 days: a Unix time) and an expired item
misses; the flags a request asks back (f, t, c, s, k, O) come in the order asked; quiet mode (q) leaves out a get's
miss and a store or delete done, so requests can be pipelined behind an mn; an item over the size limit is refused
with SERVER_ERROR; a command line memcached cannot read is a CLIENT_ERROR, an unknown command an ERROR. A connection
to an address where no server listens is refused, one to a server that went away is reset, and a request the server
cannot complete is never answered (the client's timeout).
Not done (a flag not done is refused with a CLIENT_ERROR, never answered as if done): LRU eviction, mg that touches
(T, N), ms modes (M) and invalidation (I), base64 keys, the text protocol's storage commands, the binary protocol.
"""
from __future__ import annotations

import errno
import itertools
import math
import os
import time
from dataclasses import dataclass
from typing import Callable

from mbalancer.memcache.addresses import ServerAddress
from mbalancer.memcache.meta import MAX_ITEM
from mbalancer.memcache.requests import Request, parse_request
from mbalancer.memcache.results import NotParsed, Unreadable

MONTH = 60 * 60 * 24 * 30  # memcached reads an exptime above this as a Unix time
FLAGS_DONE = {"mg": b"vftcskOq", "ms": b"FTcCskOq", "md": b"CkOq"}  # the meta flags done here; any other is refused
_pids = itertools.count(os.getpid() * 1000 + 1)


@dataclass
class _Item:
    value: bytes
    flags: int
    expires: float | None  # on the server's clock; None: never
    cas: int


class MemoryMemcached:
    """One memcached server in memory. `clock` is its time (seconds, monotonic); `max_item` its item size limit."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, max_item: int = 1 << 20):
        self.clock, self.max_item = clock, max_item
        self.items: dict[bytes, _Item] = {}
        self.up = True  # False: stopped (new connections refused, open ones reset)
        self.pid = next(_pids)
        self.started = clock()
        self.counts = {"cmd_get": 0, "cmd_set": 0, "get_hits": 0, "get_misses": 0, "delete_hits": 0,
                       "delete_misses": 0, "cmd_flush": 0}
        self._cas = itertools.count(1)

    def answer(self, buffer: bytearray) -> bytes:
        """The replies to every whole request at the start of `buffer` (each removed from it); an incomplete one
        stays, unanswered, until the rest of it comes."""
        replies = []
        while buffer:
            request = parse_request(bytes(buffer), MAX_ITEM)  # read whole, so ms can refuse it as memcached does
            if isinstance(request, NotParsed):
                if request.incomplete:
                    break
                end = buffer.find(b"\r\n")
                del buffer[:len(buffer) if end < 0 else end + 2]
                unknown = request.kind is Unreadable.UNKNOWN_COMMAND
                replies.append(b"ERROR\r\n" if unknown else b"CLIENT_ERROR bad command line format\r\n")
                continue
            del buffer[:request.size]
            replies.append(self._run(request))
        return b"".join(replies)

    # --- the commands -------------------------------------------------------------------------------------------
    def _run(self, request: Request) -> bytes:
        handler = {"mg": self._mg, "ms": self._ms, "md": self._md, "mn": lambda r: b"MN\r\n",
                   "stats": self._stats}.get(request.command)
        if handler is None:
            return b"ERROR\r\n"
        undone = [flag[:1] for flag in request.meta_flags if flag[:1] not in FLAGS_DONE.get(request.command, b"")]
        if undone:  # refused aloud, never answered as if done
            return b"CLIENT_ERROR the in-memory memcached does not do flag %s\r\n" % undone[0]
        return handler(request)

    def _mg(self, request: Request) -> bytes:
        self.counts["cmd_get"] += 1
        item = self._live(request.key)
        if item is None:
            self.counts["get_misses"] += 1
            return _reply(request, b"EN", quiet=True)
        self.counts["get_hits"] += 1
        returned = {b"f": b"%d" % item.flags, b"t": b"%d" % self._ttl(item), b"c": b"%d" % item.cas,
                    b"s": b"%d" % len(item.value)}
        if any(flag[:1] == b"v" for flag in request.meta_flags):
            return _reply(request, b"VA %d" % len(item.value), returned, value=item.value)
        return _reply(request, b"HD", returned)

    def _ms(self, request: Request) -> bytes:
        self.counts["cmd_set"] += 1
        options = _options(request.meta_flags)
        if len(request.data) > self.max_item:
            return b"SERVER_ERROR object too large for cache\r\n"
        current = self._live(request.key)
        if b"C" in options:
            if current is None:
                return _reply(request, b"NF")
            if current.cas != int(options[b"C"]):
                return _reply(request, b"EX")
        item = _Item(request.data, int(options.get(b"F", 0)), self._expires(int(options.get(b"T", 0))),
                     next(self._cas))
        self.items[request.key] = item
        return _reply(request, b"HD", {b"c": b"%d" % item.cas, b"s": b"%d" % len(item.value)}, quiet=True)

    def _md(self, request: Request) -> bytes:
        options = _options(request.meta_flags)
        current = self._live(request.key)
        if current is None:
            self.counts["delete_misses"] += 1
            return _reply(request, b"NF")  # (said even in quiet mode, as memcached says it)
        if b"C" in options and current.cas != int(options[b"C"]):
            return _reply(request, b"EX")
        del self.items[request.key]
        self.counts["delete_hits"] += 1
        return _reply(request, b"HD", quiet=True)

    def _stats(self, request: Request) -> bytes:
        now = self.clock()
        stats = {"pid": self.pid, "uptime": int(now - self.started), "time": int(time.time()),
                 "curr_items": sum(self._live(key) is not None for key in list(self.items)), **self.counts}
        return b"".join(b"STAT %s %d\r\n" % (name.encode(), value) for name, value in stats.items()) + b"END\r\n"

    # --- inside -------------------------------------------------------------------------------------------------
    def _live(self, key: bytes) -> _Item | None:
        item = self.items.get(key)
        if item is not None and item.expires is not None and item.expires <= self.clock():
            del self.items[key]
            return None
        return item

    def _expires(self, exptime: int) -> float | None:
        if exptime == 0:
            return None
        if exptime > MONTH:  # a Unix time
            return self.clock() + (exptime - time.time())
        return self.clock() + exptime  # (negative: already expired)

    def _ttl(self, item: _Item) -> int:
        """Seconds left, as memcached counts them (whole seconds, rounded up); -1: never expires."""
        return -1 if item.expires is None else max(math.ceil(item.expires - self.clock()), 0)


def _reply(request: Request, code: bytes, returned: dict[bytes, bytes] | None = None, value: bytes | None = None,
           quiet: bool = False) -> bytes:
    """A meta reply: `code`, then the flags the request asked back, in its order (those in `returned`, the key for
    k, the opaque token for O), then the value; nothing when `quiet` and the request has q (memcached's quiet mode
    leaves out the answers nobody waits for: a get's miss, a store or a delete done)."""
    if quiet and b"q" in request.meta_flags:
        return b""
    flags = []
    for flag in request.meta_flags:
        kind = flag[:1]
        if kind == b"k":
            flags.append(b"k" + request.key)
        elif kind == b"O":
            flags.append(flag)
        elif returned and kind in returned and len(flag) == 1:
            flags.append(kind + returned[kind])
    line = b" ".join([code, *flags]) + b"\r\n"
    return line if value is None else line + value + b"\r\n"


def _options(flags: tuple[bytes, ...]) -> dict[bytes, bytes]:
    """Meta flags such as (b"F7", b"T0", b"c") as {b"F": b"7", b"T": b"0", b"c": b""}."""
    return {flag[:1]: flag[1:] for flag in flags if flag}


class MemoryConnection:
    """A client's connection to a MemoryMemcached: a socket's calls (meta.py Connection), answered in memory."""

    def __init__(self, server: MemoryMemcached, address: ServerAddress):
        self.server, self.address = server, address
        self._request, self._replies = bytearray(), bytearray()
        self._open = True

    def sendall(self, data: bytes) -> None:
        self._check()
        self._request += data
        self._replies += self.server.answer(self._request)

    def recv(self, size: int) -> bytes:
        self._check()
        if not self._replies:  # the server has nothing to say: a real client waits out its timeout
            raise TimeoutError("timed out")
        chunk = bytes(self._replies[:size])
        del self._replies[:size]
        return chunk

    def settimeout(self, seconds: float | None) -> None:
        pass  # nothing here waits

    def close(self) -> None:
        self._open = False

    def _check(self) -> None:
        if not self._open:
            raise OSError(errno.EBADF, "Bad file descriptor")
        if not self.server.up:
            raise ConnectionResetError(errno.ECONNRESET, "Connection reset by peer")


class MemoryNetwork:
    """Addresses with an in-memory memcached at some of them: `connect` is a client's Connect (meta.py)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.servers: dict[tuple[str, int], MemoryMemcached] = {}

    def start(self, address: ServerAddress, max_item: int = 1 << 20) -> MemoryMemcached:
        """A server listening at `address` from now on (an empty one, as a restarted memcached is)."""
        server = MemoryMemcached(self.clock, max_item)
        self.servers[(address.host, address.port)] = server
        return server

    def stop(self, address: ServerAddress) -> None:
        """The server at `address` goes away: its connections are reset, new ones refused."""
        server = self.servers.pop((address.host, address.port), None)
        if server is not None:
            server.up = False

    def connect(self, address: ServerAddress, timeout: float) -> MemoryConnection:
        server = self.servers.get((address.host, address.port))
        if server is None:
            raise ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused")
        return MemoryConnection(server, address)
