"""A hot key's record as the executor keeps it, and the state machine that record moves through.

Every change of a key's state goes through `HotKey.move`, which checks it against TRANSITIONS: the one table of
what may follow what (docs/architecture.md shows it, generated from here: `python -m controller.hot_keys
docs/architecture.md`, checked by tests/test_hot_key_states.py).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from controller.planner import Placement
from dataplanes.driver import ReplicaWeight, WriteStamp


class HotKeyState(str, Enum):
    """Where a hot key stands, as the executor knows it (a str: GET /state shows the value)."""
    COPIED = "copied"  # its value copied to the replicas, its rules not yet in the switch (not in the executor's keys)
    FOUND = "found"  # read back from the switches by a controller that took over, not judged yet (adoption.py)
    NOT_INSTALLED = "not-installed"  # its rules are not in the switch (a reinstall is pending): gets go home
    DIRTY = "dirty"  # installed; gets go home until the copies are known to match the home
    CLEAN = "clean"  # installed and cleared to a write stamp: gets are balanced over the replicas
    REMOVED = "removed"  # cooled (rules, then extra copies gone) or its first install refused: the record is dropped


class Stamp(Enum):
    """What a transition does to the write stamp the key was last cleared to (which `_check` and the poll compare
    with the data plane's counts to tell whether a write was counted since)."""
    SET = "set"  # to the stamp the key is cleared to
    FORGET = "forgotten"  # a write counted since, or held dirty: the next check settles it again
    KEEP = "kept"


@dataclass(frozen=True)
class Transition:
    event: str  # a short name, the diagram's label: for the docs, never read by logic
    cause: str  # what moves a key this way, in full: for the docs too
    stamp: Stamp


S = HotKeyState
# The one table of a hot key's life: (from, to) -> why, and what it does to the stamp. Any other move raises.
TRANSITIONS: dict[tuple[HotKeyState, HotKeyState], Transition] = {
    (S.COPIED, S.DIRTY): Transition(
        "install", "installed in the switch with the plan's other warming keys, dirty: gets go home", Stamp.KEEP),
    (S.COPIED, S.REMOVED): Transition(
        "install refused", "the driver refused its rules: its copies deleted, tried again after a back-off",
        Stamp.KEEP),
    (S.DIRTY, S.CLEAN): Transition(
        "clear", "cleared to a write stamp: the home's CAS and expiry are the copies', and the copy of every write "
        "the stamp counts was handled", Stamp.SET),
    (S.CLEAN, S.CLEAN): Transition(
        "clear", "cleared again, to a newer stamp (a settle retried after another one cleared it)", Stamp.SET),
    (S.CLEAN, S.DIRTY): Transition(
        "held dirty", "a write or unsure request counted, a change found at its home, weights not written, its item "
        "about to expire, or a clear that did not hold", Stamp.FORGET),
    (S.DIRTY, S.DIRTY): Transition("held dirty", "the same while dirty", Stamp.FORGET),
    (S.DIRTY, S.NOT_INSTALLED): Transition(
        "rules lost", "the switch came back empty, or holding the key dirty was refused and its rules were removed",
        Stamp.KEEP),
    (S.CLEAN, S.NOT_INSTALLED): Transition("rules lost", "the same from clean", Stamp.KEEP),
    (S.NOT_INSTALLED, S.NOT_INSTALLED): Transition(
        "write copied", "the copy of a write to it handled while its rules are out", Stamp.FORGET),
    (S.NOT_INSTALLED, S.DIRTY): Transition("reinstall", "its rules installed again, dirty, then settled", Stamp.KEEP),
    (S.DIRTY, S.REMOVED): Transition(
        "cool", "cooled: its rules removed, its extra copies deleted once gets on their way are answered", Stamp.KEEP),
    (S.CLEAN, S.REMOVED): Transition("cool", "the same from clean", Stamp.KEEP),
    (S.NOT_INSTALLED, S.REMOVED): Transition(
        "cool", "cooled: no rules to remove, its extra copies deleted once gets on their way are answered", Stamp.KEEP),
    (S.FOUND, S.CLEAN): Transition(
        "adopt", "clean in every switch that holds it, its lease live, every replica with weight holding its home's "
        "item: kept as it is, cleared to the counts the switches synced it to", Stamp.SET),
    (S.FOUND, S.DIRTY): Transition(
        "adopt dirty", "dirty in a switch (a write counted since its last clear), or not to be trusted as it is (its "
        "lease ran out, a replica's copy missing or not the home's): held dirty, the home's item copied again, then "
        "settled", Stamp.KEEP),
    (S.FOUND, S.REMOVED): Transition(
        "rebuild", "its rules removed as it was read back (the switches disagree, it names servers the config does "
        "not have, or the data plane cannot read it back): its extra copies deleted once gets on their way are "
        "answered, the plan warms it again",
        Stamp.KEEP),
}
del S
# A record is made copied (a warm), or found (a takeover: HotKey.found), and dropped once removed.
INITIAL, FOUND, FINAL = HotKeyState.COPIED, HotKeyState.FOUND, HotKeyState.REMOVED
INITIALS = (INITIAL, FOUND)


class IllegalTransition(RuntimeError):
    """A move that TRANSITIONS does not allow: a bug in the executor, never a condition of the network."""

    def __init__(self, current: HotKeyState, to: HotKeyState):
        super().__init__(f"a hot key cannot go from {current.value} to {to.value} (controller/hot_keys.py, "
                         f"TRANSITIONS)")
        self.current, self.to = current, to


@dataclass
class HotKey:
    placement: Placement
    holding: set[int]  # servers known to hold the home's current item (the home included)
    synced_cas: int | None  # the home's CAS the copies were made from (None: the key is absent everywhere)
    synced_digest: bytes | None  # what the copies hold (value and flags), to tell a moved item from a write
    since: float
    synced_expiry: float | None = None  # when the copies' item expires at its home, on the core's clock (None: never)
    syncs: int = 0
    last_sync_ms: float | None = None
    unsynced_since: float | None = None  # when the oldest mirrored write not yet synced was received
    mirrored: int = 0  # copies of writes to the key handled here since install (the data plane counts the same)
    missing_since: float | None = None  # since when copies counted by the data plane are awaited, with none coming
    # Changed by `move` alone (read through the properties below):
    _state: HotKeyState = field(default=INITIAL, init=False)
    _cleared: WriteStamp | None = field(default=None, init=False)  # None: a write counted, or held dirty, since

    @classmethod
    def found(cls, placement: Placement, holding: set[int], synced_cas: int | None, synced_digest: bytes | None,
              since: float, synced_expiry: float | None = None) -> "HotKey":
        """The record of a key read back from the switches (controller/adoption.py), in state found."""
        hot = cls(placement, holding, synced_cas, synced_digest, since, synced_expiry)
        hot._state = HotKeyState.FOUND
        return hot

    def move(self, to: HotKeyState, stamp: WriteStamp | None = None) -> None:
        """The one way the key changes state, checked against TRANSITIONS (raises IllegalTransition); `stamp`: the
        write stamp it is cleared to, given when (and only when) it goes clean."""
        transition = TRANSITIONS.get((self._state, to))
        if transition is None:
            raise IllegalTransition(self._state, to)
        if (stamp is not None) != (transition.stamp is Stamp.SET):
            raise ValueError(f"{self._state.value} -> {to.value}: a stamp is given exactly when a key is cleared")
        self._state = to
        if transition.stamp is not Stamp.KEEP:
            self._cleared = stamp

    @property
    def state(self) -> HotKeyState:
        return self._state

    @property
    def cleared(self) -> WriteStamp | None:
        """The stamp the key was last cleared to (None: a write counted, or held dirty, since)."""
        return self._cleared

    @property
    def installed(self) -> bool:
        """The switch holds the key's rules."""
        return self._state in (HotKeyState.DIRTY, HotKeyState.CLEAN)

    @property
    def dirty(self) -> bool:
        """Gets for it go home, as far as the core knows (the data plane may hold it dirty sooner)."""
        return self._state is not HotKeyState.CLEAN

    def weights(self) -> tuple[ReplicaWeight, ...]:
        """The placement's weights with replicas that do not hold the value at 0 (all at home if none does)."""
        p = self.placement
        kept = [w if s in self.holding else 0.0 for s, w in zip(p.replicas, p.weights)]
        total = sum(kept)
        if total <= 0:
            kept, total = [1.0 if s == p.home else 0.0 for s in p.replicas], 1.0
        return tuple(ReplicaWeight(s, w / total) for s, w in zip(p.replicas, kept))


# --- the table as docs/architecture.md shows it -------------------------------------------------------------------
DOC_BEGIN = "<!-- hot-key states: generated from TRANSITIONS by `python -m controller.hot_keys FILE` -->"
DOC_END = "<!-- end of the hot-key states -->"


def transitions_markdown() -> str:
    """The state diagram (Mermaid) and the transition table, both from TRANSITIONS."""
    diagram = ["```mermaid", "stateDiagram-v2"]
    diagram += [f'    state "{s.value}" as {s.name}' for s in HotKeyState]
    diagram += [f"    [*] --> {initial.name}" for initial in INITIALS]
    diagram += [f"    {a.name} --> {b.name}: {t.event}" for (a, b), t in TRANSITIONS.items()]
    diagram += [f"    {FINAL.name} --> [*]", "```"]
    table = ["| from | to | event | when | its write stamp |", "|---|---|---|---|---|"]
    table += [f"| {a.value} | {b.value} | {t.event} | {t.cause} | {t.stamp.value} |"
              for (a, b), t in TRANSITIONS.items()]
    return "\n".join([DOC_BEGIN, *diagram, "", *table, DOC_END])


def rewrite_doc(path: Path) -> bool:
    """Put the generated diagram and table between the markers of the doc at `path`; True if it changed."""
    text = path.read_text()
    head, rest = text.split(DOC_BEGIN, 1)
    tail = rest.split(DOC_END, 1)[1]
    new = head + transitions_markdown() + tail
    if new == text:
        return False
    path.write_text(new)
    return True


if __name__ == "__main__":
    for name in sys.argv[1:]:
        print(f"{name}: {'rewritten' if rewrite_doc(Path(name)) else 'already current'}")
