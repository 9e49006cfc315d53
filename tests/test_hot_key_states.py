"""A hot key's state machine (controller/hot_keys.py): every move in TRANSITIONS works and does to the write stamp
what the table says, every other one raises naming both states, and docs/architecture.md shows the table."""
from __future__ import annotations

import re
from collections import deque
from itertools import product
from pathlib import Path

import pytest

from controller.hot_keys import (FINAL, FOUND, INITIAL, INITIALS, TRANSITIONS, HotKey, HotKeyState,
                                 IllegalTransition, Stamp, transitions_markdown)
from controller.planner import Placement
from dataplanes.driver import WriteStamp

ROOT = Path(__file__).resolve().parent.parent
OLD, NEW = WriteStamp(1, ((1, 0),)), WriteStamp(2, ((2, 0),))


def route(to: HotKeyState, start: HotKeyState = INITIAL) -> list[HotKeyState] | None:
    """The states a record made in `start` goes through to reach `to` (shortest, by the table alone); None: never."""
    paths, todo = {start: []}, deque([start])
    while todo:
        state = todo.popleft()
        for (a, b) in TRANSITIONS:
            if a is state and b not in paths:
                paths[b] = paths[state] + [b]
                todo.append(b)
    return paths.get(to)


def record_in(state: HotKeyState) -> HotKey:
    """A record brought to `state` by allowed moves, cleared to OLD on the way if it ever was (a found one only to
    reach found)."""
    placement = Placement(b"k", 0, 0, (0, 1), (0.5, 0.5))
    if state is FOUND:
        return HotKey.found(placement, {0, 1}, 7, None, 0.0)
    hot = HotKey(placement, {0, 1}, 7, None, 0.0)
    for step in route(state):
        hot.move(step, OLD if TRANSITIONS[hot.state, step].stamp is Stamp.SET else None)
    return hot


@pytest.mark.parametrize("current,to", list(TRANSITIONS), ids=lambda s: s.value)
def test_every_allowed_transition_moves_the_key_and_its_stamp(current, to):
    hot = record_in(current)
    before = hot.cleared
    effect = TRANSITIONS[current, to].stamp
    hot.move(to, NEW if effect is Stamp.SET else None)
    assert hot.state is to
    assert hot.cleared == {Stamp.SET: NEW, Stamp.FORGET: None, Stamp.KEEP: before}[effect]
    assert hot.installed == (to in (HotKeyState.DIRTY, HotKeyState.CLEAN))
    assert hot.dirty == (to is not HotKeyState.CLEAN)


DISALLOWED = [pair for pair in product(HotKeyState, repeat=2) if pair not in TRANSITIONS]


@pytest.mark.parametrize("current,to", DISALLOWED, ids=lambda s: s.value)
def test_every_other_transition_raises_naming_both_states(current, to):
    hot = record_in(current)
    with pytest.raises(IllegalTransition, match=f"from {current.value} to {to.value}"):
        hot.move(to, NEW)
    assert hot.state is current  # refused: nothing moved


def test_a_life_begins_copied_or_found_ends_removed_and_can_always_end():
    assert HotKey(Placement(b"k", 0, 0, (0,), (1.0,)), {0}, None, None, 0.0).state is INITIAL
    assert HotKey.found(Placement(b"k", 0, 0, (0,), (1.0,)), {0}, None, None, 0.0).state is FOUND
    assert all(any(route(state, start) is not None for start in INITIALS) for state in HotKeyState)  # reachable
    assert not [pair for pair in TRANSITIONS if pair[1] is FOUND]  # found only by reading the switches back
    assert not [pair for pair in TRANSITIONS if pair[0] is FINAL]  # nothing after removed
    assert all((state, FINAL) in TRANSITIONS for state in HotKeyState if state is not FINAL)  # cool, or refused


def test_a_stamp_is_given_exactly_when_the_key_is_cleared():
    with pytest.raises(ValueError, match="stamp"):
        record_in(HotKeyState.DIRTY).move(HotKeyState.CLEAN)
    with pytest.raises(ValueError, match="stamp"):
        record_in(HotKeyState.CLEAN).move(HotKeyState.DIRTY, NEW)


def test_the_state_and_its_flags_cannot_be_set_around_the_table():
    hot = record_in(HotKeyState.DIRTY)
    for name, value in (("state", HotKeyState.CLEAN), ("dirty", False), ("installed", False), ("cleared", NEW)):
        with pytest.raises(AttributeError):
            setattr(hot, name, value)
    outside = {f"{path.relative_to(ROOT)}:{n}" for path in (ROOT / "controller").glob("*.py")
               if path.name != "hot_keys.py"
               for n, line in enumerate(path.read_text().splitlines(), 1) if re.search(r"\._(state|cleared)\b", line)}
    assert outside == set()


def test_the_architecture_shows_exactly_the_table():
    text = (ROOT / "docs" / "architecture.md").read_text()
    assert transitions_markdown() in text, "run: .venv/bin/python -m controller.hot_keys docs/architecture.md"
    values = {state.value: state for state in HotKeyState}
    rows = re.findall(r"^\| ([a-z-]+) \| ([a-z-]+) \|", text, re.M)
    assert {(values[a], values[b]) for a, b in rows if a in values} == set(TRANSITIONS)
