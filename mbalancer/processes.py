"""Stopping processes: the ones we started by their own PID, never by name (a name may match someone else's);
our own long commands by SIGINT/SIGTERM, at their next look, keeping what they measured."""
from __future__ import annotations

import os
import signal
import subprocess
import threading
from pathlib import Path


def stop_process(process: subprocess.Popen, grace: float = 5.0, group: bool = False, asked: bool = False) -> None:
    """Terminate, then kill after `grace` seconds; waits, so no zombie is left. `group`: the whole process group
    (a process started with start_new_session=True whose children must go too, e.g. a tool that forks per CPU);
    `asked`: it was told to end already, its own way (no SIGTERM: it is given `grace` seconds to do so)."""
    if process.poll() is None:
        if not asked:
            _signal(process, signal.SIGTERM, group)
        try:
            process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            _signal(process, signal.SIGKILL, group)
            process.wait()


def runs(pid: int, program: str) -> bool:
    """Whether process `pid` runs `program` (its argv[0] ends with it): a PID kept in a record or pidfile still names
    the process it was written for, not another that took the number since."""
    try:
        return pid > 0 and Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].endswith(program.encode())
    except OSError:
        return False


def kill_left_over(pidfile: Path, program: str) -> bool:
    """Kill (SIGKILL) what a killed run left running: the process whose PID `pidfile` holds, if it still runs
    `program`; whether it was there."""
    try:
        pid = int(pidfile.read_text().strip())
    except (OSError, ValueError):
        return False
    if not runs(pid, program):
        return False
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:  # it ended meanwhile
        return False
    return True


def _signal(process: subprocess.Popen, signum: int, group: bool) -> None:
    try:
        os.killpg(process.pid, signum) if group else process.send_signal(signum)
    except ProcessLookupError:
        pass


def stop_on_signals() -> threading.Event:
    """An event that Ctrl-C (SIGINT) and SIGTERM set from now on: a long command polls it and ends cleanly."""
    stop = threading.Event()

    def on_signal(*_) -> None:
        # From another thread: the handler runs in the main thread between two of its bytecodes, which may be inside
        # stop.wait() while it holds the event's lock (not reentrant): setting the event here would wait for that
        # lock forever. (Seen: an agent SIGTERMed as it began to wait never stopped.)
        threading.Thread(target=stop.set, name="mbalancer-stop", daemon=True).start()

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, on_signal)
    return stop


PR_SET_PDEATHSIG = 1  # prctl(2)


def stop_with_parent(parent: int, stop: threading.Event) -> None:
    """Have the kernel send this process SIGTERM when `parent` (the process, thread really, that started it) ends,
    as a `stop_on_signals` stop; `stop` set at once if it has ended already. Set here, in the child, rather than in
    a preexec_fn: a parent running gRPC threads must not run Python between fork and exec."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
    if os.getppid() != parent:  # it ended before the line above: no signal will come
        stop.set()
