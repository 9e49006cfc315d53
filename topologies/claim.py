"""One MBalancer network per machine, and nothing left behind by a killed one.

Both networks this package builds (the Mininet testbed, the namespace network) put the controller's port at
10.0.0.254 and their switches' ports in the root namespace, so two at once would collide. A network holds a claim
for its life: an exclusive flock on /run/mbalancer/network.lock, plus a record, written before anything is made,
of what it is about to make in the root namespace (interfaces, named namespaces, switches with pinned programs).
release() empties the record. The kernel drops the lock when its process dies, so a run killed with SIGKILL
leaves a record and no holder: the next claim removes exactly what is listed, says so, and goes on.
"""
from __future__ import annotations

import fcntl
import logging
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from dataplanes import registry
from mbalancer.interfaces import NETNS_NAMES, interface_exists
from mbalancer.lock_records import read_record, write_record
from topologies.shapes import TopologyError

log = logging.getLogger(__name__)

CLAIM_DIR = Path("/run/mbalancer")
# Seconds to wait for another network to go before refusing (default: refuse at once). For suites run side by side
# on one machine: each waits its turn instead of failing.
WAIT_ENV = "MBALANCER_NETWORK_WAIT"


@dataclass
class Made:
    """What a network makes in the root namespace (all of it goes when it closes)."""
    interfaces: list[str] = field(default_factory=list)
    namespaces: list[str] = field(default_factory=list)
    # switches: whatever a data plane makes named after a switch (pins, mirror links, a private Open vSwitch, a bmv2
    # process): each kind's leftovers hook in the registry removes its own
    switches: list[str] = field(default_factory=list)

    def remove(self) -> list[str]:
        """Delete whatever of it still exists; the names of what was there."""
        removed = [what for switch in self.switches for what in registry.remove_left_over(switch)]
        for iface in self.interfaces:
            if interface_exists(iface):
                subprocess.run(["ip", "link", "del", iface], capture_output=True)
                removed.append(iface)
        for ns in self.namespaces:
            if (NETNS_NAMES / ns).exists():
                subprocess.run(["ip", "netns", "del", ns], capture_output=True)
                removed.append(f"namespace {ns}")
        return removed


class NetworkClaim:
    """with NetworkClaim("testbed") as claim: claim.record(Made(...)); build ...  (released at exit)."""

    def __init__(self, owner: str, directory: Path = CLAIM_DIR):
        self.owner = owner
        self.path = directory / "network.lock"
        self._fd: int | None = None

    def take(self) -> "NetworkClaim":
        wait = _wait_seconds()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        if not _lock_within(fd, wait):
            holder = read_record(fd).get("pid", "?")
            os.close(fd)
            raise TopologyError(f"another MBalancer network is running on this machine (pid {holder}, "
                                f"{self.path}): one at a time, they share 10.0.0.254") from None
        self._fd = fd
        self._clean_after_a_killed_run()
        return self

    def record(self, made: Made) -> None:
        """Written before building, so a kill at any point leaves the names for the next claim."""
        self._write({"pid": os.getpid(), "owner": self.owner, "made": made.__dict__})

    def release(self) -> None:
        if self._fd is None:
            return
        self._write({})
        os.close(self._fd)  # the lock goes with the descriptor
        self._fd = None

    def _clean_after_a_killed_run(self) -> None:
        left = read_record(self._fd)
        if not left.get("made"):
            return
        made = left["made"] if isinstance(left["made"], dict) else {}
        removed = Made(**{name: list(made.get(name, [])) for name in Made.__dataclass_fields__}).remove()
        if removed:
            log.warning("removed what a killed %s run (pid %s) left: %s", left.get("owner", "?"),
                        left.get("pid", "?"), ", ".join(removed))
        self._write({})

    def _write(self, content: dict) -> None:
        write_record(self._fd, content)

    def __enter__(self) -> "NetworkClaim":
        return self.take()

    def __exit__(self, *exc) -> None:
        self.release()


def _wait_seconds() -> float:
    try:
        return max(float(os.environ.get(WAIT_ENV, "0")), 0.0)
    except ValueError:
        raise TopologyError(f"{WAIT_ENV}: a number of seconds (got {os.environ[WAIT_ENV]!r})") from None


def _lock_within(fd: int, wait: float) -> bool:
    """Take the lock on `fd`, trying every 0.2 s for `wait` seconds; False if another holds it all along."""
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.2)
