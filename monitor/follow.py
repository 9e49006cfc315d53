"""The monitor follows its eBPF switch (or key classifier): `mbalancer switch detach` then `attach`, a switch
restart or a reload pins a new program's maps under the same name, while the maps this monitor holds open live on
with no packet counted in them. Read on, they would report 0 gets forever and the switch's sketch would stay off
(issue 50). So before each interval's read the monitor looks where the pins lead now, and its view of the switch
moves through SwitchState by one small table: attached (the pins lead to the maps held here), gone (nothing is
pinned: no report is pushed, so the controller keeps its hot keys for the switch's return rather than cooling them
on zeros), reattached (a new program: its maps opened, the sketch turned on in them) or lost (gone past the grace:
the monitor exits 1, for systemd's Restart=on-failure to start it again). Each change is said in one line.
"""
from __future__ import annotations

import enum
import time
from pathlib import Path
from typing import Callable

from dataplanes.bpf.tables import Tables

GRACE = 10.0  # s a gone switch may stay away before the monitor gives up (a `systemctl restart` takes 1-2 s)


class SwitchState(enum.Enum):
    ATTACHED = "attached"  # the pins lead to the maps this monitor reads
    GONE = "gone"  # nothing pinned under the switch's name: detached, or half way through being attached again
    REATTACHED = "reattached"  # pinned again with new maps, now opened here; attached from the next look on
    LOST = "lost"  # gone for longer than the grace: the monitor exits 1


class Seen(enum.Enum):
    """What one look at the pins found."""
    SAME = "same"  # the maps held here
    ABSENT = "absent"  # no program pinned (its maps may be pinned already: it is being loaded)
    NEW = "new"  # another program's maps, opened
    EXPIRED = "expired"  # absent, and gone since longer than the grace


TRANSITIONS: dict[tuple[SwitchState, Seen], SwitchState] = {
    (SwitchState.ATTACHED, Seen.SAME): SwitchState.ATTACHED,
    (SwitchState.ATTACHED, Seen.ABSENT): SwitchState.GONE,
    (SwitchState.ATTACHED, Seen.NEW): SwitchState.REATTACHED,  # reloaded within one interval
    (SwitchState.GONE, Seen.SAME): SwitchState.ATTACHED,  # our own maps pinned back (by hand): nothing was lost
    (SwitchState.GONE, Seen.ABSENT): SwitchState.GONE,
    (SwitchState.GONE, Seen.NEW): SwitchState.REATTACHED,
    (SwitchState.GONE, Seen.EXPIRED): SwitchState.LOST,
    (SwitchState.REATTACHED, Seen.SAME): SwitchState.ATTACHED,
    (SwitchState.REATTACHED, Seen.ABSENT): SwitchState.GONE,
    (SwitchState.REATTACHED, Seen.NEW): SwitchState.REATTACHED,
}


class SwitchFollower:
    """The monitor's view of one switch, from its pins; `tables` are the maps to read (new ones after a reattach)."""

    def __init__(self, name: str, tables: Tables, grace: float = GRACE, clock: Callable[[], float] = time.monotonic):
        self.name, self.tables, self.grace, self.clock = name, tables, grace, clock
        self.pin_dir = Path(tables.pin_dir)
        self.state = SwitchState.ATTACHED
        self.gone_since = 0.0
        self.said = ""  # the line that says the last look's change of state ("" if none)

    def look(self) -> SwitchState:
        """Look at the pins once and move to the state the table gives; LOST stays LOST."""
        if self.state is SwitchState.LOST:
            self.said = ""
            return self.state
        seen, opened = self._observe()
        if seen is Seen.ABSENT and self.state is SwitchState.GONE and self.clock() - self.gone_since >= self.grace:
            seen = Seen.EXPIRED
        before, self.state = self.state, TRANSITIONS[(self.state, seen)]
        if opened is not None:  # NEW: whatever the state came from, the new maps are the ones to read
            self.tables.close()
            self.tables = opened
        if self.state is SwitchState.GONE and before is not SwitchState.GONE:
            self.gone_since = self.clock()
        self.said = self._line(before)
        return self.state

    def _observe(self) -> tuple[Seen, Tables | None]:
        if self.tables.current():
            return Seen.SAME, None
        if not (self.pin_dir / "prog").exists():  # a loader pins the maps first, the program last
            return Seen.ABSENT, None
        try:
            return Seen.NEW, Tables(self.pin_dir)
        except OSError:  # detached again while being opened: the next look sees where it went
            return Seen.ABSENT, None

    def _line(self, before: SwitchState) -> str:
        """The one line that says what this look changed, "" if nothing did."""
        name, state = self.name, self.state
        if state is SwitchState.GONE and before is not SwitchState.GONE:
            return (f"switch {name} gone: no program pinned at {self.pin_dir} (detached, restarting or reloading); "
                    f"no report until it is back, exit 1 if it is not back within {self.grace:g} s")
        if state is SwitchState.REATTACHED:
            return f"switch {name} reattached: its pins lead to a new program's maps, opened; the sketch is read again"
        if state is SwitchState.LOST:
            return (f"switch {name} lost: gone for {self.grace:g} s; exit 1 (under systemd, Restart=on-failure "
                    f"starts the monitor again)")
        if state is SwitchState.ATTACHED and before is SwitchState.GONE:
            return f"switch {name} attached: its pins lead back to the maps read here"
        return ""
