"""Hot keys in the maps of one or more copies of the BPF program (dataplanes/bpf/src/): the bookkeeping the eBPF
switch's driver and the OpenFlow data plane's key classifier share, used by each by composition.

Each copy (a switch, or a classifier) has its own maps, pinned under its directory; every hot-key request is
written to all of them, so a key is balanced by the first switch on its path (later switches see the "already
balanced" mark). Maps are written through the bpf syscall (dataplanes/bpf/bpf_syscall.py says why).

Slots: each hot key gets a slot, the index of its write count, synced counts and counters. A slot is freed when
the key is removed or its install is refused, and its counters are reset when it is reused. Keys a previous
controller left in the maps are removed at attach, before any slot is handed out. A copy that was reloaded (its
pins lead to new maps) is noticed by reopen_if_reloaded: the maps are reopened and every slot forgotten, and the
caller asks the core to install everything again.
"""
from __future__ import annotations

import logging
import socket
import threading
import time
from pathlib import Path
from typing import Callable, Sequence

from dataplanes.bpf.bpf_syscall import BpfError
from dataplanes.bpf.tables import HotEntry, Tables
from dataplanes.driver import (Counters, DriverError, ForwardingEntry, KeyCounters, LeftoverKey, ReplicaWeight,
                               WriteStamp)
from dataplanes.pipeline import MAX_HOT, MAX_REPLICAS, cumulative_weights, own_addresses
from mbalancer.settings import Server

log = logging.getLogger(__name__)


class KeyTables:
    """The driver-side state of the hot keys in every copy's maps; thread-safe (the core's worker writes, HTTP
    threads and the reload watcher read)."""

    def __init__(self, pin_dirs: Sequence[Path | str], what: str = "eBPF data plane"):
        """pin_dirs: one per copy of the program; `what` names them in errors."""
        self.pin_dirs = [Path(p) for p in pin_dirs]
        self.what = what
        self.servers: tuple[Server, ...] = ()
        self.tables: list[Tables] = []
        self._reset_slots()
        self.lease_until = 0  # CLOCK_MONOTONIC ns: the lease as last renewed (written again to a reloaded copy)
        self.reconnects = 0
        self._lock = threading.RLock()

    def attach(self, servers: Sequence[Server]) -> list[LeftoverKey]:
        """Open every copy's maps, write the servers there, and remove the hot keys a previous controller left."""
        self.servers = tuple(servers)
        self._open()
        return self._remove_leftovers()

    def install_hot_key(self, key: bytes, home: int, replicas: Sequence[ReplicaWeight]) -> None:
        with self._lock:
            if key in self.slots:
                raise DriverError(f"{key!r} is already installed")
            if not self.free_slots:
                raise DriverError(f"all {MAX_HOT} hot-key slots are in use")
            slot = self.free_slots[-1]
            entry = self._entry(slot, home, replicas)  # refused here, nothing is taken
            self.free_slots.pop()
            try:
                bases = []
                for tables in self.tables:
                    tables.reset_key_counts(slot)
                    tables.hold(slot)  # before the entry exists: no get is balanced before the core says
                    bases.append(tables.writes(slot))  # the slot's count before this key: writes are counted anew
                    tables.set_hot(key, entry)
            except (BpfError, ValueError) as err:
                self._forget(key, slot)
                raise DriverError(f"install {key!r}: {err}") from None
            self.slots[key] = slot
            self.homes[key] = home
            self.write_bases[key] = tuple(bases)

    def set_weights(self, key: bytes, replicas: Sequence[ReplicaWeight]) -> None:
        with self._lock:
            entry = self._entry(self.slot_of(key), self.homes[key], replicas)
            self._write_all(lambda t: t.set_hot(key, entry), f"weights of {key!r}")

    def remove_hot_key(self, key: bytes) -> None:
        with self._lock:
            slot = self.slot_of(key)
            self._write_all(lambda t: t.delete_hot(key), f"remove {key!r}")
            del self.slots[key], self.homes[key], self.write_bases[key]
            self.free_slots.append(slot)

    def set_dirty(self, key: bytes) -> None:
        with self._lock:
            slot = self.slot_of(key)
            self._write_all(lambda t: t.hold(slot), f"hold {key!r} dirty")

    def write_stamp(self, key: bytes) -> WriteStamp:
        with self._lock:
            slot, home = self.slot_of(key), self.homes[key]
            try:
                counts = tuple((t.writes(slot), t.unsure(home)) for t in self.tables)
                written = sum(w for w, _ in counts) - sum(self.write_bases[key])
                return WriteStamp(written, counts)
            except (BpfError, ValueError) as err:
                raise DriverError(f"write counts of {key!r}: {err}") from None

    def clear_dirty(self, key: bytes, stamp: WriteStamp) -> None:
        with self._lock:
            slot = self.slot_of(key)
            if len(stamp.counts) != len(self.tables):
                raise DriverError(f"clear {key!r}: the stamp is from before a switch was reloaded")
            try:
                for tables, (writes, unsure) in zip(self.tables, stamp.counts):
                    tables.set_synced(slot, writes, unsure)
            except (BpfError, ValueError) as err:
                raise DriverError(f"clear {key!r}: {err}") from None

    def renew_lease(self, seconds: float) -> None:
        until = time.monotonic_ns() + int(seconds * 1e9) if seconds > 0 else 0  # as bpf_ktime_get_ns counts
        with self._lock:
            self.lease_until = until
            self._write_all(lambda t: t.set_lease(until), "lease")

    def set_forwarding(self, entries: Sequence[ForwardingEntry]) -> None:
        with self._lock:
            for entry in entries:
                try:
                    ifindex = int(entry.port) if entry.port.isdigit() else socket.if_nametoindex(entry.port)
                except OSError:
                    raise DriverError(f"forwarding of {entry.mac}: no interface {entry.port!r}") from None
                self._write_all(lambda t: t.set_forward(entry.mac, ifindex), f"forwarding of {entry.mac}")

    def read_counters(self) -> Counters:
        counters = Counters()
        with self._lock:
            try:
                for tables in self.tables:
                    self._add_counts(tables, counters)
            except (BpfError, ValueError) as err:
                raise DriverError(f"reading counters: {err}") from None
        return counters

    def switch_counters(self) -> list[dict[str, int]]:
        """Each switch's own counters (packets, balanced, mirrored, ...)."""
        with self._lock:
            return [t.counters() for t in self.tables]

    def hold_slot(self, slot: int) -> tuple[int, int]:
        """Hold a slot dirty in the first copy; its synced counts before, to give back with restore_synced."""
        tables = self.tables[0]
        try:
            synced = tables.synced(slot)
            tables.hold(slot)
        except (BpfError, ValueError) as err:
            raise DriverError(f"hold slot {slot}: {err}") from None
        return synced

    def restore_synced(self, slot: int, synced: tuple[int, int]) -> None:
        try:
            self.tables[0].set_synced(slot, *synced)
        except (BpfError, ValueError) as err:
            raise DriverError(f"slot {slot}: synced counts not restored: {err}") from None

    def close(self) -> None:
        """End the lease (gets go home) and close the maps."""
        with self._lock:
            self.lease_until = 0
            try:
                self._write_all(lambda t: t.set_lease(0), "end the lease")
            except DriverError as err:  # the switch is gone already: nothing left to balance
                log.info("lease not ended: %s", err)
            self._close_tables()

    def reopen_if_reloaded(self) -> bool:
        """True if a copy came back with new maps: they are reopened and every slot forgotten (the caller tells
        the core to install its hot keys again)."""
        with self._lock:
            if all(t.current() for t in self.tables) and len(self.tables) == len(self.pin_dirs):
                return False
            if not all((p / "prog").exists() for p in self.pin_dirs):
                return False  # unloaded, not (yet) loaded again: wait for it
            log.warning("the %s was reloaded: its tables are empty; installing every hot key again", self.what)
            self._close_tables()
            self._reset_slots()
            try:
                self._open()
            except DriverError as err:
                log.warning("reopening the reloaded %s failed (%s): trying again", self.what, err)
                return False
            self.reconnects += 1
            return True

    # --- inside ---------------------------------------------------------------------------------------------
    def _open(self) -> None:
        """Open every switch's maps and write what the driver owns there: the servers and their ports."""
        try:
            self.tables = [Tables(p) for p in self.pin_dirs]
            for tables in self.tables:
                for index, server in enumerate(self.servers):
                    tables.set_server(index, server.mac, server.ip, server.port)
                tables.add_memcached_ports(sorted({s.port for s in self.servers}))
                for ip in own_addresses(self.servers):
                    tables.trust(ip)
                tables.set_lease(self.lease_until)
        except (BpfError, ValueError) as err:
            self._close_tables()
            raise DriverError(f"{self.what} tables: {err}") from None

    def _remove_leftovers(self) -> list[LeftoverKey]:
        """Remove the hot keys a previous controller left (their copies may be stale; this core never synced them)."""
        found: dict[bytes, LeftoverKey] = {}
        with self._lock:
            try:
                for tables in self.tables:
                    for key, entry in tables.hot_entries().items():
                        tables.delete_hot(key)
                        found[key] = LeftoverKey(key, entry.home, tuple(entry.servers))
            except (BpfError, ValueError) as err:
                raise DriverError(f"removing the hot keys left in the switch: {err}") from None
        if found:
            log.warning("removed %d hot keys a previous controller left in the switch: their gets go home",
                        len(found))
        return list(found.values())

    def _reset_slots(self) -> None:
        """No key installed: every slot free (at start, and when the switch came back empty)."""
        self.slots: dict[bytes, int] = {}
        self.homes: dict[bytes, int] = {}
        self.write_bases: dict[bytes, tuple[int, ...]] = {}  # each switch's write count of the slot at install
        self.free_slots = list(range(MAX_HOT - 1, -1, -1))

    def _close_tables(self) -> None:
        for tables in self.tables:
            tables.close()
        self.tables = []

    def _entry(self, slot: int, home: int, replicas: Sequence[ReplicaWeight]) -> HotEntry:
        if not 1 <= len(replicas) <= MAX_REPLICAS:
            raise DriverError(f"{len(replicas)} replicas: the eBPF data plane holds 1 to {MAX_REPLICAS} per key")
        return HotEntry(slot, home, tuple(r.server for r in replicas),
                        tuple(cumulative_weights([r.weight for r in replicas])))

    def slot_of(self, key: bytes) -> int:
        """The slot of an installed key; DriverError if it is not installed."""
        if key not in self.slots:
            raise DriverError(f"{key!r} is not installed")
        return self.slots[key]

    def _forget(self, key: bytes, slot: int) -> None:
        for tables in self.tables:
            try:
                tables.delete_hot(key)
            except (BpfError, ValueError) as err:
                log.warning("could not remove the half-installed %r: %s", key, err)
        self.free_slots.append(slot)

    def _write_all(self, write: Callable[[Tables], object], what: str) -> None:
        try:
            for tables in self.tables:
                write(tables)
        except (BpfError, ValueError) as err:
            raise DriverError(f"{what}: {err}") from None

    def _add_counts(self, tables: Tables, counters: Counters) -> None:
        switch = tables.counters()
        counters.unparsed += switch["unparsed"]
        counters.unsure += switch["unsure"]
        for name, value in switch.items():
            counters.switch[name] = counters.switch.get(name, 0) + value
        for key, slot in self.slots.items():
            counts = tables.key_counts(slot)
            entry = tables.hot(key)
            total = counters.keys.setdefault(key, KeyCounters())
            total.gets += counts.gets
            total.home_while_dirty += counts.home_while_dirty
            total.mirrored += counts.mirrored
            for server, n in zip(entry.servers if entry else (), counts.per_replica):
                total.per_replica[server] = total.per_replica.get(server, 0) + n
