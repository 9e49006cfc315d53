"""What every MBalancer pipeline shares, whatever runs it (the eBPF program, p4src/mbalancer.p4, the OpenFlow
classifier): the limits the tables are sized for, the switch counters' names and order, how replica weights are
encoded for the switch's hash, and which source addresses the switch trusts as the controller's.

The programs define the same numbers (dataplanes/bpf/src/structs.h, p4src/headers.p4); the tests check the
compiled tables against these.
"""
from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Sequence

from mbalancer.settings import Server

MAX_KEY = 250  # memcached's own key limit: a longer key is not a key, its request passes untouched
MAX_REPLICAS = 8  # servers a hot key can be spread over
MAX_HOT = 16384  # hot-key slots of the eBPF program and the OpenFlow classifier (the same program): map sizes only
WEIGHT_ONE = 65536  # the request hash's range: a replica's weight is its share of 0..65535
# the switch counters, in the programs' order
COUNTERS = ("packets", "memcached", "unparsed", "balanced", "already_balanced", "mirrored", "replies_rewritten",
            "flooded", "dropped", "unsure", "cloned", "lease_expired", "coalesced")


@dataclass(frozen=True)
class HeavyKey:
    """A candidate of a data plane's hot-key detection: the sketch's estimate of its gets in one epoch."""
    key: bytes
    count: int
    server: str  # ip:port its gets were sent to


def cumulative_weights(weights: Sequence[float]) -> list[int]:
    """Weights (summing to 1) as the running sums the program compares its hash (0..65535) against; the last one
    is WEIGHT_ONE exactly, so some replica with weight is always chosen."""
    total, sums = 0.0, []
    for weight in weights:
        total += weight
        sums.append(min(round(total * WEIGHT_ONE), WEIGHT_ONE))
    last_used = max((i for i, w in enumerate(weights) if w > 0), default=len(weights) - 1)
    for i in range(last_used, len(sums)):
        sums[i] = WEIGHT_ONE
    return sums


def own_addresses(servers: Sequence[Server]) -> set[str]:
    """This host's source address towards each server (what the controller's copies and reads come from): the
    switch trusts writes from these, since they are the controller's own copies."""
    found = set()
    for server in servers:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            try:
                probe.connect((server.ip, server.port))  # UDP: picks the route and source, sends nothing
            except OSError:
                continue  # no route (yet): nothing of ours goes there either
            found.add(probe.getsockname()[0])
    return found
