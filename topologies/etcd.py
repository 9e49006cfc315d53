"""etcd for the testbed, the tests and the benchmarks: Debian's etcd-server, a cluster of members (three, as
production runs it; one where a test needs no more) on free loopback ports (or in a namespace of the testbed's
management LAN, at its address), each member's data in a temporary folder in memory (/dev/shm: a disk busy with other
tests stalls etcd's fsyncs past a 1 s lease), with a 250 ms election timeout (ELECTION_MS), and pre-vote on (a member
back from a partition does not depose etcd's raft leader by calling an election).

A member can be cut off (frozen with SIGSTOP: it holds its connections and answers nothing, as a member behind a
partition or a stalled disk does) and brought back, killed and started again on its data, or stopped for good; every
member is stopped by its PID. With `peer_cuts` (root, clang, bpftool, cgroup v2), a member can also be cut off from
its peers alone, its clients still answered, as behind a partition between etcd's machines: each member runs in a
cgroup of its own, and a cgroup eBPF program (etcd_peer_cut.bpf.c) attached to it drops every TCP segment to or from a
peer port. On loopback the peer ports are all a packet filter can tell the members apart by, and a member's own dials
to its peers leave from ports nobody chose: its cgroup names them. (No nftables or iptables here; SIGSTOP silences
the clients too.)"""
from __future__ import annotations

import base64
import json
import os
import secrets
import shutil
import signal
import ssl
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from dataplanes.bpf.program import compile_bpf, run_tool
from mbalancer.memcache.server import free_port
from mbalancer.processes import stop_process

START_TIMEOUT = 30.0
START_ATTEMPTS = 3  # a port taken between choosing it and etcd binding it: all members again, on other ports
# etcd's election timeout: a 1 s lease is honoured (etcd's minimum TTL is 1.5 of them), and etcd has a new raft leader
# before a 1 s lease held through the member that went is lost (experiments/benchmarks/bench_etcd_failover.py)
ELECTION_MS = 250
CGROUPS = Path("/sys/fs/cgroup/unified")  # cgroup v2, where a member's cgroup is made (peer_cuts)
BPFFS = Path("/sys/fs/bpf")
PEER_CUT = Path(__file__).with_name("etcd_peer_cut.bpf.c")


class EtcdError(RuntimeError):
    """etcd did not start, or a member did not come back; the message has the end of its log."""


def available() -> str | None:
    return None if shutil.which("etcd") else "etcd is missing (apt package etcd-server: make install)"


def peer_cuts_available() -> str | None:
    """None if a member can be cut off from its peers alone here (EtcdCluster(peer_cuts=True)), else why not."""
    if os.geteuid() != 0:
        return "cutting a member off its peers needs root (a cgroup and a cgroup eBPF program)"
    for tool in ("clang", "bpftool"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (install/apt-packages.txt)"
    if not (CGROUPS / "cgroup.procs").exists() or not BPFFS.is_dir():
        return f"no cgroup v2 at {CGROUPS} or no bpffs at {BPFFS}"
    return None


@dataclass
class Member:
    name: str
    url: str  # its client URL, what a controller's `etcd` lists
    peer: str
    data: Path
    log: Path
    process: subprocess.Popen | None = None
    frozen: bool = False
    cgroup: Path | None = None  # its own cgroup (peer_cuts)
    cut: Path | None = None  # the pinned program that cuts it off its peers, while attached


class EtcdCluster:
    """`members` etcd members, started together (a static bootstrap) and healthy once the constructor returns."""

    def __init__(self, folder: Path, host=None, tls: tuple[Path, Path, Path] | None = None, members: int = 3,
                 election_ms: int = ELECTION_MS, peer_cuts: bool = False):
        """host: a topologies.management.LanHost to run in, every member at its address (default: 127.0.0.1). tls:
        (ca, server, client) of tests/certificates.py: https, client certificates that CA signed required
        (--client-cert-auth), the client's used by the health check. election_ms: etcd's --election-timeout (its
        heartbeat a tenth of it). peer_cuts: each member in a cgroup of its own, for cut_peers (on loopback;
        peer_cuts_available() says whether it can be)."""
        self.folder, self.host, self.tls, self.size, self.election_ms = folder, host, tls, members, election_ms
        self.peer_cuts = peer_cuts
        self.token = ""
        self.context = None
        if tls:
            ca, _, me = tls
            self.context = ssl.create_default_context(cafile=f"{ca}.crt")
            self.context.load_cert_chain(f"{me}.crt", f"{me}.key")
        self.members: list[Member] = []
        for attempt in range(START_ATTEMPTS):
            self._start()
            if self._wait_healthy():
                return
            said = "\n".join(m.log.read_text()[-600:] for m in self.members)
            self.stop()
            if "address already in use" not in said or attempt == START_ATTEMPTS - 1:
                raise EtcdError(f"etcd did not start: {said}")

    @property
    def urls(self) -> list[str]:
        """Every member's client URL, in member order."""
        return [m.url for m in self.members]

    def _start(self) -> None:
        ip = self.host.ip if self.host is not None else "127.0.0.1"
        ports: list[int] = []
        while len(ports) < 2 * self.size:  # distinct: free_port may hand out a port it gave before
            if (port := free_port()) not in ports:
                ports.append(port)
        scheme = "https" if self.tls else "http"
        self.members = [Member(f"m{i}", f"{scheme}://{ip}:{ports[2 * i]}", f"http://{ip}:{ports[2 * i + 1]}",
                               Path(tempfile.mkdtemp(prefix="mbalancer-etcd-", dir="/dev/shm")),
                               self.folder / f"etcd-m{i}.log") for i in range(self.size)]
        self.token = f"mbalancer-test-{secrets.token_hex(4)}"  # no member of another test's cluster joins this one
        for member in self.members:
            if self.peer_cuts:
                member.cgroup = CGROUPS / f"{self.token}-{member.name}"
                member.cgroup.mkdir()
            member.process = self._popen(member)

    def _popen(self, member: Member) -> subprocess.Popen:
        inside = self.host.command() if self.host is not None else []
        if member.cgroup is not None:  # in its cgroup from the start: a socket belongs to the cgroup it was made in
            inside = ["sh", "-c", f'echo $$ > {member.cgroup}/cgroup.procs && exec "$@"', "etcd-in-cgroup"]
        secure = []
        if self.tls:
            ca, server, _ = self.tls
            secure = ["--client-cert-auth", "--trusted-ca-file", f"{ca}.crt", "--cert-file", f"{server}.crt",
                      "--key-file", f"{server}.key"]
        cluster = ",".join(f"{m.name}={m.peer}" for m in self.members)
        with open(member.log, "a") as log:  # a member started again logs on
            return subprocess.Popen(
                [*inside, "etcd", "--name", member.name, "--data-dir", str(member.data),
                 "--listen-client-urls", member.url, "--advertise-client-urls", member.url,
                 "--listen-peer-urls", member.peer, "--initial-advertise-peer-urls", member.peer,
                 "--initial-cluster", cluster, "--initial-cluster-token", self.token, "--initial-cluster-state", "new",
                 "--heartbeat-interval", str(self.election_ms // 10), "--election-timeout", str(self.election_ms),
                 "--pre-vote", *secure],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def _wait_healthy(self, members: list[Member] | None = None) -> bool:
        """Until every member (or those given) says it is healthy (it has a leader); False if one exited first."""
        deadline = time.monotonic() + START_TIMEOUT
        waiting = list(members or self.members)
        while waiting:
            if time.monotonic() > deadline or any(m.process.poll() is not None for m in waiting):
                return False
            waiting = [m for m in waiting if not self._healthy(m)]
            time.sleep(0.1)
        return True

    def _healthy(self, member: Member) -> bool:
        try:
            with urllib.request.urlopen(f"{member.url}/health", timeout=1, context=self.context) as reply:
                return b'"true"' in reply.read()
        except OSError:
            return False

    # --- faults --------------------------------------------------------------------------------------------
    def freeze(self, index: int) -> None:
        """Member `index` cut off: stopped with SIGSTOP, its sockets open and silent."""
        member = self.members[index]
        os.kill(member.process.pid, signal.SIGSTOP)
        member.frozen = True

    def thaw(self, index: int) -> None:
        """Member `index` back (SIGCONT), once it is healthy again."""
        member = self.members[index]
        os.kill(member.process.pid, signal.SIGCONT)
        member.frozen = False
        if not self._wait_healthy([member]):
            raise EtcdError(f"etcd member {member.name} did not come back: {member.log.read_text()[-1000:]}")

    def kill(self, index: int) -> None:
        """Member `index` gone (SIGKILL): its ports refuse, its data stays for restart."""
        member = self.members[index]
        if member.frozen:
            os.kill(member.process.pid, signal.SIGCONT)
            member.frozen = False
        member.process.kill()
        member.process.wait()

    def restart(self, index: int) -> None:
        """Member `index`, killed, started again on its data and ports, once it is healthy (it has a leader)."""
        member = self.members[index]
        member.process = self._popen(member)
        if not self._wait_healthy([member]):
            raise EtcdError(f"etcd member {member.name} did not come back: {member.log.read_text()[-1000:]}")

    def cut_peers(self, index: int) -> None:
        """Member `index` cut off from every peer, both ways (its raft traffic dropped), its clients still answered
        (peer_cuts)."""
        member = self.members[index]
        ports = ",".join(str(urllib.parse.urlsplit(m.peer).port) for m in self.members)
        built = compile_bpf(PEER_CUT, self.folder / f"etcd-peer-cut-{member.name}.o", "the etcd peer cut",
                            [f"PEERS={ports}"])
        member.cut = BPFFS / f"{self.token}-{member.name}"
        run_tool(["bpftool", "prog", "load", str(built), str(member.cut), "type", "cgroup/skb"], "loading the peer cut")
        for direction in ("ingress", "egress"):
            run_tool(["bpftool", "cgroup", "attach", str(member.cgroup), direction, "pinned", str(member.cut)],
                     f"attaching the peer cut ({direction})")

    def heal_peers(self, index: int) -> None:
        """Member `index`'s peers reach it again; returns once it is healthy (it has a leader)."""
        member = self.members[index]
        self._uncut(member)
        if not self._wait_healthy([member]):
            raise EtcdError(f"etcd member {member.name} did not rejoin: {member.log.read_text()[-1000:]}")

    @staticmethod
    def _uncut(member: Member) -> None:
        if member.cut is None:
            return
        for direction in ("ingress", "egress"):
            subprocess.run(["bpftool", "cgroup", "detach", str(member.cgroup), direction, "pinned", str(member.cut)],
                           capture_output=True)
        member.cut.unlink(missing_ok=True)
        member.cut = None

    def raft_leader(self) -> int:
        """Which member leads etcd's own raft group now (as the first answering member says)."""
        ids = {}
        leader = None
        for index, member in enumerate(self.members):
            if member.frozen or member.process.poll() is not None:
                continue
            status = self.call(index, "maintenance/status", {})
            ids[int(status["header"]["member_id"])] = index
            if member.cut is None and "leader" in status:  # a member cut off knows of no leader, or an old one
                leader = int(status["leader"])
        return ids[leader]

    def move_raft_leader(self, index: int) -> None:
        """etcd's raft leadership moved to member `index` (etcdctl move-leader), so that a fault hits it."""
        target = int(self.call(index, "maintenance/status", {})["header"]["member_id"])
        deadline = time.monotonic() + START_TIMEOUT
        while (leader := self.raft_leader()) != index:
            if time.monotonic() > deadline:
                raise EtcdError(f"etcd's raft leadership stayed with {self.members[leader].name}")
            try:
                self.call(leader, "maintenance/transfer-leadership", {"targetID": target})
            except OSError:
                time.sleep(0.1)  # a leadership changing already: ask the next leader

    def call(self, index: int, path: str, body: dict) -> dict:
        """One request to member `index`'s v3 HTTP API."""
        request = urllib.request.Request(f"{self.members[index].url}/v3/{path}", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=5, context=self.context) as reply:
            return json.loads(reply.read())

    def holders(self, key: str) -> list[tuple[int, int | None, str]]:
        """The key's holders in etcd's own history, oldest first: (the revision that created it, the revision from
        which it was gone or held by another, None while it holds it; its value), read revision by revision from an
        answering member (nothing is compacted). A value put over another's without a delete is a holder of its
        own, with the same creation revision."""
        index = next(i for i, m in enumerate(self.members) if not m.frozen and m.process.poll() is None)
        encoded = base64.b64encode(key.encode()).decode()
        now = int(self.call(index, "kv/range", {"key": encoded})["header"]["revision"])
        held: list[tuple[int, int | None, str]] = []
        for revision in range(1, now + 1):
            found = self.call(index, "kv/range", {"key": encoded, "revision": revision}).get("kvs", [])
            created = int(found[0]["create_revision"]) if found else None
            value = base64.b64decode(found[0].get("value", "")).decode(errors="replace") if found else ""
            if held and held[-1][1] is None and (created, value) != (held[-1][0], held[-1][2]):
                held[-1] = (held[-1][0], revision, held[-1][2])  # gone, or another's, from this revision
            if found and (not held or held[-1][1] is not None):
                held.append((created, None, value))
        return held

    def stop(self) -> None:
        for member in self.members:
            if member.process is not None:
                if member.frozen and member.process.poll() is None:
                    os.kill(member.process.pid, signal.SIGCONT)  # a stopped process takes no SIGTERM
                    member.frozen = False
                stop_process(member.process, grace=15)
            shutil.rmtree(member.data, ignore_errors=True)
            self._uncut(member)
            if member.cgroup is not None and member.cgroup.exists():
                member.cgroup.rmdir()  # empty now: its member exited

    def __enter__(self) -> "EtcdCluster":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


class EtcdServer(EtcdCluster):
    """One member: for tests about a controller and etcd, not about etcd's own failures."""

    def __init__(self, folder: Path, host=None, tls: tuple[Path, Path, Path] | None = None):
        super().__init__(folder, host, tls, members=1)

    @property
    def url(self) -> str:
        return self.members[0].url
