"""A driver without a switch: the slot book (dataplanes/slot_book.py) over switches kept in memory (tables.py), and a
log of every call.

For unit tests of the core (ask `route` where a get would go, as faucet's tests ask a fake flow table) and for
`mbalancer controller --driver none`, a dry run that decides and replicates without touching any switch. The
bookkeeping is the one every data plane uses (slots, write bases, stamps, holds, the lease), and the in-memory
tables decide dirty state as a pipeline does, so there is no second implementation of the dirty rules here. What
passes the switch is played by a test: `mirror(frame, key)` counts a write to the key at its home and delivers the
copy, `count_write(key)` counts one whose copy never comes, `unsure(server, frame)` a request nobody can read,
`count_close(server)` a server closing a connection of the controller's (acknowledged by the core alone);
`reconnect()` plays a switch that came back empty; `macs` is what it reports of the servers' MACs; `refuse(...)`
makes chosen calls fail as a network driver's would; `leftover(...)` plays keys a previous controller left behind,
`lease_left(...)` the switches' lease, and `successor()` a controller that takes over the same switches (a driver
made on another's `tables` finds that one's keys and reads them back, as a new leader finds its switch's).
"""
from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Mapping, Sequence

from dataplanes.driver import (KEYED_CALLS, ONE_KEY_CALLS, Counters, DriverError, ForwardingEntry, FoundKey,
                               MacSighting, MirrorHandler, ReconnectHandler, ReplicaWeight)
from dataplanes.fan_out import FanOut
from dataplanes.pipeline import MAX_HOT, WEIGHT_ONE, cumulative_weights
from dataplanes.read_back import read_back
from dataplanes.recording.tables import MemoryTables, TablesError
from dataplanes.slot_book import HotEntry, SlotBook
from dataplanes.slot_book_driver import SlotBookDriver
from mbalancer.settings import Server

CALLS_KEPT = 10_000  # a dry run may last days: the call log keeps the latest only


def driver_from_settings(settings: Any = None) -> "RecordingDriver":
    """The registry's factory (the `none` data plane has no settings)."""
    return RecordingDriver()


@dataclass(frozen=True)
class Call:
    time: float  # time.monotonic() when the core made the call
    method: str  # a call on many keys is logged key by key, by the name of its call on one (dataplanes/driver.py)
    key: bytes | None = None
    args: tuple = ()  # the call's arguments after the key


@dataclass(frozen=True)
class TableEntry:
    """A hot key as the (first) switch holds it."""
    home: int
    replicas: tuple[ReplicaWeight, ...]  # the weights as the switch holds them: multiples of 1/WEIGHT_ONE
    writes: int  # writes to the key counted since it was installed


class RecordingDriver(SlotBookDriver):
    name = "none"
    counts_gets = False  # no switch counts gets in a dry run (a test that plays them through `route` sets True)
    thread_name = "mbalancer-recording"

    def __init__(self, tables: Sequence[MemoryTables] | None = None, what: str = "recording data plane",
                 fan_out: FanOut | None = None, slots: int | range = MAX_HOT):
        """tables: the switches (default: one, empty); another driver's to find what it left there; fan_out: how
        many the book writes at once (default: one after the other); slots: the book's (a key-range shard's)."""
        super().__init__(SlotBook(what, (TablesError,), fan_out, slots))
        self.tables = list(tables) if tables is not None else [MemoryTables()]
        self.calls: deque[Call] = deque(maxlen=CALLS_KEPT)
        self.forwarding: tuple[ForwardingEntry, ...] = ()
        self.counters: Counters | None = None  # what read_counters answers instead of the switches' (a test's)
        self.macs: list[MacSighting] | None = None  # what server_macs reports (a test plays a switch's sightings)
        self.refusals: list[list] = []  # [method, key or None, calls left]: see refuse()
        self._lock = threading.Lock()

    # --- the driver interface beyond the book ---------------------------------------------------------------------
    def attach(self, servers: Sequence[Server], on_mirror: MirrorHandler,
               on_reconnect: ReconnectHandler | None = None) -> list[FoundKey]:
        self._check("attach")
        return super().attach(servers, on_mirror, on_reconnect)

    def set_forwarding(self, entries: Sequence[ForwardingEntry]) -> None:
        self._check("set_forwarding", None, tuple(entries))
        self.forwarding = tuple(entries)

    def read_counters(self) -> Counters:
        return self.counters if self.counters is not None else self.book.read_counters()

    def server_macs(self) -> list[MacSighting] | None:
        return self.macs

    def _to_book(self, call: str, args: tuple) -> Any:
        """Every hot-key call: refused if a test said so, logged, then answered by the book."""
        if call in ONE_KEY_CALLS:
            return self._many(call, args[0])
        if call in KEYED_CALLS:
            self._check(call, args[0], *args[1:])
        else:
            self._check(call, logged=False)  # (the lease, counters, closes: no key, and often)
        return super()._to_book(call, args)

    def _many(self, call: str, items: Any) -> Any:
        """A call on many keys, key by key as its call on one is refused and logged; the book takes the rest in one
        call. A refused key is answered as refused (write_stamps, which answers all or none, raises)."""
        refused, kept = {}, []
        for key, rest, item in _each_key(call, items):
            try:
                self._check(ONE_KEY_CALLS[call], key, *rest)
                kept.append(item)
            except DriverError as err:
                if call == "write_stamps":
                    raise
                refused[key] = err
        if not kept:
            return refused
        taken = {key: items[key] for key in kept} if call == "clear_dirty_keys" else kept
        return {**refused, **super()._to_book(call, (taken,))}

    # --- what a test (or a dry run) reads and plays --------------------------------------------------------------
    def refuse(self, method: str, key: bytes | None = None, times: int = 1) -> None:
        """The next `times` calls of `method` (for `key`, or any key) raise DriverError, changing nothing; a call on
        many keys is refused key by key, by the name of its call on one (install_hot_keys by install_hot_key)."""
        with self._lock:
            self.refusals.append([method, key, times])

    def calls_of(self, method: str) -> list[Call]:
        with self._lock:
            return [c for c in self.calls if c.method == method]

    @property
    def table(self) -> Mapping[bytes, TableEntry]:
        """Every hot key the (first) switch holds, as it holds it (read only: play changes through the calls)."""
        tables, entries = self.tables[0], {}
        with self.book.lock:  # (the core's worker writes meanwhile: the tests read from their own thread)
            for key, entry in tables.hot.items():
                bounds = (0, *entry.cumulative)
                weights = tuple(ReplicaWeight(s, (b - a) / WEIGHT_ONE)
                                for s, a, b in zip(entry.servers, bounds, bounds[1:]))
                base = self.book.write_bases.get(key, (0,))[0]
                entries[key] = TableEntry(entry.home, weights, tables.written[entry.slot] - base)
        return MappingProxyType(entries)

    def dirty(self, key: bytes) -> bool:
        """As the data plane decides: held, or a count moved since the core synced the key, on some switch."""
        try:
            with self.book.lock:
                return any(t.dirty(key) for t in self.tables)
        except KeyError:
            raise DriverError(f"{key!r} is not installed") from None

    def route(self, key: bytes, request_id: int) -> int | None:
        """The server the first switch sends a get for `key` to: None when it passes untouched (not hot, dirty, or
        the lease out: it goes home), else the replica chosen by weight from a hash of `request_id`."""
        with self.book.lock:
            return self.tables[0].route(key, request_id)

    def count_write(self, key: bytes) -> None:
        """A write to `key` passed the first switch to its home: counted (dirty), its copy not delivered."""
        with self.book.lock:
            self.tables[0].count_write(key)

    def mirror(self, frame: bytes, key: bytes | None = None) -> None:
        """Deliver a copied packet; with `key`, first count the write to its home as the data plane would."""
        if key is not None:
            self.count_write(key)
        if self.on_mirror is not None:
            self.on_mirror(frame)

    def unsure(self, server: int, frame: bytes) -> None:
        """A request to `server` the data plane could not read: every hot key homed there dirty, the frame copied."""
        with self.book.lock:
            self.tables[0].count_unsure(server)
        self.mirror(frame)

    def count_close(self, server: int) -> None:
        """`server`'s memcached closed a connection of the controller's, as the first switch counts it (no copy
        delivered): no get balanced to it, its hot keys dirty, until the core acknowledges it (closes_handled)."""
        with self.book.lock:
            self.tables[0].count_close(server)

    def reconnect(self) -> None:
        """The switches came back empty: every table is new; the core is told to install its keys again."""
        with self.book.lock:
            for tables in self.tables:
                tables.reload()
                self._fill(tables)
            self.forwarding = ()
            self.book.came_back(self.tables)
        self._came_back()

    def leftover(self, key: bytes, home: int, replicas: Sequence[ReplicaWeight] | Sequence[int],
                 clean: bool = False) -> None:
        """Before attach: the switches hold `key` in a slot of its own (held dirty, or `clean` at the counts they
        have), installed by a controller that is gone; replicas given as servers are weighed equally."""
        weights = [r if isinstance(r, ReplicaWeight) else ReplicaWeight(r, 1 / len(replicas)) for r in replicas]
        for tables in self.tables:
            slot = next(n for n in range(len(tables.hot) + 1) if n not in {e.slot for e in tables.hot.values()})
            tables.hot[key] = HotEntry(slot, home, tuple(r.server for r in weights),
                                       tuple(cumulative_weights([r.weight for r in weights])))
            tables.synced[slot] = (tables.written[slot], tables.unsure_counts[home]) if clean else None

    def lease_left(self, seconds: float) -> None:
        """The switches' lease runs out `seconds` from now (0: it has run out): what they trust, whoever set it."""
        with self.book.lock:
            for tables in self.tables:
                tables.lease_ns = time.monotonic_ns() + int(seconds * 1e9) if seconds > 0 else 0

    def successor(self) -> "RecordingDriver":
        """A new driver on the same switches (a controller that took over): it finds their tables, counts and lease
        as they are."""
        return type(self)(self.tables)

    # --- the slot book driver's parts -----------------------------------------------------------------------------
    def _open(self, servers: Sequence[Server]) -> list[FoundKey]:
        """The switches as they are: what an earlier controller left there is read back and kept where they agree
        (dataplanes/read_back.py); the lease is left as it was, for the core to renew once it has judged each key."""
        with self.book.lock:
            self.book.servers = tuple(servers)
            self.book.use(self._views())
            return read_back(self.book)  # (closes counted before are the core's to handle: closes_pending)

    def _views(self) -> list[MemoryTables]:
        """What the book writes: the switches' tables themselves."""
        return self.tables

    def _fill(self, tables: MemoryTables) -> None:
        """What the driver writes to a switch that came back empty: the lease."""
        tables.set_lease(self.book.lease_until)

    def _release(self) -> None:
        pass  # the tables stay, as a switch's do

    def _watch(self) -> None:
        self._stop.wait()  # a switch in memory comes back empty only when a test says so (reconnect)

    def _check(self, method: str, key: bytes | None = None, *args: Any, logged: bool = True) -> None:
        """Refuse the call if a test said so (DriverError, nothing changed); else log it (`logged`)."""
        with self._lock:
            for refusal in self.refusals:
                if refusal[0] == method and refusal[1] in (None, key) and refusal[2] > 0:
                    refusal[2] -= 1
                    raise DriverError(f"{method} refused (test)")
            if logged:
                self.calls.append(Call(time.monotonic(), method, key, args))


def _each_key(call: str, items: Any) -> list[tuple[bytes, tuple, Any]]:
    """(key, the further arguments of the call on one key, the item) of each item of a call on many keys."""
    if call == "install_hot_keys":
        return [(i.key, (i.home, i.replicas), i) for i in items]
    if call == "clear_dirty_keys":
        return [(key, (stamp,), key) for key, stamp in items.items()]
    return [(key, (), key) for key in items]  # remove_hot_keys, write_stamps
