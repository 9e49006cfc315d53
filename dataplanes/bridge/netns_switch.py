"""A Linux bridge as the namespace topology's switch: forwarding only, the benchmarks' baseline."""
from __future__ import annotations

from typing import Any

from dataplanes.switch_nodes import sh


class BridgePorts:
    """A Linux bridge over the network's switch ports: forwarding only."""

    def __init__(self, tag: str):
        self.name = f"{tag}-br"

    def start(self, ports: list[str], wire_ends: list[tuple[str | None, str]] = ()) -> None:
        sh("ip", "link", "add", self.name, "type", "bridge")
        for port in ports:
            sh("ip", "link", "set", port, "master", self.name)
        sh("ip", "link", "set", self.name, "up")

    def close(self) -> None:
        sh("ip", "link", "del", self.name, check=False)

    def driver_settings(self) -> dict[str, Any]:
        return {}
