"""Where each hot key lives: learned from where the clients send its gets, so clients with any hash work unchanged.

The monitor reports, per top key, the destination its gets were sent to (before any rewrite): that server is the
key's home, whatever hash the clients use (libmemcached's ketama, pymemcache's rendezvous, mcrouter's routes). The
configured hash answers for keys not seen yet, and cross-checks: where traffic and hash disagree, traffic wins and
the controller says so once per key. An installed key keeps the home it was placed with.
"""
from __future__ import annotations

from typing import Callable, Mapping

from mbalancer.monitor_report import MonitorReport

WARNED_KEPT = 10_000  # keys remembered as already warned about (then the memory starts afresh)


class HomeBook:
    def __init__(self, hash_home: Callable[[bytes], int], addresses: list[str]):
        """addresses: each configured server as "ip:port", in config order."""
        self.hash_home = hash_home
        self.index = {address: i for i, address in enumerate(addresses)}
        self.learned: dict[bytes, int] = {}
        self.warned: set[bytes] = set()

    def learn(self, report: MonitorReport, installed: Mapping[bytes, object]) -> list[tuple[bytes, str]]:
        """Take the homes of this report's top keys (and keep the installed keys'); returns (key, why) for each key
        whose traffic disagrees with the configured hash for the first time."""
        learned = {key: home for key, home in self.learned.items() if key in installed}
        notes = []
        for entry in report.top:
            home = self.index.get(entry.server)
            if home is None or entry.key in installed:
                continue
            learned[entry.key] = home
            hashed = self.hash_home(entry.key)
            if hashed != home and entry.key not in self.warned:
                if len(self.warned) >= WARNED_KEPT:
                    self.warned.clear()
                self.warned.add(entry.key)
                notes.append((entry.key, f"clients send its gets to server {home} ({entry.server}), the configured "
                                         f"hash says {hashed}: following the traffic (check balancing.hash)"))
        self.learned = learned
        return notes

    def home_of(self, key: bytes) -> int:
        home = self.learned.get(key)
        return self.hash_home(key) if home is None else home

    def measured_loads(self, report: MonitorReport) -> list[float] | None:
        """Gets/s each configured server was sent, as the report measured it; None if it measured none of them."""
        if not any(address in self.index for address in report.servers):
            return None
        loads = [0.0] * len(self.index)
        for address, rate in report.servers.items():
            if address in self.index:
                loads[self.index[address]] = rate
        return loads
