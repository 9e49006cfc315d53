"""Per-server load from a monitor report: measured where the report says where gets went, estimated otherwise.

Measured: the monitor counts gets per destination server before any rewrite, i.e. the load as the clients spread
it; each balanced key's rate then moves from its home to its replicas by weight. Estimated (a report without
`servers`): each top key's rate lands on its home (or its replicas), and the rest of the traffic is assumed even,
which is what a hash over many cold keys gives on average, and wrong wherever the cold keys are not even (the
thesis's skewed hash, a small fleet, a bad hash).
"""
from __future__ import annotations

from typing import Callable, Mapping, Sequence

import numpy as np

from mbalancer.monitor_report import MonitorReport


def estimate_loads(report: MonitorReport, servers: int, home_of: Callable[[bytes], int],
                   spread: Mapping[bytes, Sequence[tuple[int, float]]] = {},
                   measured: Sequence[float] | None = None) -> np.ndarray:
    """gets/s per server. `spread`: keys balanced (or to be) -> (server, weight) pairs (none: the key's load is
    left out). `measured`: gets/s sent to each server, from the report (None: estimate)."""
    if measured is None:
        loads = np.full(servers, max(report.rate - report.top_rate, 0.0) / servers)
        for entry in report.top:
            for server, weight in spread.get(entry.key, ((home_of(entry.key), 1.0),)):
                loads[server] += entry.rate * weight
        return loads
    loads = np.array(measured, dtype=float)
    for entry in report.top:
        if entry.key in spread:
            loads[home_of(entry.key)] -= entry.rate
            for server, weight in spread[entry.key]:
                loads[server] += entry.rate * weight
    return np.maximum(loads, 0.0)


def imbalance_factor(loads: np.ndarray) -> np.ndarray:
    """Mean server load over the maximum (1 = perfectly even), along the last axis: (trials, servers) -> (trials,),
    (servers,) -> (). Shared with the simulation. No load at all counts as even."""
    loads = np.asarray(loads, dtype=float)
    peak = loads.max(axis=-1)
    return np.divide(loads.mean(axis=-1), peak, out=np.ones_like(peak), where=peak > 0)
