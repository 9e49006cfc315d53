"""Issue 50, "the monitor follows its switch", with the real parts of tests/test_deployment.py: a bridging box's eBPF
switch attached and detached by `mbalancer switch`, the real `mbalancer controller` and `mbalancer monitor` (the
switch's sketch), memcached servers and 64 clients in namespaces. Detached and attached again under load, the switch
is balanced again within 5 s by the same monitor process, which says so in its log; a switch that does not come back
makes the monitor exit 1 within its grace, in one line. monitor/follow.py's states are tested alone in
tests/test_monitor_follow.py."""
from __future__ import annotations

import json
import re
import subprocess
import time

import pytest

from monitor.cli import READY
from monitor.follow import SwitchState
from tests.conftest import MBALANCER, eventually, wait_for_line
from tests.test_deployment import (LOAD_SECONDS, controller_state, gets_served, load_command, serve_and_fill, switch,
                                   switch_status, why_not, write_config)
from mbalancer.memcache.server import free_port
from mbalancer.processes import stop_process
from topologies.netns import NamespaceNetwork

pytestmark = pytest.mark.skipif(why_not is not None, reason=f"eBPF data plane cannot run here: {why_not}")
TAG = "mbfol"
BALANCED = 0.40  # the busiest server's share of gets served: 0.33 balanced, 0.44 as the clients' hash sends them
BACK_WITHIN = 5.0  # s from the attach command's return to balanced gets (issue 50)
WINDOW = 4  # s over which the shares are measured once balanced


def states_said(log: str, name: str = TAG) -> list[SwitchState]:
    """The monitor's switch states in the order its log says them (one line each: `switch NAME STATE: ...`)."""
    return [SwitchState(state) for state in re.findall(rf"^mbalancer monitor: switch {name} (\w+):", log, re.M)]


def shares(net: NamespaceNetwork, seconds: float) -> list[float]:
    """Each server's share of the gets the servers themselves served over the next `seconds`."""
    before = gets_served(net)
    time.sleep(seconds)
    served = [b - a for a, b in zip(before, gets_served(net))]
    return [n / max(sum(served), 1) for n in served]


def balanced_after(net: NamespaceNetwork, since: float, within: float) -> float | None:
    """Seconds from `since` until a half-second window of gets is balanced, None if not within `within`."""
    while time.monotonic() - since < within:
        if max(shares(net, 0.5)) < BALANCED:
            return time.monotonic() - since
    return None


def test_detached_and_attached_again_under_load_the_same_monitor_balances_again_within_5_s(tmp_path):
    with NamespaceNetwork(servers=3, clients=1, tag=TAG, dataplane="bridge") as net:
        serve_and_fill(net)
        config, listen = tmp_path / "mbalancer.toml", f"127.0.0.1:{free_port()}"
        write_config(net, config, listen, TAG)
        processes = []
        try:
            assert switch("attach", "--config", str(config)).returncode == 0
            processes.append(subprocess.Popen([str(MBALANCER), "controller", "--config", str(config)],
                                              stderr=subprocess.PIPE, text=True))
            wait_for_line(processes[-1], "mbalancer controller:", timeout=30)
            monitor = subprocess.Popen([str(MBALANCER), "monitor", "--config", str(config)],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            processes.append(monitor)
            said = wait_for_line(monitor, READY, timeout=30)
            generator = net.popen(net.client_hosts[0], load_command(net, LOAD_SECONDS, tmp_path, clients=64),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            assert eventually(lambda: switch_status(TAG)["hot_keys"] == 10, timeout=30), switch_status(TAG)
            assert balanced_after(net, time.monotonic(), 10) is not None, "never balanced before the detach"

            detached = switch("detach", "--config", str(config))
            assert detached.returncode == 0, detached.stderr
            said += wait_for_line(monitor, f"switch {TAG} gone:", timeout=5)  # within one interval (1 s)
            time.sleep(1)  # the bridge forwards meanwhile
            attached = switch("attach", "--config", str(config))
            assert attached.returncode == 0, attached.stderr
            back_from = time.monotonic()
            said += wait_for_line(monitor, f"switch {TAG} reattached:", timeout=BACK_WITHIN)
            took = balanced_after(net, back_from, BACK_WITHIN)
            assert took is not None, shares(net, 1)

            reports = controller_state(listen)["counters"]["reports"]
            served = shares(net, WINDOW)  # stays balanced: the monitor's reports keep the keys hot
            state = controller_state(listen)
            sent = [s["measured_gets_per_s"] for s in state["servers"]]  # the new program's sketch, as reported
            print(f"balanced {took:.2f} s after the attach; shares {served}, the clients' {[x / sum(sent) for x in sent]}")
            assert max(served) < BALANCED < max(sent) / sum(sent), (served, sent)
            assert state["counters"]["reports"] - reports >= WINDOW - 2, state["counters"]
            assert switch_status(TAG)["sketch_read"] is True
            assert monitor.poll() is None and processes[1] is monitor  # the same process, never restarted
            assert states_said(said) == [SwitchState.GONE, SwitchState.REATTACHED], said

            generator.terminate()
            out, err = generator.communicate(timeout=60)
            assert generator.returncode == 0, err[-2000:]
            measured = json.loads(out)
            print({k: measured[k] for k in ("requests", "hits", "misses", "timeouts")})
            assert measured["misses"] == 0 and measured["hits"] > 0, measured
        finally:
            for process in reversed(processes):
                stop_process(process, grace=30)
            switch("detach", "--config", str(config))


def test_a_switch_that_does_not_come_back_makes_the_monitor_exit_1_in_one_line(tmp_path):
    grace = 2.0
    with NamespaceNetwork(servers=1, clients=1, tag=TAG, dataplane="bridge") as net:
        config = tmp_path / "mbalancer.toml"
        write_config(net, config, f"127.0.0.1:{free_port()}", TAG)
        monitor = None
        try:
            assert switch("attach", "--config", str(config)).returncode == 0
            monitor = subprocess.Popen([str(MBALANCER), "monitor", "--source", "dataplane", "--switch", TAG, "--json",
                                        "--interval", "0.5", "--switch-grace", f"{grace:g}"],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            said = wait_for_line(monitor, READY, timeout=30)
            assert switch("detach", "--config", str(config)).returncode == 0
            gone_at = time.monotonic()
            exit_code = monitor.wait(timeout=grace + 10)
            waited = time.monotonic() - gone_at
            said += monitor.stderr.read()
        finally:
            if monitor is not None and monitor.poll() is None:
                monitor.terminate()
                monitor.wait(timeout=30)
            switch("detach", "--config", str(config))
    lines = said.strip().splitlines()
    print(f"exit {exit_code} {waited:.2f} s after the detach; {lines[-1]}")
    assert exit_code == 1 and "Traceback" not in said, said
    assert states_said(said) == [SwitchState.GONE, SwitchState.LOST], said
    assert lines[-1] == f"mbalancer monitor: switch {TAG} lost: gone for {grace:g} s; exit 1 (under systemd, " \
                        f"Restart=on-failure starts the monitor again)"
    assert grace <= waited < grace + 0.5 + 3, waited  # the grace, one interval, the process's own exit
