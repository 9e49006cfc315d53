"""etcd for the testbed, the tests and the benchmarks: Debian's etcd-server, a cluster of members (three, as
production runs it; one where a test needs no more) on free loopback ports (or in a namespace of the testbed's
management LAN, at its address), each member's data in a temporary folder in memory (/dev/shm: a disk busy with other
tests stalls etcd's fsyncs past a 1 s lease), with a 250 ms election timeout (ELECTION_MS), and pre-vote on (a member
back from a partition does not depose etcd's raft leader by calling an election).

A member can be cut off (frozen with SIGSTOP: it holds its connections and answers nothing, as a member behind a
partition or a stalled disk does) and brought back, or stopped for good; every member is stopped by its PID."""
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
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from mbalancer.memcache.server import free_port
from mbalancer.processes import stop_process

START_TIMEOUT = 30.0
START_ATTEMPTS = 3  # a port taken between choosing it and etcd binding it: all members again, on other ports
# etcd's election timeout: a 1 s lease is honoured (etcd's minimum TTL is 1.5 of them), and etcd has a new raft leader
# before a 1 s lease held through the member that went is lost (experiments/benchmarks/bench_etcd_failover.py)
ELECTION_MS = 250


class EtcdError(RuntimeError):
    """etcd did not start, or a member did not come back; the message has the end of its log."""


def available() -> str | None:
    return None if shutil.which("etcd") else "etcd is missing (apt package etcd-server: make install)"


@dataclass
class Member:
    name: str
    url: str  # its client URL, what a controller's `etcd` lists
    peer: str
    data: Path
    log: Path
    process: subprocess.Popen | None = None
    frozen: bool = False


class EtcdCluster:
    """`members` etcd members, started together (a static bootstrap) and healthy once the constructor returns."""

    def __init__(self, folder: Path, host=None, tls: tuple[Path, Path, Path] | None = None, members: int = 3,
                 election_ms: int = ELECTION_MS):
        """host: a topologies.management.LanHost to run in, every member at its address (default: 127.0.0.1). tls:
        (ca, server, client) of tests/certificates.py: https, client certificates that CA signed required
        (--client-cert-auth), the client's used by the health check. election_ms: etcd's --election-timeout (its
        heartbeat a tenth of it)."""
        self.folder, self.host, self.tls, self.size, self.election_ms = folder, host, tls, members, election_ms
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
        token = f"mbalancer-test-{secrets.token_hex(4)}"  # no member of another test's cluster joins this one
        for member in self.members:
            member.process = self._popen(member, token)

    def _popen(self, member: Member, token: str) -> subprocess.Popen:
        inside = self.host.command() if self.host is not None else []
        secure = []
        if self.tls:
            ca, server, _ = self.tls
            secure = ["--client-cert-auth", "--trusted-ca-file", f"{ca}.crt", "--cert-file", f"{server}.crt",
                      "--key-file", f"{server}.key"]
        cluster = ",".join(f"{m.name}={m.peer}" for m in self.members)
        with open(member.log, "w") as log:
            return subprocess.Popen(
                [*inside, "etcd", "--name", member.name, "--data-dir", str(member.data),
                 "--listen-client-urls", member.url, "--advertise-client-urls", member.url,
                 "--listen-peer-urls", member.peer, "--initial-advertise-peer-urls", member.peer,
                 "--initial-cluster", cluster, "--initial-cluster-token", token, "--initial-cluster-state", "new",
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

    def raft_leader(self) -> int:
        """Which member leads etcd's own raft group now (as the first answering member says)."""
        ids = {}
        leader = None
        for index, member in enumerate(self.members):
            if member.frozen or member.process.poll() is not None:
                continue
            status = self.call(index, "maintenance/status", {})
            ids[int(status["header"]["member_id"])] = index
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
