"""C closed-loop clients on one epoll loop.

Each client behaves as a blocking web-server thread of the thesis: it sends one request, waits for the reply or
its timeout, records the result, and only then sends the next. Multiplexing them on one loop instead of C
threads keeps the per-request cost near the two system calls (no GIL hand-offs), which is what lets one Python
process drive tens of thousands of requests a second.

UDP: one unconnected socket per client (its own flow, as a real client host has), replies accepted from any
address and matched by request id (mbalancer.memcache.pending). TCP: one connection per client and server; a
request that times out closes its connection, since its late reply would otherwise be read as the next answer.
"""
from __future__ import annotations

import collections
import select
import socket
import threading
import time
from typing import Callable

from experiments.workload.keystream import KeyStream
from experiments.workload.records import NOT_ANSWERED, OUTCOME_CODE, Records
from experiments.workload.spec import Workload
from mbalancer.memcache.frame import UDP_HEADER
from mbalancer.memcache.pending import STRAY, PendingReply
from mbalancer.memcache.replies import parse_reply, reply_outcome
from mbalancer.memcache.requests import build_get, build_set
from mbalancer.memcache.results import NotParsed
from mbalancer.memcache.udp import udp_socket

Progress = Callable[[str], None]
PROGRESS_EVERY = 0.5  # seconds
STOP_CHECK = 0.1  # seconds at most between looks at the stop event
CLIENT_RECEIVE_BUFFER = 2 * 1024 * 1024  # one outstanding reply per client: room for a 1 MB value
MAX_RECEIVE = 65536
TIMEOUT = OUTCOME_CODE["timeout"]
UNREACHABLE = OUTCOME_CODE["unreachable"]


class _Client:
    __slots__ = ("index", "request_id", "pending", "sent", "key", "is_set", "server", "busy", "buffer")

    def __init__(self, index: int):
        self.index = index
        self.request_id = index << 8  # spread ids so two clients rarely share one at the same time
        self.pending: PendingReply | None = None
        self.sent = 0.0
        self.key = self.server = 0
        self.is_set = False
        self.busy = False
        self.buffer = b""  # TCP: reply bytes so far


class ClosedLoop:
    """Run `workload` until its duration or request count is reached; fills and returns a Records."""

    def __init__(self, workload: Workload, progress: Progress | None = None, stop: threading.Event | None = None):
        self.w = workload
        self.progress = progress
        self.stop = stop or threading.Event()  # set (e.g. by a signal handler) to end the run early, records kept
        self.records = Records(workload.servers)
        self.stream = KeyStream(workload.weights(), workload.set_ratio, workload.seed)
        self.homes = workload.homes
        self.gets = [build_get(name) for name in workload.key_names]
        self.addresses = [tuple(s) for s in workload.servers]
        self.clients = [_Client(i) for i in range(workload.clients)]
        self.deadlines: collections.deque = collections.deque()  # (deadline, client, request id), in send order
        self.epoll = select.epoll()
        self.issued = 0
        self.busy = 0  # clients with a request outstanding
        self.timeouts = 0
        self.limit = workload.requests
        self.start = 0.0
        self.on_start: Callable[[], None] = lambda: None  # once the first requests are out

    # --- the loop ---------------------------------------------------------------------------------------------
    def run(self) -> Records:
        self.start, self.records.started_unix = time.perf_counter(), time.time()
        end = self.start + self.w.duration if self.limit is None else float("inf")
        for client in self.clients:
            self._issue(client, self.start)
        self.on_start()
        next_report = self.start + PROGRESS_EVERY
        try:
            while True:
                now = time.perf_counter()
                if now >= end or not self.busy or self.stop.is_set():
                    break
                wait = min(end, next_report, self.deadlines[0][0] if self.deadlines else end, now + STOP_CHECK) - now
                for fd, _ in self.epoll.poll(max(wait, 0.0)):
                    self._readable(fd)
                now = time.perf_counter()
                self._expire(now)
                if now >= next_report:
                    self._report(now, end)
                    next_report = now + PROGRESS_EVERY
        finally:
            now = time.perf_counter()
            self.records.duration = min(now, end) - self.start
            self.records.stopped_early = self.stop.is_set()
            self._report(now, end)  # the final count, also for runs shorter than one progress period
            self._close()
        return self.records

    def _issue(self, client: _Client, now: float) -> None:
        """Send the client's next request, or leave it idle when the run has issued all it should."""
        if self.limit is not None and self.issued >= self.limit:
            self.busy -= client.busy
            client.busy = False
            return
        self.issued += 1
        self.busy += not client.busy
        client.busy = True
        key, is_set = self.stream.draw()
        client.key, client.is_set, client.server = key, is_set, self.homes[key]
        client.sent = now
        client.request_id = (client.request_id + 1) & 0xFFFF
        payload = build_set(self.w.key_names[key], self.w.value(key)) if is_set else self.gets[key]
        try:
            self._send(client, payload)
        except OSError:
            # No route, refused connection...: the client learns nothing until its timeout, like a blocked thread.
            client.pending = None
        self.deadlines.append((now + self.w.timeout, client, client.request_id))

    def _complete(self, client: _Client, answered: int, outcome: int, now: float) -> None:
        self.records.add(client.sent - self.start, client.index, client.key, client.is_set, client.server,
                         answered, now - client.sent, outcome)
        self._issue(client, now)

    def _expire(self, now: float) -> None:
        """Time out the requests whose deadline passed; entries of requests already answered are skipped."""
        deadlines = self.deadlines
        while deadlines and deadlines[0][0] <= now:
            _, client, request_id = deadlines.popleft()
            if client.busy and client.request_id == request_id and client.sent + self.w.timeout <= now:
                outcome = TIMEOUT if client.pending is not None else UNREACHABLE
                self.timeouts += outcome == TIMEOUT
                self._abandon(client)
                self._complete(client, NOT_ANSWERED, outcome, now)

    def _report(self, now: float, end: float) -> None:
        if not self.progress:
            return
        done = len(self.records)
        elapsed = now - self.start
        where = f"{elapsed:.1f}/{self.w.duration:g} s" if self.limit is None else f"{done}/{self.limit} requests"
        self.progress(f"load {where}  {done / elapsed:,.0f} req/s  timeouts {self.timeouts}")

    # --- transport hooks --------------------------------------------------------------------------------------
    def _send(self, client: _Client, payload: bytes) -> None:
        raise NotImplementedError

    def _readable(self, fd: int) -> None:
        raise NotImplementedError

    def _abandon(self, client: _Client) -> None:
        """Forget an outstanding request (its late reply must not answer the next one)."""

    def _close(self) -> None:
        self.epoll.close()


class UdpLoop(ClosedLoop):
    def __init__(self, workload: Workload, progress: Progress | None = None, stop: threading.Event | None = None):
        super().__init__(workload, progress, stop)
        self.sockets = []
        self.by_fd = {}
        for client in self.clients:
            sock = udp_socket(CLIENT_RECEIVE_BUFFER)
            sock.setblocking(False)
            self.sockets.append(sock)
            self.by_fd[sock.fileno()] = client, sock
            self.epoll.register(sock.fileno(), select.EPOLLIN)

    def _send(self, client: _Client, payload: bytes) -> None:
        client.pending = PendingReply(client.request_id)
        self.sockets[client.index].sendto(UDP_HEADER.pack(client.request_id, 0, 1, 0) + payload,
                                          self.addresses[client.server])

    def _readable(self, fd: int) -> None:
        client, sock = self.by_fd[fd]
        try:
            datagram, source = sock.recvfrom(MAX_RECEIVE)
        except (BlockingIOError, ConnectionRefusedError):
            return
        whole = client.pending.accept(datagram) if client.busy and client.pending else STRAY
        if whole is STRAY:
            self.records.strays += 1
        elif whole is not None:
            client.pending = None
            self._complete(client, self.records.index_of(source), OUTCOME_CODE[reply_outcome(whole)],
                           time.perf_counter())

    def _abandon(self, client: _Client) -> None:
        client.pending = None

    def _close(self) -> None:
        super()._close()
        for sock in self.sockets:
            sock.close()


class TcpLoop(ClosedLoop):
    def __init__(self, workload: Workload, progress: Progress | None = None, stop: threading.Event | None = None):
        super().__init__(workload, progress, stop)
        self.connections: dict[tuple[int, int], socket.socket] = {}  # (client, server) -> connection
        self.by_fd: dict[int, tuple[_Client, int]] = {}

    def _send(self, client: _Client, payload: bytes) -> None:
        client.pending = PendingReply(client.request_id)  # marks "sent"; TCP needs no id, the stream is ordered
        client.buffer = b""
        conn = self.connections.get((client.index, client.server))
        if conn is None:
            conn = self._connect(client)
        conn.sendall(payload)  # requests are small; the kernel buffer takes them whole

    def _connect(self, client: _Client) -> socket.socket:
        # Kept in timeout mode: sendall of a large set may wait for the window; recv runs only once epoll says
        # data is there, so it does not block.
        conn = socket.create_connection(self.addresses[client.server], timeout=self.w.timeout)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.connections[(client.index, client.server)] = conn
        self.by_fd[conn.fileno()] = client, client.server
        self.epoll.register(conn.fileno(), select.EPOLLIN)
        return conn

    def _readable(self, fd: int) -> None:
        client, server = self.by_fd[fd]
        conn = self.connections[(client.index, server)]
        try:
            data = conn.recv(MAX_RECEIVE)
        except OSError:
            data = b""
        if not data:  # the server closed the connection: the request will time out
            self._drop(client.index, server)
            return
        if client.pending is None or client.server != server:
            self.records.strays += 1  # nothing asked on this connection: not an answer
            return
        client.buffer += data
        reply = parse_reply(client.buffer)
        if isinstance(reply, NotParsed) and reply.incomplete:
            return
        whole, client.buffer, client.pending = client.buffer, b"", None
        self._complete(client, server, OUTCOME_CODE[reply_outcome(whole)], time.perf_counter())

    def _abandon(self, client: _Client) -> None:
        if client.pending is not None:
            self._drop(client.index, client.server)
        client.pending = None

    def _drop(self, client_index: int, server: int) -> None:
        conn = self.connections.pop((client_index, server), None)
        if conn is not None:
            self.by_fd.pop(conn.fileno(), None)
            self.epoll.unregister(conn.fileno())
            conn.close()

    def _close(self) -> None:
        super()._close()
        for conn in self.connections.values():
            conn.close()


def run_load(workload: Workload, progress: Progress | None = None, stop: threading.Event | None = None,
             on_start: Callable[[], None] = lambda: None) -> Records:
    """Run the workload's clients against its servers; every request ends up in the returned Records. Setting
    `stop` ends the run early; what was measured is returned. on_start: called once the first requests are out."""
    loop = (UdpLoop if workload.protocol == "udp" else TcpLoop)(workload, progress, stop)
    loop.on_start = on_start
    return loop.run()
