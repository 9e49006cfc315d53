"""The eBPF driver: the controller core's requests as writes to the maps of one or more eBPF switches.

Each switch has its own copy of the program and maps (topologies/ebpf/program.py pins them under
/sys/fs/bpf/mbalancer/<switch>/); every hot-key request is written to all of them, so a key is balanced by the
first switch on its path (later switches see the "already balanced" mark). Maps are written through the bpf
syscall (topologies/ebpf/bpf_syscall.py says why). Mirrored writes arrive as clones on the switch's controller
port: a capture thread reads them from the controller's end of that link with an AF_PACKET socket.

Slots: each hot key gets a slot, the index of its dirty bit and counters. A slot is freed when the key is removed
and its counters are reset when it is reused.
"""
from __future__ import annotations

import logging
import select
import socket
import threading
from pathlib import Path
from typing import Sequence

from controller.driver import (Counters, Driver, DriverError, ForwardingEntry, KeyCounters, MirrorHandler,
                               ReplicaWeight)
from mbalancer.config import Server
from topologies.ebpf.bpf_syscall import BpfError
from topologies.ebpf.tables import MAX_HOT, MAX_REPLICAS, HotEntry, Tables, cumulative_weights

log = logging.getLogger(__name__)
ETH_P_ALL = 0x0003
PACKET_OUTGOING = 4


class EbpfDriver(Driver):
    name = "ebpf"

    def __init__(self, pin_dirs: Sequence[Path | str], mirror_ifaces: Sequence[str] = (),
                 memcached_port: int = 11211):
        """pin_dirs: one per switch; mirror_ifaces: the controller's ends of the switches' mirror links (none: no
        mirrored writes are read, e.g. in packet-fixture tests)."""
        self.pin_dirs = [Path(p) for p in pin_dirs]
        self.mirror_ifaces = list(mirror_ifaces)
        self.memcached_port = memcached_port
        self.tables: list[Tables] = []
        self.slots: dict[bytes, int] = {}
        self.homes: dict[bytes, int] = {}
        self.free_slots = list(range(MAX_HOT - 1, -1, -1))
        self.on_mirror: MirrorHandler | None = None
        self.mirrors_received = 0
        self._stop = threading.Event()
        self._capture: threading.Thread | None = None

    def attach(self, servers: Sequence[Server], on_mirror: MirrorHandler) -> None:
        try:
            self.tables = [Tables(p) for p in self.pin_dirs]
            for tables in self.tables:
                for index, server in enumerate(servers):
                    tables.set_server(index, server.mac, server.ip, server.port)
        except (BpfError, ValueError) as err:
            raise DriverError(f"eBPF tables: {err}") from None
        self.on_mirror = on_mirror
        if self.mirror_ifaces:
            sockets = []
            for iface in self.mirror_ifaces:
                sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
                sock.bind((iface, 0))
                sockets.append(sock)
            self._capture = threading.Thread(target=self._read_mirrors, args=(sockets,), name="mbalancer-mirrors",
                                             daemon=True)
            self._capture.start()

    def install_hot_key(self, key: bytes, home: int, replicas: Sequence[ReplicaWeight]) -> None:
        if key in self.slots:
            raise DriverError(f"{key!r} is already installed")
        if not self.free_slots:
            raise DriverError(f"all {MAX_HOT} hot-key slots are in use")
        slot = self.free_slots.pop()
        try:
            for tables in self.tables:
                tables.reset_key_counts(slot)
                tables.set_dirty(slot, True)  # before the entry exists: no get is balanced before the core says
                tables.set_hot(key, self._entry(slot, home, replicas))
        except (BpfError, ValueError) as err:
            self._forget(key, slot)
            raise DriverError(f"install {key!r}: {err}") from None
        self.slots[key] = slot
        self.homes[key] = home

    def set_weights(self, key: bytes, replicas: Sequence[ReplicaWeight]) -> None:
        slot = self._slot(key)
        self._write_all(lambda t: t.set_hot(key, self._entry(slot, self.homes[key], replicas)), f"weights of {key!r}")

    def remove_hot_key(self, key: bytes) -> None:
        slot = self._slot(key)
        self._write_all(lambda t: t.delete_hot(key), f"remove {key!r}")
        del self.slots[key], self.homes[key]
        self.free_slots.append(slot)

    def set_dirty(self, key: bytes, dirty: bool) -> None:
        slot = self._slot(key)
        self._write_all(lambda t: t.set_dirty(slot, dirty), f"dirty bit of {key!r}")

    def set_forwarding(self, entries: Sequence[ForwardingEntry]) -> None:
        for entry in entries:
            ifindex = socket.if_nametoindex(entry.port) if not entry.port.isdigit() else int(entry.port)
            self._write_all(lambda t: t.set_forward(entry.mac, ifindex), f"forwarding of {entry.mac}")

    def read_counters(self) -> Counters:
        counters = Counters()
        for tables in self.tables:
            counters.unparsed += tables.counters()["unparsed"]
            for key, slot in self.slots.items():
                counts = tables.key_counts(slot)
                entry = tables.hot(key)
                total = counters.keys.setdefault(key, KeyCounters())
                total.gets += counts.gets
                total.home_while_dirty += counts.home_while_dirty
                total.mirrored += counts.mirrored
                for server, n in zip(entry.servers if entry else (), counts.per_replica):
                    total.per_replica[server] = total.per_replica.get(server, 0) + n
        return counters

    def switch_counters(self) -> list[dict[str, int]]:
        """Each switch's own counters (packets, balanced, mirrored, ...)."""
        return [t.counters() for t in self.tables]

    def close(self) -> None:
        self._stop.set()
        if self._capture:
            self._capture.join(timeout=2)
        for tables in self.tables:
            tables.close()
        self.tables = []

    def _entry(self, slot: int, home: int, replicas: Sequence[ReplicaWeight]) -> HotEntry:
        if len(replicas) > MAX_REPLICAS:
            raise DriverError(f"{len(replicas)} replicas: the eBPF data plane holds at most {MAX_REPLICAS}")
        return HotEntry(slot, home, tuple(r.server for r in replicas),
                        tuple(cumulative_weights([r.weight for r in replicas])))

    def _slot(self, key: bytes) -> int:
        if key not in self.slots:
            raise DriverError(f"{key!r} is not installed")
        return self.slots[key]

    def _forget(self, key: bytes, slot: int) -> None:
        for tables in self.tables:
            tables.delete_hot(key)
        self.free_slots.append(slot)

    def _write_all(self, write, what: str) -> None:
        try:
            for tables in self.tables:
                write(tables)
        except (BpfError, ValueError) as err:
            raise DriverError(f"{what}: {err}") from None

    def _read_mirrors(self, sockets: list[socket.socket]) -> None:
        try:
            while not self._stop.is_set() and sockets:
                ready, _, _ = select.select(sockets, [], [], 0.2)
                for sock in ready:
                    try:
                        frame, address = sock.recvfrom(65535)
                    except OSError as err:  # the link went away (the topology is being torn down)
                        log.info("mirror capture on %s ended: %s", address_of(sock), err)
                        sockets.remove(sock)
                        sock.close()
                        continue
                    if address[2] == PACKET_OUTGOING or frame[12:14] != b"\x08\x00":
                        continue  # mirrors are IPv4; the link's own IPv6 chatter is not
                    self.mirrors_received += 1
                    try:
                        self.on_mirror(frame)
                    except Exception:  # the core queues; a failure there must not end the capture
                        log.exception("mirror handler failed")
        finally:
            for sock in sockets:
                sock.close()


def address_of(sock: socket.socket) -> str:
    try:
        return sock.getsockname()[0]
    except OSError:
        return "?"
