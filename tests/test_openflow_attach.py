"""Your own Open vSwitch box, with namespaces standing in for the machines: a bridge of a running Open vSwitch
(userspace datapath) forwards between a client and three memcached servers; `mbalancer switch attach --dataplane
openflow` puts the key classifier where it sees every frame before the bridge does, a switch agent drives the bridge,
and the servers' own counters say the hot key's gets were spread over all three; `status` says what is attached,
bad input is one line, and `detach` removes exactly what attach made (an operator's own tc filter stays)."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from dataplanes import registry
from dataplanes.bpf.program import CLASSIFIER, CLASSIFIER_XDP
from dataplanes.openflow.ovs import OpenVSwitch
from dataplanes.openflow.standalone import PREF, _xdp_id, record_path
from experiments.endtoend.stack import LocalController
from mbalancer.config import parse_config
from mbalancer.memcache.hashing import make_hash
from mbalancer.memcache.meta import MetaClient, StoredItem
from tests.conftest import MBALANCER, eventually, memcached_answers
from tests.switch_agent import AgentProcess
from tests.test_ebpf_network import client_gets, hits, hot_gets_spread_evenly_and_answered_from_home
from topologies.netns import NamespaceNetwork

why_not = registry.get("openflow").available() if os.geteuid() == 0 else "needs root (namespaces, bpf, OVS)"
pytestmark = pytest.mark.skipif(why_not is not None, reason=f"OpenFlow data plane cannot run here: {why_not}")
TAG = "mbova"
BRIDGE = f"{TAG}-of"


def switch(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(MBALANCER), "switch", *args], capture_output=True, text=True, timeout=120)


def one_line_failure(done: subprocess.CompletedProcess, *words: str) -> str:
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert all(w in lines[0] for w in words), lines[0]
    return lines[0]


def tc_filters(iface: str, direction: str) -> list[dict]:
    shown = subprocess.run(["tc", "-j", "filter", "show", "dev", iface, direction], capture_output=True, text=True)
    return json.loads(shown.stdout or "[]")


@pytest.fixture(scope="module")
def box():
    """The namespace network with the ports bare, an Open vSwitch of its own with a bridge on them (as an operator
    has it: NORMAL until something drives it), memcached on the servers."""
    with NamespaceNetwork(servers=3, clients=1, tag=TAG, dataplane="bridge") as net:
        net.switch.close()  # the Linux bridge goes: the ports are Open vSwitch's
        ports = [h.port for h in net.hosts] + [f"{TAG}-rp"]
        ovs = OpenVSwitch(TAG).start()
        try:
            ovs.add_bridge(BRIDGE, ports, "tcp:127.0.0.1:1")  # no controller there: the agent drives it directly
            for host in net.server_hosts:
                net.popen(host, ["memcached", "-l", host.ip, "-p", "11211", "-U", "11211", "-u", "root", "-t", "1"])
            assert eventually(lambda: all(memcached_answers(h.ip) for h in net.server_hosts), timeout=10)
            yield net, ovs
        finally:
            switch("detach", "--dataplane", "openflow", "--name", TAG)  # after a failed test: pins and record
            ovs.stop()


def write_config(net, ovs, path, **openflow) -> None:
    servers = "".join(f'[[servers]]\nname = "{h.name}"\nip = "{h.ip}"\nmac = "{h.mac}"\n' for h in net.server_hosts)
    section = {"classifier": TAG, "connect": f"unix:{ovs.rundir}/{BRIDGE}.mgmt", **openflow}
    path.write_text(servers + '[dataplane]\nkind = "openflow"\n[dataplane.openflow]\n' +
                    "".join(f"{k} = {json.dumps(v)}\n" for k, v in section.items()))


def test_bad_input_is_one_line_and_leaves_nothing(box, tmp_path):
    net, ovs = box
    config = tmp_path / "box.toml"
    write_config(net, ovs, config)
    one_line_failure(switch("attach", "--config", str(config), "--bridge", "nosuch"), "no bridge nosuch",
                     BRIDGE)
    one_line_failure(switch("attach", "--dataplane", "openflow", "--bridge", BRIDGE, "--ovs-rundir", str(tmp_path)),
                     "no Open vSwitch database", str(tmp_path))
    write_config(net, ovs, tmp_path / "kernel.toml", datapath="system")
    one_line_failure(switch("attach", "--config", str(tmp_path / "kernel.toml")), "runs the userspace datapath",
                     "not the kernel datapath")
    ovs.vsctl("add-port", BRIDGE, f"{TAG}-ghost")  # an interface that does not exist
    try:
        one_line_failure(switch("attach", "--config", str(config)), f"port {TAG}-ghost", "is gone")
    finally:
        ovs.vsctl("del-port", BRIDGE, f"{TAG}-ghost")
    # a port whose XDP hook holds another program: the classifier must run there
    other = Path("/sys/fs/bpf") / f"{TAG}-other-xdp"
    subprocess.run(["bpftool", "prog", "load", str(CLASSIFIER_XDP.object), str(other), "type", "xdp"], check=True)
    try:
        subprocess.run(["ip", "link", "set", "dev", f"{TAG}-c1", "xdpgeneric", "pinned", str(other)], check=True)
        one_line_failure(switch("attach", "--config", str(config)), f"the XDP hook of {TAG}-c1 (program",
                         "holds a program already")
    finally:
        subprocess.run(["ip", "link", "set", "dev", f"{TAG}-c1", "xdpgeneric", "off"])
        other.unlink()
    ovs.stop_switch()
    try:
        one_line_failure(switch("attach", "--config", str(config)), "ovs-vswitchd is not running")
    finally:
        ovs.start_switch()
    assert not (CLASSIFIER.pin_root / TAG).exists() and not record_path(TAG).exists()
    one_line_failure(switch("status", "--config", str(config), "--name", TAG), f"no key classifier named {TAG}")
    none = switch("status", "--config", str(config))
    assert none.returncode == 0 and "no key classifier is attached" in none.stderr, none.stderr


def test_attach_balances_through_the_bridge_and_detach_removes_exactly_what_it_made(box, tmp_path):
    net, ovs = box
    config = tmp_path / "box.toml"
    write_config(net, ovs, config)
    # an operator's own filter on the bridge's internal port: attach goes in beside it, detach leaves it
    subprocess.run(["tc", "qdisc", "add", "dev", BRIDGE, "clsact"], check=True)
    subprocess.run(["tc", "filter", "add", "dev", BRIDGE, "egress", "pref", "7", "bpf", "bytecode", "1,6 0 0 0,"],
                   check=True)
    attached = switch("attach", "--config", str(config))
    assert attached.returncode == 0, attached.stderr
    assert f"key classifier {TAG} attached to bridge {BRIDGE} (netdev datapath)" in attached.stderr
    for port in [h.port for h in net.hosts] + [f"{TAG}-rp"]:  # read through AF_PACKET: XDP runs before it
        assert f"{port}: XDP of {port};" in attached.stderr and _xdp_id(port) > 0, attached.stderr
    assert f"{BRIDGE}: tc egress of {BRIDGE};" in attached.stderr  # the bridge's own port: this box's stack
    again = switch("attach", "--config", str(config))
    one_line_failure(again, f"key classifier {TAG} is attached to bridge {BRIDGE}", "since")
    status = json.loads(switch("status", "--config", str(config), "--json").stdout)
    assert sorted(status["ports"]) == sorted([h.port for h in net.hosts] + [f"{TAG}-rp", BRIDGE])
    assert status["unclassified_ports"] == [] and status["memcached_ports"] == [11211] and status["hot_keys"] == 0

    agent = AgentProcess(tmp_path, "openflow", {"classifier": TAG, "connect": f"unix:{ovs.rundir}/{BRIDGE}.mgmt"})
    settings = parse_config({"servers": [{"name": h.name, "ip": h.ip, "mac": h.mac} for h in net.server_hosts],
                             "balancing": {"hot": 2, "hysteresis": 1, "mode": "equal"},
                             "controller": {"listen": "127.0.0.1:18091", "poll_interval": 0, "health_interval": 60,
                                            "lease": 150},
                             "dataplane": {"kind": "agent", "agent": {"address": agent.address, "kind": "openflow",
                                                                      "token_file": str(agent.token_file)}}})
    key_hash = make_hash(settings.balancing.hash, [s.address for s in settings.servers])
    controller = LocalController(settings, key_hash, tmp_path)
    try:
        controller.start()
        home = key_hash.server_of(b"hot:1")
        MetaClient(settings.servers[home].address).set(b"hot:1", StoredItem(b"v1", 0, -1, 0))
        controller.report([(b"hot:1", 500.0)])
        assert eventually(lambda: any(k["key"] == "hot:1" and k["dirty"] is False
                                      for k in controller.state()["hot_keys"]), timeout=20), agent.read_log()
        hot_gets_spread_evenly_and_answered_from_home(net, home, agent.read_log)  # who served: memcached's counts
        status = json.loads(switch("status", "--config", str(config), "--json").stdout)
        assert status["hot_keys"] == 1 and status["counters"]["balanced"] >= 900, status
        plain = switch("status", "--dataplane", "openflow", "--name", TAG).stdout
        assert plain.startswith(f"{TAG}: bridge {BRIDGE} (netdev datapath);") and "1 hot keys" in plain, plain
    finally:
        controller.stop()
        agent.stop()

    detached = switch("detach", "--config", str(config))
    assert detached.returncode == 0 and "its record" in detached.stderr, detached.stderr
    assert all(_xdp_id(port) == 0 for port in [h.port for h in net.hosts] + [f"{TAG}-rp"])
    assert [f.get("pref") for f in tc_filters(BRIDGE, "egress")] in ([7], [7, 7]), \
        tc_filters(BRIDGE, "egress")  # the operator's filter, and nothing of ours
    assert not (CLASSIFIER.pin_root / TAG).exists() and not record_path(TAG).exists()
    nothing = switch("detach", "--config", str(config))
    assert nothing.returncode == 0 and "nothing to remove" in nothing.stderr
    before = hits(net)  # the bridge still forwards, untagged: every get of the key goes home
    assert client_gets(net, net.server_hosts[home].ip, b"hot:1", 30)["answered"] == 30
    assert [a - b for a, b in zip(hits(net), before)] == [30 if i == home else 0 for i in range(3)]
