"""The eBPF driver: the controller core's requests as writes to the maps of one or more eBPF switches.

Each switch has its own copy of the program and maps (dataplanes/ebpf/program.py pins them under
/sys/fs/bpf/mbalancer/<switch>/); every hot-key request is written to all of them, so a key is balanced by the
first switch on its path (later switches see the "already balanced" mark). Maps are written through the bpf
syscall (dataplanes/ebpf/bpf_syscall.py says why). Mirrored writes arrive as clones on the switch's controller
port: a thread reads them from the controller's end of that link with an AF_PACKET socket. The same thread
notices a switch that was reloaded (its pins lead to new maps): the driver then reopens the maps, forgets its
slots and asks the core to install everything again.

Slots: each hot key gets a slot, the index of its write count, synced counts and counters. A slot is freed when
the key is removed or its install is refused, and its counters are reset when it is reused. Keys a previous
controller left in the maps are removed at attach, before any slot is handed out.
"""
from __future__ import annotations

import logging
import select
import socket
import threading
import time
from pathlib import Path
from typing import Callable, Sequence

from dataplanes.driver import (Counters, Driver, DriverError, ForwardingEntry, KeyCounters, LeftoverKey,
                               MirrorHandler, ReconnectHandler, ReplicaWeight, WriteStamp)
from dataplanes.ebpf import Settings
from dataplanes.ebpf.bpf_syscall import BpfError
from dataplanes.ebpf.program import PIN_ROOT, loaded_switches, mirror_link_of
from dataplanes.ebpf.tables import MAX_HOT, MAX_REPLICAS, HotEntry, Tables, cumulative_weights
from mbalancer.config import Server

log = logging.getLogger(__name__)
ETH_P_ALL = 0x0003
PACKET_OUTGOING = 4
WATCH_EVERY = 0.5  # seconds between checks that the switches are still the ones whose maps are open


def driver_from_settings(settings: Settings) -> "EbpfDriver":
    """The registry's factory: the named switches (every loaded one if none is named), each with its mirror link
    where it has one."""
    names = list(settings.switches) or loaded_switches()
    if not names:
        raise DriverError(f"no eBPF switch is loaded (nothing under {PIN_ROOT}): start a topology, or load the "
                          f"data plane on your switch's ports first")
    missing = [n for n in names if not (PIN_ROOT / n / "prog").exists()]
    if missing:
        raise DriverError(f"no eBPF switch named {', '.join(missing)} is loaded (loaded: "
                          f"{', '.join(loaded_switches()) or 'none'})")
    mirrors = [mirror_link_of(n)[1] for n in names if Path(f"/sys/class/net/{mirror_link_of(n)[1]}").exists()]
    return EbpfDriver([PIN_ROOT / n for n in names], mirrors)


class EbpfDriver(Driver):
    name = "ebpf"
    max_replicas = MAX_REPLICAS

    def __init__(self, pin_dirs: Sequence[Path | str], mirror_ifaces: Sequence[str] = ()):
        """pin_dirs: one per switch; mirror_ifaces: the controller's ends of the switches' mirror links (none: no
        mirrored writes are read, e.g. in packet-fixture tests)."""
        self.pin_dirs = [Path(p) for p in pin_dirs]
        self.mirror_ifaces = list(mirror_ifaces)
        self.servers: tuple[Server, ...] = ()
        self.tables: list[Tables] = []
        self._reset_slots()
        self.on_mirror: MirrorHandler | None = None
        self.on_reconnect: ReconnectHandler | None = None
        self.mirrors_received = 0  # copies delivered to on_mirror
        self.lease_until = 0  # CLOCK_MONOTONIC ns: the lease as last renewed (written again to a reloaded switch)
        self.reconnects = 0
        # The core's worker writes slots and tables; read_counters (HTTP threads) and the reload watcher read them.
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def attach(self, servers: Sequence[Server], on_mirror: MirrorHandler,
               on_reconnect: ReconnectHandler | None = None) -> list[LeftoverKey]:
        self.servers = tuple(servers)
        self.on_mirror, self.on_reconnect = on_mirror, on_reconnect
        self._open()
        leftovers = self._remove_leftovers()
        self._thread = threading.Thread(target=self._watch, name="mbalancer-ebpf", daemon=True)
        self._thread.start()
        return leftovers

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
            entry = self._entry(self._slot(key), self.homes[key], replicas)
            self._write_all(lambda t: t.set_hot(key, entry), f"weights of {key!r}")

    def remove_hot_key(self, key: bytes) -> None:
        with self._lock:
            slot = self._slot(key)
            self._write_all(lambda t: t.delete_hot(key), f"remove {key!r}")
            del self.slots[key], self.homes[key], self.write_bases[key]
            self.free_slots.append(slot)

    def set_dirty(self, key: bytes) -> None:
        with self._lock:
            slot = self._slot(key)
            self._write_all(lambda t: t.hold(slot), f"hold {key!r} dirty")

    def write_stamp(self, key: bytes) -> WriteStamp:
        with self._lock:
            slot, home = self._slot(key), self.homes[key]
            try:
                counts = tuple((t.writes(slot), t.unsure(home)) for t in self.tables)
                written = sum(w for w, _ in counts) - sum(self.write_bases[key])
                return WriteStamp(written, counts)
            except (BpfError, ValueError) as err:
                raise DriverError(f"write counts of {key!r}: {err}") from None

    def clear_dirty(self, key: bytes, stamp: WriteStamp) -> None:
        with self._lock:
            slot = self._slot(key)
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

    def close(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=2)
        with self._lock:
            self.lease_until = 0
            try:
                self._write_all(lambda t: t.set_lease(0), "end the lease")
            except DriverError as err:  # the switch is gone already: nothing left to balance
                log.info("lease not ended: %s", err)
            self._close_tables()

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
            raise DriverError(f"eBPF tables: {err}") from None

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

    def _slot(self, key: bytes) -> int:
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

    # --- the driver's thread: mirrored writes in, reloads noticed -------------------------------------------
    def _watch(self) -> None:
        sockets = self._mirror_sockets()
        checked = time.monotonic()
        try:
            while not self._stop.is_set():
                if sockets:
                    for sock in select.select(sockets, [], [], 0.2)[0]:
                        self._read_mirror(sock, sockets)
                else:
                    self._stop.wait(0.2)
                if time.monotonic() - checked >= WATCH_EVERY:
                    checked = time.monotonic()
                    if self._reloaded():
                        for sock in sockets:
                            sock.close()
                        sockets = self._mirror_sockets()
        finally:
            for sock in sockets:
                sock.close()

    def _mirror_sockets(self) -> list[socket.socket]:
        sockets = []
        for iface in self.mirror_ifaces:
            sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
            try:
                sock.bind((iface, 0))
            except OSError as err:  # the switch is being reloaded: its link comes back with it
                log.warning("mirror link %s not there (%s): mirrored writes from it are not read", iface, err)
                sock.close()
                continue
            sockets.append(sock)
        return sockets

    def _read_mirror(self, sock: socket.socket, sockets: list[socket.socket]) -> None:
        try:
            frame, address = sock.recvfrom(65535)
        except OSError as err:  # the link went away (the topology is being torn down, or the switch reloaded)
            log.info("mirror capture on %s ended: %s", address_of(sock), err)
            sockets.remove(sock)
            sock.close()
            return
        if address[2] == PACKET_OUTGOING or frame[12:14] != b"\x08\x00":
            return  # mirrors are IPv4; the link's own IPv6 chatter is not
        self.mirrors_received += 1
        try:
            self.on_mirror(frame)
        except Exception:  # the core queues; a failure there must not end the capture
            log.exception("mirror handler failed")

    def _reloaded(self) -> bool:
        """True if a switch came back with new maps (and the driver has reopened them and told the core)."""
        with self._lock:
            if all(t.current() for t in self.tables) and len(self.tables) == len(self.pin_dirs):
                return False
            if not all((p / "prog").exists() for p in self.pin_dirs):
                return False  # unloaded, not (yet) loaded again: wait for it
            log.warning("an eBPF switch was reloaded: its tables are empty; installing every hot key again")
            self._close_tables()
            self._reset_slots()
            try:
                self._open()
            except DriverError as err:
                log.warning("reopening the reloaded switch failed (%s): trying again", err)
                return False
            self.reconnects += 1
        if self.on_reconnect is not None:
            self.on_reconnect()
        return True


def own_addresses(servers: Sequence[Server]) -> set[str]:
    """This host's source address towards each server (what the controller's copies and reads come from)."""
    found = set()
    for server in servers:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            try:
                probe.connect((server.ip, server.port))  # UDP: picks the route and source, sends nothing
            except OSError:
                continue  # no route (yet): nothing of ours goes there either
            found.add(probe.getsockname()[0])
    return found


def address_of(sock: socket.socket) -> str:
    try:
        return sock.getsockname()[0]
    except OSError:
        return "?"
