"""Replica health: is each memcached server answering?

A server is down after `failures` probes in a row fail (one lost probe is not a dead server: no flapping), and up
again at the first probe that succeeds; the core then refills its copies before it gets weight back. The tracker
is plain logic fed with probe results; `probe` is the blocking check the core's prober thread runs.
"""
from __future__ import annotations

from dataclasses import dataclass

from mbalancer.memcache.meta import MetaClient, MetaError


@dataclass
class ServerHealth:
    up: bool = True
    failures: int = 0  # in a row
    probes: int = 0
    last_error: str = ""
    changed_at: float | None = None


class HealthTracker:
    def __init__(self, servers: int, failures: int):
        if failures < 1:
            raise ValueError("a server is down after at least 1 failed probe")
        self.failures = failures
        self.servers = [ServerHealth() for _ in range(servers)]

    def record(self, server: int, error: str | None, now: float) -> str | None:
        """One probe's result (error None: it answered). Returns "down" or "up" when the state changes."""
        health = self.servers[server]
        health.probes += 1
        if error is None:
            health.failures = 0
            if not health.up:
                health.up, health.changed_at = True, now
                return "up"
            return None
        health.failures += 1
        health.last_error = error
        if health.up and health.failures >= self.failures:
            health.up, health.changed_at = False, now
            return "down"
        return None

    def down(self) -> set[int]:
        return {i for i, h in enumerate(self.servers) if not h.up}


def probe(client: MetaClient) -> str | None:
    """None if the server answered a meta no-op within the client's timeout, else why not."""
    try:
        client.ping()
        return None
    except MetaError as err:
        return str(err)
