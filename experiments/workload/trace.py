"""Synthetic memcached traffic as frames and pcap files: Zipf gets to load the monitor and the data planes
without the cost of real clients (tcpreplay offers a pcap at hundreds of thousands of packets a second)."""
from __future__ import annotations

import socket
import struct
from pathlib import Path
from typing import Iterable

import numpy as np

from experiments.simulation.zipf import zipf_weights
from mbalancer.memcache.frame import pack_udp_frame

MAC_DST, MAC_SRC = b"\x02\x00\x00\x00\x00\x02", b"\x02\x00\x00\x00\x00\x01"
IP_SRC, IP_DST = bytes([10, 0, 0, 1]), bytes([10, 0, 0, 2])
LINKTYPE_ETHERNET = 1


def ipv4(protocol: int, transport: bytes, flags_fragment: int = 0, dst: bytes = IP_DST) -> bytes:
    """An IPv4 packet from 10.0.0.1 to `dst` (checksum left 0: nothing here routes it)."""
    header = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(transport), 1, flags_fragment, 64, protocol, 0,
                         IP_SRC, dst)
    return header + transport


def ethernet(ip_packet: bytes, ethertype: int = 0x0800) -> bytes:
    return MAC_DST + MAC_SRC + struct.pack("!H", ethertype) + ip_packet


def udp_frame(payload: bytes, dport: int = 11211, sport: int = 40000, request_id: int = 1,
              dst: str = "10.0.0.2") -> bytes:
    """An Ethernet frame carrying one memcached UDP request (frame header included) to dst:dport."""
    data = pack_udp_frame(request_id, payload)
    return ethernet(ipv4(17, struct.pack("!HHHH", sport, dport, 8 + len(data), 0) + data, dst=socket.inet_aton(dst)))


def tcp_frame(payload: bytes, dport: int = 11211, sport: int = 40000, dst: str = "10.0.0.2") -> bytes:
    """An Ethernet frame carrying one TCP segment of memcached requests to dst:dport."""
    header = struct.pack("!HHIIBBHHH", sport, dport, 1, 1, 5 << 4, 0x18, 65535, 0, 0)
    return ethernet(ipv4(6, header + payload, dst=socket.inet_aton(dst)))


def zipf_trace(keys: int, alpha: float, gets: int, seed: int = 1, ranks: np.ndarray | None = None) -> np.ndarray:
    """Key indices of `gets` requests; `ranks` maps popularity rank -> key index (default: identity)."""
    rng = np.random.default_rng(seed)
    cumulative = np.cumsum(zipf_weights(keys, alpha))
    drawn = np.minimum(np.searchsorted(cumulative, rng.random(gets), side="right"), keys - 1)
    return drawn if ranks is None else ranks[drawn]


def get_frames(key_indices: np.ndarray, port: int = 11211) -> list[bytes]:
    """One UDP `get key:<i>` frame per request (frames of a key are built once and shared)."""
    cache: dict[int, bytes] = {}
    out = []
    for index in key_indices.tolist():
        frame = cache.get(index)
        if frame is None:
            frame = cache[index] = udp_frame(b"get key:%d\r\n" % index, dport=port)
        out.append(frame)
    return out


def write_pcap(path: Path, frames: Iterable[bytes], rate: float = 100_000.0) -> None:
    """A little-endian microsecond pcap of Ethernet frames, timestamped `rate` frames a second apart."""
    record = struct.Struct("<IIII")
    with open(path, "wb") as out:
        out.write(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, LINKTYPE_ETHERNET))
        for i, frame in enumerate(frames):
            micros = int(i * 1e6 / rate)
            out.write(record.pack(micros // 1_000_000, micros % 1_000_000, len(frame), len(frame)))
            out.write(frame)


def write_trafgen(path: Path, frames: Iterable[bytes]) -> None:
    """The frames as a packet config of netsniff-ng's trafgen, one packet per line: trafgen sends them round robin
    from a TX ring (well over a million packets a second, where tcpreplay's write() per packet stops near 200k)."""
    with open(path, "w") as out:
        for frame in frames:
            out.write("{ " + ", ".join(f"0x{byte:02x}" for byte in frame) + " }\n")
