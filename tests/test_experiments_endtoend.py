"""The end-to-end experiments: settings and the model's numbers (pure), the testbed's topologies on Mininet, and
a short experiment through the command line with the whole loop running (monitor -> controller -> replication ->
eBPF data plane) against real memcached servers, including an interrupted one."""
from __future__ import annotations

import json
import math
import signal
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import pytest

from controller.mac_check import MacStatus, verdicts
from experiments.endtoend.measure import run_limit
from experiments.endtoend.plot import plot_all
from experiments.endtoend.predict import model_hot, simulated_imbalance
from experiments.endtoend.report import demo_line, format_runs
from experiments.endtoend.spec import PRESETS
from experiments.endtoend.sweep import medians, spec_dict, write_outputs
from mbalancer.config import Balancing
from mbalancer.memcache.addresses import ServerAddress
from tests.conftest import eventually, store_closed, why_no_mininet
from dataplanes import registry
from dataplanes.bpf.program import CLASSIFIER, PIN_ROOT
from dataplanes.openflow.ovs import RUN_ROOT
from topologies.shapes import LinkSpec, TopologyError, host_plan
from topologies.testbed import TestbedSpec

TWO = (ServerAddress("10.0.0.1"), ServerAddress("10.0.0.2"))
why_not = why_no_mininet()
needs_testbed = pytest.mark.skipif(why_not is not None, reason=f"the Mininet testbed cannot run: {why_not}")


# --- settings and the model (pure) ----------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_are_runnable(name):
    PRESETS[name].check()


def test_clients_are_split_over_the_client_hosts():
    spec = replace(PRESETS["fig5.1"], clients=65, testbed=TestbedSpec(clients=3))
    assert [spec.clients_of(h) for h in (1, 2, 3)] == [22, 22, 21]
    assert spec.workload(TWO, "skewed:0.7", host=2).seed != spec.workload(TWO, "skewed:0.7", host=1).seed


def test_the_model_for_the_thesis_setting():
    """Skewed hash at IF 0.7 on two servers: the ten hottest keys (39.1% of gets) all live on server 1; split
    evenly they leave it 0.714 - 0.196 = 0.519 of the load: IF = 0.5 / 0.519 = 0.964."""
    spec = PRESETS["fig5.1"]
    thesis = replace(spec.balancing, mode="equal")
    workload = spec.workload(TWO, "skewed:0.7")
    assert simulated_imbalance(workload, None) == pytest.approx(0.7, abs=0.002)
    assert simulated_imbalance(workload, thesis) == pytest.approx(0.964, abs=0.002)
    assert simulated_imbalance(spec.calibration(TWO), None) == pytest.approx(1.0, abs=0.01)
    # Already even (IF 1) with the hot keys on server 1: equal weights push 0.196 of the load onto server 2
    # (0.5 / 0.696 = 0.718); water-filling keeps it even.
    even = spec.workload(TWO, "skewed:1")
    assert simulated_imbalance(even, thesis) == pytest.approx(0.718, abs=0.005)
    assert simulated_imbalance(even, spec.balancing) > 0.99  # weighted, the default


def test_the_model_picks_h_like_the_controller():
    """H "auto": the fewest hottest keys whose remedy reaches the target; none where the hash is already even."""
    spec = PRESETS["fig5.1"]
    auto = Balancing(hot=None, target=0.97, groups=1, hysteresis=2)
    skewed = spec.workload(TWO, "skewed:0.7")
    hot = model_hot(skewed, auto, 50)
    assert 1 <= hot < 10
    assert simulated_imbalance(skewed, replace(auto, hot=hot - 1)) < 0.97 <= simulated_imbalance(skewed, auto, 50)
    assert model_hot(spec.workload(TWO, "skewed:1"), auto, 50) == 0
    assert model_hot(skewed, replace(auto, target=1.0), 3) == 3  # out of reach: every reported key
    assert model_hot(skewed, spec.balancing, 50) == 10  # a fixed H is what it says


def test_rounds_are_summarised_by_medians_and_ranges(tmp_path):
    """Three rounds of one point: medians over rounds, ranges, limits counted; table, CSV and plots written."""
    def run(number: int, mode: str, normalised: float, limit: str = "servers") -> dict:
        return {"round": number, "point": "skewed:0.7", "mode": mode, "replicas": "weighted" if mode == "mbalancer"
                else "", "throughput": 1000 * normalised, "normalised": normalised, "imbalance_measured": normalised,
                "imbalance_simulated": 0.7, "imbalance_hash": 0.7, "mean_ms": 10.0 * number, "p50_ms": 5.0,
                "p99_ms": 9.0, "hot_keys": 4 if mode == "mbalancer" else 0, "hot_model": 4, "timeouts": 1,
                "misses": 0, "limit": limit, "server_rates": [600.0, 400.0], "server_normalised_min": 0.8,
                "server_normalised_max": 1.2, "server_mean_ms_min": 1.0, "server_mean_ms_max": 2.0,
                "cpu_busy": 0.5, "cpu_steal": 0.0, "cores": {}}
    rows = [run(n, "calibration", 1.0) for n in (1, 2, 3)]
    rows += [run(n, "baseline", x) for n, x in ((1, 0.70), (2, 0.60), (3, 0.72))]
    rows += [run(n, "mbalancer", x, limit) for n, x, limit in ((1, 0.99, "servers"), (2, 0.90, "cpu"),
                                                                (3, 0.97, "servers"))]
    by_mode = {r["mode"]: r for r in medians(rows)}
    assert by_mode["baseline"]["normalised"] == 0.70 and by_mode["baseline"]["rounds"] == 3
    assert (by_mode["mbalancer"]["normalised_min"], by_mode["mbalancer"]["normalised_max"]) == (0.90, 0.99)
    assert by_mode["mbalancer"]["limit"] == "servers 2, cpu 1" and by_mode["baseline"]["timeouts"] == 3
    summary = {"experiment": "fig5.1", "spec": spec_dict(PRESETS["fig5.1"]), "capacity": 1000.0,
               "capacities": [1000.0] * 3, "runs": rows, "medians": medians(rows)}
    text = format_runs(summary, "throughput")
    assert "medians over 3 rounds" in text and "0.970 [0.90-0.99]" in text
    write_outputs(summary, tmp_path)
    assert (tmp_path / "medians.csv").read_text().count("\n") == 4
    assert all(path.stat().st_size > 0 for path in plot_all(summary, tmp_path))


@pytest.mark.parametrize("change, message", [
    ({"clients": 1}, "client hosts"),
    ({"measure": 0}, "measurement"),
    ({"balancing": Balancing(hot=None, target=None)}, "needs a target"),
    ({"rounds": 0}, "rounds"),
    ({"hashes": ("skewed:0.2",)}, "out of reach"),
    ({"testbed": TestbedSpec(dataplane="bridge")}, "cannot run as a Mininet switch"),
    ({"testbed": TestbedSpec(topology="ring")}, "topology"),
    ({"testbed": TestbedSpec(topology="leafspine", dataplane="openflow")}, "a switch agent per switch"),
    ({"controller": "local", "testbed": TestbedSpec(dataplane="openflow")}, "driven by the Ryu app"),
    ({"testbed": TestbedSpec(server_link=LinkSpec(rate_mbit=-1))}, "rate"),
    ({"detection": "psychic"}, "detection must be one of"),
    ({"detection": "sketch", "testbed": TestbedSpec(topology="leafspine")}, "every leaf: detect by capture"),
    ({"testbed": TestbedSpec(topology="leafspine", leaves=0)}, "at least one leaf and one spine"),
    ({"testbed": TestbedSpec(topology="leafspine", leaves=60, spines=4)}, "63 switches at most"),
    ({"testbed": TestbedSpec(topology="leafspine", controllers=2)}, "controller hosts reach the switches over the"),
    ({"testbed": TestbedSpec(topology="leafspine", agents=True, controllers=4)}, "at most 3 controller hosts"),
])
def test_impossible_settings_are_named(change, message):
    with pytest.raises((ValueError, TopologyError), match=message):
        replace(PRESETS["demo"], **change).check()


def test_host_plan_addresses():
    servers, clients = host_plan(2, 3)
    assert [h.ip for h in servers + clients] == [f"10.0.0.{i}" for i in range(1, 6)]
    assert servers[1].mac == "02:00:00:00:00:02" and clients[0].name == "cli1"
    with pytest.raises(TopologyError):
        host_plan(200, 60)


def test_demo_line_has_the_contract_fields():
    run = {"point": "skewed:0.7", "replicas": "", "throughput": 100.0, "p50_ms": 5.0, "server_rates": [75.0, 25.0],
           "normalised": 0.7, "imbalance_measured": 0.66, "imbalance_simulated": 0.7}
    summary = {"runs": [{**run, "mode": "calibration", "point": "skewed:1"}, {**run, "mode": "baseline"},
                        {**run, "mode": "mbalancer", "replicas": "equal", "throughput": 130.0,
                         "server_rates": [50.0, 50.0]},
                        {**run, "mode": "mbalancer", "replicas": "weighted", "throughput": 140.0}]}
    line = demo_line(summary)
    assert line["gain"] == 1.3 and line["baseline"]["max_server_share"] == 0.75 and line["replicas"] == "equal"
    assert set(line["mbalancer"]) >= {"throughput", "p50_ms", "max_server_share"}


def test_a_server_link_carries_what_its_rate_allows():
    # 10 KB values in 8 datagrams of memcached UDP frames: 10,040 B + 8 x 50 B of headers per reply at 100 Mbit/s
    assert PRESETS["demo"].link_gets() == pytest.approx(100e6 / 8 / 10_440)
    assert replace(PRESETS["demo"], testbed=TestbedSpec(servers=2, clients=2)).link_gets() is None


@pytest.mark.parametrize("rates, cores, busy, steal, limit", [
    ([1150, 480], {"load on cli1": 0.3}, 0.4, 0.0, "servers"),  # the busiest at >= 95% of its link
    ([900, 880], {"load on cli1": 0.97, "monitor": 0.2}, 0.7, 0.0, "load on cli1"),  # a generator used a core
    ([900, 880], {"load on cli1": 0.5}, 0.7, 0.25, "cpu"),  # a CPU was full (with a hypervisor's share)
    ([1090, 1100], {"load on cli1": 0.3}, 0.5, 0.1, "steal"),  # a 10% stolen CPU explains a 9% shortfall
    ([900, 880], {"load on cli1": 0.5}, 0.6, 0.0, "unknown"),  # nothing full: suspect the path
])
def test_what_limited_a_run_is_named(rates, cores, busy, steal, limit):
    assert run_limit(rates, 1197.0, cores, busy, steal) == limit
    assert run_limit(rates, None, cores, busy, steal) == "unshaped"


@pytest.mark.parametrize("args, message", [
    (["nosuch", "--out", "x"], "invalid choice"),
    (["demo", "--out", "x", "--points", "a,b"], "--points"),
    (["demo", "--out", "x", "--measure", "-1"], "measurement"),
    (["demo", "--out", "x", "--config", "/nonexistent.toml"], "--config"),
    (["demo", "--out", "x", "--hot", "many"], "--hot"),
    (["demo", "--out", "x", "--hot", "auto", "--target", "1.5"], "--target"),
    (["demo", "--out", "x", "--hot", "5", "--target", "0.9"], "--target goes with --hot auto"),
    (["demo", "--out", "x", "--rounds", "0"], "rounds"),
    (["demo", "--out", "x", "--leaves", "3"], "--leaves and --spines go with --topology leafspine"),
    (["demo", "--out", "x", "--topology", "leafspine", "--spines", "0"], "at least one leaf and one spine"),
])
def test_bad_options_exit_2(run_cli, args, message):
    result = run_cli("experiment", *args)
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr


# --- the testbed ----------------------------------------------------------------------------------------------
@needs_testbed
def test_leaf_spine_reaches_every_host_and_caps_the_server_links():
    from topologies.testbed import Testbed
    spec = TestbedSpec(topology="leafspine", servers=2, clients=2, leaves=2, spines=2,
                       server_link=LinkSpec(rate_mbit=50))
    with Testbed(spec) as bed:
        assert bed.net.pingAll(timeout=2) == 0.0  # floods follow the tree: no storm, every pair answers
        assert sorted(s.name for s in bed.net.switches) == ["leaf1", "leaf2", "spine1", "spine2"]
        assert all(port.startswith("leaf") for port in bed.monitor_ports)
        assert "rate 50Mbit" in bed.server_hosts[0].cmd("tc class show dev srv1-eth0")
        from mbalancer.memcache.meta import MetaClient
        for address in bed.addresses:  # the controller's port reaches every memcached through the fabric
            MetaClient(address).ping()
        pins = [PIN_ROOT / name for name in bed.dataplane().settings.switches]
        recorded = json.loads(Path("/run/mbalancer/network.lock").read_text())["made"]  # for a killed run's successor
        in_root = {intf.name for node in bed.net.switches + [bed.net.get("mbctl")] for intf in node.intfList()}
        assert set(recorded["interfaces"]) == in_root - {"lo"}
    assert not any(p.exists() for p in pins)
    assert subprocess.run(["ip", "link", "show", "mbctl-eth0"], capture_output=True).returncode != 0


# Runs on a client host: gets of one key over a connected UDP socket, each with its own request id; prints how many
# were answered (a reply from any address but the home's is not).
UDP_GETS = r"""
import random, socket, struct, sys
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
sock.connect((sys.argv[1], 11211))
sock.settimeout(1.0)
answered, rng = 0, random.Random(2)
for _ in range(int(sys.argv[3])):
    rid = rng.randrange(65536)
    sock.send(struct.pack("!HHHH", rid, 0, 1, 0) + b"get " + sys.argv[2].encode() + b"\r\n")
    try:
        while sock.recv(65535)[:2] != struct.pack("!H", rid):
            pass
        answered += 1
    except socket.timeout:
        pass
print(answered)
"""


@needs_testbed
def test_leaf_spine_on_bmv2_floods_along_the_tree_and_balances_each_get_once(tmp_path):
    """Four bmv2 switches: floods follow the tree (every pair answers, no storm); a hot key's gets are balanced by the
    client's leaf only (the others see the mark), spread over both servers, and answered from the home's address."""
    if (why := registry.get("p4").available()) is not None:
        pytest.skip(f"the p4 data plane cannot run here: {why}")
    from dataplanes.driver import ReplicaWeight
    from topologies.testbed import Testbed
    spec = TestbedSpec(topology="leafspine", servers=2, clients=2, leaves=2, spines=2, dataplane="p4")
    with Testbed(spec) as bed:
        assert bed.net.pingAll(timeout=2) == 0.0
        for address in bed.addresses:
            store_closed(address, b"k")
        kind = registry.get("p4")
        driver = kind.make_driver(bed.dataplane().settings)
        driver.attach(bed.servers, lambda frame: None)
        try:
            driver.install_hot_key(b"k", 0, [ReplicaWeight(0, 0.5), ReplicaWeight(1, 0.5)])
            driver.renew_lease(3600)
            driver.clear_dirty(b"k", driver.write_stamp(b"k"))
            script = tmp_path / "gets.py"
            script.write_text(UDP_GETS)
            answered = bed.client_hosts[0].cmd(f"python3 {script} {bed.servers[0].ip} k 200").strip()
            assert answered == "200"  # a connected socket: every reply came from the home's address
            counts = driver.switch_counters()
            per_replica = driver.read_counters().keys[b"k"].per_replica
            assert sum(per_replica.values()) == 200 and min(per_replica.get(s, 0) for s in (0, 1)) > 50
            assert sum(c["balanced"] for c in counts) == 200  # once each, at the client's leaf (leaf2) ...
            # ... and left alone by the spine and leaf1 on the way to srv1 (srv2 sits on leaf2 with the client; a
            # frame flooded before its destination was learned passes more switches: at least, not exactly)
            assert sum(c["already_balanced"] for c in counts) >= 2 * per_replica[0]
        finally:
            driver.close()


# Runs on a client host: UDP sets of one key, each waiting for its STORED; prints how many were stored.
UDP_SETS = r"""
import socket, struct, sys
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
sock.connect((sys.argv[1], 11211))
sock.settimeout(1.0)
stored = 0
for rid in range(int(sys.argv[3])):
    sock.send(struct.pack("!HHHH", rid, 0, 1, 0) + b"set " + sys.argv[2].encode() + b" 0 0 2\r\nv%d\r\n" % (rid % 10))
    try:
        stored += sock.recv(65535)[8:] == b"STORED\r\n"
    except socket.timeout:
        pass
print(stored)
"""


def fabric_with_a_hot_key(bed):
    """The fabric's driver, attached, with key k (value v at both servers) installed at its home srv1, balanced
    50/50 and clean; and the list its mirrored writes go to."""
    from dataplanes.driver import ReplicaWeight
    for address in bed.addresses:
        store_closed(address, b"k")  # both FINs passed: none is taken for the server's own close once attached
    mirrors: list[bytes] = []
    driver = registry.get("agent").make_driver(bed.dataplane().settings)
    driver.attach(bed.servers, mirrors.append)
    driver.install_hot_key(b"k", 0, [ReplicaWeight(0, 0.5), ReplicaWeight(1, 0.5)])
    driver.renew_lease(3600)
    driver.clear_dirty(b"k", driver.write_stamp(b"k"))
    return driver, mirrors


@needs_testbed
@pytest.mark.parametrize("dataplane", ["ebpf", "openflow", pytest.param("p4", marks=pytest.mark.skipif(
    registry.get("p4").available() is not None, reason=f"no p4: {registry.get('p4').available()}"))])
def test_a_fabric_of_switch_agents_balances_each_get_at_its_homes_leaf(tmp_path, dataplane):
    """Four switches (eBPF, Open vSwitch with the key classifier, or bmv2), each on a box of its own behind its agent,
    driven over the management LAN: a hot key's gets from the far leaf are balanced by the home's leaf only, spread
    over both servers and answered from the home's address (the replica's leaf rewrites the reply); each write is
    mirrored once; after a write from the home's leaf, the far leaf's clients' gets go home (no switch that never saw
    the write balances them)."""
    from topologies.testbed import Testbed
    spec = TestbedSpec(topology="leafspine", servers=2, clients=2, leaves=2, spines=2, agents=True,
                       dataplane=dataplane)
    with Testbed(spec) as bed:
        settings = bed.dataplane().settings
        assert bed.dataplane().kind == "agent" and all(not b.startswith("127.") for b in settings.boxes)
        assert Path(settings.token_file).stat().st_mode & 0o077 == 0  # the shared token: the owner's alone
        driver, mirrors = fabric_with_a_hot_key(bed)
        try:
            (tmp_path / "gets.py").write_text(UDP_GETS)
            (tmp_path / "sets.py").write_text(UDP_SETS)
            far, near = bed.client_hosts  # cli1 on leaf2 (srv2's), cli2 on leaf1 (srv1's: the home's)
            answered = far.cmd(f"python3 {tmp_path}/gets.py {bed.servers[0].ip} k 200").strip()
            assert answered == "200"  # a connected socket: every reply came from the home's address
            # OVS updates its group's bucket counters a moment later
            eventually(lambda: sum(driver.read_counters().keys[b"k"].per_replica.values()) >= 200, every=0.1)
            per_replica = driver.read_counters().keys[b"k"].per_replica
            assert sum(per_replica.values()) == 200 and min(per_replica.get(s, 0) for s in (0, 1)) > 50
            balanced = {box.switch: counts["balanced"]
                        for box, counts in zip(bed.agents.boxes, driver.switch_counters())}
            assert balanced == {"spine1": 0, "spine2": 0, "leaf1": 200, "leaf2": 0}
            # each server's MAC as the boxes saw its TCP segments (a connection of this host's to each, as the
            # controller's copies and probes bring): right, whatever the boxes flooded while they learned where the
            # servers are (controller/mac_check.py); bmv2 cannot tell
            for address in bed.addresses:
                store_closed(address, b"seen")
            macs = driver.server_macs()
            assert macs is None if dataplane == "p4" else \
                [(v.status, v.seen) for v in verdicts(bed.servers, macs)] == [
                    (MacStatus.OK, (server.mac,)) for server in bed.servers], macs
            assert near.cmd(f"python3 {tmp_path}/sets.py {bed.servers[0].ip} k 5").strip() == "5"
            deadline = time.monotonic() + 10
            while len(mirrors) < 5 and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(0.5)  # any second copy would have come by now
            assert len(mirrors) == 5 and driver.read_counters().keys[b"k"].mirrored == 5
            before = driver.read_counters().keys[b"k"]
            assert far.cmd(f"python3 {tmp_path}/gets.py {bed.servers[0].ip} k 40").strip() == "40"
            after = driver.read_counters().keys[b"k"]
            assert after.home_while_dirty - before.home_while_dirty == 40 and after.per_replica == before.per_replica
        finally:
            driver.close()


TCP_GETS = r"""
import socket, sys
sock = socket.create_connection((sys.argv[1], 11211), timeout=2)
answered = 0
for _ in range(int(sys.argv[3])):
    sock.sendall(b"get " + sys.argv[2].encode() + b"\r\n")
    reply = b""
    while not reply.endswith(b"END\r\n"):
        chunk = sock.recv(65536)
        if not chunk:
            break
        reply += chunk
    answered += reply.startswith(b"VALUE ")
print(answered)
"""

TCP_SETS = r"""
import socket, sys
sock = socket.create_connection((sys.argv[1], 11211), timeout=2)
stored = 0
for n in range(int(sys.argv[3])):
    sock.sendall(b"set " + sys.argv[2].encode() + b" 0 0 2\r\nv%d\r\n" % (n % 10))
    stored += sock.recv(64) == b"STORED\r\n"
print(stored)
"""


@needs_testbed
def test_a_fabric_of_boxes_takes_tcp_connections_at_the_homes_leaf_and_balances_their_gets(tmp_path):
    """Four eBPF switches behind their agents, each leaf with its TCP path (its splitter in its box): a client on
    the far leaf connects to the home on the near leaf over TCP; the far leaf passes the connection on, the home's
    leaf takes it and spreads its gets over both servers (the replica's leaf passes the splitter's own connection on,
    and the replica's answers come back through the home's leaf); after writes over TCP from the home's leaf, the
    far client's gets go home."""
    from topologies.testbed import Testbed
    spec = TestbedSpec(topology="leafspine", servers=2, clients=2, leaves=2, spines=2, agents=True, tcp=True)
    with Testbed(spec) as bed:
        driver, mirrors = fabric_with_a_hot_key(bed)
        try:
            (tmp_path / "gets.py").write_text(TCP_GETS)
            (tmp_path / "sets.py").write_text(TCP_SETS)
            far, near = bed.client_hosts  # cli1 on leaf2 (srv2's), cli2 on leaf1 (srv1's: the home's)
            assert far.cmd(f"python3 {tmp_path}/gets.py {bed.servers[0].ip} k 200").strip() == "200"
            per_replica = driver.read_counters().keys[b"k"].per_replica
            assert sum(per_replica.values()) == 200 and min(per_replica.get(s, 0) for s in (0, 1)) > 50, per_replica
            taken = {box.switch: (counts["tcp_connections"], counts["tcp_balanced"])
                     for box, counts in zip(bed.agents.boxes, driver.switch_counters())}
            assert {box: n for box, (n, _) in taken.items()} == {"spine1": 0, "spine2": 0, "leaf1": 1, "leaf2": 0}
            assert taken["leaf1"][1] == per_replica[1]  # balanced by the home's leaf's splitter
            assert near.cmd(f"python3 {tmp_path}/sets.py {bed.servers[0].ip} k 5").strip() == "5"
            assert eventually(lambda: len(mirrors) >= 5, every=0.05), mirrors
            before = driver.read_counters().keys[b"k"]
            assert far.cmd(f"python3 {tmp_path}/gets.py {bed.servers[0].ip} k 40").strip() == "40"
            after = driver.read_counters().keys[b"k"]
            assert after.home_while_dirty - before.home_while_dirty == 40 and after.per_replica == before.per_replica
        finally:
            driver.close()


@needs_testbed
def test_a_delay_that_cannot_apply_is_refused():
    from topologies.testbed import Testbed
    netem = subprocess.run(["tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"],
                           capture_output=True).returncode == 0
    if netem:
        subprocess.run(["tc", "qdisc", "del", "dev", "lo", "root"], capture_output=True)
        with Testbed(TestbedSpec(servers=1, clients=1, client_link=LinkSpec(delay_ms=5))) as bed:
            assert "netem" in bed.client_hosts[0].cmd("tc qdisc show dev cli1-eth0")
    else:
        with pytest.raises(TopologyError, match="netem"):
            Testbed(TestbedSpec(servers=1, clients=1, client_link=LinkSpec(delay_ms=5))).start()
        assert not (PIN_ROOT / "sw1").exists()  # a failed start leaves nothing behind


# --- the whole loop -------------------------------------------------------------------------------------------
@needs_testbed
# One leaf-spine run, the mixed one: its spines and the busy home's leaf are eBPF boxes behind their agents, as in an
# all-eBPF leaf-spine, and its other leaf Open vSwitch (an all-eBPF run beside it took a minute and added no path).
@pytest.mark.parametrize("dataplane", ["ebpf", "openflow", "p4", "ebpf,openflow/leafspine"])
def test_demo_end_to_end(run_cli, tmp_path, dataplane):
    """Two servers at IF 0.7, 64 clients: MBalancer installs the hot keys, copies them, the switch spreads them, so
    the busiest server's share of gets falls from the hash's 0.71 to about a half, with no miss. On the eBPF switch
    with the core in this process; on Open vSwitch with the core inside ryu-manager (the Ryu app); on bmv2 over
    P4Runtime, at the rates the experiment scales to for it (experiments/endtoend/spec.py on_dataplane); and on a
    leaf-spine of four switches, each behind its switch agent on a box of its own, balanced at the home's leaf, a
    mixed one (leaf1 and the spines eBPF, leaf2 Open vSwitch: the busy home's leaf balances, the other kind's leaf
    answers for it; tests/test_mixed_fabric.py asserts each kind's part get by get).
    Throughput, gain and how close it comes to the model depend on how busy the machine is: the experiment prints
    them (`make demo`), and this test asserts only that it says what limited a run that its servers did not."""
    dataplane, _, topology = dataplane.partition("/")
    for kind in dataplane.split(","):
        if (why := registry.get(kind).available()) is not None:
            pytest.skip(f"the {kind} data plane cannot run here: {why}")
    result = run_cli("experiment", "demo", "--out", str(tmp_path), "--warmup", "3", "--measure", "3",
                     "--dataplane", dataplane, *(["--topology", topology] if topology else []), timeout=240)
    assert result.returncode == 0, result.stderr[-2000:]
    line = json.loads(result.stdout.strip().splitlines()[-1])
    base, mb = line["baseline"], line["mbalancer"]
    # The share is measured over the window's gets, each sent to the busier server with probability 0.714: four
    # standard deviations of that count's share, at least 0.03. bmv2 under two CPU hogs answered few enough gets in
    # 3 s for 0.668 and 0.658 to be seen (a fixed 0.05 failed on the second).
    gets = base["throughput"] * 3
    tolerance = max(0.03, 4 * math.sqrt(0.714 * 0.286 / max(gets, 1)))
    assert line["gain"] > 0 and base["max_server_share"] == pytest.approx(0.714, abs=tolerance), (gets, base)
    summary = json.loads((tmp_path / "summary.json").read_text())
    run = next(r for r in summary["runs"] if r["mode"] == "mbalancer")
    # About a half once the ten hot keys are in and the servers limit the run. A busy machine (two CPU hogs beside
    # bmv2: 0.56-0.59 in 3 of 9 runs, with the code before this session's changes as after) finds fewer hot keys in
    # the 3 s warm-up or runs out of CPU first, and spreads less; it must still move well towards balance.
    settled = mb["limit"] == "servers" and run["hot_keys"] >= 10
    state = json.loads((tmp_path / "skewed_0.7" / "mbalancer-weighted" / "state.json").read_text())
    decided = [f"{d['action']} {d.get('key')}: {d['reason']}" for d in state["decisions"]]  # why, if it fails
    assert mb["max_server_share"] < (0.56 if settled else 0.64), (mb, run["hot_keys"], decided)
    # on p4 read through the controller; a leaf-spine's gets enter at every leaf: captured there
    assert summary["detection"] == line["detection"] == ("capture" if topology else "sketch")
    capacity = next(r for r in summary["runs"] if r["mode"] == "calibration")
    for name, figures in (("baseline", base), ("mbalancer", mb)):
        if figures["limit"] != "servers" or capacity["limit"] != "servers":
            limited = capacity if capacity["limit"] != "servers" else figures
            assert f"limited by {limited['limit']}, not by its servers" in result.stderr, name
    # on bmv2 the run is ~1/6 of the rate: the tenth hottest key gets a few gets/s and the monitor finds 6-10 of the
    # ten within the short warm-up (measured: 6 once in 6 runs, 8-10 otherwise), enough for the balance asserted above
    least = 5 if "p4" in dataplane else 8
    assert run["hot_keys"] >= least and run["bytes_copied"] >= least * 10_000
    assert run["misses"] == 0  # every balanced get found its copy (a timeout on a busy machine is not a miss)
    assert state["counters"]["data_plane"]["keys"]  # the switch counted gets for the hot keys
    for name in ("runs.csv", "fig5_1.png", "fig5_2.png", "servers.png"):
        assert (tmp_path / name).stat().st_size > 0
    assert not (PIN_ROOT / "sw1").exists() and not (CLASSIFIER.pin_root / "sw1").exists()
    assert not list(Path("/run/netns").glob("mbbox-*")) and not list(PIN_ROOT.glob("leaf*"))  # boxes gone too
    assert not (RUN_ROOT / "sw1").exists()  # the private Open vSwitch went with the testbed, its bridge's tap too
    assert "sw1-" not in subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert "sw1" not in subprocess.run(["pgrep", "-a", "simple_switch"], capture_output=True, text=True).stdout


@needs_testbed
def test_an_interrupted_experiment_removes_what_it_made(tmp_path):
    from tests.conftest import MBALANCER
    process = subprocess.Popen([str(MBALANCER), "experiment", "demo", "--out", str(tmp_path), "--warmup", "2",
                                "--measure", "5"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (tmp_path / "skewed_0.7" / "mbalancer-weighted").exists() and time.monotonic() < deadline:
        time.sleep(0.2)  # interrupt in the middle of the MBalancer run: controller, monitor and load all up
    time.sleep(3)  # inside the run's 2 s warm-up and 5 s window, whatever the machine's speed: they start after this
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 130, err[-2000:]
    assert "interrupted" in err
    assert not (PIN_ROOT / "sw1").exists()
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert "mbctl-eth0" not in links and "sw1-" not in links
    memcached = subprocess.run(["pgrep", "-af", "memcached -l 10.0.0."], capture_output=True, text=True).stdout
    assert not memcached.strip()
    hosts = subprocess.run(["pgrep", "-af", "mininet:"], capture_output=True, text=True).stdout
    assert not hosts.strip()  # every host's shell (and with it its namespace) is gone
    assert not Path(tmp_path / "summary.json").exists()
