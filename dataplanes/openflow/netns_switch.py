"""Open vSwitch plus the key classifier as the namespace topology's switch (topologies/netns.py)."""
from __future__ import annotations

from typing import Any

from dataplanes.bpf.program import DataPlane


class OvsPorts:
    """Open vSwitch (a private instance, userspace datapath) over the network's switch ports, the key classifier on
    the far end of every link, and ryu-manager (started by whoever drives it) as the controller at `controller`."""

    def __init__(self, tag: str, controller: str = "127.0.0.1:6653"):
        from dataplanes.openflow.ovs import OpenVSwitch
        self.tag, self.controller = tag, controller
        self.ovs = OpenVSwitch(tag)
        self.bridge = f"{tag}-of"
        self.classifier: DataPlane | None = None

    def start(self, ports: list[str], wire_ends: list[tuple[str | None, str]] = ()) -> None:
        from dataplanes.openflow import classifier
        self.classifier = classifier.load(self.tag, wire_ends)
        self.ovs.start()
        self.ovs.add_bridge(self.bridge, ports, f"tcp:{self.controller}")

    def close(self) -> None:
        self.ovs.stop()
        if self.classifier is not None:
            self.classifier.unload()
            self.classifier = None

    def driver_settings(self) -> dict[str, Any]:
        return {"classifier": self.tag, "listen": self.controller}
