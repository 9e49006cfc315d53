"""Replica health: is each memcached server answering, over the protocols its clients use?

A probe leaves no trace in the server's statistics (an operator's hit and miss rates stay the clients'): it reads
`stats` over TCP (a new pid or start time means the server restarted, a higher cmd_flush that it was flushed,
however quickly: its copies are gone either way) and, unless the config says the servers take no UDP, sends UDP
`version` requests one after the other (a server whose UDP listener is wedged still answers over TCP while
balanced gets to it vanish; with several worker threads only the one that read the wedging datagram swallows them,
so one request would often pass: each of the sequence is read by whichever thread wakes, and all but one must be
answered: one unanswered request is sent again, since a datagram is now and then lost on a saturated link, while a
wedged reader swallows more). A server is down once its probes have kept failing for `hold` seconds (and at least
`failures` probes; a single probe that passes in between does not end the failing, `failures` in a row do): a transient
shorter than that moves nothing. It is up again once its probes have kept succeeding as long (a half-wedged server
that passes one probe in a while does not flap back in); the core then refills its copies before it gets weight
back. A server whose TCP probes failed SUSPECT_AFTER times in a row is suspect: the core stops sending it copies and
reading its values (over TCP, they would wait out their timeout) before it is declared down. UDP failures alone do
not make it suspect (TCP answers): on a saturated link a UDP request or its answer is now and then lost or late, and
a busy home that the core may not read keeps its hot keys dirty, their gets sent home, just when it needs them
balanced. They count towards down as any failure, since balanced gets over UDP would vanish there.

The tracker is plain logic fed with probe results, one server per prober thread (so one server's timeouts never
delay another's probes); `Prober` is the blocking check such a thread runs.
"""
from __future__ import annotations

import select
import socket
import struct
import threading
import time
from dataclasses import dataclass

from controller.events import ServerChange
from mbalancer.memcache.addresses import ServerAddress
from mbalancer.memcache.meta import MetaClient, MetaError

UDP_PROBES = 16  # UDP requests per probe, each sent once the previous one was answered
UDP_UNANSWERED_PER_PROBE = 1  # sent again: one datagram lost on a saturated link is no fault (a wedged reader among
                              # four still fails 94% of probes: two of the 16 requests land on it)
START_SLACK = 2  # seconds the start time (time - uptime, whole seconds each) may seem to move without a restart
LATENCY_FACTOR = 4  # a probe waits this many times the server's recent answer time (a busy server queues) ...
MAX_TIMEOUT = 1.0  # ... from the configured timeout up to this (and this long for a server not heard from yet)
LATENCY_WEIGHT = 0.3  # of each new answer time in the running estimate
SUSPECT_AFTER = 1  # failed TCP probes (each unanswered for the timeout) before copies to the server are skipped
RESTARTED = ServerChange.RESTARTED  # Prober.check's verdict for a server that lost its data (restarted or flushed)


@dataclass(frozen=True)
class ProbeFailure:
    """Why a probe failed (for people), and whether its TCP part did (else only UDP requests went unanswered)."""
    why: str
    tcp: bool = True

    def __str__(self) -> str:
        return self.why


@dataclass
class ServerHealth:
    up: bool = True
    failures: int = 0  # in a row
    tcp_failures: int = 0  # in a row, of those whose TCP part failed (copies and reads go over TCP)
    failing_since: float | None = None  # when the first probe of the current run of failures was sent
    successes: int = 0  # in a row
    passing_since: float | None = None  # when the first probe of the current run of successes was sent
    probes: int = 0
    last_error: str = ""
    changed_at: float | None = None


class HealthTracker:
    def __init__(self, servers: int, failures: int, hold: float = 0.0):
        if failures < 1:
            raise ValueError("a server is down after at least 1 failed probe")
        self.failures, self.hold = failures, hold
        self.servers = [ServerHealth() for _ in range(servers)]
        self._lock = threading.Lock()

    def record(self, server: int, error: ProbeFailure | None, sent: float) -> ServerChange | None:
        """One probe's result (error None: it answered; `sent`: when the probe was sent). Returns DOWN or UP when
        the state changes."""
        with self._lock:
            health = self.servers[server]
            health.probes += 1
            health.tcp_failures = health.tcp_failures + 1 if error is not None and error.tcp else 0
            if error is None:
                health.successes += 1
                if health.successes >= self.failures:  # one answer among failures does not end them: a
                    health.failures, health.failing_since = 0, None  # half-wedged server answers some
                if health.passing_since is None:
                    health.passing_since = sent
                if not health.up and health.successes >= self.failures and sent - health.passing_since >= self.hold:
                    health.up, health.changed_at = True, sent
                    return ServerChange.UP
                return None
            health.successes, health.passing_since = 0, None
            health.failures += 1
            health.last_error = error.why
            if health.failing_since is None:
                health.failing_since = sent
            if health.up and health.failures >= self.failures and sent - health.failing_since >= self.hold:
                health.up, health.changed_at = False, sent
                return ServerChange.DOWN
            return None

    def down(self) -> set[int]:
        return {i for i, h in enumerate(self.servers) if not h.up}

    def unavailable(self, server: int) -> str | None:
        """Why copies to `server` are not worth trying now (down, or failing its probes), or None."""
        health = self.servers[server]
        if not health.up:
            return f"server {server} is down ({health.last_error})"
        if health.tcp_failures >= SUSPECT_AFTER:
            return f"server {server} failed its last {health.tcp_failures} health probes ({health.last_error})"
        return None


class Prober:
    """The probes of one server: its statistics over TCP and, if `udp`, a sequence of UDP `version` requests.

    How long a probe waits adapts to the server: LATENCY_FACTOR times its recent answer time (the running estimate
    or the latest answer, whichever is longer), never less than the configured timeout nor more than MAX_TIMEOUT.
    A server at its link's cap answers late but answers (replies queue behind the values: 250 ms on the ketama10
    testbed's 20 Mbit links); with a fixed 0.25 s it was declared down, and the home that most needed its hot keys
    balanced could not even be read. The latest answer counts whole, so a queue that grows as the load starts is
    waited out from the next request on (the running estimate, still at the idle server's 1 ms, took the demo's home
    down as its clients started); late answers to earlier requests count too."""

    def __init__(self, address: ServerAddress, timeout: float, udp: bool = True):
        self.address, self.base_timeout = address, timeout
        self.tcp = MetaClient(address, timeout=MAX_TIMEOUT)
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM) if udp else None
        self.identity: tuple[str, int] | None = None  # (pid, start time) as last seen
        self.flushes = 0  # its cmd_flush as last seen
        self.request_id = 0
        self.latency: float | None = None  # running estimate of its answer time, seconds
        self.latest: float = 0.0  # its latest answer time, seconds (late answers too)
        self.sent_at: dict[int, float] = {}  # request id -> when sent, for the requests of the last few probes

    @property
    def timeout(self) -> float:
        """How long the next answer is awaited."""
        if self.latency is None:
            return MAX_TIMEOUT
        return min(max(self.base_timeout, LATENCY_FACTOR * max(self.latency, self.latest)), MAX_TIMEOUT)

    def check(self) -> ServerChange | ProbeFailure | None:
        """None if the server answered every probe within the timeout; RESTARTED if it restarted or was flushed
        since the last probe; else why not."""
        self.tcp.set_timeout(self.timeout)
        started = time.monotonic()
        try:
            stats = self.tcp.stats()
            identity = (stats["pid"], int(stats["time"]) - int(stats["uptime"]))
            flushes = int(stats.get("cmd_flush", 0))
        except MetaError as err:
            return ProbeFailure(f"{err} (after {self.timeout:.2f} s)")
        except (KeyError, ValueError):
            return ProbeFailure(f"{self.address}: its stats have no pid, time and uptime: is it memcached?")
        self._answered(time.monotonic() - started)
        restarted = self.identity is not None and (
            identity[0] != self.identity[0] or abs(identity[1] - self.identity[1]) > START_SLACK
            or flushes != self.flushes)
        self.identity, self.flushes = identity, flushes
        if restarted:
            return RESTARTED
        if self.udp is None:
            return None
        unanswered = 0
        for sent in range(UDP_PROBES):
            while not self._udp_probe():  # bounded: each pass counts one more unanswered
                unanswered += 1
                if unanswered > UDP_UNANSWERED_PER_PROBE:
                    return ProbeFailure(f"{self.address}: {unanswered} of {sent + unanswered} UDP requests "
                                        f"unanswered in {self.timeout:.2f} s (TCP answers: is its UDP listener "
                                        f"wedged, or off?)", tcp=False)
        return None

    def _answered(self, seconds: float) -> None:
        self.latency = seconds if self.latency is None else \
            (1 - LATENCY_WEIGHT) * self.latency + LATENCY_WEIGHT * seconds
        self.latest = seconds

    def _udp_probe(self) -> bool:
        """One UDP `version`; True if it was answered within the timeout."""
        self.request_id = (self.request_id + 1) & 0xFFFF
        now = time.monotonic()
        if len(self.sent_at) >= 4 * UDP_PROBES:
            self.sent_at.clear()
        self.sent_at[self.request_id] = now
        self.udp.sendto(struct.pack("!HHHH", self.request_id, 0, 1, 0) + b"version\r\n", tuple(self.address))
        deadline = now + self.timeout
        while (left := deadline - time.monotonic()) > 0:
            if not select.select([self.udp], [], [], left)[0]:
                return False
            try:
                datagram = self.udp.recv(2048)
            except OSError:  # e.g. ICMP port unreachable: nothing listens on UDP there
                return False
            if len(datagram) < 2:
                continue
            answered = self.sent_at.pop(struct.unpack("!H", datagram[:2])[0], None)
            if answered is not None:
                self._answered(time.monotonic() - answered)  # late answers too: it is alive, just slow
            if datagram[:2] == struct.pack("!H", self.request_id):
                return True
        return False

    def close(self) -> None:
        self.tcp.close()
        if self.udp is not None:
            self.udp.close()
