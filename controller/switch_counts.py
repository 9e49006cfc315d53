"""What the data plane counted, read every COUNT_EVERY seconds by the core's counters thread: each installed key's
gets/s since the previous read (the rates the planner trusts over a report's sample), per replica too (where the
switch sent them: the measured spread, controller/measured_balance.py), and running totals that only grow, although
a key's counters start again from zero whenever it is installed anew (what Prometheus's counters need: a total that
fell would read as a reset and inflate every rate())."""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from dataplanes.driver import Counters

TOTALS = ("gets", "home_while_dirty", "mirrored")


@dataclass
class Snapshot:
    """The latest read and the totals up to it (replaced whole: readers on other threads see one or the other)."""
    counters: Counters | None = None  # the last read (None before the first)
    totals: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TOTALS, 0))  # summed over every key ever
    rates: dict[bytes, float] = field(default_factory=dict)  # installed key -> gets/s since the previous read
    replica_rates: dict[bytes, dict[int, float]] = field(default_factory=dict)  # key -> server -> gets/s sent there
    read_at: float | None = None  # when it was read (the core's clock)
    error: str | None = None  # why the latest read failed (None: it did not); the figures above are older then


@dataclass(frozen=True)
class _Seen:
    values: tuple[int, ...]  # the key's TOTALS
    per_replica: dict[int, int]
    at: float


class SwitchCounts:
    """Updated by one thread (update, failed), read by any (snapshot)."""

    def __init__(self):
        self.snapshot = Snapshot()
        self._seen: dict[bytes, _Seen] = {}  # key -> its counts at the last read

    def update(self, counters: Counters, now: float) -> dict[bytes, float]:
        """Take one read of the counters; returns each key's gets/s since the read before (keys seen twice)."""
        totals, rates, replica_rates, seen = dict(self.snapshot.totals), {}, {}, {}
        for key, counts in counters.keys.items():
            values = tuple(getattr(counts, name) for name in TOTALS)  # copied: a driver may reuse the object
            now_seen = seen[key] = _Seen(values, dict(counts.per_replica), now)
            before = self._seen.get(key)
            fresh = before is None or any(v < p for v, p in zip(values, before.values))  # new, or installed anew
            for name, value, old in zip(TOTALS, values, (0,) * len(TOTALS) if fresh else before.values):
                totals[name] += value - old
            if not fresh and now > before.at:
                rates[key] = (values[0] - before.values[0]) / (now - before.at)
                replica_rates[key] = _replica_rates(before, now_seen)
        self._seen = seen
        self.snapshot = Snapshot(counters, totals, rates, replica_rates, now)
        return rates

    def failed(self, error: str) -> None:
        """The latest read failed: the figures stay those of the last read, with why they are not newer."""
        self.snapshot = replace(self.snapshot, error=error)


def _replica_rates(before: _Seen, after: _Seen) -> dict[int, float]:
    """gets/s each server was sent between two reads of one key (a replica counted less than before: none)."""
    span = after.at - before.at
    return {server: max(n - before.per_replica.get(server, 0), 0) / span for server, n in after.per_replica.items()}
