"""How long mirrored writes took to reach every copy of their key (the write's arrival to the last replica
updated): the recent ones for /state's p50 and max, and every one in cumulative buckets for /metrics's histogram."""
from __future__ import annotations

import bisect
import threading
from collections import deque

RECENT = 1000  # syncs kept one by one
BUCKETS_MS = (0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)  # upper bounds; +Inf beyond


class SyncTimes:
    def __init__(self):
        self.recent: deque[float] = deque(maxlen=RECENT)
        self.count = 0
        self.sum_ms = 0.0
        self._in_bucket = [0] * (len(BUCKETS_MS) + 1)  # per bucket, not cumulative; the last is +Inf
        self._lock = threading.Lock()  # recorded by the core's worker, read by HTTP threads

    def record(self, ms: float) -> None:
        with self._lock:
            self.recent.append(ms)
            self.count += 1
            self.sum_ms += ms
            self._in_bucket[bisect.bisect_left(BUCKETS_MS, ms)] += 1

    def buckets(self) -> list[tuple[float, int]]:
        """(upper bound in ms, syncs at most that long), ending with (inf, all of them)."""
        with self._lock:
            counts = list(self._in_bucket)
        cumulative, total = [], 0
        for bound, n in zip((*BUCKETS_MS, float("inf")), counts):
            total += n
            cumulative.append((float(bound), total))
        return cumulative

    def summary(self) -> dict[str, float | int | None]:
        """The count of every sync, the median and maximum of the recent ones."""
        with self._lock:
            recent = sorted(self.recent)
        return {"count": self.count, "p50": recent[len(recent) // 2] if recent else None,
                "max": recent[-1] if recent else None}

    def clear(self) -> None:
        with self._lock:
            self.recent.clear()
