"""A switch agent run as a process of its own (`mbalancer switch serve --config F`), for whatever starts agents
itself: the tests, the benchmarks, a testbed with one agent per switch node."""
from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

from mbalancer.processes import stop_process

START_TIMEOUT = 30.0  # seconds the agent may take to import, make its driver and listen
READY = "Ctrl-C stops"  # the line `mbalancer switch serve` prints once it serves


class AgentProcess:
    """`mbalancer switch serve --config config` (under `prefix`, e.g. nsenter into a namespace, which execs it: this
    process stays its parent), stopping when this process ends (--stop-with: killed, it leaves no agent behind);
    `log` is what it said so far. Raises RuntimeError with its words if it does not start."""

    def __init__(self, config: Path, prefix: Sequence[str] = ()):
        self.config = config
        self.process = subprocess.Popen([*prefix, sys.executable, "-m", "mbalancer.cli", "switch", "serve",
                                         "--config", str(config), "--stop-with", str(os.getpid())],
                                        stdin=subprocess.DEVNULL,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.log = ""
        deadline = time.monotonic() + START_TIMEOUT
        while READY not in self.log:
            if time.monotonic() > deadline or self.process.poll() is not None:
                self.stop()
                raise RuntimeError(f"the switch agent did not start: {self.log.strip()[-800:]}")
            self._read(0.2)

    def read_log(self) -> str:
        """What it said so far (without waiting)."""
        while not self.process.stderr.closed and self._read(0):
            pass
        return self.log

    def _read(self, wait: float) -> bool:
        """Add what it wrote within `wait` seconds to the log; False if it wrote nothing."""
        if not select.select([self.process.stderr], [], [], wait)[0]:  # unbuffered: select sees all there is
            return False
        chunk = os.read(self.process.stderr.fileno(), 65536)
        self.log += chunk.decode(errors="replace")
        return bool(chunk)

    def stop(self) -> str:
        """SIGTERM, then its whole log (again if stopped already)."""
        if self.process.stderr.closed:
            return self.log
        stop_process(self.process, grace=15)
        self.log += self.process.stderr.read().decode(errors="replace")
        self.process.stderr.close()
        return self.log
