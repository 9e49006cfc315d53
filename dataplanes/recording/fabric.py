"""A simulated fabric: N switches whose hot-key tables are kept in memory, driven through the slot book
(dataplanes/slot_book.py), the bookkeeping the eBPF and P4 drivers use for their own N switches. Each request to a
switch (a single call, or a call on many keys: P4Runtime's one WriteRequest) takes `delay` seconds, what reaching a
switch across the network costs; the book writes `width` switches at once (1: one after the other), as the P4
driver does (`[dataplane.p4] parallel`). For
measuring one controller against many switches and servers without them (experiments/benchmarks/
bench_controller_scale.py); no packet is forwarded and nothing is counted but the requests.

Key-range shards (docs/scale.md, "Where it would shard"): several fabrics over the same switches, each driving its
own range of slots (`slots`) through a ShardTables view, whose lease is its shard's alone; a switch serves one
request at a time, whichever controller sent it. A shard's new controller removes the keys it finds in its own
range, and no other.
"""
from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Sequence

from dataplanes.driver import ForwardingEntry, LeftoverKey, StreamId
from dataplanes.fan_out import FanOut
from dataplanes.pipeline import COUNTERS, MAX_HOT
from dataplanes.slot_book import HotEntry, KeyCounts, SlotBook
from dataplanes.slot_book_driver import SlotBookDriver
from mbalancer.settings import Server


class MemoryTables:
    """One simulated switch's tables (dataplanes/slot_book.py SwitchTables); `requests` counts what it was sent."""

    up = True

    def __init__(self, delay: float = 0.0):
        self.delay = delay
        self.requests = 0
        self.hot: dict[bytes, HotEntry] = {}
        self.written: Counter = Counter()  # slot -> writes counted (none here: no packet passes)
        self.synced: dict[int, tuple[int, int] | None] = {}  # slot -> (writes, unsure) it is clean at; None: held
        self.lease_ns = 0
        self.shard_leases: dict[int, int] = {}  # a key-range shard's first slot -> its lease (ShardTables)
        self._serving = threading.Lock()  # one request at a time, whoever sent it

    def _request(self) -> None:
        with self._serving:
            self.requests += 1
            if self.delay:
                time.sleep(self.delay)

    # --- one call, one request ---------------------------------------------------------------------------------
    def set_hot(self, key: bytes, entry: HotEntry, old: HotEntry | None) -> None:
        self._request()
        self.hot[key] = entry

    def delete_hot(self, key: bytes, entry: HotEntry) -> None:
        self._request()
        self.hot.pop(key, None)

    def reset_key_counts(self, slot: int) -> None:
        self._request()

    def writes(self, slot: int) -> int:
        self._request()
        return self.written[slot]

    def unsure(self, server: int) -> int:
        self._request()
        return 0

    def hold(self, slot: int) -> None:
        self._request()
        self.synced[slot] = None

    def set_synced(self, slot: int, writes: int, unsure: int) -> None:
        self._request()
        self.synced[slot] = (writes, unsure)

    def key_counts(self, slot: int, replicas: int) -> KeyCounts:
        self._request()
        return KeyCounts(0, 0, 0, [0] * replicas)

    def counters(self) -> dict[str, int]:
        self._request()
        return dict.fromkeys(COUNTERS, 0)

    def set_lease(self, until_ns: int) -> None:
        self._request()
        self.lease_ns = until_ns

    def closes(self, server: int) -> int:
        self._request()
        return 0

    def set_closes_handled(self, server: int, count: int) -> None:
        self._request()

    def resume_stream(self, stream: StreamId, seq: int) -> None:
        self._request()

    def blind_stream(self, stream: StreamId) -> None:
        self._request()

    # --- a call on many keys, one request ----------------------------------------------------------------------
    def install_keys(self, entries: Sequence[tuple[bytes, HotEntry]]) -> list[int]:
        self._request()
        for key, entry in entries:
            self.synced[entry.slot] = None
            self.hot[key] = entry
        return [self.written[entry.slot] for _, entry in entries]

    def delete_keys(self, entries: Sequence[tuple[bytes, HotEntry]]) -> None:
        self._request()
        for key, _ in entries:
            self.hot.pop(key, None)

    def key_counts_many(self, slot_replicas: Sequence[tuple[int, int]]) -> list[KeyCounts]:
        self._request()
        return [KeyCounts(0, 0, 0, [0] * replicas) for _, replicas in slot_replicas]

    def write_counts(self, slot_homes: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
        self._request()
        return [(self.written[slot], 0) for slot, _ in slot_homes]

    def set_synced_slots(self, synced: Sequence[tuple[int, int, int]]) -> None:
        self._request()
        for slot, writes, unsure in synced:
            self.synced[slot] = (writes, unsure)


class ShardTables:
    """A key-range shard's view of a switch's tables: its lease is the shard's (an election id and a lease per slot
    range, where the agent today has one per switch); the rest is the switch's."""

    def __init__(self, tables: MemoryTables, slots: range):
        self.tables, self.slots = tables, slots

    def set_lease(self, until_ns: int) -> None:
        self.tables._request()
        self.tables.shard_leases[self.slots.start] = until_ns

    def __getattr__(self, name: str):
        return getattr(self.tables, name)


class SimulatedFabric(SlotBookDriver):
    """`switches` simulated switches, each request to one taking `delay` seconds, `width` of them written at once;
    or, as a key-range shard, the `slots` range of shared `tables`."""

    name = "simulated fabric"

    def __init__(self, switches: int, delay: float = 0.0, width: int = 1,
                 tables: list[MemoryTables] | None = None, slots: range | None = None):
        super().__init__(SlotBook(f"simulated fabric of {switches} switches", (RuntimeError,),
                                  FanOut(width, "mbalancer-fabric"), slots if slots is not None else MAX_HOT))
        self.tables = tables if tables is not None else [MemoryTables(delay) for _ in range(switches)]
        self.shard = slots

    @property
    def requests(self) -> int:
        """Requests sent to every switch so far."""
        return sum(t.requests for t in self.tables)

    def set_forwarding(self, entries: Sequence[ForwardingEntry]) -> None:
        pass  # nothing is forwarded

    def _open(self, servers: Sequence[Server]) -> list[LeftoverKey]:
        with self.book.lock:
            self.book.servers = tuple(servers)
            if self.shard is None:
                self.book.use(self.tables)
                return []
            self.book.use([ShardTables(t, self.shard) for t in self.tables])
            left = {key: entry for t in self.tables for key, entry in list(t.hot.items()) if entry.slot in self.shard}
            for tables in self.tables:  # what a previous controller of this shard left: its rules out
                tables.delete_keys([(key, entry) for key, entry in left.items() if key in tables.hot])
        return [LeftoverKey(key, entry.home, (entry.home, *entry.servers)) for key, entry in left.items()]

    def _release(self) -> None:
        pass

    def _watch(self) -> None:
        self._stop.wait()  # a simulated switch never comes back empty

