"""Keeping the copies of hot keys fresh: coherence handles copies of writes, polls the homes' CAS for writes that
never passed the switch, and clears a key to a write stamp once its copies match the home (docs/coherence.md says
why each step is safe).

An object with a declared interface (`Coherence`): it is given what it works on (the executor's records of the hot
keys, the driver, the replicator, the key guard with the retries, the decision log, the clock) and calls nothing
above it; the executor (controller/execution.py) calls its public methods, and passes the core's calls on; adoption
(controller/adoption.py) calls the few its AdoptionCoherence declares. Every
clear goes through one settle (`settle`), whose round is one read of the keys' write stamps, then one step per key
(`_step`: the checks in the one order that keeps gets correct), then one clear of the keys the step found ready.
Only the core's worker thread calls in here.
"""
from __future__ import annotations

import hashlib
import logging
import time
from collections import Counter
from dataclasses import dataclass
from enum import Enum
from typing import Callable, Collection, Container, Iterable, Mapping

from controller.decisions import Decide, Decision
from controller.hot_keys import HotKey, HotKeyState
from controller.key_guard import KeyGuard
from controller.replicator import Replicator
from controller.retries import KEY_LEVEL, RetryKind
from controller.sync_times import SyncTimes
from dataplanes.driver import Driver, DriverError, WriteStamp
from mbalancer.memcache.meta import NO_EXPIRY, ItemVersion, MetaError, StoredItem

log = logging.getLogger(__name__)

SYNC_WAIT = 0.05  # how long a mirrored write may take to show on the home server (it arrives in microseconds)
SYNC_ROUNDS = 3  # rounds of a settle while writes keep landing (each re-copies); then the key stays dirty (served home)
MIRROR_WAIT = 0.002  # seconds before looking again for the copy of a counted write the core has not had yet
MIRRORS_LOST_AFTER = 0.1  # no copy of the key's writes for this long while some are missing: they were lost
UNREADABLE_WAIT = 0.005  # before checking the keys of a request nobody could read: the home applies it first
WRITE_LATE = 0.5  # s a mirrored write not at its home after SYNC_WAIT is given to land before its key is settled
EXPIRY_SLACK = 2.0  # s: two reads of one item's expiry may differ this much (memcached counts whole seconds)
EXPIRY_MARGIN = 2.5  # s before its home expires an item, gets for it go home (each server's clock ticks on its own)


class Step(Enum):
    """What a key's step of a settle round found."""
    CLEAR = "clear"  # the copies match the home: clear the key to the stamp
    PUSH = "push"  # the home's item is not the copies': push it, then another round
    STOP = "stop"  # not now: a retry is scheduled (or the key is held until its item expires)


Read = ItemVersion | None | MetaError | DriverError | bool  # what a round read for a key (or why it could not)


@dataclass(frozen=True)
class Facts:
    """What a key's step decides on, read for every key of the round at once, in the order the step checks them:
    after the stamps, whether the copies of the writes they count are in; then its home's wait for requests nobody
    could read (None: not read, the copies are not in); then its home's CAS and TTL (False: not read)."""
    mirrors_in: bool | MetaError | DriverError
    wait: float | DriverError | None
    version: Read


class Coherence:
    """The copies' freshness (see the module docstring)."""

    def __init__(self, hot: Mapping[bytes, HotKey], driver: Driver, replicator: Replicator, guard: KeyGuard,
                 decide: Decide, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep, poll_every: float = 0.5,
                 backlog: Callable[[], bool] = lambda: False,
                 mid_command: Callable[[int], bool] = lambda server: False):
        """hot: the executor's records (it adds and drops them; here they are read and moved); poll_every: seconds
        between checks of every clean hot key's CAS at its home (0: never); backlog: True while copied packets wait
        in the core's queue (a copy not handled yet is then not lost); mid_command(server): True while a TCP
        connection to the server is cut inside a command (its next segment may complete a write)."""
        self.hot, self.driver, self.replicator, self.guard, self.decide = hot, driver, replicator, guard, decide
        self.clock, self.sleep, self.poll_every = clock, sleep, poll_every
        self.backlog, self.mid_command = backlog, mid_command
        self.next_poll = clock() + poll_every
        self.unreadable_at: dict[int, float] = {}  # server -> when the latest copy nobody could read was handled
        self.unarmed: set[int] = set()  # servers whose unsure report was not rearmed (home to no hot key when
        # checked): their requests nobody can read are not copied until one of their keys is settled
        self.sync_times = SyncTimes()  # mirrored write -> every replica updated
        self.mirrors_lost = 0  # copies of counted writes that never reached the core
        self.unseen_writes = 0  # changes at a home found by polling, not by a mirrored write
        self.cas_moves = 0  # new CAS at a home with the same value (memcached relinked the item)
        self.settled_alone: Counter[str] = Counter()  # why keys did not clear in their settle's round: another round
        # or a retry (a hot-set change's keys clear together in one round, the common path: docs/scale.md)

    # --- the interface: what the executor calls (the core's calls too), and adoption -------------------------------
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
            if unreadable:  # the home may not have applied it yet: look after it has
                self.unreadable_at[server] = self.clock()
                self.guard.schedule(RetryKind.HOME_CHECK, b"", server, "a request nobody could read",
                                    delay=UNREADABLE_WAIT)
            else:
                self.check_home(server, between=between, skip=writes)

    def check_home(self, server: int, attempt: int = 0, between: Callable[[], None] = lambda: None,
                   skip: Container[bytes] = ()) -> None:
        """The data plane counted unsure requests to `server`: each of its hot keys the counts made dirty is
        settled again. The data plane's coalesced copies are rearmed first: an unsure request it did not copy came
        before this, and is in the counts read now. A server that is home to no hot key is left unarmed (its
        requests nobody can read then cost nothing) until one of its keys is settled."""
        homed = [key for key, hot in self.hot.items() if hot.placement.home == server]
        if not homed:
            self.unarmed.add(server)
            return
        try:
            self._rearm(server)
        except DriverError as err:
            return self.guard.schedule(RetryKind.HOME_CHECK, b"", server, str(err), attempt)
        for key in homed:
            if key not in skip and (hot := self.hot.get(key)) is not None:
                between()
                self._check(key, hot)

    def sync(self, key: bytes, data: bytes | None, received: float) -> None:
        """A write to `key` was mirrored (its data if it was a set): bring the replicas up to date."""
        hot = self.hot.get(key)
        if hot is None:
            return
        # the data plane counted the write: dirty there (a key whose rules are out stays out)
        hot.move(HotKeyState.DIRTY if hot.installed else HotKeyState.NOT_INSTALLED)
        if hot.unsynced_since is None:
            hot.unsynced_since = received
        item, shown = self._wait_for_write(hot, key, data)
        if isinstance(item, MetaError):
            return self.decide(Decision.ERROR, key,
                               f"mirrored write not synced, home unreadable (gets stay home): {item}")
        if not shown:  # a write that failed never shows (an add of an existing key), but one held up on a busy
            # switch or server lands late, and copies cleared now would be old then (a stale get on OpenFlow under
            # load): gets stay home until the key is settled, the home's item pushed, WRITE_LATE from now
            self.guard.schedule(RetryKind.SETTLE, key, KEY_LEVEL, "the mirrored write had not shown at its home",
                                delay=WRITE_LATE)
            return
        self.push(key, hot, item)
        self._synced(key, hot)  # every replica that holds the key holds the home's latest now
        self.settle([key])

    def poll(self, idle: bool = True) -> None:
        """Every poll_every seconds: each clean hot key's CAS at its home (every home at once), for writes no
        switch saw (a client on the server's own host, a path around the switch). A changed one is made dirty and
        synced. Done when the core is idle, or once it is a whole interval late."""
        now = self.clock()
        if not self.poll_every or now < self.next_poll or (not idle and now < self.next_poll + self.poll_every):
            return
        self.next_poll = now + self.poll_every
        found = self.replicator.versions_many([(key, hot.placement.home) for key, hot in self.hot.items()
                                               if not hot.dirty and hot.installed])  # every home at once
        for key, version in found.items():
            hot = self.hot.get(key)
            if hot is None or isinstance(version, MetaError):
                continue  # (the health checker deals with servers that do not answer)
            if self._expiring(hot):
                self._hold_until_expired(key, hot)
            elif not self._matches(hot, version) and not self._seen(key, hot) and not self._moved(key, hot):
                self.unseen_writes += 1
                self.guard.protect(key, hot, "its home changed (value or TTL) without a write the switch saw")
                self.settle([key])  # pushes the home's item, then clears

    def poll_due(self) -> float | None:
        """When the next poll of the homes is due, while some key is clean (nothing else finds a write that went
        around the switch); None: no poll is waiting."""
        if self.poll_every and any(hot.installed and not hot.dirty for hot in self.hot.values()):
            return self.next_poll
        return None

    def expiry(self, ttl: int) -> float | None:
        """When an item with `ttl` seconds left expires, on this clock (None: never)."""
        return None if ttl == NO_EXPIRY else self.clock() + ttl

    def push(self, key: bytes, hot: HotKey, item: StoredItem | None) -> None:
        """Make every holding replica match the home's item; replicas that fail lose their weight now."""
        replicas = sorted(hot.holding - {hot.placement.home})
        if item is None:
            failed = self.replicator.delete(key, replicas, update=True)
        else:
            failed = self.replicator.write(key, item, replicas, update=True)
        hot.synced_cas = item.cas if item is not None else None
        hot.synced_digest = digest(item)
        hot.synced_expiry = self.expiry(item.ttl) if item is not None else None
        if failed:
            hot.holding -= set(failed)
            self.guard.set_weights(key, hot)
            for server, error in failed.items():
                self.guard.schedule(RetryKind.REFILL, key, server, error)

    def rearm_homes(self, homes: Iterable[int]) -> None:
        """Copy the next request nobody can read to each of `homes` again (a controller that takes over: the one
        before may have had the copy the data plane coalesced it into); a home the switch cannot rearm now is left
        unarmed, and the first settle of one of its keys rearms it."""
        for home in sorted(homes):
            try:
                self._rearm(home)
            except DriverError as err:
                self.unarmed.add(home)
                log.info("server %d not rearmed (%s): the first settle of one of its keys rearms it", home, err)

    # --- inside -------------------------------------------------------------------------------------------------
    def _rearm(self, server: int) -> None:
        self.driver.rearm_unsure(server)
        self.unarmed.discard(server)

    def _matches(self, hot: HotKey, version: ItemVersion | None) -> bool:
        """True if the home holds the item the copies were made from: the same CAS and the same expiry (gat, touch
        and mg T change a TTL and nothing else), within the whole seconds memcached counts in."""
        if version is None or hot.synced_cas is None:
            return version is None and hot.synced_cas is None
        return version.cas == hot.synced_cas and self._same_expiry(hot, version.ttl)

    def _same_expiry(self, hot: HotKey, ttl: int) -> bool:
        expiry = self.expiry(ttl)
        if expiry is None or hot.synced_expiry is None:
            return expiry is None and hot.synced_expiry is None
        return abs(expiry - hot.synced_expiry) <= EXPIRY_SLACK

    def _expiring(self, hot: HotKey) -> bool:
        """True if the copies' item expires at its home within EXPIRY_MARGIN: a replica's clock may expire it
        later than the home does, so gets must go home from now until the home has."""
        return hot.synced_expiry is not None and hot.synced_expiry - self.clock() <= EXPIRY_MARGIN

    def _hold_until_expired(self, key: bytes, hot: HotKey) -> None:
        """Gets go home until the home has expired the item; then the settle deletes the copies and clears."""
        left = hot.synced_expiry - self.clock()
        try:
            self.guard.hold_dirty(key, hot)
        except DriverError as err:
            return self.guard.protect(key, hot, f"expires at its home in {left:.1f} s, not held dirty ({err})")
        self.decide(Decision.EXPIRE, key, f"expires at its home in {left:.1f} s: gets go home until it has, then the "
                                          f"copies are deleted")
        self.guard.schedule(RetryKind.SETTLE, key, KEY_LEVEL, "waiting for the home to expire it",
                            delay=max(left, 0.0) + EXPIRY_SLACK)

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
        if item is None or digest(item) != hot.synced_digest or not self._same_expiry(hot, item.ttl):
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
            return self.guard.schedule(RetryKind.SETTLE, key, KEY_LEVEL, str(err))
        hot.move(HotKeyState.DIRTY)
        self.settle([key])

    def _wait_for_write(self, hot: HotKey, key: bytes,
                        data: bytes | None) -> tuple[StoredItem | None | MetaError, bool]:
        """The home's item, and whether the mirrored write showed there within SYNC_WAIT (else the item as it is
        then)."""
        deadline, delay = self.clock() + SYNC_WAIT, 0.0005
        while True:
            try:
                item = self.replicator.read(hot.placement.home, key)
            except MetaError as err:
                return err, False
            if item is None or item.cas != hot.synced_cas or (data is not None and item.value == data) \
                    or not self._same_expiry(hot, item.ttl):  # a gat or mg T changes the TTL alone
                return item, True
            if self.clock() >= deadline:
                return item, False
            self.sleep(delay)
            delay = min(2 * delay, 0.01)

    # --- the settle: one round for one key or many ---------------------------------------------------------------
    def settle(self, keys: list[bytes], attempt: int = 0) -> set[bytes]:
        """Clear each key once its copies match its home, re-copying while writes keep landing: at most SYNC_ROUNDS
        rounds, each one read of the write stamps of the keys still going, then the step (`_step`) of each, then one
        clear of the keys it found ready and, for each other that must go round again, its home's item pushed. A key
        just installed settles with the plan's others; a copied write's, a retry's, a poll's alone. Returns the
        keys cleared; one that cannot finish stays dirty (gets go home) and its settle is retried."""
        going = [key for key in dict.fromkeys(keys) if self._may_settle(key, self.hot[key], attempt)]
        cleared: set[bytes] = set()
        for _ in range(SYNC_ROUNDS):
            if not going:
                return cleared
            done, going = self._round(going, attempt)
            cleared |= done
        for key in going:
            self.guard.schedule(RetryKind.SETTLE, key, KEY_LEVEL, "writes kept landing during the sync", attempt)
        return cleared

    def _round(self, keys: list[bytes], attempt: int) -> tuple[set[bytes], list[bytes]]:
        """One round of a settle: (the keys cleared, those whose home's item was pushed: another round)."""
        keys = self._armed(keys, attempt)
        try:
            stamps = self.driver.write_stamps(keys) if keys else {}
        except DriverError as err:
            if len(keys) == 1:
                self._settle_failed(keys[0], self.hot[keys[0]], err, attempt)
                return set(), []
            log.info("stamps of %d keys not read together (%s): each on its own", len(keys), err)
            rounds = [self._round([key], attempt) for key in keys]
            return set().union(*(done for done, _ in rounds)), [key for _, again in rounds for key in again]
        facts = self._facts(stamps)
        steps = {key: self._step(key, self.hot[key], facts[key], attempt) for key in stamps}
        cleared, held = self._clear({key: stamps[key] for key, step in steps.items() if step is Step.CLEAR}, attempt)
        return cleared, self._pushed([key for key, step in steps.items() if step is Step.PUSH] + held, attempt)

    def _facts(self, stamps: Mapping[bytes, WriteStamp]) -> dict[bytes, Facts]:
        """What each key's step needs, read for all the round's keys at once (each home's wait once, every home's
        CAS pipelined), in the order the step checks it."""
        mirrors: dict[bytes, bool | MetaError | DriverError] = {}
        for key, stamp in stamps.items():
            try:
                mirrors[key] = self._mirrors_in(key, self.hot[key], stamp)
            except (MetaError, DriverError) as err:
                mirrors[key] = err
        waits: dict[int, float | DriverError] = {}  # home -> _unreadable_wait, read once a round, after the stamps
        for key in [key for key in stamps if mirrors[key] is True]:
            home = self.hot[key].placement.home
            if home not in waits:
                try:
                    waits[home] = self._unreadable_wait(home)
                except DriverError as err:
                    waits[home] = err
        wait_of = {key: waits.get(self.hot[key].placement.home) if mirrors[key] is True else None for key in stamps}
        versions = self._home_versions([key for key in stamps if wait_of[key] == 0])
        return {key: Facts(mirrors[key], wait_of[key], versions.get(key, False)) for key in stamps}

    def _step(self, key: bytes, hot: HotKey, facts: Facts, attempt: int) -> Step:
        """A key's step of a round, given what the round read, in the one order that keeps gets correct: the copy of
        every write the stamp counts handled here; no request nobody could read too recent for the home to have
        applied it (one the stamp counts); the home's item the copies'; the item not about to expire."""
        try:
            if not _raised(facts.mirrors_in):
                self._left("the copy of a write the switch counted is not in yet")
                self.guard.schedule(RetryKind.SETTLE, key, KEY_LEVEL, "the copy of a counted write is on its way",
                                    attempt, delay=MIRROR_WAIT)
                return Step.STOP
            if _raised(facts.wait) > 0:
                self._left("a request to its home nobody could read just passed")
                self.guard.schedule(RetryKind.SETTLE, key, KEY_LEVEL, "a request nobody could read just passed",
                                    attempt, delay=facts.wait)
                return Step.STOP
            if not self._matches(hot, _raised(facts.version)):
                self._left("its home changed since the copy")
                return Step.PUSH
            if self._expiring(hot):
                self._left("its item expires soon")
                self._hold_until_expired(key, hot)
                return Step.STOP
            return Step.CLEAR
        except (MetaError, DriverError) as err:
            self._left("its home or the switch could not be read")
            self._settle_failed(key, hot, err, attempt)
            return Step.STOP

    def _left(self, why: str) -> None:
        """A key that does not clear in this round, and why (the state's counters.settled_alone)."""
        self.settled_alone[why] += 1

    def _home_versions(self, keys: Collection[bytes]) -> dict[bytes, ItemVersion | None | MetaError]:
        """Each key's CAS and TTL at its home, read for all at once (or its MetaError)."""
        return self.replicator.versions_many([(key, self.hot[key].placement.home) for key in keys]) if keys else {}

    def _armed(self, keys: list[bytes], attempt: int) -> list[bytes]:
        """The keys whose homes copy their requests nobody can read (a home left unarmed is rearmed first: from now
        on they are copied again); a key whose home cannot be rearmed fails its settle."""
        failed: dict[int, DriverError] = {}
        for home in sorted({self.hot[key].placement.home for key in keys} & self.unarmed):
            try:
                self._rearm(home)
            except DriverError as err:
                failed[home] = err
        for key in keys:
            if (home := self.hot[key].placement.home) in failed:
                self._settle_failed(key, self.hot[key], failed[home], attempt)
        return [key for key in keys if self.hot[key].placement.home not in failed]

    def _clear(self, stamps: dict[bytes, WriteStamp], attempt: int) -> tuple[set[bytes], list[bytes]]:
        """Clear every key to its stamp in one driver call, then check each clear held: (the keys clean, those held
        dirty again because their home changed with no write counted: to be pushed)."""
        try:
            refused = self.driver.clear_dirty_keys(stamps) if stamps else {}
        except DriverError as err:
            refused = dict.fromkeys(stamps, err)
        cleared, held = set(), []
        after = self._home_versions([key for key in stamps if key not in refused])  # every home's, after the clear
        for key, stamp in stamps.items():
            hot = self.hot[key]
            if key in refused:
                self._left("the switch refused its clear")
                self._settle_failed(key, hot, refused[key], attempt)
                continue
            hot.move(HotKeyState.CLEAN, stamp)
            try:
                if self._still_clean(key, hot, stamp, after[key]):
                    cleared.add(key)
                    continue
                self._left("its home changed just after the clear")
                self.guard.hold_dirty(key, hot)  # and synced again
                held.append(key)
            except (MetaError, DriverError) as err:
                self._settle_failed(key, hot, err, attempt)
        return cleared, held

    def _pushed(self, keys: list[bytes], attempt: int) -> list[bytes]:
        """Each key's home item pushed to its replicas: the keys pushed (the others failed their settle)."""
        pushed = []
        for key in keys:
            hot = self.hot[key]
            try:
                self.push(key, hot, self.replicator.read(hot.placement.home, key))
                pushed.append(key)
            except (MetaError, DriverError) as err:
                self._settle_failed(key, hot, err, attempt)
        return pushed

    def _may_settle(self, key: bytes, hot: HotKey, attempt: int = 0) -> bool:
        """Whether the key can be cleared now; if not, its settle is retried when it may."""
        if not hot.installed:
            return False  # its reinstall settles it
        if self.mid_command(hot.placement.home):  # the segment that ends it may complete a write to this key
            self.guard.schedule(RetryKind.SETTLE, key, KEY_LEVEL,
                                "a command to its home is cut between TCP segments", attempt, delay=MIRROR_WAIT)
            return False
        return True

    def _still_clean(self, key: bytes, hot: HotKey, stamp: WriteStamp,
                     version: ItemVersion | None | MetaError) -> bool:
        """Just cleared to `stamp`: whether it may stay so, given its home's `version` read after the clear. Any
        change at the home since is a write the data plane counted after the stamp (the key is dirty there, and that
        write's copy is on its way), unless the data plane counted none: two writers' writes were then applied in the
        other order than they passed the switch, or one went around it, and the key must be synced again. Raises
        MetaError, DriverError."""
        return self._matches(hot, _raised(version)) or self.driver.write_stamp(key).counts != stamp.counts

    def _settle_failed(self, key: bytes, hot: HotKey, err: Exception, attempt: int = 0) -> None:
        if not hot.dirty:  # cleared, then the check or the hold failed: the copies may be stale
            self.guard.protect(key, hot, str(err))
        self.guard.schedule(RetryKind.SETTLE, key, KEY_LEVEL, str(err), attempt)
        self.decide(Decision.ERROR, key, f"left dirty (gets go home), retrying: {err}")

    def _unreadable_wait(self, home: int) -> float:
        """Seconds until the home has had UNREADABLE_WAIT to apply the latest request to it nobody could read: the
        latest such copy handled here (a check scheduled for an earlier one may come sooner), and the latest the
        data plane counted, whose copy it may have coalesced (0: none that recent). Raises DriverError."""
        quiet = self.clock() - self.unreadable_at.get(home, float("-inf"))
        in_data_plane = self.driver.unsure_quiet(home)
        if in_data_plane is not None:
            quiet = min(quiet, in_data_plane)
        wait = UNREADABLE_WAIT - quiet
        return wait if wait > 1e-6 else 0.0  # (a rounding error's microsecond is no wait)

    def _synced(self, key: bytes, hot: HotKey) -> None:
        if hot.unsynced_since is None:
            return
        hot.syncs += 1
        hot.last_sync_ms = 1000 * (self.clock() - hot.unsynced_since)
        hot.unsynced_since = None
        self.sync_times.record(hot.last_sync_ms)
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
        self.decide(Decision.ERROR, key, f"{lost} copied write(s) never reached the controller: checking the key "
                                         f"at its home")
        return True  # the settle compares the home's CAS: a lost write changed it, and is pushed


def digest(item: StoredItem | None) -> bytes | None:
    """A short fingerprint of an item's value and flags (not its CAS or TTL)."""
    if item is None:
        return None
    return hashlib.blake2b(item.value, digest_size=16, key=str(item.flags).encode()).digest()


def _raised(read: Read | float) -> Read | float:
    """What a round read for a key, or the error it met raised now (in the step, where it is handled)."""
    if isinstance(read, (MetaError, DriverError)):
        raise read
    return read
