"""Where a hot key's gets go: its group, its replicas (the group plus the home server) and their weights."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from controller.water_filling import water_fill_weights


def server_groups(servers: int, groups: int) -> list[tuple[int, ...]]:
    """G groups of n/G servers each, in config order: (0..n/G-1), (n/G..2n/G-1), ..."""
    if groups < 1 or servers % groups:
        raise ValueError(f"{groups} groups do not divide {servers} servers")
    size = servers // groups
    return [tuple(range(g * size, (g + 1) * size)) for g in range(groups)]


def replicas_of(home: int, group: Sequence[int], loads: np.ndarray | None = None,
                limit: int | None = None) -> tuple[int, ...]:
    """The group's servers plus the home: the home always holds the value, so it always takes a share. With a
    `limit` (what the data plane holds per key) below that, the home and the least loaded others."""
    replicas = sorted(set(group) | {home})
    if limit is None or len(replicas) <= limit:
        return tuple(replicas)
    others = np.array([s for s in replicas if s != home])
    by_load = np.lexsort((others, loads[others] if loads is not None else np.zeros(len(others))))  # ties: by index
    return tuple(sorted([home, *(int(s) for s in others[by_load[:limit - 1]])]))


def least_loaded_group(groups: Sequence[Sequence[int]], loads: np.ndarray) -> int:
    """Index of the group whose servers carry the least load in total (the first one on a tie)."""
    return int(np.argmin([loads[list(g)].sum() for g in groups]))


def replica_weights(mode: str, replicas: Sequence[int], loads: np.ndarray, rate: float,
                    usable: Sequence[bool] | None = None) -> tuple[float, ...]:
    """Share of the key's gets per replica.

    equal: the same share each (the thesis). weighted: water-filling, so the key's `rate` tops up the least
    loaded replicas first (`loads`: per-server load without this key). Replicas marked not usable (down, or not
    yet holding the value) get 0 and the others share their part; at least one must be usable.
    """
    usable = np.ones(len(replicas), bool) if usable is None else np.asarray(usable, bool)
    if not usable.any():
        raise ValueError("no usable replica")
    weights = np.zeros(len(replicas))
    if mode == "weighted":
        weights[usable] = water_fill_weights(loads[np.asarray(replicas)[usable]], rate)
    else:
        weights[usable] = 1.0 / usable.sum()
    return tuple(float(w) for w in weights / weights.sum())
