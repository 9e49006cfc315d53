"""Water-filling: spread a key's requests over its replicas so that the busiest server is as idle as possible.

Given the load each replica already carries and an amount of hot-key load to place, the minimum achievable
maximum is a water level L with sum(max(0, L - load_j)) = mass: the least loaded replicas are topped up to L and
replicas already above L get nothing. The same function serves the controller (one group, measured loads) and
the Monte Carlo simulation (thousands of trials at once), so it works on batches: the last axis is the replicas.
"""
from __future__ import annotations

import numpy as np


def water_level(loads: np.ndarray, mass: np.ndarray | float) -> np.ndarray:
    """Water level reached when `mass` is poured over servers with base `loads`.

    loads: shape (..., m), base load of each of m servers (any non-negative numbers).
    mass:  shape (...) or a scalar, the load to place (>= 0).
    Returns shape (...): the level L; servers below L end at L, the others keep their load.
    """
    loads = np.asarray(loads, dtype=float)
    mass = np.asarray(mass, dtype=float)
    if loads.shape[-1] == 0:
        raise ValueError("water_level needs at least one server")
    if np.any(mass < 0):
        raise ValueError("mass to place must be non-negative")
    ordered = np.sort(loads, axis=-1)
    filled = np.arange(1, ordered.shape[-1] + 1)
    # Level if exactly the k least loaded servers are filled: (mass + their loads) / k.
    levels = (mass[..., None] + np.cumsum(ordered, axis=-1)) / filled
    # Filling k servers is consistent while the level stays at or above the k-th load; that holds for a prefix
    # of k, so the right k is the length of that prefix.
    consistent = levels >= ordered
    k = consistent.sum(axis=-1)
    return np.take_along_axis(levels, (k - 1)[..., None], axis=-1)[..., 0]


def water_fill(loads: np.ndarray, mass: np.ndarray | float) -> np.ndarray:
    """Load each server receives when `mass` is placed to minimise the maximum load.

    Same shapes as `water_level`; returns shape (..., m), non-negative, summing to `mass` along the last axis.
    """
    loads = np.asarray(loads, dtype=float)
    level = water_level(loads, mass)
    return np.maximum(level[..., None] - loads, 0.0)


def water_fill_weights(loads: np.ndarray, mass: np.ndarray | float) -> np.ndarray:
    """Replica weights (fractions summing to 1) of a water-filling split; equal weights where mass is zero."""
    added = water_fill(loads, mass)
    total = added.sum(axis=-1, keepdims=True)
    equal = np.full_like(added, 1.0 / added.shape[-1])
    return np.divide(added, total, out=equal, where=total > 0)
