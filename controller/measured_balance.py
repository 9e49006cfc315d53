"""Balance as measured, next to the plan's estimate (issue 50): every figure says where it comes from and how old it is.

The plan's figures (controller/load.py, through the planner) move each hot key's reported rate from its home to its
replicas by the plan's weights: what should happen, not what did. Gets the data plane does not balance (TCP gets on
a switch without its TCP path, keys that stay dirty, a detached switch) leave the plan's balance near 1 while the
home carries them all. So two measurements sit beside the plan, each a `Spread` of gets/s per server:

- `switch`: the clients' spread from the last report (where they sent their gets, before any rewrite: the monitor's
  `servers`) with each hot key's gets moved from its home as the switch's per-replica counters counted them over
  their last read: a get the switch did not send elsewhere stays at its home;
- `servers`: each memcached's own count of gets (`stats` cmd_get) as a rate between two reads, where the controller
  reaches them (it counts every get a server answered, the controller's own reads of a home's CAS included).

A figure that cannot be had says why (`unavailable`), never a 0. Pure functions; the core gathers their inputs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from controller.load import imbalance_factor
from controller.planner import Placement
from controller.switch_counts import Snapshot

PLAN, SWITCH, SERVERS = "plan", "switch", "servers"
SOURCES = (PLAN, SWITCH, SERVERS)
UNSUPPORTED = "not supported by this data plane"


@dataclass(frozen=True)
class Spread:
    """gets/s per server (config order) from one source, and how old the oldest figure it was made from is."""
    source: str
    loads: tuple[float, ...] | None  # None: unavailable (see `unavailable`)
    age_s: float | None = None
    balanced: float | None = None  # gets/s sent to another server than the clients addressed (None: not known)
    unavailable: str | None = None  # why `loads` (or, with loads, `balanced`) cannot be had

    @property
    def imbalance(self) -> float | None:
        """Mean server load over the maximum (1 = even)."""
        return None if self.loads is None else float(imbalance_factor(list(self.loads)))

    @property
    def shares(self) -> tuple[float, ...] | None:
        """Each server's share of all gets (None without loads or without any get)."""
        total = sum(self.loads) if self.loads is not None else 0.0
        return None if total <= 0 else tuple(load / total for load in self.loads)

    def as_state(self) -> dict[str, Any]:
        shares = self.shares
        return {"source": self.source, "age_s": _rounded(self.age_s, 3), "imbalance": _rounded(self.imbalance, 4),
                "gets_per_s": None if self.loads is None else [round(float(x), 1) for x in self.loads],
                "shares": None if shares is None else [round(float(x), 4) for x in shares],
                "busiest_share": None if shares is None else round(max(shares), 4),
                "balanced_gets_per_s": _rounded(self.balanced, 1), "unavailable": self.unavailable}


@dataclass(frozen=True)
class GetCount:
    """A server's cmd_get, and when it was read (the core's clock)."""
    gets: int
    at: float


def plan_spread(loads: Sequence[float] | None, age_s: float, placements: Mapping[bytes, Placement],
                rates: Mapping[bytes, float]) -> Spread:
    """The plan's estimate: its loads, and its hot keys' gets/s (`rates`) times their weight off their homes."""
    if loads is None:
        return Spread(PLAN, None, age_s, unavailable="no monitor report yet: nothing planned")
    balanced = sum(rates.get(key, 0.0) * sum(w for s, w in zip(p.replicas, p.weights) if s != p.home)
                   for key, p in placements.items())
    return Spread(PLAN, tuple(loads), age_s, balanced)


def switch_spread(clients: Sequence[float] | None, placements: Mapping[bytes, Placement], counts: Snapshot,
                  age_s: float, supported: bool = True) -> Spread:
    """The clients' spread (None: the report did not say) with each installed key's gets moved from its home as the
    switch counted them per server at its last read (`counts`); `supported`: the data plane counts them at all."""
    if not supported or counts.read_at is None:
        return Spread(SWITCH, None, age_s, unavailable=UNSUPPORTED if not supported else
                      counts.error or "the switch's counters not read yet")
    moved = [0.0] * len(clients) if clients is not None else None
    balanced = 0.0
    for key, rates in counts.replica_rates.items():
        if key not in placements:
            continue  # cooled since the read: its gets go home now
        home = placements[key].home
        for server, rate in rates.items():
            if server == home or rate <= 0:
                continue
            balanced += rate
            if moved is not None and 0 <= server < len(moved) and 0 <= home < len(moved):
                moved[server] += rate
                moved[home] -= rate
    if clients is None:
        return Spread(SWITCH, None, age_s, balanced, "the last monitor report does not say where the clients sent "
                                                     "their gets (servers): per-server loads unknown")
    return Spread(SWITCH, tuple(max(c + m, 0.0) for c, m in zip(clients, moved)), age_s, balanced)


def servers_spread(before: Sequence[GetCount | None], after: Sequence[GetCount | None],
                   errors: Sequence[str | None], now: float) -> Spread:
    """Each server's gets/s between its two latest reads; unavailable (naming why) unless every server has one."""
    rates, missing = [], []
    for index, (old, new, error) in enumerate(zip(before, after, errors)):
        rate = gets_rate(old, new)
        if error is not None:
            missing.append(f"server {index}: {error}")
        elif rate is None:
            missing.append(f"server {index}: " + ("read once so far" if new is not None and old is None else
                                                  "restarted between reads" if new is not None else "not read yet"))
        rates.append(rate)
    read = [count.at for count in after if count is not None]
    age = now - min(read) if read else None
    if missing:
        return Spread(SERVERS, None, age, unavailable="; ".join(missing))
    return Spread(SERVERS, tuple(rates), age)


def balance_state(spreads: Sequence[Spread]) -> dict[str, Any]:
    """/state's `balance`: each source's figures, and how far the plan's imbalance factor is above each measured
    one's (`plan_minus_measured`; over 0.1: the plan and what happened disagree)."""
    by_source = {spread.source: spread for spread in spreads}
    planned = by_source[PLAN].imbalance if PLAN in by_source else None
    gaps = {source: None if planned is None or spread.imbalance is None else round(planned - spread.imbalance, 4)
            for source, spread in by_source.items() if source != PLAN}
    return {**{source: spread.as_state() for source, spread in by_source.items()}, "plan_minus_measured": gaps}


def gets_rate(before: GetCount | None, after: GetCount | None) -> float | None:
    """gets/s between two reads of one server; None without two, or if its count fell (it restarted)."""
    if before is None or after is None or after.at <= before.at or after.gets < before.gets:
        return None
    return (after.gets - before.gets) / (after.at - before.at)


def _rounded(value: float | None, digits: int) -> float | None:
    return None if value is None else round(float(value), digits)
