"""One bmv2 switch's hot-key tables over P4Runtime, as the slot book (dataplanes/slot_book.py) asks for them: the
P4 data plane's tables adapter. Entities are built and read back by name (dataplanes/p4/entries.py).

How the P4 program (p4src/mbalancer.p4) holds what the book keeps: a hot key is a `hot_keys` entry (slot, home); its
weights are `replicas` entries, a range of the request hash per replica; its synced counts a `synced` entry (none:
held dirty). Writes per slot and unsure requests per server are counted in registers, which P4Runtime cannot read;
each has a twin counter (key_mirrored, server_unsure) that is read instead, and that is never reset (it must stay
equal to its register), so the slot's mirrored count is given relative to its value at install. The lease
is a PacketOut the switch adds to its own clock; another PacketOut asks how much of it is left (op 3, answered by a
PacketIn).

What P4Runtime cannot read back of a key otherwise rides with its hot_keys entry as the entry's metadata (bytes the
switch keeps for the controller, `hot_metadata`): every replica in order, those at weight 0 too (they have no
range), and the slot's mirrored count at install. So a controller that takes over reads each key back whole
(`held_keys`), as dataplanes/read_back.py asks.
"""
from __future__ import annotations

import ipaddress
import logging
import queue
import struct
import time
from collections import OrderedDict
from typing import Sequence

from dataplanes.p4 import entries as e
from dataplanes.p4.client import P4RuntimeClient, P4RuntimeError, encode
from dataplanes.p4.pipeline import STREAM_RESUMES, P4Error, Pipeline
from dataplanes.driver import StreamId
from dataplanes.pipeline import COUNTERS, MAX_REPLICAS, WEIGHT_ONE
from dataplanes.slot_book import HotEntry, KeyCounts, keys_named

log = logging.getLogger(__name__)
Range = tuple[int, int, int]  # (low, high, position) of the 16-bit request hash
LEASE_US_MAX = (1 << 32) - 1  # the packet_out's lease_us field
BASE = struct.Struct(">Q")  # hot_metadata: the slot's mirrored count at install, then a server index per replica
SERVER = struct.Struct(">H")
UNKNOWN_SERVER = 0xFFFF  # a replica read back without its server (an entry with no metadata): no config has it
# seconds a lease query's answer is awaited (bmv2 answers in ms): one not answered only makes a takeover resync the
# switch's keys, so it is not worth the whole P4Runtime timeout of a takeover
LEASE_QUERY_WAIT = 1.0


class P4Tables:
    def __init__(self, client: P4RuntimeClient, pipeline: Pipeline):
        self.client, self.pipeline = client, pipeline
        self.synced_slots: set[int] = set()  # slots with a `synced` entry
        self.mirrored_base: dict[int, int] = {}  # slot -> key_mirrored at its reset
        self.handled_servers: set[int] = set()  # servers with a `closes_handled` entry
        self.resumes: OrderedDict[StreamId, int] = OrderedDict()  # connection -> its `stream_resumes` entry's seq
        self.blind: OrderedDict[StreamId, None] = OrderedDict()  # connections with a `blind_streams` entry
        self.reports: queue.Queue[int] = queue.Queue()  # answers to rearms, as the stream's thread receives them
        self.lease_answers: queue.Queue[int] = queue.Queue()  # answers to lease queries (µs left)
        self.lease_asked: int | None = None  # CLOCK_MONOTONIC ns a lease query went out, until its answer is taken
        self.found_synced: dict[int, tuple[int, int]] = {}  # the `synced` entries as held_keys read them
        self.found_ranges: dict[int, set[tuple[int, int]]] = {}  # slot -> its ranges as held_keys read them

    @property
    def up(self) -> bool:
        return not self.client.down

    # --- hot_get ----------------------------------------------------------------------------------------------
    def set_hot(self, key: bytes, entry: HotEntry, old: HotEntry | None) -> None:
        if old is None:
            self.client.write(self._install_updates(key, entry), f"install {key!r}")
            return
        try:
            self.client.write(self._weight_updates(key, old, entry), f"weights of {key!r}")
        except P4Error:  # bmv2 applies a batch update by update: put back what was there
            self._quietly(self._weight_updates(key, entry, old), f"restore {key!r}")
            raise
        self.found_ranges.pop(entry.slot, None)  # its ranges are the entry's now

    def delete_hot(self, key: bytes, entry: HotEntry) -> None:
        self.delete_keys([(key, entry)])

    # --- many keys, one request each (bmv2 applies a batch's updates in order, and goes on past a refused one) --
    def install_keys(self, entries: Sequence[tuple[bytes, HotEntry]]) -> list[int]:
        """One read (each slot's write count so far: the keys' bases), one write: the slots' counters reset and held
        dirty, then each key's ranges and its hot_keys entry (which makes them live)."""
        slots = [entry.slot for _, entry in entries]
        bases = self._counts([("key_mirrored", slot) for slot in slots], "the slots' write counts")
        updates = [e.update(e.MODIFY, r) for slot in slots for r in self._counter_resets(slot)]
        updates += [e.update(e.DELETE, self._synced(slot)) for slot in slots if slot in self.synced_slots]
        updates += [e.update(e.DELETE, self._range(slot, low, high))  # ranges read back of no key (a crash between
                    for slot in slots for low, high in sorted(self.found_ranges.pop(slot, ()))]  # a remove's writes)
        for (key, entry), base in zip(entries, bases):
            updates += self._install_updates(key, entry, base)
        self.synced_slots.difference_update(slots)
        self.client.write(updates, f"install {keys_named([k for k, _ in entries])}")
        self.mirrored_base.update(zip(slots, bases))
        return bases

    def delete_keys(self, entries: Sequence[tuple[bytes, HotEntry]]) -> None:
        """Every key out of hot_keys first (its gets and writes go home untouched from then on), then the slots' other
        entries; an entry not there (a failed install never wrote it) is no error."""
        updates = [e.update(e.DELETE, self._hot(key)) for key, _ in entries]
        for _, entry in entries:  # (ranges read back that are not the entry's: a switch that disagreed, gone too)
            held = {(low, high) for low, high, _ in ranges(entry)} | self.found_ranges.pop(entry.slot, set())
            updates += [e.update(e.DELETE, self._range(entry.slot, low, high)) for low, high in sorted(held)]
            updates.append(e.update(e.DELETE, self._synced(entry.slot)))
            self.synced_slots.discard(entry.slot)
        self.client.write(updates, f"remove {keys_named([k for k, _ in entries])}", missing_ok=True)

    def write_counts(self, slot_homes: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
        """One read of every slot's write count and every home's unsure count."""
        homes = sorted({home for _, home in slot_homes})
        values = self._counts([("key_mirrored", slot) for slot, _ in slot_homes]
                              + [("server_unsure", home) for home in homes], "write counts")
        unsure = dict(zip(homes, values[len(slot_homes):]))
        return [(writes, unsure[home]) for writes, (_, home) in zip(values, slot_homes)]

    def set_synced_slots(self, synced: Sequence[tuple[int, int, int]]) -> None:
        updates = [e.update(e.MODIFY if slot in self.synced_slots else e.INSERT, self._synced(slot, writes, unsure))
                   for slot, writes, unsure in synced]
        try:
            self.client.write(updates, f"clear slots {', '.join(str(slot) for slot, _, _ in synced)}")
        except P4RuntimeError as err:  # those the switch did not name were applied
            if err.refused:
                self.synced_slots.update(slot for i, (slot, _, _) in enumerate(synced) if i not in err.refused)
            raise
        self.synced_slots.update(slot for slot, _, _ in synced)

    # --- dirty state ------------------------------------------------------------------------------------------
    def writes(self, slot: int) -> int:
        return self.count("key_mirrored", slot)

    def unsure(self, server: int) -> int:
        return self.count("server_unsure", server)

    def hold(self, slot: int) -> None:
        if slot in self.synced_slots:
            self.client.write([e.update(e.DELETE, self._synced(slot))], f"hold slot {slot} dirty")
            self.synced_slots.discard(slot)

    def set_synced(self, slot: int, writes: int, unsure: int) -> None:
        self.set_synced_slots([(slot, writes, unsure)])

    def synced(self, slot: int) -> tuple[int, int] | None:
        """The slot's `synced` entry as the switch has it: (writes, unsure), None where there is none."""
        for entity in self.client.read([self._synced(slot)], "synced"):
            params = e.params_of(self.pipeline, "synced_to", entity)
            return params["written"], params["unsure_count"]
        return None

    # --- what a controller that takes over reads back (dataplanes/read_back.py) --------------------------------
    def held_keys(self) -> dict[bytes, HotEntry]:
        """Every hot key the switch holds, with its entry, in one read; with them what this adapter records of the
        switch's tables is read too (the `synced` entries, which synced_counts then answers from, the slots'
        mirrored bases, `closes_handled`, `stream_resumes` and `blind_streams`): it goes on from the tables as they
        are. An entry the switch holds but this controller could not have written (its ranges are not its
        replicas' cumulative weights, or its metadata is missing and a replica has no range) is given with a
        server no config has (UNKNOWN_SERVER) or no weights: the book does not keep it (read_back.placeable)."""
        tables = ("hot_keys", "replicas", "synced", "closes_handled", "stream_resumes", "blind_streams")
        ids = {self.pipeline.table(t).id: t for t in tables}
        read: dict[str, list] = {t: [] for t in tables}
        for entity in self.client.read([e.table_entry(self.pipeline, t, {}) for t in tables], "the hot keys held"):
            read[ids[entity.table_entry.table_id]].append(entity)
        found: dict[int, dict[int, tuple[int, int, int]]] = {}  # slot -> position -> (low, high, server)
        for entity in read["replicas"]:
            match, to = e.match_of(self.pipeline, "replicas", entity), e.params_of(self.pipeline, "to_replica", entity)
            found.setdefault(match["meta.slot"], {})[to["position"]] = (*match["meta.point"], to["server"])
        held = {}
        for entity in read["hot_keys"]:
            match, hot = e.match_of(self.pipeline, "hot_keys", entity), e.params_of(self.pipeline, "hot", entity)
            key = match["meta.key"].to_bytes(match["meta.key_len"], "big")
            servers, base = read_metadata(entity.table_entry.metadata)
            if base is not None:
                self.mirrored_base[hot["slot"]] = base
            held[key] = read_entry(hot["slot"], hot["home"], servers, found.get(hot["slot"], {}))
        self.found_ranges = {slot: {(low, high) for low, high, _ in at.values()} for slot, at in found.items()}
        self.found_synced = {}
        for entity in read["synced"]:
            synced = e.params_of(self.pipeline, "synced_to", entity)
            self.found_synced[e.match_of(self.pipeline, "synced", entity)["meta.slot"]] = (
                synced["written"], synced["unsure_count"])
        self.synced_slots = set(self.found_synced)
        self.handled_servers = {e.match_of(self.pipeline, "closes_handled", entity)["meta.checked_server"]
                                for entity in read["closes_handled"]}
        for table, held_streams in (("stream_resumes", self.resumes), ("blind_streams", self.blind)):
            held_streams.clear()
            for entity in read[table]:
                match = e.match_of(self.pipeline, table, entity)
                held_streams[stream_of(match)] = match.get("hdr.tcp.seq")
        return held

    def synced_counts(self, slot: int) -> tuple[int, int] | None:
        """The (writes, unsure) the slot's key is clean at, as held_keys read its `synced` entry; None: held."""
        return self.found_synced.get(slot)

    def ask_lease(self) -> None:
        """Ask the switch how much of the lease is left (op 3): `lease` takes the answer, so that every switch is
        asked before any answer is awaited."""
        while not self.lease_answers.empty():  # an answer that came after its caller gave up
            self.lease_answers.get_nowait()
        self.lease_asked = time.monotonic_ns()
        self._packet_out(OP_LEASE_QUERY)

    def lease_left(self) -> int | None:
        """Microseconds left on the lease as the switch answers a lease query (0: over, or never given); None if it
        gives no answer in time (a program without the query drops it)."""
        if self.lease_asked is None:
            self.ask_lease()
        wait = min(self.client.timeout, LEASE_QUERY_WAIT)
        try:
            return self.lease_answers.get(timeout=max(self.lease_asked + wait * 1e9 - time.monotonic_ns(), 0) / 1e9)
        except queue.Empty:
            log.warning("%s: no answer to a lease query within %g s (a program without op 3?): the lease is not "
                        "known", self.client.address, wait)
            return None

    def lease(self) -> int | None:
        """Until when (CLOCK_MONOTONIC ns) the switch trusts the copies: from when the query went out, so never
        later than the switch's own end; 0 if over; None if the switch does not say."""
        asked = self.lease_asked if self.lease_asked is not None else time.monotonic_ns()
        left = self.lease_left()
        self.lease_asked = None
        if left is None:
            return None
        return asked + left * 1000 if left else 0

    def lease_answer(self, left_us: int) -> None:
        """A lease query's answer, as its PacketIn brought it."""
        self.lease_answers.put(left_us)

    # --- servers that closed the controller's connections -----------------------------------------------------
    def closes(self, server: int) -> int:
        return self.count("server_closes", server)

    def closes_pending(self, server: int) -> bool:
        """The server's closes (the twin counter) differ from its `closes_handled` entry (none: 0 handled)."""
        entry = e.table_entry(self.pipeline, "closes_handled", {"meta.checked_server": server})
        handled = [e.params_of(self.pipeline, "handled_closes", entity)["count"]
                   for entity in self.client.read([entry], f"closes of server {server} handled")]
        return self.closes(server) != (handled[0] if handled else 0)

    def set_closes_handled(self, server: int, count: int) -> None:
        kind = e.MODIFY if server in self.handled_servers else e.INSERT
        entry = e.table_entry(self.pipeline, "closes_handled", {"meta.checked_server": server}, "handled_closes",
                              {"count": count})
        self.client.write([e.update(kind, entry)], f"closes of server {server} handled")
        self.handled_servers.add(server)

    # --- requests nobody can read: copies coalesced per report ------------------------------------------------
    def unsure_report(self, server: int) -> float:
        """Rearm the server's report (its next coalescable unsure request is copied again); seconds since the latest
        such request passed, as the switch answers."""
        while not self.reports.empty():  # an answer that came after its caller gave up
            self.reports.get_nowait()
        self._packet_out(OP_REARM, server=server)
        try:
            return self.reports.get(timeout=self.client.timeout) / 1e6
        except queue.Empty:
            raise P4Error(f"{self.client.address}: no answer to the rearm of server {server} within "
                          f"{self.client.timeout:g} s") from None

    def answer(self, quiet_us: int) -> None:
        """A rearm's answer, as its PacketIn brought it."""
        self.reports.put(quiet_us)

    def blind_stream(self, stream: StreamId) -> None:
        """A `blind_streams` entry: the connection's segments are copied once per report."""
        if stream not in self.blind:
            self._connection_entry("blind_streams", self.blind, stream, None, f"{stream} not followed")

    def _connection_entry(self, table: str, held: OrderedDict, stream: StreamId, seq: int | None, what: str) -> None:
        """`stream`'s entry in `table` (keyed by the connection, and by `seq` if given), in place of its earlier one;
        `held` mirrors the table (connection -> seq), whose oldest entries go when it is full."""
        updates = []
        if stream in held:
            updates.append(e.update(e.DELETE, self._connection(table, stream, held.pop(stream))))
        while len(held) >= STREAM_RESUMES:
            updates.append(e.update(e.DELETE, self._connection(table, *held.popitem(last=False))))
        updates.append(e.update(e.INSERT, self._connection(table, stream, seq)))
        self.client.write(updates, what)
        held[stream] = seq

    def _connection(self, table: str, stream: StreamId, seq: int | None):
        match = {"hdr.ipv4.src": e.ip_value(stream.client_ip), "hdr.ports.src": stream.client_port,
                 "hdr.ipv4.dst": e.ip_value(stream.server_ip), "hdr.ports.dst": stream.server_port}
        if seq is not None:
            match["hdr.tcp.seq"] = seq
        return e.table_entry(self.pipeline, table, match, "NoAction")

    def _packet_out(self, op: int, lease_us: int = 0, server: int = 0) -> None:
        fields = self.pipeline.packet_metadata["packet_out"]
        self.client.packet_out(b"", {fields[name][0]: encode(value, fields[name][1])
                                     for name, value in (("op", op), ("lease_us", lease_us), ("server", server))})

    # --- TCP connections read as streams ----------------------------------------------------------------------
    def resume_stream(self, stream: StreamId, seq: int) -> None:
        """A `stream_resumes` entry for the segment at `seq`, in place of the connection's earlier one; the oldest
        goes when the table is full (that connection's next boundary is then not known: its segments stay
        unsure until it ends)."""
        self._connection_entry("stream_resumes", self.resumes, stream, seq & 0xFFFFFFFF,
                               f"command boundary of {stream}")

    def set_lease(self, until_ns: int) -> None:
        """A PacketOut the switch adds to its own clock; returns once the switch has counted it (a PacketOut is sent
        on the stream without a reply: an ended lease must be over when this returns)."""
        lease_us = min(max(until_ns - time.monotonic_ns(), 0) // 1000, LEASE_US_MAX) if until_ns else 0
        before = self.count("lease_renewals", 0)
        self._packet_out(OP_LEASE, lease_us=lease_us)
        deadline = time.monotonic() + self.client.timeout
        while self.count("lease_renewals", 0) == before:
            if time.monotonic() > deadline:
                raise P4Error(f"{self.client.address}: the switch did not take the lease within "
                              f"{self.client.timeout:g} s")
            time.sleep(0.001)

    # --- counters ---------------------------------------------------------------------------------------------
    def key_counts(self, slot: int, replicas: int) -> KeyCounts:
        reads = [e.counter_read(self.pipeline, name, slot)
                 for name in ("key_gets", "key_home_while_dirty", "key_mirrored")]
        reads += [e.counter_read(self.pipeline, "key_per_replica", slot * MAX_REPLICAS + p) for p in range(replicas)]
        values = [r.counter_entry.data.packet_count for r in self.client.read(reads, f"counters of slot {slot}")]
        return KeyCounts(values[0], values[1], values[2] - self.mirrored_base.get(slot, 0), values[3:])

    def key_counts_many(self, slot_replicas: Sequence[tuple[int, int]]) -> list[KeyCounts]:
        """key_counts of each (slot, replicas) in one ReadRequest."""
        if not slot_replicas:
            return []
        cells = [[(name, slot) for name in ("key_gets", "key_home_while_dirty", "key_mirrored")]
                 + [("key_per_replica", slot * MAX_REPLICAS + p) for p in range(replicas)]
                 for slot, replicas in slot_replicas]
        values = iter(self._counts([cell for cells_of in cells for cell in cells_of], "counters of the hot keys"))
        counts = []
        for (slot, replicas) in slot_replicas:
            gets, home, mirrored, *per_replica = (next(values) for _ in range(3 + replicas))
            counts.append(KeyCounts(gets, home, mirrored - self.mirrored_base.get(slot, 0), per_replica))
        return counts

    def counters(self) -> dict[str, int]:
        read = self.client.read([e.counter_read(self.pipeline, "switch_counters"),
                                 e.counter_read(self.pipeline, "cloned")], "switch counters")
        cloned_id = self.pipeline.counter("cloned")
        counts = dict.fromkeys(COUNTERS, 0)  # switch_counters holds them in the eBPF program's order
        for entity in read:
            entry = entity.counter_entry
            if entry.counter_id == cloned_id:
                counts["cloned"] += entry.data.packet_count
            elif entry.index.index < len(COUNTERS) and COUNTERS[entry.index.index] != "cloned":
                counts[COUNTERS[entry.index.index]] += entry.data.packet_count
        return counts

    # --- entries ----------------------------------------------------------------------------------------------
    def _hot(self, key: bytes, entry: HotEntry | None = None, base: int | None = None):
        """The key's hot_keys entry (its key only if `entry` is None), with its replicas and the slot's mirrored
        count at install (`base`; by default as recorded) as metadata."""
        match = {"meta.key_len": len(key), "meta.key": e.key_value(key)}
        if entry is None:
            return e.table_entry(self.pipeline, "hot_keys", match)
        base = self.mirrored_base.get(entry.slot, 0) if base is None else base
        return e.table_entry(self.pipeline, "hot_keys", match, "hot", {"slot": entry.slot, "home": entry.home},
                             metadata=hot_metadata(entry.servers, base))

    def _weight_updates(self, key: bytes, old: HotEntry, new: HotEntry) -> list:
        """From `old` weights to `new` ones: the ranges, and the hot_keys entry's metadata where the replicas
        differ."""
        updates = self._range_updates(new.slot, old, new)
        if old.servers != new.servers:
            updates.append(e.update(e.MODIFY, self._hot(key, new)))
        return updates

    def _range_updates(self, slot: int, old: HotEntry | None, new: HotEntry | None) -> list:
        """From the `old` entry's ranges to the `new` one's: old ones deleted first (a point between ranges goes
        home, never to a replica that lost its weight)."""
        updates = [e.update(e.DELETE, self._range(slot, lo, hi)) for lo, hi, _ in ranges(old)]
        servers = new.servers if new else ()
        return updates + [e.update(e.INSERT, self._range(slot, lo, hi, servers[p], p)) for lo, hi, p in ranges(new)]

    def _range(self, slot: int, low: int, high: int, server: int | None = None, position: int = 0):
        match = {"meta.slot": slot, "meta.point": (low, high)}
        if server is None:
            return e.table_entry(self.pipeline, "replicas", match, priority=1)
        return e.table_entry(self.pipeline, "replicas", match, "to_replica", {"server": server, "position": position},
                             priority=1)

    def _synced(self, slot: int, writes: int | None = None, unsure: int | None = None):
        if writes is None:
            return e.table_entry(self.pipeline, "synced", {"meta.slot": slot})
        return e.table_entry(self.pipeline, "synced", {"meta.slot": slot}, "synced_to",
                             {"written": writes, "unsure_count": unsure})

    def count(self, counter: str, index: int) -> int:
        return self._counts([(counter, index)], counter)[0]

    def _counts(self, cells: Sequence[tuple[str, int]], what: str) -> list[int]:
        """The packet counts of (counter, index) cells, read in one request."""
        read = self.client.read([e.counter_read(self.pipeline, name, index) for name, index in cells], what)
        found = {(r.counter_entry.counter_id, r.counter_entry.index.index): r.counter_entry.data.packet_count
                 for r in read}
        return [found.get((self.pipeline.counter(name), index), 0) for name, index in cells]

    def _counter_resets(self, slot: int) -> list:
        """The slot's counters written to zero (a reused slot's belong to its previous key)."""
        resets = [e.counter_write(self.pipeline, name, slot) for name in ("key_gets", "key_home_while_dirty")]
        return resets + [e.counter_write(self.pipeline, "key_per_replica", slot * MAX_REPLICAS + p)
                         for p in range(MAX_REPLICAS)]

    def _install_updates(self, key: bytes, entry: HotEntry, base: int | None = None) -> list:
        """A new key's ranges, then its hot_keys entry (which makes them live)."""
        return [*self._range_updates(entry.slot, None, entry), e.update(e.INSERT, self._hot(key, entry, base))]

    def _quietly(self, updates: list, what: str) -> None:
        try:
            self.client.write(updates, what)
        except P4Error as err:  # the caller raises the first error
            log.info("%s: %s", what, err)


PACKET_OUT = ("op", "lease_us", "server")  # the packet_out header's fields (p4src/headers.p4)
OP_LEASE, OP_REARM, OP_LEASE_QUERY = 1, 2, 3  # the packet_out's op (p4src/headers.p4: OP_*)
REPORT_QUIET, REPORT_LEASE_LEFT = 1, 2  # the packet_in's report: what an answer's quiet_us holds


def lease_fields(pipeline: Pipeline) -> tuple[tuple[int, int], tuple[int, int]]:
    """(id, bitwidth) of the packet_out's op and lease_us: the lease PacketOut's metadata."""
    packet_out = pipeline.packet_metadata.get("packet_out", {})
    if set(packet_out) != set(PACKET_OUT):
        raise P4Error(f"the compiled program's packet_out has {sorted(packet_out)}, not {', '.join(PACKET_OUT)}")
    return packet_out["op"], packet_out["lease_us"]


def ranges(entry: HotEntry | None) -> tuple[Range, ...]:
    """(low, high, position) of the 16-bit request hash per replica of `entry`, as wide as its weight; none for a
    weight of 0 (nor for no entry)."""
    if entry is None:
        return ()
    found, low = [], 0
    for position, high in enumerate(entry.cumulative):
        if high > low:
            found.append((low, high - 1, position))
        low = max(low, high)
    return tuple(found)


def hot_metadata(servers: Sequence[int], base: int) -> bytes:
    """A hot_keys entry's metadata: the slot's mirrored count at install, then each replica's server index."""
    return BASE.pack(base) + b"".join(SERVER.pack(server) for server in servers)


def read_metadata(metadata: bytes) -> tuple[tuple[int, ...] | None, int | None]:
    """(replicas, mirrored base) of a hot_keys entry's metadata; (None, None) where it has none of ours."""
    if len(metadata) < BASE.size + SERVER.size or (len(metadata) - BASE.size) % SERVER.size:
        return None, None
    servers = tuple(s for (s,) in SERVER.iter_unpack(metadata[BASE.size:]))
    return servers, BASE.unpack_from(metadata)[0]


def read_entry(slot: int, home: int, servers: tuple[int, ...] | None, found: dict[int, tuple[int, int, int]]
               ) -> HotEntry:
    """A hot key's entry from its ranges (position -> (low, high, server)) and its replicas (None: as the ranges
    name them, UNKNOWN_SERVER where a position has none): the cumulative weights `ranges` wrote them from. Ranges
    that are not those of its replicas' weights (a gap, an overlap, a server not the replica's, not ending at
    WEIGHT_ONE) give no weights at all."""
    if servers is None:
        servers = tuple(found[p][2] if p in found else UNKNOWN_SERVER
                        for p in range(max(found, default=-1) + 1))
    cumulative, low = [], 0
    for position, server in enumerate(servers):
        if position in found:
            start, high, named = found[position]
            if start != low or named != server or high < start:
                return HotEntry(slot, home, servers, ())
            low = high + 1
        cumulative.append(low)
    if set(found) - set(range(len(servers))) or low != WEIGHT_ONE:
        return HotEntry(slot, home, servers, ())
    return HotEntry(slot, home, servers, tuple(cumulative))


def stream_of(match: dict) -> StreamId:
    """The connection a `stream_resumes` or `blind_streams` entry is keyed by."""
    return StreamId(str(ipaddress.IPv4Address(match["hdr.ipv4.src"])), match["hdr.ports.src"],
                    str(ipaddress.IPv4Address(match["hdr.ipv4.dst"])), match["hdr.ports.dst"])
