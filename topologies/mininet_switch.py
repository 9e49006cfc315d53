"""A Mininet switch that runs the eBPF data plane: `Mininet(topo, switch=EbpfSwitch, controller=None)`.

Like Mininet's own switches it lives in the root namespace; each one loads its own copy of the program and maps
(pinned under /sys/fs/bpf/mbalancer/<name>/) and attaches it to every one of its ports, so several switches per
network work and the controller's eBPF driver writes to all of them (`EbpfSwitch.pin_dirs(net)`). With mirror=True
(the default) it also makes its mirror link `<name>-m` <-> `<name>-mc`: writes to hot keys are cloned to `<name>-m`
and the driver reads them on `<name>-mc`.
"""
from __future__ import annotations

import socket
import subprocess
from pathlib import Path

from mininet.node import Switch

from topologies.ebpf.program import DataPlane
from topologies.ebpf.tables import Tables


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
        mirror_ifindex = 0
        if self.mirror:
            subprocess.run(["ip", "link", "add", f"{self.name}-m", "type", "veth", "peer", "name", self.mirror_iface],
                           check=True, capture_output=True)
            for iface in (f"{self.name}-m", self.mirror_iface):
                subprocess.run(["sysctl", "-qw", f"net.ipv6.conf.{iface}.disable_ipv6=1"], capture_output=True)
                subprocess.run(["ip", "link", "set", iface, "up"], check=True)
            mirror_ifindex = socket.if_nametoindex(f"{self.name}-m")
        for port in ports:
            subprocess.run(["ip", "link", "set", port, "up"], check=True)
            self.plane.attach(port)
        tables = Tables(self.plane.pin_dir)
        try:
            tables.set_ports([socket.if_nametoindex(p) for p in ports])
            tables.set_settings(mirror_ifindex, self.memcached_port)
        finally:
            tables.close()

    def stop(self, deleteIntfs: bool = True) -> None:
        if self.plane is not None:
            self.plane.unload()
            self.plane = None
        if self.mirror:
            subprocess.run(["ip", "link", "del", f"{self.name}-m"], capture_output=True)
        super().stop(deleteIntfs)

    @staticmethod
    def pin_dirs(net) -> list[Path]:
        """Where the eBPF driver finds each switch's maps."""
        return [s.plane.pin_dir for s in net.switches if isinstance(s, EbpfSwitch) and s.plane]
