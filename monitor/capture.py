"""Live capture of memcached requests: an AF_PACKET socket with the kernel filter of bpf.py.

Not scapy's sniff (about 4k packets/s here): a raw socket read in a tight loop, the filter and the 1-in-k sampling
done in the kernel. The kernel's own counters (PACKET_STATISTICS) say how many packets the filter passed and how
many the socket dropped for lack of buffer.
"""
from __future__ import annotations

import ctypes
import select
import socket
import struct
import time
from typing import Callable, Iterator, Sequence

from mbalancer.interfaces import interface_index, link_type
from mbalancer.memcache.udp import SO_RCVBUFFORCE
from monitor.bpf import assemble, request_filter
from mbalancer.packets import LINKTYPE_ETHERNET

ETH_P_ALL = 0x0003
SO_ATTACH_FILTER = 26
SOL_PACKET = 263
PACKET_STATISTICS = 6
ETHERNET_FRAMED = (1, 772)  # ARPHRD_ETHER, ARPHRD_LOOPBACK: both carry a 14-byte Ethernet header
RECEIVE_BUFFER = 32 * 1024 * 1024
MAX_FRAME = 65536
CLOCK_EVERY = 64  # frames read between clock reads in a burst


class CaptureError(RuntimeError):
    """The interface cannot be captured on (missing, not Ethernet-framed, or no permission)."""


class LiveCapture:
    """Requests arriving on one interface, or on any of several (one socket on all interfaces; the kernel filter
    keeps those whose ifindex is listed, so each request is counted once, where it enters)."""

    linktype = LINKTYPE_ETHERNET

    def __init__(self, ifaces: str | Sequence[str], port: int = 11211, sample: int = 1):
        self.ifaces = [ifaces] if isinstance(ifaces, str) else list(ifaces)
        if not self.ifaces:
            raise CaptureError("no interface to capture on")
        self.received = 0  # passed by the kernel filter (after sampling)
        self.dropped = 0  # passed by the filter but lost: the socket buffer was full
        ifindexes = tuple(_ethernet_ifindex(iface) for iface in self.ifaces)
        several = len(ifindexes) > 1
        self.port, self.sample = port, sample
        self._only = ifindexes if several else ()  # the filter's interfaces (one bound socket needs none)
        try:
            # protocol 0: nothing arrives until bound; a socket for several interfaces cannot bind to one and
            # receives from the start, so what came before the filter is drained below.
            self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL) if several else 0)
        except PermissionError:
            raise CaptureError("capturing needs root (or CAP_NET_RAW)") from None
        self.set_sample(sample)
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, RECEIVE_BUFFER)
        except PermissionError:
            pass
        self.sock.setblocking(False)
        if several:
            _drain(self.sock)
        else:
            self.sock.bind((self.ifaces[0], ETH_P_ALL))

    def set_sample(self, sample: int) -> None:
        """Keep 1 in `sample` requests from now on: the kernel filter is replaced in one step."""
        try:
            code = assemble(request_filter(self.port, sample, self._only))
        except ValueError as err:
            raise CaptureError(str(err)) from None
        program = ctypes.create_string_buffer(code, len(code))  # must outlive the setsockopt
        fprog = struct.pack("HL", len(code) // 8, ctypes.addressof(program))
        self.sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)
        self._program, self.sample = program, sample

    def frames(self, until: float, wake_every: float,
               stop: Callable[[], bool] = lambda: False) -> Iterator[tuple[float, bytes | None]]:
        """(time, frame) as frames arrive; (time, None) at least every `wake_every` s, so reports go out on time
        whether traffic stops or never lets up (the socket is drained in bursts of at most `wake_every` s: under
        steady traffic it may never be empty). Ends at monotonic time `until`, or once stop() says so."""
        poller = select.poll()
        poller.register(self.sock.fileno(), select.POLLIN)
        recv = self.sock.recv
        while (left := until - time.monotonic()) > 0 and not stop():
            if not poller.poll(min(left, wake_every) * 1000):
                yield time.time(), None
                continue
            now = time.time()  # a clock read per CLOCK_EVERY frames: reports need interval accuracy, not per packet
            burst_ends, read = time.monotonic() + wake_every, 0
            while True:
                try:
                    frame = recv(MAX_FRAME)
                except BlockingIOError:
                    break
                yield now, frame
                read += 1
                if read % CLOCK_EVERY == 0:
                    now = time.time()
                    if time.monotonic() >= burst_ends or stop():
                        break
            yield now, None

    def update_statistics(self) -> dict[str, int]:
        """The kernel's counters since the last call (reading them resets them), also added to the totals."""
        packets, drops = struct.unpack("II", self.sock.getsockopt(SOL_PACKET, PACKET_STATISTICS, 8))
        self.received += packets
        self.dropped += drops
        return {"kernel_received": packets, "kernel_dropped": drops}

    def close(self) -> None:
        self.update_statistics()
        self.sock.close()


def _ethernet_ifindex(iface: str) -> int:
    index = interface_index(iface)
    if index is None:
        raise CaptureError(f"no network interface named {iface!r} in this network namespace")
    if (kind := link_type(iface)) not in ETHERNET_FRAMED:
        raise CaptureError(f"{iface} is not Ethernet-framed (ARPHRD {kind})")
    return index


def _drain(sock: socket.socket) -> None:
    """Throw away what an unbound socket received before its filter was attached."""
    while True:
        try:
            sock.recv(MAX_FRAME)
        except BlockingIOError:
            return
