"""Keeping the copies of hot keys fresh: the part of the executor that handles copies of writes, polls the homes'
CAS for writes that never passed the switch, and clears a key to a write stamp once its copies match the home
(docs/coherence.md says why each step is safe).

A mixin of the Executor (controller/execution.py): it uses the executor's records (`hot`), driver, replicator,
retries and clock, and nothing else; only the core's worker thread calls in here.
"""
from __future__ import annotations

import hashlib
import logging
from typing import Callable, Collection, Container

from controller.decisions import Decision
from controller.hot_keys import HotKey, HotKeyState
from controller.retries import KEY_LEVEL, RetryKind
from dataplanes.driver import DriverError, WriteStamp
from mbalancer.memcache.meta import NO_EXPIRY, ItemVersion, MetaError, StoredItem

log = logging.getLogger(__name__)

SYNC_WAIT = 0.05  # how long a mirrored write may take to show on the home server (it arrives in microseconds)
SYNC_ROUNDS = 3  # copies retried when writes keep landing during a sync; then the key stays dirty (served home)
MIRROR_WAIT = 0.002  # seconds before looking again for the copy of a counted write the core has not had yet
MIRRORS_LOST_AFTER = 0.1  # no copy of the key's writes for this long while some are missing: they were lost
UNREADABLE_WAIT = 0.005  # before checking the keys of a request nobody could read: the home applies it first
EXPIRY_SLACK = 2.0  # s: two reads of one item's expiry may differ this much (memcached counts whole seconds)
EXPIRY_MARGIN = 2.5  # s before its home expires an item, gets for it go home (each server's clock ticks on its own)


class Coherence:
    """The executor's coherence methods (see the module docstring)."""

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
                self._schedule(RetryKind.HOME_CHECK, b"", server, "a request nobody could read",
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
            return self._schedule(RetryKind.HOME_CHECK, b"", server, str(err), attempt)
        for key in homed:
            if key not in skip and (hot := self.hot.get(key)) is not None:
                between()
                self._check(key, hot)

    def _rearm(self, server: int) -> None:
        self.driver.rearm_unsure(server)
        self.unarmed.discard(server)

    def sync(self, key: bytes, data: bytes | None, received: float) -> None:
        """A write to `key` was mirrored (its data if it was a set): bring the replicas up to date."""
        hot = self.hot.get(key)
        if hot is None:
            return
        # the data plane counted the write: dirty there (a key whose rules are out stays out)
        hot.move(HotKeyState.DIRTY if hot.installed else HotKeyState.NOT_INSTALLED)
        if hot.unsynced_since is None:
            hot.unsynced_since = received
        item = self._wait_for_write(hot, key, data)
        if isinstance(item, MetaError):
            return self.decide(Decision.ERROR, key,
                               f"mirrored write not synced, home unreadable (gets stay home): {item}")
        self._push(key, hot, item)
        self._synced(key, hot)  # every replica that holds the key holds the home's latest now
        self._settle(key, hot)

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
                self._protect(key, hot, "its home changed (value or TTL) without a write the switch saw")
                self._settle(key, hot)  # pushes the home's item, then clears

    def _matches(self, hot: HotKey, version: ItemVersion | None) -> bool:
        """True if the home holds the item the copies were made from: the same CAS and the same expiry (gat, touch
        and mg T change a TTL and nothing else), within the whole seconds memcached counts in."""
        if version is None or hot.synced_cas is None:
            return version is None and hot.synced_cas is None
        return version.cas == hot.synced_cas and self._same_expiry(hot, version.ttl)

    def _same_expiry(self, hot: HotKey, ttl: int) -> bool:
        expiry = self._expiry(ttl)
        if expiry is None or hot.synced_expiry is None:
            return expiry is None and hot.synced_expiry is None
        return abs(expiry - hot.synced_expiry) <= EXPIRY_SLACK

    def _expiry(self, ttl: int) -> float | None:
        """When an item with `ttl` seconds left expires, on this clock (None: never)."""
        return None if ttl == NO_EXPIRY else self.clock() + ttl

    def _expiring(self, hot: HotKey) -> bool:
        """True if the copies' item expires at its home within EXPIRY_MARGIN: a replica's clock may expire it
        later than the home does, so gets must go home from now until the home has."""
        return hot.synced_expiry is not None and hot.synced_expiry - self.clock() <= EXPIRY_MARGIN

    def _hold_until_expired(self, key: bytes, hot: HotKey) -> None:
        """Gets go home until the home has expired the item; then the settle deletes the copies and clears."""
        left = hot.synced_expiry - self.clock()
        try:
            self._dirty(key, hot)
        except DriverError as err:
            return self._protect(key, hot, f"expires at its home in {left:.1f} s, not held dirty ({err})")
        self.decide(Decision.EXPIRE, key, f"expires at its home in {left:.1f} s: gets go home until it has, then the "
                                          f"copies are deleted")
        self._schedule(RetryKind.SETTLE, key, KEY_LEVEL, "waiting for the home to expire it",
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
            return self._schedule(RetryKind.SETTLE, key, KEY_LEVEL, str(err))
        hot.move(HotKeyState.DIRTY)
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
            if item is None or item.cas != hot.synced_cas or (data is not None and item.value == data) \
                    or not self._same_expiry(hot, item.ttl):  # a gat or mg T changes the TTL alone
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
        hot.synced_expiry = self._expiry(item.ttl) if item is not None else None
        if failed:
            hot.holding -= set(failed)
            self._set_weights(key, hot)
            for server, error in failed.items():
                self._schedule(RetryKind.REFILL, key, server, error)

    def _settle_together(self, keys: list[bytes]) -> set[bytes]:
        """Settle keys just installed: one stamp read and one clear for all whose copies match their home as they are
        (the usual case); every other key, or all if the stamps cannot be read, settles on its own (_settle), in the
        same order of steps. Returns the keys cleared. Why each other key left the common path is counted in
        `settled_alone`."""
        ready, alone, checked = [], [], set()  # checked: the home's version was read (a sync round spent)
        for key in keys:
            if self._may_settle(key, self.hot[key]):
                (alone if self.hot[key].placement.home in self.unarmed else ready).append(key)
            else:
                self.settled_alone["settled later (not installed, or a command to its home is cut)"] += 1
        if alone:
            self.settled_alone["its home was home to no hot key (unsure requests not rearmed)"] += len(alone)
        try:
            stamps = self.driver.write_stamps(ready) if ready else {}
        except DriverError as err:
            log.info("stamps of %d keys not read together (%s): each on its own", len(ready), err)
            stamps, alone = {}, alone + ready
            self.settled_alone["the stamps could not be read together"] += len(ready)
        waits: dict[int, float] = {}  # home -> _unreadable_wait, read after the stamps as _settle does
        matching: dict[bytes, WriteStamp] = {}
        for key, stamp in stamps.items():
            hot, home = self.hot[key], self.hot[key].placement.home
            why = "the copy of a write the switch counted is not in yet"
            try:
                if self._mirrors_in(key, hot, stamp):
                    if home not in waits:
                        waits[home] = self._unreadable_wait(home)
                    why = "a request to its home nobody could read just passed"
                    if waits[home] == 0:
                        checked.add(key)
                        continue
            except (MetaError, DriverError) as err:
                log.info("%r settles on its own: %s", key, err)
                why = "its home or the switch could not be read"
            self.settled_alone[why] += 1
            alone.append(key)
        versions = self._home_versions(checked)  # every home's CAS after the stamps, pipelined
        for key in [key for key in stamps if key in checked]:
            hot = self.hot[key]
            if not isinstance(versions[key], MetaError) and self._matches(hot, versions[key]) \
                    and not self._expiring(hot):
                matching[key] = stamps[key]
                continue
            self.settled_alone["its home changed since the copy (or it expires soon)" if not isinstance(
                versions[key], MetaError) else "its home or the switch could not be read"] += 1
            alone.append(key)
        refused = self.driver.clear_dirty_keys(matching) if matching else {}
        cleared = set()
        after = self._home_versions([key for key in matching if key not in refused])  # after the clear
        for key, stamp in matching.items():
            hot = self.hot[key]
            if key in refused:  # as a clear refused in _settle: retried later
                self._settle_failed(key, hot, refused[key])
                continue
            hot.move(HotKeyState.CLEAN, stamp)
            try:
                if self._still_clean(key, hot, stamp, after[key]):
                    cleared.add(key)
                    continue
                self._dirty(key, hot)
                self.settled_alone["its home changed just after the clear"] += 1
                alone.append(key)
            except (MetaError, DriverError) as err:
                self._settle_failed(key, hot, err)
        return cleared | {key for key in alone
                          if self._settle(key, self.hot[key], rounds=SYNC_ROUNDS - (key in checked))}

    def _may_settle(self, key: bytes, hot: HotKey, attempt: int = 0) -> bool:
        """Whether the key can be cleared now; if not, its settle is retried when it may."""
        if not hot.installed:
            return False  # its reinstall settles it
        if self.mid_command(hot.placement.home):  # the segment that ends it may complete a write to this key
            self._schedule(RetryKind.SETTLE, key, KEY_LEVEL, "a command to its home is cut between TCP segments",
                           attempt, delay=MIRROR_WAIT)
            return False
        return True

    def _still_clean(self, key: bytes, hot: HotKey, stamp: WriteStamp,
                     version: ItemVersion | None | MetaError | bool = False) -> bool:
        """Just cleared to `stamp`: whether it may stay so. Any change at the home since is a write the data plane
        counted after the stamp (the key is dirty there, and that write's copy is on its way), unless the data plane
        counted none: two writers' writes were then applied in the other order than they passed the switch, or one
        went around it, and the key must be synced again. `version`: the home's, read after the clear (False: read
        it here). Raises MetaError, DriverError."""
        if version is False:
            version = self.replicator.version(hot.placement.home, key)
        if isinstance(version, MetaError):
            raise version
        return self._matches(hot, version) or self.driver.write_stamp(key).counts != stamp.counts

    def _home_versions(self, keys: Collection[bytes]) -> dict[bytes, ItemVersion | None | MetaError]:
        """Each key's CAS and TTL at its home, read for all at once (or its MetaError)."""
        return self.replicator.versions_many([(key, self.hot[key].placement.home) for key in keys]) if keys else {}

    def _settle_failed(self, key: bytes, hot: HotKey, err: Exception, attempt: int = 0) -> None:
        if not hot.dirty:  # cleared, then the check or the hold failed: the copies may be stale
            self._protect(key, hot, str(err))
        self._schedule(RetryKind.SETTLE, key, KEY_LEVEL, str(err), attempt)
        self.decide(Decision.ERROR, key, f"left dirty (gets go home), retrying: {err}")

    def _settle(self, key: bytes, hot: HotKey, attempt: int = 0, rounds: int = SYNC_ROUNDS) -> bool:
        """Clear the key if the copies match the home; re-copy while writes keep landing (`rounds` checks of the
        home at most). True if cleared. When it cannot finish, the key stays dirty (gets go home) and the settle is
        retried."""
        if not self._may_settle(key, hot, attempt):
            return False
        home = hot.placement.home
        for _ in range(rounds):
            try:
                if home in self.unarmed:  # from now on its requests nobody can read are copied again
                    self._rearm(home)
                stamp = self.driver.write_stamp(key)
                if not self._mirrors_in(key, hot, stamp):
                    self._schedule(RetryKind.SETTLE, key, KEY_LEVEL, "the copy of a counted write is on its way",
                                   attempt, delay=MIRROR_WAIT)
                    return False
                if (wait := self._unreadable_wait(home)) > 0:  # one the stamp counts may not be applied yet
                    self._schedule(RetryKind.SETTLE, key, KEY_LEVEL, "a request nobody could read just passed",
                                   attempt, delay=wait)
                    return False
                if self._matches(hot, self.replicator.version(home, key)):
                    if self._expiring(hot):
                        self._hold_until_expired(key, hot)
                        return False
                    self.driver.clear_dirty(key, stamp)
                    hot.move(HotKeyState.CLEAN, stamp)
                    if self._still_clean(key, hot, stamp):
                        return True
                    self._dirty(key, hot)  # and synced again
                self._push(key, hot, self.replicator.read(home, key))
            except (MetaError, DriverError) as err:
                self._settle_failed(key, hot, err, attempt)
                return False
        self._schedule(RetryKind.SETTLE, key, KEY_LEVEL, "writes kept landing during the sync", attempt)
        return False

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


def _errors(failed: dict[int, str]) -> str:
    return "; ".join(f"server {s}: {e}" for s, e in failed.items()) or "none"
