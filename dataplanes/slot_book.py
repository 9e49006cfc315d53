"""The slot book: the hot-key bookkeeping every data plane needs, kept once over any number of switches.

Each switch is reached through a tables adapter (SwitchTables below) that a data plane's control library provides:
the eBPF maps (dataplanes/bpf/tables.py), P4Runtime entities (dataplanes/p4/tables.py). The book decides what is
the same everywhere, whatever the switch:

- a hot key gets a slot, the index of its write count, synced counts and counters; a slot is freed when the key is
  removed or its install refused, and its counters start from zero when it is reused;
- a key is installed held dirty, with the write count its slot had before it (its write base), so the stamp says
  how many writes to this key were counted since, summed over every switch;
- every switch is written with one request in flight per switch, all at once (the book's FanOut, dataplanes/
  fan_out.py; a width of 1 writes them one after the other and stops at the first refusal);
- a refused request leaves the switches and the book as they were: a half-done install, weight change or clear is
  undone on the switches that took it (a clear is held dirty again); a refused remove or hold may leave other
  switches (one after the other: the earlier ones) with the key out or held, which is the safe side, and which a
  retry finishes;
- counters are summed over the switches, per key and per replica;
- the lease is kept as an absolute time (CLOCK_MONOTONIC ns) and written again to a switch that comes back.

A switch that came back empty (reloaded, restarted) is handed in again with `use`: every slot is forgotten and the
core installs its hot keys anew. A driver that holds a book adds only what is its own: how switches are reached,
reading back what an earlier controller left (dataplanes/read_back.py, which hands each key it keeps to `take`),
forwarding, copies of packets (dataplanes/slot_book_driver.py).
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable, Mapping, Protocol, Sequence

from dataplanes.driver import (Counters, DriverError, HotKeyInstall, KeyCounters, ReplicaWeight, StreamId,
                               WriteStamp, raise_refused)
from dataplanes.fan_out import FanOut, Outcomes
from dataplanes.pipeline import MAX_HOT, MAX_KEY, MAX_REPLICAS, cumulative_weights
from mbalancer.settings import Server

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HotEntry:
    """A hot key as the pipeline's hot_get table holds it."""
    slot: int
    home: int
    servers: tuple[int, ...]  # the replicas, in the order of their counters
    cumulative: tuple[int, ...]  # the replicas' cumulative weights (dataplanes/pipeline.py cumulative_weights)


@dataclass
class KeyCounts:
    """One switch's counters of one slot since they were last reset."""
    gets: int
    home_while_dirty: int
    mirrored: int
    per_replica: list[int]  # by position in the entry's servers


class SwitchTables(Protocol):
    """One switch's hot-key tables, as its data plane's control library writes them. Methods raise the errors the
    book is given (e.g. BpfError); the book turns them into DriverError."""

    up: bool  # False while the switch cannot be reached (the lease and counters skip it)

    def set_hot(self, key: bytes, entry: HotEntry, old: HotEntry | None) -> None:
        """Install the key, or (old given) change its replicas or weights in place; refused, the switch keeps `old`."""

    def delete_hot(self, key: bytes, entry: HotEntry) -> None:
        """The key out of hot_get first (its gets and writes go home untouched), then the rest of its slot's entries;
        entries that are not there are no error."""

    def reset_key_counts(self, slot: int) -> None:
        """The slot's counters start from zero (a reused slot's belong to its previous key)."""

    def writes(self, slot: int) -> int:
        """Writes to the slot's key the pipeline has counted (copied to the controller), since it was loaded."""

    def unsure(self, server: int) -> int:
        """Requests to the server the pipeline could not be sure held no write."""

    def hold(self, slot: int) -> None:
        """Dirty until set_synced, whatever the counts."""

    def set_synced(self, slot: int, writes: int, unsure: int) -> None:
        """Clean while the pipeline's counts still equal these."""

    def key_counts(self, slot: int, replicas: int) -> KeyCounts:
        """The slot's counters, `replicas` of them per replica."""

    def key_counts_many(self, slot_replicas: Sequence[tuple[int, int]]) -> list[KeyCounts]:
        """key_counts of each (slot, replicas): one request to a switch reached over the network."""

    def counters(self) -> dict[str, int]:
        """The switch's own counters, by the names in dataplanes/pipeline.py COUNTERS (a data plane may add its own)."""

    def set_lease(self, until_ns: int) -> None:
        """Until when (CLOCK_MONOTONIC ns) the controller vouches for the copies; 0 or past: every key acts dirty."""

    def closes(self, server: int) -> int:
        """How often the server's memcached closed a connection of the controller's, as the switch counted."""

    def set_closes_handled(self, server: int, count: int) -> None:
        """The controller has dealt with the server's closes up to `count`."""

    def closes_pending(self, server: int) -> bool:
        """Whether the switch counted closes of the server the controller has not dealt with (its count differs from
        the handled one: no get is balanced to the server)."""

    def resume_stream(self, stream: StreamId, seq: int) -> None:
        """A command starts at `seq` of the connection read as a stream: that segment is read on its own again."""

    def blind_stream(self, stream: StreamId) -> None:
        """The controller cannot follow the connection: its segments are copied once per report."""

    # What a new controller reads back to adopt (dataplanes/read_back.py).
    def held_keys(self) -> dict[bytes, HotEntry]:
        """Every hot key the switch holds, with its entry."""

    def synced_counts(self, slot: int) -> tuple[int, int] | None:
        """The (writes, unsure) the slot's key is clean at; None while it is held dirty."""

    def lease(self) -> int | None:
        """Until when (CLOCK_MONOTONIC ns) the switch trusts the copies; None where it cannot be read."""

    # Many keys at once: a switch reached over the network (P4Runtime) makes each one request; OneByOne below makes
    # them of the calls above, for a switch whose every call is cheap (eBPF maps).
    def install_keys(self, entries: Sequence[tuple[bytes, HotEntry]]) -> list[int]:
        """Keys new to the switch, each in a fresh slot: the slot's counters reset, held dirty, then the key
        installed. Returns each slot's write count before its key (its write base, read before the key goes in).
        When it raises, some of the keys may be in: the book deletes them all."""

    def delete_keys(self, entries: Sequence[tuple[bytes, HotEntry]]) -> None:
        """delete_hot of each; when it raises, each key is either gone or still whole."""

    def write_counts(self, slot_homes: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
        """(writes of the slot, unsure requests to the home) for each (slot, home)."""

    def set_synced_slots(self, synced: Sequence[tuple[int, int, int]]) -> None:
        """set_synced of each (slot, writes, unsure); when it raises, each slot is synced or as it was."""


class OneByOne:
    """SwitchTables' calls on many keys, made of its calls on one: for a switch whose every call is cheap."""

    def install_keys(self: SwitchTables, entries: Sequence[tuple[bytes, HotEntry]]) -> list[int]:
        bases = []
        for key, entry in entries:
            self.reset_key_counts(entry.slot)
            self.hold(entry.slot)  # before the entry exists: no get is balanced before the core says
            bases.append(self.writes(entry.slot))  # the slot's count before this key
            self.set_hot(key, entry, None)
        return bases

    def delete_keys(self: SwitchTables, entries: Sequence[tuple[bytes, HotEntry]]) -> None:
        for key, entry in entries:
            self.delete_hot(key, entry)

    def write_counts(self: SwitchTables, slot_homes: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
        return [(self.writes(slot), self.unsure(home)) for slot, home in slot_homes]

    def set_synced_slots(self: SwitchTables, synced: Sequence[tuple[int, int, int]]) -> None:
        for slot, writes, unsure in synced:
            self.set_synced(slot, writes, unsure)

    def key_counts_many(self: SwitchTables, slot_replicas: Sequence[tuple[int, int]]) -> list[KeyCounts]:
        return [self.key_counts(slot, replicas) for slot, replicas in slot_replicas]


def keys_named(keys: Sequence[bytes]) -> str:
    """The key, or how many, for a message about a request on many keys."""
    return repr(keys[0]) if len(keys) == 1 else f"{len(keys)} keys"


class SlotBook:
    """The hot keys of one data plane's switches; thread-safe (the core's worker writes, HTTP threads and the
    driver's own thread read)."""

    def __init__(self, what: str, errors: tuple[type[Exception], ...], fan_out: FanOut | None = None,
                 slots: int | range = MAX_HOT):
        """`what` names the data plane in errors; `errors` are what its adapters raise; `fan_out` writes the switches
        (by default one after the other: a switch whose every call is cheap, the eBPF maps); `slots`: the hot keys
        its tables hold, or the range of slots this book may use (a key-range shard's, docs/scale.md)."""
        self.what = what
        self.slot_range = range(slots) if isinstance(slots, int) else slots
        self.max_hot = len(self.slot_range)
        self.errors = errors
        self.fan_out = fan_out or FanOut(1)
        self.switches: list[SwitchTables] = []
        self.servers: tuple[Server, ...] = ()
        self.lease_until = 0  # CLOCK_MONOTONIC ns: the lease as last renewed (written again to a switch that returns)
        self.reconnects = 0  # times the switches came back empty
        self.lock = threading.RLock()
        self._forget_all()

    @property
    def slots(self) -> dict[bytes, int]:
        """Installed key -> its slot."""
        with self.lock:
            return {key: entry.slot for key, entry in self.entries.items()}

    def use(self, switches: Sequence[SwitchTables]) -> None:
        """The switches from now on, empty of hot keys (just attached, or come back empty): every slot is free."""
        with self.lock:
            self.switches = list(switches)
            self._forget_all()

    def take(self, key: bytes, entry: HotEntry, bases: tuple[int, ...]) -> None:
        """A key the switches already hold (read back from them: dataplanes/read_back.py), kept as installed: its
        slot taken, its stamps counted from `bases` (each switch's write count of the slot now)."""
        with self.lock:
            self.free_slots.remove(entry.slot)
            self.entries[key], self.write_bases[key] = entry, bases

    def came_back(self, switches: Sequence[SwitchTables]) -> None:
        """The switches returned empty (reloaded, restarted): `use` them and count it."""
        with self.lock:
            self.use(switches)
            self.reconnects += 1

    # --- the driver interface's hot-key calls --------------------------------------------------------------------
    # Each call on many keys is one batch per switch; a batch a switch refuses is undone and its keys tried one by
    # one, so one bad key holds back no other. The calls on one key are batches of one.
    def install_hot_keys(self, installs: Sequence[HotKeyInstall]) -> dict[bytes, DriverError]:
        with self.lock:
            refused: dict[bytes, DriverError] = {}
            batch = self._take_slots(installs, refused)
            if not batch:
                return refused
            taken: dict[bytes, HotKeyInstall] = {}
            for install in installs:  # the first install of a key listed twice: the one the batch took
                taken.setdefault(install.key, install)
            return {**refused, **_or_one_by_one([key for key, _ in batch], lambda: self._write_installs(batch),
                                                lambda key: self.install_hot_keys([taken[key]]), "installing")}

    def install_hot_key(self, key: bytes, home: int, replicas: Sequence[ReplicaWeight]) -> None:
        raise_refused(self.install_hot_keys([HotKeyInstall(key, home, tuple(replicas))]))

    def set_weights(self, key: bytes, replicas: Sequence[ReplicaWeight]) -> None:
        """Every switch or none: a switch that refuses puts back the old entry itself (SwitchTables.set_hot), and
        those written before it get it back here, so the book's entry is what every switch holds."""
        with self.lock:
            old = self.entry_of(key)
            entry = self._entry(old.slot, old.home, replicas)
            self._reachable()
            self._each_or_undo(lambda _, s: s.set_hot(key, entry, old), lambda s: s.set_hot(key, old, entry),
                               f"weights of {key!r}")
            self.entries[key] = entry

    def remove_hot_keys(self, keys: Sequence[bytes]) -> dict[bytes, DriverError]:
        with self.lock:
            refused: dict[bytes, DriverError] = {}
            batch = []
            for key in dict.fromkeys(keys):
                try:
                    batch.append((key, self.entry_of(key)))
                except DriverError as err:
                    refused[key] = err
            if not batch:
                return refused
            what = f"remove {keys_named([k for k, _ in batch])}"

            def remove() -> None:
                self._each(lambda s: s.delete_keys(batch), what)
                for key, entry in batch:
                    del self.entries[key], self.write_bases[key]
                    self.free_slots.append(entry.slot)
            return {**refused, **_or_one_by_one([key for key, _ in batch], remove,
                                                lambda key: self.remove_hot_keys([key]), "removing")}

    def remove_hot_key(self, key: bytes) -> None:
        raise_refused(self.remove_hot_keys([key]))

    def set_dirty(self, key: bytes) -> None:
        with self.lock:
            slot = self.entry_of(key).slot
            self._each(lambda s: s.hold(slot), f"hold {key!r} dirty")

    def write_stamps(self, keys: Sequence[bytes]) -> dict[bytes, WriteStamp]:
        """Raises DriverError if a key is not installed or a switch cannot be read."""
        with self.lock:
            entries = [(key, self.entry_of(key)) for key in keys]
            what = keys_named([k for k, _ in entries])
            try:
                counts = self._on_each(lambda _, s: s.write_counts([(e.slot, e.home) for _, e in entries])).results()
            except self.errors as err:
                raise DriverError(f"write counts of {what}: {err}") from None
            stamps = {}
            for i, (key, _) in enumerate(entries):
                per_switch = tuple(c[i] for c in counts)
                stamps[key] = WriteStamp(sum(w for w, _ in per_switch) - sum(self.write_bases[key]), per_switch)
            return stamps

    def write_stamp(self, key: bytes) -> WriteStamp:
        return self.write_stamps([key])[key]

    def clear_dirty_keys(self, stamps: Mapping[bytes, WriteStamp]) -> dict[bytes, DriverError]:
        with self.lock:
            refused: dict[bytes, DriverError] = {}
            batch = []
            for key, stamp in stamps.items():
                try:
                    slot = self.entry_of(key).slot
                except DriverError as err:
                    refused[key] = err
                    continue
                if len(stamp.counts) != len(self.switches):
                    refused[key] = DriverError(f"clear {key!r}: the stamp is from before a switch came back")
                else:
                    batch.append((key, slot, stamp))
            if not batch:
                return refused
            counts = {slot: stamp.counts for _, slot, stamp in batch}
            what = f"clear {keys_named([key for key, _, _ in batch])}"

            def clear() -> None:  # a switch that refuses may have cleared some slots: it is held again too (dirty is
                self._each_or_undo(  # always safe)
                    lambda i, s: s.set_synced_slots([(slot, *counts[slot][i]) for slot in counts]),
                    lambda s: [s.hold(slot) for slot in counts], what, undo_refusing=True)
            return {**refused, **_or_one_by_one([key for key, _, _ in batch], clear,
                                                lambda key: self.clear_dirty_keys({key: stamps[key]}), "clearing")}

    def clear_dirty(self, key: bytes, stamp: WriteStamp) -> None:
        raise_refused(self.clear_dirty_keys({key: stamp}))

    def renew_lease(self, seconds: float) -> None:
        until = time.monotonic_ns() + int(seconds * 1e9) if seconds > 0 else 0  # as bpf_ktime_get_ns counts
        with self.lock:
            self.lease_until = until
            self._each(lambda s: s.set_lease(until), "lease", reachable_only=True)

    def end_lease(self) -> None:
        """Gets go home on every switch that can still be reached: nobody keeps the copies fresh any more."""
        try:
            self.renew_lease(0)
        except DriverError as err:  # the switch is gone already: nothing left to balance
            log.info("lease not ended: %s", err)

    def read_counters(self) -> Counters:
        """Summed over the switches that are up: two requests to each (its own counters, then every key's)."""
        counters = Counters()
        with self.lock:
            entries = list(self.entries.items())
            cells = [(entry.slot, len(entry.servers)) for _, entry in entries]
            up = [switch for switch in self.switches if switch.up]
            try:
                read = self.fan_out.run([lambda s=s: (s.counters(), s.key_counts_many(cells)) for s in up],
                                        self.errors).results()
            except self.errors as err:
                raise DriverError(f"reading counters: {err}") from None
        for own, counts in read:
            _add_counts(entries, own, counts, counters)
        return counters

    def switch_counters(self) -> list[dict[str, int]]:
        """Each switch's own counters (packets, balanced, mirrored, ...)."""
        with self.lock:
            try:
                return self._on_each(lambda _, s: s.counters()).results()
            except self.errors as err:
                raise DriverError(f"reading switch counters: {err}") from None

    def entry_of(self, key: bytes) -> HotEntry:
        """The entry of an installed key; DriverError if it is not installed."""
        try:
            return self.entries[key]
        except KeyError:
            raise DriverError(f"{key!r} is not installed") from None

    def slot_of(self, key: bytes) -> int:
        return self.entry_of(key).slot

    # --- inside ----------------------------------------------------------------------------------------------
    def _forget_all(self) -> None:
        self.entries: dict[bytes, HotEntry] = {}
        self.write_bases: dict[bytes, tuple[int, ...]] = {}  # each switch's write count of the slot at install
        self.free_slots = list(reversed(self.slot_range))

    def _entry(self, slot: int, home: int, replicas: Sequence[ReplicaWeight]) -> HotEntry:
        if not 1 <= len(replicas) <= MAX_REPLICAS:
            raise DriverError(f"{len(replicas)} replicas: the {self.what} holds 1 to {MAX_REPLICAS} per key")
        for server in (home, *(r.server for r in replicas)):
            if not 0 <= server < len(self.servers):
                raise DriverError(f"server {server} is not in the config's {len(self.servers)} servers")
        return HotEntry(slot, home, tuple(r.server for r in replicas),
                        tuple(cumulative_weights([r.weight for r in replicas])))

    def _take_slots(self, installs: Sequence[HotKeyInstall], refused: dict[bytes, DriverError]
                    ) -> list[tuple[bytes, HotEntry]]:
        """A free slot and the entry for each install the book can take; the others in `refused`, with why."""
        batch: list[tuple[bytes, HotEntry]] = []
        taken: set[bytes] = set()
        for install in installs:
            key = install.key
            try:
                if key in self.entries or key in taken:
                    raise DriverError(f"{key!r} is already installed")
                if not 1 <= len(key) <= MAX_KEY:
                    raise DriverError(f"key of {len(key)} bytes: the {self.what} takes 1 to {MAX_KEY}")
                if not self.free_slots:
                    raise DriverError(f"all {self.max_hot} hot-key slots are in use")
                self._reachable()
                entry = self._entry(self.free_slots[-1], install.home, install.replicas)  # refused: nothing taken
            except DriverError as err:
                refused[key] = err
                continue
            self.free_slots.pop()
            batch.append((key, entry))
            taken.add(key)
        return batch

    def _write_installs(self, batch: list[tuple[bytes, HotEntry]]) -> None:
        """`batch` into every switch, or (refused) out of every switch again and its slots freed."""
        written = self._on_each(lambda _, s: s.install_keys(batch))
        if written.failed:
            undone = self._on_each(lambda _, s: s.delete_keys(batch), every=True)
            for _, undo_err in undone.failed:
                log.warning("could not remove the half-installed keys: %s", undo_err)
            self.free_slots.extend(entry.slot for _, entry in batch)
            raise DriverError(f"install {keys_named([k for k, _ in batch])}: {written.failed[0][1]}") from None
        bases = written.outcomes
        for i, (key, entry) in enumerate(batch):
            self.entries[key] = entry
            self.write_bases[key] = tuple(b[i] for b in bases)

    def _reachable(self) -> None:
        """A request with no switch to write to would succeed and do nothing: refused instead."""
        if not self.switches:
            raise DriverError(f"the {self.what} has no switch open (not attached, or being reopened)")

    def server_closes(self, server: int) -> tuple:
        return tuple(self._read_closes(server, lambda t: t.closes(server)))

    def closes_handled(self, server: int, closes: tuple) -> None:
        with self.lock:
            if len(closes) != len(self.switches):
                raise DriverError(f"closes of server {server}: read from {len(closes)} switches, {len(self.switches)} "
                                  f"now")
            self._reachable()
            try:
                self._on_each(lambda i, t: t.set_closes_handled(server, closes[i])).results()
            except self.errors as err:
                raise DriverError(f"closes of server {server}: {err}") from None

    def closes_pending(self, server: int) -> bool:
        return any(self._read_closes(server, lambda t: t.closes_pending(server)))

    def _read_closes(self, server: int, read: Callable[[SwitchTables], object]) -> list:
        """`read(switch)` of every switch, in switch order; a refusal as one DriverError about the server's closes."""
        with self.lock:
            try:
                return self._on_each(lambda _, t: read(t)).results()
            except self.errors as err:
                raise DriverError(f"closes of server {server}: {err}") from None

    def resume_stream(self, stream: StreamId, seq: int) -> None:
        with self.lock:
            self._each(lambda t: t.resume_stream(stream, seq), f"stream {stream}")

    def blind_stream(self, stream: StreamId) -> None:
        with self.lock:
            self._each(lambda t: t.blind_stream(stream), f"stream {stream}")

    def _each_or_undo(self, write: Callable[[int, SwitchTables], object], undo: Callable[[SwitchTables], object],
                      what: str, undo_refusing: bool = False) -> None:
        """`write(index, switch)` to every switch; if one refuses, `undo` on those that took it (and on the refusing
        ones too with `undo_refusing`: a write a switch may have applied in part), so the switches are as they were."""
        written = self._on_each(write)
        if not written.failed:
            return
        err = written.failed[0][1]
        again = set(written.done + ([i for i, _ in written.failed] if undo_refusing else []))
        undone = self._on_each(lambda i, s: undo(s), every=True, only=again)
        for _, undo_err in undone.failed:  # the next request on the key finds it as this one left it
            log.warning("%s: refused (%s), and not undone on a switch: %s", what, err, undo_err)
        raise DriverError(f"{what}: {err}") from None

    def _each(self, write: Callable[[SwitchTables], object], what: str, reachable_only: bool = False) -> None:
        if not reachable_only:
            self._reachable()
        switches = [s for s in self.switches if s.up or not reachable_only]
        try:
            self.fan_out.run([lambda s=s: write(s) for s in switches], self.errors).results()
        except self.errors as err:
            raise DriverError(f"{what}: {err}") from None

    def _on_each(self, call: Callable[[int, SwitchTables], object], every: bool = False,
                 only: set[int] | None = None) -> Outcomes:
        """`call(index, switch)` on every switch (`only` those indexes), at once (the book's fan-out); `every`: an
        undo, which one after the other too goes on past a refusal, the last switch written first."""
        calls = [lambda i=i, s=s: call(i, s) for i, s in enumerate(self.switches) if only is None or i in only]
        if every:  # (one after the other, the last switch first: the calls and their outcomes reversed)
            return Outcomes(self.fan_out.run(calls[::-1], self.errors, every=True).outcomes[::-1])
        return self.fan_out.run(calls, self.errors)


def _add_counts(entries: Sequence[tuple[bytes, HotEntry]], own: dict[str, int], counts: Sequence[KeyCounts],
                counters: Counters) -> None:
    """One switch's counters (`own`, and `counts` of each of `entries`) added to `counters`."""
    counters.unparsed += own["unparsed"]
    counters.unsure += own["unsure"]
    for name, value in own.items():
        counters.switch[name] = counters.switch.get(name, 0) + value
    for (key, entry), key_counts in zip(entries, counts):
        total = counters.keys.setdefault(key, KeyCounters())
        total.gets += key_counts.gets
        total.home_while_dirty += key_counts.home_while_dirty
        total.mirrored += key_counts.mirrored
        for server, n in zip(entry.servers, key_counts.per_replica):
            total.per_replica[server] = total.per_replica.get(server, 0) + n


def _or_one_by_one(keys: Sequence[bytes], batch: Callable[[], None],
                   one: Callable[[bytes], dict[bytes, DriverError]], doing: str) -> dict[bytes, DriverError]:
    """`batch()` for all `keys`; if a switch refuses it, each key alone (`one`), so that one bad key holds back no
    other: the keys refused, with why ({} when the batch went through)."""
    try:
        batch()
    except DriverError as err:
        if len(keys) == 1:
            return {keys[0]: err}
        log.info("%s; %s them one by one", err, doing)
        refused: dict[bytes, DriverError] = {}
        for key in keys:
            refused.update(one(key))
        return refused
    return {}
