"""The OpenFlow driver's decisions against a recorded flow table (faucet's way: no switch needed), with the real key
classifier loaded in the kernel; and every message it builds decoded by Open vSwitch's own parser (ovs-ofctl)."""
from __future__ import annotations

import os
import re
import shutil
import socket
import struct
import subprocess
import time

import pytest

from dataplanes.driver import Distrust, DriverError, ReplicaWeight
from dataplanes.bpf.program import CLASSIFIER, DataPlane, available as ebpf_available
from dataplanes.bpf.tables import Tables
from dataplanes.openflow import Settings, tags
from dataplanes.openflow.ovs import OpenVSwitch, available as ovs_available
from dataplanes.openflow.weights import bucket_weights, win_shares
from mbalancer.config import Server
from mbalancer.macs import mac_bytes
from tests.conftest import eventually
from dataplanes.openflow.driver import OpenflowDriver, driver_from_settings
from dataplanes.openflow import messages
from tests.openflow_switch import Datapath, RecordedSwitch
from ryu.ofproto import ofproto_v1_5 as ofp
from ryu.ofproto import ofproto_v1_5_parser as parser

SERVERS = (Server("s1", "10.0.0.1", "02:00:00:00:00:01"), Server("s2", "10.0.0.2", "02:00:00:00:00:02"),
           Server("s3", "10.0.0.3", "02:00:00:00:00:03", 11311))
why_not = ("needs root (bpf)" if os.geteuid() else None) or ebpf_available() or \
    (None if CLASSIFIER.object.exists() else f"{CLASSIFIER.object} is not built")


@pytest.fixture
def classifier():
    plane = DataPlane(f"ofd{os.getpid()}", CLASSIFIER).load()
    yield plane
    plane.unload()


@pytest.fixture
def switch():
    return RecordedSwitch()


@pytest.fixture
def driver(classifier, switch):
    driver = OpenflowDriver(Settings(classifier=classifier.name), switch)
    driver.attach(SERVERS, lambda frame: None)
    yield driver
    driver.close()


def replicas(*weights: float) -> list[ReplicaWeight]:
    return [ReplicaWeight(i, w) for i, w in enumerate(weights)]


pytestmark = pytest.mark.skipif(why_not is not None, reason=f"the key classifier cannot load here: {why_not}")


def test_attach_programs_the_pipeline_and_every_server(driver, switch):
    tables = {key[0] for key in switch.flows}
    assert tables == {messages.LEARN, messages.TAGS, messages.L2}
    copies = [key for key in switch.flows if "0e:02:" in key[2]]
    replies = [key for key in switch.flows if "0e:03:" in key[2]]
    assert len(copies) == len(replies) == len(SERVERS)


def test_install_makes_a_group_by_weight_and_holds_the_key_dirty(driver, switch, classifier):
    driver.install_hot_key(b"hot", 0, replicas(0.2, 0.3, 0.5))
    slot = driver.slots[b"hot"]
    group = switch.group_of_get(slot)
    assert group == messages.group_id(slot)
    weights = switch.weights(group)
    assert list(weights) == ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
    assert list(weights.values()) == bucket_weights([0.2, 0.3, 0.5])
    tables = Tables(classifier.pin_dir)
    try:
        assert tables.hot(b"hot").slot == slot and tables.dirty(slot, 0)  # no get is tagged until the core clears
    finally:
        tables.close()


def test_a_replica_weighted_zero_has_no_bucket(driver, switch):
    driver.install_hot_key(b"hot", 0, replicas(0.2, 0.3, 0.5))
    driver.set_weights(b"hot", replicas(0.5, 0.0, 0.5))
    weights = switch.weights(messages.group_id(driver.slots[b"hot"]))
    assert list(weights) == ["10.0.0.1", "10.0.0.3"] and len(set(weights.values())) == 1


def test_remove_stops_the_classifier_before_the_rules_go(driver, switch, classifier):
    driver.install_hot_key(b"hot", 0, replicas(0.5, 0.5, 0.0))
    slot = driver.slots[b"hot"]
    tables = Tables(classifier.pin_dir)
    seen = []
    original = switch.send
    switch.send = lambda dp, batch: (seen.append(tables.hot(b"hot")), original(dp, batch))
    try:
        driver.remove_hot_key(b"hot")
    finally:
        tables.close()
    assert seen == [None]  # by the time the delete went out, no get was tagged for the key any more
    assert switch.group_of_get(slot) is None and messages.group_id(slot) not in switch.groups


def test_an_install_the_switch_refuses_leaves_nothing(driver, switch, classifier):
    switch.refuse_groups = True
    with pytest.raises(DriverError, match="refused"):
        driver.install_hot_key(b"hot", 0, replicas(0.5, 0.5, 0.0))
    assert b"hot" not in driver.slots
    tables = Tables(classifier.pin_dir)
    try:
        assert tables.hot(b"hot") is None
    finally:
        tables.close()
    switch.refuse_groups = False
    driver.install_hot_key(b"hot", 0, replicas(0.5, 0.5, 0.0))  # the slot was freed: it installs later


def test_a_switch_that_connects_again_gets_the_same_rules(driver, switch):
    driver.install_hot_key(b"a", 0, replicas(0.5, 0.5, 0.0))
    driver.install_hot_key(b"b", 1, replicas(0.1, 0.6, 0.3))
    flows, groups = dict(switch.flows), {g: switch.weights(g) for g in switch.groups}
    switch.restart()
    driver.switch_connected(switch.dp)
    assert switch.flows.keys() == flows.keys()
    assert {g: switch.weights(g) for g in switch.groups} == groups


def rules_written(sent) -> list:
    return [m for m in sent if isinstance(m, (parser.OFPFlowMod, parser.OFPGroupMod))]


def test_a_driver_that_takes_over_keeps_every_flow_and_group_that_agrees_and_writes_none(classifier, switch):
    """A new leader (or an agent's controller come back) reads the groups and flows back from the switch: the ones
    its classifier entries agree with stay as they are, weights solved again from the entries' rounded shares
    included."""
    first = OpenflowDriver(Settings(classifier=classifier.name), switch)
    first.attach(SERVERS, lambda frame: None)
    first.install_hot_key(b"a", 0, replicas(0.5, 0.5, 0.0))
    first.install_hot_key(b"b", 1, replicas(0.1, 0.6, 0.3))
    first.renew_lease(30)
    first.let_go()  # its lease left to run out: the next one adopts
    before, switch.sent = (dict(switch.flows), {g: switch.weights(g) for g in switch.groups}), []
    second = OpenflowDriver(Settings(classifier=classifier.name), switch)
    try:
        found = second.attach(SERVERS, lambda frame: None)
        assert {f.key: f.distrust for f in found} == {b"a": None, b"b": None}
        assert rules_written(switch.sent) == [], switch.sent  # read back, nothing written
        assert (switch.flows, {g: switch.weights(g) for g in switch.groups}) == before
        second.set_weights(b"b", replicas(0.2, 0.5, 0.3))  # goes on from there
        assert list(switch.weights(messages.group_id(second.slots[b"b"])).values()) == bucket_weights([0.2, 0.5, 0.3])
    finally:
        second.close()


def test_a_flow_read_back_with_its_match_fields_in_another_order_is_the_same_flow():
    """Ryu sorts a match it builds by OXM field number; Open vSwitch answers in its own order (source MAC before
    destination MAC). Compared by their order, a takeover would take the server's flood rule for another one: delete
    it and write it again (losing its count), or, written before the deletion, lose it."""
    built = messages.server_rules(Datapath(), SERVERS[:1])[-1]
    fields = built.match.to_jsondict()["OFPMatch"]["oxm_fields"]
    assert [f["OXMTlv"]["field"] for f in fields][:2] == ["eth_dst", "eth_src"]
    as_ovs = parser.OFPMatch(_ordered_fields=[(f["OXMTlv"]["field"], f["OXMTlv"]["value"]) for f in
                                              [fields[1], fields[0], *fields[2:]]])
    read_back = parser.OFPFlowDesc(built.table_id, built.priority, 0, 0, 0, 0, built.cookie, as_ovs, None,
                                   built.instructions)
    assert messages.flow_of(read_back).key == messages.flow_of(built).key


def test_the_gets_flooded_to_a_servers_mac_are_counted_from_when_the_driver_wrote_the_rules(classifier, switch):
    """Each server's balanced gets flooded (controller/mac_check.py) are its L2 flood rule's count since this
    driver wrote the switch's rules: what the switch counted under a controller before is not held against it, and
    a switch that restarted counts afresh."""
    first = OpenflowDriver(Settings(classifier=classifier.name), switch)
    first.attach(SERVERS, lambda frame: None)
    assert [m.flooded for m in first.server_macs()] == [0, 0, 0]
    switch.flood(SERVERS[1], 4)
    assert [m.flooded for m in first.server_macs()] == [0, 4, 0]
    first.let_go()
    second = OpenflowDriver(Settings(classifier=classifier.name), switch)
    try:
        second.attach(SERVERS, lambda frame: None)  # the flood rules kept, with their counts
        assert [m.flooded for m in second.server_macs()] == [0, 0, 0]
        switch.flood(SERVERS[2], 2)
        assert [m.flooded for m in second.server_macs()] == [0, 0, 2]
        switch.restart()
        second.switch_connected(switch.dp)
        switch.flood(SERVERS[0], 1)
        assert [m.flooded for m in second.server_macs()] == [1, 0, 0]
        assert [m.seen for m in second.server_macs()] == [(), (), ()]  # no TCP segment of theirs crossed it
    finally:
        second.close()


def test_a_key_whose_group_disagrees_with_its_classifier_entry_is_rebuilt_alone(classifier, switch):
    first = OpenflowDriver(Settings(classifier=classifier.name), switch)
    first.attach(SERVERS, lambda frame: None)
    for key, home in ((b"a", 0), (b"b", 1), (b"c", 2)):
        first.install_hot_key(key, home, replicas(0.5, 0.5, 0.0))
    slots = dict(first.slots)
    first.renew_lease(30)
    first.let_go()
    # b's group sends gets to server 3 too (a copy nobody keeps in sync); c's flow is gone
    switch.apply(messages.hot_group(switch.dp, slots[b"b"], [(0, SERVERS[0], 100), (2, SERVERS[2], 100)], "hash",
                                    add=False)[0])
    switch.apply(messages.remove_hot(switch.dp, slots[b"c"])[0])
    switch.sent = []
    second = OpenflowDriver(Settings(classifier=classifier.name), switch)
    tables = Tables(classifier.pin_dir)
    try:
        found = {f.key: f for f in second.attach(SERVERS, lambda frame: None)}
        assert {k: f.distrust for k, f in found.items()} == {b"a": None, b"b": Distrust.RULES_DISAGREE,
                                                             b"c": Distrust.RULES_DISAGREE}
        assert set(second.slots) == {b"a"} and set(tables.held_keys()) == {b"a"}  # no get tagged for b or c
        assert set(switch.groups) == {messages.group_id(slots[b"a"])}
        assert [switch.group_of_get(slots[k]) for k in (b"a", b"b", b"c")] == [messages.group_id(slots[b"a"]),
                                                                                None, None]
        assert all(m.command in (ofp.OFPFC_DELETE_STRICT, ofp.OFPGC_DELETE) for m in rules_written(switch.sent)), \
            switch.sent  # a's group and flow untouched: only b's and c's rules removed
    finally:
        tables.close()
        second.close()


def test_gets_per_replica_come_from_the_bucket_counters(driver, switch):
    driver.install_hot_key(b"hot", 0, replicas(0.5, 0.0, 0.5))
    switch.bucket_packets = {messages.group_id(driver.slots[b"hot"]): [7, 11]}
    counters = driver.read_counters()
    assert counters.keys[b"hot"].per_replica == {0: 7, 1: 0, 2: 11}  # no bucket for server 1: none of its gets


def test_refusals_outside_ryu_and_for_bad_settings(classifier, switch):
    with pytest.raises(DriverError, match="mbalancer-ryu-manager"):
        driver_from_settings(Settings())
    with pytest.raises(DriverError, match="selection"):
        OpenflowDriver(Settings(classifier=classifier.name, selection="random"), switch)
    with pytest.raises(DriverError, match="no key classifier named nosuch"):
        OpenflowDriver(Settings(classifier="nosuch"), switch)


# --- the weights and the wire format, no classifier needed ----------------------------------------------------------

def test_bucket_weights_give_the_shares_under_ovs_rendezvous_selection():
    assert list(win_shares([1, 2]).round(6)) == [0.25, 0.75]  # not 1/3, 2/3: why the weights are solved for
    for shares in ([0.5, 0.5], [0.1, 0.3, 0.6], [0.05] * 4 + [0.8], [0.01, 0.99], [1 / 8] * 8):
        weights = bucket_weights(shares)
        assert all(1 <= w <= 65535 for w in weights)
        assert max(abs(win_shares(weights) - shares)) < 2e-4, (shares, weights)
    with pytest.raises(ValueError):
        bucket_weights([0.5, 0.0])


@pytest.mark.skipif(shutil.which("ovs-ofctl") is None, reason="ovs-ofctl (openvswitch-switch) is not installed")
def test_every_message_decodes_with_open_vswitchs_own_parser():
    dp = Datapath()
    built = (messages.base_pipeline(dp) + messages.server_rules(dp, SERVERS[:1])
             + messages.hot_group(dp, 3, [(0, SERVERS[0], 100), (2, SERVERS[2], 200)], "hash", add=True)
             + messages.hot_group(dp, 3, [(0, SERVERS[0], 100)], "dp_hash", add=False)
             + messages.hot_flow(dp, 3) + messages.remove_hot(dp, 3))
    printed = []
    for message in built:
        message.serialize()
        result = subprocess.run(["ovs-ofctl", "ofp-print", bytes(message.buf).hex()], capture_output=True, text=True)
        assert result.returncode == 0 and "decode error" not in result.stdout + result.stderr, result
        printed.append(result.stdout)
    text = "".join(printed)
    for expected in ("learn(table=2,idle_timeout=300,priority=10,cookie=0x4d42,NXM_OF_ETH_DST[]=NXM_OF_ETH_SRC[],"
                     "output:NXM_OF_IN_PORT[])",
                     "dl_dst=0e:02:00:00:00:00 cookie:0x4d42 out_port:0 actions=set_field:02:00:00:00:00:01->eth_dst,"
                     "CONTROLLER:65535,goto_table:2",
                     "set_field:10.0.0.1->ip_src,set_field:11211->udp_src",
                     "group_id=4,type=select,selection_method=hash,fields=eth_dst,bucket=bucket_id:0,weight:100",
                     "bucket=bucket_id:2,weight:200,actions=set_field:02:00:00:00:00:03->eth_dst,"
                     "set_field:10.0.0.3->ip_dst,set_field:11311->udp_dst,set_field:0e:04:00:00:00:00->eth_src,"
                     "set_field:0->in_port,resubmit(,2)",
                     "MOD group_id=4,type=select,selection_method=dp_hash",
                     "priority=200,dl_dst=0e:01:00:03:00:00/ff:ff:ff:ff:00:00 cookie:0x4d42 out_port:0 actions=group:4",
                     "DEL_STRICT table:1 priority=200,dl_dst=0e:01:00:03:00:00/ff:ff:ff:ff:00:00"):
        assert expected in text, expected


def test_groups_read_back_are_the_groups_sent():
    """What a switch answers a group desc with reads back as the groups the driver sent: OVS's selection-method
    property (Ryu had no parser for it: the reply was dropped), every bucket's properties and every group's (Ryu read
    a bucket's, and a group's, on past its end into the next one, and looped for ever on a length of 0 there)."""
    from ryu.ofproto import ofproto_parser
    dp = Datapath()
    sent, entries = [], b""
    for slot, selection in enumerate(("hash", "dp_hash", "default")):
        group = messages.hot_group(dp, slot, [(0, SERVERS[0], 100), (1, SERVERS[1], 50), (2, SERVERS[2], 9)],
                                   selection, add=True)[0]
        group.set_xid(1)
        group.serialize()
        back = ofproto_parser.msg(dp, ofp.OFP_VERSION, ofp.OFPT_GROUP_MOD, len(group.buf), 1, bytes(group.buf))
        assert back is not None and [len(b.properties) for b in back.buckets] == [1, 1, 1]
        assert messages.group_of(back) == messages.group_of(group)
        rest = bytes(group.buf[24:])  # the group mod's buckets and properties, as a group desc carries them
        entries += struct.pack("!HBxIH6x", 16 + len(rest), group.type, group.group_id, group.bucket_array_len) + rest
        sent.append(group)
    reply = struct.pack("!BBHIHH4x", ofp.OFP_VERSION, ofp.OFPT_MULTIPART_REPLY, 16 + len(entries), 1,
                        ofp.OFPMP_GROUP_DESC, 0) + entries
    held = messages.held_groups([ofproto_parser.msg(dp, ofp.OFP_VERSION, ofp.OFPT_MULTIPART_REPLY, len(reply), 1,
                                                    reply)])
    assert held == {g.group_id: messages.group_of(g) for g in sent}
    assert not held[1].same(messages.group_of(messages.hot_group(  # another replica in a bucket
        dp, 0, [(0, SERVERS[0], 100), (1, SERVERS[2], 50), (2, SERVERS[1], 9)], "hash", add=True)[0]), 64)


def test_tags_round_trip_and_refuse_what_is_not_one():
    assert tags.tag(tags.GET, 0x0102, 0x0304) == "0e:01:01:02:03:04"
    assert tags.parse_tag("0e:01:01:02:03:04") == (tags.GET, 0x0102, 0x0304)
    assert tags.parse_tag("02:00:00:00:00:01") is None and tags.parse_tag("0e:09:00:00:00:00") is None
    with pytest.raises(ValueError):
        tags.tag(tags.COPY, 1 << 16)


@pytest.mark.skipif(os.geteuid() != 0 or ovs_available() is not None, reason="needs root and Open vSwitch")
def test_open_vswitch_spreads_tagged_gets_by_the_solved_weights():
    """Every one of the 1,024 entropy values a get's tag can carry, once, through a real select group: the bucket
    counts are the shares OVS gives those weights (deterministic: OVS's hash of each tag is fixed)."""
    shares = [0.1, 0.3, 0.6]
    weights = bucket_weights(shares)
    buckets = ",".join(f"bucket=bucket_id:{i},weight:{w},actions=set_field:10.0.0.{i + 1}->ip_dst"
                       for i, w in enumerate(weights))  # no output: counted, then dropped
    subprocess.run(["ip", "link", "add", "mbw-a", "type", "veth", "peer", "name", "mbw-b"], check=True)
    try:
        with OpenVSwitch("mbw") as ovs:
            for end in ("mbw-a", "mbw-b"):
                subprocess.run(["ip", "link", "set", end, "up"], check=True)
            ovs.add_bridge("mbw-of", ["mbw-a"], "tcp:127.0.0.1:9")  # no controller there: the rules below only
            ovs.ofctl("add-group", "mbw-of", f"group_id=1,type=select,selection_method=hash,fields(eth_dst),{buckets}")
            ovs.ofctl("add-flow", "mbw-of", "priority=10,dl_dst=0e:01:00:00:00:00/ff:ff:ff:ff:00:00,actions=group:1")
            with socket.socket(socket.AF_PACKET, socket.SOCK_RAW) as raw:
                raw.bind(("mbw-b", 0))
                for entropy in range(1 << tags.ENTROPY_BITS):
                    dst = mac_bytes(tags.tag(tags.GET, 0, entropy))
                    raw.send(dst + bytes.fromhex("020000000099") + b"\x08\x00" + bytes(46))
                    time.sleep(0.0002)  # the userspace datapath's receive queue is not deep
            stats = lambda: [int(n) for n in re.findall(r"bucket\d+:packet_count=(\d+)",  # noqa: E731
                                                        ovs.ofctl("dump-group-stats", "mbw-of"))]
            assert eventually(lambda: sum(stats()) == 1 << tags.ENTROPY_BITS, timeout=10), stats()
            counts = stats()
    finally:
        subprocess.run(["ip", "link", "del", "mbw-a"], capture_output=True)
    total = sum(counts)
    chi = sum((c - s * total) ** 2 / (s * total) for c, s in zip(counts, shares))
    assert chi < 13.8, counts  # 2 degrees of freedom, p = 0.001


def test_the_controller_command_points_to_the_ryu_app_for_openflow(run_cli, tmp_path):
    config = tmp_path / "c.toml"
    config.write_text('[[servers]]\nname = "a"\nip = "127.0.0.1"\nmac = "02:00:00:00:00:01"\n')
    result = run_cli("controller", "--config", str(config), "--driver", "openflow", "--duration", "1")
    assert result.returncode == 2 and "mbalancer-ryu-manager" in result.stderr and "Traceback" not in result.stderr


def test_the_classifier_marks_the_gets_it_tags_and_rewrites_replies_to_gets_another_switch_balanced(driver,
                                                                                                      classifier):
    """A fabric's two halves in the classifier: a clean hot get leaves tagged GET(slot) and marked balanced with its
    home's index as IP ID (for the replica's switch); a reply to a get that another switch balanced (seen marked on
    its way to the replica, with the BALANCED tag as its source so that the switch learns no client from it) leaves with
    the home's source IP and port, the replica's MAC kept, and no tag."""
    from scapy.all import IP, Ether
    from tests.conftest import run_program
    from tests.pipeline_fixtures import IP_BALANCED, balanced_to, from_home, reply, request

    def run(packet: bytes) -> bytes:
        return run_program(classifier.program_pin, packet)

    driver.install_hot_key(b"hot", 2, replicas(0.5, 0.0, 0.5))
    driver.renew_lease(60)
    driver.clear_dirty(b"hot", driver.write_stamp(b"hot"))
    out = Ether(run(request(b"get hot\r\n", to=2, request_id=9)))
    assert tags.parse_tag(out.dst)[:2] == (tags.GET, driver.slots[b"hot"])
    assert int(out[IP].flags) & IP_BALANCED and out[IP].id == 2
    sent = out[IP].chksum
    del out[IP].chksum
    assert Ether(bytes(out))[IP].chksum == sent  # the IP checksum fixed for the mark

    get = request(b"get cold\r\n", to=2, request_id=11)  # balanced by the home's switch, on its way to server 1
    passed = Ether(run(balanced_to(get, 1, home=2)))  # not ours: passed on, its source made a tag no switch learns
    assert passed.src == tags.tag(tags.BALANCED, 0)
    passed.src = Ether(balanced_to(get, 1, home=2)).src
    assert bytes(passed) == balanced_to(get, 1, home=2)
    answer = reply(b"VALUE cold 0 1\r\nv\r\nEND\r\n", by=1, request_id=11)
    assert run(answer) == from_home(answer, 2, mac=False)


@pytest.mark.parametrize("hook", ["tc", "xdp"])
def test_the_classifier_records_the_mac_each_servers_tcp_segments_come_from(driver, classifier, hook):
    """What the controller compares with each configured server MAC (controller/mac_check.py), on either build of the
    classifier (tc, and XDP for a userspace datapath's ports): the source MAC of a server's TCP segment; a UDP
    reply's is not taken (in a fabric one may carry another server's MAC)."""
    from scapy.all import Ether
    from tests.conftest import run_program
    from tests.pipeline_fixtures import closing, reply

    pin = classifier.program_pin if hook == "tc" else classifier.load_xdp()

    def from_mac(frame: bytes, mac: str) -> bytes:
        out = Ether(frame)
        out.src = mac
        return bytes(out)

    real = "02:00:00:00:00:b2"  # server 1's NIC, where the config says 02:00:00:00:00:02
    run_program(pin, from_mac(reply(b"END\r\n", by=1, request_id=9), "02:00:00:00:00:c2"))
    assert [m.seen for m in driver.server_macs()] == [(), (), ()]
    run_program(pin, from_mac(closing(1, flags="A"), real))  # a segment of a controller's connection
    assert [m.seen for m in driver.server_macs()] == [(), (real,), ()]
