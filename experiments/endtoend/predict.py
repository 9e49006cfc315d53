"""The simulated imbalance factor of the very placement a run uses (the thesis's model, section 3): loads from the
Zipf weights and the clients' hash, then MBalancer's remedy on the H hottest keys. The thesis's claim is that the
measured normalised throughput matches it."""
from __future__ import annotations

import numpy as np

from controller.load import imbalance_factor
from experiments.simulation.placement import Placement, server_loads
from experiments.simulation.remedies import ReplicatedGroups
from experiments.workload.records import expected_imbalance
from experiments.workload.spec import Workload
from mbalancer.config import Balancing


def simulated_imbalance(workload: Workload, balancing: Balancing | None, most_hot: int = 0) -> float:
    """IF with no remedy (balancing None) or with MBalancer's H, G and replica mode; with H "auto" (balancing.hot
    None) the H the controller would pick, among at most `most_hot` keys (see model_hot)."""
    if balancing is None:
        return expected_imbalance(workload)
    hot = balancing.hot if balancing.hot is not None else model_hot(workload, balancing, most_hot)
    return _remedied(workload, balancing, hot)


def model_hot(workload: Workload, balancing: Balancing, most_hot: int) -> int:
    """H "auto" as the controller picks it: the fewest hottest keys whose remedy reaches balancing.target, or
    `most_hot` (the monitor's report size) if none does; balancing.hot where H is fixed."""
    if balancing.hot is not None:
        return balancing.hot
    return next((h for h in range(most_hot + 1) if _remedied(workload, balancing, h) >= balancing.target), most_hot)


def _remedied(workload: Workload, balancing: Balancing, hot: int) -> float:
    servers = len(workload.servers)
    weights = workload.weights()
    homes = np.asarray(workload.homes, dtype=np.int32)[None, :]
    placement = Placement(servers=servers, weights=weights, loads=server_loads(homes, weights, servers),
                          homes=homes[:, :hot])
    remedy = ReplicatedGroups(placement, balancing.groups, balancing.mode)
    for rank in range(hot):
        remedy.add(weights[rank], placement.homes[:, rank])
    return float(imbalance_factor(remedy.loads())[0])
