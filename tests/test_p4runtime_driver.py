"""The P4Runtime driver's messages against the committed P4Info, through an in-process P4Runtime server that checks
them (tests/p4runtime_server.py): runs everywhere, CI included. Whether the program then does the right thing with
those entries is for the bmv2 tests (tests/test_p4_program.py, the driver contract)."""
from __future__ import annotations

import os
import queue
import time
from pathlib import Path

import pytest

from dataplanes.driver import Distrust, DriverError, ForwardingEntry, HotKeyInstall, ReplicaWeight
from dataplanes.p4.driver import P4RuntimeDriver
from dataplanes.p4 import Settings
from dataplanes.p4.bmv2 import free_port
from dataplanes.p4.pipeline import FLOOD_GROUP, MIRROR_SESSION, Pipeline
from dataplanes.p4.pipeline import MAX_HOT
from mbalancer.config import Server
from tests.conftest import eventually
from tests.p4runtime_server import CheckingServer

SERVERS = [Server(f"s{i}", f"10.0.0.{i + 1}", f"02:00:00:00:00:{i + 1:02x}", 11211 + (i == 2)) for i in range(4)]


@pytest.fixture
def server():
    running = CheckingServer().start()
    yield running
    running.stop()


@pytest.fixture
def driver(server):
    made = P4RuntimeDriver(Settings(switches=(server.address,), ports=(1, 2, 3), trusted=("10.0.0.254",)),
                           Pipeline())
    made.attach(SERVERS, lambda frame: None)
    yield made
    made.close()


def entries(server: CheckingServer, table: str) -> list:
    table_id = Pipeline().table(table).id
    return [e for e in server.entries.values() if e.table_id == table_id]


def params(entry) -> list[int]:
    return [int.from_bytes(p.value, "big") for p in entry.action.action.params]


def test_attach_pushes_the_pipeline_and_writes_servers_ports_and_sessions(server, driver):
    assert server.cookie == Pipeline().cookie
    assert sorted(tuple(params(e)) for e in entries(server, "servers")) == [
        (0x020000000001 + i, (10 << 24) + i + 1, s.port) for i, s in enumerate(SERVERS)]
    assert len(entries(server, "memcached_ports")) == len(entries(server, "reply_ports")) == 2  # 11211 and 11212
    assert len(entries(server, "trusted_sources")) >= 1
    assert set(server.pre) == {("clone_session_entry", MIRROR_SESSION), ("multicast_group_entry", FLOOD_GROUP)}
    assert [r.egress_port for r in server.pre[("multicast_group_entry", FLOOD_GROUP)].multicast_group_entry.replicas] \
        == [1, 2, 3]


def test_the_controllers_sizes_are_the_programs():
    """What pipeline.py and the driver assume of p4src/headers.p4, against the committed P4Info."""
    from dataplanes.pipeline import COUNTERS
    from dataplanes.pipeline import MAX_REPLICAS
    from dataplanes.p4.pipeline import STREAM_RESUMES
    info = Pipeline().p4info
    tables = {t.preamble.name.split(".")[-1]: t.size for t in info.tables}
    counters = {c.preamble.name.split(".")[-1]: c.size for c in info.counters}
    assert tables["hot_keys"] == tables["synced"] == MAX_HOT and tables["replicas"] == MAX_HOT * MAX_REPLICAS
    assert counters["key_gets"] == counters["key_mirrored"] == MAX_HOT
    assert counters["key_per_replica"] == MAX_HOT * MAX_REPLICAS
    assert counters["switch_counters"] == len(COUNTERS)
    assert tables["stream_resumes"] == STREAM_RESUMES


def test_a_hot_key_is_its_entry_and_one_range_per_weighted_replica(server, driver):
    driver.install_hot_key(b"k" * 250, 1, [ReplicaWeight(1, 0.25), ReplicaWeight(2, 0.0), ReplicaWeight(3, 0.75)])
    (hot,) = entries(server, "hot_keys")
    assert [int.from_bytes(m.exact.value, "big") for m in hot.match] == [250, int.from_bytes(b"k" * 250, "big")]
    ranges = sorted((int.from_bytes(e.match[1].range.low, "big"), int.from_bytes(e.match[1].range.high, "big"),
                     params(e)[0]) for e in entries(server, "replicas"))
    assert ranges == [(0, 16383, 1), (16384, 65535, 3)]  # the zero weight has no range: never chosen
    assert entries(server, "synced") == []  # installed dirty
    driver.clear_dirty(b"k" * 250, driver.write_stamp(b"k" * 250))
    assert [params(e) for e in entries(server, "synced")] == [[0, 0]]
    driver.set_weights(b"k" * 250, [ReplicaWeight(1, 1.0), ReplicaWeight(2, 0.0), ReplicaWeight(3, 0.0)])
    assert [params(e)[0] for e in entries(server, "replicas")] == [1]
    driver.set_dirty(b"k" * 250)
    assert entries(server, "synced") == []
    driver.remove_hot_key(b"k" * 250)
    assert entries(server, "hot_keys") == entries(server, "replicas") == []


def test_a_hot_set_change_is_five_requests_and_a_key_the_switch_refuses_holds_back_no_other():
    server = CheckingServer(sizes={"hot_keys": 12}).start()  # a switch with room for 12 hot keys
    driver = P4RuntimeDriver(Settings(switches=(server.address,), ports=(1, 2)), Pipeline())
    try:
        driver.attach(SERVERS, lambda frame: None)
        weights = (ReplicaWeight(0, 0.5), ReplicaWeight(1, 0.5))
        old, new = [b"old:%d" % i for i in range(10)], [b"new:%d" % i for i in range(10)]
        assert driver.install_hot_keys([HotKeyInstall(key, 0, weights) for key in old]) == {}
        before = dict(server.requests)
        assert driver.remove_hot_keys(old) == {}  # held dirty: their `synced` entries are not there, no error
        assert driver.install_hot_keys([HotKeyInstall(key, 0, weights) for key in new]) == {}
        assert driver.clear_dirty_keys(driver.write_stamps(new)) == {}
        # writes: the removal, the install, the clear; reads: the slots' write counts, the stamps
        assert {k: server.requests[k] - before[k] for k in before} == {"write": 3, "read": 2}
        assert len(entries(server, "hot_keys")) == len(entries(server, "synced")) == 10
        more = [b"more:%d" % i for i in range(4)]  # 2 fit: the batch is refused, then each key tried alone
        refused = driver.install_hot_keys([HotKeyInstall(key, 1, weights) for key in more])
        assert set(refused) == set(more[2:])
        assert all("RESOURCE_EXHAUSTED" in str(err) and "full" in str(err) for err in refused.values())
        assert sorted(driver.slots) == sorted(new + more[:2]) and len(driver.free_slots) == MAX_HOT - 12
        assert len(entries(server, "hot_keys")) == 12 and len(entries(server, "replicas")) == 24
    finally:
        driver.close()
        server.stop()


def test_a_reused_slot_starts_its_counters_again(server, driver):
    driver.install_hot_key(b"a", 0, [ReplicaWeight(0, 0.5), ReplicaWeight(1, 0.5)])
    driver.remove_hot_key(b"a")
    server.counter_writes.clear()
    driver.install_hot_key(b"b", 0, [ReplicaWeight(0, 0.5), ReplicaWeight(1, 0.5)])
    names = {c.preamble.id: c.preamble.name.split(".")[-1] for c in Pipeline().p4info.counters}
    assert {names[c.counter_id] for c in server.counter_writes} == {"key_gets", "key_home_while_dirty",
                                                                     "key_per_replica"}
    assert all(c.data.packet_count == 0 for c in server.counter_writes)


def test_the_lease_is_a_packet_out_the_switch_adds_to_its_clock(server, driver):
    """The lease is kept as an absolute time and sent as what is left of it: 2.5 s less the time the call took."""
    started = time.monotonic_ns()
    driver.renew_lease(2.5)
    took_us = (time.monotonic_ns() - started) // 1000
    deadline = time.monotonic() + 5
    while not server.packet_outs and time.monotonic() < deadline:
        time.sleep(0.01)
    metadata = Pipeline().packet_metadata["packet_out"]
    values = {m.metadata_id: int.from_bytes(m.value, "big") for m in server.packet_outs[-1].metadata}
    assert values[metadata["op"][0]] == 1 and set(values) == {metadata[f][0] for f in ("op", "lease_us", "server")}
    assert 2_500_000 - took_us <= values[metadata["lease_us"][0]] <= 2_500_000


def test_forwarding_is_replaced_as_a_whole(server, driver):
    driver.set_forwarding([ForwardingEntry("02:00:00:00:00:01", "1"), ForwardingEntry("02:00:00:00:00:02", "2")])
    driver.set_forwarding([ForwardingEntry("02:00:00:00:00:02", "3")])
    assert [params(e) for e in entries(server, "forward")] == [[3]]
    with pytest.raises(DriverError, match="a bmv2 port is a number"):
        driver.set_forwarding([ForwardingEntry("02:00:00:00:00:02", "eth0")])


def test_refused_requests_change_nothing(server, driver):
    for key in (b"", b"k" * 251):
        with pytest.raises(DriverError, match="1 to 250"):
            driver.install_hot_key(key, 0, [ReplicaWeight(0, 1.0)])
    with pytest.raises(DriverError, match="not in the config"):
        driver.install_hot_key(b"k", 0, [ReplicaWeight(9, 1.0)])
    with pytest.raises(DriverError, match="replicas"):
        driver.install_hot_key(b"k", 0, [ReplicaWeight(i % 4, 1 / 9) for i in range(9)])
    assert entries(server, "hot_keys") == entries(server, "replicas") == []
    driver.install_hot_key(b"k", 0, [ReplicaWeight(0, 1.0)])
    with pytest.raises(DriverError, match="already installed"):
        driver.install_hot_key(b"k", 0, [ReplicaWeight(0, 1.0)])
    assert len(entries(server, "hot_keys")) == 1


def successor_of(driver: P4RuntimeDriver, servers: list, **settings) -> P4RuntimeDriver:
    """A controller that takes over from `driver`, which stopped without ending its lease (killed, or deposed)."""
    driver.let_go()
    after = P4RuntimeDriver(Settings(switches=tuple(driver.settings.switches), **settings), Pipeline())
    after.found = {k.key: k for k in after.attach(servers, lambda frame: None)}
    return after


def left_behind(driver: P4RuntimeDriver) -> None:
    """Three keys as a controller leaves them: `clean` (cleared), `dirty` (held), `wide` with a replica at weight 0
    (it has no range: its server rides in the entry's metadata), the lease running, forwarding written."""
    driver.install_hot_key(b"clean", 2, [ReplicaWeight(2, 0.5), ReplicaWeight(3, 0.5)])
    driver.install_hot_key(b"dirty", 0, [ReplicaWeight(0, 0.25), ReplicaWeight(1, 0.75)])
    driver.install_hot_key(b"wide", 1, [ReplicaWeight(1, 0.5), ReplicaWeight(0, 0.0), ReplicaWeight(3, 0.5)])
    driver.clear_dirty_keys(driver.write_stamps([b"clean", b"wide"]))
    driver.renew_lease(60)
    driver.set_forwarding([ForwardingEntry(s.mac, "1") for s in SERVERS])


def test_a_new_driver_adopts_what_the_switch_holds_and_writes_nothing(server, driver):
    """A switch that runs this pipeline is not pushed again: every key is read back whole (home, every replica,
    weights, slot, clean or held) and kept in the book; with the same config not one Write reaches the switch,
    and the new driver goes on from there (the dirty key cleared, forwarding and weights changed in place)."""
    left_behind(driver)
    slots, writes = driver.slots, len(server.writes)
    after = successor_of(driver, SERVERS, ports=(1, 2, 3), trusted=("10.0.0.254",))
    try:
        found = after.found
        assert {k: (f.home, [(r.server, r.weight) for r in f.replicas], f.synced is not None, f.distrust)
                for k, f in found.items()} == {
            b"clean": (2, [(2, 0.5), (3, 0.5)], True, None),
            b"dirty": (0, [(0, 0.25), (1, 0.75)], False, None),
            b"wide": (1, [(1, 0.5), (0, 0.0), (3, 0.5)], True, None)}
        assert after.slots == slots and len(server.writes) == writes  # no pipeline, no entry written
        after.clear_dirty(b"dirty", after.write_stamp(b"dirty"))  # its `synced` entry inserted, as for its own
        after.set_forwarding([ForwardingEntry(s.mac, "2") for s in SERVERS])  # modified, not inserted twice
        assert [params(e) for e in entries(server, "forward")] == [[2]] * len(SERVERS)
        after.set_weights(b"wide", [ReplicaWeight(1, 0.5), ReplicaWeight(2, 0.5), ReplicaWeight(3, 0.0)])
        after.remove_hot_keys([b"clean"])
    finally:
        after.close()
    again = P4RuntimeDriver(Settings(switches=(server.address,)), Pipeline())
    try:  # the weights changed the replicas: what the entry carries changed with them
        found = {k.key: k for k in again.attach(SERVERS, lambda frame: None)}
        assert [(r.server, r.weight) for r in found[b"wide"].replicas] == [(1, 0.5), (2, 0.5), (3, 0.0)]
        assert set(found) == {b"wide", b"dirty"} and found[b"dirty"].synced is not None
    finally:
        again.close()


def test_the_driver_entries_are_made_what_the_config_says(server, driver):
    """A successor with another config: entries of a server it no longer has deleted, changed ones modified, new
    ones inserted, none inserted twice; a key that names the server gone is not kept (not placeable) and its rules
    are out."""
    left_behind(driver)
    moved = [SERVERS[0], Server("s1", SERVERS[1].ip, "02:00:00:00:00:99", SERVERS[1].port), SERVERS[2]]
    after = successor_of(driver, moved)
    try:
        assert sorted(tuple(params(e)) for e in entries(server, "servers")) == sorted(
            (int(s.mac.replace(":", ""), 16), (10 << 24) + i + 1, s.port) for i, s in enumerate(moved))
        assert len(entries(server, "server_index")) == len(entries(server, "closing_servers")) == 3
        assert {k: f.distrust for k, f in after.found.items()} == {
            b"clean": Distrust.NOT_PLACEABLE, b"wide": Distrust.NOT_PLACEABLE, b"dirty": None}
        assert sorted(after.slots) == [b"dirty"] and len(entries(server, "hot_keys")) == 1
    finally:
        after.close()


def test_a_switch_that_cannot_tell_its_lease_has_its_keys_resynced():
    """A program without the lease query (op 3) answers nothing: the lease is not known, and no key is trusted as
    clean (each resynced), whatever its table says."""
    server = CheckingServer(lease_query=False).start()
    driver = P4RuntimeDriver(Settings(switches=(server.address,), timeout=0.5), Pipeline())
    try:
        driver.attach(SERVERS, lambda frame: None)
        left_behind(driver)
        after = successor_of(driver, SERVERS, timeout=0.5)
        assert {k.distrust for k in after.found.values()} == {Distrust.LEASE_UNKNOWN}
        after.close()
    finally:
        server.stop()


def test_an_ended_lease_is_read_back_as_ended(server, driver):
    left_behind(driver)
    driver.renew_lease(0)
    after = successor_of(driver, SERVERS)
    try:
        assert {k.distrust for k in after.found.values()} == {Distrust.LEASE_EXPIRED}
    finally:
        after.close()


def test_a_key_two_switches_disagree_on_is_rebuilt_alone():
    """Two switches, one of which lost a key's range: that key alone is taken out of both (tables-disagree); the
    others are kept on both."""
    servers = [CheckingServer().start() for _ in range(2)]
    driver = P4RuntimeDriver(Settings(switches=tuple(s.address for s in servers)), Pipeline())
    try:
        driver.attach(SERVERS, lambda frame: None)
        left_behind(driver)
        store = servers[1].entries
        (lost,) = [k for k, v in store.items() if v.table_id == Pipeline().table("replicas").id
                   and params(v)[0] == 3 and int.from_bytes(v.match[0].exact.value, "big") == driver.slots[b"clean"]]
        del store[lost]
        after = successor_of(driver, SERVERS)
        assert {k: f.distrust for k, f in after.found.items()} == {
            b"clean": Distrust.TABLES_DISAGREE, b"dirty": None, b"wide": None}
        assert sorted(after.slots) == [b"dirty", b"wide"]
        assert [len(entries(s, "hot_keys")) for s in servers] == [2, 2]
        after.close()
    finally:
        for s in servers:
            s.stop()


def test_a_switch_whose_stream_drops_is_adopted_and_one_back_empty_starts_every_switch_afresh():
    """Two switches, the first behind a relay whose connections the test cuts (the switch goes on), the servers
    not answering lease queries: the lease is the driver's own. The driver reconnects and hands the core what the
    switches hold (`on_reconnect(found, None)`) without one Write: every key read back as it was, the lease its own
    (clean keys stay clean, none `lease-unknown`), but the key whose range the first switch lost meanwhile, taken out
    of both (tables-disagree). Cut again with an empty switch behind the relay (restarted): the pipeline goes on
    both switches again and the core is told to install everything again (`on_reconnect()`)."""
    from tests.tcp_relay import TcpRelay
    servers = [CheckingServer(lease_query=False).start() for _ in range(2)]
    came_back: queue.Queue = queue.Queue()
    with TcpRelay(("127.0.0.1", servers[0].port)) as relay:
        driver = P4RuntimeDriver(Settings(switches=(relay.address, servers[1].address), timeout=1.0), Pipeline())
        try:
            driver.attach(SERVERS, lambda frame: None, lambda *args: came_back.put(args))
            left_behind(driver)
            slots, writes = driver.slots, [len(s.writes) for s in servers]
            relay.cut(hold=True)
            assert eventually(lambda: driver.clients[0].down, timeout=10)
            store = servers[0].entries  # one range of `wide` lost on the first switch while it was out of reach
            del store[next(k for k, v in store.items() if v.table_id == Pipeline().table("replicas").id
                           and int.from_bytes(v.match[0].exact.value, "big") == slots[b"wide"])]
            lease_outs = len(servers[0].packet_outs)
            relay.heal()
            found, lost = came_back.get(timeout=10)
            assert lost is None and {k.key: (k.synced is not None, k.distrust) for k in found} == {
                b"clean": (True, None), b"dirty": (False, None), b"wide": (False, Distrust.TABLES_DISAGREE)}
            assert driver.slots == {k: v for k, v in slots.items() if k != b"wide"} and driver.reconnects == 0
            assert [len(s.writes) - w for s, w in zip(servers, writes)] == [1, 1]  # `wide` out of each, alone
            assert len(servers[0].packet_outs) == lease_outs + 1  # its lease written again (it missed renewals)

            empty = CheckingServer(lease_query=False).start()
            servers.append(empty)
            relay.upstream = ("127.0.0.1", empty.port)
            relay.cut()
            assert came_back.get(timeout=10) == () and driver.reconnects == 1 and driver.slots == {}
            assert empty.cookie == servers[1].cookie == Pipeline().cookie
            assert [len(entries(s, "servers")) for s in (empty, servers[1])] == [len(SERVERS)] * 2
            assert [len(entries(s, "hot_keys")) for s in (empty, servers[1])] == [0, 0]
        finally:
            driver.close()
            for s in servers:
                s.stop()


def test_a_p4_box_whose_stream_drops_is_adopted_through_its_switch_agent(tmp_path):
    """The same behind a switch agent (`mbalancer switch serve`, kind p4: a fabric's bmv2 box): the agent's driver
    reconnects on its own and what it read back reaches the controller over the agent's stream (`on_reconnect(found,
    None)`), not one Write on the switch."""
    from dataplanes.agent import Settings as AgentSettings
    from dataplanes.agent.client import AgentDriver
    from tests.switch_agent import AgentProcess
    from tests.tcp_relay import TcpRelay
    server = CheckingServer(lease_query=False).start()
    came_back: queue.Queue = queue.Queue()
    with TcpRelay(("127.0.0.1", server.port)) as relay:
        agent = AgentProcess(tmp_path, "p4", {"switches": [relay.address], "timeout": 1.0})
        driver = None
        try:
            driver = AgentDriver(AgentSettings(address=agent.address, token_file=str(agent.token_file), kind="p4"))
            driver.attach(SERVERS, lambda frame: None, lambda *args: came_back.put(args))
            driver.install_hot_key(b"k", 0, [ReplicaWeight(0, 0.5), ReplicaWeight(1, 0.5)])
            driver.clear_dirty(b"k", driver.write_stamp(b"k"))
            driver.renew_lease(60)
            writes = len(server.writes)
            relay.cut()
            found, lost = came_back.get(timeout=15)
            assert lost is None and [(k.key, k.synced is not None, k.distrust) for k in found] == [(b"k", True, None)]
            assert len(server.writes) == writes
        finally:
            if driver is not None:
                driver.close()
            said = agent.stop()
            server.stop()
    assert "Traceback" not in said, said


def test_a_lease_querys_answer_and_a_rearms_go_each_to_its_own_caller(server, driver):
    """Both come as PacketIns with a `report`: 1 (a rearm's, µs since the server's latest unsure request) and 2 (a
    lease query's, µs left), each to its own queue, whichever comes first."""
    driver.renew_lease(30)
    (tables,) = driver.book.switches
    tables.ask_lease()  # its answer comes before the rearm's: not taken for it
    assert driver.unsure_quiet(0) == pytest.approx((2 ** 48 - 1) / 1e6)  # never an unsure request
    assert 25_000_000 < tables.lease_left() <= 30_000_000


def test_an_entry_read_back_is_the_one_written_or_none_the_book_keeps():
    """read_entry, the inverse of `ranges`: the weights from the ranges, the replicas from the metadata (or, without
    it, from the ranges, a replica with no range unknown); ranges that are not the replicas' give no weights."""
    from dataplanes.p4.tables import UNKNOWN_SERVER, hot_metadata, ranges, read_entry, read_metadata
    from dataplanes.pipeline import cumulative_weights
    from dataplanes.read_back import placeable
    from dataplanes.slot_book import HotEntry
    for servers, weights in (((1, 0, 3), (0.5, 0.0, 0.5)), ((2,), (1.0,)), ((0, 1, 2), (0.0, 0.0, 1.0)),
                             ((3, 1), (0.2, 0.8)), ((0, 1, 2, 3), (0.3, 0.3, 0.4, 0.0))):
        entry = HotEntry(7, servers[0], servers, tuple(cumulative_weights(weights)))
        found = {p: (low, high, servers[p]) for low, high, p in ranges(entry)}
        assert read_metadata(hot_metadata(servers, 41)) == (servers, 41)
        assert read_entry(7, servers[0], servers, found) == entry
        assert read_entry(7, servers[0], None, found).servers == tuple(
            servers[p] if p in found else UNKNOWN_SERVER for p in range(max(found) + 1))
    gap = {0: (0, 99, 1), 1: (200, 65535, 3)}  # 100..199 is nobody's
    assert not placeable(read_entry(7, 1, (1, 3), gap), 4)
    assert not placeable(read_entry(7, 1, (1, 0, 3), {0: (0, 32767, 1), 2: (32768, 65535, 2)}), 4)  # not replica 2
    assert not placeable(read_entry(7, 1, None, {0: (0, 32767, 1), 2: (32768, 65535, 3)}), 4)  # position 1 unknown
    assert read_metadata(b"") == (None, None) and read_metadata(b"\x00" * 9) == (None, None)


def test_a_switch_running_another_pipeline_gets_this_one(server, driver):
    """Another program's tables are not ours to read: the pipeline is pushed, and nothing is read back."""
    driver.install_hot_key(b"left", 2, [ReplicaWeight(2, 0.5), ReplicaWeight(3, 0.5)])
    server.cookie = Pipeline().cookie ^ 1  # as if another build ran there
    after = successor_of(driver, SERVERS)
    try:
        assert after.found == {} and server.cookie == Pipeline().cookie
        assert entries(server, "hot_keys") == []
    finally:
        after.close()


def test_an_unreachable_switch_is_one_clear_error():
    closed = free_port()  # nothing listens there
    made = P4RuntimeDriver(Settings(switches=(f"127.0.0.1:{closed}",), timeout=0.5), Pipeline())
    with pytest.raises(DriverError, match=f"no P4Runtime server at 127.0.0.1:{closed}"):
        made.attach(SERVERS, lambda frame: None)


def test_no_switch_given_is_refused():
    with pytest.raises(DriverError, match="no P4Runtime switch"):
        P4RuntimeDriver(Settings(switches=()), Pipeline())


CONFIG = '[[servers]]\nname = "a"\nip = "127.0.0.1"\nmac = "02:00:00:00:00:01"\n'


def test_the_controller_command_drives_p4runtime_switches_named_on_its_command_line(run_cli, tmp_path, server):
    config = tmp_path / "c.toml"
    config.write_text(CONFIG + f'[controller]\nlisten = "127.0.0.1:{free_port()}"\n')
    result = run_cli("controller", "--config", str(config), "--driver", "p4runtime", "--switch", server.address,
                     "--duration", "1")
    assert result.returncode == 0, result.stderr
    assert "driver p4" in result.stderr and server.cookie == Pipeline().cookie  # it pushed the pipeline there


@pytest.mark.parametrize("extra, args, message", [
    ('[dataplane.p4]\ntimeout = 0.5\n', ["--driver", "p4", "--switch", "127.0.0.1:{closed}"],
     "no P4Runtime server at 127.0.0.1:{closed}"),
    ('[dataplane.p4]\nswitches = "127.0.0.1:1"\n', ["--driver", "p4"], "dataplane.p4.switches: expected a list"),
    ("", ["--driver", "none", "--switch", "x"], "--switch: the none data plane takes no switches"),
    ("", ["--driver", "p4", "--switch", ","], "--switch: give at least one switch"),
])
def test_bad_p4_settings_are_one_line_errors(run_cli, tmp_path, extra, args, message):
    closed = free_port()
    config = tmp_path / "c.toml"
    config.write_text(CONFIG + f'[controller]\nlisten = "127.0.0.1:{free_port()}"\n' + extra)
    result = run_cli("controller", "--config", str(config), *[a.format(closed=closed) for a in args],
                     "--duration", "1")
    assert result.returncode == 2 and message.format(closed=closed) in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_the_ryu_app_drives_a_p4_switch_through_a_driver_process_and_stops_on_sigterm(tmp_path, server):
    """Under ryu-manager the P4Runtime driver runs in a process of its own (gRPC blocks in C, which stalled
    eventlet's hub: the app hung and ignored SIGTERM): the app pushes the pipeline through it, answers its HTTP
    API, and on SIGTERM ends its lease (a lease PacketOut of 0), and the driver's process ends with it."""
    import json
    import urllib.request
    from controller.ryu_manager import launch
    from mbalancer.processes import stop_process
    listen = f"127.0.0.1:{free_port()}"
    config = tmp_path / "c.toml"
    config.write_text(CONFIG + f'[controller]\nlisten = "{listen}"\n[dataplane]\nkind = "p4"\n'
                      f'[dataplane.p4]\nswitches = ["{server.address}"]\nports = [1, 2]\n')
    log = tmp_path / "ryu.log"
    with open(log, "w") as out:
        process = launch(config, out)
    try:
        deadline = time.monotonic() + 60
        state = None
        while state is None and process.poll() is None and time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://{listen}/state", timeout=2) as reply:
                    state = json.load(reply)
            except OSError:
                time.sleep(0.2)
        assert state is not None, log.read_text()
        assert state["driver"] == "p4runtime" and server.cookie == Pipeline().cookie, state
        assert len(entries(server, "servers")) == 1  # the config's one server, written through the child
        children = children_of(process.pid)
        assert children, "no driver process under ryu-manager"
        leases_before = len(server.packet_outs)
    finally:
        stop_process(process, grace=20)
    text = log.read_text()
    assert process.returncode == 0 and "Traceback" not in text, text
    assert len(server.packet_outs) > leases_before  # the lease ended on the way out
    assert not any(Path(f"/proc/{pid}").exists() for pid in children), "the driver process outlived ryu-manager"


def children_of(pid: int) -> list[int]:
    tasks = Path(f"/proc/{pid}/task")
    return [int(c) for task in tasks.iterdir() for c in (task / "children").read_text().split()]


def test_a_controller_elected_through_etcd_deposes_one_that_was_not_and_a_later_leader_an_earlier_one(server):
    """The election id an etcd election gives (controller/cli.py passes it as [dataplane.p4] election_id) is above
    every first-come id: the switch makes the elected controller primary and refuses the other's writes; a leader
    elected later (a higher revision) deposes it in turn."""
    from dataplanes.p4.client import elected_election_id

    def made(election_id: int = 0) -> P4RuntimeDriver:
        return P4RuntimeDriver(Settings(switches=(server.address,), ports=(1,), election_id=election_id), Pipeline())
    unelected, earlier, later = made(), made(elected_election_id(7)), made(elected_election_id(9))
    try:
        unelected.attach(SERVERS, lambda frame: None)
        earlier.attach(SERVERS, lambda frame: None)
        with pytest.raises(DriverError, match="not primary"):
            unelected.set_forwarding([ForwardingEntry("02:00:00:00:00:01", "1")])
        later.attach(SERVERS, lambda frame: None)
        with pytest.raises(DriverError, match="not primary"):
            earlier.set_forwarding([ForwardingEntry("02:00:00:00:00:01", "1")])
        later.set_forwarding([ForwardingEntry("02:00:00:00:00:01", "1")])
        with pytest.raises(DriverError, match=r"election id \d+, a controller elected through etcd \(revision 9\)"):
            made(elected_election_id(8)).attach(SERVERS, lambda frame: None)
    finally:
        for driver in (later, earlier, unelected):
            driver.close()
    with pytest.raises(DriverError, match="election_id: 0 to 2"):
        made(-1)


def test_the_first_controller_stays_primary_and_the_next_is_primary_once_it_is_gone(server):
    """First come: a controller started later is refused by the switch's arbitration (told when the primary
    started); once the first closes its stream, a new one is primary."""
    def made() -> P4RuntimeDriver:
        return P4RuntimeDriver(Settings(switches=(server.address,), ports=(1,)), Pipeline())
    first = made()
    first.attach(SERVERS, lambda frame: None)
    second = made()
    try:
        with pytest.raises(DriverError, match=r"another controller is primary \(election id \d+, a controller started"):
            second.attach(SERVERS, lambda frame: None)
        first.set_forwarding([ForwardingEntry("02:00:00:00:00:01", "1")])  # still primary: taken
    finally:
        second.close()
        first.close()
    third = made()
    third.attach(SERVERS, lambda frame: None)
    third.close()


def test_the_reach_probe_counts_the_p4runtime_servers_that_accept_a_connection(server):
    """What a candidate controller of P4 switches publishes (controller/election.py): a closed port is not reached."""
    from dataplanes import registry
    from mbalancer.memcache.server import free_port
    closed = f"127.0.0.1:{free_port()}"
    probe = registry.get("p4").reach_probe(Settings(switches=(server.address, closed)))
    assert probe(2.0) == (1, 2)


GOLDEN = Path(__file__).resolve().parent / "golden" / "p4_hot_set_change.txt"


def test_a_hot_set_change_is_the_exact_write_request_on_record(server):
    """Two hot keys installed in one change: the WriteRequests the switch receives, compared field by field (in
    protobuf text format) with tests/golden/p4_hot_set_change.txt, as p4runtime-shell's tests compare theirs. A change
    to the encoding shows here as a diff; a deliberate one is recorded again with MBALANCER_RECORD_GOLDEN=1."""
    from google.protobuf import text_format
    driver = P4RuntimeDriver(Settings(switches=(server.address,), ports=(1, 2, 3), trusted=("10.0.0.254",),
                                      election_id=7), Pipeline())  # not the first-come id, which is the time's
    driver.attach(SERVERS, lambda frame: None)
    try:
        taken = len(server.writes)
        refused = driver.install_hot_keys([
            HotKeyInstall(b"golden:a", 0, [ReplicaWeight(0, 0.5), ReplicaWeight(1, 0.5)]),
            HotKeyInstall(b"golden:b", 2, [ReplicaWeight(2, 0.25), ReplicaWeight(3, 0.75)])])
    finally:
        driver.close()
    assert refused == {}
    sent = "".join(f"# request {n}\n{text_format.MessageToString(request)}"
                   for n, request in enumerate(server.writes[taken:], 1))
    if os.environ.get("MBALANCER_RECORD_GOLDEN") == "1":
        GOLDEN.write_text(sent)
    assert sent == GOLDEN.read_text()
