"""End to end on the OpenFlow data plane: real Open vSwitch (userspace datapath), real ryu-manager running the
MBalancer app (or, instead, a switch agent on the bridge's management socket driven by a controller core: no
ryu-manager), the real key classifier on every link, real memcached servers and UDP clients in namespaces. Which
server answered is read from each memcached's own counters; what the controller did, from its HTTP state."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from controller.ryu_manager import launch
from experiments.endtoend.stack import LocalController, RyuController
from mbalancer.config import Config, config_toml, parse_config
from mbalancer.memcache.addresses import ServerAddress
from mbalancer.memcache.client import tcp_client
from mbalancer.memcache.hashing import make_hash
from mbalancer.memcache.meta import MetaClient, StoredItem
from mbalancer.memcache.server import free_port
from dataplanes import registry
from dataplanes.bpf.tables import Tables
from dataplanes.openflow.messages import L2
from tests.conftest import eventually, memcached_answers
from tests.switch_agent import AgentProcess
from tests.tcp_relay import TcpRelay
from tests.test_fabric_failover import LOAD
from tests.test_ebpf_network import (WRONG_MAC, client_gets, cold_and_multi_gets_reach_their_home,
                                     hot_gets_spread_evenly_and_answered_from_home, hits)
from topologies.netns import NamespaceNetwork

why_not = registry.get("openflow").available() if os.geteuid() == 0 else "needs root (namespaces, bpf, OVS)"
pytestmark = pytest.mark.skipif(why_not is not None, reason=f"OpenFlow data plane cannot run here: {why_not}")
TAG = "mbof"
HTTP = "127.0.0.1:18089"
OPENFLOW = "127.0.0.1:16659"


@pytest.fixture(scope="module")
def network():
    with NamespaceNetwork(servers=3, clients=1, tag=TAG, dataplane="openflow") as net:
        net.switch.ovs.vsctl("set-controller", net.switch.bridge, f"tcp:{OPENFLOW}")
        for host in net.server_hosts:  # reached through the switch: checked once the app has programmed it
            net.popen(host, ["memcached", "-l", host.ip, "-p", "11211", "-U", "11211", "-u", "root", "-t", "1"])
        yield net


def config_of(net: NamespaceNetwork, dataplane: dict | None = None, macs: dict[int, str] | None = None) -> Config:
    """macs: servers given another MAC than their host's (a wrong entry)."""
    # equal weights whatever the load; no CAS polling and health probes rarely (their gets would count as hits)
    macs = macs or {}
    return parse_config({"servers": [{"name": h.name, "ip": h.ip, "mac": macs.get(i, h.mac)}
                                     for i, h in enumerate(net.server_hosts)],
                         "balancing": {"hot": 2, "hysteresis": 1, "mode": "equal"},
                         "controller": {"listen": HTTP, "poll_interval": 0, "health_interval": 60, "lease": 150},
                         "dataplane": dataplane or {"kind": "openflow",
                                                    "openflow": {"classifier": TAG, "listen": OPENFLOW}}})


class App:
    """MBalancer driving the network's Open vSwitch `via` ryu-manager (the Ryu app, the switch connecting to it), or
    via a switch agent on the switch's box (`mbalancer switch serve`, connected to the bridge's management socket:
    no ryu-manager) driven by a controller core over its wire; and what a test asks of either."""

    def __init__(self, net: NamespaceNetwork, tmp_path, via: str, relayed: bool = False,
                 macs: dict[int, str] | None = None):
        """relayed: the controller reaches the agent through a TcpRelay (self.relay) that a test can cut; macs:
        servers configured with another MAC than their host's."""
        self.config = config_of(net, macs=macs)
        self.key_hash = make_hash(self.config.balancing.hash, [s.address for s in self.config.servers])
        self.agent: AgentProcess | None = None
        self.relay: TcpRelay | None = None
        if via == "agent":
            self.agent = AgentProcess(tmp_path, "openflow", {
                "classifier": TAG, "connect": f"unix:{net.switch.ovs.rundir}/{net.switch.bridge}.mgmt"})
            address = self.agent.address
            if relayed:
                host, _, port = address.rpartition(":")
                self.relay = TcpRelay((host, int(port))).__enter__()
                address = self.relay.address
            self.controller = LocalController(config_of(net, {"kind": "agent", "agent": {
                "address": address, "kind": "openflow", "token_file": str(self.agent.token_file)}}, macs),
                self.key_hash, tmp_path)
        else:
            self.controller = RyuController(self.config, self.key_hash, tmp_path)
        try:
            self.controller.start()
        except BaseException:
            self.stop()
            raise
        for host in net.server_hosts:
            assert eventually(lambda: memcached_answers(host.ip), timeout=10), f"{host.name} unreachable: {self.log()}"

    def state(self) -> dict:
        return self.controller.state()

    def log(self) -> str:
        """What the process that drives the switch said: ryu-manager, or the agent."""
        return self.agent.read_log() if self.agent is not None else self.controller.log()

    def stop(self) -> int | None:
        """ryu-manager's exit status; or the controller stopped, then the agent, and the agent's."""
        if self.agent is None:
            return self.controller.stop()
        self.controller.stop()
        if self.relay is not None:
            self.relay.__exit__(None, None, None)
        self.agent.stop()
        return self.agent.process.returncode

    def hot(self, key: bytes) -> dict | None:
        return next((k for k in self.state()["hot_keys"] if k["key"] == key.decode()), None)

    def make_hot(self, key: bytes, value: bytes) -> int:
        home = self.key_hash.server_of(key)
        MetaClient(self.config.servers[home].address).set(key, StoredItem(value, 0, -1, 0))
        self.controller.report([(key, 500.0)])
        assert eventually(lambda: (self.hot(key) or {}).get("dirty") is False, timeout=10), self.state()["decisions"]
        return home


@pytest.fixture(params=["ryu", "agent"])
def app(network, tmp_path, request):
    running = App(network, tmp_path, request.param)
    yield running
    running.stop()
    emptied(network)


def emptied(network) -> None:
    """Servers flushed, the classifier's hot keys gone: each test's app starts on empty tables (it would adopt what
    the one before left: controller/adoption.py)."""
    for host in network.server_hosts:
        tcp_client(ServerAddress(host.ip)).flush_all()
    tables = Tables(network.switch.classifier.pin_dir)
    try:
        for key, entry in tables.held_keys().items():
            tables.delete_hot(key, entry)
    finally:
        tables.close()


def test_hot_gets_are_spread_by_weight_and_answered_from_the_home_address(network, app):
    home = app.make_hot(b"hot:1", b"v1")
    before = app.state()["counters"]["data_plane"]["switch"]  # the classifier's, since the module began
    hot_gets_spread_evenly_and_answered_from_home(network, home)
    counters = app.state()["counters"]["data_plane"]
    assert counters["switch"]["balanced"] - before["balanced"] == 900, (before, counters["switch"])
    assert counters["switch"]["replies_rewritten"] > before["replies_rewritten"]
    groups = network.switch.ovs.ofctl("dump-groups", network.switch.bridge)
    assert "selection_method=hash,fields=eth_dst" in groups and groups.count("bucket=") == 3, groups


def test_cold_keys_and_multi_gets_reach_their_home(network, app):
    cold_and_multi_gets_reach_their_home(network, app.config.servers, app.key_hash, app.make_hot(b"hot:2", b"v2"))


def test_a_write_is_mirrored_synced_and_no_get_after_it_is_stale(network, app):
    home = app.make_hot(b"hot:3", b"old")
    server_ip = network.server_hosts[home].ip
    setter = ("import socket,sys; s=socket.create_connection((sys.argv[1],11211)); "
              "s.sendall(b'set hot:3 0 0 3\\r\\nnew\\r\\n'); print(s.recv(100))")
    # the set and, at once after it, 300 gets from the same client: none may see the old value
    result = network.run(network.client_hosts[0], [sys.executable, "-c", setter, server_ip])
    assert b"STORED" in result.stdout.encode(), result
    reply = client_gets(network, server_ip, b"hot:3", 300)
    assert reply["answered"] == 300 and list(reply["values"]) == ["VALUE hot:3 0 3\r\nnew\r\nEND\r\n"], reply
    key = app.hot(b"hot:3")
    assert key["syncs"] >= 1 and key["dirty"] is False, key
    for server in app.config.servers:  # every copy holds the new value
        assert MetaClient(server.address).get(b"hot:3").value == b"new"
    counts = app.state()["counters"]["data_plane"]["keys"]["hot:3"]
    assert counts["mirrored"] == 1, counts


def test_the_dirty_rule_sends_gets_home_until_the_sync(network, app):
    home = app.make_hot(b"hot:4", b"v4")
    tables = Tables(network.switch.classifier.pin_dir)
    try:
        slot = next(entry.slot for key, entry in tables.held_keys().items() if key == b"hot:4")
        tables.hold(slot)  # as a write the controller has not synced yet leaves it
        before = hits(network)
        client_gets(network, network.server_hosts[home].ip, b"hot:4", 100)
        spread = [a - b for a, b in zip(hits(network), before)]
        assert spread[home] == 100 and sum(spread) == 100, spread
        assert tables.key_counts(slot).home_while_dirty == 100
    finally:
        tables.close()


@pytest.mark.parametrize("via", ["ryu", "agent"])
def test_a_wrong_server_mac_takes_the_server_out_and_the_others_stay_balanced(network, tmp_path, via):
    """The operator's black hole on OpenFlow: a server configured with a valid-looking but wrong MAC. The group
    rewrites the gets balanced to it to that MAC, which no port has learned: flooded and lost (its L2 flood rule
    counts them). The classifier records the MAC the server's TCP segments come from (the controller's copies to
    it bring some); the controller compares, takes the server out of every replica set and says so in one line with
    both MACs. From then on every get is answered and none is balanced to it."""
    key = b"hot:mac"
    config = config_of(network)
    home = make_hash(config.balancing.hash, [s.address for s in config.servers]).server_of(key)
    bad = (home + 1) % 3
    app = App(network, tmp_path, via, macs={bad: WRONG_MAC})
    try:
        assert app.make_hot(key, b"vm") == home
        home_ip = network.server_hosts[home].ip
        early = client_gets(network, home_ip, key, 20)  # balanced at once: those sent to `bad` may be lost
        assert eventually(lambda: any(d["action"] == "server-mac" for d in app.state()["decisions"]), timeout=10), \
            app.state()["decisions"]
        line = next(d["reason"] for d in app.state()["decisions"] if d["action"] == "server-mac")
        real = network.server_hosts[bad].mac
        assert f"configured mac {WRONG_MAC}, seen {real}" in line and line.startswith(f"server {bad} "), line
        assert eventually(lambda: all(r["weight"] == 0 for r in app.hot(key)["replicas"] if r["server"] == bad)
                          and not app.hot(key)["dirty"], timeout=10), app.hot(key)
        # every get lost was one flooded to the wrong MAC (Open vSwitch adds its datapath's counts to the flow's
        # within a second or so)
        assert eventually(lambda: app.state()["servers"][bad]["mac_check"]["flooded_gets"] >= 20 - early["answered"],
                          timeout=10), (early, app.state()["servers"][bad]["mac_check"])
        check = app.state()["servers"][bad]["mac_check"]
        lost = check["flooded_gets"]
        assert check["out_of_rotation"]["status"] == "mismatch" and check["seen"] == [real], check
        assert [s["mac_check"]["status"] for s in app.state()["servers"]] == [
            "mismatch" if i == bad else "ok" for i in range(3)]
        before = hits(network)
        reply = client_gets(network, home_ip, key, 600)
        spread = [a - b for a, b in zip(hits(network), before)]
        assert reply["answered"] == 600 and spread[bad] == 0 and sum(spread) == 600, (reply, spread)
        assert min(spread[i] for i in range(3) if i != bad) > 150, spread  # both others serve it
        assert app.state()["servers"][bad]["mac_check"]["flooded_gets"] == lost  # none balanced to it since
    finally:
        app.stop()
        emptied(network)


def test_a_switch_that_restarts_gets_its_flows_and_groups_back(network, app):
    home = app.make_hot(b"hot:5", b"v5")
    ovs = network.switch.ovs
    ovs.stop_switch()
    ovs.start_switch()  # empty: no flow, no group, until the app sees it connect again
    assert eventually(lambda: "group_id=" in ovs.ofctl("dump-groups", network.switch.bridge), timeout=20), app.log()
    assert eventually(lambda: client_gets(network, network.server_hosts[home].ip, b"hot:5", 30)["answered"] == 30,
                      timeout=20)
    before = hits(network)
    client_gets(network, network.server_hosts[home].ip, b"hot:5", 300)
    spread = [a - b for a, b in zip(hits(network), before)]
    assert sum(spread) == 300 and min(spread) > 0, spread  # balanced again, over all three
    assert app.log().count("hot keys installed") >= 2


def test_the_app_stops_cleanly_and_ends_its_lease(network, app):
    app.make_hot(b"hot:6", b"v6")
    assert app.stop() == 0, app.log()
    assert "Traceback" not in app.log(), app.log()
    tables = Tables(network.switch.classifier.pin_dir)
    try:
        assert tables.lease() == 0  # nobody keeps the copies fresh any more: every hot get goes home
    finally:
        tables.close()


# --- taking over what the switch holds (issue 47 item 2) ----------------------------------------------------------
READ_ONLY, WRITTEN = b"hot:r", b"hot:w"
PACE = 0.0005  # seconds the load's clients wait between requests


def rule_ages(net: NamespaceNetwork) -> dict[str, float]:
    """Open vSwitch's own age (duration) of each flow and group on the bridge, but the learned L2 flows: a rule written
    again, or deleted and added, starts from 0."""
    ovs, bridge = net.switch.ovs, net.switch.bridge
    ages = {f"table={table} {rule}": float(age) for age, table, rule in re.findall(
        r"duration=([\d.]+)s, table=(\d+),.*?(priority=\S+)", ovs.ofctl("dump-flows", bridge))}
    ages.update({f"group {number}": float(age) for number, age in re.findall(
        r"group_id=(\d+),duration=([\d.]+)s", ovs.ofctl("dump-group-stats", bridge))})
    return {rule: age for rule, age in ages.items() if not rule.startswith(f"table={L2} priority=10,")}


def untouched(before: dict[str, float], after: dict[str, float], since: float) -> dict[str, tuple]:
    """The rules of `before` that are gone from `after`, or younger there than the `since` seconds between the two
    dumps (written again meanwhile): rule -> (age before, age after)."""
    return {rule: (age, after.get(rule)) for rule, age in before.items()
            if rule not in after or after[rule] < since}


def both_hot(app: App) -> dict[bytes, int]:
    """READ_ONLY and WRITTEN made hot in one report, and clean: their homes."""
    homes = {key: app.key_hash.server_of(key) for key in (READ_ONLY, WRITTEN)}
    for key, home in homes.items():
        MetaClient(app.config.servers[home].address).set(key, StoredItem(b"v0", 0, -1, 0))
    app.controller.report([(READ_ONLY, 500.0), (WRITTEN, 500.0)])
    assert eventually(lambda: all((app.hot(k) or {}).get("dirty") is False for k in homes), timeout=20), \
        app.state()["decisions"]
    return homes


def start_load(net: NamespaceNetwork, tmp_path, homes: dict[bytes, int]) -> tuple[Path, list]:
    """A client writing WRITTEN and reading it back (stale and miss counted), another only reading READ_ONLY (the
    fabric failover test's load); touch the path returned to stop them."""
    (tmp_path / "load.py").write_text(LOAD)
    stop = tmp_path / "stop"
    loads = [net.popen(net.client_hosts[0], [sys.executable, str(tmp_path / "load.py"), mode, str(stop), str(PACE),
                                             f"{net.server_hosts[homes[key]].ip}={key.decode()}"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for mode, key in (("writes", WRITTEN), ("reads", READ_ONLY))]
    return stop, loads


def stop_load(stop: Path, loads: list) -> tuple[dict, dict]:
    stop.touch()
    return tuple(json.loads(load.communicate(timeout=60)[0].strip().splitlines()[-1]) for load in loads)


def settled(app: App, net: NamespaceNetwork, keys: tuple[bytes, ...], dumped: float, stop: Path, loads: list
            ) -> tuple[float, dict[str, float], dict, tuple[dict, dict]]:
    """Once `keys` are clean again (and a second more of load): the seconds since the rules' ages were `dumped`,
    their ages now, the state, and what the load counted."""
    assert eventually(lambda: all((app.hot(k) or {}).get("dirty") is False for k in keys), timeout=20), \
        app.state()["decisions"][-20:]
    time.sleep(1.0)
    since = time.monotonic() - dumped
    return since, rule_ages(net), app.state(), stop_load(stop, loads)


def key_counts(state: dict, key: bytes) -> dict:
    return state["counters"]["data_plane"]["keys"][key.decode()]


def test_an_agent_whose_stream_is_cut_under_load_adopts_what_the_switch_holds(network, tmp_path):
    """The network between the controller and the switch agent is cut under load (every connection through it
    ends): the agent lets its driver go, the controller comes back, the agent's fresh driver reads back the
    classifier's keys and Open vSwitch's flows and groups, and the controller adopts them. Nothing is installed
    again (no replay, no warm), no flow or group of the bridge is written again (Open vSwitch's own ages go on), the
    read-only key's gets are balanced all along (none sent home), and no get is stale or missed."""
    app = App(network, tmp_path, "agent", relayed=True)
    core = app.controller.core
    try:
        homes = both_hot(app)
        stop, loads = start_load(network, tmp_path, homes)
        time.sleep(1.5)
        before, counts_before = app.state(), dict(core.counts)
        ages, dumped = rule_ages(network), time.monotonic()
        app.relay.cut()
        assert eventually(lambda: core.counts["reconnects"] > counts_before.get("reconnects", 0), timeout=30), \
            app.log()[-3000:]
        since, ages_after, after, (writes, reads) = settled(app, network, tuple(homes), dumped, stop, loads)
        cuts = app.relay.cuts
    finally:
        app.stop()
        emptied(network)
    made = {name: core.counts[name] - counts_before.get(name, 0) for name in
            ("reconnects", "decisions_replay", "decisions_warm", "decisions_cool", "decisions_reconcile",
             "decisions_adopt", "adopted_kept_clean", "adopted_kept_dirty", "adopted_resynced", "adopted_rebuilt")}
    sent_home = key_counts(after, READ_ONLY)["home_while_dirty"] - key_counts(before, READ_ONLY)["home_while_dirty"]
    print(f"stream cut {cuts} time(s): {made}; writer {writes}, reader {reads}; read-only key's gets sent "
          f"home since: {sent_home}; {len(ages)} flows and groups, aged {since:.2f} s more")
    assert made["reconnects"] == 1 and made["decisions_adopt"] == 2, made
    assert made["decisions_replay"] == made["decisions_warm"] == made["decisions_cool"] == 0, made
    assert made["decisions_reconcile"] == made["adopted_rebuilt"] == 0, made
    assert untouched(ages, ages_after, since) == {}
    assert key_counts(after, READ_ONLY)["gets"] >= key_counts(before, READ_ONLY)["gets"]
    assert sent_home == 0
    assert writes["stale"] == 0 and writes["miss"] == 0 and reads["miss"] == 0, (writes, reads)
    assert writes["fresh"] > 0 and reads["found"] > 0 and "Traceback" not in app.log()


def test_a_ryu_manager_killed_and_started_again_keeps_every_flow_and_group(network, tmp_path):
    """ryu-manager killed (SIGKILL: its lease left in the classifier) and started again under load: the new app
    adopts the classifier's keys, and when the bridge connects to it, reads its flows and groups back and writes
    none of them again (Open vSwitch's own ages go on)."""
    app = App(network, tmp_path, "ryu")
    try:
        homes = both_hot(app)
        stop, loads = start_load(network, tmp_path, homes)
        time.sleep(1.0)
        ages, dumped = rule_ages(network), time.monotonic()
        os.kill(app.controller.process.pid, signal.SIGKILL)
        app.controller.process.wait(timeout=30)
        app.controller.start()  # the same config: adopts what the killed one left
        # (the written key is kept dirty and settles once its lost copies are given up, which a steady writer
        # delays: the copies of the writes made while no ryu-manager ran never came)
        since, ages_after, after, (writes, reads) = settled(app, network, (READ_ONLY,), dumped, stop, loads)
    finally:
        app.stop()
        emptied(network)
    actions = [(d["action"], d["key"], d.get("why")) for d in after["decisions"]]
    print(f"ryu-manager killed and started again: {actions[:6]}; writer {writes}, reader {reads}; {len(ages)} flows "
          f"and groups, aged {since:.2f} s more")
    assert sorted(a for a in actions if a[0] == "adopt") == [("adopt", k.decode(), None) for k in (READ_ONLY, WRITTEN)]
    assert not [a for a in actions if a[0] in ("replay", "warm", "cool", "reconcile")], actions
    assert untouched(ages, ages_after, since) == {}
    assert writes["stale"] == 0 and reads["miss"] == 0 and writes["miss"] == 0, (writes, reads)


@pytest.mark.parametrize("app", ["ryu"], indirect=True)
def test_the_http_api_through_ryus_wsgi_answers_as_the_controllers_does(network, app):
    def ask(method: str, path: str, body: bytes | None = None):
        request = urllib.request.Request(f"http://{HTTP}{path}", body, method=method,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=5) as reply:
                return reply.status, dict(reply.headers), json.load(reply)
        except urllib.error.HTTPError as err:
            return err.code, dict(err.headers), json.load(err)

    status, headers, body = ask("POST", "/report", b"{not json")
    assert status == 400 and "error" in body and headers.get("Content-Type") == "application/json", headers
    status, headers, body = ask("PUT", "/state", b"{}")
    assert status == 405 and headers["Allow"] == "GET" and "endpoints" in body
    status, _, body = ask("GET", "/nowhere")
    assert status == 404 and set(body["endpoints"]) == {"GET /state", "GET /decisions", "GET /metrics",
                                                         "POST /report", "POST /sketch"}
    status, _, body = ask("POST", "/sketch", b'{"call": "counters", "args": []}')
    assert status == 503 and "read from the switch itself" in body["error"]  # the key classifier's: bpf maps
    status, _, body = ask("POST", "/report", json.dumps({"time": 1.0, "interval": 1.0, "rate": -5.0,
                                                          "top": []}).encode())
    assert status == 400 and "rate" in body["error"]
    assert ask("GET", "/decisions")[0] == 200
    home = app.make_hot(b"hot:7", b"v7")  # /metrics: the gets the switch counted, as Prometheus reads them
    client_gets(network, network.server_hosts[home].ip, b"hot:7", 60)
    assert eventually(lambda: metric("mbalancer_hot_key_gets_total", key="hot:7") == 60, timeout=10)
    assert metric("mbalancer_controller_info", driver="openflow") == 1
    assert metric("mbalancer_hot_keys") == 1
    def split() -> list[float]:  # from the group's bucket counters, which OVS brings up to date a little later
        return [metric("mbalancer_hot_key_replica_gets_total", key="hot:7", server=str(s)) or 0 for s in range(3)]
    assert eventually(lambda: sum(split()) == 60, timeout=10), split()
    assert min(split()) > 0, split()


def metric(name: str, **labels: str) -> float | None:
    """A sample of the Ryu app's /metrics, parsed by prometheus-client (None: no such sample)."""
    with urllib.request.urlopen(f"http://{HTTP}/metrics", timeout=5) as reply:
        assert reply.headers["Content-Type"].startswith("text/plain")
        text = reply.read().decode()
    return next((s.value for family in text_string_to_metric_families(text) for s in family.samples
                 if s.name == name and labels.items() <= s.labels.items()), None)


def test_a_bad_config_is_one_line_and_exit_status(network, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[[servers]]\nname = "a"\nip = "10.0.0.1"\nmac = "zz"\n')
    log = tmp_path / "ryu.log"
    process = launch(bad, open(log, "w"))
    assert process.wait(timeout=30) != 0
    text = log.read_text()
    assert "mbalancer: --mbalancer-config:" in text and "Traceback" not in text, text


def test_the_bridge_is_reached_over_tcp_too_and_an_unreachable_one_is_one_line(network, tmp_path, run_cli):
    """`mbalancer controller` on the switch's box drives the bridge itself (dataplane.openflow.connect, here a ptcp:
    target of the bridge), no ryu-manager; a bridge that does not answer, or an address that is none, is one line,
    from the controller and from the agent."""
    ovs, bridge = network.switch.ovs, network.switch.bridge
    port = free_port()
    ovs.vsctl("set-controller", bridge, f"tcp:{OPENFLOW}", f"ptcp:{port}:127.0.0.1")
    try:
        ovs.ofctl("del-flows", bridge)
        config = tmp_path / "direct.toml"
        config.write_text(config_toml(config_of(network, {"kind": "openflow", "openflow": {
            "classifier": TAG, "connect": f"tcp:127.0.0.1:{port}"}})))
        result = run_cli("-v", "controller", "--config", str(config), "--duration", "1", timeout=60)
        assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-2000:]
        assert "connected to the bridge at tcp:127.0.0.1" in result.stderr
        assert "cookie=0x4d42" in ovs.ofctl("dump-flows", bridge)  # the pipeline, installed over that connection
    finally:
        ovs.vsctl("set-controller", bridge, f"tcp:{OPENFLOW}")
    for connect, said in ((f"unix:{tmp_path}/none.mgmt", "no Open vSwitch bridge answers at unix:"),
                          (f"tcp:127.0.0.1:{port}", "no Open vSwitch bridge answers at tcp:127.0.0.1"),
                          ("ftp:x", 'is not "unix:PATH"')):
        config.write_text(config_toml(config_of(network, {"kind": "openflow", "openflow": {
            "classifier": TAG, "connect": connect}})))
        result = run_cli("controller", "--config", str(config), "--duration", "1", timeout=60)
        assert result.returncode != 0 and said in result.stderr and "Traceback" not in result.stderr, result.stderr
        with pytest.raises(RuntimeError, match=said) as refused:
            AgentProcess(tmp_path, "openflow", {"classifier": TAG, "connect": connect})
        assert "Traceback" not in str(refused.value)
