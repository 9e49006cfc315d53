"""Hysteresis for the hot set: a key must be among the candidates for N reports in a row to become hot, and out of
them for N reports in a row to cool, so a key near the edge of the top H does not flap (each flip costs copies)."""
from __future__ import annotations

from typing import Iterable


class HotKeyTracker:
    def __init__(self, reports: int):
        if reports < 1:
            raise ValueError("hysteresis needs at least 1 report")
        self.reports = reports
        self.warming: dict[bytes, int] = {}  # not hot: reports in a row as a candidate
        self.cooling: dict[bytes, int] = {}  # hot: reports in a row not a candidate

    def update(self, candidates: Iterable[bytes], hot: Iterable[bytes]) -> tuple[list[bytes], list[bytes]]:
        """One report's candidates (hottest first) against the keys hot now.

        Returns (ready to warm, hottest first; ready to cool). A key that is ready but not acted on (no room,
        a failed copy) stays ready: its count keeps growing and it is returned again next report.
        """
        candidates = list(dict.fromkeys(candidates))
        chosen, hot = set(candidates), set(hot)
        self.warming = {k: self.warming.get(k, 0) + 1 for k in candidates if k not in hot}
        self.cooling = {k: self.cooling.get(k, 0) + 1 for k in hot if k not in chosen}
        warm = [k for k in candidates if self.warming.get(k, 0) >= self.reports]
        cool = sorted(k for k, n in self.cooling.items() if n >= self.reports)
        return warm, cool

    def streak(self, key: bytes) -> int:
        """Reports in a row the key has been moving toward a change of state (0 if none)."""
        return self.warming.get(key, self.cooling.get(key, 0))
