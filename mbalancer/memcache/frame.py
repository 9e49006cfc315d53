"""The memcached UDP frame header: request id, sequence number, datagram count, reserved (2 bytes each, network
order), then the ASCII payload. A reply longer than one datagram comes as `total` datagrams that share the request
id and carry sequence numbers 0..total-1."""
from __future__ import annotations

import struct
from dataclasses import dataclass

from mbalancer.memcache.results import NotParsed

UDP_HEADER = struct.Struct("!HHHH")
UDP_HEADER_SIZE = UDP_HEADER.size  # 8


@dataclass(frozen=True)
class UdpFrame:
    request_id: int
    sequence: int
    total: int
    reserved: int = 0


def pack_udp_frame(request_id: int, payload: bytes, sequence: int = 0, total: int = 1) -> bytes:
    """A datagram: header then payload. request_id, sequence and total are 16-bit."""
    return UDP_HEADER.pack(request_id & 0xFFFF, sequence, total, 0) + payload


def parse_udp_frame(datagram: bytes) -> tuple[UdpFrame, bytes] | NotParsed:
    """Split a datagram into its frame header and payload."""
    if len(datagram) < UDP_HEADER_SIZE:
        return NotParsed(f"datagram of {len(datagram)} bytes is shorter than the 8-byte frame header")
    request_id, sequence, total, reserved = UDP_HEADER.unpack_from(datagram)
    if total == 0 or sequence >= total:
        return NotParsed(f"frame header says datagram {sequence} of {total}")
    return UdpFrame(request_id, sequence, total, reserved), bytes(datagram[UDP_HEADER_SIZE:])


def reassemble(parts: dict[int, bytes], total: int) -> bytes | None:
    """The whole payload once all `total` datagrams (by sequence number) are in, else None."""
    if len(parts) < total:
        return None
    return b"".join(parts[i] for i in range(total))
