"""Carrying out the plan against real servers and a driver, in the order that keeps every get correct.

Invariants (the reason for every ordering below):
- A rule never sends gets to a replica that does not hold the home's current value. A key is installed only after
  its copies are made, and dirty (gets go home); it is cleared only to a write stamp (dataplanes/driver.py) read
  before the home's CAS was found to be the one the copies were made from, and only once the copy of every write
  to the key counted in that stamp has been handled here. A write the data plane counts after the stamp
  keeps the key dirty. A replica whose copy or update failed gets weight 0 before the key is cleared, and is
  refilled with backoff.
- On cool-down the rules go first, then the extra copies, COPY_LINGER later: a get a switch balanced just before its
  rules went may still be queued on its way (a busy replica's socket, a software switch) and must find its copy.
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
The executor keeps the hot keys' records and the retries; coherence (controller/coherence.py: copies of writes, the
poll of the homes, every settle) and the key guard (controller/key_guard.py: gets kept safe when a driver call fails)
are objects below it, given what they work on, which never call back into it. The core talks to the executor only.
Only the core's worker thread calls in here.
"""
from __future__ import annotations

import logging
import time
from typing import Callable, NamedTuple, Sequence

from controller.coherence import Coherence, digest
from controller.decisions import Decide, Decision
from controller.hot_keys import HotKey, HotKeyState
from controller.key_guard import KeyGuard
from controller.planner import Change, ChangeAction, ChangeCause, Placement
from controller.replicator import Replicator
from controller.sync_times import SyncTimes
from controller.retries import BACKOFF_FIRST, KEY_LEVEL, KEY_RETRIES, Retry, RetryKind, RetryScheduler
from dataplanes.driver import Driver, DriverError, HotKeyInstall
from mbalancer.memcache.meta import MetaError, StoredItem

log = logging.getLogger(__name__)

REFUSED_BACKOFF_MAX = 60.0  # seconds at most between installs of a key the driver keeps refusing
REFILL_DELAY = 0.05  # after a server comes back: what it had queued while hung lands before it is refilled
COPY_LINGER = 1.0  # seconds a cooled key's extra copies stay after its rules went (gets balanced before, in flight)


class Copied(NamedTuple):
    """A key warmed so far: copied to its replicas, not yet installed."""
    hot: HotKey  # its record
    failed: dict[int, str]  # replicas whose copy failed -> why
    started: float
    size: int  # bytes copied

class Executor:
    def __init__(self, driver: Driver, replicator: Replicator, decide: Decide,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                 poll_every: float = 0.5, backlog: Callable[[], bool] = lambda: False,
                 mid_command: Callable[[int], bool] = lambda server: False):
        """poll_every: seconds between checks of every clean hot key's CAS at its home (0: never); backlog: True
        while copied packets wait in the core's queue (a copy not handled yet is then not lost); mid_command(server):
        True while a TCP connection to the server is cut inside a command (its next segment may complete a write)."""
        self.driver, self.replicator, self.decide, self.clock = driver, replicator, decide, clock
        self.hot: dict[bytes, HotKey] = {}  # the one record of each hot key (coherence reads and moves them)
        self.retries = RetryScheduler(clock)
        self.guard = KeyGuard(driver, self.retries, decide)
        self.coherence = Coherence(self.hot, driver, replicator, self.guard, decide, clock, sleep, poll_every,
                                   backlog, mid_command)
        self.down: set[int] = set()
        self.refused: dict[bytes, Retry] = {}  # installs the driver refused: not tried again before `due`

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

    # --- what the core asks of coherence, through the executor ------------------------------------------------
    def count_mirror(self, key: bytes | None, server: int) -> None:
        self.coherence.count_mirror(key, server)

    def sync_batch(self, writes: dict[bytes, tuple[bytes | None, float]], unsure: dict[int, bool],
                   between: Callable[[], None] = lambda: None) -> None:
        self.coherence.sync_batch(writes, unsure, between)

    def poll(self, idle: bool = True) -> None:
        self.coherence.poll(idle)

    mirrors_lost = property(lambda self: self.coherence.mirrors_lost)
    unseen_writes = property(lambda self: self.coherence.unseen_writes)
    cas_moves = property(lambda self: self.coherence.cas_moves)
    settled_alone = property(lambda self: self.coherence.settled_alone)
    sync_times: SyncTimes = property(lambda self: self.coherence.sync_times)

    # --- the plan -----------------------------------------------------------------------------------------------
    def apply(self, changes: tuple[Change, ...]) -> None:
        """The planner lists cools first (they free room and load before warms), then warms, then reweights: the cools
        go to the driver together, as do the warms (a hot-set change is a few requests, not a few per key)."""
        for change in changes:
            if not isinstance(change.action, ChangeAction):
                raise ValueError(f"unknown change {change.action!r} for {change.key!r}")
        self.cool([c for c in changes if c.action is ChangeAction.COOL])
        self.warm([c for c in changes if c.action is ChangeAction.WARM])
        for change in changes:
            if change.action is ChangeAction.REWEIGHT:
                self.reweight(change)

    def warm(self, changes: list[Change]) -> None:
        """Copy each key to its replicas, install every key whose copies took in one driver call, then settle them
        together (dirty until the copies are known to match)."""
        copied = self._copy_all(changes)
        if not copied:
            return
        refused = self.driver.install_hot_keys([HotKeyInstall(key, hot.placement.home, hot.weights())
                                                for key, (hot, *_) in copied.items()])
        for key, err in refused.items():
            self._refused_install(key, copied.pop(key), err)
        for key, made in copied.items():
            self.refused.pop(key, None)
            made.hot.move(HotKeyState.DIRTY)
            self.hot[key] = made.hot
            for server, error in made.failed.items():
                self.guard.schedule(RetryKind.REFILL, key, server, error)
        settled = self.coherence.settle(list(copied))
        for change in changes:
            if change.key not in copied:
                continue
            hot, failed, started, size = copied[change.key]
            copies = ", ".join(str(s) for s in sorted(hot.holding - {hot.placement.home}))
            left = "" if change.key in settled else "; left dirty (written during the copy)"
            self.decide(Decision.WARM, change.key,
                        f"{change.reason}; {size} B copied from {hot.placement.home} to {copies} in "
                        f"{1000 * (self.clock() - started):.1f} ms{left}"
                        + (f"; copy failed on {_errors(failed)}, retrying" if failed else ""))

    def _copy_all(self, changes: list[Change]) -> dict[bytes, Copied]:
        """Each key's value copied from its home to its replicas, the reads and the copies pipelined per server: its
        record (not yet installed), the copies that failed and when it started; a key that cannot be warmed now is
        left out (and why, decided)."""
        started = self.clock()
        wanted = [change for change in changes if not self._refused_now(change.key, started)]
        items = self.replicator.read_many([(change.key, change.placement.home) for change in wanted])
        copies: list[tuple[Change, StoredItem, list[int]]] = []
        for change in wanted:
            key, p, item = change.key, change.placement, items[change.key]
            if isinstance(item, MetaError):
                self.decide(Decision.SKIP, key, f"cannot read it from its home server {p.home}: {item}")
            elif item is None:
                self.decide(Decision.SKIP, key, f"not stored on its home server {p.home}: nothing to copy yet")
            else:
                copies.append((change, item, [s for s, w in zip(p.replicas, p.weights) if s != p.home and w > 0]))
        failures = self.replicator.write_many([(change.key, item, targets) for change, item, targets in copies])
        copied: dict[bytes, Copied] = {}
        for change, item, targets in copies:
            key, p, failed = change.key, change.placement, failures.get(change.key, {})
            holding = {p.home} | (set(targets) - set(failed))
            if len(holding) < 2:
                self.decide(Decision.SKIP, key, f"no replica took the copy: {_errors(failed)}")
                continue
            self.guard.cancel(key, RetryKind.DELETE)
            hot = HotKey(p, holding, item.cas, digest(item), since=started,
                         synced_expiry=self.coherence.expiry(item.ttl))
            copied[key] = Copied(hot, failed, started, len(item.value))
        return copied

    def _refused_now(self, key: bytes, now: float) -> bool:
        """True (and why, decided) if the driver refused the key's rules and its back-off has not ended."""
        refused = self.refused.get(key)
        if refused is None or refused.due <= now:
            return False
        self.decide(Decision.SKIP, key, f"the driver refused its rules {refused.attempt} time(s) ("
                                        f"{refused.last_error}); next try in {refused.due - now:.1f} s")
        return True

    def _refused_install(self, key: bytes, made: Copied, err: DriverError) -> None:
        """The driver refused a new key's rules: its copies go, and it is not tried again before its back-off."""
        made.hot.move(HotKeyState.REMOVED)
        self.replicator.delete(key, made.hot.holding - {made.hot.placement.home})
        refused = self.refused.get(key)
        attempt = refused.attempt + 1 if refused else 1
        wait = min(BACKOFF_FIRST * 2 ** attempt, REFUSED_BACKOFF_MAX)
        self.refused[key] = Retry(RetryKind.INSTALL, key, KEY_LEVEL, attempt, made.started + wait, str(err))
        self.decide(Decision.SKIP, key, f"the driver refused the rules: {err}; copies deleted, next try in "
                                        f"{wait:.1f} s at the earliest")

    def cool(self, changes: list[Change], attempt: int = 0) -> None:
        """Remove the rules of every key in one driver call, then delete each one's extra copies."""
        cooling = [c for c in changes if c.key in self.hot]
        installed = [c.key for c in cooling if self.hot[c.key].installed]
        refused = self.driver.remove_hot_keys(installed) if installed else {}
        removed: list[tuple[Change, list[int]]] = []
        for change in cooling:
            key = change.key
            if key in refused:
                self.guard.schedule(RetryKind.COOL, key, KEY_LEVEL, str(refused[key]), attempt)
                self.decide(Decision.ERROR, key, f"cool-down postponed, the driver refused to remove the rules: "
                                                 f"{refused[key]}; retrying")
                continue
            hot = self.hot.pop(key)
            hot.move(HotKeyState.REMOVED)
            self.guard.cancel(key, RetryKind.REFILL, RetryKind.RULES, RetryKind.SETTLE, RetryKind.INSTALL,
                              RetryKind.COOL)
            removed.append((change, [s for s in hot.placement.replicas if s != hot.placement.home]))
        for change, extras in removed:
            self.delete_copies_later(change.key, extras)
            self.decide(Decision.COOL, change.key, f"{change.reason}; rules removed, copies on {extras} deleted "
                                                   f"{COPY_LINGER:g} s later (for gets balanced before)")

    def delete_copies_later(self, key: bytes, servers: Sequence[int]) -> None:
        """Delete `key`'s copies on `servers` COPY_LINGER from now, its rules gone (a warm before that cancels it)."""
        for server in servers:
            self.guard.schedule(RetryKind.DELETE, key, server, "its rules went", delay=COPY_LINGER)

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
                return self.decide(Decision.ERROR, change.key, f"weights not changed, the driver refused: {err}")
        self.decide(Decision.REWEIGHT, change.key, f"{change.reason}: " + ", ".join(
            f"{r.server}={r.weight:.2f}" for r in hot.weights()))

    def replay(self, keys: Sequence[bytes] | None = None) -> None:
        """The switch came back empty (or without `keys`): every hot key (of `keys`) is installed again, dirty (its
        copies may have missed writes while no rule mirrored them), in one driver call, then settled against the
        home's CAS."""
        keys = list(self.hot) if keys is None else [key for key in keys if key in self.hot]
        for key in keys:
            hot = self.hot[key]
            if hot.installed:  # (one whose rules are out already has nothing more to lose)
                hot.move(HotKeyState.NOT_INSTALLED)
            self.guard.cancel(key, RetryKind.RULES, RetryKind.SETTLE, RetryKind.INSTALL)
        self._install(keys)
        how = "empty" if len(keys) == len(self.hot) else f"without {len(keys)} of its {len(self.hot)} hot keys"
        self.decide(Decision.REPLAY, None, f"the data plane came back {how}: {len(keys)} hot keys installed again")

    # --- health -------------------------------------------------------------------------------------------------
    def server_down(self, server: int) -> None:
        """A server stopped answering: it holds nothing we can trust any more, so it loses every weight now."""
        self.down.add(server)
        for key, hot in self.hot.items():
            if server in hot.holding:
                hot.holding.discard(server)
                self.guard.set_weights(key, hot)
        self.retries.cancel_server(server, RetryKind.REFILL)

    def server_up(self, server: int) -> None:
        """A server answers again (maybe restarted, empty): refill its copies before it gets weight back."""
        self.down.discard(server)
        for key, hot in self.hot.items():
            if server in hot.placement.replicas and server not in hot.holding:
                self.guard.schedule(RetryKind.REFILL, key, server, "the server is back", delay=REFILL_DELAY)

    # --- retries --------------------------------------------------------------------------------------------
    def run_due(self) -> None:
        deletes = []
        for retry in self.retries.take_due():
            if retry.action is RetryKind.DELETE:
                deletes.append(retry)  # the round's deletes in one pipelined request per server
            else:
                self._run(retry)
        if deletes:
            self._delete(deletes)

    def _delete(self, retries: list[Retry]) -> None:
        servers: dict[bytes, list[int]] = {}
        for retry in retries:
            servers.setdefault(retry.key, []).append(retry.server)
        failures = self.replicator.delete_many(list(servers.items()))
        for retry in retries:
            error = failures.get(retry.key, {}).get(retry.server)
            if error is not None:
                self.guard.schedule(RetryKind.DELETE, retry.key, retry.server, error, retry.next_attempt)

    def _run(self, retry: Retry) -> None:
        hot = self.hot.get(retry.key)
        if retry.action in KEY_RETRIES and hot is None:
            return  # the key cooled meanwhile: nothing left to retry
        handlers = {RetryKind.REFILL: self._retry_refill, RetryKind.RULES: self._retry_rules,
                    RetryKind.SETTLE: self._retry_settle, RetryKind.INSTALL: self._retry_install,
                    RetryKind.COOL: self._retry_cool, RetryKind.HOME_CHECK: self._retry_home_check}
        handlers[retry.action](retry, hot, retry.next_attempt)

    def _retry_refill(self, retry: Retry, hot: HotKey | None, attempt: int) -> None:
        self._refill(retry)

    def _retry_rules(self, retry: Retry, hot: HotKey, attempt: int) -> None:
        self.guard.set_weights(retry.key, hot, attempt)
        if hot.dirty and hot.installed and not self.retries.pending(RetryKind.RULES, retry.key):
            self.coherence.settle([retry.key])  # the weights are in: the key need not stay at home

    def _retry_settle(self, retry: Retry, hot: HotKey, attempt: int) -> None:
        self.coherence.settle([retry.key], attempt)

    def _retry_home_check(self, retry: Retry, hot: HotKey | None, attempt: int) -> None:
        self.coherence.check_home(retry.server, attempt)

    def _retry_install(self, retry: Retry, hot: HotKey, attempt: int) -> None:
        self._install([retry.key], attempt)

    def _retry_cool(self, retry: Retry, hot: HotKey, attempt: int) -> None:
        self.cool([Change(ChangeAction.COOL, retry.key, None, ChangeCause.RETRY, "retried")], attempt)

    def next_due(self) -> float | None:
        """When the next retry is due."""
        return self.retries.next_due()

    def next_wake(self) -> float | None:
        """When the core's worker must run even if no event comes: the next retry, or the next poll of the homes
        while some key is clean (nothing else finds a write that went around the switch)."""
        due, poll = self.retries.next_due(), self.coherence.poll_due()
        return poll if due is None else due if poll is None else min(due, poll)

    def _install(self, keys: list[bytes], attempt: int = 0) -> None:
        """The keys' rules again (after a reconnect, or after they were removed to keep gets safe), then settle."""
        if not keys:
            return
        refused = self.driver.install_hot_keys([HotKeyInstall(key, self.hot[key].placement.home,
                                                              self.hot[key].weights()) for key in keys])
        for key, err in refused.items():
            self.guard.schedule(RetryKind.INSTALL, key, KEY_LEVEL, str(err), attempt)
            self.decide(Decision.ERROR, key, f"rules not installed again ({err}); gets go home meanwhile; retrying")
        installed = [key for key in keys if key not in refused]
        for key in installed:
            self.hot[key].move(HotKeyState.DIRTY)
        self.coherence.settle(installed)

    def _refill(self, retry: Retry) -> None:
        key, server = retry.key, retry.server
        hot = self.hot.get(key)
        if hot is None or server in self.down:
            return
        if server != hot.placement.home and not self._copied_back(retry, hot):
            return
        hot.holding.add(server)  # (the home holds what its clients wrote: nothing is ever written or deleted there)
        self.guard.set_weights(key, hot)
        self.decide(Decision.REFILL, key, f"server {server} holds the value again; weights " + ", ".join(
            f"{r.server}={r.weight:.2f}" for r in hot.weights()))

    def _copied_back(self, retry: Retry, hot: HotKey) -> bool:
        """The home's item copied to the replica `retry.server` (or its copy deleted, the home holding none); else
        the refill is tried again."""
        key, server = retry.key, retry.server
        try:
            item = self.replicator.read(hot.placement.home, key)
        except MetaError as err:
            self.guard.schedule(RetryKind.REFILL, key, server, str(err), retry.attempt + 1)
            return False
        failed = self.replicator.delete(key, [server]) if item is None else self.replicator.write(key, item, [server])
        if failed:
            self.guard.schedule(RetryKind.REFILL, key, server, failed[server], retry.attempt + 1)
            return False
        if item is not None and item.cas != hot.synced_cas:
            self.guard.schedule(RetryKind.REFILL, key, server, "home changed during the refill", retry.attempt + 1)
            return False
        return True


def _errors(failed: dict[int, str]) -> str:
    """Copies that failed, by server, for the decision log."""
    return "; ".join(f"server {s}: {e}" for s, e in failed.items()) or "none"
