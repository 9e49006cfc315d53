"""Controllers failing over on a fabric under load: the testbed's leaf-spine of four switches (eBPF, Open vSwitch or
bmv2), each behind its switch agent on a box of its own, three `mbalancer controller` processes on hosts of their own
elected through a real etcd of three members (in a namespace of the management LAN), memcached on the server hosts,
and clients writing and reading hot keys the whole time. Three faults in turn, each ending with another controller
driving every box: the leader killed with SIGKILL; the next leader cut off from etcd (a partition on the LAN: it
stops, its lease gone); the next cut off from one switch (it hands the lead to the candidate that reaches every
switch). No client read a value older than its
own last acknowledged write (a stale read) or found no value (a miss), before, during or after."""
from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from dataplanes import registry
from mbalancer.config import load_config
from mbalancer.memcache.hashing import make_hash
from mbalancer.memcache.meta import MetaClient, StoredItem
from tests.conftest import MBALANCER, why_no_mininet
from tests.etcd_server import EtcdCluster, available
from tests.switch_agent import hello

why_not = why_no_mininet() or available()
pytestmark = pytest.mark.skipif(why_not is not None, reason=str(why_not))
WAIT = 60.0  # seconds any one step below may take at most (two CPU hogs beside it all: still seconds)
KEYS = [b"fo:%d" % i for i in range(4)]
LEADS = re.compile(r"elected through etcd, election id (\d+)(?s:.*)Ctrl-C stops")  # what a leader says, in order
HTTP_PORT = 9700  # each controller's API, on its host's address on the management LAN
PACE = 0.0002  # seconds each client waits between requests: load, not a flood that starves the controllers

# Runs on a client host until the file `stop` exists: each key in turn is set to a new value over UDP at its home
# (the set acknowledged: STORED; sent again while unanswered, as a client does, SET_TRIES times at most), then got 30
# times (the first go home while the key is dirty, the later ones are balanced once the controller has synced the
# copies); every get must answer that value. With "reads" only gets, which must find a value. Prints the counts as
# JSON.
LOAD = r"""
import json, os, socket, struct, sys, time
writes, stop, pace = sys.argv[1] == "writes", sys.argv[2], float(sys.argv[3])
SET_TRIES = 3
pairs = [p.split("=") for p in sys.argv[4:]]
socks = {}
for ip, key in pairs:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.connect((ip, 11211))  # connected: a reply from any address but the home's is never read
    s.settimeout(0.5)
    socks[key] = s
counts = dict(sets=0, set_retries=0, set_unanswered=0, gets=0, fresh=0, stale=0, miss=0, unanswered=0, unsure=0,
              found=0)
rid, n, deadline = 0, 0, time.monotonic() + 300  # at most, if never told to stop

def ask(sock, payload):
    global rid
    time.sleep(pace)
    rid = (rid + 1) % 65536
    sock.send(struct.pack("!HHHH", rid, 0, 1, 0) + payload)
    while True:
        data = sock.recv(65535)
        if data[:2] == struct.pack("!H", rid):
            return data[8:]

while time.monotonic() < deadline and not os.path.exists(stop):
    for ip, key in pairs:
        n += 1
        value, acked = b"v%d" % n, False
        if writes:
            for attempt in range(SET_TRIES):
                try:
                    acked = ask(socks[key], b"set %s 0 0 %d\r\n%s\r\n" % (key.encode(), len(value), value)) == \
                        b"STORED\r\n"
                    break
                except socket.timeout:
                    counts["set_retries"] += attempt + 1 < SET_TRIES
            counts["sets"] += 1
            counts["set_unanswered"] += not acked
        for _ in range(30 if writes else 1):
            counts["gets"] += 1
            try:
                reply = ask(socks[key], b"get %s\r\n" % key.encode())
            except socket.timeout:
                counts["unanswered"] += 1
                continue
            if reply == b"END\r\n":
                counts["miss"] += 1
            elif not writes:
                counts["found"] += 1
            elif not acked:
                counts["unsure"] += 1  # the set may or may not have been applied: either value is right
            elif reply.split(b"\r\n")[1] == value:
                counts["fresh"] += 1
            else:
                counts["stale"] += 1
print(json.dumps(counts))
"""


def controller_config(folder: Path, name: str, bed, etcd: EtcdCluster) -> Path:
    """A controller's config: its HTTP API on the management LAN, so with a token (the monitor's config has it)."""
    fabric = bed.dataplane().settings
    boxes = ", ".join(f'"{box}"' for box in fabric.boxes)
    endpoints = ", ".join(f'"{url}"' for url in etcd.urls)
    path = folder / f"{name}.toml"
    path.write_text(f'{servers_table(bed)}[balancing]\nhot = {len(KEYS)}\nhysteresis = 1\nmode = "equal"\n'
                    f'[controller]\nlisten = "{bed.lan_host(name).ip}:{HTTP_PORT}"\netcd = [{endpoints}]\n'
                    f'election_ttl = 1\ntoken_file = "{api_token(folder)}"\n'
                    f'[dataplane]\nkind = "agent"\n[dataplane.agent]\nkind = "{fabric.kind}"\n'
                    f'boxes = [{boxes}]\ntoken_file = "{fabric.token_file}"\n')
    return path


def servers_table(bed) -> str:
    return "".join(f'[[servers]]\nname = "{s.name}"\nip = "{s.ip}"\nmac = "{s.mac}"\nport = {s.port}\n'
                   for s in bed.servers)


def api_token(folder: Path) -> Path:
    """The controllers' HTTP API token (folder/controller.token), made once."""
    path = folder / "controller.token"
    if not path.exists():
        path.write_text(secrets.token_hex(16) + "\n")
    return path


def monitor_config(folder: Path, bed) -> Path:
    """The monitor's: the servers, and the controllers' token for its pushes."""
    path = folder / "monitor.toml"
    path.write_text(f'{servers_table(bed)}[controller]\ntoken_file = "{api_token(folder)}"\n')
    return path


@dataclass
class Controller:
    """One controller of the group: its host, config and the process now running there (with its log)."""
    host: object
    config: Path
    folder: Path
    process: subprocess.Popen | None = None
    log: Path | None = None
    runs: int = 0

    @property
    def name(self) -> str:
        return self.host.name

    def start(self, bed) -> None:
        """Started (again, as systemd would after a lost lead): a candidate, or the leader if none leads."""
        self.runs += 1
        self.log = self.folder / f"{self.name}-{self.runs}.log"
        self.process = bed.popen(self.host, [str(MBALANCER), "-v", "controller", "--config", str(self.config)],
                                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self.log.open("w"))

    def waits(self) -> None:
        """Until it is a candidate, waiting while another leads."""
        deadline = time.monotonic() + WAIT
        while "standby: " not in said(self.log):
            assert time.monotonic() < deadline and self.process.poll() is None, said(self.log)[-2000:]
            time.sleep(0.05)

    def leads(self) -> bool:
        return LEADS.search(said(self.log)) is not None


def said(log: Path) -> str:
    return log.read_text(errors="replace") if log.exists() else ""


def elected_id(log: Path) -> int:
    """The controller's election id, once it leads and serves its HTTP API."""
    deadline = time.monotonic() + WAIT
    while (found := LEADS.search(said(log))) is None:
        assert time.monotonic() < deadline, said(log)[-2000:]
        time.sleep(0.05)
    return int(found.group(1))


def next_leader(candidates: list[Controller]) -> Controller:
    deadline = time.monotonic() + WAIT
    while not (leading := [c for c in candidates if c.leads()]):
        assert time.monotonic() < deadline, [said(c.log)[-1000:] for c in candidates]
        time.sleep(0.02)
    assert len(leading) == 1, [said(c.log) for c in leading]
    return leading[0]


def state(config: Path) -> dict:
    settings = load_config(config).controller
    request = urllib.request.Request(f"http://{settings.listen}/state", headers={
        "Authorization": f"Bearer {Path(settings.token_file).read_text().strip()}"})
    with urllib.request.urlopen(request, timeout=5) as answer:
        return json.loads(answer.read())


def installed(state: dict) -> int:
    return len([k for k in state["hot_keys"] if k["state"] != "not-installed"])


def balanced(state: dict) -> int:
    """Gets the switches balanced over a key's replicas (its home among them) since this controller attached."""
    return sum(n for key in state["counters"]["data_plane"]["keys"].values() for n in key["per_replica"].values())


def balancing(config: Path) -> int:
    """Once the controller has every key installed and the switches have balanced gets: how many."""
    deadline = time.monotonic() + WAIT
    while not (installed(now := state(config)) == len(KEYS) and balanced(now) > 0):
        assert time.monotonic() < deadline, (now["hot_keys"], now["counters"])
        time.sleep(0.1)
    return balanced(now)


def every_box_driven_by(boxes: list[str], token: Path, election_id: int) -> bool:
    return all(hello(box.split()[0], token)["primary_election_id"] == election_id for box in boxes)


def taken_over(fault: str, old: Controller, candidates: list[Controller], boxes: list[str], token: Path,
               since: float) -> Controller:
    """The candidate that leads after `fault`, once it drives every box and balances; prints how long it took."""
    new = next_leader(candidates)
    election_id = elected_id(new.log)
    while not every_box_driven_by(boxes, token, election_id):
        assert time.monotonic() - since < WAIT, said(new.log)[-2000:]
        time.sleep(0.02)
    took = time.monotonic() - since
    balancing(new.config)
    print(f"{fault}: {new.name} (election id {election_id}) drives all {len(boxes)} boxes {took:.2f} s after "
          f"{old.name}'s fault")
    return new


def ended_saying(controller: Controller, words: str) -> None:
    """The controller stopped by itself (exit 1) and said why."""
    assert controller.process.wait(timeout=WAIT) == 1, said(controller.log)[-2000:]
    assert words in said(controller.log) and "Traceback" not in said(controller.log), said(controller.log)[-2000:]


# On Open vSwitch boxes a set is lost now and then (its userspace datapath drops a send when a veth's queue is full):
# the writer sends it again, as a client does. bmv2 boxes where simple_switch_grpc is installed (`make p4`).
@pytest.mark.parametrize("dataplane", ["ebpf", "openflow", pytest.param("p4", marks=pytest.mark.skipif(
    registry.get("p4").available() is not None, reason=f"no bmv2 boxes: {registry.get('p4').available()}"))])
def test_a_fabric_under_load_fails_over_with_no_stale_read_and_no_miss(tmp_path, dataplane):
    from topologies.testbed import Testbed, TestbedSpec
    spec = TestbedSpec(topology="leafspine", servers=2, clients=2, leaves=2, spines=2, agents=True, controllers=3,
                       dataplane=dataplane)
    with Testbed(spec) as bed, EtcdCluster(tmp_path, bed.lan_namespace("etcd")) as etcd:
        fabric = bed.dataplane().settings
        boxes, token = list(fabric.boxes), Path(fabric.token_file)
        group = [Controller(host, controller_config(tmp_path, host.name, bed, etcd), tmp_path)
                 for host in bed.controller_hosts]
        key_hash = make_hash(load_config(group[0].config).balancing.hash, bed.addresses)
        for key in KEYS:
            MetaClient(bed.addresses[key_hash.server_of(key)]).set(key, StoredItem(b"v0", 0, -1, 0))
        assert {key_hash.server_of(k) for k in KEYS} == {0, 1}  # keys homed on both leaves
        loads: list[subprocess.Popen] = []
        try:
            group[0].start(bed)
            first = elected_id(group[0].log)  # ctl1 leads before the others start: they wait
            for controller in group[1:]:
                controller.start(bed)
                controller.waits()
            pushes = [arg for c in group
                      for arg in ("--push", f"http://{load_config(c.config).controller.listen}/report")]
            bed.processes.append(subprocess.Popen(  # reports go to whichever controller leads
                [str(MBALANCER), "monitor", "--iface", ",".join(bed.monitor_ports), "--json", "--interval", "0.5",
                 "--top", str(len(KEYS)), "--port", "11211", "--config", str(monitor_config(tmp_path, bed)), *pushes],
                stdout=subprocess.DEVNULL,
                stderr=(tmp_path / "monitor.log").open("w")))
            pairs = [f"{bed.servers[key_hash.server_of(k)].ip}={k.decode()}" for k in KEYS]
            (tmp_path / "load.py").write_text(LOAD)
            stop = tmp_path / "stop"
            loads = [bed.popen(host, ["python3", str(tmp_path / "load.py"), mode, str(stop), str(PACE), *pairs],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                     for host, mode in zip(bed.client_hosts, ("writes", "reads"))]
            balanced_before = balancing(group[0].config)

            leader, since = group[0], time.monotonic()  # 1. kill -9 of the leader
            os.kill(leader.process.pid, signal.SIGKILL)
            leader = taken_over("kill -9", leader, group[1:], boxes, token, since)

            etcd_host = bed.lan_host("etcd")  # 2. the leader cut off from etcd
            old, since = leader, time.monotonic()
            bed.lan.cut(bed.lan_host(old.name), etcd_host)
            leader = taken_over("cut off from etcd", old, [c for c in group[1:] if c is not old], boxes, token, since)
            ended_saying(old, "lost the lead")
            bed.lan.heal(bed.lan_host(old.name), etcd_host)
            old.start(bed)  # as systemd would: a candidate again
            old.waits()

            leaf = bed.lan_host("leaf1")  # 3. the leader cut off from one switch, the one homing srv1's keys
            cut_off, since = leader, time.monotonic()
            bed.lan.cut(bed.lan_host(cut_off.name), leaf)
            leader = taken_over("cut off from leaf1", cut_off, [old], boxes, token, since)
            ended_saying(cut_off, "handed over to a candidate that reaches more switches")
            bed.lan.heal(bed.lan_host(cut_off.name), leaf)

            time.sleep(3)
            stop.touch()
            counts, reads = (json.loads(load.communicate(timeout=WAIT)[0].strip().splitlines()[-1]) for load in loads)
            after = state(leader.config)
            print(f"the writing client: {counts}; the reading one: {reads}; gets balanced before the first fault "
                  f"{balanced_before}, by the last leader {balanced(after)}")
            assert elected_id(leader.log) > first
            assert counts["stale"] == 0 and counts["miss"] == 0 and reads["miss"] == 0, (counts, reads)
            assert counts["fresh"] > 0 and counts["unsure"] == 0 and reads["found"] > 0
            assert installed(after) == len(KEYS) and balanced(after) > 0, after  # the last leader balances again
        finally:
            for controller in group:
                if controller.process is not None and controller.process.poll() is None:
                    controller.process.terminate()
                    controller.process.wait(timeout=30)
            for load in loads:
                if load.poll() is None:
                    load.kill()
        for controller in group:
            assert "Traceback" not in said(controller.log), said(controller.log)[-3000:]
