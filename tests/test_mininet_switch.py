"""The eBPF switch inside Mininet: hosts reach each other through one switch and through several."""
from __future__ import annotations

import pytest

from tests.conftest import why_no_mininet

why_not = why_no_mininet()
pytestmark = pytest.mark.skipif(why_not is not None, reason=f"Mininet with the eBPF switch cannot run: {why_not}")


@pytest.mark.parametrize("topology", ["single", "linear"])
def test_every_host_reaches_every_other(topology):
    from mininet.net import Mininet
    from mininet.topo import LinearTopo, SingleSwitchTopo

    from dataplanes.bpf.program import PIN_ROOT
    from dataplanes.ebpf.mininet_switch import EbpfSwitch
    topo = SingleSwitchTopo(3) if topology == "single" else LinearTopo(k=3, n=1)
    net = Mininet(topo=topo, switch=EbpfSwitch, controller=None, autoSetMacs=True)
    net.start()
    pins = [PIN_ROOT / name for name in EbpfSwitch.driver_settings(net)["switches"]]
    try:
        assert len(pins) == len(net.switches) and all((p / "prog").exists() for p in pins)
        assert net.pingAll(timeout=2) == 0.0
    finally:
        net.stop()
    assert not any(p.exists() for p in pins)  # unloaded with the network


def test_a_hot_key_is_balanced_once_across_two_switches():
    """Client on s1, two memcached servers on s2: s1 balances, s2 sees the mark and leaves the gets alone."""
    import json
    import subprocess
    import sys

    from mininet.net import Mininet
    from mininet.topo import LinearTopo

    from dataplanes.driver import ReplicaWeight
    from dataplanes.ebpf.driver import EbpfDriver
    from mbalancer.config import Server
    from tests.conftest import eventually
    from tests.test_ebpf_network import CLIENT
    from dataplanes.bpf.program import PIN_ROOT
    from dataplanes.ebpf.mininet_switch import EbpfSwitch
    net = Mininet(topo=LinearTopo(k=2, n=2), switch=EbpfSwitch, controller=None, autoSetMacs=True)
    net.start()
    driver, processes = None, []
    try:
        client, servers = net.get("h1s1"), [net.get("h1s2"), net.get("h2s2")]
        for host in servers:
            processes.append(host.popen(["memcached", "-l", host.IP(), "-p", "11211", "-U", "11211", "-u", "root",
                                         "-t", "1"]))
        setter = ("import sys; from mbalancer.memcache.meta import MetaClient, StoredItem; "
                  "from mbalancer.memcache.addresses import ServerAddress; "
                  "MetaClient(ServerAddress(sys.argv[1], 11211)).set(b'hot', StoredItem(b'v', 0, -1, 0))")
        for host in servers:
            assert eventually(lambda: host.popen([sys.executable, "-c", setter, host.IP()]).wait() == 0, timeout=10)
        driver = EbpfDriver([PIN_ROOT / name for name in EbpfSwitch.driver_settings(net)["switches"]])
        driver.attach([Server(h.name, h.IP(), h.MAC()) for h in servers], lambda frame: None)
        driver.install_hot_key(b"hot", 0, [ReplicaWeight(0, 0.5), ReplicaWeight(1, 0.5)])
        driver.renew_lease(3600)  # no core here to renew it
        driver.clear_dirty(b"hot", driver.write_stamp(b"hot"))
        run = client.popen([sys.executable, "-c", CLIENT, servers[0].IP(), "hot", "200"], stdout=subprocess.PIPE,
                           text=True)
        reply = json.loads(run.communicate(timeout=60)[0])
        assert reply["answered"] == 200
        first, second = driver.switch_counters()
        assert first["balanced"] == 200 and second["already_balanced"] == 200 and second["balanced"] == 0
        per_replica = driver.read_counters().keys[b"hot"].per_replica
        assert min(per_replica.values()) > 60, per_replica
    finally:
        if driver:
            driver.close()
        for process in processes:
            process.terminate()
            process.wait(timeout=5)
        net.stop()
