"""A driver without a switch: it records every call and keeps the tables a data plane would hold.

For unit tests of the core (ask `route` where a get would go, as faucet's tests ask a fake flow table) and for
`mbalancer controller --driver none`, a dry run that decides and replicates without touching any switch. It keeps
dirty state the way a data plane does (write counts per key, unsure counts per server, what the core synced each
key to, a lease). Mirrored writes come in through `mirror(frame, key)`, the way a data plane counts and copies
them; `unsure(server)` plays a request the data plane could not read; `reconnect()` plays a switch that came back
empty; `macs` is what it reports of the servers' MACs; `refuse(...)` makes chosen calls fail as a network driver's
would; `leftover(...)` plays keys a previous controller left behind, `successor()` a controller that takes
over the same switch.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Sequence

from dataplanes.driver import (Counters, Distrust, Driver, DriverError, ForwardingEntry, KeyCounters, FoundKey,
                               MacSighting, MirrorHandler, ReconnectHandler, ReplicaWeight, WriteStamp)
from dataplanes.pipeline import MAX_KEY
from mbalancer.settings import Server

CALLS_KEPT = 10_000  # a dry run may last days: the call log keeps the latest only


def driver_from_settings(settings: Any = None) -> "RecordingDriver":
    """The registry's factory (the `none` data plane has no settings)."""
    return RecordingDriver()


@dataclass(frozen=True)
class Call:
    time: float  # time.monotonic() when the core made the call
    method: str
    key: bytes | None = None
    args: tuple = ()


HELD = None  # TableEntry.synced while the core holds the key dirty


@dataclass
class TableEntry:
    home: int
    replicas: tuple[ReplicaWeight, ...]
    writes: int = 0  # mirrored writes to the key
    synced: tuple[int, int] | None = HELD  # (writes, home's unsure count) the core synced it to
    base: int = 0  # writes when the driver took it (installed it, or read it back): its stamp counts from there


class RecordingDriver(Driver):
    name = "none"
    counts_gets = False  # no switch counts gets here (a test that plays one sets True and fills `counters`)

    def __init__(self, max_replicas: int | None = None) -> None:
        self.max_replicas = max_replicas
        self.calls: deque[Call] = deque(maxlen=CALLS_KEPT)
        self.table: dict[bytes, TableEntry] = {}
        self.forwarding: tuple[ForwardingEntry, ...] = ()
        self.servers: tuple[Server, ...] = ()
        self.counters = Counters()
        self.unsure_counts: dict[int, int] = {}  # server -> requests the data plane could not read
        self.lease_until = 0.0  # time.monotonic() until which the core vouches for the copies
        self.macs: list[MacSighting] | None = None  # what server_macs reports (a test plays a switch's sightings)
        self.refusals: list[list] = []  # [method, key or None, calls left]: see refuse()
        self._on_mirror: MirrorHandler | None = None
        self._on_reconnect: ReconnectHandler | None = None
        self._lock = threading.Lock()

    def attach(self, servers: Sequence[Server], on_mirror: MirrorHandler,
               on_reconnect: ReconnectHandler | None = None) -> list[FoundKey]:
        self.servers = tuple(servers)
        self._on_mirror, self._on_reconnect = on_mirror, on_reconnect
        self._record("attach")
        expired = self.lease_until <= time.monotonic()
        found = []
        for key, entry in self.table.items():  # read back what an earlier controller left: kept as it is
            entry.base = entry.writes
            clean = entry.synced == (entry.writes, self.unsure_counts.get(entry.home, 0))
            found.append(FoundKey(key, entry.home, entry.replicas, WriteStamp(0, entry.synced) if clean else None,
                                  Distrust.LEASE_EXPIRED if expired else None))
        return found

    def leftover(self, key: bytes, home: int, replicas: Sequence[ReplicaWeight] | Sequence[int],
                 clean: bool = False) -> None:
        """Before attach: the switch holds `key` (held dirty, or `clean` at the counts it has), installed by a
        controller that is gone; replicas as servers are weighed equally."""
        weights = tuple(r if isinstance(r, ReplicaWeight) else ReplicaWeight(r, 1 / len(replicas)) for r in replicas)
        self.table[key] = TableEntry(home, weights)
        if clean:
            self.table[key].synced = (0, self.unsure_counts.get(home, 0))

    def successor(self) -> "RecordingDriver":
        """A new driver on the same switch (a controller that took over): it finds this one's table, counts and
        lease as they are."""
        after = RecordingDriver(self.max_replicas)
        after.table, after.unsure_counts, after.lease_until = self.table, self.unsure_counts, self.lease_until
        return after

    def refuse(self, method: str, key: bytes | None = None, times: int = 1) -> None:
        """The next `times` calls of `method` (for `key`, or any key) raise DriverError, changing nothing."""
        with self._lock:
            self.refusals.append([method, key, times])

    def install_hot_key(self, key: bytes, home: int, replicas: Sequence[ReplicaWeight]) -> None:
        self._check_weights(key, replicas)
        self._record("install_hot_key", key, home, tuple(replicas))
        if key in self.table:
            raise DriverError(f"{key!r} is already installed")
        if not 1 <= len(key) <= MAX_KEY:  # memcached's limit, as every data plane holds it
            raise DriverError(f"key of {len(key)} bytes: a hot key has 1 to {MAX_KEY}")
        self.table[key] = TableEntry(home, tuple(replicas))

    def set_weights(self, key: bytes, replicas: Sequence[ReplicaWeight]) -> None:
        self._check_weights(key, replicas)
        self._record("set_weights", key, tuple(replicas))
        entry = self._entry(key)
        if [r.server for r in replicas] != [r.server for r in entry.replicas]:
            raise DriverError(f"{key!r}: set_weights keeps the replica set")
        entry.replicas = tuple(replicas)

    def remove_hot_key(self, key: bytes) -> None:
        self._record("remove_hot_key", key)
        self._entry(key)
        del self.table[key]

    def set_dirty(self, key: bytes) -> None:
        self._record("set_dirty", key)
        self._entry(key).synced = HELD

    def write_stamp(self, key: bytes) -> WriteStamp:
        self._record("write_stamp", key)
        entry = self._entry(key)
        return WriteStamp(entry.writes - entry.base, (entry.writes, self.unsure_counts.get(entry.home, 0)))

    def clear_dirty(self, key: bytes, stamp: WriteStamp) -> None:
        self._record("clear_dirty", key, stamp)
        self._entry(key).synced = stamp.counts

    def renew_lease(self, seconds: float) -> None:
        self.lease_until = time.monotonic() + seconds if seconds > 0 else 0.0

    def close(self) -> None:
        self.lease_until = 0.0  # nobody keeps the copies fresh any more

    def let_go(self) -> None:
        """The lease left to run out by itself."""

    def dirty(self, key: bytes) -> bool:
        """As the data plane decides: held, or a count moved since the core synced the key."""
        entry = self._entry(key)
        return entry.synced != (entry.writes, self.unsure_counts.get(entry.home, 0))

    def set_forwarding(self, entries: Sequence[ForwardingEntry]) -> None:
        self._record("set_forwarding", None, tuple(entries))
        self.forwarding = tuple(entries)

    def read_counters(self) -> Counters:
        return self.counters

    def server_macs(self) -> list[MacSighting] | None:
        return self.macs

    # What a test (or a real data plane) does from the switch side.
    def reconnect(self) -> None:
        """The switch came back empty: every table entry is gone; the core is told to install them again."""
        self.table.clear()
        self.forwarding = ()
        if self._on_reconnect is not None:
            self._on_reconnect()

    def mirror(self, frame: bytes, key: bytes | None = None) -> None:
        """Deliver a copied packet; with `key`, first count the write to it as the data plane would."""
        if key is not None and key in self.table:
            self.table[key].writes += 1
            self.counters.keys.setdefault(key, KeyCounters()).mirrored += 1
        if self._on_mirror is not None:
            self._on_mirror(frame)

    def unsure(self, server: int, frame: bytes) -> None:
        """A request to `server` the data plane could not read: every hot key homed there dirty, the frame copied."""
        self.unsure_counts[server] = self.unsure_counts.get(server, 0) + 1
        self.counters.unsure += 1
        self.mirror(frame)

    def route(self, key: bytes, request_id: int) -> int | None:
        """The server a get for `key` would go to: None when not hot (its home), the home when dirty, else the
        replica whose cumulative weight covers request_id's place in [0, 1)."""
        entry = self.table.get(key)
        if entry is None:
            return None
        if self.dirty(key) or time.monotonic() >= self.lease_until:
            return entry.home
        point = (request_id * 2654435761 % 2 ** 32) / 2 ** 32
        total = 0.0
        for replica in entry.replicas:
            total += replica.weight
            if replica.weight > 0 and point < total:
                return replica.server
        return next(r.server for r in reversed(entry.replicas) if r.weight > 0)

    def calls_of(self, method: str) -> list[Call]:
        with self._lock:
            return [c for c in self.calls if c.method == method]

    def _record(self, method: str, key: bytes | None = None, *args) -> None:
        with self._lock:
            for refusal in self.refusals:
                if refusal[0] == method and refusal[1] in (None, key) and refusal[2] > 0:
                    refusal[2] -= 1
                    raise DriverError(f"{method} refused (test)")
            self.calls.append(Call(time.monotonic(), method, key, args))

    def _entry(self, key: bytes) -> TableEntry:
        entry = self.table.get(key)
        if entry is None:
            raise DriverError(f"{key!r} is not installed")
        return entry

    def _check_weights(self, key: bytes, replicas: Sequence[ReplicaWeight]) -> None:
        total = sum(r.weight for r in replicas)
        if not replicas or abs(total - 1) > 1e-6 or any(not 0 <= r.server < len(self.servers) for r in replicas):
            raise DriverError(f"{key!r}: bad replicas {replicas}")
        if self.max_replicas is not None and len(replicas) > self.max_replicas:
            raise DriverError(f"{len(replicas)} replicas: this driver holds at most {self.max_replicas} per key")
