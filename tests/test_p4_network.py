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
    core.stop()  # the next core's driver finds what this one left and removes it
    for host in network.server_hosts:
        tcp_client(ServerAddress(host.ip)).flush_all()


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
