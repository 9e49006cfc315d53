"""A Mininet switch that runs the eBPF data plane: `Mininet(topo, switch=EbpfSwitch, controller=None)`.

Like Mininet's own switches it lives in the root namespace; each one loads its own copy of the program and maps
(pinned under /sys/fs/bpf/mbalancer/<name>/) and attaches it to every one of its ports, so several switches per
network work and the controller's eBPF driver writes to all of them (`EbpfSwitch.pin_dirs(net)`). With mirror=True
(the default) it also makes its mirror link `<name>-m` <-> `<name>-mc`: writes to hot keys are cloned to `<name>-m`
and the driver reads them on `<name>-mc`.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

from mininet.node import Switch

from topologies.ebpf.program import DataPlane


class EbpfSwitch(Switch):
    def __init__(self, name: str, mirror: bool = True, memcached_port: int = 11211,
                 flood_exclude: tuple[str, ...] = (), **params):
        """flood_exclude: names of neighbour switches this one never floods to (a loop-free flood tree)."""
        super().__init__(name, **params)
        self.mirror = mirror
        self.flood_exclude = set(flood_exclude)
        self.memcached_port = memcached_port
        self.plane: DataPlane | None = None

    @property
    def mirror_iface(self) -> str:
        """The controller's end of this switch's mirror link."""
        return f"{self.name}-mc"

    def start(self, controllers) -> None:
        self.plane = DataPlane(self.name).load()
        intfs = [intf for intf in self.intfList() if intf.name != "lo"]
        ports = [intf.name for intf in intfs]
        flood = [intf.name for intf in intfs if peer_intf(intf).node.name not in self.flood_exclude]
        mirror_ifindex = self.plane.add_mirror_link() if self.mirror else 0
        for port in ports:
            subprocess.run(["ip", "link", "set", port, "up"], check=True)
        self.plane.serve(ports, mirror_ifindex, self.memcached_port, flood)


    def reload(self) -> None:
        """A fresh program and empty tables on the same ports (experiments start every run from a clean switch)."""
        if self.plane is not None:
            self.plane.unload()
            self.plane = None
        self.start([])

    def stop(self, deleteIntfs: bool = True) -> None:
        if self.plane is not None:
            self.plane.unload()  # the mirror link with it
            self.plane = None
        super().stop(deleteIntfs)

    @staticmethod
    def pin_dirs(net) -> list[Path]:
        """Where the eBPF driver finds each switch's maps."""
        return [s.plane.pin_dir for s in net.switches if isinstance(s, EbpfSwitch) and s.plane]


def peer_intf(intf):
    """The interface at the other end of a Mininet interface's link."""
    link = intf.link
    return link.intf2 if link.intf1 is intf else link.intf1
