"""A driver in a process of its own (dataplanes/driver_process.py), on the recording driver: calls and their errors
cross the socket, bad requests are one-line errors, and the child never outlives its parent; how the project stops
the processes it started (mbalancer/processes.py). The P4Runtime driver
through it, inside ryu-manager, is tests/test_p4runtime_driver.py's and tests/test_p4_network.py's."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from dataplanes.driver import DriverError, ReplicaWeight
from dataplanes.driver_process import DriverProcess
from mbalancer.config import Server
from mbalancer.processes import kill_left_over, runs, stop_process
from tests.conftest import eventually, process_running

SERVERS = [Server(f"s{i}", f"10.0.0.{i + 1}", f"02:00:00:00:00:{i + 1:02x}") for i in range(3)]


@pytest.fixture
def driver():
    made = DriverProcess("none")
    yield made
    made.close()


def test_calls_results_and_errors_cross_to_the_child(driver):
    assert driver.name == "none" and driver.attach(SERVERS, lambda frame: None) == []
    driver.install_hot_key(b"k", 0, [ReplicaWeight(0, 0.5), ReplicaWeight(1, 0.5)])
    stamp = driver.write_stamp(b"k")
    driver.clear_dirty(b"k", stamp)
    with pytest.raises(DriverError, match=r"b'k' is already installed"):
        driver.install_hot_key(b"k", 0, [ReplicaWeight(0, 1.0)])
    driver.remove_hot_key(b"k")
    with pytest.raises(DriverError, match="not installed"):
        driver.remove_hot_key(b"k")
    assert driver.read_counters().unsure == 0


def test_an_unknown_kind_is_one_line_and_no_child_is_left():
    with pytest.raises(DriverError, match=r"^unknown data plane 'p5' \(choose from"):
        DriverProcess("p5")


def test_the_child_ends_when_its_parent_is_killed():
    """kill -9 of the process that made it (ryu-manager): the child sees its socket end, closes its driver (the
    lease ends on the switch) and exits, bounded."""
    parent = subprocess.Popen([sys.executable, "-c", (
        "import sys, time\n"
        "from dataplanes.driver_process import DriverProcess\n"
        "d = DriverProcess('none')\n"
        "print(d.process.pid, flush=True)\n"
        "time.sleep(60)\n")], stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(timeout=10)
        assert eventually(lambda: not process_running(child), every=0.05), "the driver process outlived its parent"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


def test_an_answer_that_comes_after_its_call_gave_up_answers_no_later_call(driver):
    """Calls are numbered: the late answer to a call that timed out is dropped, and the next call gets its own."""
    from dataplanes.driver import Counters, WriteStamp
    driver.attach(SERVERS, lambda frame: None)
    driver.install_hot_key(b"k", 0, [ReplicaWeight(0, 1.0)])
    for _ in range(20):
        try:
            driver._call("read_counters", (), timeout=0)  # gives up at once, mostly before the answer comes
        except DriverError:
            pass
        assert isinstance(driver.write_stamp(b"k"), WriteStamp)
        assert isinstance(driver.read_counters(), Counters)


# --- stopping processes (mbalancer/processes.py) ---------------------------------------------------------------------
def test_a_process_asked_to_end_its_own_way_is_waited_for_then_killed_not_terminated():
    ending = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.2)"])
    stop_process(ending, grace=30, asked=True)
    assert ending.returncode == 0  # it ended by itself: no SIGTERM cut it short
    stuck = subprocess.Popen([sys.executable, "-c", "import signal, time\n"
                              "signal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(60)"])
    stop_process(stuck, grace=0.2, asked=True)
    assert stuck.returncode == -signal.SIGKILL


def test_what_a_killed_run_left_is_killed_by_its_pidfile_only_while_the_pid_runs_that_program(tmp_path):
    left = subprocess.Popen(["sleep", "60"])
    pidfile = tmp_path / "left.pid"
    try:
        pidfile.write_text(f"{left.pid}\n")
        # once the child has exec'd sleep (until then its /proc cmdline is still this Python's)
        assert eventually(lambda: runs(left.pid, "sleep"), timeout=10)
        assert not runs(left.pid, "memcached") and not runs(0, "sleep")
        assert not kill_left_over(pidfile, "memcached") and left.poll() is None  # the PID runs another program now
        assert kill_left_over(pidfile, "sleep") and left.wait(timeout=10) == -signal.SIGKILL
        assert not runs(left.pid, "sleep") and not kill_left_over(pidfile, "sleep")  # gone
        for broken in ("", "not a pid", "-1"):
            pidfile.write_text(broken)
            assert not kill_left_over(pidfile, "sleep")
        assert not kill_left_over(tmp_path / "none.pid", "sleep")
    finally:
        stop_process(left)
