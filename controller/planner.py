"""The decisions: from one monitor report to the changes of the hot set, each with its reason.

Plain logic, no I/O and no clock (faucet's way): the core hands in the report, the keys installed now and the
servers that are down, and gets back a Plan; carrying it out (copies, table writes) is the core's job. So unit
tests drive every decision directly.

Per report: learn the top keys' homes from where their gets went (controller/homes.py); per-server load measured
from the report where it says where gets went, estimated otherwise (controller/load.py); pick H (fixed, or the
smallest H whose predicted imbalance factor reaches the target); the top H keys are candidates, and the hysteresis
tracker says which keys have been candidates (or not) long enough to warm (or cool). Then all hot keys are laid out
hottest first: a key keeps its group, a new key goes to the group least loaded at that point, and its weights are
equal or water-filled over the load already placed. Installed keys whose weights moved by more than REWEIGHT_STEP
get new weights.

Do no harm: outside the thesis's equal mode (kept as it was, for reproduction), a plan whose predicted imbalance
factor is lower than the current one by more than HARM_MARGIN is held back: its warms and load-driven reweights
are not applied (cools and health reweights are), and the plan says why.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum
from typing import Callable, Collection, Iterable, Mapping

import numpy as np

from dataplanes.driver import ReplicaWeight
from controller.homes import HomeBook
from controller.hysteresis import HotKeyTracker
from controller.load import estimate_loads, imbalance_factor
from controller.placement import least_loaded_group, replica_weights, replicas_of, server_groups
from mbalancer.monitor_report import KeyRate, MonitorReport
from mbalancer.config import Balancing

REWEIGHT_STEP = 0.05  # smaller moves of a weight are not worth a table write
HARM_MARGIN = 0.01  # a plan predicted to lower the imbalance factor by more than this is held back


@dataclass(frozen=True)
class Placement:
    key: bytes
    home: int
    group: int
    replicas: tuple[int, ...]
    weights: tuple[float, ...]  # aligned with replicas, summing to 1
    rate: float = 0.0  # gets/s when placed

    def replica_weights(self) -> tuple[ReplicaWeight, ...]:
        return tuple(ReplicaWeight(s, w) for s, w in zip(self.replicas, self.weights))


class ChangeAction(str, Enum):
    """What a change does (a str: its value is the decision the executor logs for it)."""
    WARM = "warm"  # copy, then install
    COOL = "cool"  # remove, then delete the extra copies
    REWEIGHT = "reweight"


class ChangeCause(Enum):
    """Why the planner made a change: what logic reads (the reason is text, for people)."""
    HOT = "hot"  # in the top H for long enough
    COLD = "cold"  # out of the top H for long enough
    HEALTH = "health"  # a replica went out of, or came back into, its group (weight 0 or back) as its health changed
    LOAD = "load"  # the measured load moved its weights by more than REWEIGHT_STEP, or one of them to or from 0
    RETRY = "retry"  # a cool-down the driver refused, tried again


@dataclass(frozen=True)
class Change:
    action: ChangeAction
    key: bytes
    placement: Placement | None  # None for cool
    cause: ChangeCause
    reason: str  # for the decision log


@dataclass(frozen=True)
class Plan:
    changes: tuple[Change, ...]
    hot_target: int  # H used for this report
    loads: tuple[float, ...]  # estimated gets/s per server as the traffic is spread now
    predicted_loads: tuple[float, ...]  # ... once the plan is carried out
    imbalance_now: float
    imbalance_predicted: float
    measured: bool = False  # loads measured per server (else estimated: cold keys assumed even)
    held: str | None = None  # why warms and reweights were held back (do no harm)
    home_notes: tuple[tuple[bytes, str], ...] = ()  # keys whose traffic disagrees with the configured hash
    loads_without: tuple[float, ...] = ()  # gets/s per server where the clients' hash sends them (no balancing)
    cools_awaiting_counts: tuple[bytes, ...] = ()  # out of the top, kept until the switch has counted their gets

    @property
    def imbalance_without(self) -> float:
        """The imbalance factor without MBalancer (1.0 when unknown)."""
        return float(imbalance_factor(np.array(self.loads_without))) if self.loads_without else 1.0


class Planner:
    def __init__(self, balancing: Balancing, servers: int, home_of: Callable[[bytes], int],
                 addresses: list[str] | None = None, max_replicas: int | None = None):
        """home_of: the configured hash; addresses: the servers as "ip:port" (to read measured loads and homes);
        max_replicas: what the data plane holds per key (a larger group is cut to its least loaded servers)."""
        self.balancing = balancing
        self.max_replicas = max_replicas
        self.servers = servers
        self.homes = HomeBook(home_of, addresses or [])
        self.groups = server_groups(servers, balancing.groups)
        self.tracker = HotKeyTracker(balancing.hysteresis)

    def plan(self, report: MonitorReport, installed: Mapping[bytes, Placement],
             down: Iterable[int] = (), switch_rates: Mapping[bytes, float] | None = None,
             recent: Collection[bytes] = ()) -> Plan:
        """switch_rates: gets/s of installed keys as the data plane counted them since the last report: the truth
        for those keys, so a report that misses them (empty, late, sampled) does not cool keys still in use;
        recent: installed keys just installed or adopted, on a data plane that counts gets: one it has no rate of
        yet is not cooled on a report alone."""
        down = frozenset(down)
        reported = {k.key: k.rate for k in report.top}
        switch_rates = {k: r for k, r in (switch_rates or {}).items() if k in installed}
        report = with_switch_rates(report, switch_rates)
        notes = self.homes.learn(report, installed)
        measured = self.homes.measured_loads(report)
        spread = {k: tuple(zip(p.replicas, p.weights)) for k, p in installed.items()}
        loads = estimate_loads(report, self.servers, self._home_in(installed), spread, measured)
        hot_target = self.balancing.hot if self.balancing.hot is not None else self._auto_hot(report, installed, down)
        rates = {k.key: k.rate for k in report.top}
        candidates = [k.key for k in report.top[:hot_target]]
        ready_warm, ready_cool = self.tracker.update(candidates, installed)
        awaiting = tuple(key for key in ready_cool if key in recent and key not in switch_rates)
        ready_cool = [key for key in ready_cool if key not in awaiting]
        changes = [Change(ChangeAction.COOL, key, None, ChangeCause.COLD,
                          f"out of the top {hot_target} for {self.tracker.streak(key)} reports "
                          f"({reported.get(key, 0.0):.0f} gets/s in the report, "
                          + (f"{switch_rates[key]:.0f} counted by the switch)" if key in switch_rates
                             else "no count from the switch)")) for key in ready_cool]
        staying = [k for k in installed if k not in set(ready_cool)]
        room = max(hot_target - len(staying), 0)
        layout, predicted = self._layout(report, staying + ready_warm[:room], installed, down)
        for key in ready_warm[:room]:
            if key in layout:
                share = rates[key] / report.rate if report.rate else 0.0
                changes.append(Change(ChangeAction.WARM, key, layout[key], ChangeCause.HOT,
                                      f"in the top {hot_target} for {self.tracker.streak(key)} reports: "
                                      f"{rates[key]:.0f} gets/s, {100 * share:.1f}% of gets"))
        for key in staying:
            moved = _weights_moved(installed[key], layout[key], down)
            if moved:
                changes.append(Change(ChangeAction.REWEIGHT, key, layout[key], *moved))
        now, after = float(imbalance_factor(loads)), float(imbalance_factor(predicted))
        held = None
        if self.balancing.mode != "equal" and after < now - HARM_MARGIN:
            kept = [c for c in changes if c.action is ChangeAction.COOL or c.cause is ChangeCause.HEALTH]
            if len(kept) < len(changes):
                held = (f"the plan would lower the imbalance factor from {now:.3f} to {after:.3f} "
                        f"({'measured' if measured else 'estimated'} loads): {len(changes) - len(kept)} changes held")
                changes = kept
        without = estimate_loads(report, self.servers, self._home_in(installed), {}, measured)
        return Plan(tuple(changes), hot_target, tuple(loads), tuple(predicted), now, after,
                    measured is not None, held, tuple(notes), tuple(float(x) for x in without), awaiting)

    def _home_in(self, installed: Mapping[bytes, Placement]) -> Callable[[bytes], int]:
        """An installed key's home is the one it was placed with; any other key's is learned or hashed."""
        return lambda key: installed[key].home if key in installed else self.homes.home_of(key)

    def reweigh(self, report: MonitorReport, installed: Mapping[bytes, Placement],
                down: Iterable[int] = ()) -> tuple[Change, ...]:
        """New weights for the installed keys alone, from the last report (a server went down or came back): no
        report is counted, no key warms or cools, and a weight that goes to or from 0 does so for health."""
        layout, _ = self._layout(report, list(installed), installed, frozenset(down))
        return tuple(Change(ChangeAction.REWEIGHT, key, layout[key], *moved) for key in installed
                     if key in layout and (moved := _weights_moved(installed[key], layout[key], down, health=True)))

    def _layout(self, report: MonitorReport, hot: list[bytes], installed: Mapping[bytes, Placement],
                down: frozenset[int]) -> tuple[dict[bytes, Placement], np.ndarray]:
        """Place the hot keys, hottest first, over the load of everything else; returns placements and loads.

        A new key whose only live replica would be its home is left out (nothing to balance)."""
        rates = {k.key: k.rate for k in report.top}
        home_of = self._home_in(installed)
        running = estimate_loads(report, self.servers, home_of, {k: () for k in set(hot)},
                                 self.homes.measured_loads(report))
        placed: dict[bytes, Placement] = {}
        for key in sorted(hot, key=lambda k: rates.get(k, 0.0), reverse=True):
            rate, home = rates.get(key, 0.0), home_of(key)
            if key in installed:
                group, replicas = installed[key].group, installed[key].replicas
            else:
                group = least_loaded_group(self.groups, running)
                replicas = replicas_of(home, self.groups[group], running, self.max_replicas)
            usable = [r not in down for r in replicas]
            if key not in installed and sum(usable) < 2:
                running[home] += rate
                continue
            if not any(usable):
                usable = [r == home for r in replicas]  # all down: keep the home, where writes go anyway
            weights = replica_weights(self.balancing.mode, replicas, running, rate, usable)
            running[list(replicas)] += rate * np.asarray(weights)
            placed[key] = Placement(key, home, group, replicas, weights, rate)
        return placed, running

    def _auto_hot(self, report: MonitorReport, installed: Mapping[bytes, Placement], down: frozenset[int]) -> int:
        """Smallest H whose layout reaches the target imbalance factor; all reported keys if none does."""
        keys = [k.key for k in report.top]
        for h in range(len(keys) + 1):
            _, loads = self._layout(report, keys[:h], installed, down)
            if imbalance_factor(loads) >= self.balancing.target:
                return h
        return len(keys)


def with_switch_rates(report: MonitorReport, switch_rates: Mapping[bytes, float]) -> MonitorReport:
    """The report with every key the switch counted at least at the switch's rate (added where the report missed
    it), hottest first again; its total rate at least the sum of its keys'."""
    top = {k.key: k for k in report.top}
    raised = {key: rate for key, rate in switch_rates.items() if rate > (top[key].rate if key in top else 0.0)}
    if not raised:
        return report
    for key, rate in raised.items():
        top[key] = replace(top[key], rate=rate) if key in top else KeyRate(key, rate)
    ranked = tuple(sorted(top.values(), key=lambda k: -k.rate))
    return replace(report, top=ranked, rate=max(report.rate, sum(k.rate for k in ranked)))


def _weights_moved(old: Placement, new: Placement, down: Iterable[int],
                   health: bool = False) -> tuple[ChangeCause, str] | None:
    """Why the weights moved enough to write (the cause and its reason); None if they did not. A weight that goes
    to or from 0 does so for health if `health` says a server's health changed, or if its server is down; else the
    weighted mode's water-filling left a replica out (or took it back) by measured load, which the plan's do-no-harm
    check may hold back as any other load change."""
    if old.replicas != new.replicas:
        return None  # a key keeps its group and home, so its replicas only change with the config
    flipped = [(r, w) for r, a, w in zip(new.replicas, old.weights, new.weights) if (a > 0) != (w > 0)]
    if flipped:
        down = set(down)
        cause = ChangeCause.HEALTH if health or any(r in down and w == 0 for r, w in flipped) else ChangeCause.LOAD
        changed = ", ".join(f"server {r} {'back in' if w > 0 else 'out'}" for r, w in flipped)
        return cause, f"{changed} ({'health' if cause is ChangeCause.HEALTH else 'measured load'})"
    step = max(abs(a - b) for a, b in zip(old.weights, new.weights))
    if step > REWEIGHT_STEP:
        return ChangeCause.LOAD, f"measured load moved the weights by up to {step:.2f}"
    return None
