"""End to end through the P4 data plane: bmv2's simple_switch_grpc running p4src/mbalancer.p4 between real memcached
servers and real UDP clients in network namespaces, the controller core with the P4Runtime driver (mirrored writes
as PacketIns). The tests are the eBPF network tests (tests/test_ebpf_network.py), imported and run here with this
module's fixtures: the same questions, asked of the other data plane. Needs root, simple_switch_grpc and memcached;
skips elsewhere."""
from __future__ import annotations

import os
import time

import pytest

from controller.core import ControllerCore
from dataplanes import registry
from mbalancer.memcache.addresses import ServerAddress
from mbalancer.memcache.client import tcp_client
from tests.conftest import eventually, memcached_answers
from tests.test_ebpf_network import (  # noqa: F401  (collected here: pytest runs them with the fixtures below)
    client_gets, closes_handled, config_of, hits, make_hot,
    test_a_set_is_mirrored_and_gets_go_home_until_the_copies_are_fresh,
    test_cold_keys_and_multi_gets_reach_their_home,
    test_hot_gets_are_spread_by_weight_and_answered_from_the_home_address,
    test_malformed_requests_and_long_keys_reach_the_server_untouched, test_the_dirty_bit_sends_gets_home,
    test_writes_nobody_can_read_cost_a_copy_per_check_and_are_never_served_stale)
from topologies.netns import NamespaceNetwork

why_not = registry.get("p4").available() if os.geteuid() == 0 else "needs root (namespaces, veths)"
pytestmark = pytest.mark.skipif(why_not is not None, reason=f"P4 data plane cannot run here: {why_not}")


@pytest.fixture(scope="module")
def network():
    with NamespaceNetwork(servers=3, clients=1, tag=f"mbp{os.getpid() % 1000}", dataplane="p4") as net:
        for host in net.server_hosts:
            net.popen(host, ["memcached", "-l", host.ip, "-p", "11211", "-U", "11211", "-u", "root", "-t", "1"])
        for host in net.server_hosts:
            assert eventually(lambda: memcached_answers(host.ip), timeout=10), f"memcached on {host.name} did not start"
        yield net


@pytest.fixture
def core(network):
    core = ControllerCore(config_of(network), network.driver(), probe_health=False).start()
    yield core
    core.stop()
    for host in network.server_hosts:
        tcp_client(ServerAddress(host.ip)).flush_all()
    empty_hot_keys(network.switch.bmv2.address)  # each test's core starts afresh: it would adopt what this one left


def empty_hot_keys(address: str) -> None:
    """Take every hot key out of the switch (its pipeline stays): as a controller that never ran left it."""
    from dataplanes.p4.client import P4RuntimeClient
    from dataplanes.p4.pipeline import Pipeline
    from dataplanes.p4.tables import P4Tables
    client = P4RuntimeClient(address, 1)
    try:
        client.connect()
        tables = P4Tables(client, Pipeline())
        tables.delete_keys(list(tables.held_keys().items()))
    finally:
        client.close()


def test_a_restarted_switch_gets_its_pipeline_and_hot_keys_back(network, core):
    """bmv2 killed and started again (empty): the driver reconnects, pushes the pipeline, the core installs its hot
    keys again, and gets are balanced again, without a controller restart."""
    home = make_hot(core, b"hot:5", b"v5")
    network.switch.reload()
    assert eventually(lambda: core.driver.reconnects >= 1, timeout=10), "the driver did not reconnect"

    def balanced() -> bool:
        before = hits(network)
        client_gets(network, network.server_hosts[home].ip, b"hot:5", 90)
        return min(a - b for a, b in zip(hits(network), before)) > 10

    assert eventually(balanced, timeout=20), core.state()["decisions"][-3:]
    assert b"hot:5" in core.driver.slots


def test_the_ryu_app_balances_and_mirrors_writes_through_its_p4_driver_process(network, tmp_path):
    """The core inside ryu-manager, the P4Runtime driver in the child process the app starts (gRPC cannot run on
    eventlet's hub): a reported key is copied and its gets spread over the servers; a set to it reaches the core as
    a PacketIn the child relays (the key is synced again), and no get reads the old value after the set's answer;
    SIGTERM ends it all."""
    from dataclasses import replace
    from experiments.endtoend.stack import RyuController
    from mbalancer.config import Controller, DataPlane
    from mbalancer.memcache.hashing import make_hash
    from mbalancer.memcache.server import free_port
    settings = registry.get("p4").parse_settings(network.switch.driver_settings())
    config = replace(config_of(network), controller=Controller(listen=f"127.0.0.1:{free_port()}", poll_interval=0),
                     dataplane=DataPlane("p4", (("p4", settings),)))
    key = b"ryu:1"
    home = make_hash(config.balancing.hash, [s.address for s in config.servers]).server_of(key)
    home_ip = network.server_hosts[home].ip
    tcp_client(ServerAddress(home_ip)).set(key, b"old")
    app = RyuController(config, None, tmp_path)
    app.start()
    try:
        def synced(times: int) -> bool:
            return any(h["key"] == key.decode() and not h["dirty"] and h["syncs"] >= times
                       for h in app.state()["hot_keys"])

        app.report([(key, 500.0)])
        assert eventually(lambda: synced(0), timeout=20), app.state()["decisions"][-3:]
        before = hits(network)
        assert set(client_gets(network, home_ip, key, 90)["values"]) == {"VALUE ryu:1 0 3\r\nold\r\nEND\r\n"}
        spread = [a - b for a, b in zip(hits(network), before)]
        assert min(spread) > 10, (spread, app.state()["decisions"][-3:])
        stored = client_gets(network, home_ip, key, 1, b"set ryu:1 0 0 3\r\nnew\r\n")
        assert stored["values"] == {"STORED\r\n": 1}, stored
        assert set(client_gets(network, home_ip, key, 60)["values"]) == {"VALUE ryu:1 0 3\r\nnew\r\nEND\r\n"}
        assert eventually(lambda: synced(1), timeout=20), app.state()["decisions"][-3:]  # the mirrored copy came
    finally:
        assert app.stop() == 0, app.log()[-2000:]


def test_a_stream_cut_under_gets_is_adopted_and_a_switch_restarted_empty_gets_everything_again(network):
    """The controller's P4Runtime connection cut (a relay in front of bmv2, which goes on) while a client gets and
    sets: a set crosses the switch (counted: its key dirty there; its copy lost with the stream), the lease runs out,
    and a range of a third key is deleted by another controller meanwhile. Healed: the driver reconnects and the core
    adopts what the switch holds, as a new leader would but knowing its own lease: the key nobody touched is kept
    with nothing written (its entries and counters read the same), the one set is settled from its home, the one
    whose range went is rebuilt alone, and no get reads the old value. Then bmv2 is restarted (empty): the pipeline
    and every key go on again. What each reconnect wrote is printed side by side."""
    from dataclasses import replace
    from dataplanes.p4 import entries as e
    from dataplanes.p4.client import P4RuntimeClient, P4RuntimeError
    from dataplanes.p4.pipeline import Pipeline
    from mbalancer.memcache.meta import MetaClient, StoredItem
    from tests.tcp_relay import TcpRelay
    from tests.test_p4_adoption import of_slot, slot_counts, snapshot
    bmv2, pipeline = network.switch.bmv2, Pipeline()
    kept, written, cut = keys = [b"rc:kept", b"rc:set", b"rc:cut"]
    host, port = bmv2.address.rsplit(":", 1)
    with TcpRelay((host, int(port))) as relay:
        kind = registry.get("p4")
        driver = kind.make_driver(kind.parse_settings({**network.switch.driver_settings(),
                                                       "switches": [relay.address]}))
        config = config_of(network)
        core = ControllerCore(replace(config, balancing=replace(config.balancing, hot=3)), driver,
                              probe_health=False).start()
        ip = {key: network.server_hosts[core.key_hash.server_of(key)].ip for key in keys}
        try:
            for key in keys:
                MetaClient(core.config.servers[core.key_hash.server_of(key)].address).set(
                    key, StoredItem(b"old", 0, -1, 0))

            def reported_and_clean() -> bool:
                """A report each call, as a monitor sends them: a key an earlier test left on the switch is adopted,
                and keeps its room (it is not cooled) until the switch has counted its gets."""
                core.submit_report({"time": time.time(), "interval": 1.0, "rate": 1000.0,
                                    "top": [{"key": k.decode(), "rate": 500.0} for k in keys]})
                return all(k in core.executor.hot and not core.executor.hot[k].dirty for k in keys) \
                    and closes_handled(core)

            assert eventually(reported_and_clean, timeout=30, every=0.5), core.state()["decisions"][-5:]
            slots = dict(driver.slots)
            relay.cut(hold=True)
            assert eventually(lambda: driver.clients[0].down, timeout=10)
            stored = client_gets(network, ip[written], written, 1, b"set rc:set 0 0 3\r\nnew\r\n")
            assert stored["values"] == {"STORED\r\n": 1}, stored
            fresh = {"VALUE rc:set 0 3\r\nnew\r\nEND\r\n"}
            assert set(client_gets(network, ip[written], written, 30)["values"]) == fresh  # home: dirty there
            client_gets(network, ip[kept], kept, 30)
            other = P4RuntimeClient(bmv2.address, 1, election_id=1)  # another controller, while this one is away
            assert eventually(lambda: _connected(other, P4RuntimeError), timeout=10)
            try:
                ranges = [r for r in other.read([e.table_entry(pipeline, "replicas", {})], "ranges")
                          if e.match_of(pipeline, "replicas", r)["meta.slot"] == slots[cut]]
                other.write([e.update(e.DELETE, ranges[0])], "a range of rc:cut")
            finally:
                other.close()
            before, reconnects, decided = snapshot(bmv2.address), core.counts["reconnects"], len(core.decisions_made())
            relay.heal()
            assert eventually(lambda: core.counts["reconnects"] > reconnects and core.wait_idle()
                              and written in core.executor.hot and not core.executor.hot[written].dirty,
                              timeout=30), core.state()["decisions"][-5:]
            after, adopted = snapshot(bmv2.address), (driver.clients[0].writes, driver.clients[0].updates)
            verdicts = {d["key"]: (d["action"], d.get("why")) for d in core.decisions_made()[decided:]
                        if d["action"] in ("adopt", "reconcile", "replay", "warm")}
            assert verdicts == {"rc:kept": ("adopt", None), "rc:set": ("adopt", None),
                                "rc:cut": ("reconcile", "not-placeable")}, verdicts
            assert driver.reconnects == 0 and cut not in driver.slots and of_slot(after, slots[cut], cut) == set()
            assert of_slot(after, slots[kept], kept) == of_slot(before, slots[kept], kept) != set()  # not rewritten
            assert slot_counts(after, slots[kept]) == slot_counts(before, slots[kept])  # no counter reset
            assert driver.slots[kept] == slots[kept] and driver.slots[written] == slots[written]
            for key, value in ((kept, "old"), (written, "new")):  # balanced again, never an old value
                spread = hits(network)
                got = client_gets(network, ip[key], key, 90)["values"]
                assert set(got) == {f"VALUE {key.decode()} 0 3\r\n{value}\r\nEND\r\n"}, got
                spread = [a - b for a, b in zip(hits(network), spread)]
                assert min(spread) > 10, spread

            network.switch.reload()  # restarted: empty (then bootstrapped with this pipeline, no hot key)
            assert eventually(lambda: driver.reconnects == 1 and core.wait_idle() and all(
                k in driver.slots and not core.executor.hot[k].dirty for k in (kept, written)), timeout=30), \
                core.state()["decisions"][-5:]
            reinstalled = (driver.clients[0].writes, driver.clients[0].updates)
            print(f"P4Runtime writes on reconnect: stream cut, switch went on (adopted): {adopted[0]} requests, "
                  f"{adopted[1]} updates; switch restarted empty (everything again, as every reconnect did before): "
                  f"{reinstalled[0]} requests, {reinstalled[1]} updates")
            assert adopted[1] < reinstalled[1]
        finally:
            core.stop()
    for host_ in network.server_hosts:
        tcp_client(ServerAddress(host_.ip)).flush_all()
    empty_hot_keys(bmv2.address)


def _connected(client, errors) -> bool:
    try:
        client.connect()
        return True
    except errors:
        return False
