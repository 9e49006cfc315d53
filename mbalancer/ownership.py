"""One controller per switch: a controller owns the switches its driver drives for as long as it runs.

Two controllers writing one switch's tables undo each other's work (measured: a second controller started during
load left 3 of 10 hot keys installed and 106,559 misses in 1.0M gets). Ownership is an exclusive lock (flock) on a
file per switch under OWNERS_DIR, held by the owner's open file: the kernel drops it the moment the owner's process
ends, however it ends (kill -9 included), so nothing is left to clean up and no lease has to run out. The file
also says who holds it (pid, HTTP address, since when), for the error a second controller prints.

A second controller is refused, naming the owner; or, started with --standby, waits for the lock and takes over
the moment the owner is gone: it then attaches as any new controller does (it removes the hot keys the old owner
left, whose copies it never synced, and gets go home until it installs them again), so the handover serves
nothing stale. This guards controllers on one machine (the eBPF switch and the OpenFlow key classifier live on it;
for P4Runtime switches elsewhere, P4Runtime's own arbitration decides between machines).
"""
from __future__ import annotations

import fcntl
import logging
import os
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from mbalancer.lock_records import read_record, write_record

log = logging.getLogger(__name__)

OWNERS_DIR = Path(os.environ.get("MBALANCER_OWNERS_DIR", "/run/mbalancer/owners"))
STANDBY_POLL = 0.05  # seconds between a standby's tries for the lock: it takes over this soon after the owner ends
TAKE_TRIES = 10  # opens of a switch's owner file at most, when it is removed (released) between open and lock


class OwnershipError(OSError):
    """The owner files cannot be kept (e.g. no permission to create their folder)."""


@dataclass(frozen=True)
class Owner:
    switch: str
    pid: int | None
    listen: str
    since: str

    def describe(self) -> str:
        who = f"controller pid {self.pid}" if self.pid else "another controller"
        return f"{self.switch} is driven by {who} (http://{self.listen}, since {self.since})"


class Ownership:
    """The locks of one controller's switches (none for a driver without a switch)."""

    def __init__(self, switches: Sequence[str], listen: str, owners_dir: Path = OWNERS_DIR):
        self.switches = sorted(set(switches))  # always taken in the same order: two standbys never deadlock
        self.listen = listen
        self.owners_dir = owners_dir
        self._files: list[tuple[int, Path]] = []

    def take(self) -> Owner | None:
        """Take every switch's lock; None if taken, else the owner of the first switch held by another (none kept)."""
        if self._files or not self.switches:
            return None
        try:
            self.owners_dir.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise OwnershipError(f"cannot keep the switches' owner files in {self.owners_dir}: {err}") from None
        for switch in self.switches:
            for _ in range(TAKE_TRIES):
                try:
                    fd = os.open(self._path(switch), os.O_RDWR | os.O_CREAT, 0o644)
                except OSError as err:
                    self.release()
                    raise OwnershipError(f"cannot open the owner file of {switch}: {err}") from None
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    owner = self._read(fd, switch)
                    os.close(fd)
                    self.release()
                    return owner
                if self._still_there(fd, switch):
                    break
                os.close(fd)  # its owner removed it as it released it: the lock is on the file now at the path
            else:
                self.release()
                raise OwnershipError(f"the owner file of {switch} kept being replaced")
            self._files.append((fd, self._path(switch)))
            self._write(fd)
        return None

    def _still_there(self, fd: int, switch: str) -> bool:
        try:
            return os.fstat(fd).st_ino == os.stat(self._path(switch)).st_ino
        except FileNotFoundError:
            return False

    def wait_take(self, stop: threading.Event) -> Owner | None:
        """As a standby: wait until every switch is ours (None), or `stop` is set (the owner we waited for)."""
        waited_for = None
        while True:
            owner = self.take()
            if owner is None:
                return None
            waited_for = waited_for or owner
            if stop.wait(STANDBY_POLL):
                return waited_for

    def release(self) -> None:
        """The locks go with the files, which are removed first (held, so nobody takes a lock on one meanwhile; a
        taker that opened it before checks that it is still the file at the path)."""
        for fd, path in self._files:
            try:
                path.unlink()
            except OSError:
                pass
            os.close(fd)
        self._files = []

    def _path(self, switch: str) -> Path:
        return lock_path(self.owners_dir, switch)

    def _write(self, fd: int) -> None:
        write_record(fd, {"pid": os.getpid(), "listen": self.listen, "since": time.strftime("%Y-%m-%d %H:%M:%S %Z")})

    @staticmethod
    def holder(switch: str, owners_dir: Path = OWNERS_DIR) -> Owner | None:
        """The live controller that owns `switch`, if one does (e.g. for `mbalancer switch detach` to warn)."""
        try:
            fd = os.open(lock_path(owners_dir, switch), os.O_RDONLY)
        except OSError:
            return None  # never owned, or no owner folder
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return None  # nobody holds it: the owner is gone
        except BlockingIOError:
            return Ownership._read(fd, switch)
        finally:
            os.close(fd)

    @staticmethod
    def _read(fd: int, switch: str) -> Owner:
        record = read_record(fd)
        return Owner(switch, record.get("pid"), record.get("listen", "?"), record.get("since", "?"))


def lock_path(owners_dir: Path, switch: str) -> Path:
    return owners_dir / (re.sub(r"[^A-Za-z0-9_.-]", "_", switch) + ".lock")
