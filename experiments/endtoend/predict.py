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


def simulated_imbalance(workload: Workload, balancing: Balancing | None) -> float:
    """IF with no remedy (balancing None) or with MBalancer's fixed H, G and replica mode."""
    if balancing is None:
        return expected_imbalance(workload)
    servers = len(workload.servers)
    weights = workload.weights()
    homes = np.asarray(workload.homes, dtype=np.int32)[None, :]
    hot = balancing.hot or 0
    placement = Placement(servers=servers, weights=weights, loads=server_loads(homes, weights, servers),
                          homes=homes[:, :hot])
    remedy = ReplicatedGroups(placement, balancing.groups, balancing.mode)
    for rank in range(hot):
        remedy.add(weights[rank], placement.homes[:, rank])
    return float(imbalance_factor(remedy.loads())[0])
