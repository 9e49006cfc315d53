"""The controller core: monitor reports and mirrored writes in, decisions out to a driver, state out as JSON.

Threads, not asyncio (ryu-manager greens plain threads with eventlet; an asyncio loop would not run there):
- callers (the HTTP server, the driver's mirror thread) only parse and queue;
- one worker thread handles the queue in batches (everything queued at once: health changes and a switch that came
  back empty first, then reports, then the copied packets, coalesced per key) and runs due retries, so the hot-key
  state has a single writer; health changes that arrive meanwhile are handled between two keys' syncs;
- one prober thread per server checks its health (so one hung server delays no other's probes) and queues changes;
- one lease thread renews the core's lease on the data plane: if this process dies or hangs, the switch stops
  trusting the copies within `controller.lease` seconds.
`state()` may be called from any thread and never waits for the worker (whose batch may spend seconds copying to a
slow server): the worker publishes a snapshot of its state after every batch and after a decision (unless those
snapshots, H hot keys each, would take more than PUBLISH_SHARE of its time: a change of 1,000 keys is 2,000
decisions); state() adds the servers' health and the data plane's counters, read when asked.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from collections import Counter, deque
from typing import Any, Callable, Sequence

from dataplanes.driver import Distrust, Driver, DriverError, FoundKey
from controller.adoption import came_back, summary
from controller.decisions import WARNED, Decision
from controller.events import Closed, Event, HealthChange, Mirror, Reconnect, Report, ServerChange, Stop, Wake
from controller.execution import Executor
from controller.hot_keys import HotKey
from controller.health import HealthTracker, Prober
from controller.mac_check import MacWatch
from controller.measured_balance import SERVERS, Spread, balance_state, plan_spread, switch_spread
from controller.mirrors import read_mirror
from controller.streams import TcpStreams
from controller.planner import Plan, Planner
from controller.replicator import Replicator
from controller.server_gets import ServerGets
from controller.switch_counts import SwitchCounts
from mbalancer.config import Config
from mbalancer.memcache.hashing import KeyHash, make_hash
from mbalancer.memcache.keys import key_to_text
from mbalancer.monitor_report import MonitorReport, parse_report

log = logging.getLogger(__name__)

DECISIONS_KEPT = 1000
COPY_TIMEOUT = 0.5  # seconds a copy to or read from one server may take
COUNT_EVERY = 1.0  # seconds between reads of the switch's per-key counters (the rates the planner trusts)
UNCOUNTED_FOR = 3 * COUNT_EVERY  # a new key has a rate after two reads; a report alone cools it after this at most
STALE_AFTER = 3  # intervals (monitor reports, counter reads) without a new one: the figures from them are stale
BATCH_MAX = 1_000  # events handled in one batch at most (health changes wait at most for one batch's parsing)
PUBLISH_SHARE = 0.1  # of the worker's time, at most, for the snapshots published after decisions (each H keys long:
# one per decision made a change of H keys cost H x H, 20 s at H = 1,000)


class ControllerCore:
    def __init__(self, config: Config, driver: Driver, key_hash: KeyHash | None = None,
                 clock: Callable[[], float] = time.monotonic, probe_health: bool = True):
        """key_hash: how clients map keys to servers; by default the config's hash (a skewed hash needs the
        workload's keys, so experiments pass theirs)."""
        self.config, self.driver, self.clock = config, driver, clock
        addresses = [s.address for s in config.servers]
        self.key_hash = key_hash or make_hash(config.balancing.hash, addresses)
        self.planner = Planner(config.balancing, len(addresses), self.key_hash.server_of,
                               [f"{s.ip}:{s.port}" for s in config.servers], driver.max_replicas)
        self.health = HealthTracker(len(addresses), config.controller.health_failures, config.controller.health_hold)
        self.macs = MacWatch(config.servers)  # each server's MAC against what the switch saw (mac_check.py)
        self.replicator = Replicator(addresses, COPY_TIMEOUT, self.health.unavailable, config.controller.copy_depth)
        self.streams = TcpStreams(driver, clock)  # connections the data plane reads as streams
        self.executor = Executor(driver, self.replicator, self._decide, clock,
                                 poll_every=config.controller.poll_interval,
                                 backlog=lambda: not self._events.empty(),
                                 mid_command=lambda server: self.streams.mid_command(config.servers[server].ip,
                                                                                     config.servers[server].port))
        self.server_of_address = {(s.ip, s.port): i for i, s in enumerate(config.servers)}
        self.switch_counts = SwitchCounts()  # the data plane's counters, read every COUNT_EVERY s
        # the servers' own counts of gets, read every COUNT_EVERY s: only where this core may talk to its servers
        # for its own checks (tests that give it unreachable addresses turn the probes off)
        self.server_gets = ServerGets(addresses, clock) if probe_health else None
        self._gone: set[str] = set()  # switches the driver found gone at the last count (warned once)
        self.server_ports = [s.port for s in config.servers]
        self._closes_handled: dict[int, tuple] = {}  # per server, the data plane's closes the worker dealt with
        self.ports = sorted({s.port for s in config.servers})
        self.decisions: deque[dict[str, Any]] = deque(maxlen=DECISIONS_KEPT)
        self.counts: Counter = Counter()
        self.last_plan: Plan | None = None
        self.last_report: MonitorReport | None = None
        self.last_report_at: float | None = None  # when it came (the core's clock)
        self.started = clock()
        self.lock = threading.Lock()  # guards `decisions` (appended by the worker, read by HTTP threads)
        self._snapshot: dict[str, Any] = {}
        self._published_at, self._publish_cost = float("-inf"), 0.0  # perf_counter s: the last snapshot, its cost
        self._worker: threading.Thread | None = None
        self._events: queue.Queue[Event] = queue.Queue()
        self._urgent: deque[HealthChange] = deque()  # handled even in the middle of a batch
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._probe_health = probe_health

    # --- life cycle -----------------------------------------------------------------------------------------
    def start(self) -> "ControllerCore":
        found = self.driver.attach(self.config.servers, self.submit_mirror, self.submit_reconnect)
        self._adopt(found)  # before the lease is renewed: a key not trusted is held dirty first
        self._check_macs()  # (then every COUNT_EVERY: /state says at once where the data plane cannot tell)
        for server in range(len(self.config.servers)):
            self._take_closes_at_start(server)
            self._rearm(server)
        self._publish()
        self.driver.renew_lease(self.config.controller.lease)
        self._worker = self._spawn(self._work, "mbalancer-core")
        self._spawn(self._renew_lease, "mbalancer-lease")
        self._spawn(self._count_gets, "mbalancer-counters")
        if self.server_gets is not None:
            self._spawn(self._read_server_gets, "mbalancer-server-gets")
        if self._probe_health:
            for server in range(len(self.config.servers)):
                self._spawn(lambda server=server: self._probe(server), f"mbalancer-health-{server}")
        log.info("controller core started: %d servers, H=%s, G=%d, %s weights, hysteresis %d, driver %s",
                 len(self.config.servers), self.config.balancing.hot or f"auto({self.config.balancing.target})",
                 self.config.balancing.groups, self.config.balancing.mode, self.config.balancing.hysteresis,
                 self.driver.name)
        return self

    def stop(self, end_lease: bool = True) -> None:
        """Stop every thread (no more renewals, copies or writes), then close the driver: its lease ended, so every
        get goes home at once; or, `end_lease` False, let go with the lease left to run out by itself, for a
        successor to adopt the switches' keys balanced (a leader that lost its lead: controller/cli.py says why)."""
        self._stop.set()
        self._events.put(Stop())
        for thread in self._threads:
            thread.join(timeout=5)
        if end_lease:
            self.driver.close()
        else:
            self.driver.let_go()
        self.replicator.close()
        if self.server_gets is not None:
            self.server_gets.close()

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """Block until every queued event has been handled (tests and benchmarks)."""
        deadline = time.monotonic() + timeout
        while self._events.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.001)
        return not self._events.unfinished_tasks

    # --- inputs (any thread) --------------------------------------------------------------------------------
    def submit_report(self, raw: Any) -> MonitorReport:
        """Queue a monitor report (the decoded JSON); raises ReportError, naming the field, if it is malformed."""
        try:
            report = parse_report(raw)
        except ValueError:
            self.counts["bad_reports"] += 1
            raise
        self._events.put(Report(report, self.clock()))
        return report

    def submit_mirror(self, frame: bytes) -> None:
        """Queue a mirrored write (a whole Ethernet frame, as the data plane copied it)."""
        self._events.put(Mirror(frame, self.clock()))

    def submit_health(self, server: int, change: ServerChange | str, error: str | None) -> None:
        """A server went down or came up (the health tracker's verdict), restarted, or shows a wrong MAC: handled
        before anything queued. (`change` may be its value: "down", "up", ...)"""
        self._urgent.append(HealthChange(server, ServerChange(change), error))
        self._events.put(Wake())

    def submit_reconnect(self, found: Sequence[FoundKey] | None = None, lost: Sequence[bytes] | None = None) -> None:
        """The driver's switch came back: empty (no arguments), queue the replay of every hot key; or holding `found`
        (read back), queue their adoption and the replay of `lost` (None: every hot key not found)."""
        self._events.put(Reconnect(None if found is None else tuple(found), None if lost is None else tuple(lost)))

    def _adopt(self, found: list[FoundKey], lost: Sequence[bytes] | None = ()) -> None:
        """Hot keys a previous controller left in the switches (or this one, in a switch that came back holding
        them), read back by the driver: each judged and kept as it is, settled, resynced or rebuilt
        (controller/adoption.py); the keys the switch lost installed again (`lost`; None: all not found)."""
        started = self.clock()
        verdicts = came_back(self.executor, found, lost, len(self.config.servers), self._group_of)
        if not verdicts:
            return
        for verdict in verdicts:
            self.counts[f"adopted_{verdict.treatment.name.lower()}"] += 1
        log.info("took over %d hot keys from the switches in %.1f ms: %s", len(found),
                 1000 * (self.clock() - started), summary(verdicts))

    def _group_of(self, replicas: Sequence[int]) -> int:
        """The planner's group holding most of a key's replicas (its group when it was placed)."""
        groups = self.planner.groups
        return max(range(len(groups)), key=lambda g: (len(set(groups[g]) & set(replicas)), -g)) if groups else 0

    # --- the worker -----------------------------------------------------------------------------------------
    def _work(self) -> None:
        while not self._stop.is_set():
            due = self.executor.next_wake()
            try:
                batch = [self._events.get(timeout=None if due is None else max(due - self.clock(), 0.0))]
            except queue.Empty:
                batch = []  # a retry or the poll of the homes is due
            batch += self._drain()
            try:
                self._handle(batch)
                self.executor.run_due()
                self.executor.poll(idle=self._events.empty())
            except Exception:  # one bad event must not stop the controller
                self.counts["internal_errors"] += 1
                log.exception("handling a batch of %d events failed", len(batch))
            self._publish()
            for _ in batch:
                self._events.task_done()
            if any(isinstance(event, Stop) for event in batch):
                break

    def _drain(self) -> list[Event]:
        """Everything queued behind the first event, up to BATCH_MAX."""
        batch = []
        while len(batch) < BATCH_MAX:
            try:
                batch.append(self._events.get_nowait())
            except queue.Empty:
                break
        return batch

    def _handle(self, batch: list[Event]) -> None:
        self._handle_urgent()
        for event in batch:
            if isinstance(event, Reconnect):
                self.counts["reconnects"] += 1
                if event.found is None:
                    self.executor.replay()
                else:
                    self._adopt(list(event.found), event.lost)
        for event in batch:
            if isinstance(event, Report):
                self._on_report(event.report, event.received)
        mirrors = [event for event in batch if isinstance(event, Mirror)]
        if mirrors:
            self._on_mirrors(mirrors)
        for server in sorted({event.server for event in batch if isinstance(event, Closed)}):
            self._on_closed(server)  # (a duplicate of a close already handled is ignored)

    def _handle_urgent(self) -> None:
        while self._urgent:
            change = self._urgent.popleft()
            self._on_health(change.server, change.change, change.error)

    def _on_report(self, report: MonitorReport, received: float) -> None:
        self.counts["reports"] += 1
        self.last_report, self.last_report_at = report, received
        plan = self.planner.plan(report, self.executor.placements(), self._out(), self.switch_counts.snapshot.rates,
                                 self._recent())
        self.last_plan = plan
        for key, why in plan.home_notes:
            self._decide(Decision.HOME, key, why)
        for key in plan.cools_awaiting_counts:
            self._decide(Decision.HOLD, key, "out of the report's top, kept until the switch has counted its gets "
                                             "(installed or adopted too recently)")
        if plan.held:
            self._decide(Decision.HOLD, None, plan.held)
        self.executor.apply(plan.changes)

    def _recent(self) -> set[bytes]:
        """Hot keys installed or adopted under UNCOUNTED_FOR ago, on a data plane that counts gets: the planner does
        not cool one the switch has no rate of yet on a report alone (the first report after a takeover may miss
        a key still in use, and only the switch can say it is)."""
        if not self.driver.counts_gets:
            return set()
        now = self.clock()
        return {key for key, hot in self.executor.hot_keys() if now - hot.since < UNCOUNTED_FOR}

    def _count_gets(self) -> None:
        """Its own thread (a slow switch never holds up the worker): every COUNT_EVERY seconds, each installed key's
        gets/s as the data plane counted them, for the planner (the truth for those keys; a report is a sample, and
        may be empty or late)."""
        while not self._stop.wait(COUNT_EVERY):
            self._note_gone_switches()
            self._check_macs()
            try:
                counters = self.driver.read_counters()
            except DriverError as err:
                log.warning("switch counters not read (reports alone decide meanwhile): %s", err)
                self.switch_counts.failed(str(err))
                continue
            self.switch_counts.update(counters, self.clock())

    def _read_server_gets(self) -> None:
        """Its own thread (a hung server never delays the switch's counters): each server's cmd_get."""
        while not self._stop.wait(COUNT_EVERY):
            self.server_gets.read()

    def _check_macs(self) -> None:
        """Every server's configured MAC against what the switch saw (controller/mac_check.py): a wrong one is
        queued to the worker as urgently as a server that went down."""
        try:
            sightings = self.driver.server_macs()
        except DriverError as err:
            return log.debug("server MACs not read now: %s", err)
        for server, found in self.macs.update(sightings).items():
            self.submit_health(server, ServerChange.MAC_WRONG, found.describe(server, self.config.servers[server].name))

    def _out(self) -> set[int]:
        """Servers that get no weight: down, or with a wrong MAC."""
        return self.health.down() | set(self.macs.wrong)

    def _note_gone_switches(self) -> None:
        """Warn once when a switch goes (e.g. `mbalancer switch detach` under this controller) and once when it is
        back; /state lists the gone ones."""
        try:
            gone = set(self.driver.switches_gone())
        except DriverError as err:  # a driver that could not ask (a switch agent unreachable, or deposed)
            log.debug("switches gone not known now: %s", err)
            return
        for name in sorted(gone - self._gone):
            log.warning("switch %s is gone (detached or unloaded): its gets are not balanced; waiting for it to be "
                        "loaded again", name)
        for name in sorted(self._gone - gone):
            log.warning("switch %s is back: its tables are filled anew", name)
        self._gone = gone

    def _on_mirrors(self, mirrors: list[Mirror]) -> None:
        """A batch of packets the data plane copied: the keys they write (the latest value of each), and the
        servers they were for (the data plane may have made every hot key there dirty)."""
        writes: dict[bytes, tuple[bytes | None, float]] = {}
        unsure: dict[int, bool] = {}
        closed: set[int] = set()
        for copied in mirrors:
            self.counts["mirrors"] += 1
            mirror = read_mirror(copied.frame, self.server_of_address, self.server_ports, self.streams)
            if mirror.closed:
                self.counts["server_closes"] += 1
                closed.add(mirror.server)
                continue
            if mirror.server is None:
                self.counts["mirrors_unreadable"] += 1
                log.warning("copied packet not for a configured server: ignored")
                continue
            self.executor.count_mirror(mirror.counted_key, mirror.server)  # as the data plane counted it
            if mirror.unreadable is not None:
                self.counts["mirrors_unreadable"] += 1
                log.debug("copied packet for server %d not readable (%s): its hot keys are checked", mirror.server,
                          mirror.unreadable)
                unsure[mirror.server] = True
                continue
            for key, data in mirror.writes:
                if self.executor.home_of(key) != mirror.server:
                    continue  # not hot, or a copy to a replica (the controller's own): the home did not change
                writes[key] = (data, writes[key][1] if key in writes else copied.received)
            unsure[mirror.server] = unsure.get(mirror.server, False) or not mirror.whole
        for server in sorted(closed):
            self._on_closed(server)
        self.executor.sync_batch(writes, unsure, between=self._handle_urgent)

    def _rearm(self, server: int) -> None:
        """A report a predecessor left armed would keep the next unreadable request from being copied."""
        try:
            self.driver.rearm_unsure(server)
        except DriverError as err:
            log.warning("server %d: its unsure report not rearmed (requests nobody can read may wait for the next "
                        "check): %s", server, err)

    def submit_closed(self, server: int) -> None:
        """The data plane counted a close of the server that no copy told of (read with a health probe)."""
        self._events.put(Closed(server))

    def _take_closes_at_start(self, server: int) -> None:
        """Closes the switches counted before this core started and nobody acknowledged (the server closed a
        connection while no controller ran: it may have restarted empty) are handled by the worker as any close;
        with none pending (a normal handover), the closes as they are count as handled: nothing to check."""
        if self.driver.closes_pending(server):
            self.submit_closed(server)  # (no record of its closes until handled: `_on_closed` says why)
        else:
            self._closes_handled[server] = self.driver.server_closes(server)

    def _on_closed(self, server: int) -> None:
        """The data plane saw the server close one of our connections: it may have died or restarted empty, and
        since then balances no get to it and holds its hot keys dirty. Its copies leave rotation (refilled, then
        weighted again), its hot keys are checked at it as their home; then the data plane may balance to it. A
        server whose closes this core has no record of had them pending at start: counted before it started."""
        try:
            seen = self.driver.server_closes(server)
        except DriverError as err:
            return log.warning("server %d closed our connection; its closes not read (it stays out of rotation in "
                               "the data plane until the next one is handled): %s", server, err)
        if seen == self._closes_handled.get(server):
            return  # handled already (its copy and the probe's poll both tell of it)
        before_start = server not in self._closes_handled
        self._take_out_and_check(server)
        try:
            self.driver.closes_handled(server, seen)
            self._closes_handled[server] = seen
        except DriverError as err:
            log.warning("server %d: the data plane did not take the handled closes (it stays out of rotation): %s",
                        server, err)
        if server in self.health.down():  # each probe of a server that is down is refused: said once, when it went
            return log.debug("server %d refused a probe while down: it stays out of rotation", server)
        when = " while no controller was running (before this one started)" if before_start else ""
        self._decide(Decision.SERVER_CLOSED, None, f"server {server} ({self.config.servers[server].name}) closed the "
                                                   f"controller's connection{when} (it may have restarted): weight 0 "
                                                   f"until its copies are refilled; its hot keys checked at it")

    def _take_out_and_check(self, server: int) -> None:
        """The server may have lost what it held: out of rotation until refilled, and its own hot keys checked at it
        (a home that restarted empty makes its keys absent everywhere)."""
        self.executor.server_down(server)
        if server not in self._out():
            self.executor.server_up(server)  # refills it (a server still down is refilled once it is up)
        self.executor.sync_batch({}, {server: True})

    def _on_health(self, server: int, change: ServerChange, error: str | None) -> None:
        name = self.config.servers[server].name
        if change is ServerChange.DOWN:
            self.executor.server_down(server)
            self._decide(Decision.SERVER_DOWN, None, f"server {server} ({name}) failed its probes for "
                                                     f"{self.config.controller.health_hold:g} s: {error}; weight 0")
        elif change is ServerChange.UP and server in self.macs.wrong:
            self._decide(Decision.SERVER_UP, None, f"server {server} ({name}) answers again, but its configured mac is "
                                                   f"wrong: it stays at weight 0")
        elif change is ServerChange.UP:
            self.executor.server_up(server)
            self._decide(Decision.SERVER_UP, None, f"server {server} ({name}) answers again; its copies are refilled, "
                                                   f"then it gets weight")
        elif change is ServerChange.MAC_WRONG:
            self.executor.server_down(server)
            self._decide(Decision.SERVER_MAC, None, error)
        elif change is ServerChange.RESTARTED:
            self._take_out_and_check(server)
            self._decide(Decision.SERVER_RESTARTED, None, f"server {server} ({name}) {error}: weight 0 until its "
                                                          f"copies are refilled")
        if self.last_report is not None:  # the weights now, not at the next report (a replica gets weight only
            placements = self.executor.placements()  # once it holds the value)
            self.executor.apply(self.planner.reweigh(self.last_report, placements, self._out()))

    def _probe(self, server: int) -> None:
        interval = self.config.controller.health_interval
        prober = Prober(self.config.servers[server].address, self.config.controller.health_timeout,
                        self.config.controller.health_udp)
        try:
            while not self._stop.wait(interval):
                self.watch_closes(server)
                sent = self.clock()
                result = prober.check()
                if result is ServerChange.RESTARTED:
                    # it answers, but lost its data: its copies are gone, however fast it was (down before: UP
                    # refills it anyway)
                    back = self.health.record(server, None, sent) is ServerChange.UP
                    self.submit_health(server, ServerChange.UP if back else ServerChange.RESTARTED,
                                       "it restarted or was flushed (a new pid or start time, or a higher cmd_flush)")
                    continue
                change = self.health.record(server, result, sent)
                if change is not None:
                    self.submit_health(server, change, self.health.servers[server].last_error)
        finally:
            prober.close()

    def watch_closes(self, server: int) -> None:
        """With every probe: a close of the server the data plane counted and no copy told of (lost, or a data plane
        that copies none: the OpenFlow key classifier) is handled now; so is one pending at start whose handling
        failed (no record of the server's closes yet)."""
        try:
            seen = self.driver.server_closes(server)
        except DriverError:
            return  # the data plane keeps the server out of rotation meanwhile
        if seen != self._closes_handled.get(server):
            self.submit_closed(server)

    def _renew_lease(self) -> None:
        every = self.config.controller.health_interval
        while not self._stop.wait(every):
            try:
                self.driver.renew_lease(self.config.controller.lease)
            except DriverError as err:
                log.warning("lease not renewed (the switch sends gets home when it runs out): %s", err)

    def _spawn(self, target: Callable[[], None], name: str) -> threading.Thread:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)
        return thread

    def _decide(self, action: Decision, key: bytes | None, reason: str, why: Distrust | None = None) -> None:
        """One entry of the decision log; `why`: a key read back that was not kept as it was (controller/adoption.py),
        as its own field."""
        entry = {"time": round(time.time(), 3), "action": action.value, "key": key_to_text(key) if key else None,
                 "reason": reason}
        if why is not None:
            entry["why"] = why.value
        with self.lock:
            self.decisions.append(entry)
        self.counts[f"decisions_{action.value}"] += 1
        log.log(logging.WARNING if action in WARNED else logging.INFO, "%s %s: %s", action, entry["key"] or "", reason)
        if threading.current_thread() is self._worker and \
                time.perf_counter() - self._published_at >= self._publish_cost / PUBLISH_SHARE:
            self._publish()  # the state moved on (the batch's end publishes it anyway)

    def decisions_made(self) -> list[dict[str, Any]]:
        """The decisions kept (DECISIONS_KEPT), oldest first; from any thread."""
        with self.lock:
            return list(self.decisions)

    # --- output ---------------------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """Everything an operator or a test wants to see, as JSON-ready data; from any thread, without waiting."""
        snapshot = self.published()
        return {"uptime": round(self.clock() - self.started, 3), "driver": self.driver.name,
                **self._switches_gone_state(),
                "config": snapshot["config"], "servers": self._servers_state(snapshot["loads"], snapshot["measured"]),
                **{k: snapshot[k] for k in ("hot_keys", "plan", "retries")},
                "counters": {**snapshot["counters"], "data_plane": self._data_plane_counters()},
                "freshness": self.freshness(), "balance": balance_state(self.spreads()),
                "decisions": self.decisions_made()[-100:]}

    def _switches_gone_state(self) -> dict[str, Any]:
        """The switches the driver finds gone; null, and why, when it cannot ask now (a switch agent out of reach is
        exactly when an operator looks)."""
        try:
            return {"switches_gone": self.driver.switches_gone(), "switches_unknown": None}
        except DriverError as err:
            return {"switches_gone": None, "switches_unknown": str(err)}

    def freshness(self) -> dict[str, Any]:
        """How old the figures are: the last monitor report (its loads, rates, imbalance) and the last read of the
        switch's counters, in seconds (since the start when none came yet), and what is stale: no new one for
        STALE_AFTER of their intervals (the monitor stopped, the switch cannot be read)."""
        now = self.clock()
        report_age = now - (self.last_report_at if self.last_report_at is not None else self.started)
        read_at = self.switch_counts.snapshot.read_at
        counters_age = now - (read_at if read_at is not None else self.started)
        stale = []
        if report_age > STALE_AFTER * self.config.monitor.interval:
            stale.append(f"no monitor report for {report_age:.1f} s: the loads, rates and imbalance shown are from "
                         f"{'the last one' if self.last_report_at is not None else 'none (no monitor has reported)'}")
        if counters_age > STALE_AFTER * COUNT_EVERY:
            stale.append(f"the switch's counters not read for {counters_age:.1f} s")
        return {"last_report_age_s": round(report_age, 3), "counters_age_s": round(counters_age, 3), "stale": stale}

    def spreads(self) -> list[Spread]:
        """gets/s per server as the plan estimates them, as the switch's counters and as the servers' own counts
        measure them, each with its age (controller/measured_balance.py); from any thread, never waits."""
        freshness, snapshot, counts = self.freshness(), self.published(), self.switch_counts.snapshot
        report_age, placements = freshness["last_report_age_s"], snapshot["placements"]
        rates = {key: max(counts.rates.get(key, 0.0), snapshot["key_rates"].get(key, 0.0))  # as the planner ranks
                 for key in placements}  # installed keys (planner.with_switch_rates)
        plan_loads = snapshot["loads"] if snapshot["plan"] is not None else None
        return [plan_spread(plan_loads, report_age, placements, rates),
                switch_spread(snapshot["measured"], placements, counts, max(report_age, freshness["counters_age_s"]),
                              self.driver.counts_gets),
                self.server_gets.spread() if self.server_gets is not None else
                Spread(SERVERS, None, unavailable="not read: this controller does not probe its servers")]

    def published(self) -> dict[str, Any]:
        """The worker's state as it last published it (see _publish); from any thread, never waits."""
        return self._snapshot

    def _publish(self) -> None:
        """The worker's state as JSON-ready data, for state() (only the worker calls this)."""
        started = time.perf_counter()
        self._snapshot = {
            "config": {"hot": self.config.balancing.hot, "target": self.config.balancing.target,
                       "groups": [list(g) for g in self.planner.groups], "mode": self.config.balancing.mode,
                       "hysteresis": self.config.balancing.hysteresis, "hash": self.config.balancing.hash},
            "loads": list(self.last_plan.loads) if self.last_plan else [0.0] * len(self.config.servers),
            "measured": self.planner.homes.measured_loads(self.last_report) if self.last_report else None,
            "placements": self.executor.placements(),
            "key_rates": {entry.key: entry.rate for entry in self.last_report.top} if self.last_report else {},
            "hot_keys": [self._hot_key_state(k, hot) for k, hot in self.executor.hot_keys()],
            "plan": self._plan_state(),
            "retries": [{"action": r.action, "key": key_to_text(r.key), "server": r.server,
                         "attempt": r.attempt, "error": r.last_error} for r in self.executor.pending_retries()],
            "counters": self._counters_state(),
        }
        self._published_at = time.perf_counter()
        self._publish_cost = self._published_at - started

    def _servers_state(self, loads: list[float], measured: list[float] | None) -> list[dict[str, Any]]:
        """Per server: health, the load the plan works with (measured and rebalanced, or estimated), and the gets
        the clients sent it in the last report (null when the monitor does not say)."""
        return [{"index": i, "name": s.name, "ip": s.ip, "mac": s.mac, "port": s.port, "up": h.up,
                 "failed_probes": h.failures, "last_error": h.last_error, "estimated_gets_per_s": round(load, 1),
                 "measured_gets_per_s": round(measured[i], 1) if measured else None, "mac_check": self.macs.state(i)}
                for i, (s, h, load) in enumerate(zip(self.config.servers, self.health.servers, loads))]

    def _hot_key_state(self, key: bytes, hot: HotKey) -> dict[str, Any]:
        p = hot.placement
        return {"key": key_to_text(key), "home": p.home, "group": p.group, "rate": round(p.rate, 1),
                "replicas": [{"server": r.server, "weight": round(r.weight, 4), "holds_value": r.server in hot.holding}
                             for r in hot.weights()],
                "state": hot.state.value, "dirty": hot.dirty, "since": round(hot.since - self.started, 3),
                "syncs": hot.syncs, "last_sync_ms": hot.last_sync_ms}

    def _plan_state(self) -> dict[str, Any] | None:
        if self.last_plan is None:
            return None
        return {"hot_target": self.last_plan.hot_target, "imbalance_now": round(self.last_plan.imbalance_now, 4),
                "imbalance_predicted": round(self.last_plan.imbalance_predicted, 4),
                "imbalance_without": round(self.last_plan.imbalance_without, 4),
                "predicted_gets_per_s": [round(x, 1) for x in self.last_plan.predicted_loads],
                "loads": "measured" if self.last_plan.measured else "estimated (cold keys assumed even)",
                "held": self.last_plan.held}

    def _counters_state(self) -> dict[str, Any]:
        return {**self.counts, "copies": self.replicator.copies, "bytes_copied": self.replicator.bytes_copied,
                "copy_failures": self.replicator.failures, "mirrors_lost": self.executor.mirrors_lost,
                "writes_found_by_polling": self.executor.unseen_writes,
                "cas_moves": self.executor.cas_moves, "settled_alone": dict(self.executor.settled_alone),
                "stream_boundaries_proven": self.streams.resumed, "stream_segments_lost": self.streams.lost,
                "streams_blind": self.streams.blinded,
                "sync_ms": self.executor.sync_times.summary()}

    def _data_plane_counters(self) -> dict[str, Any]:
        try:
            counters = self.driver.read_counters()
        except DriverError as err:
            return {"error": str(err)}
        return {"unparsed": counters.unparsed, "unsure": counters.unsure, "switch": counters.switch, "keys": {
            key_to_text(k): {"gets": c.gets, "home_while_dirty": c.home_while_dirty, "mirrored": c.mirrored,
                             "per_replica": {str(s): n for s, n in c.per_replica.items()}}
            for k, c in counters.keys.items()}}
