"""From a captured frame to the memcached payload: link layer, IPv4, then UDP or TCP to the memcached port.

Only requests matter (destination port = the memcached port); replies and other traffic come back as None.
IPv4 fragments after the first carry no transport header and are skipped as such.
"""
from __future__ import annotations

import socket
import struct
from typing import NamedTuple

LINKTYPE_NULL = 0
LINKTYPE_ETHERNET = 1
LINKTYPE_RAW = 101
LINKTYPE_LINUX_SLL = 113
LINKTYPE_IPV4 = 228
LINKTYPE_LINUX_SLL2 = 276
SUPPORTED_LINKTYPES = (LINKTYPE_NULL, LINKTYPE_ETHERNET, LINKTYPE_RAW, LINKTYPE_LINUX_SLL, LINKTYPE_IPV4,
                       LINKTYPE_LINUX_SLL2)

ETHERTYPE_IPV4 = 0x0800
VLAN_TYPES = (0x8100, 0x88A8)
ETH_P_ALL = 0x0003  # every protocol, for AF_PACKET sockets
UDP, TCP = 17, 6
_U16 = struct.Struct("!H")
_U32 = struct.Struct("!I")
TCP_FIN, TCP_RST = 0x01, 0x04


class Segment(NamedTuple):
    transport: int  # UDP or TCP
    payload: bytes
    destination: str = ""  # "ip:port" the request was sent to (its server, as the client chose it)
    source: str = ""  # "ip:port" it came from (the client)
    seq: int | None = None  # TCP: the segment's sequence number


def ip_offset(frame: bytes, linktype: int) -> int | None:
    """Where the IPv4 header starts in a frame of this link type, or None when it is not IPv4."""
    if linktype == LINKTYPE_ETHERNET:
        offset, ethertype = 14, _U16.unpack_from(frame, 12)[0] if len(frame) >= 14 else 0
        while ethertype in VLAN_TYPES and len(frame) >= offset + 4:
            ethertype, offset = _U16.unpack_from(frame, offset + 2)[0], offset + 4
        return offset if ethertype == ETHERTYPE_IPV4 else None
    if linktype in (LINKTYPE_RAW, LINKTYPE_IPV4):
        return 0
    if linktype == LINKTYPE_LINUX_SLL:
        return 16 if len(frame) >= 16 and _U16.unpack_from(frame, 14)[0] == ETHERTYPE_IPV4 else None
    if linktype == LINKTYPE_LINUX_SLL2:
        return 20 if len(frame) >= 20 and _U16.unpack_from(frame, 0)[0] == ETHERTYPE_IPV4 else None
    if linktype == LINKTYPE_NULL:  # BSD loopback: 4-byte address family in host order; 2 is IPv4
        return 4 if len(frame) >= 4 and frame[0] in (2, 0) and frame[3] in (2, 0) else None
    return None


def destination(frame: bytes, linktype: int) -> tuple[str, int] | None:
    """The destination IPv4 address and UDP/TCP port of a frame, or None if it has none."""
    ip = ip_offset(frame, linktype)
    if ip is None or len(frame) < ip + 20 or frame[ip + 9] not in (UDP, TCP):
        return None
    start = ip + (frame[ip] & 0x0F) * 4
    if len(frame) < start + 4:
        return None
    return socket.inet_ntoa(frame[ip + 16:ip + 20]), _U16.unpack_from(frame, start + 2)[0]


def closing_source(frame: bytes, linktype: int) -> tuple[str, int] | None:
    """The source IPv4 address and port of a TCP frame that closes its connection (FIN or RST), or None."""
    ip = ip_offset(frame, linktype)
    if ip is None or len(frame) < ip + 20 or frame[ip + 9] != TCP:
        return None
    start = ip + (frame[ip] & 0x0F) * 4
    if len(frame) < start + 14 or not frame[start + 13] & (TCP_FIN | TCP_RST):
        return None
    return socket.inet_ntoa(frame[ip + 12:ip + 16]), _U16.unpack_from(frame, start)[0]


def memcached_segment(frame: bytes, linktype: int, port: int) -> Segment | str:
    """The UDP/TCP payload of a request to `port`, or why the frame is skipped (a short reason)."""
    ip = ip_offset(frame, linktype)
    if ip is None:
        return "not IPv4"
    if len(frame) < ip + 20 or frame[ip] >> 4 != 4:
        return "truncated IPv4"
    header_length = (frame[ip] & 0x0F) * 4
    total_length = _U16.unpack_from(frame, ip + 2)[0]
    if header_length < 20 or total_length < header_length:
        return "malformed IPv4"
    if _U16.unpack_from(frame, ip + 6)[0] & 0x1FFF:
        return "IPv4 fragment"
    end = min(len(frame), ip + total_length)  # Ethernet pads short frames: trust the IP length
    transport, start = frame[ip + 9], ip + header_length
    to = f"{socket.inet_ntoa(frame[ip + 16:ip + 20])}:{port}"
    if transport == UDP:
        if end < start + 8:
            return "truncated UDP"
        if _U16.unpack_from(frame, start + 2)[0] != port:
            return "other port"
        return Segment(UDP, frame[start + 8:end], to)
    if transport == TCP:
        if end < start + 20:
            return "truncated TCP"
        if _U16.unpack_from(frame, start + 2)[0] != port:
            return "other port"
        data = start + (frame[start + 12] >> 4) * 4
        if data < start + 20 or data > end:
            return "malformed TCP"
        source = f"{socket.inet_ntoa(frame[ip + 12:ip + 16])}:{_U16.unpack_from(frame, start)[0]}"
        return Segment(TCP, frame[data:end], to, source, _U32.unpack_from(frame, start + 4)[0])
    return "not UDP or TCP"


def interface_socket(iface: str) -> socket.socket:
    """An AF_PACKET socket that hears every frame of `iface` and of no other interface. It is made deaf (protocol 0)
    and bound with its protocol: one made with ETH_P_ALL hears every interface of the namespace until bind(), and
    keeps what it heard (a management LAN's frame once came out of a mirror link's socket that way)."""
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
    try:
        sock.bind((iface, ETH_P_ALL))  # (Python puts a bind's protocol in network order itself)
    except OSError:
        sock.close()
        raise
    return sock
