"""Carrying out the plan against real servers and a driver, in the order that keeps every get correct.

Invariants (the reason for every ordering below):
- A rule never sends gets to a replica that does not hold the home's current value. A key is installed only after
  its copies are made, and dirty (gets go home); it is cleared only to a write stamp (dataplanes/driver.py) read
  before the home's CAS was found to be the one the copies were made from, and only once the copy of every write
  to the key counted in that stamp has been handled here. A write the data plane counts after the stamp
  keeps the key dirty. A replica whose copy or update failed gets weight 0 before the key is cleared, and is
  refilled with backoff.
- On cool-down the rules go first, then the extra copies.
- Mirrored writes are coalesced per key (only the latest value matters): for each key written in a batch, wait
  (briefly) until the home shows the latest write (its CAS changes, or for a set, the value equals the mirrored
  one), push the home's item to the replicas (or delete them), clear to the stamp, and check the CAS once more.
- A copied request the data plane could not read made every hot key of its server dirty: each is checked against
  its home's CAS (after a short wait, if not even the controller could read the request: the home must have
  applied it first) and cleared, or synced. Every hot key's home CAS is also polled now and then, for writes that
  never passed the switch.
- A driver call that fails leaves gets safe, then is retried with back-off: weights that cannot be written make
  the key dirty, and if that fails too its rules are removed (gets go home untouched either way) and reinstalled
  later; a key that cannot be cleared stays dirty (safe) and the clear is retried; an install the driver
  refuses is not tried again (nor its value copied again) before its back-off ends.
- A switch that came back empty (the driver's reconnect) gets every hot key installed again, dirty, then settled.
Only the core's worker thread calls in here.
"""
from __future__ import annotations

import hashlib
import logging
import time
from collections import deque
from dataclasses import dataclass
from enum import Enum
from typing import Callable

from dataplanes.driver import Driver, DriverError, ReplicaWeight, WriteStamp
from controller.planner import Change, Placement
from controller.replicator import Replicator
from controller.retries import BACKOFF_FIRST, KEY_LEVEL, KEY_RETRIES, Retry, RetryKind, RetryScheduler
from mbalancer.memcache.meta import MetaError, StoredItem

log = logging.getLogger(__name__)

REFUSED_BACKOFF_MAX = 60.0  # seconds at most between installs of a key the driver keeps refusing
SYNC_WAIT = 0.05  # how long a mirrored write may take to show on the home server (it arrives in microseconds)
SYNC_ROUNDS = 3  # copies retried when writes keep landing during a sync; then the key stays dirty (served home)
MIRROR_WAIT = 0.002  # seconds before looking again for the copy of a counted write the core has not had yet
MIRRORS_LOST_AFTER = 0.1  # no copy of the key's writes for this long while some are missing: they were lost
UNREADABLE_WAIT = 0.005  # before checking the keys of a request nobody could read: the home applies it first
REFILL_DELAY = 0.05  # after a server comes back: what it had queued while hung lands before it is refilled

Decide = Callable[[str, "bytes | None", str], None]  # (action, key, reason): the decision log


class HotKeyState(str, Enum):
    """Where a hot key stands, as the executor knows it (docs/architecture.md draws the transitions):

        install, copies made          clear to a write stamp (the home's CAS is the copies')
      ------------------------> DIRTY ---------------------------------------------------> CLEAN
                                  ^   <--------------------------------------------------   |
                                  |     a write or unsure request counted, the lease out,   |
                                  |     a replica lost (weight 0), a sync begun             |
      a driver call failed: NOT_INSTALLED (gets go home) --reinstall--> DIRTY               |
      cool down (from any state): rules removed, then the extra copies: the record is gone  v
    """
    NOT_INSTALLED = "not-installed"  # its rules are not in the switch (a reinstall is pending): gets go home
    DIRTY = "dirty"  # installed; gets go home until the copies are known to match the home
    CLEAN = "clean"  # installed and cleared to a write stamp: gets are balanced over the replicas


@dataclass
class HotKey:
    placement: Placement
    holding: set[int]  # servers known to hold the home's current item (the home included)
    synced_cas: int | None  # the home's CAS the copies were made from (None: the key is absent everywhere)
    synced_digest: bytes | None  # what the copies hold (value and flags), to tell a moved item from a write
    since: float
    dirty: bool = True  # as the data plane has it, as far as the core knows
    cleared: WriteStamp | None = None  # the stamp the key was last cleared to (None: held dirty since)
    installed: bool = True  # the switch holds the key's rules (False while a reinstall is pending)
    syncs: int = 0
    last_sync_ms: float | None = None
    unsynced_since: float | None = None  # when the oldest mirrored write not yet synced was received
    mirrored: int = 0  # copies of writes to the key handled here since install (the data plane counts the same)
    missing_since: float | None = None  # since when copies counted by the data plane are awaited, with none coming

    @property
    def state(self) -> HotKeyState:
        if not self.installed:
            return HotKeyState.NOT_INSTALLED
        return HotKeyState.DIRTY if self.dirty else HotKeyState.CLEAN

    def weights(self) -> tuple[ReplicaWeight, ...]:
        """The placement's weights with replicas that do not hold the value at 0 (all at home if none does)."""
        p = self.placement
        kept = [w if s in self.holding else 0.0 for s, w in zip(p.replicas, p.weights)]
        total = sum(kept)
        if total <= 0:
            kept, total = [1.0 if s == p.home else 0.0 for s in p.replicas], 1.0
        return tuple(ReplicaWeight(s, w / total) for s, w in zip(p.replicas, kept))


class Executor:
    def __init__(self, driver: Driver, replicator: Replicator, decide: Decide,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                 poll_every: float = 0.5, backlog: Callable[[], bool] = lambda: False):
        """poll_every: seconds between checks of every clean hot key's CAS at its home (0: never); backlog: True
        while copied packets wait in the core's queue (a copy not handled yet is then not lost)."""
        self.driver, self.replicator, self.decide = driver, replicator, decide
        self.backlog = backlog
        self.poll_every = poll_every
        self.clock, self.sleep = clock, sleep
        self.hot: dict[bytes, HotKey] = {}
        self.retries = RetryScheduler(clock)
        self.sync_ms: deque[float] = deque(maxlen=1000)  # mirrored write -> every replica updated
        self.down: set[int] = set()
        self.refused: dict[bytes, Retry] = {}  # installs the driver refused: not tried again before `due`
        self.mirrors_lost = 0  # copies of counted writes that never reached the core
        self.unseen_writes = 0  # changes at a home found by polling, not by a mirrored write
        self.cas_moves = 0  # new CAS at a home with the same value (memcached relinked the item)
        self.next_poll = clock() + poll_every

    # --- the plan ---------------------------------------------------------------------------------------------
    # --- what the core reads (it never reaches into the records) ---------------------------------------------
    def placements(self) -> dict[bytes, Placement]:
        """Each hot key's placement: what the planner plans from."""
        return {key: hot.placement for key, hot in self.hot.items()}

    def home_of(self, key: bytes) -> int | None:
        """The home server of a hot key; None if the key is not hot."""
        hot = self.hot.get(key)
        return hot.placement.home if hot is not None else None

    def hot_keys(self) -> list[tuple[bytes, HotKey]]:
        """Every hot key with its record, for the state the HTTP interface shows."""
        return list(self.hot.items())

    def pending_retries(self) -> list[Retry]:
        """The retries waiting for their turn, for the state the HTTP interface shows."""
        return self.retries.all()

    def apply(self, changes: tuple[Change, ...]) -> None:
        for change in changes:  # the planner lists cools first: they free room and load before warms
            if change.action == "warm":
                self.warm(change)
            elif change.action == "cool":
                self.cool(change)
            elif change.action == "reweight":
                self.reweight(change)
            else:
                raise ValueError(f"unknown change {change.action!r} for {change.key!r}")

    def warm(self, change: Change) -> None:
        key, p = change.key, change.placement
        started = self.clock()
        refused = self.refused.get(key)
        if refused is not None and refused.due > started:
            return self.decide("skip", key, f"the driver refused its rules {refused.attempt} time(s) ("
                                            f"{refused.last_error}); next try in {refused.due - started:.1f} s")
        try:
            item = self.replicator.read(p.home, key)
        except MetaError as err:
            return self.decide("skip", key, f"cannot read it from its home server {p.home}: {err}")
        if item is None:
            return self.decide("skip", key, f"not stored on its home server {p.home}: nothing to copy yet")
        targets = [s for s, w in zip(p.replicas, p.weights) if s != p.home and w > 0]
        failed = self.replicator.write(key, item, targets)
        holding = {p.home} | (set(targets) - set(failed))
        if len(holding) < 2:
            return self.decide("skip", key, f"no replica took the copy: {_errors(failed)}")
        self._cancel(key, RetryKind.DELETE)
        hot = HotKey(p, holding, item.cas, digest(item), since=started)
        try:
            self.driver.install_hot_key(key, p.home, hot.weights())
        except DriverError as err:
            self.replicator.delete(key, holding - {p.home})
            attempt = refused.attempt + 1 if refused else 1
            wait = min(BACKOFF_FIRST * 2 ** attempt, REFUSED_BACKOFF_MAX)
            self.refused[key] = Retry(RetryKind.INSTALL, key, KEY_LEVEL, attempt, started + wait, str(err))
            return self.decide("skip", key, f"the driver refused the rules: {err}; copies deleted, next try in "
                                            f"{wait:.1f} s at the earliest")
        self.refused.pop(key, None)
        self.hot[key] = hot
        for server in failed:
            self._schedule(RetryKind.REFILL, key, server, failed[server])
        settled = self._settle(key, hot)
        copied = ", ".join(str(s) for s in sorted(holding - {p.home}))
        self.decide("warm", key, f"{change.reason}; {len(item.value)} B copied from {p.home} to {copied} in "
                                 f"{1000 * (self.clock() - started):.1f} ms"
                                 + ("" if settled else "; left dirty (written during the copy)")
                                 + (f"; copy failed on {_errors(failed)}, retrying" if failed else ""))

    def cool(self, change: Change, attempt: int = 0) -> None:
        key = change.key
        hot = self.hot.get(key)
        if hot is None:
            return
        if hot.installed:
            try:
                self.driver.remove_hot_key(key)
            except DriverError as err:
                self._schedule(RetryKind.COOL, key, KEY_LEVEL, str(err), attempt)
                return self.decide("error", key, f"cool-down postponed, the driver refused to remove the rules: "
                                                 f"{err}; retrying")
        del self.hot[key]
        self._cancel(key, RetryKind.REFILL, RetryKind.RULES, RetryKind.SETTLE, RetryKind.INSTALL, RetryKind.COOL)
        extras = [s for s in hot.placement.replicas if s != hot.placement.home]
        for server, error in self.replicator.delete(key, extras).items():
            self._schedule(RetryKind.DELETE, key, server, error)
        self.decide("cool", key, f"{change.reason}; rules removed, then copies on {extras} deleted")

    def reweight(self, change: Change) -> None:
        """New weights; if the driver refuses, the old ones stay (both are safe) and the next report asks again."""
        hot = self.hot.get(change.key)
        if hot is None:
            return
        previous, hot.placement = hot.placement, change.placement
        if hot.installed:
            try:
                self.driver.set_weights(change.key, hot.weights())
            except DriverError as err:
                hot.placement = previous
                return self.decide("error", change.key, f"weights not changed, the driver refused: {err}")
        self.decide("reweight", change.key, f"{change.reason}: " + ", ".join(
            f"{r.server}={r.weight:.2f}" for r in hot.weights()))

    def replay(self) -> None:
        """The switch came back empty: every hot key is installed again, dirty (its copies may have missed writes
        while no rule mirrored them), then settled against the home's CAS."""
        for key, hot in self.hot.items():
            hot.installed, hot.dirty = False, True
            self._cancel(key, RetryKind.RULES, RetryKind.SETTLE, RetryKind.INSTALL)
            self._install(key, hot)
        self.decide("replay", None, f"the data plane came back empty: {len(self.hot)} hot keys installed again")

    # --- coherence ------------------------------------------------------------------------------------------
    def count_mirror(self, key: bytes | None, server: int) -> None:
        """A copied packet whose first request writes `key` to `server`: if that is the key's home, the data plane
        counted it as one write to the key (before any of the batch is synced)."""
        hot = self.hot.get(key) if key is not None else None
        if hot is not None and hot.placement.home == server:
            hot.mirrored += 1
            hot.missing_since = None

    def sync_batch(self, writes: dict[bytes, tuple[bytes | None, float]], unsure: dict[int, bool],
                   between: Callable[[], None] = lambda: None) -> None:
        """Handle a batch of copied packets: `writes` {key: (latest data or None, first received)} read from them;
        `unsure` {server: True if some request to it could not be read even here} for every server the data plane
        may have made unsure. `between` runs before each key (the core handles health changes there)."""
        for key, (data, received) in writes.items():
            between()
            self.sync(key, data, received)
        for server, unreadable in unsure.items():
            for key, hot in list(self.hot.items()):
                if hot.placement.home != server or key in writes:
                    continue
                if unreadable:  # the home may not have applied it yet: look after it has
                    self._schedule(RetryKind.SETTLE, key, KEY_LEVEL, "a request nobody could read",
                                   delay=UNREADABLE_WAIT)
                else:
                    between()
                    self._check(key, hot)

    def sync(self, key: bytes, data: bytes | None, received: float) -> None:
        """A write to `key` was mirrored (its data if it was a set): bring the replicas up to date."""
        hot = self.hot.get(key)
        if hot is None:
            return
        hot.dirty, hot.cleared = True, None  # the data plane counted the write: dirty there
        if hot.unsynced_since is None:
            hot.unsynced_since = received
        item = self._wait_for_write(hot, key, data)
        if isinstance(item, MetaError):
            return self.decide("error", key, f"mirrored write not synced, home unreadable (gets stay home): {item}")
        self._push(key, hot, item)
        self._synced(key, hot)  # every replica that holds the key holds the home's latest now
        self._settle(key, hot)

    def poll(self, idle: bool = True) -> None:
        """Every poll_every seconds: each clean hot key's CAS at its home (one round trip per home), for writes no
        switch saw (a client on the server's own host, a path around the switch). A changed one is made dirty and
        synced. Done when the core is idle, or once it is a whole interval late."""
        now = self.clock()
        if not self.poll_every or now < self.next_poll or (not idle and now < self.next_poll + self.poll_every):
            return
        self.next_poll = now + self.poll_every
        by_home: dict[int, list[bytes]] = {}
        for key, hot in self.hot.items():
            if not hot.dirty and hot.installed:
                by_home.setdefault(hot.placement.home, []).append(key)
        for home, keys in by_home.items():
            try:
                found = self.replicator.cas_many(home, keys)
            except MetaError:
                continue  # the health checker deals with servers that do not answer
            for key, cas in zip(keys, found):
                hot = self.hot.get(key)
                if hot is not None and cas != hot.synced_cas and not self._seen(key, hot) \
                        and not self._moved(key, hot):
                    self.unseen_writes += 1
                    self._protect(key, hot, "its home changed without a write the switch saw")
                    self._settle(key, hot)  # pushes the home's item, then clears

    def _seen(self, key: bytes, hot: HotKey) -> bool:
        """True if the data plane counted a write since the key was cleared: its copy is on its way to the core,
        which syncs it then (the key is dirty in the data plane meanwhile)."""
        try:
            return self._counted_since_clear(key, hot)
        except DriverError:
            return False

    def _counted_since_clear(self, key: bytes, hot: HotKey) -> bool:
        """True if the data plane counted a write or an unsure request for the key since the core last cleared it
        (the key is dirty there then). Raises DriverError."""
        return hot.cleared is None or self.driver.write_stamp(key).counts != hot.cleared.counts

    def _moved(self, key: bytes, hot: HotKey) -> bool:
        """True if the home's item has a new CAS but the value and flags the copies hold: memcached gives an item it
        relinks (a slab page moved, ...) a new CAS without any write. The new CAS is adopted."""
        try:
            item = self.replicator.read(hot.placement.home, key)
        except MetaError:
            return False
        if item is None or digest(item) != hot.synced_digest:
            return False
        hot.synced_cas = item.cas
        self.cas_moves += 1
        return True

    def _check(self, key: bytes, hot: HotKey) -> None:
        """The data plane may have made the key dirty (an unsure request to its home): settle it again unless the
        counts are still the ones it was cleared to."""
        if not hot.installed:
            return
        try:
            if not self._counted_since_clear(key, hot):
                return
        except DriverError as err:
            return self._schedule(RetryKind.SETTLE, key, KEY_LEVEL, str(err))
        hot.dirty, hot.cleared = True, None
        self._settle(key, hot)

    def _wait_for_write(self, hot: HotKey, key: bytes, data: bytes | None) -> StoredItem | None | MetaError:
        """The home's item once the mirrored write shows there, or as it is after SYNC_WAIT (a write that failed,
        such as an add of an existing key, never shows; pushing the home's item is right then too)."""
        deadline, delay = self.clock() + SYNC_WAIT, 0.0005
        while True:
            try:
                item = self.replicator.read(hot.placement.home, key)
            except MetaError as err:
                return err
            if item is None or item.cas != hot.synced_cas or (data is not None and item.value == data):
                return item
            if self.clock() >= deadline:
                return item
            self.sleep(delay)
            delay = min(2 * delay, 0.01)

    def _push(self, key: bytes, hot: HotKey, item: StoredItem | None) -> None:
        """Make every holding replica match the home's item; replicas that fail lose their weight now."""
        replicas = sorted(hot.holding - {hot.placement.home})
        if item is None:
            failed = self.replicator.delete(key, replicas, update=True)
        else:
            failed = self.replicator.write(key, item, replicas, update=True)
        hot.synced_cas = item.cas if item is not None else None
        hot.synced_digest = digest(item)
        if failed:
            hot.holding -= set(failed)
            self._set_weights(key, hot)
            for server, error in failed.items():
                self._schedule(RetryKind.REFILL, key, server, error)

    def _settle(self, key: bytes, hot: HotKey, attempt: int = 0) -> bool:
        """Clear the key if the copies match the home; re-copy while writes keep landing. True if cleared. When it
        cannot finish, the key stays dirty (gets go home) and the settle is retried."""
        if not hot.installed:
            return False  # its reinstall settles it
        home = hot.placement.home
        for _ in range(SYNC_ROUNDS):
            try:
                stamp = self.driver.write_stamp(key)
                if not self._mirrors_in(key, hot, stamp):
                    self._schedule(RetryKind.SETTLE, key, KEY_LEVEL, "the copy of a counted write is on its way",
                                   attempt, delay=MIRROR_WAIT)
                    return False
                if self.replicator.cas(home, key) == hot.synced_cas:
                    self.driver.clear_dirty(key, stamp)
                    hot.dirty, hot.cleared = False, stamp
                    if self.replicator.cas(home, key) == hot.synced_cas or \
                            self.driver.write_stamp(key).counts != stamp.counts:
                        return True  # any change since is a write the data plane counted after the stamp: the key
                        # is dirty there, and that write's copy is on its way
                    self._dirty(key, hot)  # the home changed with no write counted (two writers' writes applied
                    # in the other order than they passed the switch, or one around it): sync it again
                self._push(key, hot, self.replicator.read(home, key))
            except (MetaError, DriverError) as err:
                if not hot.dirty:  # cleared, then the check or the hold failed: the copies may be stale
                    self._protect(key, hot, str(err))
                self._schedule(RetryKind.SETTLE, key, KEY_LEVEL, str(err), attempt)
                self.decide("error", key, f"left dirty (gets go home), retrying: {err}")
                return False
        self._schedule(RetryKind.SETTLE, key, KEY_LEVEL, "writes kept landing during the sync", attempt)
        return False

    def _synced(self, key: bytes, hot: HotKey) -> None:
        if hot.unsynced_since is None:
            return
        hot.syncs += 1
        hot.last_sync_ms = 1000 * (self.clock() - hot.unsynced_since)
        hot.unsynced_since = None
        self.sync_ms.append(hot.last_sync_ms)
        log.debug("synced %r in %.2f ms", key, hot.last_sync_ms)

    def _mirrors_in(self, key: bytes, hot: HotKey, stamp: WriteStamp) -> bool:
        """True once the core has handled the copy of every write to the key the data plane counted in `stamp`
        (each was synced then; a write whose copy is still on its way may not have reached the home yet). Copies
        that stop coming while some are missing were lost: the key is then checked at its home (its CAS moved)."""
        if stamp.writes <= hot.mirrored:
            hot.missing_since = None
            return True
        now = self.clock()
        if hot.missing_since is None or self.backlog():
            hot.missing_since = now
        if now - hot.missing_since < MIRRORS_LOST_AFTER:
            return False
        lost = stamp.writes - hot.mirrored
        self.mirrors_lost += lost
        hot.mirrored, hot.missing_since = stamp.writes, None
        self.decide("error", key, f"{lost} copied write(s) never reached the controller: checking the key at its "
                                  f"home")
        return True  # the settle compares the home's CAS: a lost write changed it, and is pushed

    # --- health -------------------------------------------------------------------------------------------------
    def server_down(self, server: int) -> None:
        """A server stopped answering: it holds nothing we can trust any more, so it loses every weight now."""
        self.down.add(server)
        for key, hot in self.hot.items():
            if server in hot.holding:
                hot.holding.discard(server)
                self._set_weights(key, hot)
        self.retries.cancel_server(server, RetryKind.REFILL)

    def server_up(self, server: int) -> None:
        """A server answers again (maybe restarted, empty): refill its copies before it gets weight back."""
        self.down.discard(server)
        for key, hot in self.hot.items():
            if server in hot.placement.replicas and server not in hot.holding:
                self._schedule(RetryKind.REFILL, key, server, "the server is back", delay=REFILL_DELAY)

    # --- retries --------------------------------------------------------------------------------------------
    def run_due(self) -> None:
        for retry in self.retries.take_due():
            self._run(retry)

    def _run(self, retry: Retry) -> None:
        hot = self.hot.get(retry.key)
        if retry.action in KEY_RETRIES and hot is None:
            return  # the key cooled meanwhile: nothing left to retry
        attempt = retry.attempt if retry.waiting else retry.attempt + 1
        handlers = {RetryKind.REFILL: self._retry_refill, RetryKind.DELETE: self._retry_delete,
                    RetryKind.RULES: self._retry_rules, RetryKind.SETTLE: self._retry_settle,
                    RetryKind.INSTALL: self._retry_install, RetryKind.COOL: self._retry_cool}
        handlers[retry.action](retry, hot, attempt)

    def _retry_refill(self, retry: Retry, hot: HotKey | None, attempt: int) -> None:
        self._refill(retry)

    def _retry_delete(self, retry: Retry, hot: HotKey | None, attempt: int) -> None:
        failed = self.replicator.delete(retry.key, [retry.server])
        if failed:
            self._schedule(RetryKind.DELETE, retry.key, retry.server, failed[retry.server], attempt)

    def _retry_rules(self, retry: Retry, hot: HotKey, attempt: int) -> None:
        self._set_weights(retry.key, hot, attempt)
        if hot.dirty and hot.installed and not self.retries.pending(RetryKind.RULES, retry.key):
            self._settle(retry.key, hot)  # the weights are in: the key need not stay at home

    def _retry_settle(self, retry: Retry, hot: HotKey, attempt: int) -> None:
        self._settle(retry.key, hot, attempt)

    def _retry_install(self, retry: Retry, hot: HotKey, attempt: int) -> None:
        self._install(retry.key, hot, attempt)

    def _retry_cool(self, retry: Retry, hot: HotKey, attempt: int) -> None:
        self.cool(Change("cool", retry.key, None, "retried"), attempt)

    def next_due(self) -> float | None:
        return self.retries.next_due()

    def _install(self, key: bytes, hot: HotKey, attempt: int = 0) -> None:
        """The key's rules again (after a reconnect, or after they were removed to keep gets safe), then settle."""
        try:
            self.driver.install_hot_key(key, hot.placement.home, hot.weights())
        except DriverError as err:
            self._schedule(RetryKind.INSTALL, key, KEY_LEVEL, str(err), attempt)
            return self.decide("error", key, f"rules not installed again ({err}); gets go home meanwhile; retrying")
        hot.installed, hot.dirty = True, True
        self._settle(key, hot)

    def _refill(self, retry: Retry) -> None:
        key, server = retry.key, retry.server
        hot = self.hot.get(key)
        if hot is None or server in self.down:
            return
        home = hot.placement.home
        try:
            item = self.replicator.read(home, key)
        except MetaError as err:
            return self._schedule(RetryKind.REFILL, key, server, str(err), retry.attempt + 1)
        failed = (self.replicator.delete(key, [server]) if item is None
                  else self.replicator.write(key, item, [server]) if server != home else {})
        if failed:
            return self._schedule(RetryKind.REFILL, key, server, failed[server], retry.attempt + 1)
        if item is not None and item.cas != hot.synced_cas:
            return self._schedule(RetryKind.REFILL, key, server, "home changed during the refill", retry.attempt + 1)
        hot.holding.add(server)
        self._set_weights(key, hot)
        self.decide("refill", key, f"server {server} holds the value again; weights " + ", ".join(
            f"{r.server}={r.weight:.2f}" for r in hot.weights()))

    def _schedule(self, kind: RetryKind, key: bytes, server: int, error: str, attempt: int = 0,
                  delay: float | None = None) -> None:
        """Retry `kind` after the back-off of `attempt` (or after `delay`: a wait, not a failure); past the retry
        limit, say it was given up."""
        given_up = self.retries.schedule(kind, key, server, error, attempt, delay)
        if given_up is not None:
            self.decide("give-up", key, given_up)

    def _cancel(self, key: bytes, *kinds: RetryKind) -> None:
        self.retries.cancel(key, *kinds)

    def _set_weights(self, key: bytes, hot: HotKey, attempt: int = 0) -> None:
        """Write the key's weights now (a replica lost its copy, or got it back); if the driver refuses, keep gets
        away from the replicas and retry."""
        if not hot.installed:
            return  # its reinstall writes the current weights
        try:
            self.driver.set_weights(key, hot.weights())
        except DriverError as err:
            self._schedule(RetryKind.RULES, key, KEY_LEVEL, str(err), attempt)
            self._protect(key, hot, f"weights not written ({err})")

    def _protect(self, key: bytes, hot: HotKey, why: str) -> None:
        """Make the data plane send the key's gets home: hold it dirty, or if that fails remove its rules
        (and reinstall them later). Never raises: it is what the core does when a driver call has failed."""
        try:
            self._dirty(key, hot)
            return self.decide("error", key, f"{why}; key kept dirty so gets go home")
        except DriverError as err:
            dirty_error = err
        try:
            self.driver.remove_hot_key(key)
        except DriverError as err:
            return self.decide("error", key, f"{why}; the data plane refused to hold it dirty ({dirty_error}) and the "
                                             f"removal ({err}): gets may reach a stale replica until a retry lands")
        hot.installed, hot.dirty = False, True
        self._cancel(key, RetryKind.RULES)
        self._schedule(RetryKind.INSTALL, key, KEY_LEVEL, str(dirty_error))
        self.decide("error", key, f"{why}; holding it dirty was refused too ({dirty_error}): rules removed so gets go "
                                  f"home, reinstalling")

    def _dirty(self, key: bytes, hot: HotKey) -> None:
        """Hold the key dirty in the data plane (raises DriverError)."""
        self.driver.set_dirty(key)
        hot.dirty, hot.cleared = True, None


def digest(item: StoredItem | None) -> bytes | None:
    """A short fingerprint of an item's value and flags (not its CAS or TTL)."""
    if item is None:
        return None
    return hashlib.blake2b(item.value, digest_size=16, key=str(item.flags).encode()).digest()


def _errors(failed: dict[int, str]) -> str:
    return "; ".join(f"server {s}: {e}" for s, e in failed.items()) or "none"
