"""bmv2's simple_switch_grpc as the namespace topology's switch (topologies/netns.py)."""
from __future__ import annotations

from typing import Any


class Bmv2Ports:
    """bmv2's simple_switch_grpc over the network's switch ports (P4Runtime on 127.0.0.1), checksum offload off on
    every link's far end (bmv2 forwards frames as they are)."""

    def __init__(self, tag: str):
        self.tag = tag
        self.bmv2 = None

    def start(self, ports: list[str], wire_ends: list[tuple[str | None, str]] = ()) -> None:
        from dataplanes.p4.bmv2 import Bmv2Switch, no_checksum_offload
        for netns, iface in wire_ends:
            no_checksum_offload(iface, netns)
        self.bmv2 = Bmv2Switch(self.tag, ports).start().bootstrap()  # forwards L2 before a controller attaches

    def reload(self) -> None:
        """Restart the switch: it comes back empty, as after a crash (then forwards L2 again)."""
        self.bmv2.restart()
        self.bmv2.bootstrap()

    def close(self) -> None:
        if self.bmv2 is not None:
            self.bmv2.stop()
            self.bmv2 = None

    def driver_settings(self) -> dict[str, Any]:
        return {"switches": [self.bmv2.address], "ports": list(range(1, len(self.bmv2.interfaces) + 1))}
