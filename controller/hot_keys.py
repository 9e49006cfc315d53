"""A hot key's record as the executor keeps it, and the state that record puts it in."""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Callable

from controller.planner import Placement
from dataplanes.driver import ReplicaWeight, WriteStamp

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
    synced_expiry: float | None = None  # when the copies' item expires at its home, on the core's clock (None: never)
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
