"""The slot book (dataplanes/slot_book.py) over one or more copies of the BPF program (dataplanes/bpf/src/): what
the eBPF switch's driver and the OpenFlow data plane's key classifier share.

Each copy (a switch, or a classifier) has its own maps, pinned under its directory; every hot-key request is
written to all of them, so a key is balanced by the first switch on its path (later switches see the "already
balanced" mark). Maps are written through the bpf syscall (dataplanes/bpf/bpf_syscall.py says why). What this
adds to the book is the BPF side of reaching the switches: opening the maps from their pins and writing the
servers there, reading back the hot keys a previous controller left (at attach, before any slot is handed out), and
noticing a copy that was reloaded (its pins lead to new maps): the maps are reopened and every slot forgotten.
"""
from __future__ import annotations

import logging
import socket
import time
from pathlib import Path
from typing import Sequence

from dataplanes.bpf.bpf_syscall import BpfError
from dataplanes.bpf.tables import Tables
from dataplanes.driver import DriverError, ForwardingEntry, FoundKey, MacSighting, StreamId, merge_sightings
from dataplanes.pipeline import own_addresses
from dataplanes.read_back import read_back
from dataplanes.slot_book import SlotBook
from mbalancer.memcache.addresses import resolve_ipv4
from mbalancer.settings import Server

log = logging.getLogger(__name__)
ERRORS = (BpfError, ValueError)  # what Tables raises


def resolve_trusted(addresses: Sequence[str], setting: str) -> list[str]:
    """The config's trusted controller addresses as IPv4 literals (names resolved); DriverError naming `setting`."""
    try:
        return [resolve_ipv4(ip, ip) for ip in addresses]
    except ValueError as err:
        raise DriverError(f"{setting}: {err}") from None


class KeyTables(SlotBook):
    """The hot keys in every copy's maps."""

    def __init__(self, pin_dirs: Sequence[Path | str], what: str = "eBPF data plane", trusted: Sequence[str] = ()):
        """pin_dirs: one per copy of the program; `what` names them in errors; trusted: the controller's addresses
        beside this machine's own."""
        super().__init__(what, ERRORS)
        self.pin_dirs = [Path(p) for p in pin_dirs]
        self.trusted = tuple(trusted)
        self.tcp_homes: tuple[int, ...] | None = None  # whose connections the TCP path takes; None: every server's

    def attach(self, servers: Sequence[Server]) -> list[FoundKey]:
        """Open every copy's maps, write the servers there, and read back the hot keys a previous controller left
        (dataplanes/read_back.py: kept where the copies agree)."""
        with self.lock:
            self.servers = tuple(servers)
            self.use(self._open())
            try:
                return read_back(self)
            except ERRORS as err:
                raise DriverError(f"reading back the hot keys left in the {self.what}: {err}") from None

    def set_forwarding(self, entries: Sequence[ForwardingEntry]) -> None:
        with self.lock:
            for entry in entries:
                try:
                    ifindex = int(entry.port) if entry.port.isdigit() else socket.if_nametoindex(entry.port)
                except OSError:
                    raise DriverError(f"forwarding of {entry.mac}: no interface {entry.port!r}") from None
                self._each(lambda t: t.set_forward(entry.mac, ifindex), f"forwarding of {entry.mac}")

    def stream_start(self, stream: StreamId) -> int | None:
        """The connection's start as the first copy that tracks it has it (dataplanes/driver.py)."""
        with self.lock:
            try:
                return next((start for start in (t.stream_start(stream) for t in self.switches) if start is not None),
                            None)
            except ERRORS as err:
                raise DriverError(f"stream {stream}: {err}") from None

    def unsure_quiet(self, server: int) -> float:
        """Seconds since the server's latest unreadable unsure request, on any switch (dataplanes/driver.py)."""
        with self.lock:
            try:
                latest = max(t.unsure_last_ns(server) for t in self.switches)
            except ERRORS as err:
                raise DriverError(f"unsure requests of server {server}: {err}") from None
        return max(time.monotonic_ns() - latest, 0) / 1e9  # bpf_ktime_get_ns counts CLOCK_MONOTONIC

    def server_macs(self) -> list[MacSighting]:
        """Each server's MAC as every copy saw it (struct mb_server_seen), merged."""
        with self.lock:
            try:
                seen = [[t.server_seen(index) for index in range(len(self.servers))] for t in self.switches]
            except ERRORS as err:
                raise DriverError(f"server MACs seen: {err}") from None
        return merge_sightings([[MacSighting((mac,) if mac else (), flooded) for mac, flooded in row]
                                for row in seen])

    def set_tcp_homes(self, servers: Sequence[int]) -> None:
        """Whose clients' connections the TCP path takes (steer.h): kept, and written again into a reloaded copy."""
        with self.lock:
            self.tcp_homes = tuple(servers)
            self._each(self._write_tcp_homes, "the TCP path's homes")

    def _write_tcp_homes(self, tables: Tables) -> None:
        homes = range(len(self.servers)) if self.tcp_homes is None else self.tcp_homes
        tables.set_tcp_homes(homes, len(self.servers))

    def rearm_unsure(self, server: int) -> None:
        with self.lock:
            self._each(lambda t: t.rearm_unsure_report(server), f"unsure requests of server {server}")

    def hold_slot(self, slot: int) -> tuple[int, int]:
        """Hold a slot dirty in the first copy; its synced counts before, to give back with restore_synced."""
        tables = self.switches[0]
        try:
            synced = tables.synced(slot)
            tables.hold(slot)
        except ERRORS as err:
            raise DriverError(f"hold slot {slot}: {err}") from None
        return synced

    def restore_synced(self, slot: int, synced: tuple[int, int]) -> None:
        try:
            self.switches[0].set_synced(slot, *synced)
        except ERRORS as err:
            raise DriverError(f"slot {slot}: synced counts not restored: {err}") from None

    def close(self) -> None:
        """Close the maps (the lease ended first: SlotBook.end_lease)."""
        with self.lock:
            self._close_tables()

    def reopen_if_reloaded(self) -> bool:
        """True if a copy came back with new maps: they are reopened and every slot forgotten (the caller tells
        the core to install its hot keys again)."""
        with self.lock:
            if all(t.current() for t in self.switches) and len(self.switches) == len(self.pin_dirs):
                return False
            if not all((p / "prog").exists() for p in self.pin_dirs):
                return False  # unloaded, not (yet) loaded again: wait for it
            self._close_tables()
            try:
                self.came_back(self._open())
            except DriverError as err:
                log.warning("reopening the reloaded %s failed (%s): trying again", self.what, err)
                return False
            return True

    # --- inside ---------------------------------------------------------------------------------------------
    def _open(self) -> list[Tables]:
        """Open every copy's maps and write what the driver owns there: the servers, their ports, the lease."""
        opened: list[Tables] = []
        try:
            for pin_dir in self.pin_dirs:
                opened.append(Tables(pin_dir))
                tables = opened[-1]
                # (closes counted before are not acknowledged here: the core handles them, Driver.closes_pending)
                for index, server in enumerate(self.servers):
                    tables.set_server(index, server.mac, server.ip, server.port)
                tables.add_memcached_ports(sorted({s.port for s in self.servers}))
                for ip in sorted(own_addresses(self.servers) | set(self.trusted)):
                    tables.trust(ip)
                self._write_tcp_homes(tables)
                if self.lease_until:  # (a copy that came back); at attach, the lease found is read back
                    tables.set_lease(self.lease_until)
        except ERRORS as err:
            for tables in opened:
                tables.close()
            raise DriverError(f"{self.what} tables: {err}") from None
        return opened

    def _close_tables(self) -> None:
        for tables in self.switches:
            tables.close()
        self.switches = []
