"""The eBPF switch as the namespace topology's switch (topologies/netns.py): the program on every port, plus its
mirror link."""
from __future__ import annotations

from typing import Any

from dataplanes.bpf.program import DataPlane


class EbpfPorts:
    """The eBPF data plane over the network's switch ports, with its mirror link."""

    def __init__(self, tag: str):
        self.plane = DataPlane(tag)
        self.ports: list[str] = []

    def start(self, ports: list[str], wire_ends: list[tuple[str | None, str]] = ()) -> None:
        self.ports = list(ports)
        self.plane.load()
        self.plane.serve(ports, self.plane.add_mirror_link())

    def reload(self) -> None:
        """Unload the program and load it again: every table starts empty, as after a switch restart."""
        self.close()
        self.start(self.ports)

    def close(self) -> None:
        self.plane.unload()

    def driver_settings(self) -> dict[str, Any]:
        return {"switches": [self.plane.name]}
