"""Your own deployment, with namespaces standing in for machines: a Linux box whose bridge forwards between a
client and two memcached servers gets the eBPF switch from `mbalancer switch attach`, then runs `mbalancer
controller` and `mbalancer monitor` from the same config, as docs/deployment.md's "Use it with your own memcached
servers" says; `mbalancer switch detach` gives the box its bridge back."""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from dataplanes.bpf.program import PIN_ROOT, available, mirror_link_of
from mbalancer.memcache.server import free_port
from monitor.cli import READY
from tests.conftest import MBALANCER, eventually, memcached_answers, wait_for_line
from topologies.netns import NamespaceNetwork

why_not = available() if os.geteuid() == 0 else "needs root (namespaces, bpf)"
pytestmark = pytest.mark.skipif(why_not is not None, reason=f"eBPF data plane cannot run here: {why_not}")
TAG = "mbdep"  # the network's tag, and the switch's name: a killed run's leftovers go with the network's claim


def write_config(net: NamespaceNetwork, path, listen: str) -> list[str]:
    """The one config file of the deployment; returns the switch ports it names."""
    ports = [h.port for h in net.hosts] + [f"{TAG}-rp"]  # the root namespace (the controller) is on a port too
    servers = "".join(f'[[servers]]\nname = "{h.name}"\nip = "{h.ip}"\nmac = "{h.mac}"\nport = 11211\n'
                      for h in net.server_hosts)
    # equal weights: both copies of a hot key serve, whatever the load (the shares are what this test reads)
    path.write_text(servers + '[balancing]\nhot = 2\nhysteresis = 1\nmode = "equal"\n[monitor]\ninterval = 0.5\n'
                    f'[controller]\nlisten = "{listen}"\n[dataplane]\nkind = "ebpf"\n'
                    f'[dataplane.ebpf]\nswitches = ["{TAG}"]\nports = {json.dumps(ports)}\n')
    return ports


def load_command(net: NamespaceNetwork, seconds: float, out) -> list[str]:
    servers = ",".join(f"{h.ip}:11211" for h in net.server_hosts)
    return [str(MBALANCER), "load", "--servers", servers, "--keys", "50", "--alpha", "1.2", "--clients", "4",
            "--duration", f"{seconds:g}", "--value-size", "100", "--no-records", "--out", str(out), "--json"]


def load(net: NamespaceNetwork, seconds: float, out) -> dict:
    result = net.run(net.client_hosts[0], load_command(net, seconds, out))
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout)


def switch(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(MBALANCER), "switch", *args], capture_output=True, text=True, timeout=60)


def test_attach_run_and_detach_on_a_bridging_box(tmp_path):
    with NamespaceNetwork(servers=2, clients=1, tag=TAG, dataplane="bridge") as net:
        for host in net.server_hosts:
            net.popen(host, ["memcached", "-l", host.ip, "-p", "11211", "-U", "11211", "-u", "root", "-t", "1"])
        assert eventually(lambda: all(memcached_answers(h.ip) for h in net.server_hosts), timeout=10)
        config = tmp_path / "mbalancer.toml"
        ports = write_config(net, config, f"127.0.0.1:{free_port()}")
        populate = net.run(net.client_hosts[0], [str(MBALANCER), "load", "--servers", ",".join(
            f"{h.ip}:11211" for h in net.server_hosts), "--keys", "50", "--value-size", "100", "--populate",
            "--duration", "0"])
        assert populate.returncode == 0, populate.stderr
        processes = []
        try:
            attached = switch("attach", "--config", str(config))
            assert attached.returncode == 0 and f"{TAG} attached to" in attached.stderr, attached.stderr
            again = switch("attach", "--config", str(config))
            assert again.returncode == 1 and "attached already" in again.stderr and "Traceback" not in again.stderr
            status = json.loads(switch("status", "--name", TAG, "--json").stdout)
            assert status["ports"] == ports and status["memcached_ports"] == [11211]
            assert status["sketch_read"] is False  # no `monitor --source dataplane` renews it
            piped = subprocess.Popen([str(MBALANCER), "switch", "status", "--name", TAG], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
            piped.stdout.close()  # the reader is gone before the command writes (as with `| head -0`)
            assert piped.wait(timeout=60) == 141 and piped.stderr.read() == ""  # quiet, as cat is

            processes.append(subprocess.Popen([str(MBALANCER), "controller", "--config", str(config)],
                                              stderr=subprocess.PIPE, text=True))
            wait_for_line(processes[-1], "mbalancer controller:", timeout=30)
            processes.append(subprocess.Popen([str(MBALANCER), "monitor", "--config", str(config), "--iface",
                                               net.client_hosts[0].port, "--json"],
                                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
            wait_for_line(processes[-1], READY, timeout=30)
            # Under load: the hot keys are installed, then the switch balances their gets; every get answered.
            generator = net.popen(net.client_hosts[0], load_command(net, 60, tmp_path), stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
            assert eventually(lambda: switch_status()["hot_keys"] == 2, timeout=30)
            before = switch_status()["counters"]["balanced"]
            assert eventually(lambda: switch_status()["counters"]["balanced"] > before + 100, timeout=30)
            generator.terminate()  # the generator stops early and reports what it measured
            out, err = generator.communicate(timeout=30)
            assert generator.returncode == 0, err[-2000:]
            measured = json.loads(out)
            assert measured["timeouts"] == 0 and measured["misses"] == 0 and measured["hits"] > 0
        finally:
            for process in processes:
                process.terminate()
                process.wait(timeout=30)
            detached = switch("detach", "--name", TAG)
        assert detached.returncode == 0 and "removed" in detached.stderr, detached.stderr
        assert not (PIN_ROOT / TAG).exists() and not os.path.exists(f"/sys/class/net/{mirror_link_of(TAG)[0]}")
        assert "nothing to remove" in switch("detach", "--name", TAG).stderr
        after = load(net, 1.0, tmp_path)  # the bridge forwards again
        assert after["timeouts"] == 0 and after["hits"] > 0


def switch_status() -> dict:
    return json.loads(switch("status", "--name", TAG, "--json").stdout)


@pytest.mark.parametrize("args, message", [
    (["attach", "--ports", "no-such-if0"], "no such interface"),
    (["attach"], "--ports"),
    (["attach", "--ports", "lo", "--name", "a/b"], "bad data plane name"),
    (["attach", "--ports", "lo", "--name", "x" * 18], "too long: at most 12 characters"),
    (["status", "--name", "no-such-switch"], "no switch named"),
])
def test_bad_switch_commands_say_why(args, message):
    result = switch(*args)
    assert result.returncode in (1, 2) and message in result.stderr and "Traceback" not in result.stderr
