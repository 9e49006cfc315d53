"""Shared test helpers: run the installed `mbalancer` command as a user would."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

MBALANCER = Path(sys.executable).parent / "mbalancer"


@pytest.fixture
def run_cli():
    """Run `mbalancer ARGS...`; returns the CompletedProcess (text mode, output captured)."""
    def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        assert MBALANCER.exists(), f"console script missing at {MBALANCER}: is the package installed (pip install -e .)?"
        return subprocess.run([str(MBALANCER), *args], capture_output=True, text=True, timeout=timeout)
    return run


@pytest.fixture(scope="module")
def memcached():
    """A real memcached on a free loopback port, TCP and UDP, stopped by PID after the module's tests."""
    from mbalancer.memcache.server import MemcachedServer
    with MemcachedServer(max_item="2m") as server:
        yield server


@pytest.fixture(scope="module")
def memcached_pair():
    """Two real memcached servers on free loopback ports (home and replica), stopped by PID after the module."""
    from mbalancer.memcache.server import MemcachedServer
    with MemcachedServer() as first, MemcachedServer() as second:
        yield [first, second]


def eventually(check, timeout: float = 10.0, every: float = 0.02) -> bool:
    """Poll `check()` until it is true or `timeout` seconds pass; returns its last answer."""
    import time
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(every)
    return bool(check())


def memcached_answers(ip: str, port: int = 11211) -> bool:
    """True if a memcached answers at ip:port (for waiting until one has started)."""
    from mbalancer.memcache.addresses import ServerAddress
    from mbalancer.memcache.meta import answers
    return answers(ServerAddress(ip, port))


def wait_for_line(process, text: str, timeout: float = 30.0) -> str:
    """Read the process's stderr (a text pipe) until a line contains `text`; returns what was read. Fails the test
    if the process exits or the time runs out first (start-up time depends on the machine: wait, never guess)."""
    import select
    import time
    deadline, seen = time.monotonic() + timeout, []
    while (left := deadline - time.monotonic()) > 0:
        if select.select([process.stderr], [], [], left)[0]:
            line = process.stderr.readline()
            if not line:
                break
            seen.append(line)
            if text in line:
                return "".join(seen)
    pytest.fail(f"no {text!r} from the process within {timeout:g} s; it said: {''.join(seen)[-2000:]!r}")


def why_no_mininet() -> str | None:
    """None if Mininet with the eBPF switch can run here, else why not (for skipif)."""
    import shutil

    from dataplanes.bpf.program import available
    if os.geteuid() != 0:
        return "needs root"
    return available() or (None if shutil.which("mnexec") else "mnexec missing (apt package mininet)")


def run_program(pin: Path, frame: bytes) -> bytes:
    """The frame as a pinned BPF program leaves it (BPF_PROG_TEST_RUN)."""
    from dataplanes.bpf.bpf_syscall import obj_get, prog_test_run
    prog = obj_get(str(pin))
    try:
        return prog_test_run(prog, frame).packet
    finally:
        os.close(prog)


def process_running(pid: int) -> bool:
    """Whether process `pid` runs: not gone, and not a zombie waiting to be reaped (init reaps it: gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
