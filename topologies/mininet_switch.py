"""Mininet switches of MBalancer's data planes: `Mininet(topo, switch=EbpfSwitch, controller=None)`.

EbpfSwitch: the eBPF data plane.

Like Mininet's own switches it lives in the root namespace; each one loads its own copy of the program and maps
(pinned under /sys/fs/bpf/mbalancer/<name>/) and attaches it to every one of its ports, so several switches per
network work and the controller's eBPF driver writes to all of them (`EbpfSwitch.driver_settings(net)` names
them). With mirror=True (the default) it also makes its mirror link (dataplanes/ebpf/program.py, mirror_link_of):
writes to hot keys are cloned to the switch side and the driver reads them on the controller side.

OpenflowSwitch: Open vSwitch (a private instance per switch, userspace datapath; dataplanes/openflow/ovs.py) with
the key classifier on the far end of each of its links, and ryu-manager running the MBalancer app (started by the
experiment's stack, not by Mininet) as its controller at `controller`. Until the app connects, a lone NORMAL rule
forwards L2, so the testbed can fill its servers first.

P4Switch: bmv2's simple_switch_grpc on the switch's ports (port i + 1 on its i-th interface), P4Runtime on a free
port of 127.0.0.1, the program pushed at start so it forwards L2 at once; the controller's P4Runtime driver takes it
over and fills its tables. bmv2 does not
complete checksums the kernel left to the receiver, so the hosts' checksum offload is turned off.
"""
from __future__ import annotations

import subprocess
from typing import Any

from mininet.node import Switch

from dataplanes.ebpf.program import DataPlane, mirror_link_of
from mbalancer.memcache.server import free_port
from topologies.shapes import peer_intf


class EbpfSwitch(Switch):
    def __init__(self, name: str, mirror: bool = True, memcached_ports: tuple[int, ...] = (11211,),
                 flood_exclude: tuple[str, ...] = (), **params):
        """flood_exclude: names of neighbour switches this one never floods to (a loop-free flood tree)."""
        super().__init__(name, **params)
        self.mirror = mirror
        self.flood_exclude = set(flood_exclude)
        self.memcached_ports = memcached_ports
        self.plane: DataPlane | None = None

    @property
    def mirror_iface(self) -> str:
        """The controller's end of this switch's mirror link."""
        return mirror_link_of(self.name)[1]

    def start(self, controllers) -> None:
        self.plane = DataPlane(self.name).load()
        intfs = [intf for intf in self.intfList() if intf.name != "lo"]
        ports = [intf.name for intf in intfs]
        flood = [intf.name for intf in intfs if peer_intf(intf).node.name not in self.flood_exclude]
        mirror_ifindex = self.plane.add_mirror_link() if self.mirror else 0
        for port in ports:
            subprocess.run(["ip", "link", "set", port, "up"], check=True)
        self.plane.serve(ports, mirror_ifindex, self.memcached_ports, flood)

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
    def driver_settings(net) -> dict[str, Any]:
        """The [dataplane.ebpf] section that drives this network's eBPF switches."""
        return {"switches": [s.name for s in net.switches if isinstance(s, EbpfSwitch) and s.plane]}


class OpenflowSwitch(Switch):
    def __init__(self, name: str, controller: str | None = None, memcached_ports: tuple[int, ...] = (11211,),
                 **params):
        super().__init__(name, **params)
        self.controller = controller or f"127.0.0.1:{free_port()}"
        self.memcached_ports = memcached_ports
        self.ovs = None
        self.classifier: DataPlane | None = None

    @property
    def bridge(self) -> str:
        return f"{self.name}-of"

    def start(self, controllers) -> None:
        from dataplanes.openflow import classifier
        from dataplanes.openflow.ovs import OpenVSwitch
        intfs = [intf for intf in self.intfList() if intf.name != "lo"]
        ends = []
        for intf in intfs:
            peer = peer_intf(intf)
            ends.append((f"/proc/{peer.node.pid}/ns/net" if peer.node.inNamespace else None, peer.name))
        self.classifier = classifier.load(self.name, ends, self.memcached_ports)
        for intf in intfs:
            subprocess.run(["ip", "link", "set", intf.name, "up"], check=True)
        self.ovs = OpenVSwitch(self.name).start()
        self.ovs.add_bridge(self.bridge, [intf.name for intf in intfs], f"tcp:{self.controller}")

    def reload(self) -> None:
        """Empty tables: a fresh classifier and Open vSwitch on the same ports."""
        self._unload()
        self.start([])

    def stop(self, deleteIntfs: bool = True) -> None:
        self._unload()
        super().stop(deleteIntfs)

    def _unload(self) -> None:
        if self.ovs is not None:
            self.ovs.stop()
            self.ovs = None
        if self.classifier is not None:
            self.classifier.unload()
            self.classifier = None

    @staticmethod
    def driver_settings(net) -> dict[str, Any]:
        """The [dataplane.openflow] section that drives this network's (single) OpenFlow switch."""
        switch = next(s for s in net.switches if isinstance(s, OpenflowSwitch))
        return {"classifier": switch.name, "listen": switch.controller}


class P4Switch(Switch):
    def __init__(self, name: str, flood_exclude: tuple[str, ...] = (), **params):
        """flood_exclude: names of neighbour switches this one never floods to (a loop-free flood tree)."""
        super().__init__(name, **params)
        self.flood_exclude = set(flood_exclude)
        self.bmv2 = None

    def start(self, controllers) -> None:
        from dataplanes.p4.bmv2 import Bmv2Switch
        intfs = [intf for intf in self.intfList() if intf.name != "lo"]
        for intf in intfs:
            subprocess.run(["ip", "link", "set", intf.name, "up"], check=True)
            peer = peer_intf(intf)
            if not isinstance(peer.node, Switch):
                peer.node.cmd(f"ethtool -K {peer.name} tx off")
        flood = [n for n, intf in enumerate(intfs, 1) if peer_intf(intf).node.name not in self.flood_exclude]
        self.bmv2 = Bmv2Switch(self.name, [intf.name for intf in intfs], flood_ports=flood).start().bootstrap()

    def reload(self) -> None:
        """An empty switch on the same ports and address, forwarding L2 until the driver takes over again."""
        self.bmv2.restart()
        self.bmv2.bootstrap()

    def stop(self, deleteIntfs: bool = True) -> None:
        if self.bmv2 is not None:
            self.bmv2.stop()
            self.bmv2 = None
        super().stop(deleteIntfs)

    @staticmethod
    def driver_settings(net) -> dict[str, Any]:
        """The [dataplane.p4] section that drives this network's bmv2 switches (each keeps the flood group its
        start wrote: no `ports`)."""
        return {"switches": [s.bmv2.address for s in net.switches if isinstance(s, P4Switch) and s.bmv2]}
