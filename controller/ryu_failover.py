"""The Ryu app in a failover group: each ryu-manager running it is a candidate in the etcd election (the Election of
`mbalancer controller`, controller/election.py), every switch connects to every candidate, and the switch itself
refuses a deposed leader, by OpenFlow's controller roles.

- A candidate takes the SLAVE role at every switch, with the generation id the switch holds now (it tells a NOCHANGE
  request). Not EQUAL, OpenFlow's default: the switch sends a slave no PacketIn (so the candidates do not each parse
  every mirrored write under load) and refuses its writes (OFPBRC_IS_SLAVE), where an equal one could write.
- The elected one asks every switch for MASTER with its election id as the generation id: the etcd revision at which
  it created the leader's key, which only grows, so a later leader's is higher. The switch makes it master, makes
  the master before it a slave (and tells it: ROLE_STATUS), and from then on refuses a lower generation id
  (OFPRRFC_STALE). The leader writes a switch only once its master role there was accepted, a switch that connects
  later included.
- Then it takes the key classifier's lock (mbalancer/ownership.py) and starts the core. The classifier's maps are on
  the switch's box, where OpenFlow's roles do not reach: while a deposed leader lives it holds the lock, so its
  successor waits for it to end (its OpenFlow writes are refused meanwhile, and its lease in the classifier runs out).
- A leader demoted by a switch (ROLE_STATUS), whose master request a switch refuses, or that lost its etcd lease steps
  down: it asks every switch for SLAVE with its own generation id (refused, OFPRRFC_STALE, where a successor is master
  already; accepted where none is yet) and ends ryu-manager with status 1, as `mbalancer controller` exits when it
  loses the lead, for systemd to start it again as a candidate.
- A candidate watches that lock too: the kernel frees it the moment the leader's process ends (kill -9 included), so a
  candidate that sees it freed deletes the leader's election key if the key still names that holder (pid and HTTP
  address), and the election goes on at once instead of after the leader's lease ran out (election_ttl, plus up to
  half a second of etcd's own lease checks). A leader that stops resigns before it frees the lock; one that is alive
  but cut off (frozen, partitioned) holds the lock, and its lease decides as before.
The logic is plain Python over a Switches interface (the Ryu app implements it over Ryu's connections).
"""
from __future__ import annotations

import logging
import threading
from enum import Enum
from typing import Any, Callable, Protocol

from ryu.ofproto import ofproto_v1_5 as ofp

from controller.election import Election, ElectionError
from dataplanes.driver import DriverError
from mbalancer.ownership import STANDBY_POLL, Owner, Ownership, OwnershipError

log = logging.getLogger("mbalancer.ryu")
WATCH = 0.05  # seconds between the leader's looks at its election
SLAVE_TRIES = 3  # a candidate's (ask the generation id, then SLAVE with it) rounds, if a new master comes between
# the switch's refusals that concern roles, named as OpenFlow names them
ROLE_ERRORS = {(ofp.OFPET_ROLE_REQUEST_FAILED, ofp.OFPRRFC_STALE): "OFPRRFC_STALE: a higher generation id came",
               (ofp.OFPET_BAD_REQUEST, ofp.OFPBRC_IS_SLAVE): "OFPBRC_IS_SLAVE: this controller is a slave here"}


class RoleRefused(DriverError):
    """The switch refused a role request (e.g. OFPRRFC_STALE: a controller with a higher generation id came)."""


class Standing(Enum):
    CANDIDATE = "candidate"  # waiting in the election; slave at every switch
    CLAIMING = "claiming"  # elected: taking the master role at every switch, then the classifier's lock
    LEADING = "leading"  # the core runs and drives every switch where it is master
    DEPOSED = "deposed"  # stepping down; ryu-manager ends


class Switches(Protocol):
    """What the failover logic needs of the switches' connections (the Ryu app's RyuChannel)."""

    def connected(self) -> list[Any]:
        """Every switch connected to this ryu-manager now."""

    def ask_role(self, dp: Any, role: int, generation_id: int) -> tuple[int, int]:
        """(role, generation id) the switch answers; RoleRefused, or DriverError if it did not answer."""

    def drive(self, dp: Any) -> None:
        """The driver may write this switch from now on (this controller is master there)."""


def identity(pid: int, listen: str, openflow: str) -> str:
    """A ryu-manager's name in the election (the leader key's value): its pid and HTTP address first, as its owner
    lock records them."""
    return f"ryu-manager pid {pid} (http://{listen}, OpenFlow {openflow})"


def names(leader: str, owner: Owner) -> bool:
    """Whether the election key's value `leader` names the controller that held the owner lock."""
    return leader.startswith(f"ryu-manager pid {owner.pid} (http://{owner.listen},")


def error_name(kind: int, code: int) -> str | None:
    return ROLE_ERRORS.get((kind, code))


def dpid(dp: Any) -> str:
    return f"{getattr(dp, 'id', 0):016x}"


class Failover:
    """One candidate of the group: campaign, claim every switch, lead, step down."""

    def __init__(self, election: Election, ownership: Ownership, switches: Switches, start_core: Callable[[], None],
                 end: Callable[[int], None]):
        """start_core: start the controller core (DriverError: ends with status 2); end(status): end ryu-manager."""
        self.election, self.ownership, self.switches = election, ownership, switches
        self.start_core, self.end = start_core, end
        self.standing = Standing.CANDIDATE
        self.generation: int | None = None  # the election id, once elected
        self._roles = threading.Lock()  # one role change at a time: a candidate's SLAVE never lands after its MASTER

    @property
    def leading(self) -> bool:
        return self.standing is Standing.LEADING

    @property
    def lets_lease_run(self) -> bool:
        """Deposed (lost the lead, demoted or refused by a switch): the core lets the switches go with their lease
        running, as `mbalancer controller` does (controller/cli.py _stop_driving says why that is safe). Ending it
        would write the shared classifier's lease to 0 under the successor driving it: every hot get home until its
        next renewal."""
        return self.standing is Standing.DEPOSED

    def run(self, stop: threading.Event) -> None:
        """Campaign until elected (or `stop`), claim every switch, take the classifier, start the core, then watch the
        election until the lead is lost."""
        try:
            leader = self.election.leader()
            if leader is not None:
                log.info("mbalancer: standby: %s leads; a candidate, slave at every switch", leader)
            threading.Thread(target=self._watch_owner, args=(stop,), name="mbalancer-owner-watch",
                             daemon=True).start()
            election_id = self.election.campaign(stop)
        except ElectionError as err:
            log.error("mbalancer: controller.etcd: %s", err)
            return self.end(2)
        if election_id is None:
            return
        with self._roles:
            self.standing, self.generation = Standing.CLAIMING, election_id
        log.info("mbalancer: elected through etcd, election id %d: asking every switch for the master role with "
                 "generation id %d", election_id, election_id)
        for dp in self.switches.connected():
            self.claim(dp)
        if self.standing is Standing.DEPOSED or not self._take_classifier(stop):
            return
        try:
            self.start_core()
        except DriverError as err:
            log.error("mbalancer: the data plane cannot be driven: %s", err)
            return self.end(2)
        with self._roles:
            self.standing = Standing.LEADING if self.standing is Standing.CLAIMING else self.standing
        if self.standing is not Standing.LEADING:
            return
        log.info("mbalancer: leading with election id %d (%d switches connected; one that connects later is "
                 "claimed first)", election_id, len(self.switches.connected()))
        while not stop.wait(WATCH):
            if self.election.lost.is_set():
                return self.step_down(f"lost the lead in etcd ({self.election.why_lost})")
            if self.standing is Standing.DEPOSED:
                return

    def _watch_owner(self, stop: threading.Event) -> None:
        """While a candidate: the owner lock's holder, every STANDBY_POLL; once freed, its election key deleted if it
        still names it (the module's docstring says why that is safe)."""
        held: Owner | None = None
        while self.standing is Standing.CANDIDATE and not stop.wait(STANDBY_POLL):
            owner = next((o for s in self.ownership.switches if (o := Ownership.holder(s, self.ownership.owners_dir))),
                         None)
            if owner is None and held is not None and self.standing is Standing.CANDIDATE:
                self._depose(held)
            held = owner

    def _depose(self, ended: Owner) -> None:
        try:
            leader = self.election.leader()
            if leader is not None and names(leader, ended) and self.election.depose(leader):
                log.warning("mbalancer: the leader ended (%s freed its owner lock): its election key deleted, not "
                            "waiting for its lease to run out", leader)
        except ElectionError as err:  # its lease runs out by itself
            log.warning("mbalancer: controller.etcd: %s", err)

    def _take_classifier(self, stop: threading.Event) -> bool:
        try:
            owner = self.ownership.take()
            if owner is not None:
                log.warning("mbalancer: %s: waiting for it to end (a deposed leader: the switches refuse its "
                            "writes already)", owner.describe())
                if self.ownership.wait_take(stop) is not None:
                    return False
        except OwnershipError as err:
            log.error("mbalancer: %s", err)
            self.end(2)
            return False
        return True

    def connected(self, dp: Any) -> None:
        """A switch (re)connected: slave while a candidate; master first, then driven, once elected."""
        if self.standing is Standing.CANDIDATE:
            self._slave(dp)
        if self.standing in (Standing.CLAIMING, Standing.LEADING):
            self.claim(dp)

    def claim(self, dp: Any) -> None:
        """The master role at `dp` with this leader's generation id; refused: step down."""
        try:
            with self._roles:
                role, generation = self.switches.ask_role(dp, ofp.OFPCR_ROLE_MASTER, self.generation)
        except RoleRefused as err:
            return self.step_down(f"switch {dpid(dp)} refused the master role for generation id {self.generation}: "
                                  f"{err}")
        except DriverError as err:  # it reconnects (and is claimed then) or is gone
            return log.warning("mbalancer: switch %s: no answer to the master role request: %s", dpid(dp), err)
        log.info("mbalancer: switch %s: master role accepted, generation id %d", dpid(dp), generation)
        self.switches.drive(dp)

    def _slave(self, dp: Any) -> None:
        for _ in range(SLAVE_TRIES):
            with self._roles:
                if self.standing is not Standing.CANDIDATE:
                    return
                try:
                    _, held = self.switches.ask_role(dp, ofp.OFPCR_ROLE_NOCHANGE, 0)
                    self.switches.ask_role(dp, ofp.OFPCR_ROLE_SLAVE, held)
                except RoleRefused:
                    continue  # a master with a higher generation id came between the two: ask again
                except DriverError as err:
                    return log.warning("mbalancer: switch %s: no answer to the slave role request: %s", dpid(dp), err)
            return log.info("mbalancer: switch %s: slave (generation id %d) while a candidate", dpid(dp), held)
        log.warning("mbalancer: switch %s: its generation id kept moving; left in the equal role", dpid(dp))

    def demoted(self, dp: Any, role: int, generation: int) -> None:
        """The switch says this controller's role changed (ROLE_STATUS): made slave, another took master."""
        if role == ofp.OFPCR_ROLE_SLAVE and self.standing in (Standing.CLAIMING, Standing.LEADING):
            self.step_down(f"switch {dpid(dp)} made this controller slave: another controller took the master role "
                           f"with generation id {generation} (this one's {self.generation})")

    def step_down(self, why: str) -> None:
        """Slave at every switch with this leader's generation id (each switch's answer logged), then end: status 1."""
        with self._roles:
            if self.standing is Standing.DEPOSED:
                return
            self.standing = Standing.DEPOSED
        log.error("mbalancer: stepping down: %s", why)
        for dp in self.switches.connected():
            try:
                self.switches.ask_role(dp, ofp.OFPCR_ROLE_SLAVE, self.generation)
                log.info("mbalancer: switch %s: slave now (generation id %d)", dpid(dp), self.generation)
            except RoleRefused as err:
                log.warning("mbalancer: switch %s refused this controller (generation id %d): %s", dpid(dp),
                            self.generation, err)
            except DriverError as err:
                log.warning("mbalancer: switch %s: no answer to the slave role request: %s", dpid(dp), err)
        self.end(1)
