"""The eBPF switch as a Mininet switch: `Mininet(topo, switch=EbpfSwitch, controller=None)`.

Like Mininet's own switches it lives in the root namespace; each one loads its own copy of the program and maps
(pinned under /sys/fs/bpf/mbalancer/<name>/) and attaches it to every one of its ports, so several switches per
network work and the controller's eBPF driver writes to all of them (`EbpfSwitch.driver_settings(net)` names
them). With mirror=True (the default) it also makes its mirror link (dataplanes/bpf/program.py, mirror_link_of):
writes to hot keys are cloned to the switch side and the driver reads them on the controller side."""
from __future__ import annotations

import subprocess
from typing import Any

from mininet.node import Switch

from dataplanes.bpf.program import DataPlane, mirror_link_of
from dataplanes.ebpf.tcp.path import TcpPath
from dataplanes.switch_nodes import peer_intf


class EbpfSwitch(Switch):
    def __init__(self, name: str, mirror: bool = True, memcached_ports: tuple[int, ...] = (11211,),
                 flood_exclude: tuple[str, ...] = (), tcp: bool = False, tcp_in_box: bool = False, **params):
        """flood_exclude: names of neighbour switches this one never floods to (a loop-free flood tree); tcp: with
        its TCP path (clients' TCP gets balanced too: dataplanes/ebpf/tcp/); tcp_in_box: its splitter runs in its
        box's namespace, from when it has one (enter_box: the switches of a fabric share the root namespace)."""
        super().__init__(name, **params)
        self.mirror = mirror
        self.tcp = tcp
        self.tcp_in_box = tcp_in_box
        self.tcp_netns: str | None = None  # where its splitter runs; None: here
        self.tcp_path: TcpPath | None = None
        self.flood_exclude = set(flood_exclude)
        self.memcached_ports = memcached_ports
        self.plane: DataPlane | None = None

    @property
    def mirror_iface(self) -> str:
        """The controller's end of this switch's mirror link."""
        return mirror_link_of(self.name)[1]

    def start(self, controllers) -> None:
        self.plane = DataPlane(self.name)  # held before it loads: an interrupted start is still unloaded by stop
        self.plane.load()
        intfs = [intf for intf in self.intfList() if intf.name != "lo"]
        ports = [intf.name for intf in intfs]
        flood = [intf.name for intf in intfs if peer_intf(intf).node.name not in self.flood_exclude]
        mirror_ifindex = self.plane.add_mirror_link() if self.mirror else 0
        for port in ports:
            subprocess.run(["ip", "link", "set", port, "up"], check=True)
        if self.tcp and (self.tcp_netns or not self.tcp_in_box):  # before the ports: a connection opened in between
            self._start_tcp_path()                                  # would bypass the splitter for good
        self.plane.serve(ports, mirror_ifindex, self.memcached_ports, flood)

    def enter_box(self, netns: str) -> None:
        """Its box's namespace exists (topologies/agents.py): its splitter runs there (before any client does)."""
        if self.tcp and self.tcp_in_box and self.tcp_path is None:  # (a reload made it there again already)
            self.tcp_netns = netns
            self._start_tcp_path()

    def _start_tcp_path(self) -> None:
        self.tcp_path = TcpPath(self.plane, self.memcached_ports, splitter_netns=self.tcp_netns).start()

    def reload(self) -> None:
        """A fresh program and empty tables on the same ports (experiments start every run from a clean switch)."""
        self._stop_plane()
        self.start([])

    def stop(self, deleteIntfs: bool = True) -> None:
        self._stop_plane()
        super().stop(deleteIntfs)

    def _stop_plane(self) -> None:
        try:
            if self.tcp_path is not None:
                self.tcp_path.stop()
        finally:  # the pins go even if the splitter's stop failed or was interrupted
            self.tcp_path = None
            if self.plane is not None:
                self.plane.unload()  # the mirror link with it
                self.plane = None

    def box_settings(self) -> dict[str, Any]:
        """The [dataplane.ebpf] section of the agent that drives this switch from its box (topologies/agents.py)."""
        return {"switches": [self.name]}

    @property
    def box_links(self) -> tuple[str, ...]:
        """What goes into the box with its agent: the controller's end of the mirror link."""
        return (self.mirror_iface,)

    @staticmethod
    def driver_settings(net) -> dict[str, Any]:
        """The [dataplane.ebpf] section that drives this network's eBPF switches."""
        return {"switches": [s.name for s in net.switches if isinstance(s, EbpfSwitch) and s.plane]}
