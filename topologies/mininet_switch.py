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
    def __init__(self, name: str, mirror: bool = True, memcached_port: int = 11211, **params):
        super().__init__(name, **params)
        self.mirror = mirror
        self.memcached_port = memcached_port
        self.plane: DataPlane | None = None

    @property
    def mirror_iface(self) -> str:
        """The controller's end of this switch's mirror link."""
        return f"{self.name}-mc"

    def start(self, controllers) -> None:
        self.plane = DataPlane(self.name).load()
        ports = [intf.name for intf in self.intfList() if intf.name != "lo"]
        mirror_ifindex = self.plane.add_mirror_link() if self.mirror else 0
        for port in ports:
            subprocess.run(["ip", "link", "set", port, "up"], check=True)
        self.plane.serve(ports, mirror_ifindex, self.memcached_port)

    def stop(self, deleteIntfs: bool = True) -> None:
        if self.plane is not None:
            self.plane.unload()  # the mirror link with it
            self.plane = None
        super().stop(deleteIntfs)

    @staticmethod
    def pin_dirs(net) -> list[Path]:
        """Where the eBPF driver finds each switch's maps."""
        return [s.plane.pin_dir for s in net.switches if isinstance(s, EbpfSwitch) and s.plane]
