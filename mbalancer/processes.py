"""Stopping processes: the ones we started by their own PID, never by name (a name may match someone else's);
our own long commands by SIGINT/SIGTERM, at their next look, keeping what they measured."""
from __future__ import annotations

import signal
import subprocess
import threading


def stop_process(process: subprocess.Popen, grace: float = 5.0) -> None:
    """Terminate, then kill after `grace` seconds; waits, so no zombie is left."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def stop_on_signals() -> threading.Event:
    """An event that Ctrl-C (SIGINT) and SIGTERM set from now on: a long command polls it and ends cleanly."""
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    return stop
