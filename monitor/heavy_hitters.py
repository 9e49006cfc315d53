"""Top keys of a stream in bounded memory: Space-Saving, fed in batches, over tumbling windows.

Exact counts are kept for one batch at a time (collections.Counter, in C), then merged into a summary of at most
`capacity` keys, Space-Saving style:
- a key already in the summary adds its batch count exactly;
- a new key enters with count = batch count + `floor`, error = `floor`;
- the summary is cut back to the `capacity` largest counts, and `floor` rises to the largest count cut.
Invariants: every key outside the summary occurred at most `floor` times; a key inside occurred between
count - error and count times. So any key that occurred more than `floor` times is in the summary, and `floor` is
at most (stream length) / capacity. Memory: capacity + batch keys, whatever the number of distinct keys.

Windows: `reset()` at each report interval starts a fresh summary, so a key that cools drops out at once and a
new hot key shows up in the first interval in which it is hot.
"""
from __future__ import annotations

import heapq
from collections import Counter
from typing import NamedTuple


class HeavyHitter(NamedTuple):
    key: bytes
    count: int  # upper bound of the key's occurrences
    error: int  # count - error is a lower bound


class SpaceSaving:
    def __init__(self, capacity: int = 1024, batch: int = 8192):
        if capacity < 1 or batch < 1:
            raise ValueError("capacity and batch must be at least 1")
        self.capacity = capacity
        self.batch = batch
        self.reset()

    def reset(self) -> None:
        self.counts: dict[bytes, int] = {}
        self.errors: dict[bytes, int] = {}
        self.floor = 0
        self.total = 0  # occurrences seen in this window
        self._pending: list[bytes] = []

    def add(self, keys: list[bytes]) -> None:
        """Count these occurrences (in order of arrival; a key may repeat)."""
        self._pending.extend(keys)
        if len(self._pending) >= self.batch:
            self._merge()

    def top(self, n: int) -> list[HeavyHitter]:
        """The n keys with the largest counts, largest first."""
        self._merge()
        best = heapq.nlargest(n, self.counts.items(), key=lambda item: item[1])
        return [HeavyHitter(key, count, self.errors[key]) for key, count in best]

    def _merge(self) -> None:
        if not self._pending:
            return
        batch = Counter(self._pending)
        self.total += len(self._pending)
        self._pending = []
        counts, errors, floor = self.counts, self.errors, self.floor
        for key, n in batch.items():
            if key in counts:
                counts[key] += n
            else:
                counts[key] = n + floor
                errors[key] = floor
        if len(counts) > self.capacity:
            self._cut()

    def _cut(self) -> None:
        keep = heapq.nlargest(self.capacity, self.counts.items(), key=lambda item: item[1])
        kept = dict(keep)
        # the largest count among the keys cut (keys tied with the lowest kept count may be among them)
        cut_max = max((c for k, c in self.counts.items() if k not in kept), default=0)
        self.floor = max(self.floor, cut_max)
        self.errors = {k: self.errors[k] for k in kept}
        self.counts = kept
