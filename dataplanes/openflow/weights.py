"""Bucket weights that make Open vSwitch's hash selection give the core's shares.

OVS picks, for a packet's hash, the live bucket with the highest score (hash of bucket id and packet) & 0xffff times
weight (group_best_live_bucket). That is rendezvous hashing with weights, and a bucket's share is not proportional
to its weight: with weights 1 and 2 the second wins 3/4 of the time, not 2/3. With U uniform on [0, 1), bucket i
wins with probability  P_i = integral over u of  prod_{j != i} min(1, u w_i / w_j);  `bucket_weights` solves
P_i = share_i for the weights (a few multiplicative steps; OVS weights are 16-bit). Replicas with share 0 get no
bucket at all (a zero-weight bucket still wins when every other score is 0).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

MAX_WEIGHT = 65535
STEPS = 400
GRID = 4096


def win_shares(weights: Sequence[float]) -> np.ndarray:
    """The share of packets each bucket gets under OVS's weighted rendezvous selection (weights > 0)."""
    w = np.asarray(weights, dtype=float)
    u = (np.arange(GRID) + 0.5) / GRID
    ratio = np.minimum(1.0, u[None, None, :] * w[:, None, None] / w[None, :, None])  # [i, j, u]
    ratio[np.arange(len(w)), np.arange(len(w)), :] = 1.0
    return ratio.prod(axis=1).mean(axis=1)


def bucket_weights(shares: Sequence[float], tolerance: float = 1e-4) -> list[int]:
    """OVS weights (1..65535) for buckets that should get `shares` (all > 0, summing to 1)."""
    target = np.asarray(shares, dtype=float)
    if len(target) == 0 or (target <= 0).any():
        raise ValueError(f"shares must be positive (got {list(shares)})")
    target = target / target.sum()
    if len(target) == 1:
        return [MAX_WEIGHT]
    w = target.copy()
    for _ in range(STEPS):
        got = win_shares(w)
        if np.abs(got - target).max() < tolerance:
            break
        w = w * (target / got) ** 0.2  # damped: larger steps overshoot and oscillate
        w = w / w.max()
    return [max(1, int(round(x * MAX_WEIGHT))) for x in w / w.max()]
