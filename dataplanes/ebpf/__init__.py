"""The eBPF data plane: a tc (clsact ingress) program on every port of a Linux switch, its tables in BPF maps.

The program and its control library are the BPF toolkit one floor down (dataplanes/bpf/: the C source split
Katran-style, build/load/pin, the map tables), shared with the OpenFlow data plane's key classifier. Here:

driver.py          the controller's driver: hot keys written to every switch's maps, mirrored writes read back
netns_switch.py    the switch of the namespace topology (topologies/netns.py)
mininet_switch.py  the switch of Mininet topologies (topologies/testbed.py)
standalone.py      a switch on this machine's own interfaces: `mbalancer switch attach | detach | status`
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Settings:
    """The config's [dataplane.ebpf] section."""
    switches: tuple[str, ...] = ()  # names of the loaded switches to drive; empty: every one loaded on this machine
    ports: tuple[str, ...] = ()  # this machine's interfaces `mbalancer switch attach` puts the switch on
    # the controller's addresses whose copies never make a server unsure, beside this machine's own (a controller on
    # another box, reaching the switch through its agent: its address towards the servers)
    trusted: tuple[str, ...] = ()
    # `mbalancer switch attach` also runs the TCP path, so that clients' TCP gets are balanced too
    # (docs/dataplanes/tcp.md). Unset: wherever it can run (when it cannot, say why and attach without it); true: it
    # must (attach fails without it); false: never.
    tcp: bool | None = None
