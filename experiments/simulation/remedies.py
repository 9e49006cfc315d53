"""Remedies for hot keys, applied to every trial of a Placement at once.

A remedy takes the hottest keys one at a time (`add`), hottest first, and can report the server loads after any
number of keys. Each key is placed given the loads at the moment it becomes hot, with keys not yet hot still
counted at their homes: the thesis's rule ("upon adding a hot key, the selected group is the one with the least
such load") and what a controller sees as keys heat up. So the loads after H keys are the same whether H was
fixed or reached by the auto-H search, which stops at the first H that reaches its target without redoing work.

- ReplicatedGroups: MBalancer. Servers form G groups of n/G; each hot key goes to one group and all its
  requests are spread over that group: in equal shares (`equal`, the thesis) or by water-filling over the
  servers' other load (`weighted`, the smallest possible maximum).
- MovedKeys: move each hot key, without copies, to the least loaded server (the thesis's straw man).
- extra_servers_to_match: Facebook's remedy, copies of the busiest servers behind a proxy.
"""
from __future__ import annotations

from typing import Protocol

import numpy as np

from controller.water_filling import water_fill
from experiments.simulation.placement import Placement
from mbalancer.config import REPLICA_MODES  # the controller's replica weightings; the model adds "move"

REMEDY_MODES = REPLICA_MODES + ("move",)


class Remedy(Protocol):
    """What every remedy offers: make the next hottest key hot, read the loads, count the copies it stored."""

    extra_copies: np.ndarray  # (trials,)

    def add(self, weight: float, homes: np.ndarray) -> None: ...

    def loads(self) -> np.ndarray: ...


class ReplicatedGroups:
    """MBalancer: every hot key is copied to all servers of one group, which share its requests.

    Group choice: in `equal` mode the group with the least hot-key load (the thesis: hot load is the same on every
    server of a group, and it is all a switch-only design knows); in `weighted` mode the group with the least total
    load, since water-filling already uses each server's measured load. Groups are blocks of consecutive servers;
    homes are random, so which servers form a group does not matter.
    """

    def __init__(self, placement: Placement, groups: int, mode: str) -> None:
        if mode not in REPLICA_MODES:
            raise ValueError(f"replica mode must be one of {REPLICA_MODES}, not {mode!r}")
        if groups < 1 or placement.servers % groups:
            raise ValueError(f"groups ({groups}) must divide the number of servers ({placement.servers})")
        self.mode = mode
        self.groups = groups
        self.size = placement.servers // groups
        self.cold = placement.loads.copy()  # load of the keys that are not hot, per server
        self.hot = np.zeros((placement.trials, groups))  # hot-key load given to each group
        self.extra_copies = np.zeros(placement.trials)
        self._rows = np.arange(placement.trials)

    def add(self, weight: float, homes: np.ndarray) -> None:
        """Make one more key hot: `weight` is its request share, `homes` its home server in each trial."""
        self.cold[self._rows, homes] -= weight
        if self.mode == "equal":
            group = np.argmin(self.hot, axis=1)
        else:
            group = np.argmin(self.hot + self._cold_by_group().sum(axis=2), axis=1)
        self.hot[self._rows, group] += weight
        # The home already holds the value; every other server of the group needs a copy.
        self.extra_copies += self.size - (homes // self.size == group)

    def loads(self) -> np.ndarray:
        """Load of every server, shape (trials, servers)."""
        cold = self._cold_by_group()
        if self.mode == "equal":
            spread = np.broadcast_to((self.hot / self.size)[:, :, None], cold.shape)
        else:
            spread = water_fill(np.maximum(cold, 0.0), self.hot)
        return (cold + spread).reshape(self.cold.shape)

    def _cold_by_group(self) -> np.ndarray:
        return self.cold.reshape(self.cold.shape[0], self.groups, self.size)


class MovedKeys:
    """Move each hot key, hottest first, to the server that is least loaded at that moment; no copies."""

    def __init__(self, placement: Placement) -> None:
        self._loads = placement.loads.copy()
        self.extra_copies = np.zeros(placement.trials)
        self._rows = np.arange(placement.trials)

    def add(self, weight: float, homes: np.ndarray) -> None:
        self._loads[self._rows, homes] -= weight
        target = np.argmin(self._loads, axis=1)
        self._loads[self._rows, target] += weight

    def loads(self) -> np.ndarray:
        return self._loads


def make_remedy(placement: Placement, mode: str, groups: int = 1) -> Remedy:
    """The remedy named by `mode`: `equal` or `weighted` (MBalancer with `groups` groups), or `move`."""
    if mode == "move":
        return MovedKeys(placement)
    return ReplicatedGroups(placement, groups, mode)


def extra_servers_to_match(loads: np.ndarray, target_max: np.ndarray) -> np.ndarray:
    """Facebook's remedy: how many copies of the busiest servers bring the busiest copy down to `target_max`.

    A server with load l split over c copies (a proxy spreads its requests evenly) carries l / c per copy, so it
    needs ceil(l / target) copies; adding copies one at a time to the busiest server reaches the same count.
    Matching the maximum load matches throughput, since the busiest server saturates first.
    loads: (trials, servers) with no remedy; target_max: (trials,). Returns (trials,) extra servers.
    """
    ratio = loads / target_max[:, None]
    copies = np.maximum(np.ceil(ratio - 1e-9), 1.0)  # tolerance: a load equal to the target needs no copy
    return copies.sum(axis=1) - loads.shape[1]
