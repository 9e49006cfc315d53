"""Per-server load as the controller estimates it from a monitor report.

A report gives the total get rate and the rates of the top keys. Each top key's rate lands on its home, or, for a
key already balanced, on its replicas by weight; the rest of the traffic (keys outside the top) is spread evenly,
which is what a hash over many cold keys does on average. Good enough to choose groups and water-fill; the
counters of the data plane refine it where a driver has them.
"""
from __future__ import annotations

from typing import Callable, Mapping, Sequence

import numpy as np

from mbalancer.monitor_report import MonitorReport


def estimate_loads(report: MonitorReport, servers: int, home_of: Callable[[bytes], int],
                   spread: Mapping[bytes, Sequence[tuple[int, float]]] = {}) -> np.ndarray:
    """gets/s per server. `spread`: keys already balanced -> (server, weight) pairs."""
    loads = np.full(servers, max(report.rate - report.top_rate, 0.0) / servers)
    for entry in report.top:
        for server, weight in spread.get(entry.key, ((home_of(entry.key), 1.0),)):
            loads[server] += entry.rate * weight
    return loads


def imbalance_factor(loads: np.ndarray) -> np.ndarray:
    """Mean server load over the maximum (1 = perfectly even), along the last axis: (trials, servers) -> (trials,),
    (servers,) -> (). Shared with the simulation. No load at all counts as even."""
    loads = np.asarray(loads, dtype=float)
    peak = loads.max(axis=-1)
    return np.divide(loads.mean(axis=-1), peak, out=np.ones_like(peak), where=peak > 0)
