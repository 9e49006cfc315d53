"""The key classifier: the eBPF program built with -DMB_CLASSIFIER, loaded once per OpenFlow switch (pinned under
/sys/fs/bpf/mbalancer-classifier/<name>/) and attached at tc egress of the wire side of each of the switch's ports,
i.e. the far end of each link. It sits there because Open vSwitch's userspace datapath reads its ports with
AF_PACKET, which sees a frame before the port's own tc ingress hook runs: a mark made there would be invisible to
OVS. On a link to another namespace the far end is in that namespace (attached with nsenter, which, unlike
`ip netns exec`, keeps /sys/fs/bpf visible).
"""
from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Sequence

from dataplanes.bpf.program import CLASSIFIER, CLASSIFIER_XDP, DataPlane, build as build_program, unavailable


def build(force: bool = False) -> Path:
    """`make install`'s build step for the OpenFlow data plane: the classifier for tc, and for XDP."""
    build_program(force, CLASSIFIER_XDP)
    return build_program(force, CLASSIFIER)


def available() -> str | None:
    """None if the OpenFlow data plane can run here (classifier built, OVS and Ryu installed), else why not."""
    from dataplanes.openflow.ovs import available as ovs_available
    if importlib.util.find_spec("ryu") is None:
        return "ryu is not installed (make install)"
    return unavailable(("bpftool", "tc", "nsenter"), (CLASSIFIER, CLASSIFIER_XDP)) or ovs_available()


def load(name: str, wire_ends: Sequence[tuple[str | None, str]], memcached_ports: Sequence[int] = (11211,)) \
        -> DataPlane:
    """Load the classifier as `name` and attach it to each (network namespace or None, interface) wire end."""
    plane = DataPlane(name, CLASSIFIER).load()
    try:
        for netns, iface in wire_ends:
            plane.attach(iface, netns)
        fill(plane, memcached_ports)
    except BaseException:
        plane.unload()
        raise
    return plane


def fill(plane: DataPlane, memcached_ports: Sequence[int]) -> None:
    """The classifier's memcached ports table: requests to these ports are read (the driver adds each server's)."""
    from dataplanes.bpf.tables import Tables  # here: tables needs the bpf syscall, importing this module does not
    tables = Tables(plane.pin_dir)
    try:
        tables.add_memcached_ports(memcached_ports)
    finally:
        tables.close()
