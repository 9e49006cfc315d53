"""A failover nobody notices (issue 47 item 2): the testbed's leaf-spine of four eBPF (or bmv2) switches behind their
switch agents, two `mbalancer controller` processes elected through etcd, memcached on two servers, one client writing
and reading two keys (one homed on each server) and another only reading two keys homed on the first server, so
that this server's share of gets shows whether those keys are balanced. The leader is killed (SIGKILL) under
load, or cut off from etcd (it loses its lead and stops, letting the switches go with their lease running); the
other one takes over and adopts what the switches hold (controller/adoption.py).

Asserted, independent of the machine's speed: every key adopted, none rebuilt, no key cooled, warmed again or
reinstalled (each key's switch counters go on from where they were: an install resets them); not one get of the
read-only keys, balanced and clean before the kill, was sent home from the kill to the end (the switches count
those); no stale read, no miss. Printed: the busiest server's share of gets in windows of 100 ms from the kill to
5 s after it, against its level before the kill and against how much the windows before the kill already varied
(read from the servers' own cmd_get): at this load a window holds a few hundred gets, so a share of 0.5 varies by
about 0.07 in 100 ms with no failover at all, which is why the share is printed rather than asserted within 0.03."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from dataplanes import registry
from mbalancer.config import load_config
from mbalancer.memcache.hashing import make_hash
from mbalancer.memcache.meta import MetaClient, MetaError, StoredItem
from mbalancer.processes import stop_process
from tests.conftest import MBALANCER, why_no_mininet
from tests.etcd_server import EtcdServer, available
from tests.switch_agent import hello
from tests.test_fabric_failover import (LOAD, WAIT, Controller, controller_config, elected_id, ended_saying,
                                        monitor_config, next_leader, said, servers_table, state)

why_not = why_no_mininet() or available()
pytestmark = pytest.mark.skipif(why_not is not None, reason=str(why_not))
PACE = 0.0002  # seconds each client waits between requests (as the fabric failover test)
LEASE = 6.0  # s: longer than a takeover (election_ttl 1 s, then the new leader's start: 1.1-1.8 s, and 3.8 s once with
# two CPU hogs and a second network stream beside it, when a 3 s lease ran out first), so no switch stops trusting
# its copies meanwhile
WINDOW = 0.1  # s: the share of gets is measured per window this long
AFTER = 5.0  # s after the kill that the windows cover
BUSIEST = 0  # the server homing the read-only keys: the busiest were they not balanced


def keys_homed(key_hash, prefix: str, home: int, count: int) -> list[bytes]:
    keys = (f"{prefix}:{i}".encode() for i in range(10_000))
    return [key for key in keys if key_hash.server_of(key) == home][:count]


def config(folder: Path, name: str, bed, etcd: EtcdServer, hot: int) -> Path:
    """A controller's config as the fabric failover test writes it, with `hot` keys and a lease that outlasts the
    takeover."""
    path = controller_config(folder, name, bed, etcd)
    text, leases = re.subn(r"(?m)^election_ttl = 1$", f"election_ttl = 1\nlease = {LEASE}", path.read_text())
    text, hots = re.subn(r"(?m)^hot = \d+$", f"hot = {hot}", text)
    assert leases == hots == 1, text
    path.write_text(text)
    return path


class ServerGets:
    """Each server's cmd_get, read every WINDOW seconds by a thread of the test: (time, gets per server)."""

    def __init__(self, addresses):
        self.clients = [MetaClient(address, timeout=0.5) for address in addresses]
        self.samples: list[tuple[float, tuple[int, ...]]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(WINDOW):
            try:
                self.samples.append((time.monotonic(), tuple(int(c.stats()["cmd_get"]) for c in self.clients)))
            except MetaError:
                continue

    def shares(self, since: float, until: float) -> list[float]:
        """The busiest server's share of the gets in each window between `since` and `until`."""
        within = [s for s in self.samples if since <= s[0] <= until]
        shares = []
        for (_, before), (_, after) in zip(within, within[1:]):
            gets = [b - a for a, b in zip(before, after)]
            if sum(gets) > 0:
                shares.append(gets[BUSIEST] / sum(gets))
        return shares


def key_counts(state_now: dict) -> dict[str, dict]:
    return state_now["counters"]["data_plane"]["keys"]


def all_clean(config_path: Path, keys: list[bytes]) -> dict:
    """Once the controller has every key clean and the switches have balanced gets of each: its state."""
    deadline = time.monotonic() + WAIT
    while True:
        now = state(config_path)
        clean = {k["key"] for k in now["hot_keys"] if k["state"] == "clean"}
        counted = key_counts(now)
        if clean >= {k.decode() for k in keys} and all(
                sum(counted.get(k.decode(), {}).get("per_replica", {}).values()) > 0 for k in keys):
            return now
        assert time.monotonic() < deadline, (now["hot_keys"], now["counters"])
        time.sleep(0.1)


# bmv2 boxes where simple_switch_grpc is installed (`make p4`); the program tells its lease (op 3), so a new leader
# knows whether the switches still trust the copies.
P4_WHY_NOT = registry.get("p4").available()


@pytest.mark.parametrize("dataplane", ["ebpf", pytest.param("p4", marks=pytest.mark.skipif(
    P4_WHY_NOT is not None, reason=f"no bmv2 boxes that tell their lease: {P4_WHY_NOT}"))])
def test_a_leader_killed_under_load_is_not_noticed(tmp_path, dataplane):
    fail_over(tmp_path, dataplane, KILLED)


def test_a_leader_that_loses_its_lead_under_load_lets_the_switches_go_balanced(tmp_path):
    """The leader cut off from etcd: it cannot renew, loses its lead and stops (exit 1) before etcd lets its lease
    run out, letting the agents go with the switches' lease running (controller/cli.py `_stop_driving`), so the
    successor adopts every key as it is, as after a kill: not one get of the read-only keys sent home, no key
    resynced, no stale read of the keys written throughout."""
    fail_over(tmp_path, "ebpf", CUT_FROM_ETCD)


KILLED, CUT_FROM_ETCD = "kill -9 of the leader", "the leader cut off from etcd (its lead lost)"


def fail_over(tmp_path: Path, dataplane: str, fault: str) -> None:
    """The testbed under load, the leader made to fail by `fault`, and what the successor did, asserted."""
    from topologies.testbed import Testbed, TestbedSpec
    spec = TestbedSpec(topology="leafspine", servers=2, clients=2, leaves=2, spines=2, agents=True, controllers=2,
                       dataplane=dataplane)
    with Testbed(spec) as bed, EtcdServer(tmp_path, bed.lan_namespace("etcd")) as etcd:
        key_hash = make_hash(load_config(_probe_config(tmp_path, bed)).balancing.hash, bed.addresses)
        written = keys_homed(key_hash, "fa:w", 0, 1) + keys_homed(key_hash, "fa:w", 1, 1)
        read_only = keys_homed(key_hash, "fa:r", BUSIEST, 2)
        keys = written + read_only
        for key in keys:
            MetaClient(bed.addresses[key_hash.server_of(key)]).set(key, StoredItem(b"v0", 0, -1, 0))
        group = [Controller(host, config(tmp_path, host.name, bed, etcd, len(keys)), tmp_path)
                 for host in bed.controller_hosts]
        loads: list[subprocess.Popen] = []
        sampler = ServerGets(bed.addresses)
        try:
            group[0].start(bed)
            first = elected_id(group[0].log)
            group[1].start(bed)
            group[1].waits()
            pushes = [arg for c in group
                      for arg in ("--push", f"http://{load_config(c.config).controller.listen}/report")]
            bed.processes.append(subprocess.Popen(
                [str(MBALANCER), "monitor", "--iface", ",".join(bed.monitor_ports), "--json", "--interval", "0.5",
                 "--top", str(len(keys)), "--port", "11211", "--config", str(monitor_config(tmp_path, bed)), *pushes],
                stdout=subprocess.DEVNULL, stderr=(tmp_path / "monitor.log").open("w")))
            (tmp_path / "load.py").write_text(LOAD)
            stop = tmp_path / "stop"
            loads = [bed.popen(host, ["python3", str(tmp_path / "load.py"), mode, str(stop), str(PACE),
                                      *[f"{bed.servers[key_hash.server_of(k)].ip}={k.decode()}" for k in chosen]],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                     for host, mode, chosen in zip(bed.client_hosts, ("writes", "reads"), (written, read_only))]
            all_clean(group[0].config, keys)
            time.sleep(2)  # the level before the kill
            before = state(group[0].config)
            killed = time.monotonic()
            if fault == KILLED:
                os.kill(group[0].process.pid, signal.SIGKILL)
            else:
                bed.lan.cut(bed.lan_host(group[0].name), bed.lan_host("etcd"))
            leader = next_leader(group[1:])
            election_id = elected_id(leader.log)
            boxes, token = list(bed.dataplane().settings.boxes), Path(bed.dataplane().settings.token_file)
            while not all(hello(box.split()[0], token)["primary_election_id"] == election_id for box in boxes):
                assert time.monotonic() - killed < WAIT, said(leader.log)[-2000:]
                time.sleep(0.02)
            took = time.monotonic() - killed
            time.sleep(max(killed + AFTER - time.monotonic(), 0))
            after = state(leader.config)
            if fault == CUT_FROM_ETCD:
                ended_saying(group[0], "lost the lead")
            stop.touch()
            counts, reads = (json.loads(load.communicate(timeout=WAIT)[0].strip().splitlines()[-1]) for load in loads)
        finally:
            sampler.stop.set()
            for process in [c.process for c in group if c.process is not None] + loads:
                stop_process(process)
        level = sum(earlier := sampler.shares(killed - 2, killed)) / len(earlier)
        windows = sampler.shares(killed, killed + AFTER)
        worst = max(abs(share - level) for share in windows)
        noise = max(abs(share - level) for share in earlier)  # what 100 ms of this load varies by, failover or not
        decisions = after["decisions"]
        sent_home = {k.decode(): key_counts(after)[k.decode()]["home_while_dirty"]
                     - key_counts(before)[k.decode()]["home_while_dirty"] for k in read_only}
        spread = {k.decode(): {server: n - key_counts(before)[k.decode()]["per_replica"].get(server, 0)
                               for server, n in key_counts(after)[k.decode()]["per_replica"].items()}
                  for k in keys}  # where each key's gets went from just before the kill on, as the switches counted
        print(f"{fault}: {leader.name} drives every box {took:.2f} s after; busiest server's share "
              f"{level:.3f} before the kill (its windows at most {noise:.3f} off it), "
              f"{min(windows):.3f}-{max(windows):.3f} in {len(windows)} windows of {1000 * WINDOW:.0f} ms over the "
              f"{AFTER:g} s after it (at most {worst:.3f} off; mean {sum(windows) / len(windows):.3f}); "
              f"read-only keys' gets "
              f"sent home after the kill: {sent_home}; each key's gets by server since: {spread}; windows: "
              f"{' '.join(f'{share:.2f}' for share in windows)}; the writing client {counts}, the reading one {reads}; "
              f"adoption: {[(d['key'], d['action'], d.get('why')) for d in decisions if d['key']]}")
        assert election_id > first
        assert counts["stale"] == 0 and counts["miss"] == 0 and reads["miss"] == 0, (counts, reads)
        assert counts["fresh"] > 0 and counts["unsure"] == 0 and reads["found"] > 0
        adopted = {d["key"]: d for d in decisions if d["action"] == "adopt"}
        assert set(adopted) == {k.decode() for k in keys} and not any("why" in d for d in adopted.values()), decisions
        assert not [d for d in decisions if d["action"] in ("reconcile", "warm", "cool", "replay")], decisions
        for key in keys:  # the same slots counting on: no key was installed again (an install resets its counters)
            assert key_counts(after)[key.decode()]["gets"] >= key_counts(before)[key.decode()]["gets"]
        assert sent_home == {k.decode(): 0 for k in read_only}, sent_home  # balanced and clean all along
        for controller in group:
            assert "Traceback" not in said(controller.log), said(controller.log)[-3000:]


def _probe_config(folder: Path, bed) -> Path:
    """The servers alone, to read the config's hash from."""
    path = folder / "hash.toml"
    path.write_text(servers_table(bed))
    return path
