"""Adoption: a controller that takes over goes on from what the switches hold, instead of building it all again.

At attach the driver reads back every hot key the switches hold (dataplanes/read_back.py): its home, replicas and
weights, slot, dirty state and whether its switch's lease ran out. The core reads the key's item at its home and at
each replica (one pipelined read per server) and judges each key alone (`judge`, a pure function):

- kept clean: clean in the switches, its lease live, every replica with weight holding its home's item (value,
  flags, expiry): nothing is written anywhere; its gets go on being balanced as they were;
- kept dirty: dirty in a switch (a write counted since its last clear): its home's item pushed to its replicas and
  settled, as after a write;
- resynced: not to be trusted as it is (its lease ran out or is not known, a replica's copy missing, unreadable or
  not the home's, its home unreadable): held dirty (its gets go home), the home's item copied to its replicas again,
  then settled;
- rebuilt: its rules are out (the switches disagreed, it names servers the config does not have, or the data plane
  cannot read back): its extra copies are deleted and the plan warms it again.

No copy is deleted and no rule removed but a rebuilt key's; each key's treatment and why (a Distrust) go to the
decision log. The lease is renewed only after this (ControllerCore.start), so a key that is not trusted is held
dirty before its switch trusts anything again. Runs in the core's thread before the worker starts.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Callable, Iterable, Mapping, Protocol, Sequence

from controller.coherence import EXPIRY_SLACK, digest
from controller.decisions import Decision
from controller.hot_keys import HotKey, HotKeyState
from controller.planner import Placement
from controller.retries import KEY_LEVEL, RetryKind
from dataplanes.driver import RULES_REMOVED, Distrust, DriverError, FoundKey
from mbalancer.memcache.meta import NO_EXPIRY, MetaError, StoredItem

if TYPE_CHECKING:
    from controller.execution import Executor

log = logging.getLogger(__name__)
Read = StoredItem | None | MetaError  # what a server held of a key (None: nothing), or why it could not be read
UNKNOWN_CAS = -1  # the copies' CAS of a key whose home could not be read: its settle pushes before it clears


class AdoptionCoherence(Protocol):
    """What adoption asks of coherence (controller/coherence.py Coherence), and all it asks
    (tests/test_adoption.py checks that adoption calls nothing else of it)."""

    def expiry(self, ttl: int) -> float | None: ...  # when an item with `ttl` seconds left expires
    def push(self, key: bytes, hot: HotKey, item: StoredItem | None) -> None: ...  # the replicas made the home's
    def rearm_homes(self, homes: Iterable[int]) -> None: ...  # unreadable requests to them copied again
    def settle(self, keys: list[bytes], attempt: int = 0) -> set[bytes]: ...  # cleared once the copies match


class Treatment(str, Enum):
    """What adoption does with a key read back (a str: the decision log shows the value)."""
    KEPT_CLEAN = "kept clean"
    KEPT_DIRTY = "kept dirty"
    RESYNCED = "resynced"
    REBUILT = "rebuilt"


@dataclass(frozen=True)
class Verdict:
    key: bytes
    treatment: Treatment
    why: Distrust | None  # why it is not kept as it was (None: kept)
    holding: frozenset[int]  # servers holding the home's item now, the home among them
    servers: tuple[int, ...]  # every server its entry names, the home first
    detail: str = ""  # which servers, for people
    remove_rules: bool = False  # a rebuilt key whose rules the driver did not remove already


def judge(found: FoundKey, reads: Mapping[int, Read], servers: int) -> Verdict:
    """What to do with a key read back, given what each of its servers holds now (`reads`, by server) and the
    number of servers in the config."""
    named = found.servers
    if found.distrust in RULES_REMOVED:
        return Verdict(found.key, Treatment.REBUILT, found.distrust, frozenset(), named)
    if not all(0 <= s < servers for s in named):
        return Verdict(found.key, Treatment.REBUILT, Distrust.NOT_PLACEABLE, frozenset(), named,
                       f"servers {[s for s in named if not 0 <= s < servers]} are not the config's", remove_rules=True)
    home = reads.get(found.home, MetaError("not read"))
    weighted = [r.server for r in found.replicas if r.weight > 0 and r.server != found.home]
    if isinstance(home, MetaError):
        return Verdict(found.key, Treatment.RESYNCED, Distrust.HOME_UNREADABLE, frozenset({found.home}), named,
                       str(home))
    holding = frozenset({found.home} | {s for s in named if s != found.home and same_item(reads.get(s), home)})
    if found.distrust in (Distrust.LEASE_EXPIRED, Distrust.LEASE_UNKNOWN):
        return Verdict(found.key, Treatment.RESYNCED, found.distrust, holding, named)
    if found.synced is None:  # as after a write: its home's item pushed to its replicas, then settled
        return Verdict(found.key, Treatment.KEPT_DIRTY, None, holding, named)
    for why, bad in ((Distrust.REPLICA_UNREADABLE, [s for s in weighted if isinstance(reads.get(s), MetaError)]),
                     (Distrust.REPLICA_MISSING, [s for s in weighted if reads.get(s) is None and home is not None]),
                     (Distrust.REPLICA_DIFFERS, [s for s in weighted if s not in holding])):
        if bad:
            return Verdict(found.key, Treatment.RESYNCED, why, holding, named, f"replicas {bad}")
    return Verdict(found.key, Treatment.KEPT_CLEAN, None, holding, named)


def same_item(read: Read, home: StoredItem | None) -> bool:
    """Whether a replica holds the home's item: both nothing, or the same value and flags expiring together."""
    if isinstance(read, MetaError) or read is None or home is None:
        return read is None and home is None
    if digest(read) != digest(home):
        return False
    if NO_EXPIRY in (read.ttl, home.ttl):
        return read.ttl == home.ttl
    return abs(read.ttl - home.ttl) <= EXPIRY_SLACK


def read_items(executor: "Executor", found: Sequence[FoundKey]) -> dict[bytes, dict[int, Read]]:
    """Each key's item at each of its servers: one pipelined read per server."""
    wanted: dict[int, list[bytes]] = {}
    for key in found:
        if key.distrust not in RULES_REMOVED:
            for server in key.servers:
                wanted.setdefault(server, []).append(key.key)
    reads: dict[bytes, dict[int, Read]] = {key.key: {} for key in found}
    for server, keys in wanted.items():
        try:
            items: Sequence[Read] = executor.replicator.items(server, keys)
        except (MetaError, IndexError) as err:  # (a server the config does not have: judged not placeable)
            items = [err if isinstance(err, MetaError) else MetaError(f"no server {server}")] * len(keys)
        for key, item in zip(keys, items):
            reads[key][server] = item
    return reads


def adopt(executor: "Executor", found: Sequence[FoundKey], servers: int, group_of: Callable[[Sequence[int]], int]
          ) -> list[Verdict]:
    """Judge every key read back and carry each verdict out through the executor (its records, driver and
    replicator); the verdicts, each logged with why."""
    coherence: AdoptionCoherence = executor.coherence
    reads = read_items(executor, found)
    verdicts = [judge(key, reads[key.key], servers) for key in found]
    now = executor.clock()
    kept: dict[bytes, HotKey] = {}
    for key, verdict in zip(found, verdicts):
        if verdict.treatment is Treatment.REBUILT:
            continue
        home = reads[key.key].get(key.home)
        item = home if isinstance(home, StoredItem) else None
        hot = HotKey.found(_placement(key, group_of), set(verdict.holding), item.cas if item else None,
                           digest(item), now, coherence.expiry(item.ttl) if item else None)
        for server in verdict.holding - {key.home}:  # later updates of these copies are conditional on them
            if isinstance(copy := reads[key.key].get(server), StoredItem):
                executor.replicator.adopt_copy(key.key, server, copy.cas)
        kept[key.key] = hot
    _rebuild(executor, [v for v in verdicts if v.treatment is Treatment.REBUILT])
    settle = _keep(executor, coherence, found, verdicts, kept, reads)
    coherence.settle([k for k in settle if k in executor.hot and executor.hot[k].installed])
    for verdict in verdicts:
        executor.decide(Decision.RECONCILE if verdict.treatment is Treatment.REBUILT else Decision.ADOPT,
                        verdict.key, _reason(verdict), why=verdict.why)
    return verdicts


def came_back(executor: "Executor", found: Sequence[FoundKey], lost: Sequence[bytes] | None, servers: int,
              group_of: Callable[[Sequence[int]], int]) -> list[Verdict]:
    """The switches' keys read back (at start, or from a switch that came back holding them: a switch agent whose
    controller's stream dropped) adopted as a new leader adopts them, the records this core had of them replaced;
    `lost` (None: every key held and not found) installed again, and the keys rebuilt forgotten (the plan warms them
    again)."""
    held = {key.key for key in found}
    lost = [k for k in executor.hot if k not in held] if lost is None else [k for k in lost if k not in held]
    for key in held & set(executor.hot):
        executor.guard.cancel(key, RetryKind.RULES, RetryKind.SETTLE, RetryKind.INSTALL)
    verdicts = adopt(executor, found, servers, group_of) if found else []
    for verdict in verdicts:
        if verdict.treatment is Treatment.REBUILT and executor.hot.pop(verdict.key, None) is not None:
            executor.guard.cancel(verdict.key, RetryKind.REFILL, RetryKind.RULES, RetryKind.SETTLE, RetryKind.INSTALL,
                                  RetryKind.COOL)
    if lost:
        executor.replay(lost)
    return verdicts


def _keep(executor: "Executor", coherence: AdoptionCoherence, found: Sequence[FoundKey], verdicts: Sequence[Verdict],
          kept: dict[bytes, HotKey], reads: Mapping[bytes, Mapping[int, Read]]) -> list[bytes]:
    """The records of the keys kept, in the executor: clean ones as they are, the others held dirty (their copies made
    again where not trusted). Returns the keys to settle."""
    settle = []
    for key, verdict in zip(found, verdicts):
        hot = kept.get(key.key)
        if hot is None:
            continue
        if verdict.treatment is Treatment.RESYNCED:
            try:
                executor.driver.set_dirty(key.key)
            except DriverError as err:  # its gets may reach a copy not trusted: its rules go instead
                _rebuild(executor, [Verdict(key.key, Treatment.REBUILT, verdict.why, frozenset(), verdict.servers,
                                            remove_rules=True)])
                hot.move(HotKeyState.REMOVED)
                executor.decide(Decision.ERROR, key.key, f"not held dirty ({err}): its rules removed instead, the "
                                                         f"plan warms it again")
                continue
        if verdict.treatment is Treatment.KEPT_CLEAN:
            hot.move(HotKeyState.CLEAN, key.synced)
        else:
            hot.move(HotKeyState.DIRTY)
            settle.append(key.key)
        executor.hot[key.key] = hot
        if verdict.treatment is not Treatment.KEPT_CLEAN:  # every replica with weight made to hold the home's item
            hot.holding |= {r.server for r in key.replicas if r.weight > 0}
            home = reads[key.key].get(key.home)
            if isinstance(home, MetaError):  # pushed by its first settle that reads the home: a CAS no item has
                hot.synced_cas = UNKNOWN_CAS  # never matches, not even an absent item's (None)
            else:
                coherence.push(key.key, hot, home)
        for server in set(key.servers) - hot.holding:  # a replica at weight 0 without the item: refilled
            executor.guard.schedule(RetryKind.REFILL, key.key, server, "found without the home's item")
    coherence.rearm_homes({executor.hot[k].placement.home for k in kept if k in executor.hot})
    return settle + _written_since(executor, [k for k in kept if k in executor.hot and not executor.hot[k].dirty])


def _written_since(executor: "Executor", clean: list[bytes]) -> list[bytes]:
    """Keys kept clean that the data plane counted a write or an unsure request for since they were read back:
    dirty there now (their copies on the way, or lost), so settled again."""
    try:
        stamps = executor.driver.write_stamps(clean) if clean else {}
    except DriverError as err:
        log.info("stamps of the %d keys kept clean not read (%s): each checked on its own", len(clean), err)
        for key in clean:
            executor.guard.schedule(RetryKind.SETTLE, key, KEY_LEVEL, str(err))
        return []
    moved = [key for key, stamp in stamps.items() if stamp.counts != executor.hot[key].cleared.counts]
    for key in moved:
        executor.hot[key].move(HotKeyState.DIRTY)
    return moved


def _rebuild(executor: "Executor", verdicts: Sequence[Verdict]) -> None:
    """Rules out (where the driver left them), then the extra copies deleted; the plan warms the key again."""
    remove = [v.key for v in verdicts if v.remove_rules]
    refused = executor.driver.remove_hot_keys(remove) if remove else {}
    for verdict in verdicts:
        if verdict.key in refused:
            executor.decide(Decision.ERROR, verdict.key, f"read back not placeable, its rules not removed: "
                                                         f"{refused[verdict.key]}; its gets may be balanced until "
                                                         f"they are")
    for verdict in verdicts:
        if verdict.key not in refused:
            executor.delete_copies_later(verdict.key, [s for s in verdict.servers[1:]
                                                       if s < len(executor.replicator.clients)])


def _placement(key: FoundKey, group_of: Callable[[Sequence[int]], int]) -> Placement:
    total = sum(r.weight for r in key.replicas)
    weights = tuple(r.weight / total for r in key.replicas) if total > 0 else \
        tuple(float(r.server == key.home) for r in key.replicas)
    replicas = tuple(r.server for r in key.replicas)
    return Placement(key.key, key.home, group_of(replicas), replicas, weights)


def _reason(verdict: Verdict) -> str:
    what = {Treatment.KEPT_CLEAN: "read back clean from the switches: kept as it is, its gets balanced as they were",
            Treatment.KEPT_DIRTY: "read back dirty (a write counted since its last clear): kept, its home's item "
                                  "pushed to its replicas and settled, as after a write",
            Treatment.RESYNCED: "read back, not to be trusted as it is: held dirty, its home's item copied to its "
                                "replicas again, then settled",
            Treatment.REBUILT: f"read back, its rules removed: copies on {list(verdict.servers[1:])} deleted, the "
                               f"plan warms it again"}[verdict.treatment]
    why = f" ({verdict.why.value}{': ' + verdict.detail if verdict.detail else ''})" if verdict.why else ""
    return what + why


def summary(verdicts: Sequence[Verdict]) -> str:
    """How many keys each treatment had, and why, in one line."""
    counts: dict[str, int] = {}
    for verdict in verdicts:
        name = verdict.treatment.value + (f" ({verdict.why.value})" if verdict.why else "")
        counts[name] = counts.get(name, 0) + 1
    return ", ".join(f"{n} {name}" for name, n in sorted(counts.items())) or "none"
