"""The fault runner's client: paced gets (UDP, or TCP with --protocol tcp) and versioned TCP sets to hot keys, every
get checked for staleness.

Runs inside the client's namespace (`python -m experiments.faults.load`). Each key has one writer, this process:
its sets carry increasing versions, and a get is stale when it returns a version older than the newest set that
had been acknowledged before the get was sent. A set that times out is abandoned with a reset (SO_LINGER 0, so the
kernel does not deliver it later) and its version is never reused; if it reached the home anyway before the reset,
the home really holds it, so reading it is not counted stale. A miss (END) on a key that exists is counted apart.
Everything is counted per 100 ms bucket and written as JSON lines when the run ends (or on SIGTERM); every stale
read is listed in OUT.stale.
Over TCP each get has a connection to itself while it is out (a pool per home, as a closed-loop client's connections):
a reply after the timeout is still read (late), and a connection whose get is unanswered after LOST_AFTER is reset.
"""
from __future__ import annotations

import argparse
import json
import select
import selectors
import signal
import socket
import struct
import sys
import time
from dataclasses import asdict, dataclass, field

BUCKET = 0.1  # seconds per output row
GET_TIMEOUT = 0.25  # a get unanswered after this counts as a timeout
LOST_AFTER = 1.0  # a timed-out get answered within this is only late (a busy machine), not lost (a dead server)
WRITE_TIMEOUT = 0.5
VALUE_BYTES = 64
TCP_CONNECTIONS = 256  # at most, over every home: a get beyond them is left unsent and counts as a timeout
CONNECT_TIMEOUT = 0.1  # s a new connection may take (the load waits for it)
CONNECT_BACKOFF = 0.1  # s without a new connection to a home after one failed


@dataclass
class Bucket:
    t: float  # seconds since the start of the run, at the bucket's start
    sent: int = 0
    answered: int = 0
    timeouts: int = 0
    late: int = 0  # of the timeouts, those answered within LOST_AFTER after all
    stale: int = 0
    misses: int = 0
    writes: int = 0
    write_errors: int = 0


@dataclass
class Pending:
    key: bytes
    sent: float
    floor: int  # the newest acknowledged version when the get was sent


@dataclass
class KeyState:
    home: tuple[str, int]
    acked: int = 0  # newest acknowledged version
    issued: int = 0  # newest version sent
    abandoned: set[int] = field(default_factory=set)  # versions whose set timed out (they may have landed)
    writer: socket.socket | None = field(default=None, repr=False)


def value_of(version: int) -> bytes:
    return b"%d|" % version + b"v" * (VALUE_BYTES - len(b"%d|" % version))


def version_in(reply: bytes) -> int | None:
    """The version in a get reply ("VALUE k f n\\r\\n<n>|vvv\\r\\nEND"), or None for a miss."""
    if not reply.startswith(b"VALUE "):
        return None
    body = reply.split(b"\r\n", 2)[1]
    return int(body.split(b"|", 1)[0])


def reply_complete(data: bytes) -> bool:
    """Whether `data` holds a whole reply to one single-key get (a value and END, END, or an error line)."""
    line, found, rest = data.partition(b"\r\n")
    if not found:
        return False
    if not line.startswith(b"VALUE "):
        return True
    size = int(line.split(b" ")[3])
    return len(rest) >= size + len(b"\r\nEND\r\n")


class UdpGets:
    """Gets as memcached UDP datagrams (the 8-byte frame header carries the request id) from one socket."""

    def __init__(self):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.setblocking(False)

    def send(self, request_id: int, key: bytes, home: tuple[str, int]) -> None:
        self.sock.sendto(struct.pack("!HHHH", request_id, 0, 1, 0) + b"get " + key + b"\r\n", home)

    def poll(self, wait: float) -> list[tuple[int, bytes]]:
        if not select.select([self.sock], [], [], max(wait, 0.0))[0]:
            return []
        replies = []
        for _ in range(1000):
            try:
                datagram = self.sock.recv(65535)
            except BlockingIOError:
                break
            replies.append((struct.unpack("!H", datagram[:2])[0], datagram[8:]))
        return replies

    def forget_older(self, sent_before: float) -> None:
        """Nothing to do: a datagram's late reply costs nothing."""


@dataclass
class Connection:
    sock: socket.socket
    home: tuple[str, int]
    request_id: int = -1  # the get it is out for (-1: idle)
    sent: float = 0.0
    data: bytes = b""


class TcpGets:
    """Gets over TCP, one out per connection; idle connections are kept per home and used again."""

    def __init__(self):
        self.selector = selectors.DefaultSelector()
        self.idle: dict[tuple[str, int], list[Connection]] = {}
        self.busy: dict[int, Connection] = {}  # by file descriptor
        self.refused_until: dict[tuple[str, int], float] = {}  # no connection tried before then (a stalled client
        # would count its own stall as the switch's timeouts)

    def send(self, request_id: int, key: bytes, home: tuple[str, int]) -> None:
        connection = self._idle(home)
        if connection is None:
            return  # unsent: it times out
        connection.request_id, connection.sent, connection.data = request_id, time.monotonic(), b""
        try:
            connection.sock.send(b"get " + key + b"\r\n")
        except OSError:
            self._drop(connection)
            return
        self.busy[connection.sock.fileno()] = connection
        self.selector.register(connection.sock, selectors.EVENT_READ, connection)

    def _idle(self, home: tuple[str, int]) -> Connection | None:
        pool = self.idle.setdefault(home, [])
        if pool:
            return pool.pop()
        if len(self.busy) + sum(map(len, self.idle.values())) >= TCP_CONNECTIONS or \
                time.monotonic() < self.refused_until.get(home, 0.0):
            return None
        try:
            sock = socket.create_connection(home, timeout=CONNECT_TIMEOUT)
        except OSError:  # nothing listening (a switch restarting its TCP path): the get times out
            self.refused_until[home] = time.monotonic() + CONNECT_BACKOFF
            return None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # closed: reset, no late bytes
        sock.setblocking(False)
        return Connection(sock, home)

    def poll(self, wait: float) -> list[tuple[int, bytes]]:
        replies = []
        for event, _ in self.selector.select(max(wait, 0.0)):
            connection: Connection = event.data
            try:
                chunk = connection.sock.recv(65536)
            except BlockingIOError:
                continue
            except OSError:
                chunk = b""
            if not chunk:
                self._drop(connection)  # reset or closed: its get times out
                continue
            connection.data += chunk
            if reply_complete(connection.data):
                replies.append((connection.request_id, connection.data))
                self._rest(connection)
        return replies

    def forget_older(self, sent_before: float) -> None:
        """Reset the connections whose get has been out since before `sent_before`: lost, not late."""
        for connection in [c for c in self.busy.values() if c.sent < sent_before]:
            self._drop(connection)

    def _rest(self, connection: Connection) -> None:
        self.selector.unregister(connection.sock)
        del self.busy[connection.sock.fileno()]
        connection.request_id = -1
        self.idle[connection.home].append(connection)

    def _drop(self, connection: Connection) -> None:
        if self.busy.pop(connection.sock.fileno(), None) is not None:
            self.selector.unregister(connection.sock)
        connection.sock.close()


class Load:
    def __init__(self, keys: dict[bytes, tuple[str, int]], rate: float, write_rate: float, protocol: str = "udp"):
        self.keys = {k: KeyState(home) for k, home in keys.items()}
        self.names = list(self.keys)
        self.rate, self.write_rate = rate, write_rate
        self.gets = TcpGets() if protocol == "tcp" else UdpGets()
        self.pending: dict[int, Pending] = {}
        self.overdue: dict[int, Pending] = {}  # timed out, not yet answered: late while under LOST_AFTER
        self.buckets: list[Bucket] = []
        self.request_id = 0
        self.started = time.monotonic()
        self.stopped = False
        self.stale: list[dict] = []  # every stale read: when sent, which key, the version got and the one acked

    def bucket(self, now: float) -> Bucket:
        index = int((now - self.started) / BUCKET)
        while len(self.buckets) <= index:
            self.buckets.append(Bucket(round(len(self.buckets) * BUCKET, 3)))
        return self.buckets[index]

    def prepare(self) -> None:
        """Version 1 of every key, acknowledged before the run (a miss later is then a real miss)."""
        for key in self.names:
            self.write(key, time.monotonic(), count=False)

    def run(self, duration: float) -> None:
        self.started = time.monotonic()
        next_get, next_write, turn = self.started, self.started, 0
        end = self.started + duration
        while not self.stopped and (now := time.monotonic()) < end:
            while next_get <= now:
                self.get(self.names[turn % len(self.names)], now)
                turn += 1
                next_get += 1 / self.rate
            if self.write_rate and next_write <= now:
                self.write(self.names[int(now * 1000) % len(self.names)], now)
                next_write += 1 / self.write_rate
            self.receive(min(next_get, next_write if self.write_rate else next_get) - time.monotonic())
            self.expire(time.monotonic())
        self.expire(float("inf"))

    def get(self, key: bytes, now: float) -> None:
        self.request_id = (self.request_id + 1) & 0xFFFF
        self.pending[self.request_id] = Pending(key, now, self.keys[key].acked)
        self.gets.send(self.request_id, key, self.keys[key].home)
        self.bucket(now).sent += 1

    def receive(self, wait: float) -> None:
        for request_id, reply in self.gets.poll(wait):
            pending = self.pending.pop(request_id, None)
            if pending is None:
                self._answered_late(request_id)
                continue
            bucket = self.bucket(pending.sent)
            bucket.answered += 1
            version = version_in(reply)
            if version is None:
                bucket.misses += 1
            elif version < pending.floor and version not in self.keys[pending.key].abandoned:
                bucket.stale += 1
                self.stale.append({"t": round(pending.sent - self.started, 4), "key": pending.key.decode(),
                                   "got": version, "acked": pending.floor})

    def _answered_late(self, request_id: int) -> None:
        """A reply after its get timed out (already counted): late, or lost if it took LOST_AFTER or more."""
        overdue = self.overdue.pop(request_id, None)
        if overdue is not None and time.monotonic() - overdue.sent < LOST_AFTER:
            self.bucket(overdue.sent).late += 1

    def expire(self, now: float) -> None:
        for rid in [r for r, p in self.pending.items() if now - p.sent > GET_TIMEOUT]:
            self.overdue[rid] = self.pending.pop(rid)
            self.bucket(self.overdue[rid].sent).timeouts += 1
        self.gets.forget_older(now - LOST_AFTER)

    def write(self, key: bytes, now: float, count: bool = True) -> None:
        """A set of the next version over TCP to the key's home, waiting for STORED."""
        state = self.keys[key]
        state.issued += 1
        version = state.issued
        bucket = self.bucket(now) if count else None
        try:
            if state.writer is None:
                state.writer = socket.create_connection(state.home, timeout=WRITE_TIMEOUT)
                state.writer.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                state.writer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            value = value_of(version)
            state.writer.sendall(b"set %s 0 0 %d\r\n%s\r\n" % (key, len(value), value))
            reply = b""
            while not reply.endswith(b"\r\n"):
                chunk = state.writer.recv(64)
                if not chunk:
                    raise OSError("connection closed")
                reply += chunk
            if reply != b"STORED\r\n":
                raise OSError(reply.decode("latin-1").strip())
            state.acked = version
            if bucket:
                bucket.writes += 1
        except OSError:
            state.abandoned.add(version)
            if state.writer is not None:
                state.writer.close()  # a reset: what was not delivered is dropped, not delivered late
                state.writer = None
            if bucket:
                bucket.write_errors += 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", required=True, help='JSON: {"key": ["home ip", port], ...}')
    parser.add_argument("--rate", type=float, default=2000.0, help="gets per second")
    parser.add_argument("--write-rate", type=float, default=20.0, help="sets per second")
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--protocol", choices=("udp", "tcp"), default="udp", help="of the gets (sets are TCP)")
    parser.add_argument("--out", required=True, help="JSON lines, one per 100 ms bucket")
    args = parser.parse_args(argv)
    keys = {k.encode(): (ip, int(port)) for k, (ip, port) in json.loads(args.keys).items()}
    load = Load(keys, args.rate, args.write_rate, args.protocol)
    signal.signal(signal.SIGTERM, lambda *_: setattr(load, "stopped", True))
    load.prepare()
    print("ready", flush=True)
    sys.stdin.readline()  # the runner says go: every run starts its clock at the same moment as the faults'
    load.run(args.duration)
    with open(args.out, "w") as out:
        for bucket in load.buckets:
            out.write(json.dumps(asdict(bucket)) + "\n")
    if load.stale:
        with open(args.out + ".stale", "w") as out:
            json.dump(load.stale, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
