"""Open vSwitch as a Mininet switch: a private instance per switch, userspace datapath (dataplanes/openflow/ovs.py),
with the key classifier on the far end of each of its links, and ryu-manager running the MBalancer app (started by
the experiment's stack, not by Mininet) as its controller at `controller`, or a switch agent on its box connected to
its bridge's management socket (a testbed with agents: topologies/agents.py). Until either programs it, a lone
NORMAL rule forwards L2, so the testbed can fill its servers first. Ports towards `flood_exclude` get no-flood at
start (NORMAL floods too), and the agent's port_flags set it again whenever ovs-vswitchd comes back."""
from __future__ import annotations

import subprocess
from typing import Any

from mininet.node import Switch

from dataplanes.bpf.program import DataPlane
from dataplanes.switch_nodes import peer_intf
from mbalancer.memcache.server import free_port


class OpenflowSwitch(Switch):
    # One Open vSwitch for every OpenFlow switch node of this process: an instance's netdev datapath makes a tap named
    # ovs-netdev in the root namespace, so a second instance on the same kernel cannot open its own. Each node is a
    # bridge of it (tables, management socket and controller of its own); the instance is named after the node that
    # started it, by which name a killed run's successor removes it (the registry's leftovers hook).
    shared: Any = None
    users: set[str] = set()

    def __init__(self, name: str, controller: str | None = None, memcached_ports: tuple[int, ...] = (11211,),
                 flood_exclude: tuple[str, ...] = (), **params):
        """flood_exclude: names of neighbour switches this one never floods to (a loop-free flood tree)."""
        super().__init__(name, **params)
        self.controller = controller or f"127.0.0.1:{free_port()}"
        self.flood_exclude = set(flood_exclude)
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
        if OpenflowSwitch.shared is None:
            OpenflowSwitch.shared = OpenVSwitch(self.name).start()
        OpenflowSwitch.users.add(self.name)
        self.ovs = OpenflowSwitch.shared
        self.ovs.add_bridge(self.bridge, [intf.name for intf in intfs], f"tcp:{self.controller}")
        for intf in intfs:
            if peer_intf(intf).node.name in self.flood_exclude:
                self.ovs.no_flood(self.bridge, intf.name)

    def reload(self) -> None:
        """Empty tables: a fresh classifier and bridge on the same ports."""
        self._unload()
        self.start([])

    def stop(self, deleteIntfs: bool = True) -> None:
        self._unload()
        super().stop(deleteIntfs)

    def _unload(self) -> None:
        if self.ovs is not None:
            OpenflowSwitch.users.discard(self.name)
            if OpenflowSwitch.users:
                self.ovs.remove_bridge(self.bridge)
            else:
                self.ovs.stop()
                OpenflowSwitch.shared = None
            self.ovs = None
        if self.classifier is not None:
            self.classifier.unload()
            self.classifier = None

    def box_settings(self) -> dict[str, Any]:
        """The [dataplane.openflow] section of the agent that drives this switch from its box (topologies/agents.py):
        its classifier, and its bridge through the management socket (the box shares this machine's file system)."""
        return {"classifier": self.name, "connect": f"unix:{self.ovs.rundir}/{self.bridge}.mgmt",
                "port_flags": [f"{intf.name} no-flood" for intf in self.intfList()
                               if intf.name != "lo" and peer_intf(intf).node.name in self.flood_exclude]}

    @property
    def box_links(self) -> tuple[str, ...]:
        """Nothing: the switch's copies come to the agent as PacketIns over its OpenFlow connection."""
        return ()

    @staticmethod
    def driver_settings(net) -> dict[str, Any]:
        """The [dataplane.openflow] section that drives this network's (single) OpenFlow switch."""
        switch = next(s for s in net.switches if isinstance(s, OpenflowSwitch))
        return {"classifier": switch.name, "listen": switch.controller}
