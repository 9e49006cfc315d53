"""A controller that takes over P4 switches adopts what they hold (issue 47, "a failover nobody notices"), on two
running bmv2 switches: the first driver leaves three keys (one clean, one held dirty, one with a replica at weight 0)
and lets go without ending its lease, as a killed or deposed controller does; a second driver attaches to the same
switches. Nothing is pushed: every table entry and counter reads back the same before and after, but those of the key
whose tables disagree between the two switches (the test takes a range out of one), which alone is taken out of
both and reported with why. The kept keys are balanced as they were and go on as the new driver's own. The lease is
asked of the switch (op 3) and kept as it is (a program without the query would have every key resynced,
`lease-unknown`: tests/test_p4runtime_driver.py)."""
from __future__ import annotations

import logging
import os
import random

import grpc
import pytest
from p4.v1 import p4runtime_pb2, p4runtime_pb2_grpc

from dataplanes import registry
from dataplanes.driver import Distrust, ForwardingEntry, ReplicaWeight
from mbalancer.config import Server

why_not = registry.get("p4").available() if os.geteuid() == 0 else "needs root (veths)"
pytestmark = pytest.mark.skipif(why_not is not None, reason=f"P4 data plane cannot run here: {why_not}")

SERVERS = [Server(f"s{i}", f"10.0.0.{i + 1}", f"02:00:00:00:00:{i + 1:02x}", 11211) for i in range(4)]
UNTOUCHED = -1  # the get left as it came: home
KEY_TABLES = ("hot_keys", "replicas", "synced")
COUNTERS = ("switch_counters", "key_gets", "key_home_while_dirty", "key_mirrored", "key_per_replica",
            "server_unsure", "lease_renewals")


class Switch:
    """A bmv2 switch on two veths: gets go in at port 1, every server is forwarded to port 2."""

    def __init__(self, tag: str):
        from dataplanes.p4.bmv2 import Bmv2Switch
        from dataplanes.p4.veth_ports import Ports
        self.ports = Ports(tag, 2)
        self.bmv2 = Bmv2Switch(tag, self.ports.switch_ends).start()

    def route(self, key: bytes, home: int, request_id: int) -> int:
        from tests.pipeline_fixtures import request_to
        packet = request_to(SERVERS[home], b"get " + key + b"\r\n", request_id)
        out = self.through(packet)
        return UNTOUCHED if out == packet else [s.ip for s in SERVERS].index(".".join(str(b) for b in out[30:34]))

    def through(self, packet: bytes) -> bytes:
        self.ports.drain()
        self.ports.send(1, packet)
        out = self.ports.receive(2)
        assert out is not None, "the switch sent nothing on"
        return out

    def spread(self, key: bytes, home: int, gets: int = 60) -> dict[int, int]:
        rng, seen = random.Random(5), {}
        for _ in range(gets):
            server = self.route(key, home, rng.randrange(65536))
            seen[server] = seen.get(server, 0) + 1
        return seen

    def snapshot(self) -> set[bytes]:
        return snapshot(self.bmv2.address)

    def close(self) -> None:
        self.bmv2.stop()
        self.ports.close()


@pytest.fixture
def switches():
    made = []
    try:
        for n in range(2):
            made.append(Switch(f"p4ad{os.getpid() % 1000}{n}"))
        yield made
    finally:
        for switch in made:
            switch.close()


def driver_of(switches: list[Switch], trusted: tuple[str, ...] = ()):
    from dataplanes.p4 import Settings
    from dataplanes.p4.driver import P4RuntimeDriver
    from dataplanes.p4.pipeline import Pipeline
    return P4RuntimeDriver(Settings(switches=tuple(s.bmv2.address for s in switches), ports=(1, 2), trusted=trusted),
                           Pipeline())


def set_request(key: bytes) -> bytes:
    """A set of `key` to server 0 over TCP (its home in this test): counted as a write where the key is hot."""
    from tests.pipeline_fixtures import request_to
    return request_to(SERVERS[0], b"set " + key + b" 0 0 1\r\nx\r\n", udp=False)


def snapshot(address: str) -> set[bytes]:
    """Every entry of the hot-key tables and every cell of the counters, as the switch at `address` gives them (a
    Read of its own, no arbitration): serialized, to compare as sets."""
    from dataplanes.p4 import entries as e
    from dataplanes.p4.pipeline import Pipeline
    pipeline = Pipeline()
    entities = [e.table_entry(pipeline, t, {}) for t in (*KEY_TABLES, "servers", "forward", "closes_handled")]
    entities += [e.counter_read(pipeline, c) for c in COUNTERS]
    channel = grpc.insecure_channel(address)
    try:
        stub = p4runtime_pb2_grpc.P4RuntimeStub(channel)
        replies = stub.Read(p4runtime_pb2.ReadRequest(device_id=1, entities=entities), timeout=10)
        return {entity.SerializeToString(deterministic=True) for reply in replies for entity in reply.entities}
    finally:
        channel.close()


def slot_counts(snapshot: set[bytes], slot: int) -> set[bytes]:
    """The counter cells of a snapshot that belong to `slot`: its gets, sent home, mirrored, and per replica."""
    from dataplanes.p4.pipeline import Pipeline
    from dataplanes.pipeline import MAX_REPLICAS
    pipeline, found = Pipeline(), set()
    per_slot = {pipeline.counter(c) for c in ("key_gets", "key_home_while_dirty", "key_mirrored")}
    for raw in snapshot:
        entity = p4runtime_pb2.Entity.FromString(raw)
        cell = entity.counter_entry if entity.HasField("counter_entry") else None
        if cell is not None and (cell.counter_id in per_slot and cell.index.index == slot or
                                 cell.counter_id == pipeline.counter("key_per_replica")
                                 and cell.index.index // MAX_REPLICAS == slot):
            found.add(raw)
    return found


def of_slot(snapshot: set[bytes], slot: int, key: bytes) -> set[bytes]:
    """The entries of a snapshot that belong to `key` in `slot`: its hot_keys entry, its ranges, its synced entry."""
    from dataplanes.p4 import entries as e
    from dataplanes.p4.pipeline import Pipeline
    pipeline, found = Pipeline(), set()
    for raw in snapshot:
        entity = p4runtime_pb2.Entity.FromString(raw)
        if not entity.HasField("table_entry"):
            continue
        for table in KEY_TABLES:
            if entity.table_entry.table_id == pipeline.table(table).id:
                match = e.match_of(pipeline, table, entity)
                if match.get("meta.slot") == slot or match.get("meta.key") == e.key_value(key):
                    found.add(raw)
    return found


def test_a_second_driver_adopts_every_key_and_rebuilds_only_the_one_the_switches_disagree_on(switches, caplog):
    from dataplanes.p4 import entries as e
    first = driver_of(switches)
    first.attach(SERVERS, lambda frame: None)
    first.set_forwarding([ForwardingEntry(s.mac, "2") for s in SERVERS])
    first.install_hot_key(b"earlier", 0, [ReplicaWeight(0, 0.5), ReplicaWeight(1, 0.5)])
    switches[0].through(set_request(b"earlier"))  # counted in its slot's write count, which `dirty` takes next
    first.remove_hot_key(b"earlier")
    first.install_hot_key(b"dirty", 0, [ReplicaWeight(0, 0.5), ReplicaWeight(1, 0.5)])
    switches[0].through(set_request(b"dirty"))  # its mirrored count: 1 since its install, 2 in the slot
    first.install_hot_key(b"clean", 2, [ReplicaWeight(2, 0.5), ReplicaWeight(3, 0.5)])
    first.install_hot_key(b"wide", 1, [ReplicaWeight(1, 0.5), ReplicaWeight(0, 0.0), ReplicaWeight(3, 0.5)])
    first.clear_dirty_keys(first.write_stamps([b"clean", b"wide"]))
    first.renew_lease(600)
    balanced = {key: switches[0].spread(key, home) for key, home in ((b"wide", 1), (b"dirty", 0))}
    assert set(balanced[b"wide"]) == {1, 3} and balanced[b"dirty"] == {UNTOUCHED: 60}
    counted = first.read_counters().keys
    assert counted[b"dirty"].mirrored == 1
    slot = first.slots[b"clean"]
    lost = [r for r in first.clients[1].read([e.table_entry(first.pipeline, "replicas", {})], "ranges")
            if e.match_of(first.pipeline, "replicas", r)["meta.slot"] == slot][:1]
    first.clients[1].write([e.update(e.DELETE, lost[0])], "one range of `clean` lost on the second switch")
    before, slots = [s.snapshot() for s in switches], first.slots
    first.let_go()  # killed or deposed: the lease left running
    after = driver_of(switches)
    with caplog.at_level(logging.INFO):
        found = {k.key: k for k in after.attach(SERVERS, lambda frame: None)}
    try:
        assert {k: (f.distrust, f.synced is not None) for k, f in found.items()} == {  # the lease still runs
            b"clean": (Distrust.TABLES_DISAGREE, False), b"dirty": (None, False), b"wide": (None, True)}
        assert [(r.server, r.weight) for r in found[b"wide"].replicas] == [(1, 0.5), (0, 0.0), (3, 0.5)]
        assert "read back 3 hot keys" in caplog.text and "1 removed: tables-disagree" in caplog.text
        now = [s.snapshot() for s in switches]
        for was, is_ in zip(before, now):  # nothing pushed, nothing rewritten, no counter reset: but `clean`'s
            assert of_slot(is_, slot, b"clean") == set()  # entries, out of both switches
            assert is_ == was - of_slot(was, slot, b"clean")
        assert after.slots == {k: slot for k, slot in slots.items() if k != b"clean"}  # the book's slots kept
        kept = after.read_counters().keys
        for key in (b"dirty", b"wide"):  # the counters go on from where they were (mirrored counts included)
            assert kept[key] == counted[key], (key, kept[key], counted[key])
        after.renew_lease(600)
        assert switches[0].spread(b"wide", 1) == balanced[b"wide"]  # balanced as it was
        assert switches[0].spread(b"dirty", 0) == {UNTOUCHED: 60}  # still held dirty
        after.clear_dirty(b"dirty", after.write_stamp(b"dirty"))  # the new driver's own from here on
        assert set(switches[0].spread(b"dirty", 0)) == {0, 1}
        after.set_forwarding([ForwardingEntry(s.mac, "2") for s in SERVERS])  # the same: nothing inserted twice
    finally:
        after.close()


def test_closes_counted_before_a_driver_attaches_are_left_pending_for_the_core(switches):
    """A server closed a connection of the controller's after the first driver's last look (it may have restarted
    empty while no controller ran): the next driver writes nothing for it at attach (no `closes_handled` entry) and
    reports it pending, so the core checks the server before it acknowledges the close (core.start); the switch
    balances the server no get until then, and again once the close is acknowledged."""
    from tests.pipeline_fixtures import CONTROLLER, closing
    first = driver_of(switches, trusted=(CONTROLLER[1],))
    first.attach(SERVERS, lambda frame: None)
    first.set_forwarding([ForwardingEntry(s.mac, "2") for s in SERVERS])
    first.install_hot_key(b"both", 0, [ReplicaWeight(0, 0.5), ReplicaWeight(1, 0.5)])
    first.clear_dirty_keys(first.write_stamps([b"both"]))
    first.renew_lease(600)
    assert set(switches[0].spread(b"both", 0)) == {0, 1}
    switches[0].through(closing(1))  # server 1's memcached closes the controller's connection
    assert first.server_closes(1) == (1, 0) and first.closes_pending(1)
    assert set(switches[0].spread(b"both", 0)) == {0, UNTOUCHED}  # out of rotation until the close is handled
    first.let_go()
    before = [s.snapshot() for s in switches]
    after = driver_of(switches, trusted=(CONTROLLER[1],))
    after.attach(SERVERS, lambda frame: None)
    try:
        assert [s.snapshot() for s in switches] == before  # nothing written at attach, no closes_handled entry
        assert [after.closes_pending(s) for s in range(len(SERVERS))] == [False, True, False, False]
        after.renew_lease(600)
        assert set(switches[0].spread(b"both", 0)) == {0, UNTOUCHED}  # still out of rotation
        after.closes_handled(1, after.server_closes(1))  # the core, once it has checked the server
        assert not after.closes_pending(1)
        assert set(switches[0].spread(b"both", 0)) == {0, 1}  # back in rotation
    finally:
        after.close()
