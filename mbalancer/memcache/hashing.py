"""Key -> server hashes, as memcached clients use them. The controller needs the same one to know a key's home.

ketama   consistent hashing as libketama/libmemcached do it: 160 points per server on a 32-bit ring, four points
         from each MD5 of "host:port-i"; a key goes to the first point at or after the first 4 bytes of its MD5
         (both little-endian). Adding a server moves about 1/n of the keys.
modulo   python-memcached's classic crc32 hash modulo the number of servers.
skewed   an experiment device (the thesis used one with two servers): keys of a known Zipf workload are placed
         so the first server carries a chosen share of the requests, which dials the imbalance factor
         (mean load / max load). Keys outside the workload fall back to ketama.
"""
from __future__ import annotations

import bisect
import hashlib
import zlib
from typing import Protocol, Sequence

from mbalancer.memcache.addresses import ServerAddress

KETAMA_POINTS_PER_HASH = 4
KETAMA_HASHES_PER_SERVER = 40  # 160 points per server


class KeyHash(Protocol):
    spec: str

    def server_of(self, key: bytes) -> int:
        """Index of the key's server in the configured server list."""


class KetamaHash:
    spec = "ketama"

    def __init__(self, servers: Sequence[ServerAddress]):
        ring: list[tuple[int, int]] = []
        for index, server in enumerate(servers):
            for i in range(KETAMA_HASHES_PER_SERVER):
                digest = hashlib.md5(f"{server.host}:{server.port}-{i}".encode()).digest()
                for p in range(KETAMA_POINTS_PER_HASH):
                    ring.append((int.from_bytes(digest[4 * p:4 * p + 4], "little"), index))
        ring.sort()
        self._points = [point for point, _ in ring]
        self._owners = [owner for _, owner in ring]

    def server_of(self, key: bytes) -> int:
        point = int.from_bytes(hashlib.md5(key).digest()[:4], "little")
        slot = bisect.bisect_left(self._points, point)
        return self._owners[slot % len(self._points)]


class ModuloHash:
    spec = "modulo"

    def __init__(self, servers: Sequence[ServerAddress]):
        self._count = len(servers)

    def server_of(self, key: bytes) -> int:
        return ((zlib.crc32(key) >> 16) & 0x7FFF) % self._count


class SkewedHash:
    """Hottest keys first: to the first server while its share stays within the target, else to the least loaded
    of the others. The first server's share is 1 / (n * target), so the imbalance factor lands on the target up
    to the weight of the coldest keys."""

    def __init__(self, servers: Sequence[ServerAddress], keys: Sequence[bytes], weights: Sequence[float],
                 target: float):
        n = len(servers)
        self.spec = f"skewed:{target:g}"
        if n < 2:
            raise ValueError("a skewed hash needs at least two servers")
        highest = 1.0 / (n * max(weights))  # the hottest key alone caps the imbalance factor
        if not 1.0 / n <= target <= min(1.0, highest):
            raise ValueError(f"skewed imbalance factor {target:g} is out of reach: with {n} servers and these keys "
                             f"it must lie in [{1 / n:.3f}, {min(1.0, highest):.3f}]")
        heavy_share = 1.0 / (n * target)
        loads = [0.0] * n
        self._table: dict[bytes, int] = {}
        for key, weight in sorted(zip(keys, weights), key=lambda kw: -kw[1]):
            if loads[0] + weight <= heavy_share + 1e-12:
                server = 0
            else:
                server = min(range(1, n), key=loads.__getitem__)
            loads[server] += weight
            self._table[key] = server
        self._fallback = KetamaHash(servers)

    def server_of(self, key: bytes) -> int:
        server = self._table.get(key)
        return self._fallback.server_of(key) if server is None else server

    def placement(self) -> dict[bytes, int]:
        """The workload's keys and their servers (what TableHash rebuilds it from in another process)."""
        return dict(self._table)


class TableHash(SkewedHash):
    """A skewed hash rebuilt from its placement (keys -> servers) without the workload: the same homes for every key,
    ketama for keys outside the table."""

    def __init__(self, spec: str, servers: Sequence[ServerAddress], table: dict[bytes, int]):
        self.spec = spec
        if any(not 0 <= s < len(servers) for s in table.values()):
            raise ValueError(f"the key table names servers outside 0..{len(servers) - 1}")
        self._table = dict(table)
        self._fallback = KetamaHash(servers)


HASH_KINDS = ("ketama", "modulo", "skewed:IF")


def parse_hash_spec(spec: str) -> tuple[str, float | None]:
    """`ketama`, `modulo` or `skewed:IF` -> (kind, target imbalance factor or None); ValueError if neither."""
    kind, _, argument = spec.partition(":")
    if kind in ("ketama", "modulo") and not argument:
        return kind, None
    if kind == "skewed":
        try:
            return kind, float(argument)
        except ValueError:
            raise ValueError(f"hash {spec!r}: write skewed:IF with IF the target imbalance factor, e.g. skewed:0.6")
    raise ValueError(f"unknown hash {spec!r}: choose one of {', '.join(HASH_KINDS)}")


def make_hash(spec: str, servers: Sequence[ServerAddress], keys: Sequence[bytes] = (),
              weights: Sequence[float] = ()) -> KeyHash:
    """`ketama`, `modulo` or `skewed:0.6` (target imbalance factor; needs the workload's keys and weights)."""
    kind, target = parse_hash_spec(spec)
    if kind == "ketama":
        return KetamaHash(servers)
    if kind == "modulo":
        return ModuloHash(servers)
    if not keys:
        raise ValueError(f"{spec} places an experiment's own keys (mbalancer load, mbalancer experiment): a controller "
                         f"of real clients takes the hash they use, ketama or modulo")
    return SkewedHash(servers, keys, weights, target)
