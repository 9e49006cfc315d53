"""Does every server have the MAC its config entry gives it? (issue 50)

A get the switch balances leaves with the configured MAC of the server it was balanced to: a wrong one, however
valid it looks, sends the get nowhere (the switch floods it, every host drops it), while the health probes, which
find the server through the kernel's ARP, still pass. The driver reports what its switches saw of each server
(dataplanes/driver.py MacSighting): the MACs the server's TCP segments came from, and the gets balanced to it that
were flooded because no switch knew where its configured MAC is. `verdict` compares that with the config, a pure
function; `MacWatch` keeps the latest verdicts and the servers found wrong, which the core takes out of every
replica set (weight 0, as a down server) for as long as it runs: the entry must be fixed and the controller
restarted (the switch forgets what it saw of a server whenever a controller writes its entry).
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, Sequence

from dataplanes.driver import MacSighting
from mbalancer.settings import Server


class MacStatus(Enum):
    UNSEEN = "not seen yet"  # no TCP segment of it passed a switch, no get to it was flooded
    OK = "ok"  # seen with the configured MAC
    MISMATCH = "mismatch"  # seen with another MAC: gets rewritten to the configured one are lost
    FLOODED = "flooded"  # gets to it flooded, and no switch saw the configured MAC: they are likely lost (out once
    # they go on being flooded from one check to the next)
    UNSUPPORTED = "not supported by this data plane"  # P4: the switch does not say


@dataclass(frozen=True)
class MacVerdict:
    status: MacStatus
    configured: str
    seen: tuple[str, ...] = ()
    flooded: int = 0

    def describe(self, index: int, name: str) -> str:
        """One line naming both MACs, for the decision log."""
        seen = ", ".join(self.seen) or "none"
        why = ("the switch saw its packets come from another MAC" if self.status is MacStatus.MISMATCH
               else f"{self.flooded} gets balanced to it were flooded: no switch knows where that MAC is")
        return (f"server {index} ({name}): configured mac {self.configured}, seen {seen}: {why}; weight 0 in every "
                f"replica set until its [[servers]] mac is fixed and the controller restarted")

    def as_state(self) -> dict[str, Any]:
        return {"status": self.status.value, "configured": self.configured, "seen": list(self.seen),
                "flooded_gets": self.flooded}


def verdict(configured: str, sighting: MacSighting | None) -> MacVerdict:
    """Compare a server's configured MAC with what the switches saw (None: the data plane cannot tell)."""
    configured = configured.lower()
    if sighting is None:
        return MacVerdict(MacStatus.UNSUPPORTED, configured)
    seen = tuple(mac.lower() for mac in sighting.seen)
    if any(mac != configured for mac in seen):
        status = MacStatus.MISMATCH
    elif seen:
        status = MacStatus.OK  # the floods reached it anyway: flooding delivers to its port too
    else:
        status = MacStatus.FLOODED if sighting.flooded else MacStatus.UNSEEN
    return MacVerdict(status, configured, seen, sighting.flooded)


def verdicts(servers: Sequence[Server], sightings: Sequence[MacSighting] | None) -> list[MacVerdict]:
    if sightings is not None and len(sightings) != len(servers):
        raise ValueError(f"{len(sightings)} servers' MACs reported for {len(servers)} servers")
    return [verdict(server.mac, None if sightings is None else sightings[i]) for i, server in enumerate(servers)]


def _confirmed(now: MacVerdict, before: MacVerdict) -> bool:
    """Whether a verdict takes the server out: a MAC seen wrong at once; gets flooded to a server never seen only
    if they went on being flooded since the check before. A switch that has not learned the server's MAC yet (just
    attached, restarted) floods a few of its gets until the server's first frame through it; a wrong MAC floods
    every get balanced to it."""
    if now.status is MacStatus.MISMATCH:
        return True
    return now.status is MacStatus.FLOODED and before.status is MacStatus.FLOODED and now.flooded > before.flooded


class MacWatch:
    """The latest verdicts and the servers found wrong (kept for good). Updated by one thread (the core's counters
    thread), read by any: both are replaced whole, never changed in place."""

    def __init__(self, servers: Sequence[Server]):
        self.servers = tuple(servers)
        self.latest: list[MacVerdict] = [MacVerdict(MacStatus.UNSEEN, s.mac.lower()) for s in servers]
        self.wrong: dict[int, MacVerdict] = {}  # server -> the verdict that took it out

    def update(self, sightings: Sequence[MacSighting] | None) -> dict[int, MacVerdict]:
        """Take the driver's report; returns the servers newly found wrong, with their verdicts."""
        latest = verdicts(self.servers, sightings)
        new = {i: v for i, (v, before) in enumerate(zip(latest, self.latest))
               if i not in self.wrong and _confirmed(v, before)}
        self.latest = latest
        if new:
            self.wrong = {**self.wrong, **new}
        return new

    def state(self, server: int) -> dict[str, Any]:
        """What /state shows of the server's MAC: the latest verdict, and whether it is out for its MAC (with the
        verdict that took it out)."""
        taken_out = self.wrong.get(server)
        return {**self.latest[server].as_state(),
                "out_of_rotation": None if taken_out is None else taken_out.as_state()}
