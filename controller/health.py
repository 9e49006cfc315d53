"""Replica health: is each memcached server answering, over the protocols its clients use?

A probe is a TCP meta no-op and, unless the config says the servers take no UDP, a UDP get (a server whose UDP
listener is wedged still answers over TCP, while every balanced get to it times out). A server is down once its
probes have kept failing for `hold` seconds (and at least `failures` probes): a transient shorter than that moves
nothing, so nothing flaps. It is up again at the first probe that succeeds; the core then refills its copies before
it gets weight back. A server with `suspect_after` failures in a row is suspect: the core stops sending it copies
(they would wait out their timeout) before it is declared down.

The tracker is plain logic fed with probe results, one server per prober thread (so one server's timeouts never
delay another's probes); `Prober` is the blocking check such a thread runs.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

from mbalancer.memcache.addresses import ServerAddress
from mbalancer.memcache.client import UdpClient
from mbalancer.memcache.meta import MetaClient, MetaError

PROBE_KEY = b"mbalancer:health"  # the key the UDP probe asks for (a miss is an answer)
SUSPECT_AFTER = 2  # failed probes in a row before copies to the server are skipped
UDP_PROBE_BUFFER = 64 * 1024  # the probe's reply is "END": no room for large replies needed


@dataclass
class ServerHealth:
    up: bool = True
    failures: int = 0  # in a row
    failing_since: float | None = None  # when the first probe of the current run of failures was sent
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
                health.failures, health.failing_since = 0, None
                if not health.up:
                    health.up, health.changed_at = True, sent
                    return "up"
                return None
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
    """The probes of one server: TCP (meta no-op) and, if `udp`, a UDP get."""

    def __init__(self, address: ServerAddress, timeout: float, udp: bool = True):
        self.address = address
        self.tcp = MetaClient(address, timeout=timeout)
        self.udp = UdpClient(timeout=timeout, receive_buffer=UDP_PROBE_BUFFER) if udp else None

    def check(self) -> str | None:
        """None if the server answered every probe within the timeout, else why not."""
        try:
            self.tcp.ping()
        except MetaError as err:
            return str(err)
        if self.udp is None:
            return None
        result = self.udp.get(PROBE_KEY, self.address)
        if result.outcome in ("hit", "miss"):
            return None
        return f"{self.address}: UDP get {result.outcome} (TCP answers: is the UDP listener wedged?)"

    def close(self) -> None:
        self.tcp.close()
        if self.udp is not None:
            self.udp.close()
