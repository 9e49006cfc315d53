"""ovs-vswitchd restarted under load on the fabric of four Open vSwitch boxes (two leaves, two spines, each behind
its switch agent): a restarted ovs-vswitchd has forgotten every port flag, so each leaf's agent sets no-flood on
its second uplink again before it puts its rules back (its connection to the bridge dropped and came back). No
loop: a broadcast reaches a host once; no miss: every get answered during and after the restart had the key's
value; and the gets are balanced at the home's leaf again, over both servers."""
from __future__ import annotations

import json
import re
import time

import pytest

from dataplanes import registry
from tests.conftest import eventually, why_no_mininet
from mbalancer.memcache.meta import MetaClient
from tests.test_experiments_endtoend import UDP_GETS, fabric_with_a_hot_key

why_not = why_no_mininet() or registry.get("openflow").available()
pytestmark = pytest.mark.skipif(why_not is not None, reason=f"the OVS fabric cannot run here: {why_not}")

LOAD = r"""
import json, random, socket, struct, sys, time
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
sock.connect((sys.argv[1], 11211))
sock.settimeout(0.2)
counts, rng, end = dict(value=0, miss=0, wrong=0, unanswered=0), random.Random(), time.monotonic() + float(sys.argv[3])
while time.monotonic() < end:
    rid = rng.randrange(65536)
    sock.send(struct.pack("!HHHH", rid, 0, 1, 0) + b"get " + sys.argv[2].encode() + b"\r\n")
    try:
        reply = sock.recv(65535)
        while reply[:2] != struct.pack("!H", rid):
            reply = sock.recv(65535)
    except socket.timeout:
        counts["unanswered"] += 1
        continue
    body = reply[8:]
    counts["value" if body == b"VALUE k 0 1\r\nv\r\nEND\r\n" else "miss" if body == b"END\r\n" else "wrong"] += 1
    time.sleep(0.002)
print(json.dumps(counts))
"""

BROADCASTS = r"""
import socket, sys
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
sock.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
for n in range(int(sys.argv[1])):
    sock.sendto(b"hello %d" % n, ("10.0.0.255", 9999))
"""

HEAR = r"""
import socket, sys, time
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
sock.bind(("0.0.0.0", 9999))
sock.settimeout(0.2)
print("listening", flush=True)
heard, end = 0, time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    try:
        heard += sock.recv(100).startswith(b"hello")
    except socket.timeout:
        pass
print(heard, flush=True)
"""


def no_flood_ports(switch) -> set[str]:
    """The bridge's ports whose OpenFlow 1.0 config says NO_FLOOD, as ovs-ofctl shows them."""
    shown = switch.ovs._run("ovs-ofctl", "-O", "OpenFlow10", "show", switch.bridge)
    return {name for name, config in re.findall(r"\d+\((\S+)\):.*?\n\s+config:\s+([^\n]*)", shown, re.S)
            if "NO_FLOOD" in config}


def uplinks_to(switch, spine: str) -> set[str]:
    return {i.name for i in switch.intfList() if i.link and spine in (i.link.intf1.node.name, i.link.intf2.node.name)}


def gets_served(bed) -> list[int]:
    """Each memcached's own count of the gets it answered."""
    return [int(MetaClient(address).stats()["cmd_get"]) for address in bed.addresses]


def heard_broadcasts(bed, tmp_path, count: int) -> int:
    """How many of `count` broadcasts from cli1 (on leaf2) reach srv1 (on leaf1): exactly `count` on a loop-free
    flood tree, more if a frame circles leaf-spine-leaf-spine."""
    (tmp_path / "hear.py").write_text(HEAR)
    (tmp_path / "broadcast.py").write_text(BROADCASTS)
    listener = bed.server_hosts[0].popen(["python3", str(tmp_path / "hear.py"), "3"], text=True)
    assert listener.stdout.readline().strip() == "listening"
    bed.client_hosts[0].cmd(f"python3 {tmp_path / 'broadcast.py'} {count}")
    return int(listener.communicate(timeout=30)[0].strip())


def test_ovs_vswitchd_restarts_under_load_and_the_agents_restore_no_flood_first(tmp_path):
    from dataplanes.openflow.mininet_switch import OpenflowSwitch
    from topologies.testbed import Testbed, TestbedSpec
    spec = TestbedSpec(topology="leafspine", servers=2, clients=2, leaves=2, spines=2, agents=True,
                       dataplane="openflow")
    with Testbed(spec) as bed:
        leaves = [bed.net.get("leaf1"), bed.net.get("leaf2")]
        flagged = {leaf.name: uplinks_to(leaf, "spine2") for leaf in leaves}
        assert all(len(ports) == 1 for ports in flagged.values()), flagged
        driver, _ = fabric_with_a_hot_key(bed)
        try:
            assert {leaf.name: no_flood_ports(leaf) for leaf in leaves} == flagged
            assert heard_broadcasts(bed, tmp_path, 5) == 5
            (tmp_path / "load.py").write_text(LOAD)
            loads = [host.popen(["python3", str(tmp_path / "load.py"), bed.servers[0].ip, "k", "12"], text=True)
                     for host in bed.client_hosts]  # the far leaf's client and the home leaf's
            time.sleep(2)
            ovs = OpenflowSwitch.shared
            ovs.stop_switch()  # as a crash would: every flow, group and port flag is gone
            ovs.start_switch()
            assert eventually(lambda: {leaf.name: no_flood_ports(leaf) for leaf in leaves} == flagged, timeout=20)
            assert eventually(lambda: all("group_id=" in ovs.ofctl("dump-groups", leaf.bridge) for leaf in leaves[:1]),
                              timeout=20)
            assert heard_broadcasts(bed, tmp_path, 5) == 5  # no loop
            counts = [json.loads(load.communicate(timeout=60)[0]) for load in loads]
            print(f"gets during and after the restart: {counts}")
            assert all(c["miss"] == 0 and c["wrong"] == 0 and c["value"] > 0 for c in counts), counts
            served = gets_served(bed)  # balanced again at the home's leaf: both servers answer the far client's gets
            (tmp_path / "gets.py").write_text(UDP_GETS)
            assert bed.client_hosts[0].cmd(f"python3 {tmp_path}/gets.py {bed.servers[0].ip} k 200").strip() == "200"
            more = [b - a for a, b in zip(served, gets_served(bed))]
            assert sum(more) == 200 and min(more) > 50, more
            log = "".join(agent.read_log() for agent in bed.agents.agents)
            assert log.count("port flags set") >= 4, log  # each leaf: at start, and again after the restart
        finally:
            driver.close()
