"""Replica health: is each memcached server answering, over the protocols its clients use?

A probe reads a sentinel key the prober stored on the server (over TCP: a miss means the server restarted or was
flushed, however quickly, so its copies are gone) and, unless the config says the servers take no UDP, sends UDP
gets one after the other (a server whose UDP listener is wedged still answers over TCP while balanced gets to it
vanish; with several worker threads only the one that read the wedging datagram swallows them, so one get would
often pass: each of the sequence is read by whichever thread wakes, and all must be answered). A server is down once
its probes have kept failing for `hold` seconds (and at least `failures` probes; a single probe that passes in
between does not end the failing, `failures` in a row do): a transient shorter than that moves nothing. It is up
again once its probes have kept succeeding as long (a half-wedged server that passes one probe in a while does not
flap back in); the core then refills its copies before it gets weight back. A server with SUSPECT_AFTER failures
in a row is suspect: the core stops sending it copies (they would wait out their timeout) before it is declared
down.

The tracker is plain logic fed with probe results, one server per prober thread (so one server's timeouts never
delay another's probes); `Prober` is the blocking check such a thread runs.
"""
from __future__ import annotations

import os
import select
import socket
import struct
import threading
import time
from dataclasses import dataclass

from mbalancer.memcache.addresses import ServerAddress
from mbalancer.memcache.meta import MetaClient, MetaError, StoredItem

PROBE_KEY = b"mbalancer:health"  # the key the UDP probes ask for (a miss is an answer)
UDP_GETS = 16  # UDP gets per probe, each sent once the previous one was answered
LATENCY_FACTOR = 4  # a probe waits this many times the server's recent answer time (a busy server queues) ...
MAX_TIMEOUT = 1.0  # ... from the configured timeout up to this (and this long for a server not heard from yet)
LATENCY_WEIGHT = 0.3  # of each new answer time in the running estimate
SUSPECT_AFTER = 1  # failed probes (each unanswered for the timeout) before copies to the server are skipped
RESTARTED = "restarted"  # Prober.check's verdict for a server that lost its data


@dataclass
class ServerHealth:
    up: bool = True
    failures: int = 0  # in a row
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

    def record(self, server: int, error: str | None, sent: float) -> str | None:
        """One probe's result (error None: it answered; `sent`: when the probe was sent). Returns "down" or "up"
        when the state changes."""
        with self._lock:
            health = self.servers[server]
            health.probes += 1
            if error is None:
                health.successes += 1
                if health.successes >= self.failures:  # one answer among failures does not end them: a
                    health.failures, health.failing_since = 0, None  # half-wedged server answers some
                if health.passing_since is None:
                    health.passing_since = sent
                if not health.up and health.successes >= self.failures and sent - health.passing_since >= self.hold:
                    health.up, health.changed_at = True, sent
                    return "up"
                return None
            health.successes, health.passing_since = 0, None
            health.failures += 1
            health.last_error = error
            if health.failing_since is None:
                health.failing_since = sent
            if health.up and health.failures >= self.failures and sent - health.failing_since >= self.hold:
                health.up, health.changed_at = False, sent
                return "down"
            return None

    def down(self) -> set[int]:
        return {i for i, h in enumerate(self.servers) if not h.up}

    def unavailable(self, server: int) -> str | None:
        """Why copies to `server` are not worth trying now (down, or failing its probes), or None."""
        health = self.servers[server]
        if not health.up:
            return f"server {server} is down ({health.last_error})"
        if health.failures >= SUSPECT_AFTER:
            return f"server {server} failed its last {health.failures} health probes ({health.last_error})"
        return None


class Prober:
    """The probes of one server: its sentinel over TCP and, if `udp`, a sequence of UDP gets.

    How long a probe waits adapts to the server: LATENCY_FACTOR times its recent answer time, never less than the
    configured timeout nor more than MAX_TIMEOUT. A server at its link's cap answers late but answers (replies
    queue behind the values: 250 ms on the ketama10 testbed's 20 Mbit links); with a fixed 0.25 s it was declared
    down, and the home that most needed its hot keys balanced could not even be read. Late answers to earlier
    gets count as answer times too, so a server that slows down quickly is learned from its next probe."""

    def __init__(self, address: ServerAddress, timeout: float, udp: bool = True):
        self.address, self.base_timeout = address, timeout
        self.tcp = MetaClient(address, timeout=MAX_TIMEOUT)
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM) if udp else None
        self.sentinel = b"mbalancer:alive:" + os.urandom(6).hex().encode()
        self.sentinel_stored = False
        self.request_id = 0
        self.latency: float | None = None  # running estimate of its answer time, seconds
        self.sent_at: dict[int, float] = {}  # request id -> when sent, for the gets of the last few probes

    @property
    def timeout(self) -> float:
        """How long the next answer is awaited."""
        if self.latency is None:
            return MAX_TIMEOUT
        return min(max(self.base_timeout, LATENCY_FACTOR * self.latency), MAX_TIMEOUT)

    def check(self) -> str | None:
        """None if the server answered every probe within the timeout; RESTARTED if its sentinel is gone (it is
        stored again); else why not."""
        self.tcp.set_timeout(self.timeout)
        started = time.monotonic()
        try:
            if not self.sentinel_stored:
                self.tcp.set(self.sentinel, StoredItem(b"1", 0, -1, 0))
                self.sentinel_stored = True
            elif self.tcp.cas(self.sentinel) is None:
                self.sentinel_stored = False
                return RESTARTED
        except MetaError as err:
            return f"{err} (after {self.timeout:.2f} s)"
        self._answered(time.monotonic() - started)
        if self.udp is None:
            return None
        for sent in range(UDP_GETS):
            if not self._udp_get():
                return (f"{self.address}: UDP get {sent + 1} of {UDP_GETS} unanswered in {self.timeout:.2f} s (TCP "
                        f"answers: is its UDP listener wedged, or off?)")
        return None

    def _answered(self, seconds: float) -> None:
        self.latency = seconds if self.latency is None else \
            (1 - LATENCY_WEIGHT) * self.latency + LATENCY_WEIGHT * seconds

    def _udp_get(self) -> bool:
        """One UDP get of PROBE_KEY; True if it was answered within the timeout."""
        self.request_id = (self.request_id + 1) & 0xFFFF
        now = time.monotonic()
        if len(self.sent_at) >= 4 * UDP_GETS:
            self.sent_at.clear()
        self.sent_at[self.request_id] = now
        self.udp.sendto(struct.pack("!HHHH", self.request_id, 0, 1, 0) + b"get " + PROBE_KEY + b"\r\n",
                        tuple(self.address))
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
