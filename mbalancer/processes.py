"""Stopping the processes we started: by their own PID, never by name (a name may match someone else's)."""
from __future__ import annotations

import subprocess


def stop_process(process: subprocess.Popen, grace: float = 5.0) -> None:
    """Terminate, then kill after `grace` seconds; waits, so no zombie is left."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
