"""One network per machine, and a killed run's leftovers removed by the next start (topologies/claim.py)."""
from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from dataplanes.bpf.program import PIN_ROOT, available
from topologies.claim import WAIT_ENV, NetworkClaim
from topologies.netns import NamespaceNetwork
from topologies.shapes import TopologyError

why_not = available() if os.geteuid() == 0 else "needs root (namespaces, bpf)"
pytestmark = pytest.mark.skipif(why_not is not None, reason=f"eBPF data plane cannot run here: {why_not}")

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def refused_at_once(monkeypatch):
    """These tests are about a second network being refused: a suite run with MBALANCER_NETWORK_WAIT would have it
    wait instead (and a holder started here wait on this process's network), so each test starts without it."""
    monkeypatch.delenv(WAIT_ENV, raising=False)

# Builds a namespace network, says so, then waits to be killed.
HOLDER = """
import sys, time
from topologies.netns import NamespaceNetwork
net = NamespaceNetwork(servers=1, clients=1, tag=sys.argv[1]).start()
print("up", flush=True)
time.sleep(60)
"""


def _exists(iface: str) -> bool:
    return Path("/sys/class/net", iface).exists()


def _start_holder(tag: str) -> subprocess.Popen:
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, tag], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "up"
    return holder


def test_a_second_network_is_refused_while_one_runs():
    holder = _start_holder("mbq1")
    try:
        with pytest.raises(TopologyError, match=f"another MBalancer network is running .*pid {holder.pid}"):
            NamespaceNetwork(servers=1, clients=1, tag="mbq2").start()
        assert not _exists("mbq2-s1")  # refused before making anything
        assert _exists("mbq1-s1")  # and the running one untouched
    finally:
        holder.terminate()
        holder.wait(timeout=10)


def test_what_a_killed_run_left_is_removed_by_the_next_start(caplog):
    holder = _start_holder("mbq3")
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=10)
    left = ["mbq3-s1", "mbq3-c1", "mbq3-r", "mbq3-m"]
    assert all(_exists(iface) for iface in left) and (PIN_ROOT / "mbq3").exists()
    with caplog.at_level(logging.WARNING, logger="topologies.claim"):
        with NamespaceNetwork(servers=1, clients=1, tag="mbq4") as net:
            assert net.switch is not None
    assert not any(_exists(iface) for iface in left)
    assert not (PIN_ROOT / "mbq3").exists() and not Path("/run/netns/mbq3-s1").exists()
    assert "killed namespace network mbq3 run" in caplog.text and "mbq3-r" in caplog.text


def test_a_corrupt_record_is_ignored(tmp_path):
    (tmp_path / "network.lock").write_text("[not a record")
    with NetworkClaim("test", directory=tmp_path):
        pass
    assert (tmp_path / "network.lock").read_text() == "{}"


def test_with_a_wait_a_second_claim_takes_its_turn_and_without_one_is_refused(tmp_path, monkeypatch):
    first = NetworkClaim("first", directory=tmp_path).take()
    events = []
    monkeypatch.setenv(WAIT_ENV, "0.3")
    with pytest.raises(TopologyError, match="another MBalancer network is running"):
        NetworkClaim("second", directory=tmp_path).take()
    monkeypatch.setenv(WAIT_ENV, "30")

    def release() -> None:
        events.append("first released")
        first.release()
    threading.Timer(0.3, release).start()
    with NetworkClaim("second", directory=tmp_path):
        events.append("second taken")
    assert events == ["first released", "second taken"]


def test_a_wait_that_is_not_a_number_is_named_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv(WAIT_ENV, "soon")
    with pytest.raises(TopologyError, match=f"^{WAIT_ENV}: a number of seconds \\(got 'soon'\\)$"):
        NetworkClaim("test", directory=tmp_path).take()
