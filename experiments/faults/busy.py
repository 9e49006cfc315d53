"""A busy machine for the fault runner (`mbalancer faults --hogs N`): N busy loops, unpinned, for the whole of
every run, as the rest of a loaded box would be. Failure detection is judged under it: a server that only answers
late because every CPU is shared must keep its weight, and a hung one must still leave rotation in time."""
from __future__ import annotations

import subprocess

BUSY_LOOP = ["sh", "-c", "while :; do :; done"]


class CpuHogs:
    def __init__(self, count: int):
        self.count = count
        self._loops: list[subprocess.Popen] = []

    def __enter__(self) -> "CpuHogs":
        self._loops = [subprocess.Popen(BUSY_LOOP) for _ in range(self.count)]
        return self

    def __exit__(self, *exc) -> None:
        for loop in self._loops:  # by PID: they are ours
            loop.kill()
            loop.wait()
        self._loops = []


def load_average() -> float:
    """The machine's 1-minute load average."""
    with open("/proc/loadavg") as handle:
        return float(handle.read().split()[0])
