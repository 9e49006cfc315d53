"""Raw frames into and out of a bmv2 switch's ports, for the P4 tests and benchmarks: veth pairs in the root
namespace, the switch on one end, an AF_PACKET socket on the other. Everything is named after the caller's tag and
removed by close()."""
from __future__ import annotations

import select
import socket
import subprocess
import time
from typing import Callable, Sequence

from mbalancer.packets import interface_socket

WAIT = 5.0  # seconds a frame may take through bmv2 (far more than it does: the bound, not the expectation)
BURST = 32  # frames sent at once by send_paced: well within bmv2's queue


class Ports:
    """veth pairs: the switch's end <tag>-<n>, the test's end <tag>-<n>t (raw frames in and out)."""

    def __init__(self, tag: str, count: int):
        self.switch_ends = [f"{tag}-{n}" for n in range(1, count + 1)]
        self.sockets: dict[int, socket.socket] = {}
        for n, iface in enumerate(self.switch_ends, 1):
            subprocess.run(["ip", "link", "add", iface, "type", "veth", "peer", "name", iface + "t"], check=True)
            for end in (iface, iface + "t"):
                subprocess.run(["sysctl", "-qw", f"net.ipv6.conf.{end}.disable_ipv6=1"], check=False)
                subprocess.run(["ip", "link", "set", end, "up"], check=True)
            self.sockets[n] = interface_socket(iface + "t")

    def send(self, port: int, frame: bytes) -> None:
        self.sockets[port].send(frame)

    def send_paced(self, port: int, frames: Sequence[bytes], packets: Callable[[], int]) -> bool:
        """Every frame into `port`, BURST at a time, each burst once the switch has read the one before (`packets`:
        the switch's count of frames read), so none is dropped for want of room; True once it has read them all
        (within WAIT of the last burst)."""
        start = packets()
        for first in range(0, len(frames), BURST):
            deadline = time.monotonic() + WAIT
            while packets() < start + first and time.monotonic() < deadline:
                time.sleep(0.002)
            for frame in frames[first:first + BURST]:
                self.sockets[port].send(frame)
        deadline = time.monotonic() + WAIT
        while packets() < start + len(frames) and time.monotonic() < deadline:
            time.sleep(0.01)
        return packets() == start + len(frames)

    def drain(self, quiet: float = 0.0) -> None:
        """Drop what every port has received; with `quiet`, go on until no frame came for that long (bounded by
        WAIT): bmv2 emits a frame some time after its ingress counted it, later on a busy machine."""
        deadline = time.monotonic() + WAIT
        while True:
            for sock in self.sockets.values():
                while select.select([sock], [], [], 0)[0]:
                    sock.recv(65535)
            left = min(quiet, deadline - time.monotonic())
            if left <= 0 or not select.select(list(self.sockets.values()), [], [], left)[0]:
                return

    def receive(self, port: int, timeout: float = WAIT) -> bytes | None:
        """The next frame the switch sent out of `port` (frames the test itself sent are not seen: outgoing)."""
        deadline = time.monotonic() + timeout
        sock = self.sockets[port]
        while time.monotonic() < deadline:
            if select.select([sock], [], [], deadline - time.monotonic())[0]:
                frame, address = sock.recvfrom(65535)
                if address[2] != socket.PACKET_OUTGOING:
                    return frame
        return None

    def close(self) -> None:
        for sock in self.sockets.values():
            sock.close()
        for iface in self.switch_ends:
            subprocess.run(["ip", "link", "del", iface], check=False, capture_output=True)
