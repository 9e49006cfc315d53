"""The eBPF switch as the namespace topology's switch (topologies/netns.py): the program on every port, plus its
mirror link, and its TCP path when asked for (dataplanes/ebpf/tcp/)."""
from __future__ import annotations

from typing import Any, Sequence

from dataplanes.bpf.program import DataPlane
from dataplanes.ebpf.tcp.path import TcpPath


class EbpfPorts:
    """The eBPF data plane over the network's switch ports, with its mirror link; with `tcp_ports` (memcached
    ports), its TCP path too: clients' TCP gets to those ports are balanced as UDP ones are."""

    def __init__(self, tag: str, tcp_ports: Sequence[int] = ()):
        self.plane = DataPlane(tag)
        self.ports: list[str] = []
        self.tcp_ports = tuple(tcp_ports)
        self.tcp_path: TcpPath | None = None

    def start(self, ports: list[str], wire_ends: list[tuple[str | None, str]] = ()) -> None:
        self.ports = list(ports)
        self.plane.load()
        if self.tcp_ports:  # before the ports: a connection opened in between would bypass the splitter for good
            self.tcp_path = TcpPath(self.plane, self.tcp_ports).start()
        self.plane.serve(ports, self.plane.add_mirror_link())

    def reload(self) -> None:
        """Unload the program and load it again: every table starts empty, as after a switch restart. The TCP path
        restarts with it (the splitter holds the old program's maps: it must not decide from them)."""
        self.close()
        self.start(self.ports)

    def close(self) -> None:
        try:
            if self.tcp_path is not None:
                self.tcp_path.stop()
        finally:  # the pins go even if the splitter's stop failed or was interrupted
            self.tcp_path = None
            self.plane.unload()

    def driver_settings(self) -> dict[str, Any]:
        return {"switches": [self.plane.name]}
