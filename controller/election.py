"""Which of several controllers drives the switches: a leader elected through etcd (`[controller] etcd`).

The leader holds one key (`election_key`) attached to a lease of `election_ttl` seconds that it keeps alive; the
others wait for the key to go (the leader stopped, died, or lost etcd: its lease ran out) and the first to create it
anew leads. The revision at which the key was created is the leader's election id: etcd's revisions only grow, so a
later leader's id is always higher, and a switch agent that has seen it refuses every earlier leader's writes
(dataplanes/agent/server.py) even while that one still believes it leads. A leader that cannot renew its lease in
time has lost: it stops driving (the controller exits, saying so) rather than wait to learn it from the switches. In
time is before etcd could let the lease run out (the TTL counted from the sending of its last renewal that got
through), less LEAD_GUARD for the controller to stop, whatever request is in flight then: etcd without a quorum
answers nobody, and no other candidate is elected while this one leads. Every change of role is a typed event
(`events`), on this process's monotonic clock.
etcd decides; nothing here is a consensus of its own. etcd runs as a cluster (three members): every member's
endpoint is given, and each request goes to the member that answered last; one that does not answer within a quarter
of the TTL (gone, frozen, cut off; FIRST_TIMEOUT until one answered) is passed over for the next, which is asked
first from then on, so a leader renews through another member before its lease runs out. A candidate waits through
an etcd that does not answer (a member gone, etcd electing its own leader, no quorum): only a first contact without
an answer fails the controller. With https:// endpoints the controller checks etcd's certificate against `etcd_ca`
and shows its own (`etcd_cert`, `etcd_key`), for an etcd run with --client-cert-auth; a refused handshake is said in
one line. Where etcd's auth is on, it logs in as `etcd_user` (its password in `etcd_password_file`) and sends the
token etcd gives on every request, logging in again when etcd says the token is no longer valid; a refused login is
said in one line.

Which candidate should lead is the one that reaches the most switches (a controller cut off from one switch drives
the others only). When its data plane can probe that (the registry's `reach`: switch agents answering a Hello,
P4Runtime servers accepting a connection), every candidate and the leader publish how many switches they reach under
`<key>/candidates/<identity>`, on their own lease; a candidate does not take a free key while another reaches more,
and a leader that reaches fewer switches than some candidate at two renewals in a row resigns, so that one leads
(the lead passes up, never down: with nobody better, a leader that reaches few switches keeps leading, better than
none).
"""
from __future__ import annotations

import base64
import logging
import re
import threading
import time
import warnings
from dataclasses import dataclass
from enum import Enum
from typing import Callable
from urllib.parse import urlsplit

log = logging.getLogger(__name__)
POLL = 0.1  # seconds between a candidate's tries while another leads (the key's absence is checked, not watched)
REQUEST_TIMEOUT = 2.0  # seconds a member has to answer, a quarter of the TTL if less: time left for the next one
FIRST_TIMEOUT = REQUEST_TIMEOUT  # seconds a member has to answer until one did: a first contact keeps no lease in
# time, and a busy member takes longer than a quarter of a TTL for a TLS handshake (it said "unreachable")
FIRST_RETRY = 0.2  # seconds between rounds of a first contact that every member refused at once
LEAD_GUARD = 0.2  # seconds before etcd could let its lease run out that a leader stops (a quarter of the TTL if less):
# time for the controller to stop driving (controller/cli.py looks every 50 ms)
RENEW_EVERY = 0.25  # of the TTL, between renewals: one that waits a member's timeout (a quarter) and then goes
# through the next member still lands before the lead ends (a TTL less LEAD_GUARD after the last one)
HAND_OVER_AFTER = 2  # renewals in a row (a quarter of a TTL apart) that saw a candidate reach more: not one lost probe
Reach = Callable[[float], "tuple[int, int]"]  # (timeout) -> (switches answering, switches)
EtcdTls = "tuple[str, str, str] | None"  # (CA, client certificate, its key) files, "" where not given
EtcdLogin = "tuple[str, str] | None"  # (user, password) where etcd's auth is on
TOKEN_REFUSED = ("invalid auth token", "user name is empty", "auth token")  # etcd's words: log in (again)


class ElectionError(RuntimeError):
    """etcd cannot be used (unreachable, refused, a bad endpoint); the message says which and why."""


class Role(str, Enum):
    """Where a candidate stands; LEADER only between its election and its loss or resignation."""
    IDLE = "idle"  # not campaigning (made, or stopped while a candidate)
    CANDIDATE = "candidate"
    LEADER = "leader"
    LOST = "lost"  # no longer leads: renewals did not get through in time, etcd said the lease went, or handed over
    RESIGNED = "resigned"  # gave the lead up itself (a controller that stops)


@dataclass(frozen=True)
class RoleChange:
    """One change of role, at a time of this process's monotonic clock."""
    at: float
    role: Role
    election_id: int | None
    why: str = ""
    deadline: float | None = None  # LOST for want of renewals: the lead's deadline that ran out (same clock as `at`)


@dataclass(frozen=True)
class Round:
    """One round of asking every etcd endpoint in turn until one answers."""
    answered: bool
    answer: object  # what the endpoint that answered said (None: none did)
    errors: list[str]  # why each endpoint asked before it (or every one) did not answer
    all_refused: bool  # every one that did not answer refused the connection: a failure that came at once


class Election:
    """A candidate for `key` on etcd `endpoints` ("http://host:port"), known to the others as `identity`."""

    def __init__(self, endpoints: tuple[str, ...], key: str, ttl: int, identity: str, reach: Reach | None = None,
                 tls: EtcdTls = None, login: EtcdLogin = None):
        """reach: a probe of the switches this candidate could drive (the registry's), None: not compared. tls: (CA,
        certificate, key) files for https:// endpoints (etcd's --trusted-ca-file and --client-cert-auth). login:
        (user, password) where etcd's auth is on."""
        with warnings.catch_warnings():  # its futurist imports eventlet, which warns it is deprecated
            warnings.simplefilter("ignore")
            import etcd3gw  # here: a controller without etcd does not import it
        self._etcd3gw = etcd3gw
        self._timeout = min(REQUEST_TIMEOUT, ttl / 4)  # once a member answered: time left for the next one
        self.clients = [_client(etcd3gw, url, FIRST_TIMEOUT, tls, login is not None) for url in endpoints]
        self.endpoints = tuple(endpoints)
        self._current = 0  # the endpoint that answered last: asked first
        self.login = login
        self._tokens: dict[int, str] = {}  # id(client) -> the auth token etcd gave it
        self.key, self.ttl, self.identity = key, ttl, identity
        self.lease_id: int | None = None
        self.election_id: int | None = None
        self._renewed = 0.0  # monotonic time the last renewal that got through was sent (etcd renewed after it)
        self._guard = min(LEAD_GUARD, ttl / 4)
        self._unrenewed = "etcd did not answer in time"  # why the latest renewal did not get through
        self._due = 0.0  # monotonic time the renewal thread should send its next renewal
        self._late = 0.0  # how late it sent one at most since the last that got through (a starved process)
        self._revoked = False
        self.lost = threading.Event()  # set once the leader could not keep its lease, or handed over
        self.why_lost = ""
        self.reach = reach
        self.reached: tuple[int, int] | None = None  # the latest probe's answer
        self._probed = threading.Event()  # set by each probe
        self._published: tuple[int, tuple[int, int]] | None = None  # (lease, reached) in etcd now
        self.requests = 0  # requests sent to etcd members: a candidate waiting through an outage sends few
        self._answered = False  # some member answered some request: later outages are waited through
        self.events: list[RoleChange] = []  # every change of role, oldest first
        self._changing = threading.Lock()  # the role changes once per cause: a loss and a resignation race

    @property
    def member(self) -> str:
        """The endpoint asked first now: the one that answered last."""
        return self.endpoints[self._current]

    @property
    def renewed(self) -> float:
        """The monotonic time the last renewal that got through was sent: etcd cannot let the lease run out before
        this plus the TTL."""
        return self._renewed

    @property
    def role(self) -> Role:
        return self.events[-1].role if self.events else Role.IDLE

    def _become(self, role: Role, why: str = "", deadline: float | None = None) -> None:
        self.events.append(RoleChange(time.monotonic(), role, self.election_id, why, deadline))

    def leader(self) -> str | None:
        """Who leads now (its identity), None if nobody does."""
        found = self._ask(lambda client: client.get(self.key))
        return found[0].decode(errors="replace") if found else None

    def campaign(self, stop: threading.Event) -> int | None:
        """Wait until this candidate leads: its election id; None if `stop` was set first. The first request to
        etcd raises ElectionError if no endpoint answers; later, the candidate waits until one does."""
        try:
            lease_id: int | None = self._grant()
        except ElectionError:
            if not self._answered:
                raise  # the first contact: etcd is unreachable or refuses this controller
            lease_id = None  # etcd answered before (leader(), a standby's look): wait for it, as below
        self._become(Role.CANDIDATE)
        if self.reach is not None:
            threading.Thread(target=self._probe, args=(stop,), name="mbalancer-reach", daemon=True).start()
            self._probed.wait(self.ttl)  # its first answer, before it compares itself with the others
        deferred_to, outage = None, None
        while not stop.is_set():
            try:
                lease_id, better, elected = self._try_to_lead(lease_id)
            except ElectionError as err:
                if outage is None:
                    log.warning("candidate: no etcd member answers (%s); waiting for one", err)
                outage = err
                stop.wait(POLL)
                continue
            if outage is not None:
                log.info("candidate: etcd answers again")
                outage = None
            if elected is not None:
                self.lease_id, self.election_id = lease_id, elected
                self._become(Role.LEADER)
                self._due = self._renewed + self.ttl * RENEW_EVERY
                threading.Thread(target=self._keep, name="mbalancer-election", daemon=True).start()
                threading.Thread(target=self._watch, name="mbalancer-lead-deadline", daemon=True).start()
                return self.election_id
            if better is not None and better != deferred_to:
                log.info("candidate: %s; waiting while it is a candidate", better)
            deferred_to = better
            stop.wait(POLL)
        self._become(Role.IDLE, "stopped while a candidate")
        try:
            if lease_id is not None:
                self._revoke(lease_id)
        except ElectionError as err:
            log.warning("could not revoke the candidate's lease (it runs out by itself): %s", err)
        return None

    def _try_to_lead(self, lease_id: int | None) -> tuple[int, str | None, int | None]:
        """One round of a candidate: (its lease, a better candidate it waits for or None, its election id if it
        leads now or None)."""
        if lease_id is None or self._refresh(lease_id) <= 0:  # its own lease lives while it waits (else anew)
            return self._grant(), None, None
        self._publish(lease_id)
        if (better := self._better_candidate()) is not None:
            return lease_id, better, None
        reply = self._ask(lambda client: client.transaction(self._create(lease_id)))
        elected = self._created(reply, lease_id)
        if elected is None:
            return lease_id, None, None
        sent = time.monotonic()
        # a create that took longer than the lease (etcd stalled) leads nothing: the key went with the lease
        if self._refresh(lease_id) <= 0:
            return lease_id, None, None
        self._renewed = sent
        return lease_id, None, elected

    # --- which candidate reaches the most switches ---------------------------------------------------------------
    def _probe(self, stop: threading.Event) -> None:
        """Probe the switches every third of the TTL while a candidate or the leader."""
        while not stop.is_set() and not self.lost.is_set():
            self.reached = self.reach(self.ttl / 3)
            self._probed.set()
            stop.wait(self.ttl / 3)

    def _publish(self, lease_id: int) -> None:
        """This candidate's latest reach in etcd, on its lease (gone with it), when it changed."""
        if self.reached is None or self._published == (lease_id, self.reached):
            return
        reached = self.reached
        self._ask(lambda client: client.put(self._candidate_key(self.identity), "%d/%d" % reached,
                                            lease=self._etcd3gw.Lease(lease_id, client)))
        self._published = (lease_id, reached)

    def _candidate_key(self, identity: str) -> str:
        return f"{self.key}/candidates/{identity}"

    def _better_candidate(self) -> str | None:
        """Another candidate that reaches more switches than this one ("<identity> reaches 4 of 4 switches, this
        one 3"), or None."""
        if self.reached is None:
            return None
        best, who = self.reached[0], None
        prefix = self._candidate_key("")
        for value, meta in self._ask(lambda client: client.get_prefix(prefix)):
            identity = meta["key"].decode(errors="replace")[len(prefix):]
            try:
                count, total = (int(n) for n in value.decode().split("/"))
            except ValueError:
                continue  # not a candidate's entry
            if identity != self.identity and count > best:
                best, who = count, f"{identity} reaches {count} of {total} switches, this one {self.reached[0]}"
        return who

    def _create(self, lease_id: int) -> dict:
        """A transaction that puts the key, held by `lease_id`, only if nobody holds it; else reads who does."""
        return {"compare": [{"key": _b64(self.key), "result": "EQUAL", "target": "CREATE", "create_revision": 0}],
                "success": [{"request_put": {"key": _b64(self.key), "value": _b64(self.identity),
                                             "lease": lease_id}}],
                "failure": [{"request_range": {"key": _b64(self.key)}}]}

    @staticmethod
    def _created(reply: dict, lease_id: int) -> int | None:
        """The election id if `_create` made this candidate the leader: now, or in an earlier try whose answer was
        lost (a member that went silent after passing the put on): the key is on its lease."""
        if reply.get("succeeded"):
            return int(reply["header"]["revision"])
        for response in reply.get("responses", []):
            for held in response.get("response_range", {}).get("kvs", []):
                if int(held.get("lease", 0)) == lease_id:
                    return int(held["create_revision"])
        return None

    def depose(self, leader: str) -> bool:
        """Delete the key if `leader` (an identity) still holds it: a leader known to have ended (a Ryu candidate saw
        its process's owner lock freed, controller/ryu_failover.py), so the next candidate need not wait for its
        lease to run out. True if deleted; the election still decides who leads next."""
        reply = self._ask(lambda client: client.transaction({
            "compare": [{"key": _b64(self.key), "result": "EQUAL", "target": "VALUE", "value": _b64(leader)}],
            "success": [{"request_delete_range": {"key": _b64(self.key)}}], "failure": []}))
        return bool(reply.get("succeeded"))

    def resign(self) -> None:
        """Give up the lead at once (a controller that stops, or one that lost it because its renewals did not get
        through, where etcd answers again): the next candidate need not wait for the lease to run out."""
        if self.lease_id is not None and not self._revoked:
            self._revoked = True  # once: another thread's resign (the controller's, on a lost lead) revokes nothing
            with self._changing:
                if not self.lost.is_set():
                    self._become(Role.RESIGNED)
                self.lost.set()
            try:
                self._revoke(self.lease_id)
            except ElectionError as err:
                log.warning("could not resign (the lease runs out by itself): %s", err)

    def _keep(self) -> None:
        """Renew the lease a quarter of its TTL after the last renewal was sent, again at once (every POLL) while one
        does not get through. Lost when etcd says the lease is gone (or, by _watch, when no renewal got through in
        time). Handed over when another candidate reached more switches at HAND_OVER_AFTER renewals in a row."""
        outreached = 0  # renewals in a row at which a candidate reached more switches
        wait = self.ttl * RENEW_EVERY
        while not self.lost.wait(max(0.0, wait)):
            sent = time.monotonic()
            self._late = max(self._late, sent - self._due)  # this thread woke late: the machine is busy
            try:
                if self._refresh(self.lease_id) <= 0:
                    self._revoked = True  # nothing left to revoke
                    self._give_up("etcd says its lease ran out")
                    return
            except ElectionError as err:
                self._unrenewed = str(err)
                wait = POLL
                self._due = time.monotonic() + wait
                continue
            self._renewed, self._late = sent, 0.0
            wait = sent + self.ttl * RENEW_EVERY - time.monotonic()
            self._due = sent + self.ttl * RENEW_EVERY
            try:
                self._publish(self.lease_id)
                better = self._better_candidate()
            except ElectionError:
                continue  # the renewal got through: the next one says whether etcd still answers
            outreached = 0 if better is None else outreached + 1
            if outreached == HAND_OVER_AFTER:
                try:  # at once: the better candidate need not wait for the lease to run out
                    self._revoke(self.lease_id)
                except ElectionError as err:
                    log.warning("could not resign (the lease runs out by itself): %s", err)
                self._give_up(f"handed over to a candidate that reaches more switches: {better}")
                return

    def _watch(self) -> None:
        """Lost once no renewal got through for the TTL less the guard, counted from the sending of the last one that
        did, whatever request is in flight then (one that waits on every member in turn may take 3/4 of a TTL): etcd
        counts the TTL from a renewal's arrival, so this leader has stopped before etcd could let its lease run out
        and elect another, even where renewals fail for want of an etcd quorum."""
        while not self.lost.wait(max(0.0, self._lead_ends() - time.monotonic())):
            if (now := time.monotonic()) >= (deadline := self._lead_ends()):
                late = max(self._late, now - deadline)  # threads that woke late: a starved process
                late = f"; this process ran up to {late:.2f} s late: a busy machine" * (late > POLL)
                self._give_up(f"no renewal got through for {self.ttl - self._guard:g} s ({self._unrenewed}{late})",
                              deadline)
                return

    def _lead_ends(self) -> float:
        return self._renewed + self.ttl - self._guard

    def _give_up(self, why: str, deadline: float | None = None) -> None:
        with self._changing:
            if self.lost.is_set():
                return  # resigned meanwhile, or lost already: nothing more was lost
            log.error("lost the lead (election id %s): %s", self.election_id, why)
            self.why_lost = why
            self._become(Role.LOST, why, deadline)
            self.lost.set()

    def _grant(self) -> int:
        return self._ask(lambda client: client.lease(self.ttl)).id

    def _revoke(self, lease_id: int) -> None:
        self._ask(lambda client: self._etcd3gw.Lease(lease_id, client).revoke())
        if lease_id == self.lease_id:
            self._revoked = True

    def _refresh(self, lease_id: int) -> int:
        return self._ask(lambda client: self._etcd3gw.Lease(lease_id, client).refresh())

    def _ask(self, request):
        """`request(client)` on the endpoint that answered last, else on the next one that answers, which is asked
        first from then on (said in the log); ElectionError naming every one that did not. Until a member has
        answered, members that all refused the connection are asked again for FIRST_TIMEOUT (one starting, or
        thawed amid a raft election, closed a first contact at once in a CI run with two CPU hogs)."""
        deadline = time.monotonic() + FIRST_TIMEOUT
        while True:
            asked = self._ask_each(request)
            if asked.answered:
                return asked.answer
            if self._answered or not asked.all_refused or time.monotonic() + FIRST_RETRY > deadline:
                raise ElectionError(f"etcd: {'; '.join(asked.errors)}")
            time.sleep(FIRST_RETRY)

    def _ask_each(self, request) -> Round:
        """One round of _ask over the endpoints."""
        import requests  # etcd3gw's own HTTP client: an answer cut off midway (a member killed) is its error alone
        errors, refused = [], True
        for step in range(len(self.clients)):
            index = (self._current + step) % len(self.clients)
            client = self.clients[index]
            self.requests += 1
            try:
                answer = self._logged_in(client, request)
            except (self._etcd3gw.exceptions.ConnectionFailedError, self._etcd3gw.exceptions.ConnectionTimeoutError,
                    requests.exceptions.RequestException) as err:
                why = _unreachable(err)
                refused &= isinstance(err, self._etcd3gw.exceptions.ConnectionFailedError) and "TLS" not in why
                errors.append(f"{client.host}:{client.port}: {why}")
                continue
            except self._etcd3gw.exceptions.Etcd3Exception as err:
                said = str(err).strip().splitlines()
                errors.append(f"{client.host}:{client.port}: {said[0] if said else type(err).__name__}")
                refused = False
                continue
            if not self._answered:
                self._answered = True
                for each in self.clients:
                    each.timeout = self._timeout
            if index != self._current:
                log.warning("etcd: now through %s:%s (%s)", client.host, client.port, "; ".join(errors))
                self._current = index
            return Round(True, answer, errors, refused)
        return Round(False, None, errors, refused)

    def _logged_in(self, client, request):
        """`request(client)`, logged in first where etcd's auth is on (and once more if etcd says the token went)."""
        if self.login is None:
            return request(client)
        if id(client) not in self._tokens:
            self._log_in(client)
        try:
            return request(client)
        except self._etcd3gw.exceptions.Etcd3Exception as err:
            if not any(words in str(err) for words in TOKEN_REFUSED):
                raise
            self._log_in(client)
            return request(client)

    def _log_in(self, client) -> None:
        """etcd's /v3/auth/authenticate: the token every later request of this client carries."""
        import requests  # etcd3gw's own HTTP client
        user, password = self.login
        try:  # not a quarter of the TTL: etcd checks the password with bcrypt (~0.1 s of CPU, longer on a busy
            # member), and a login is not a renewal
            answer = client.session.post(f"{client.base_url}/v3/auth/authenticate",
                                         json={"name": user, "password": password}, timeout=REQUEST_TIMEOUT)
        except requests.exceptions.RequestException as err:  # as etcd3gw says it: the next endpoint is tried
            raise self._etcd3gw.exceptions.ConnectionFailedError(str(err)) from err
        if answer.status_code != 200:
            said = answer.json().get("error", answer.text) if answer.headers.get("content-type", "").startswith(
                "application/json") else answer.text
            raise ElectionError(f"etcd: {client.host}:{client.port}: user {user} not logged in: "
                                f"{str(said).strip().splitlines()[0] if str(said).strip() else answer.reason}")
        token = answer.json()["token"]
        client.session.headers["Authorization"] = token
        self._tokens[id(client)] = token


def etcd_login(settings) -> EtcdLogin:
    """([controller] etcd_user, the first line of etcd_password_file), None without a user; ElectionError naming the
    field, in one line, if the password cannot be read."""
    if not settings.etcd_user:
        return None
    try:
        password = open(settings.etcd_password_file).readline().rstrip("\n")
    except OSError as err:
        raise ElectionError(f"controller.etcd_password_file: {settings.etcd_password_file}: cannot read: "
                            f"{err.strerror}") from None
    if not password:
        raise ElectionError(f"controller.etcd_password_file: {settings.etcd_password_file}: its first line is empty")
    return settings.etcd_user, password


def _client(etcd3gw, url: str, timeout: float, tls: EtcdTls = None, login: bool = False):
    parts = urlsplit(url if "://" in url else f"http://{url}")
    if parts.scheme not in ("http", "https") or not parts.hostname or not parts.port:
        raise ElectionError(f"{url!r} is not http://HOST:PORT")
    session = _session(tls or ("", "", "")) if (tls and any(tls)) or login else None  # its own: login sets a header
    return etcd3gw.Etcd3Client(host=parts.hostname, port=parts.port, protocol=parts.scheme, timeout=timeout,
                               api_path="/v3/", session=session)


def _session(tls: EtcdTls):
    """requests' session with etcd's CA and this controller's certificate; not from the environment, whose
    REQUESTS_CA_BUNDLE would replace the CA given here (requests lets it)."""
    import requests  # etcd3gw's own HTTP client
    ca, cert, key = tls
    session = requests.Session()
    session.trust_env = False
    session.verify = ca or True
    if cert:
        session.cert = (cert, key)
    return session


def _unreachable(err: Exception) -> str:
    """Why an endpoint did not answer, in a few words: TLS refused (and OpenSSL's reason), or unreachable."""
    text = f"{err} {err.__context__!r}"  # etcd3gw keeps requests' error (and OpenSSL's words) as the context
    reason = re.search(r"\[SSL: ([A-Z_]+)\]|(certificate verify failed|certificate required|unknown ca|bad "
                       r"certificate)", text, re.IGNORECASE)
    if reason or "SSLError" in text:
        why = (reason.group(1) or reason.group(2)).lower().replace("_", " ") if reason else "handshake failed"
        return f"TLS refused ({why}): check controller.etcd_ca, etcd_cert and etcd_key against etcd's certificates"
    return f"unreachable ({type(err).__name__})"


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()
