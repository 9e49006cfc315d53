"""The controllers' election (controller/election.py) when etcd itself fails worse than one member: a three-member
etcd loses its quorum (two members frozen or killed), and a member is cut off from its peers while its clients still
reach it (a partition inside etcd). Real etcd members on loopback (topologies/etcd.py); the candidates are Elections
in this process, each giving every member's endpoint (its own member first), so that their typed role changes are on
one clock.

What must hold, read from etcd's history of the election key and from the candidates' own role changes:
- quorum lost: the leader cannot renew; it stops leading before its lease could run out in etcd (the TTL counted from
  the sending of its last renewal that got through), so no other can be elected while it leads; the candidates wait
  (no crash, a bounded number of requests); once the quorum is back exactly one of them is elected;
- a member cut off from its peers: a leader that talks to it turns to another member or stops, and nobody leads
  through it; one leader throughout.
The times (to stop, to elect again) are printed, not asserted: they depend on the machine."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from controller.election import POLL, Election, Role
from mbalancer.memcache.server import MemcachedServer
from tests.conftest import MBALANCER
from tests.etcd_server import EtcdCluster, available
from tests.switch_agent import AgentProcess, hello
from tests.test_election import controller_config, identity_pid
from topologies.etcd import peer_cuts_available

pytestmark = pytest.mark.skipif(available() is not None, reason=str(available()))
TTL = 1  # the controllers' default election_ttl
WAIT = 20.0  # seconds any one change may take at most (about 1-2 s here)
OUTAGE = 3.0  # seconds etcd stays without its quorum: three TTLs, time enough for a lease to run out


@dataclass
class Candidates:
    """Candidates a, b, c on one cluster, a leading; b and c campaigning in threads."""
    etcd: EtcdCluster
    key: str
    elections: dict[str, Election]
    stop: threading.Event
    threads: list[threading.Thread]

    def end(self) -> None:
        self.stop.set()
        for election in self.elections.values():
            election.resign()
        for thread in self.threads:
            thread.join(WAIT)


def candidates(etcd: EtcdCluster, key: str, first: dict[str, int]) -> Candidates:
    """a elected, then b and c campaigning; first: the member each asks first."""
    urls = etcd.urls
    elections = {name: Election(tuple(urls[first[name]:] + urls[:first[name]]), key, TTL, name) for name in "abc"}
    stop = threading.Event()
    assert elections["a"].campaign(stop) is not None
    threads = [threading.Thread(target=lambda: elections["a"].lost.wait() and elections["a"].resign(), daemon=True)]
    threads += [threading.Thread(target=elections[name].campaign, args=(stop,), daemon=True) for name in "bc"]
    for thread in threads:
        thread.start()
    until(lambda: all(elections[name].role == Role.CANDIDATE and elections[name].requests > 3 for name in "bc"))
    return Candidates(etcd, key, elections, stop, threads)


def until(condition, wait: float = WAIT) -> float:
    """The monotonic time `condition()` was first seen true (polled every 10 ms); fails after `wait` s."""
    deadline = time.monotonic() + wait
    while not condition():
        assert time.monotonic() < deadline, f"nothing happened in {wait:g} s"
        time.sleep(0.01)
    return time.monotonic()


def leading(elections: dict[str, Election]) -> list[tuple[float, float, str, int]]:
    """Every span of a lead from the candidates' own role changes, oldest first: (elected at, stopped leading at or
    inf, who, election id)."""
    spans = []
    for name, election in elections.items():
        events = list(election.events)
        for i, change in enumerate(events):
            if change.role == Role.LEADER:
                ended = next((e.at for e in events[i + 1:] if e.role != Role.LEADER), float("inf"))
                spans.append((change.at, ended, name, change.election_id))
    return sorted(spans)


def assert_one_leader_at_a_time(spans: list[tuple[float, float, str, int]]) -> None:
    for (_, ended, who, _), (began, _, next_who, _) in zip(spans, spans[1:]):
        assert ended < began, f"{who} still led when {next_who} was elected: {spans}"


def assert_one_holder_at_a_time(etcd: EtcdCluster, key: str, spans: list[tuple[float, float, str, int]]) -> None:
    """etcd's history of the key: one holder at a time, each the candidate that says it was elected with that
    revision."""
    held = etcd.holders(key)
    for (_, gone, _), (created, _, _) in zip(held, held[1:]):
        assert gone is not None and gone <= created, held
    assert [(created, who) for created, _, who in held] == [(id_, who) for _, _, who, id_ in spans], (held, spans)


# --- quorum lost ------------------------------------------------------------------------------------------------
def lose_quorum(etcd: EtcdCluster, members: list[int], how: str) -> None:
    for index in members:
        etcd.freeze(index) if how == "frozen" else etcd.kill(index)


def regain_quorum(etcd: EtcdCluster, members: list[int], how: str) -> None:
    for index in members:
        etcd.thaw(index) if how == "frozen" else etcd.restart(index)


@pytest.mark.parametrize("how", ["frozen", "killed"])
@pytest.mark.parametrize("survivor", ["the leader's member", "another member"])
def test_without_a_quorum_the_leader_stops_before_its_lease_can_run_out_and_one_leader_follows(tmp_path, how,
                                                                                                survivor):
    """Two of three members go (frozen: silent; killed: refusing), one stays: the member a talks to, or another. a
    stops leading within a TTL of its last renewal that got through (before etcd could let its lease run out); b and
    c wait as candidates, with a bounded number of requests; with the quorum back, one of them is elected, once."""
    with EtcdCluster(tmp_path) as etcd:
        run = candidates(etcd, "/test/quorum", {"a": 0, "b": 1, "c": 2})
        a = run.elections["a"]
        try:
            stays = 0 if survivor == "the leader's member" else 1
            gone = [i for i in range(3) if i != stays]
            asked = {name: e.requests for name, e in run.elections.items()}
            lost_at = time.monotonic()
            lose_quorum(etcd, gone, how)
            assert a.lost.wait(OUTAGE), "a still leads without a quorum"
            stopped = next(e for e in a.events if e.role == Role.LOST)
            print(f"{how}, {survivor} stays: a stopped leading {stopped.at - lost_at:.2f} s after the quorum went, "
                  f"{stopped.at - a.renewed:.2f} s after sending its last renewal that got through ({stopped.why})")
            assert stopped.at < a.renewed + TTL, "a led on past the time etcd could let its lease run out"
            time.sleep(max(0.0, lost_at + OUTAGE - time.monotonic()))
            outage = time.monotonic() - lost_at
            for name in "bc":
                candidate = run.elections[name]
                sent = candidate.requests - asked[name]
                assert candidate.role == Role.CANDIDATE and run.threads["abc".index(name)].is_alive(), candidate.events
                assert sent <= 3 * (outage / POLL + 1), f"{name} sent {sent} requests in {outage:.1f} s: it spins"
            back_at = time.monotonic()
            regain_quorum(etcd, gone, how)
            healthy_at = time.monotonic()
            elected = until(lambda: any(run.elections[n].role == Role.LEADER for n in "bc"))
            print(f"{how}: one leader again {elected - back_at:.2f} s after the members were let back "
                  f"({elected - healthy_at:.2f} s after they were healthy)")
            time.sleep(2 * TTL)  # and nobody else is elected meanwhile
            spans = leading(run.elections)
        finally:
            run.end()
        assert [who for _, _, who, _ in spans][0] == "a" and len(spans) == 2, spans
        assert_one_leader_at_a_time(spans)
        assert_one_holder_at_a_time(etcd, run.key, spans)

