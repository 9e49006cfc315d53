"""The monitor's view of its switch (monitor/follow.py), with the pins played by a stand-in: every row of the
transition table, the lines it says, the maps it swaps in. tests/test_monitor_follows_switch.py runs the real
switch, controller and monitor."""
from __future__ import annotations

import itertools

import pytest

from monitor import follow
from monitor.follow import TRANSITIONS, Seen, SwitchFollower, SwitchState


class PinnedTables:
    """Stands in for dataplanes.bpf.tables.Tables: `current` says whether the pins still lead to these maps."""
    opened: list["PinnedTables"] = []

    def __init__(self, pin_dir):
        self.pin_dir, self.is_current, self.closed = pin_dir, True, False
        PinnedTables.opened.append(self)

    def current(self) -> bool:
        return self.is_current and not self.closed

    def close(self) -> None:
        self.closed = True


class Switch:
    """The pins of one switch under tmp_path, and a monitor following them on a clock the test moves."""

    def __init__(self, tmp_path, monkeypatch, grace: float = 10.0):
        PinnedTables.opened = []
        monkeypatch.setattr(follow, "Tables", PinnedTables)
        self.pins = tmp_path / "sw1"
        self.pins.mkdir()
        (self.pins / "prog").touch()
        self.now = 0.0
        self.follower = SwitchFollower("sw1", PinnedTables(self.pins), grace, clock=lambda: self.now)

    def detach(self) -> None:
        (self.pins / "prog").unlink()
        for tables in PinnedTables.opened:
            tables.is_current = False

    def attach(self) -> None:
        (self.pins / "prog").touch()


def test_the_table_covers_every_state_but_lost_for_every_look_it_can_make():
    looks = {(state, seen) for state, seen in itertools.product(SwitchState, Seen)
             if state is not SwitchState.LOST and (seen is not Seen.EXPIRED or state is SwitchState.GONE)}
    assert set(TRANSITIONS) == looks
    assert {to for (_, seen), to in TRANSITIONS.items() if seen is Seen.NEW} == {SwitchState.REATTACHED}
    assert [key for key, to in TRANSITIONS.items() if to is SwitchState.LOST] == [(SwitchState.GONE, Seen.EXPIRED)]


def test_detach_then_attach_reopens_the_new_maps_and_says_each_change_once(tmp_path, monkeypatch):
    switch = Switch(tmp_path, monkeypatch)
    first = switch.follower.tables
    assert switch.follower.look() is SwitchState.ATTACHED and switch.follower.said == ""
    switch.detach()
    assert switch.follower.look() is SwitchState.GONE and switch.follower.said.startswith("switch sw1 gone:")
    switch.now = 5.0
    assert switch.follower.look() is SwitchState.GONE and switch.follower.said == ""  # said once
    switch.attach()
    assert switch.follower.look() is SwitchState.REATTACHED
    assert switch.follower.said.startswith("switch sw1 reattached:")
    assert first.closed and switch.follower.tables is PinnedTables.opened[-1] and not switch.follower.tables.closed
    assert switch.follower.look() is SwitchState.ATTACHED and switch.follower.said == ""


def test_a_reload_within_one_interval_is_a_reattach_without_gone(tmp_path, monkeypatch):
    switch = Switch(tmp_path, monkeypatch)
    switch.detach()
    switch.attach()  # both between two looks: `systemctl restart mbalancer-switch`
    assert switch.follower.look() is SwitchState.REATTACHED and len(PinnedTables.opened) == 2


def test_maps_pinned_before_the_program_are_not_opened_yet(tmp_path, monkeypatch):
    switch = Switch(tmp_path, monkeypatch)
    switch.detach()  # a loader pins the maps first: no prog yet
    assert switch.follower.look() is SwitchState.GONE and len(PinnedTables.opened) == 1


def test_a_switch_gone_past_the_grace_is_lost_for_good(tmp_path, monkeypatch):
    switch = Switch(tmp_path, monkeypatch, grace=3.0)
    switch.now = 100.0
    switch.detach()
    assert switch.follower.look() is SwitchState.GONE and "exit 1 if it is not back within 3 s" in \
        switch.follower.said
    switch.now = 102.9
    assert switch.follower.look() is SwitchState.GONE
    switch.now = 103.0
    assert switch.follower.look() is SwitchState.LOST
    assert switch.follower.said == "switch sw1 lost: gone for 3 s; exit 1 (under systemd, Restart=on-failure starts " \
                                   "the monitor again)"
    switch.attach()
    assert switch.follower.look() is SwitchState.LOST and switch.follower.said == ""  # the monitor is exiting


def test_a_switch_gone_again_restarts_its_grace(tmp_path, monkeypatch):
    switch = Switch(tmp_path, monkeypatch, grace=3.0)
    switch.detach()
    switch.follower.look()
    switch.now = 2.0
    switch.attach()
    assert switch.follower.look() is SwitchState.REATTACHED
    switch.detach()
    switch.now = 4.0
    assert switch.follower.look() is SwitchState.GONE  # gone since 4, not since 0
    switch.now = 6.9
    assert switch.follower.look() is SwitchState.GONE


@pytest.mark.parametrize("grace", ["0", "-1", "nan"])
def test_a_grace_that_is_not_positive_is_refused_in_one_line(run_cli, grace):
    result = run_cli("monitor", "--source", "dataplane", "--switch-grace", grace)
    assert result.returncode == 2 and "--switch-grace must be positive" in result.stderr
    assert "Traceback" not in result.stderr
