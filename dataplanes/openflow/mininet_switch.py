"""Open vSwitch as a Mininet switch: a private instance per switch, userspace datapath (dataplanes/openflow/ovs.py),
with the key classifier on the far end of each of its links, and ryu-manager running the MBalancer app (started by
the experiment's stack, not by Mininet) as its controller at `controller`. Until the app connects, a lone NORMAL
rule forwards L2, so the testbed can fill its servers first."""
from __future__ import annotations

import subprocess
from typing import Any

from mininet.node import Switch

from dataplanes.bpf.program import DataPlane
from dataplanes.switch_nodes import peer_intf
from mbalancer.memcache.server import free_port


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
