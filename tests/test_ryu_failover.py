"""Ryu apps failing over on Open vSwitch: real ryu-manager processes running the MBalancer app, each a candidate in a
real etcd's election (Debian's etcd-server on loopback), one private Open vSwitch (userspace datapath) connected to
every one of them, the key classifier on every link, memcached on the servers, clients writing and reading hot keys
the whole time, and `mbalancer monitor` pushing its reports to every ryu-manager (only the leader takes them).

The leader killed with SIGKILL, KILLS times (each started again as a candidate): another takes the master role and
balances again, each step's time printed (the killed one's owner lock freed: its election key deleted, no wait for
its lease). That one frozen (SIGSTOP, as a partition from etcd looks to the others): the next takes the master role
with a higher generation id once its lease ran out, and the frozen one, thawed, is refused by the switch
(OFPRRFC_STALE) and ends with status 1. No client read a value older than its last acknowledged write, found none,
or went without an answer. A switch claimed again and refilled REFILLS times under load loses no get either (its rule
set goes in as one atomic bundle). Before that, the switch's own refusal of a deposed leader, with election ids from
etcd: its flow-mods refused (OFPBRC_IS_SLAVE), its master role request too (OFPRRFC_STALE)."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from ryu.ofproto import ofproto_v1_5 as ofp

from controller.ryu_manager import launch
from dataplanes import registry
from dataplanes.driver import DriverError
from dataplanes.openflow import messages, tags
from mbalancer.config import config_toml, parse_config
from mbalancer.memcache.hashing import make_hash
from mbalancer.memcache.meta import MetaClient, StoredItem
from mbalancer.memcache.server import free_port
from mbalancer.processes import stop_process
from tests.conftest import MBALANCER, eventually, memcached_answers
from tests.etcd_server import EtcdServer, available
from tests.test_ebpf_network import hits
from tests.test_fabric_failover import LOAD  # the writing and the reading client

why_not = (registry.get("openflow").available() if os.geteuid() == 0 else "needs root (namespaces, bpf, OVS)") \
    or available()
pytestmark = pytest.mark.skipif(why_not is not None, reason=str(why_not))
TAG = "mbrf"
WAIT = 60.0  # seconds any one step may take at most (a busy two-CPU box)
KEYS = 4
PACE = 0.0002  # seconds each client waits between requests
SHARE_WINDOW = 2.0  # seconds of gets counted per server after a takeover
ACCEPTED = re.compile(r"master role accepted, generation id (\d+)")
STAMPED = """[loggers]
keys=root
[handlers]
keys=out
[formatters]
keys=stamped
[logger_root]
level=INFO
handlers=out
[handler_out]
class=StreamHandler
formatter=stamped
args=(sys.stderr,)
[formatter_stamped]
format=%(created).3f %(name)s %(message)s
"""  # ryu-manager's logging config: each line with its time, for the phases of a takeover
KILLS = 3  # takeovers after kill -9 per run (the killed one started again as a candidate, as systemd would)
PHASES = (("key deleted", "its election key deleted"), ("elected", "elected through etcd"), ("master", "master role accepted"), ("rules", "hot keys installed"),
          ("leading", "leading with election id"))  # a takeover's steps, as the new leader logs them
REFUSED = re.compile(r"refused this controller \(generation id (\d+)\): .*OFPRRFC_STALE")


# Sent from a client's namespace: a memcached get to the server at argv[1] in a frame whose destination MAC is a GET
# tag of a slot the switch has no rule for (argv[2]); prints the reply, or "none" after a second.
TAGGED_GET = r"""
import socket, struct, sys
server, tag = sys.argv[1], bytes.fromhex(sys.argv[2].replace(":", ""))
reply = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
reply.bind(("0.0.0.0", 0))
reply.connect((server, 11211))
reply.settimeout(1.0)
me, port = reply.getsockname()
payload = struct.pack("!HHHH", 7, 0, 1, 0) + b"get rf:tagged\r\n"
udp = struct.pack("!HHHH", port, 11211, 8 + len(payload), 0) + payload
ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 1, 0, 64, 17, 0, socket.inet_aton(me), socket.inet_aton(server))
words = sum(struct.unpack("!10H", ip))
while words >> 16:
    words = (words & 0xffff) + (words >> 16)
ip = ip[:10] + struct.pack("!H", ~words & 0xffff) + ip[12:]
raw = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
raw.bind(("eth0", 0))
mine = bytes.fromhex(open("/sys/class/net/eth0/address").read().strip().replace(":", ""))
raw.send(tag + mine + b"\x08\x00" + ip + udp)
try:
    print(reply.recv(2048)[8:])
except socket.timeout:
    print("none")
"""


def test_the_switch_refuses_a_deposed_leaders_flow_mods_and_role_request(tmp_path):
    """Two controllers on one bridge, each with the election id etcd gave it: once the second takes the master role,
    the switch refuses the first's flow-mod and its master request with its (older) generation id."""
    from controller.election import Election
    from dataplanes.openflow.bridge_connection import BridgeConnection
    from dataplanes.openflow.ovs import OpenVSwitch
    from topologies.claim import Made, NetworkClaim

    def flow_mod(link: BridgeConnection) -> None:
        link.send(link.dp, [messages.flow(link.dp, 0, 7, link.dp.ofproto_parser.OFPMatch(in_port=5), [])])

    def master(link: BridgeConnection, generation: int) -> None:
        link.send(link.dp, [messages.role_request(link.dp, ofp.OFPCR_ROLE_MASTER, generation)])

    stop = threading.Event()
    # the machine's one network at a time: a second Open vSwitch's netdev datapath cannot start beside another's
    with NetworkClaim("ryu failover roles") as claim, EtcdServer(tmp_path) as etcd:
        claim.record(Made(switches=[f"{TAG}x"]))
        with OpenVSwitch(f"{TAG}x") as ovs:
            ovs.add_bridge(f"{TAG}x-of", [], "tcp:127.0.0.1:9")  # no controller there: these two connect themselves
            first, second = (Election((etcd.url,), "/test/ryu", 1, name) for name in ("first", "second"))
            links = [BridgeConnection(f"unix:{ovs.rundir}/{TAG}x-of.mgmt") for _ in range(2)]
            try:
                for link in links:
                    link.start(lambda dp: None, lambda frame: None)
                old = first.campaign(stop)
                master(links[0], old)
                flow_mod(links[0])  # the master writes
                first.resign()
                new = second.campaign(stop)
                assert new > old  # etcd's revisions only grow
                master(links[1], new)
                with pytest.raises(DriverError, match="type 1 code 10"):  # OFPET_BAD_REQUEST, OFPBRC_IS_SLAVE
                    flow_mod(links[0])
                with pytest.raises(DriverError, match="type 11 code 0"):  # OFPET_ROLE_REQUEST_FAILED, OFPRRFC_STALE
                    master(links[0], old)
                flow_mod(links[1])  # the new master writes
            finally:
                stop.set()
                second.resign()
                for link in links:
                    link.close()


def test_a_candidate_deletes_the_leader_key_only_while_it_names_the_given_leader(tmp_path):
    """Election.depose on a real etcd: the key of a leader that ended goes (a compare on its value), another's stays."""
    from controller.election import Election
    stop = threading.Event()
    with EtcdServer(tmp_path) as etcd:
        first, second = (Election((etcd.url,), "/test/depose", 5, name) for name in ("first", "second"))
        try:
            assert first.campaign(stop) is not None
            assert not second.depose("someone else") and second.leader() == "first"
            assert second.depose("first") and second.leader() is None  # not after its 5 s lease: now
            assert second.campaign(stop) is not None and second.leader() == "second"
        finally:
            stop.set()
            first.resign()
            second.resign()


@dataclass
class RyuManager:
    """One ryu-manager of the group: its config (its own OpenFlow and HTTP ports), its process and log."""
    name: str
    config: Path
    http: str
    openflow: int
    log: Path
    process: subprocess.Popen | None = None

    def start(self) -> None:
        stamped = self.log.with_name("logging.conf")
        stamped.write_text(STAMPED)
        with open(self.log, "w") as out:  # a ryu-manager started again: what it says in this life only
            self.process = launch(self.config, out, log_config=stamped)

    def when(self, pattern: str, after: float) -> float | None:
        """The time (time.time()) of the first line saying `pattern` logged after `after`."""
        for line in self.said().splitlines():
            stamp, _, text = line.partition(" ")
            try:
                at = float(stamp)
            except ValueError:
                continue
            if at >= after and re.search(pattern, text):
                return at
        return None

    def said(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def wait_for(self, pattern: str | re.Pattern) -> re.Match:
        deadline = time.monotonic() + WAIT
        while (found := re.search(pattern, self.said())) is None:
            assert time.monotonic() < deadline and self.process.poll() is None, self.said()[-3000:]
            time.sleep(0.02)
        return found

    def leads(self) -> bool:
        return "leading with election id" in self.said()

    def state(self) -> dict:
        import urllib.request
        with urllib.request.urlopen(f"http://{self.http}/state", timeout=5) as reply:
            return json.load(reply)


def servers(net) -> list[dict]:
    return [{"name": h.name, "ip": h.ip, "mac": h.mac} for h in net.server_hosts]


def ryu_config(net, folder: Path, name: str, etcd: EtcdServer, ttl: int = 1) -> RyuManager:
    """ttl: its election_ttl (seconds)."""
    http, openflow = f"127.0.0.1:{free_port()}", free_port()
    config = parse_config({
        "servers": servers(net),
        "balancing": {"hot": KEYS, "hysteresis": 1, "mode": "equal"},
        "controller": {"listen": http, "etcd": [etcd.url], "election_ttl": ttl, "election_key": "/test/ryu-group"},
        "dataplane": {"kind": "openflow", "openflow": {"classifier": TAG, "listen": f"127.0.0.1:{openflow}"}}})
    path = folder / f"{name}.toml"
    path.write_text(config_toml(config))
    return RyuManager(name, path, http, openflow, folder / f"{name}.log")


def leader_among(group: list[RyuManager]) -> RyuManager:
    deadline = time.monotonic() + WAIT
    while not (leading := [r for r in group if r.leads()]):
        assert time.monotonic() < deadline, [r.said()[-1500:] for r in group]
        time.sleep(0.02)
    assert len(leading) == 1, [r.name for r in leading]
    return leading[0]


def balancing(ryu: RyuManager) -> dict:
    """The leader's state once every key is installed and the switch has balanced gets."""
    ryu.wait_for("leading with election id")  # (until then its API answers 503)
    deadline = time.monotonic() + WAIT
    while True:
        now = ryu.state()
        keys = now["counters"]["data_plane"].get("keys", {})
        if (len([k for k in now["hot_keys"] if k["state"] != "not-installed"]) == KEYS
                and sum(n for k in keys.values() for n in k["per_replica"].values()) > 0):
            return now
        assert time.monotonic() < deadline, (now["hot_keys"], now["counters"])
        time.sleep(0.1)


def served(net, seconds: float) -> list[int]:
    """Gets each server answered over the next `seconds` (every key is homed on the first: the second's are
    balanced gets)."""
    before = hits(net)
    time.sleep(seconds)
    return [a - b for a, b in zip(hits(net), before)]


REFILLS = 10  # times the leader claims the switch again and refills its tables, under load (with the rule set written
# as separate messages, 20 refills lost 5 gets and dropped 4 packets for want of a rule: ten catch it most times)
REFILLED = "hot keys installed"  # the driver's line for a switch given every rule again
BACKOFF = 2.1  # seconds connected: longer than OVS's backoff (1 s, counted in whole seconds) resets it to 1 s
MAX_BACKOFF = 8.0  # OVS's backoff at most (seconds): where it got to while ryu-manager was starting


def start_load(net, folder: Path, modes: tuple[str, ...], keys: list[bytes]) -> tuple[list[subprocess.Popen], Path]:
    """A client per mode ("writes": a set of each key, then 30 gets; "reads": gets only) on the client hosts, each
    until `stop` (the returned path) exists; every key is homed on the first server."""
    (folder / "load.py").write_text(LOAD)
    stop = folder / "stop"
    pairs = [f"{net.server_hosts[0].ip}={k.decode()}" for k in keys]
    return [net.popen(host, [sys.executable, str(folder / "load.py"), mode, str(stop), str(PACE), *pairs],
                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for host, mode in zip(net.client_hosts, modes)], stop


def load_counts(loads: list[subprocess.Popen], stop: Path) -> list[dict]:
    stop.touch()
    return [json.loads(load.communicate(timeout=WAIT)[0].strip().splitlines()[-1]) for load in loads]


def start_monitor(net, folder: Path, plain, group: list[RyuManager]) -> None:
    """`mbalancer monitor` on the clients' ports, pushing its reports to every ryu-manager (the leader takes them)."""
    monitor = folder / "monitor.toml"
    monitor.write_text(config_toml(plain))
    pushes = [arg for r in group for arg in ("--push", f"http://{r.http}/report")]
    net.processes.append(subprocess.Popen(
        [str(MBALANCER), "monitor", "--iface", ",".join(h.port for h in net.client_hosts), "--json",
         "--interval", "0.5", "--top", str(KEYS), "--port", "11211", "--config", str(monitor), *pushes],
        stdout=subprocess.DEVNULL, stderr=(folder / "monitor.log").open("w")))


def stop_all(group: list[RyuManager], loads: list[subprocess.Popen]) -> None:
    """Every ryu-manager and client stopped; no ryu-manager said a traceback."""
    for ryu in group:
        if ryu.process is not None:
            stop_process(ryu.process, grace=30)
    for load in loads:
        if load.poll() is None:
            load.kill()
            load.wait()
    for ryu in group:
        assert "Traceback" not in ryu.said(), ryu.said()[-3000:]


def home_keys(plain) -> list[bytes]:
    """KEYS keys whose home is the first server."""
    key_hash = make_hash(plain.balancing.hash, [s.address for s in plain.servers])
    return [k for k in (b"rf:%d" % i for i in range(200)) if key_hash.server_of(k) == 0][:KEYS]


def pipeline_drops(ovs) -> int:
    """Packets ovs-vswitchd's pipeline dropped so far for want of a rule (its coverage counter)."""
    said = subprocess.run(["ovs-appctl", "-t", "ovs-vswitchd", "coverage/read-counter", "drop_action_of_pipeline"],
                          env=ovs.env, check=True, capture_output=True, text=True, timeout=WAIT).stdout
    return int(said.strip())


def reconnect(ovs, bridge: str) -> None:
    """The bridge drops its controller connections and dials them again (not del-controller and set-controller:
    a bridge left with no controller flushes its flows, as does one that gets its first)."""
    subprocess.run(["ovs-appctl", "-t", "ovs-vswitchd", "bridge/reconnect", bridge], env=ovs.env, check=True,
                   capture_output=True, timeout=WAIT)


def test_the_leader_refills_a_switch_it_claims_again_under_load_and_no_get_is_lost(tmp_path):
    """A switch that connects again is claimed by the leader and given every rule anew: its tables emptied and filled
    again, as by a new leader at a takeover. Done REFILLS times while a client reads clean hot keys (each balanced
    get carries a tag of its own, so the switch looks each one up in its tables): no get goes unanswered."""
    from topologies.netns import NamespaceNetwork
    with NamespaceNetwork(servers=2, clients=1, tag=TAG, dataplane="openflow") as net, EtcdServer(tmp_path) as etcd:
        for host in net.server_hosts:
            net.popen(host, ["memcached", "-l", host.ip, "-p", "11211", "-U", "11211", "-u", "root", "-t", "1"])
        ryu = ryu_config(net, tmp_path, "ryu1", etcd, ttl=5)  # alone: no lease of 1 s to lose on a busy machine
        plain = parse_config({"servers": servers(net)})
        ovs, bridge = net.switch.ovs, net.switch.bridge
        target = f"tcp:127.0.0.1:{ryu.openflow}"
        ovs.vsctl("set-controller", bridge, target)
        keys = home_keys(plain)
        loads: list[subprocess.Popen] = []
        try:
            ryu.start()
            ryu.wait_for(REFILLED)
            connected = time.monotonic()
            for host in net.server_hosts:
                assert eventually(lambda: memcached_answers(host.ip), timeout=10)
            for key in keys:
                MetaClient(plain.servers[0].address).set(key, StoredItem(b"v0", 0, -1, 0))
            start_monitor(net, tmp_path, plain, [ryu])
            loads, stop = start_load(net, tmp_path, ("reads",), keys)
            balancing(ryu)
            before = served(net, 0.5)
            time.sleep(max(0.0, connected + MAX_BACKOFF + 1 - time.monotonic()))  # its backoff back to 1 s
            dropped = pipeline_drops(ovs)
            for _ in range(REFILLS):
                refills = ryu.said().count(REFILLED)
                reconnect(ovs, bridge)
                deadline = time.monotonic() + WAIT
                while ryu.said().count(REFILLED) == refills:
                    assert time.monotonic() < deadline and ryu.process.poll() is None, ryu.said()[-3000:]
                    time.sleep(0.01)
                time.sleep(BACKOFF)  # connected that long, the bridge dials again after 1 s, not twice as long
            dropped = pipeline_drops(ovs) - dropped
            after = served(net, 0.5)
            [reads] = load_counts(loads, stop)
            print(f"{REFILLS} refills under load: the reading client {reads}; packets the switch found no rule for: "
                  f"{dropped}; gets served per server in 0.5 s before {before}, after {after}")
            assert dropped == 0  # no packet met the tables emptied
            assert reads["unanswered"] == 0 and reads["miss"] == 0 and reads["found"] > 0, reads
            assert before[1] > 0 and after[1] > 0, (before, after)  # balanced gets, each looked up by the switch
        finally:
            stop_all([ryu], loads)


def generation_of(ryu: RyuManager) -> int:
    """The generation id of the master role it was last accepted in."""
    return int(ACCEPTED.findall(ryu.said())[-1])


def master_after(generation: int, group: list[RyuManager]) -> RyuManager:
    """The one of `group` accepted as master with a generation id above `generation`."""
    deadline = time.monotonic() + WAIT
    while not (found := [r for r in group if ACCEPTED.search(r.said()) and generation_of(r) > generation]):
        assert time.monotonic() < deadline, [r.said()[-1500:] for r in group]
        time.sleep(0.02)
    return found[0]


def took_over(since: float, leader: RyuManager, group: list[RyuManager]) -> RyuManager:
    """The candidate that leads after `leader` was killed at `since` (time.time()), once it balances; each step of
    its takeover printed, in seconds after the kill (a speed figure, not asserted)."""
    new = leader_among([r for r in group if r is not leader])
    balancing(new)
    balanced = time.time() - since
    steps = {name: new.when(pattern, since) for name, pattern in PHASES}
    print(f"kill -9 of {leader.name}: {new.name} took over; seconds after the kill: " +
          ", ".join(f"{name} {at - since:.3f}" for name, at in steps.items() if at is not None) +
          f", balancing (seen in its /state) {balanced:.3f}")
    return new


def test_ryu_managers_fail_over_under_load_and_the_switch_refuses_the_deposed_one(tmp_path):
    """KILLS times the leader killed with SIGKILL (and started again as a candidate): another takes the master role
    and balances again. Then the leader frozen: the next takes over, and the frozen one, thawed, is refused by the
    switch and exits 1. No client read a value older than its last acknowledged write, found none, or went without
    an answer (its 0.5 s timeout): a set or get unanswered is one missed."""
    from topologies.netns import NamespaceNetwork
    with NamespaceNetwork(servers=2, clients=2, tag=TAG, dataplane="openflow") as net, EtcdServer(tmp_path) as etcd:
        for host in net.server_hosts:
            net.popen(host, ["memcached", "-l", host.ip, "-p", "11211", "-U", "11211", "-u", "root", "-t", "1"])
        group = [ryu_config(net, tmp_path, f"ryu{i}", etcd) for i in (1, 2, 3)]
        plain = parse_config({"servers": servers(net)})  # the monitor's config: the servers
        ovs, bridge = net.switch.ovs, net.switch.bridge
        ovs.vsctl("set-controller", bridge, *(f"tcp:127.0.0.1:{r.openflow}" for r in group))  # every candidate
        for uuid in ovs.vsctl("--bare", "--columns=_uuid", "list", "controller").split():
            ovs.vsctl("set", "controller", uuid, "max_backoff=1000")  # a candidate started later is dialled soon
        keys = home_keys(plain)
        home = net.server_hosts[0]
        loads: list[subprocess.Popen] = []
        try:
            group[0].start()
            first = int(group[0].wait_for(ACCEPTED).group(1))
            group[0].wait_for("hot keys installed")  # driven: the pipeline on the switch
            # a get tagged for a slot with no rule (a datapath cache older than the slot's flow) still goes home
            for host in net.server_hosts:
                assert eventually(lambda: memcached_answers(host.ip), timeout=10)
            MetaClient(plain.servers[1].address).set(b"rf:tagged", StoredItem(b"here", 0, -1, 0))
            sent = net.run(net.client_hosts[0], [sys.executable, "-c", TAGGED_GET, net.server_hosts[1].ip,
                                                 tags.tag(tags.GET, 99, 5)])
            assert "here" in sent.stdout, (sent.stdout, sent.stderr)
            for ryu in group[1:]:
                ryu.start()
                ryu.wait_for(r"slave \(generation id \d+\) while a candidate")
            assert eventually(lambda: memcached_answers(home.ip), timeout=10)
            for key in keys:
                MetaClient(plain.servers[0].address).set(key, StoredItem(b"v0", 0, -1, 0))
            start_monitor(net, tmp_path, plain, group)
            loads, stop = start_load(net, tmp_path, ("writes", "reads"), keys)
            balancing(group[0])
            before = served(net, SHARE_WINDOW)

            # 1. the leader killed, KILLS times: another takes the master role and balances
            leader, generation = group[0], first
            for _ in range(KILLS):
                since = time.time()
                os.kill(leader.process.pid, signal.SIGKILL)
                leader.process.wait(timeout=WAIT)
                new = took_over(since, leader, group)
                newer = generation_of(new)
                assert newer > generation, (newer, generation)
                after = served(net, SHARE_WINDOW)
                print(f"  generation id {generation} -> {newer}; gets served per server in {SHARE_WINDOW:g} s before "
                      f"the first kill {before}, after this one {after}")
                assert after[1] > 0.2 * sum(after), after  # the replica serves its share of the home's keys again
                leader.start()  # as systemd would: a candidate again
                leader.wait_for(r"slave \(generation id \d+\) while a candidate")
                leader, generation = new, newer

            # 2. that one frozen: the next takes the master role; thawed, the switch refuses it
            second, others = leader, [r for r in group if r is not leader]
            frozen = time.time()
            os.kill(second.process.pid, signal.SIGSTOP)
            try:
                third = master_after(generation, others)
                master = third.when(ACCEPTED.pattern, frozen)
            finally:
                os.kill(second.process.pid, signal.SIGCONT)
            refused = int(second.wait_for(REFUSED).group(1))
            assert second.process.wait(timeout=WAIT) == 1, second.said()[-3000:]
            newest = generation_of(third)
            assert newest > generation == refused, (newest, generation, refused)
            balancing(third)
            last = served(net, SHARE_WINDOW)
            print(f"{second.name} frozen and thawed: {third.name} master with generation id {newest} "
                  f"{master - frozen:.3f} s after the freeze (its lease ran out), {second.name} "
                  f"refused by the switch with {refused}; gets served per server in {SHARE_WINDOW:g} s after: {last}")
            assert last[1] > 0.2 * sum(last), last

            counts, reads = load_counts(loads, stop)
            print(f"the writing client: {counts}; the reading one: {reads}")
            assert counts["stale"] == 0 and counts["miss"] == 0 and reads["miss"] == 0, (counts, reads)
            assert counts["unanswered"] == 0 and reads["unanswered"] == 0, (counts, reads)  # no get timed out
            assert counts["set_retries"] == 0 and counts["set_unanswered"] == 0, counts  # nor a set
            assert counts["fresh"] > 0 and counts["unsure"] == 0 and reads["found"] > 0, (counts, reads)
            assert third.leads() and "Traceback" not in third.said()
        finally:
            stop_all(group, loads)
