"""What the core's worker is handed, typed: one dataclass per kind of event on its queue, and the health changes
it handles even in the middle of a batch (controller/core.py says who queues each and in what order it is handled)."""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from mbalancer.monitor_report import MonitorReport


class ServerChange(str, Enum):
    """A change of a server's standing (a str: the health tracker's verdicts read as they always did)."""
    DOWN = "down"  # its probes kept failing for the hold time
    UP = "up"  # its probes kept passing as long
    RESTARTED = "restarted"  # it answers, but restarted or was flushed: its copies are gone
    MAC_WRONG = "mac-wrong"  # the switch saw it with another MAC than the configured one

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Report:
    """A monitor report, parsed, and when it came (the core's clock)."""
    report: MonitorReport
    received: float


@dataclass(frozen=True)
class Mirror:
    """A packet the data plane copied to the controller (a whole Ethernet frame), and when it came."""
    frame: bytes
    received: float


@dataclass(frozen=True)
class Closed:
    """The data plane counted a close of the server that no copy told of (read with a health probe)."""
    server: int


@dataclass(frozen=True)
class Reconnect:
    """The driver's switch came back: empty (found None), every hot key installed again; or holding `found` (read
    back: adopted) without `lost` (installed again; None: every hot key not found)."""
    found: tuple | None = None
    lost: tuple | None = None


@dataclass(frozen=True)
class Wake:
    """A health change waits in the urgent queue."""


@dataclass(frozen=True)
class Stop:
    """The worker ends after this batch."""


Event = Report | Mirror | Closed | Reconnect | Wake | Stop


@dataclass(frozen=True)
class HealthChange:
    """A server's change, handled before anything queued (and between two keys' syncs)."""
    server: int
    change: ServerChange
    error: str | None
