"""The control library of the eBPF data plane: every table of bpf/maps.h, read and written through one class.

Struct layouts mirror bpf/structs.h (tests/test_ebpf_program.py checks each size against the maps the kernel
loaded, so a change on one side fails the tests instead of corrupting entries).
"""
from __future__ import annotations

import errno
import socket
import struct
from pathlib import Path
from typing import Sequence

from dataplanes.bpf.bpf_syscall import BPF_EXIST, BpfError, BpfMap, pinned_map_id
from dataplanes.pipeline import (COUNTERS, MAX_HOT, MAX_KEY, MAX_REPLICAS, WEIGHT_ONE,  # structs.h agrees (tests check)
                                 HeavyKey)
from dataplanes.driver import StreamId
from dataplanes.slot_book import HotEntry, KeyCounts, OneByOne
from mbalancer.macs import mac_bytes, mac_text

KEY_BYTES = 252
KEY_WORDS = 32  # MB_KEY_WORDS: a hot key's copy of its bytes, in 8-byte words
MAX_PORTS = 32
HELD = 2 ** 64 - 1  # MB_HELD: a synced write count no slot reaches, so the key stays dirty
FILTER_BITS = 16  # MB_FILTER_BITS: hot_filter's buckets
HASH_MUL = 0x9E3779B97F4A7C15  # MB_HASH_MUL
U64_MASK = 2 ** 64 - 1
PORT_SET_BYTES = 65536 // 8  # struct mb_port_set: a bit per port
SKETCH_ROWS, SKETCH_BITS, HEAVY_BITS = 4, 14, 10  # MB_SKETCH_ROWS, MB_SKETCH_BITS, MB_HEAVY_BITS

KEY = struct.Struct(f"=I{KEY_BYTES}s")  # struct mb_key
HOT = struct.Struct(f"=III{MAX_REPLICAS}I{MAX_REPLICAS}II{KEY_WORDS * 8}s")  # struct mb_hot, its key last
SERVER = struct.Struct("=6sH4s")  # struct mb_server (port and ip in network order)
KEY_COUNTERS = struct.Struct(f"=QQQ{MAX_REPLICAS}Q")  # struct mb_key_counters
SETTINGS = struct.Struct("=I")  # struct mb_settings
SYNCED = struct.Struct("=QQ")  # struct mb_synced
SERVER_ADDRESS = struct.Struct("=4sHH")  # struct mb_server_address (network order)
SERVER_SEEN = struct.Struct("=6sHQ")  # struct mb_server_seen
SKETCH_CONTROL = struct.Struct("=QII")  # struct mb_sketch_control
HEAVY = struct.Struct(f"=QI4sH6x{KEY.size}s")  # struct mb_heavy (ip and port in network order)
DESTINATION_COUNT = struct.Struct("=4sH2xQ")  # struct mb_destination_count (ip and port in network order)
DESTINATION_SLOTS = 256  # MB_DESTINATION_SLOTS
STREAM_ID = struct.Struct("=4s4sHH")  # struct mb_stream_id (addresses and ports in network order)
STREAM = struct.Struct("=III")  # struct mb_stream
STREAM_RESUMES, STREAM_BLIND = 1, 2  # MB_STREAM_RESUMES, MB_STREAM_BLIND
TCP_PATH = struct.Struct("=I6s2xIi")  # struct mb_tcp_path
TCP_HOMES_NAMED = 256  # MB_TCP_HOMES_NAMED (= MB_MAX_SERVERS): the tcp_homes entry that says they were named
# enum mb_tcp_counter: the TCP path's counters (clients' connections and segments steered to the splitter, the gets
# it asked about, of them balanced, of them sent home while dirty), as counters() names them
TCP_COUNTERS = ("tcp_connections", "tcp_steered", "tcp_gets", "tcp_balanced", "tcp_home_while_dirty")
U32 = struct.Struct("=I")
U64 = struct.Struct("=Q")
STRUCT_SIZES = {"hot_keys": (U64.size, HOT.size), "servers": (U32.size, SERVER.size), "writes": (4, 8),
                "trusted_sources": (4, 4),
                "unsure": (4, 8), "synced": (4, SYNCED.size), "lease": (4, 8), "server_index": (SERVER_ADDRESS.size, 4),
                "forward": (8, 4), "ports": (4, 4), "flows": (4, 32), "key_counters": (4, KEY_COUNTERS.size),
                "counters": (4, 8), "settings": (4, SETTINGS.size), "memcached_ports": (4, PORT_SET_BYTES),
                "hot_filter": (4, 4),
                "sketch_control": (4, SKETCH_CONTROL.size), "sketch": (4, SKETCH_ROWS * 4 << SKETCH_BITS),
                "heavy": (4, HEAVY.size << HEAVY_BITS), "sketch_destinations": (4, DESTINATION_COUNT.size),
                "streams": (STREAM_ID.size, STREAM.size), "closes": (4, 8), "closes_handled": (4, 8),
                "unsure_last": (4, 8), "unsure_reported": (4, 4),
                "closing": (STREAM_ID.size, 1), "server_macs_seen": (4, SERVER_SEEN.size),
                "tcp_path": (4, TCP_PATH.size), "tcp_neighbors": (4, 8), "tcp_counters": (4, 8),
                "tcp_homes": (4, 4), "server_ips": (4, 4)}


def key_entry(key: bytes) -> bytes:
    """The key's hot_keys key: its hash (the program looks a key up by it, then compares the bytes)."""
    if not 1 <= len(key) <= MAX_KEY:
        raise ValueError(f"key of {len(key)} bytes: the data plane takes 1 to {MAX_KEY}")
    return U64.pack(key_hash(key))


def key_hash(key: bytes) -> int:
    """The key's 64-bit hash, as the program computes it while it scans the key (parse.h mb_scan_word): each
    8-byte word, little-endian, the last one zero padded, xored in and multiplied; then the length."""
    value = 0
    for at in range(0, len(key), 8):
        value = ((value ^ int.from_bytes(key[at:at + 8], "little")) * HASH_MUL) & U64_MASK
    return ((value ^ len(key)) * HASH_MUL) & U64_MASK


def key_bucket(key: bytes) -> int:
    """The key's hot_filter bucket: the top bits of its hash."""
    return key_hash(key) >> (64 - FILTER_BITS)


def stream_key(stream: StreamId) -> bytes:
    return STREAM_ID.pack(socket.inet_aton(stream.client_ip), socket.inet_aton(stream.server_ip),
                          socket.htons(stream.client_port), socket.htons(stream.server_port))


def hot_value(raw: bytes) -> tuple[bytes, HotEntry]:
    """A hot_keys value: the key it holds, and its entry."""
    fields = HOT.unpack(raw)
    n, length, key = fields[2], fields[-2], fields[-1]
    return key[:length], HotEntry(fields[0], fields[1], fields[3:3 + n], fields[3 + MAX_REPLICAS:3 + MAX_REPLICAS + n])




class Tables(OneByOne):
    """The maps of one loaded program (one switch), opened from their pins; a slot book's tables adapter
    (dataplanes/slot_book.py SwitchTables)."""

    up = True  # maps open are always reachable (a reloaded program is noticed by `current`)

    def __init__(self, pin_dir: Path | str):
        self.pin_dir = Path(pin_dir)
        self.maps = {name: BpfMap(str(self.pin_dir / name)) for name in STRUCT_SIZES}

    def close(self) -> None:
        for bpf_map in self.maps.values():
            bpf_map.close()

    def current(self) -> bool:
        """False once the switch was unloaded or reloaded: the pins no longer lead to the maps held open here."""
        return pinned_map_id(str(self.pin_dir / "hot_keys")) == self.maps["hot_keys"].info.id

    # hot_get / set_mirror
    def set_hot(self, key: bytes, entry: HotEntry, old: HotEntry | None = None) -> None:
        """The key's entry, new or in place of `old` (one map update either way)."""
        if not 1 <= len(entry.servers) <= MAX_REPLICAS or not 0 <= entry.slot < MAX_HOT:
            raise ValueError(f"{len(entry.servers)} replicas (at most {MAX_REPLICAS}), slot {entry.slot}")
        pad = MAX_REPLICAS - len(entry.servers)
        value = HOT.pack(entry.slot, entry.home, len(entry.servers), *entry.servers, *([0] * pad),
                         *entry.cumulative, *([WEIGHT_ONE] * pad), len(key), key)
        held = self._held(key)
        if held is not None and held[0] != key:  # 2^-64 for two given keys; refused rather than confused
            raise ValueError(f"{key!r} has the hash of hot key {held[0]!r}: one of them at a time")
        if held is None:  # a new hot key: counted in its filter bucket first, so no get of it skips it
            self._count_in_filter(key, +1)
        try:
            self.maps["hot_keys"].update(key_entry(key), value)
        except BpfError:
            if held is None:  # not in hot_keys: its bucket must not count it (its gets would pay the lookup)
                self._count_in_filter(key, -1)
            raise

    def hot(self, key: bytes) -> HotEntry | None:
        held = self._held(key)
        return held[1] if held is not None and held[0] == key else None

    def _held(self, key: bytes) -> tuple[bytes, HotEntry] | None:
        """The key that holds `key`'s hash in hot_keys, and its entry."""
        raw = self.maps["hot_keys"].lookup(key_entry(key))
        return None if raw is None else hot_value(raw)

    def held_keys(self) -> dict[bytes, HotEntry]:
        """Every hot key the switch holds (e.g. left by a controller that stopped)."""
        values = (self.maps["hot_keys"].lookup(raw) for raw in self.maps["hot_keys"].keys())
        return dict(hot_value(raw) for raw in values if raw is not None)

    def delete_hot(self, key: bytes, entry: HotEntry | None = None) -> bool:
        """Whether the key was there (the slot's other maps are per slot: nothing else to delete)."""
        if self.hot(key) is None:  # another key may hold its hash: that one stays
            return False
        deleted = self.maps["hot_keys"].delete(key_entry(key))
        if deleted:  # out of hot_keys first: a get in between still finds its bucket counted, and goes on to miss
            self._count_in_filter(key, -1)
        return deleted

    def filter_count(self, key: bytes) -> int:
        """Hot keys counted in the key's hot_filter bucket."""
        return U32.unpack(self.maps["hot_filter"].lookup(U32.pack(key_bucket(key))))[0]

    def _count_in_filter(self, key: bytes, change: int) -> None:
        self.maps["hot_filter"].update(U32.pack(key_bucket(key)), U32.pack(max(self.filter_count(key) + change, 0)))

    # dirty state (bpf/structs.h, struct mb_synced)
    def writes(self, slot: int) -> int:
        """Writes to the slot's key the pipeline has counted (since the program was loaded)."""
        return U64.unpack(self.maps["writes"].lookup(U32.pack(slot)))[0]

    def unsure(self, server: int) -> int:
        """Requests to the server the pipeline could not be sure held no write."""
        return U64.unpack(self.maps["unsure"].lookup(U32.pack(server)))[0]

    def unsure_last_ns(self, server: int) -> int:
        """bpf_ktime_get_ns of the server's latest unsure request the controller cannot read (unsure_last)."""
        return U64.unpack(self.maps["unsure_last"].lookup(U32.pack(server)))[0]

    def rearm_unsure_report(self, server: int) -> None:
        """The next unreadable unsure request to the server is copied again."""
        self.maps["unsure_reported"].update(U32.pack(server), U32.pack(0))

    def closes(self, server: int) -> int:
        """How often the server's memcached closed a connection of the controller's (struct closes, maps.h)."""
        return U64.unpack(self.maps["closes"].lookup(U32.pack(server)))[0]

    def set_closes_handled(self, server: int, count: int) -> None:
        self.maps["closes_handled"].update(U32.pack(server), U64.pack(count))

    def closes_pending(self, server: int) -> bool:
        return self.closes(server) != U64.unpack(self.maps["closes_handled"].lookup(U32.pack(server)))[0]

    def synced(self, slot: int) -> tuple[int, int]:
        return SYNCED.unpack(self.maps["synced"].lookup(U32.pack(slot)))

    def set_synced(self, slot: int, writes: int, unsure: int) -> None:
        """The counts the controller synced the slot's key to: clean while the pipeline's counts still equal them."""
        self.maps["synced"].update(U32.pack(slot), SYNCED.pack(writes, unsure))

    def hold(self, slot: int) -> None:
        """Dirty until the controller says otherwise, whatever the counts."""
        self.set_synced(slot, HELD, 0)

    def synced_counts(self, slot: int) -> tuple[int, int] | None:
        """The counts the slot's key is clean at; None while held."""
        synced = self.synced(slot)
        return None if synced[0] == HELD else synced

    def dirty(self, slot: int, home: int) -> bool:
        """The pipeline's dirty test for a key in `slot` homed on `home` (the lease aside)."""
        return self.synced(slot) != (self.writes(slot), self.unsure(home))

    def set_lease(self, until_ns: int) -> None:
        """Until when (CLOCK_MONOTONIC ns, as bpf_ktime_get_ns) the controller vouches for the copies; 0: never."""
        self.maps["lease"].update(U32.pack(0), U64.pack(until_ns))

    def lease(self) -> int:
        return U64.unpack(self.maps["lease"].lookup(U32.pack(0)))[0]

    def key_counts(self, slot: int, replicas: int = MAX_REPLICAS) -> KeyCounts:
        per_cpu = [KEY_COUNTERS.unpack(v) for v in self.maps["key_counters"].lookup(U32.pack(slot))]
        sums = [sum(column) for column in zip(*per_cpu)]
        return KeyCounts(sums[0], sums[1], sums[2], sums[3:3 + replicas])

    def reset_key_counts(self, slot: int) -> None:
        self.maps["key_counters"].update(U32.pack(slot), bytes(KEY_COUNTERS.size))

    # servers, settings, forwarding
    def set_server(self, index: int, mac: str, ip: str, port: int) -> None:
        """The server at `index`; what the switch saw of the MAC of the index's previous server is forgotten."""
        self.maps["servers"].update(U32.pack(index), SERVER.pack(mac_bytes(mac), socket.htons(port),
                                                                 socket.inet_aton(ip)))
        self.maps["server_index"].update(SERVER_ADDRESS.pack(socket.inet_aton(ip), socket.htons(port), 0),
                                         U32.pack(index))
        self.maps["server_macs_seen"].update(U32.pack(index), bytes(SERVER_SEEN.size))
        self.maps["server_ips"].update(socket.inet_aton(ip), U32.pack(1))

    def server_seen(self, index: int) -> tuple[str | None, int]:
        """The MAC the server's TCP segments came from (None before one passed), and its balanced gets flooded."""
        mac, seen, flooded = SERVER_SEEN.unpack(self.maps["server_macs_seen"].lookup(U32.pack(index)))
        return (mac_text(mac) if seen else None), flooded

    def set_settings(self, controller_ifindex: int) -> None:
        self.maps["settings"].update(U32.pack(0), SETTINGS.pack(controller_ifindex))

    def set_tcp_path(self, ifindex: int, mac: str, mark: int, netns: int = -1) -> None:
        """The TCP splitter is behind port `ifindex`, its side's MAC `mac`, its sockets marked `mark`, in network
        namespace id `netns` as the switch's namespace numbers it (-1: the switch's own) (dataplanes/ebpf/tcp/);
        ifindex 0: none."""
        self.maps["tcp_path"].update(U32.pack(0), TCP_PATH.pack(ifindex, mac_bytes(mac), mark, netns))

    def set_tcp_homes(self, servers: Sequence[int], count: int) -> None:
        """The TCP path takes the clients' connections to `servers` (indexes), of the `count` configured, and to no
        other: named from now on (until then it takes every connection)."""
        for index in range(count):
            self.maps["tcp_homes"].update(U32.pack(index), U32.pack(int(index in servers)))
        self.maps["tcp_homes"].update(U32.pack(TCP_HOMES_NAMED), U32.pack(1))

    def tcp_counter(self, index: int) -> int:
        """One of the TCP path's counters (enum mb_tcp_counter), summed over CPUs."""
        return self._summed("tcp_counters", index)

    def trust(self, ip: str) -> None:
        """Requests from `ip` (the controller's own address) never make a server unsure."""
        self.maps["trusted_sources"].update(socket.inet_aton(ip), U32.pack(1))

    def add_memcached_ports(self, ports: Sequence[int]) -> None:
        """Ports memcached servers listen on: requests to them are read, replies from them are matched."""
        for port in ports:
            if not 0 < port < 65536:
                raise ValueError(f"port {port}: must be 1-65535")
        bits = int.from_bytes(self.maps["memcached_ports"].lookup(U32.pack(0)), "little")
        for port in ports:
            bits |= 1 << port
        self.maps["memcached_ports"].update(U32.pack(0), bits.to_bytes(PORT_SET_BYTES, "little"))

    def memcached_ports(self) -> set[int]:
        raw = self.maps["memcached_ports"].lookup(U32.pack(0))
        return {at * 8 + bit for at, byte in enumerate(raw) if byte for bit in range(8) if byte >> bit & 1}

    def set_ports(self, ifindexes: Sequence[int]) -> None:
        if len(ifindexes) > MAX_PORTS:
            raise ValueError(f"{len(ifindexes)} ports: the program floods over at most {MAX_PORTS}")
        for i in range(MAX_PORTS):
            self.maps["ports"].update(U32.pack(i), U32.pack(ifindexes[i] if i < len(ifindexes) else 0))

    def set_forward(self, mac: str, ifindex: int) -> None:
        self.maps["forward"].update(mac_bytes(mac).ljust(8, b"\0"), U32.pack(ifindex))

    def forward(self) -> dict[str, int]:
        table = self.maps["forward"]
        return {mac_text(key[:6]): U32.unpack(table.lookup(key))[0] for key in table.keys()}

    def counter(self, name: str) -> int:
        """One switch counter (summed over CPUs)."""
        return self._summed("counters", COUNTERS.index(name))

    def counters(self) -> dict[str, int]:
        """The switch's counters, its TCP path's after them (0 where it has none)."""
        return {**{name: self._summed("counters", i) for i, name in enumerate(COUNTERS)},
                **{name: self._summed("tcp_counters", i) for i, name in enumerate(TCP_COUNTERS)}}

    def _summed(self, table: str, index: int) -> int:
        """A per-CPU u64 counter of `table`, summed over the CPUs."""
        return sum(U64.unpack(v)[0] for v in self.maps[table].lookup(U32.pack(index)))

    # TCP connections read as streams (struct mb_stream)
    def stream_start(self, stream: StreamId) -> int | None:
        value = self.maps["streams"].lookup(stream_key(stream))
        return None if value is None else STREAM.unpack(value)[0]

    def resume_stream(self, stream: StreamId, seq: int) -> None:
        """Prove a command starts at `seq`."""
        self._set_stream_mode(stream, seq & 0xFFFFFFFF, STREAM_RESUMES)

    def blind_stream(self, stream: StreamId) -> None:
        """The controller cannot follow the connection: its segments stay unsure, their copies coalesced."""
        self._set_stream_mode(stream, 0, STREAM_BLIND)

    def _set_stream_mode(self, stream: StreamId, resume: int, mode: int) -> None:
        """Only over an entry that is there (a connection that ended stays forgotten)."""
        key = stream_key(stream)
        value = self.maps["streams"].lookup(key)
        if value is None:
            return
        try:
            self.maps["streams"].update(key, STREAM.pack(STREAM.unpack(value)[0], resume, mode), BPF_EXIST)
        except BpfError as err:
            if err.errno != errno.ENOENT:  # gone meanwhile: nothing to change
                raise

    # hot-key detection (bpf/sketch.h)
    def sketch_control(self) -> tuple[int, int]:
        """(until when gets are counted, CLOCK_MONOTONIC ns; the epoch counted into)."""
        until, epoch, _ = SKETCH_CONTROL.unpack(self.maps["sketch_control"].lookup(U32.pack(0)))
        return until, epoch

    def set_sketch_control(self, until_ns: int, epoch: int) -> None:
        self.maps["sketch_control"].update(U32.pack(0), SKETCH_CONTROL.pack(until_ns, epoch & 1, 0))

    def heavy_keys(self, epoch: int, limit: int = 1 << HEAVY_BITS) -> list[HeavyKey]:
        """The epoch's `limit` candidates with the largest estimates, largest first, one entry per key. Entries torn
        by two CPUs writing them at once (the key does not hash to the stored hash) are left out."""
        raw = self.maps["heavy"].lookup(U32.pack(epoch & 1))
        entries = sorted((entry for entry in HEAVY.iter_unpack(raw) if entry[1]), key=lambda e: e[1], reverse=True)
        best: dict[bytes, HeavyKey] = {}
        for hashed, count, ip, port, key_raw in entries:  # largest first: the first entry of a key is its best
            length, padded = KEY.unpack(key_raw)
            key = padded[:length]
            if 1 <= length <= MAX_KEY and key not in best and key_hash(key) == hashed:
                best[key] = HeavyKey(key, count, f"{socket.inet_ntoa(ip)}:{socket.ntohs(port)}")
                if len(best) == limit:
                    break
        return list(best.values())

    def take_sketch_destinations(self, epoch: int) -> tuple[dict[str, int], int]:
        """The epoch's gets per ip:port (summed over CPUs), and those counted in the overflow slot (destinations
        that found both their slots taken), zeroed in the table as they are read."""
        table, taken, overflow = self.maps["sketch_destinations"], {}, 0
        base = (epoch & 1) * (DESTINATION_SLOTS + 1)
        for index in range(base, base + DESTINATION_SLOTS + 1):
            per_cpu = [DESTINATION_COUNT.unpack(v) for v in table.lookup(U32.pack(index))]
            if not any(gets for _, _, gets in per_cpu):
                continue
            table.update(U32.pack(index), bytes(DESTINATION_COUNT.size))
            for ip, port, gets in per_cpu:
                if index == base + DESTINATION_SLOTS:
                    overflow += gets
                elif gets:
                    where = f"{socket.inet_ntoa(ip)}:{socket.ntohs(port)}"
                    taken[where] = taken.get(where, 0) + gets
        return taken, overflow

    def clear_sketch(self, epoch: int) -> None:
        """Zero the epoch's sketch and candidates (the reader does, once it has read them)."""
        for name in ("sketch", "heavy"):
            self.maps[name].update(U32.pack(epoch & 1), bytes(self.maps[name].info.value_size))
