"""What the core decides, typed: the kinds of entry in its decision log (GET /decisions, /state), and the callback the
executor logs them through. Each kind is a str whose value is what the log's JSON has always said, so HTTP
consumers read the same strings; no logic reads an entry's reason, which is for people."""
from __future__ import annotations

from enum import Enum
from typing import Protocol

from dataplanes.driver import Distrust


class Decision(str, Enum):
    WARM = "warm"  # a key copied to its replicas and installed
    COOL = "cool"  # a key's rules removed, then its extra copies
    REWEIGHT = "reweight"  # a key's weights changed
    SKIP = "skip"  # a warm not done now (nothing to copy, no replica took it, the driver refused its rules)
    REFILL = "refill"  # a replica holds the value again and has its weight back
    REPLAY = "replay"  # the switch came back empty: every hot key installed again
    EXPIRE = "expire"  # a key held dirty until its home has expired its item
    GIVE_UP = "give-up"  # a retry past its limit
    ERROR = "error"  # what the controller could not do, and how gets are kept safe meanwhile
    ADOPT = "adopt"  # a hot key read back from the switches by a controller that took over, kept (clean or dirty)
    RECONCILE = "reconcile"  # a hot key read back from the switches that could not be kept: rules out, copies deleted
    HOME = "home"  # a key's gets go to another server than the configured hash says
    HOLD = "hold"  # a plan's warms and load-driven reweights held back (do no harm), or a cool until counted
    SERVER_DOWN = "server-down"
    SERVER_UP = "server-up"
    SERVER_RESTARTED = "server-restarted"
    SERVER_MAC = "server-mac"  # a server's configured MAC is not the one the switch saw
    SERVER_CLOSED = "server-closed"  # a server closed the controller's connection (it may have restarted)

    def __str__(self) -> str:
        return self.value


# Decisions an operator must hear about without -v: a server lost or back, and what the controller could not do.
WARNED = frozenset({Decision.SERVER_DOWN, Decision.SERVER_UP, Decision.SERVER_RESTARTED, Decision.SERVER_MAC,
                    Decision.ERROR})


class Decide(Protocol):
    """The decision log: what, for which key, why in words; `why`: a key read back that was not kept as it was
    (controller/adoption.py)."""

    def __call__(self, action: Decision, key: bytes | None, reason: str, why: Distrust | None = None) -> None: ...
