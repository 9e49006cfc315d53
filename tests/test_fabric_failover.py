"""Controllers failing over on a fabric under load: the testbed's leaf-spine of four eBPF switches, each behind its
switch agent on a box of its own, two `mbalancer controller` processes elected through a real etcd, memcached on
the server hosts, and clients writing and reading hot keys the whole time. The leader is killed with SIGKILL: the
next one drives every box, and no client read a value older than its own last acknowledged write (a stale read) or
found no value (a miss), before, during or after."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from mbalancer.config import load_config
from mbalancer.memcache.hashing import make_hash
from mbalancer.memcache.meta import MetaClient, StoredItem
from mbalancer.memcache.server import free_port
from tests.conftest import MBALANCER, why_no_mininet
from tests.etcd_server import EtcdServer, available
from tests.switch_agent import hello

why_not = why_no_mininet() or available()
pytestmark = pytest.mark.skipif(why_not is not None, reason=str(why_not))
WAIT = 60.0  # seconds any one step below may take at most (two CPU hogs beside it all: still seconds)
KEYS = [b"fo:%d" % i for i in range(4)]
PACE = 0.0002  # seconds each client waits between requests: load, not a flood that starves the controllers

# Runs on a client host until the file `stop` exists: each key in turn is set to a new value over UDP at its home
# (the set acknowledged: STORED), then got 30 times (the first go home while the key is dirty, the later ones are
# balanced once the controller has synced the copies); every get must answer that value. With "reads" only gets, which must
# find a value. Prints the counts as JSON.
LOAD = r"""
import json, os, socket, struct, sys, time
writes, stop, pace = sys.argv[1] == "writes", sys.argv[2], float(sys.argv[3])
pairs = [p.split("=") for p in sys.argv[4:]]
socks = {}
for ip, key in pairs:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.connect((ip, 11211))  # connected: a reply from any address but the home's is never read
    s.settimeout(0.5)
    socks[key] = s
counts = dict(sets=0, set_unanswered=0, gets=0, fresh=0, stale=0, miss=0, unanswered=0, unsure=0, found=0)
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
            try:
                acked = ask(socks[key], b"set %s 0 0 %d\r\n%s\r\n" % (key.encode(), len(value), value)) == \
                    b"STORED\r\n"
            except socket.timeout:
                pass
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


def controller_config(folder: Path, name: str, bed, etcd: EtcdServer) -> Path:
    fabric = bed.dataplane().settings
    servers = "".join(f'[[servers]]\nname = "{s.name}"\nip = "{s.ip}"\nmac = "{s.mac}"\nport = {s.port}\n'
                      for s in bed.servers)
    boxes = ", ".join(f'"{box}"' for box in fabric.boxes)
    path = folder / f"{name}.toml"
    path.write_text(f'{servers}[balancing]\nhot = {len(KEYS)}\nhysteresis = 1\nmode = "equal"\n'
                    f'[controller]\nlisten = "127.0.0.1:{free_port()}"\netcd = ["{etcd.url}"]\nelection_ttl = 1\n'
                    f'[dataplane]\nkind = "agent"\n[dataplane.agent]\nkind = "ebpf"\nboxes = [{boxes}]\n'
                    f'token_file = "{fabric.token_file}"\n')
    return path


def said(log: Path) -> str:
    return log.read_text(errors="replace") if log.exists() else ""


def elected_id(log: Path) -> int:
    """The controller's election id, once it leads and serves its HTTP API."""
    deadline = time.monotonic() + WAIT
    while (found := re.search(r"elected through etcd, election id (\d+)(?s:.*)Ctrl-C stops", said(log))) is None:
        assert time.monotonic() < deadline, said(log)[-2000:]
        time.sleep(0.05)
    return int(found.group(1))


def state(config: Path) -> dict:
    with urllib.request.urlopen(f"http://{load_config(config).controller.listen}/state", timeout=5) as answer:
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


def test_a_fabric_under_load_fails_over_with_no_stale_read_and_no_miss(tmp_path):
    from topologies.testbed import Testbed, TestbedSpec
    spec = TestbedSpec(topology="leafspine", servers=2, clients=2, leaves=2, spines=2, agents=True)
    with EtcdServer(tmp_path) as etcd, Testbed(spec) as bed:
        fabric = bed.dataplane().settings
        token = Path(fabric.token_file)
        configs = [controller_config(tmp_path, f"c{i}", bed, etcd) for i in range(2)]
        key_hash = make_hash(load_config(configs[0]).balancing.hash, bed.addresses)
        for key in KEYS:
            MetaClient(bed.addresses[key_hash.server_of(key)]).set(key, StoredItem(b"v0", 0, -1, 0))
        assert {key_hash.server_of(k) for k in KEYS} == {0, 1}  # keys homed on both leaves
        logs = [tmp_path / f"c{i}.log" for i in range(2)]
        controllers: list[subprocess.Popen] = []
        loads: list[subprocess.Popen] = []
        try:
            for config, log in zip(configs, logs):
                controllers.append(subprocess.Popen([str(MBALANCER), "controller", "--config", str(config)],
                                                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                                    stderr=log.open("w")))
                if len(controllers) == 1:
                    leader = elected_id(logs[0])  # c0 leads before c1 starts: c1 waits
            pushes = [arg for config in configs
                      for arg in ("--push", f"http://{load_config(config).controller.listen}/report")]
            bed.processes.append(subprocess.Popen(  # reports go to whichever controller leads
                [str(MBALANCER), "monitor", "--iface", ",".join(bed.monitor_ports), "--json", "--interval", "0.5",
                 "--top", str(len(KEYS)), *pushes], stdout=subprocess.DEVNULL,
                stderr=(tmp_path / "monitor.log").open("w")))
            pairs = [f"{bed.servers[key_hash.server_of(k)].ip}={k.decode()}" for k in KEYS]
            (tmp_path / "load.py").write_text(LOAD)
            stop = tmp_path / "stop"
            loads = [bed.popen(host, ["python3", str(tmp_path / "load.py"), mode, str(stop), str(PACE), *pairs],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                     for host, mode in zip(bed.client_hosts, ("writes", "reads"))]
            balanced_before = balancing(configs[0])
            killed_at = time.monotonic()
            os.kill(controllers[0].pid, signal.SIGKILL)
            second = elected_id(logs[1])
            while not every_box_driven_by(list(fabric.boxes), token, second):
                assert time.monotonic() - killed_at < WAIT
                time.sleep(0.02)
            took = time.monotonic() - killed_at
            balancing(configs[1])  # the new leader has installed every key again, and balances
            time.sleep(3)
            stop.touch()
            counts, reads = (json.loads(load.communicate(timeout=WAIT)[0].strip().splitlines()[-1]) for load in loads)
            after = state(configs[1])
            print(f"kill -9 of the leader: the next one (election id {second} > {leader}) drives all "
                  f"{len(fabric.boxes)} boxes {took:.2f} s later; the writing client: {counts}; the reading one: "
                  f"{reads}; gets balanced before the kill {balanced_before}, by the next leader {balanced(after)}")
            assert second > leader
            assert counts["stale"] == 0 and counts["miss"] == 0 and reads["miss"] == 0, (counts, reads)
            assert counts["fresh"] > 0 and counts["unsure"] == 0 and reads["found"] > 0
            assert installed(after) == len(KEYS) and balanced(after) > 0, after  # the new leader balances again
        finally:
            for process in controllers:
                if process.poll() is None:
                    process.terminate()
                    process.wait(timeout=30)
            for load in loads:
                if load.poll() is None:
                    load.kill()
        assert "Traceback" not in said(logs[1]), said(logs[1])[-3000:]
