"""End to end through the P4 data plane: bmv2's simple_switch_grpc running p4src/mbalancer.p4 between real memcached
servers and real UDP clients in network namespaces, the controller core with the P4Runtime driver (mirrored writes
as PacketIns). The tests are the eBPF network tests (tests/test_ebpf_network.py), imported and run here with this
module's fixtures: the same questions, asked of the other data plane. Needs root, simple_switch_grpc and memcached;
skips elsewhere."""
from __future__ import annotations

import os

import pytest

from controller.core import ControllerCore
from dataplanes import registry
from mbalancer.memcache.addresses import ServerAddress
from mbalancer.memcache.client import tcp_client
from tests.conftest import eventually, memcached_answers
from tests.test_ebpf_network import (  # noqa: F401  (collected here: pytest runs them with the fixtures below)
    client_gets, config_of, hits, make_hot, test_a_set_is_mirrored_and_gets_go_home_until_the_copies_are_fresh,
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
