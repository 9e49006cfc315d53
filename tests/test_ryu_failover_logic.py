"""The Ryu app's failover logic (controller/ryu_failover.py) against a recorded switch that keeps roles as Open vSwitch
does (one generation id per switch, the highest seen; a new master makes the old one a slave): faucet's way, no Ryu
connection, no etcd (an election that answers at once), the real owner lock in a folder of the test's.
tests/test_ryu_failover.py runs the same logic in real ryu-managers on real Open vSwitch."""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from ryu.ofproto import ofproto_v1_5 as ofp

from controller.ryu_failover import Failover, RoleRefused, Standing, identity
from mbalancer.ownership import STANDBY_POLL, Ownership


class Roles:
    """One switch's roles, as OVS keeps them (ofproto.c: handle_role_request, connmgr.c: ofconn_set_role)."""

    def __init__(self):
        self.generation: int | None = None
        self.roles: dict[str, int] = {}
        self.told: list[tuple[str, int]] = []  # ROLE_STATUS sent: (controller, its new role)

    def request(self, who: str, role: int, generation: int) -> tuple[int, int]:
        if role in (ofp.OFPCR_ROLE_MASTER, ofp.OFPCR_ROLE_SLAVE):
            if self.generation is not None and generation - self.generation < 0:
                raise RoleRefused("switch 0000000000000001 refused a role request: type 11 code 0")
            self.generation = generation
        if role == ofp.OFPCR_ROLE_MASTER:
            for other, held in self.roles.items():
                if other != who and held == ofp.OFPCR_ROLE_MASTER:
                    self.roles[other] = ofp.OFPCR_ROLE_SLAVE
                    self.told.append((other, ofp.OFPCR_ROLE_SLAVE))
        if role != ofp.OFPCR_ROLE_NOCHANGE:
            self.roles[who] = role
        return self.roles.get(who, ofp.OFPCR_ROLE_EQUAL), self.generation or 0


class Connection:
    """One controller's connection to the switch (the Switches of controller/ryu_failover.py)."""
    dp = type("Datapath", (), {"id": 1})()

    def __init__(self, who: str, roles: Roles):
        self.who, self.roles = who, roles
        self.driven = False
        self.asked: list[tuple[int, int]] = []

    def connected(self) -> list:
        return [self.dp]

    def ask_role(self, dp, role: int, generation: int) -> tuple[int, int]:
        self.asked.append((role, generation))
        return self.roles.request(self.who, role, generation)

    def drive(self, dp) -> None:
        assert self.roles.roles[self.who] == ofp.OFPCR_ROLE_MASTER  # driven only as the master
        self.driven = True


class Election:
    """Elected at once with `election_id` (None: never), lost when told; its key names `holder` (None: no leader)
    until deposed."""

    def __init__(self, election_id: int | None):
        self.election_id = election_id
        self.lost = threading.Event()
        self.why_lost = ""
        self.holder: str | None = None
        self.deposed: list[str] = []

    def leader(self) -> str | None:
        return self.holder

    def depose(self, leader: str) -> bool:
        if leader != self.holder:
            return False
        self.deposed.append(leader)
        self.holder = None
        return True

    def campaign(self, stop: threading.Event) -> int | None:
        if self.election_id is None:
            stop.wait()
        return self.election_id


def candidate(who: str, roles: Roles, election_id: int | None, owners: Path):
    link = Connection(who, roles)
    ended: list[int] = []
    started: list[bool] = []
    failover = Failover(Election(election_id), Ownership(["switch"], who, owners), link,
                        lambda: started.append(True), ended.append)
    return failover, link, started, ended


def lead(failover: Failover) -> tuple[threading.Thread, threading.Event]:
    stop = threading.Event()
    thread = threading.Thread(target=failover.run, args=(stop,), daemon=True)
    thread.start()
    return thread, stop


def wait(check, seconds: float = 5.0) -> bool:
    stop = threading.Event()
    for _ in range(int(seconds / 0.01)):
        if check():
            return True
        stop.wait(0.01)
    return check()


def test_a_candidate_is_a_slave_with_the_switchs_generation_id_and_never_drives(tmp_path):
    roles = Roles()
    first, first_link, _, _ = candidate("first", roles, 5, tmp_path)
    thread, stop = lead(first)
    assert wait(lambda: first.leading)
    waiting, link, started, _ = candidate("second", roles, None, tmp_path)
    waiting.connected(link.dp)
    assert link.asked == [(ofp.OFPCR_ROLE_NOCHANGE, 0), (ofp.OFPCR_ROLE_SLAVE, 5)]
    assert roles.roles == {"first": ofp.OFPCR_ROLE_MASTER, "second": ofp.OFPCR_ROLE_SLAVE}
    assert not link.driven and not started and waiting.standing is Standing.CANDIDATE
    stop.set()
    thread.join(5)


def test_the_next_leader_is_master_before_it_drives_and_the_deposed_one_is_refused_and_ends(tmp_path):
    roles = Roles()
    old, old_link, old_started, old_ended = candidate("old", roles, 5, tmp_path)
    old_thread, old_stop = lead(old)
    assert wait(lambda: old.leading) and old_link.driven and old_started
    new, new_link, new_started, new_ended = candidate("new", roles, 9, tmp_path)
    new_thread, new_stop = lead(new)
    # the switch made the new one master (old: slave, told so), which waits for the old one's lock
    assert wait(lambda: roles.roles == {"old": ofp.OFPCR_ROLE_SLAVE, "new": ofp.OFPCR_ROLE_MASTER})
    assert new_link.driven and not new_started and roles.told == [("old", ofp.OFPCR_ROLE_SLAVE)]
    old.demoted(old_link.dp, ofp.OFPCR_ROLE_SLAVE, 9)  # the ROLE_STATUS, as the Ryu app hands it on
    assert old.standing is Standing.DEPOSED and old_ended == [1]
    assert old.lets_lease_run and new.lets_lease_run is False  # the deposed one leaves the lease to its successor
    assert old_link.asked[-1] == (ofp.OFPCR_ROLE_SLAVE, 5)  # stepping down: refused, a higher id is master
    assert roles.roles["new"] == ofp.OFPCR_ROLE_MASTER and roles.generation == 9
    old_stop.set()  # ryu-manager ends: its apps stop, the lock goes
    old_thread.join(5)
    old.ownership.release()
    assert wait(lambda: new.leading) and new_started == [True] and not new_ended
    new_stop.set()
    new_thread.join(5)


def test_a_leader_whose_master_request_is_refused_steps_down_without_driving(tmp_path):
    roles = Roles()
    roles.request("someone", ofp.OFPCR_ROLE_MASTER, 12)  # a later leader is master already
    late, link, started, ended = candidate("late", roles, 7, tmp_path)
    thread, stop = lead(late)
    assert wait(lambda: ended == [1])
    thread.join(5)
    assert late.standing is Standing.DEPOSED and not link.driven and not started
    assert roles.roles["someone"] == ofp.OFPCR_ROLE_MASTER


def test_a_leader_that_loses_its_etcd_lease_becomes_a_slave_and_ends(tmp_path):
    roles = Roles()
    leader, link, started, ended = candidate("leader", roles, 5, tmp_path)
    thread, stop = lead(leader)
    assert wait(lambda: leader.leading)
    leader.election.why_lost = "etcd says its lease ran out"
    leader.election.lost.set()
    assert wait(lambda: ended == [1])
    thread.join(5)
    assert roles.roles["leader"] == ofp.OFPCR_ROLE_SLAVE  # no successor yet: the switch takes its slave request
    assert leader.lets_lease_run  # for one to adopt the switches' keys balanced


def test_a_leader_stopped_on_purpose_ends_the_lease(tmp_path):
    """ryu-manager stopped by a signal while it leads: nobody may come after it, so every get goes home at once."""
    roles = Roles()
    leader, link, started, ended = candidate("leader", roles, 5, tmp_path)
    thread, stop = lead(leader)
    assert wait(lambda: leader.leading)
    stop.set()
    thread.join(5)
    assert not leader.lets_lease_run and not ended


def test_a_candidate_deletes_the_key_of_a_leader_whose_owner_lock_was_freed(tmp_path):
    """The leader's process ended (the kernel freed its lock): its key goes, the election need not wait for its lease."""
    lock = Ownership(["switch"], "127.0.0.1:8081", tmp_path)
    assert lock.take() is None  # the leader drives
    waiting, _, _, _ = candidate("second", Roles(), None, tmp_path)
    waiting.election.holder = leader = identity(os.getpid(), "127.0.0.1:8081", "127.0.0.1:6653")
    thread, stop = lead(waiting)
    time.sleep(3 * STANDBY_POLL)  # seen held: nothing done
    assert waiting.election.deposed == []
    lock.release()  # as the kernel does when its process ends
    assert wait(lambda: waiting.election.deposed == [leader])
    stop.set()
    thread.join(5)


def test_a_freed_lock_deposes_no_leader_the_key_does_not_name_it(tmp_path):
    """The lock was a frozen, deposed leader's; the key names its successor, which waited for that lock: kept."""
    lock = Ownership(["switch"], "127.0.0.1:8081", tmp_path)
    assert lock.take() is None
    waiting, _, _, _ = candidate("third", Roles(), None, tmp_path)
    waiting.election.holder = successor = identity(os.getpid(), "127.0.0.1:8082", "127.0.0.1:6654")
    thread, stop = lead(waiting)
    time.sleep(3 * STANDBY_POLL)
    lock.release()
    time.sleep(5 * STANDBY_POLL)
    assert waiting.election.deposed == [] and waiting.election.holder == successor
    stop.set()
    thread.join(5)


def test_a_batch_the_switch_refuses_in_part_raises_its_first_refusal_and_prints_no_traceback(capfd):
    """A deposed leader's batch (OVS refuses a slave's writes with OFPBRC_IS_SLAVE): every message was on its way
    before the first answer, send raises the first refusal in the batch's order, and no green thread's exception
    reaches eventlet's hub, which would print a traceback into the ryu-manager's log."""
    from controller.ryu_app import RyuChannel
    from dataplanes.driver import DriverError
    import eventlet

    class Refusing(RyuChannel):
        def __init__(self):
            super().__init__(app=None)
            self.sent: list[str] = []

        def _call(self, dp, message, reply_cls, multi, what):
            self.sent.append(message)
            eventlet.sleep(0.01 * (3 - len(self.sent)))  # answers come back in another order than sent
            if message != "flow 1":
                raise DriverError(f"switch 0000000000000001 refused a {what} ({message}): type 1 code 10")

    channel = Refusing()
    try:
        channel.send(Connection.dp, ["flow 1", "flow 2", "group 3"])
    except DriverError as err:
        refused = str(err)
    else:
        refused = ""
    assert channel.sent == ["flow 1", "flow 2", "group 3"]
    assert "(flow 2)" in refused, refused
    assert "Traceback" not in capfd.readouterr().err
