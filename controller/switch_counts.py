"""What the data plane counted, read every COUNT_EVERY seconds by the core's counters thread: each installed key's
gets/s since the previous read (the rates the planner trusts over a report's sample) and running totals that only
grow, although a key's counters start again from zero whenever it is installed anew (what Prometheus's counters
need: a total that fell would read as a reset and inflate every rate())."""
from __future__ import annotations

from dataclasses import dataclass, field

from dataplanes.driver import Counters

TOTALS = ("gets", "home_while_dirty", "mirrored")


@dataclass
class Snapshot:
    """The latest read and the totals up to it (replaced whole: readers on other threads see one or the other)."""
    counters: Counters | None = None  # the last read (None before the first)
    totals: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TOTALS, 0))  # summed over every key ever
    rates: dict[bytes, float] = field(default_factory=dict)  # installed key -> gets/s since the previous read
    read_at: float | None = None  # when it was read (the core's clock)


class SwitchCounts:
    """Updated by one thread (update), read by any (snapshot)."""

    def __init__(self):
        self.snapshot = Snapshot()
        self._seen: dict[bytes, tuple[tuple[int, ...], float]] = {}  # key -> (its TOTALS at the last read, when)

    def update(self, counters: Counters, now: float) -> dict[bytes, float]:
        """Take one read of the counters; returns each key's gets/s since the read before (keys seen twice)."""
        before = self.snapshot
        totals, rates, seen = dict(before.totals), {}, {}
        for key, counts in counters.keys.items():
            values = tuple(getattr(counts, name) for name in TOTALS)  # copied: a driver may reuse the object
            previous, when = self._seen.get(key, (None, 0.0))
            fresh = previous is None or any(v < p for v, p in zip(values, previous))  # new, or installed anew
            for name, value, old in zip(TOTALS, values, previous or (0,) * len(TOTALS)):
                totals[name] += value - (0 if fresh else old)
            if not fresh and now > when:
                rates[key] = (values[0] - previous[0]) / (now - when)
            seen[key] = (values, now)
        self._seen = seen
        self.snapshot = Snapshot(counters, totals, rates, now)
        return rates
