"""One switch's hot-key tables kept in memory: the slot book's adapter (dataplanes/slot_book.py SwitchTables) for
the `none` data plane (the recording driver, driver.py) and the simulated fabric (fabric.py).

The tables decide as every pipeline does (docs/architecture.md, "The pipeline"): a key is dirty while held, or while
its slot's write count or its home's unsure count differs from what the controller synced it to, and every key acts
dirty once the lease has run out. What passes the switch is played by the caller: a write to a hot key's home
(`count_write`), a request to a server nobody can read (`count_unsure`), a server closing a connection of the
controller's (`count_close`), a get (`route`: where it goes, counted as the switch counts it). Each call of the
book's is one request (`requests`), taking `delay` seconds: what reaching a switch across the network costs.
"""
from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Sequence

from dataplanes.driver import StreamId
from dataplanes.pipeline import COUNTERS, WEIGHT_ONE
from dataplanes.slot_book import HotEntry, KeyCounts


class TablesError(Exception):
    """A simulated switch refused a request (raised only by a test's refusing adapter)."""


class MemoryTables:
    """One simulated switch's tables; `requests` counts what the book sent it."""

    up = True

    def __init__(self, delay: float = 0.0):
        self.delay = delay
        self.calls: Counter = Counter()  # the table call (its method's name) -> requests it sent
        self.hot: dict[bytes, HotEntry] = {}
        self.written: Counter = Counter()  # slot -> writes counted since the switch was loaded
        self.synced: dict[int, tuple[int, int] | None] = {}  # slot -> (writes, unsure) it is clean at; None: held
        self.unsure_counts: Counter = Counter()  # server -> requests to it the switch could not read
        self.closes_seen: Counter = Counter()  # server -> closes of the controller's connections, as counted
        self.closes_handled: Counter = Counter()
        self.counts: dict[int, KeyCounts] = {}  # slot -> its counters since they were reset
        self.switch: Counter = Counter()  # the switch-wide counters, by the names of dataplanes/pipeline.py COUNTERS
        self.lease_ns = 0
        self.shard_leases: dict[int, int] = {}  # a key-range shard's first slot -> its lease (fabric.py ShardTables)
        self._serving = threading.Lock()  # one request at a time, whoever sent it (the book writes switches at once)

    def _request(self, call: str) -> None:
        with self._serving:
            self.calls[call] += 1
            if self.delay:
                time.sleep(self.delay)

    @property
    def requests(self) -> int:
        """Requests sent to this switch so far, whatever the call."""
        return sum(self.calls.values())

    # --- one call, one request ---------------------------------------------------------------------------------
    def set_hot(self, key: bytes, entry: HotEntry, old: HotEntry | None) -> None:
        self._request("set_hot")
        self.hot[key] = entry

    def delete_hot(self, key: bytes, entry: HotEntry) -> None:
        self._request("delete_hot")
        self.hot.pop(key, None)

    def reset_key_counts(self, slot: int) -> None:
        self._request("reset_key_counts")
        self.counts.pop(slot, None)

    def writes(self, slot: int) -> int:
        self._request("writes")
        return self.written[slot]

    def unsure(self, server: int) -> int:
        self._request("unsure")
        return self.unsure_counts[server]

    def hold(self, slot: int) -> None:
        self._request("hold")
        self.synced[slot] = None

    def set_synced(self, slot: int, writes: int, unsure: int) -> None:
        self._request("set_synced")
        self.synced[slot] = (writes, unsure)

    def key_counts(self, slot: int, replicas: int) -> KeyCounts:
        self._request("key_counts")
        return self._counts_of(slot, replicas)

    def _counts_of(self, slot: int, replicas: int) -> KeyCounts:
        counts = self.counts.get(slot, KeyCounts(0, 0, 0, []))
        return KeyCounts(counts.gets, counts.home_while_dirty, counts.mirrored,
                         (counts.per_replica + [0] * replicas)[:replicas])

    def counters(self) -> dict[str, int]:
        self._request("counters")
        return {name: self.switch[name] for name in COUNTERS}

    def set_lease(self, until_ns: int) -> None:
        self._request("set_lease")
        self.lease_ns = until_ns

    def closes(self, server: int) -> int:
        self._request("closes")
        return self.closes_seen[server]

    def set_closes_handled(self, server: int, count: int) -> None:
        self._request("set_closes_handled")
        self.closes_handled[server] = count

    def closes_pending(self, server: int) -> bool:
        self._request("closes_pending")
        return self._suspect(server)

    def resume_stream(self, stream: StreamId, seq: int) -> None:
        self._request("resume_stream")

    def blind_stream(self, stream: StreamId) -> None:
        self._request("blind_stream")

    # --- what a new controller reads back to adopt (dataplanes/read_back.py) ----------------------------------
    def held_keys(self) -> dict[bytes, HotEntry]:
        self._request("held_keys")
        return dict(self.hot)

    def synced_counts(self, slot: int) -> tuple[int, int] | None:
        self._request("synced_counts")
        return self.synced.get(slot)

    def lease(self) -> int:
        self._request("lease")
        return self.lease_ns

    # --- a call on many keys, one request ----------------------------------------------------------------------
    def install_keys(self, entries: Sequence[tuple[bytes, HotEntry]]) -> list[int]:
        self._request("install_keys")
        for key, entry in entries:
            self.counts.pop(entry.slot, None)
            self.synced[entry.slot] = None
            self.hot[key] = entry
        return [self.written[entry.slot] for _, entry in entries]

    def delete_keys(self, entries: Sequence[tuple[bytes, HotEntry]]) -> None:
        self._request("delete_keys")
        for key, _ in entries:
            self.hot.pop(key, None)

    def key_counts_many(self, slot_replicas: Sequence[tuple[int, int]]) -> list[KeyCounts]:
        self._request("key_counts_many")
        return [self._counts_of(slot, replicas) for slot, replicas in slot_replicas]

    def write_counts(self, slot_homes: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
        self._request("write_counts")
        return [(self.written[slot], self.unsure_counts[home]) for slot, home in slot_homes]

    def set_synced_slots(self, synced: Sequence[tuple[int, int, int]]) -> None:
        self._request("set_synced_slots")
        for slot, writes, unsure in synced:
            self.synced[slot] = (writes, unsure)

    # --- what passes the switch (played by a test; no request) -------------------------------------------------
    def count_write(self, key: bytes) -> bool:
        """A write to `key` reached its home through the switch: counted in its slot and copied (True) if the key
        is hot here."""
        entry = self.hot.get(key)
        if entry is None:
            return False
        self.written[entry.slot] += 1
        self._slot_counts(entry).mirrored += 1
        self.switch["mirrored"] += 1
        return True

    def count_unsure(self, server: int) -> None:
        """A request to `server` the switch could not read: every hot key homed there dirty."""
        self.unsure_counts[server] += 1
        self.switch["unsure"] += 1

    def count_close(self, server: int) -> None:
        """`server`'s memcached closed a connection of the controller's (it may have restarted empty): until the
        controller has dealt with it, no get is balanced to it, and (an unsure request) its hot keys are dirty."""
        self.closes_seen[server] += 1
        self.count_unsure(server)

    def _suspect(self, server: int) -> bool:
        """It closed a connection of the controller's since the controller last dealt with its closes."""
        return self.closes_seen[server] != self.closes_handled[server]

    def dirty(self, key: bytes) -> bool:
        """Whether the key's gets go home: held, or a count moved since the controller synced it (KeyError: not
        hot here)."""
        entry = self.hot[key]
        return self.synced.get(entry.slot) != (self.written[entry.slot], self.unsure_counts[entry.home])

    def route(self, key: bytes, request_id: int) -> int | None:
        """Where a get for `key` goes: None when it passes untouched (not hot, dirty, or the lease out: to the
        server it was sent to), else the replica whose range of the request's hash (0..WEIGHT_ONE) holds it,
        counted as the switch counts it; None too where that replica may have lost its copy (`count_close`)."""
        entry = self.hot.get(key)
        if entry is None:
            return None
        counts = self._slot_counts(entry)
        counts.gets += 1
        if self.dirty(key) or time.monotonic_ns() >= self.lease_ns:
            counts.home_while_dirty += 1
            return None
        point = (request_id * 2654435761 % 2 ** 32) * WEIGHT_ONE >> 32
        index = next(i for i, bound in enumerate(entry.cumulative) if point < bound)
        counts.per_replica[index] += 1
        chosen = entry.servers[index]
        if chosen != entry.home and self._suspect(chosen):
            return None
        self.switch["balanced"] += 1
        return chosen

    def reload(self) -> None:
        """The switch came back empty (restarted, reloaded): every table and count is new."""
        delay, calls = self.delay, self.calls
        self.__init__(delay)
        self.calls = calls

    def _slot_counts(self, entry: HotEntry) -> KeyCounts:
        counts = self.counts.setdefault(entry.slot, KeyCounts(0, 0, 0, []))
        counts.per_replica += [0] * (len(entry.servers) - len(counts.per_replica))
        return counts
