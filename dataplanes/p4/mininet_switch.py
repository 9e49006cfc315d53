"""bmv2 as a Mininet switch: simple_switch_grpc on the switch's ports (port i + 1 on its i-th interface), P4Runtime on
a free port of 127.0.0.1, the program pushed at start so it forwards L2 at once; the controller's P4Runtime driver
takes it over and fills its tables. bmv2 does not complete checksums the kernel left to the receiver, so the
hosts' checksum offload is turned off."""
from __future__ import annotations

import subprocess
from typing import Any

from mininet.node import Switch

from dataplanes.switch_nodes import peer_intf


class P4Switch(Switch):
    def __init__(self, name: str, flood_exclude: tuple[str, ...] = (), grpc_host: str = "127.0.0.1", **params):
        """flood_exclude: names of neighbour switches this one never floods to (a loop-free flood tree); grpc_host:
        where P4Runtime listens (a box's agent reaches it there)."""
        super().__init__(name, **params)
        self.flood_exclude = set(flood_exclude)
        self.grpc_host = grpc_host
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
        self.bmv2 = Bmv2Switch(self.name, [intf.name for intf in intfs], flood_ports=flood,
                               grpc_host=self.grpc_host).start().bootstrap()

    def reload(self) -> None:
        """An empty switch on the same ports and address, forwarding L2 until the driver takes over again."""
        self.bmv2.restart()
        self.bmv2.bootstrap()

    def stop(self, deleteIntfs: bool = True) -> None:
        if self.bmv2 is not None:
            self.bmv2.stop()
            self.bmv2 = None
        super().stop(deleteIntfs)

    def box_settings(self) -> dict[str, Any]:
        """The [dataplane.p4] section of the agent that drives this switch from its box (topologies/agents.py)."""
        return {"switches": [self.bmv2.address]}

    box_links: tuple[str, ...] = ()  # PacketIns carry its copies: no link of its own goes to the box

    @staticmethod
    def driver_settings(net) -> dict[str, Any]:
        """The [dataplane.p4] section that drives this network's bmv2 switches (each keeps the flood group its
        start wrote: no `ports`)."""
        return {"switches": [s.bmv2.address for s in net.switches if isinstance(s, P4Switch) and s.bmv2]}
