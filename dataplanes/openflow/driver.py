"""The OpenFlow driver: the core's requests as the key classifier's maps plus OpenFlow rules on Open vSwitch.

Two halves (dataplanes/openflow/ says why): the key classifier is the BPF program in classifier mode, with the
same maps as the eBPF switch, so its slot, write-stamp, dirty and lease bookkeeping is the shared one
(the slot book over BPF maps, dataplanes/bpf/key_tables.py and maps_driver.py); the switch half is OpenFlow rules
(dataplanes/openflow/messages.py) sent through a Channel, which the Ryu app (controller/ryu_app.py) implements over
Ryu's datapath connections.

Why the dirty state stays in the classifier, not in an OpenFlow `learn` rule: measured on OVS 3.1's userspace
datapath, a write's learned "gets go home" flow took effect for the next get in 99 of 100 tries; the datapath's
flow cache kept sending the 100th to the replica (the learned flow was there, the cached decision was older).
The classifier marks a get clean or dirty in the same map update a write makes, so no get after a write is tagged
for balancing. OpenFlow does the rest: the replica choice (a select group per hot key), the rewrites, the copy to
the controller (PacketIn -> on_mirror), the replies' source, L2, and the per-replica counters (bucket stats).
The servers' MACs (controller/mac_check.py) come from both halves: the MACs the classifier saw each server's TCP
segments come from, and the balanced gets the switch flooded to each server's configured MAC (a flow per server).

Order that keeps gets correct: a key's group and flow are live (barrier) before the core can clear it, since the
classifier only tags clean keys; on removal the classifier stops tagging first, then the rules go.

Taking over (a new leader, or an agent's controller whose stream came back): the classifier's keys are read back
(dataplanes/read_back.py) and so are every switch's flows and groups (flow and group desc). A key whose group (its
buckets' replicas, ids, actions, selection method, weights within WEIGHT_SLACK) and flow agree with its classifier
entry on every switch is kept: nothing of it is written. One whose rules disagree, or are missing, is not trusted
(Distrust.RULES_DISAGREE, logged with why): the classifier stops tagging its gets, its rules go, and the core rebuilds
it alone. A switch that connects later (first time, or after a restart that emptied it) is read back the same way
and gets what it lacks, or holds otherwise, from the driver's record, and loses what the record has not; the
classifier's state did not change, so the core has nothing to redo.
"""
from __future__ import annotations

import logging
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol, Sequence

from dataplanes.bpf.key_tables import KeyTables, resolve_trusted
from dataplanes.bpf.maps_driver import BpfMapsDriver
from dataplanes.slot_book_driver import WATCH_EVERY
from dataplanes.bpf.program import CLASSIFIER, bpffs_problem
from dataplanes.driver import (RULES_REMOVED, Counters, Distrust, Driver, DriverError, FoundKey, MacSighting,
                               MirrorHandler, ReconnectHandler, ReplicaWeight)
from dataplanes.openflow import SELECTIONS, Settings, messages
from dataplanes.openflow.weights import bucket_weights
from mbalancer.settings import Server

log = logging.getLogger(__name__)
DATAPATH_SETTLE = 0.05  # seconds OVS's datapath may keep using a cached bucket after the group changed
# OVS weight units (of 65535) a group read back may differ by from the one its key's classifier entry gives: the entry
# holds each share rounded to 1/65536, and the weights solved again from those may move by a unit or two
WEIGHT_SLACK = 64


class Channel(Protocol):
    """How the driver reaches its switches (the Ryu app implements it)."""

    def switches(self) -> list[Any]:
        """The connected datapaths."""

    def send(self, dp: Any, batch: Sequence[Any]) -> None:
        """Send, then wait for a barrier; raise DriverError if the switch refused any of them or did not answer."""

    def ask(self, dp: Any, request: Any) -> list[Any]:
        """A multipart request's replies (DriverError if none came)."""

    def close(self) -> None:
        """The driver is done with the switches."""


def driver_from_settings(settings: Settings) -> "OpenflowDriver":
    """The registry's factory: the bridge at `connect`, driven directly (dataplanes/openflow/bridge_connection.py).
    Without `connect` the switches connect to ryu-manager, so the driver runs inside it (controller/ryu_app.py)."""
    if not settings.connect:
        raise DriverError("the OpenFlow data plane is driven from inside ryu-manager (`mbalancer-ryu-manager "
                          "--mbalancer-config FILE controller/ryu_app.py`), or directly on the switch's box with "
                          "dataplane.openflow.connect (docs/dataplanes/openflow.md)")
    from dataplanes.openflow import port_flags
    from dataplanes.openflow.bridge_connection import BridgeConnection
    bridge = BridgeConnection(settings.connect, port_flags.parse(settings.port_flags))
    driver = OpenflowDriver(settings, bridge)
    bridge.start(on_connect=driver.switch_connected, on_packet_in=driver.packet_in)
    return driver


class OpenflowDriver(BpfMapsDriver):
    name = "openflow"
    thread_name = "mbalancer-classifier"

    def __init__(self, settings: Settings, channel: Channel):
        if settings.selection not in SELECTIONS:
            raise DriverError(f"dataplane.openflow.selection: one of {', '.join(SELECTIONS)} "
                              f"(got {settings.selection!r})")
        if settings.port_flags and not settings.connect:
            raise DriverError("dataplane.openflow.port_flags: set by a direct connection to the bridge (connect, as "
                              "the switch agent has); under ryu-manager set them with ovs-ofctl")
        pin = CLASSIFIER.pin_root / settings.classifier
        if problem := bpffs_problem():
            raise DriverError(problem)
        if not (pin / "prog").exists():
            raise DriverError(f"no key classifier named {settings.classifier} is loaded (nothing at {pin}): start "
                              f"the OpenFlow topology, or load the classifier on your switch's links first")
        trusted = resolve_trusted(settings.trusted, "dataplane.openflow.trusted")
        super().__init__(KeyTables([pin], "OpenFlow key classifier", trusted))
        self.settings = settings
        self.channel = channel
        self.buckets: dict[int, list[tuple[int, int, int]]] = {}  # slot -> (position, server, OVS weight): the record
        self._switch_lock = threading.RLock()  # one change at a time on the wire, in the record's order
        # switch (datapath id) -> each server's flood rule count when this driver last wrote that switch's rules: the
        # gets flooded before (another controller's, or before a restart) are not this configuration's to judge
        self._floods_before: dict[int, list[int]] = {}

    def owned_switches(self) -> list[str]:
        return [f"openflow-classifier:{self.settings.classifier}"]

    # --- the switch half ----------------------------------------------------------------------------------------
    def attach(self, servers: Sequence[Server], on_mirror: MirrorHandler,
               on_reconnect: ReconnectHandler | None = None) -> list[FoundKey]:
        found = super().attach(servers, on_mirror, on_reconnect)
        with self._switch_lock:  # keys read back from the classifier: their groups as its weights say
            for key in found:
                if key.distrust not in RULES_REMOVED:
                    self.buckets[self.book.slot_of(key.key)] = self._buckets(key.replicas)
            switches = self.channel.switches()  # connected before the core started
            held = {id(dp): self._read_switch(dp) for dp in switches}
            disagree = self._disagreeing(switches, held)
            found = [self._distrusted(key, disagree[self.book.slot_of(key.key)])
                     if key.distrust not in RULES_REMOVED and self.book.slot_of(key.key) in disagree else key
                     for key in found]
            for dp in switches:
                self._reconcile(dp, held[id(dp)])
        return found

    def switch_connected(self, dp: Any) -> None:
        """A switch (re)connected: what it holds is read back and compared with the record; what agrees stays as it
        is (no flow or group written), the rest is written (all of it, for a switch that restarted empty)."""
        if not self.servers:
            return  # not attached yet: attach reads it
        with self._switch_lock:
            self._reconcile(dp, self._read_switch(dp))

    # --- a switch's rules read back and compared with the record -------------------------------------------------
    def _read_switch(self, dp: Any) -> Held | None:
        """Every flow and group the switch holds; None (logged) if it did not say: then it is written whole."""
        try:
            return Held(messages.held_flows(self.channel.ask(dp, messages.flow_descs(dp))),
                        messages.held_groups(self.channel.ask(dp, messages.group_descs(dp))))
        except DriverError as err:
            log.warning("switch %s: its flows and groups not read back (%s): every rule written again", _dpid(dp),
                        err)
            return None

    def _disagreeing(self, switches: Sequence[Any], held: dict[int, "Held | None"]) -> dict[int, str]:
        """The slots whose group or flow in a switch is not what the key's classifier entry says, with why; for the
        others, the record takes the weights the switches hold (solved again from the entry's rounded shares, they
        may differ by a unit or two from those first sent)."""
        disagree: dict[int, str] = {}
        for slot, buckets in list(self.buckets.items()):
            for dp in switches:
                rules = held[id(dp)]
                if rules is None:
                    continue
                expected = messages.group_of(self._group(dp, slot, buckets, add=True)[0])
                expected_flow = messages.flow_of(messages.hot_flow(dp, slot)[0])
                group, flow = rules.groups.get(expected.group_id), rules.flows.get(expected_flow.key)
                if group is None or flow is None:
                    disagree[slot] = f"switch {_dpid(dp)} holds no {'group' if group is None else 'flow'} for it"
                elif flow.does != expected_flow.does:
                    disagree[slot] = f"switch {_dpid(dp)}'s flow for it does not send its gets to its group"
                elif not group.same(expected, WEIGHT_SLACK):
                    disagree[slot] = (f"switch {_dpid(dp)}'s group has buckets {_buckets_of(group)}, its classifier "
                                      f"entry says {_buckets_of(expected)}")
                else:
                    weights = {b.position: b.weight for b in group.buckets}
                    self.buckets[slot] = [(p, s, weights[p]) for p, s, _ in buckets]
                if slot in disagree:
                    break
        return disagree

    def _distrusted(self, key: FoundKey, why: str) -> FoundKey:
        """A key whose switch rules disagree with its classifier entry: the classifier stops tagging its gets (its
        rules go from the switches with the rest of what no key of the record owns), and the core rebuilds it."""
        log.warning("%r read back, not trusted: %s; its rules removed, it is rebuilt", key.key, why)
        slot = self.book.slot_of(key.key)
        self.book.remove_hot_key(key.key)
        self.buckets.pop(slot, None)
        return FoundKey(key.key, key.home, key.replicas, None, Distrust.RULES_DISAGREE)

    def _reconcile(self, dp: Any, held: "Held | None") -> None:
        """Write what the switch lacks or holds otherwise, remove what the record has not: groups first (flows point
        to them), removals last. A switch not read back gets everything, its tables emptied first."""
        flows = messages.base_pipeline(dp)[2:] + messages.server_rules(dp, self.servers)
        groups = {}
        for slot, buckets in self.buckets.items():
            flows += messages.hot_flow(dp, slot)
            groups[messages.group_id(slot)] = buckets, slot
        if held is None:
            batch = messages.base_pipeline(dp)[:2] + [m for b, slot in groups.values()
                                                      for m in self._group(dp, slot, b, add=True)] + flows
            kept = ""
        else:
            wanted = {messages.flow_of(m).key: m for m in flows}
            write_groups = [m for number, (b, slot) in groups.items()
                            for m in self._group(dp, slot, b, add=number not in held.groups)
                            if number not in held.groups or not held.groups[number].same(
                                messages.group_of(m), WEIGHT_SLACK)]
            write_flows = [m for key, m in wanted.items()
                           if key not in held.flows or held.flows[key].does != messages.flow_of(m).does]
            removals = [messages.delete_flow(dp, f) for key, f in held.flows.items() if key not in wanted] + \
                [messages.delete_group(dp, number) for number in held.groups if number not in groups]
            batch = write_groups + write_flows + removals
            kept = (f"{len(wanted) - len(write_flows)} flows and {len(groups) - len(write_groups)} groups kept as "
                    f"they were, ")
        if batch:
            try:
                self.channel.send(dp, messages.atomic(dp, batch))  # no packet finds the tables half written
            except DriverError as err:
                log.warning("switch %s: the rules were not all taken (%s)", _dpid(dp), err)
                return
        try:
            self._floods_before[dp.id] = self._floods_of(dp)
        except DriverError:  # taken at the first read of the servers' MACs instead
            self._floods_before.pop(dp.id, None)
        log.info("switch %s connected: %s%d rules written; pipeline, %d server rules and %d hot keys installed",
                 _dpid(dp), kept, len(batch), len(self.servers), len(self.buckets))

    def packet_in(self, frame: bytes) -> None:
        """A copy the switch sent up (COPY tag): a mirrored write or an unsure request."""
        if self.on_mirror is None or frame[12:14] != b"\x08\x00":
            return
        self._deliver(frame)

    # --- the driver interface: classifier first or last, as the order above says -------------------------------
    def install_hot_key(self, key: bytes, home: int, replicas: Sequence[ReplicaWeight]) -> None:
        buckets = self._buckets(replicas)
        with self._switch_lock:
            self.book.install_hot_key(key, home, replicas)  # held dirty: nothing tagged for balancing yet
            slot = self.book.slot_of(key)
            try:
                self._send_all(lambda dp, m: m.remove_hot(dp, slot) + self._group(dp, slot, buckets, add=True)
                               + m.hot_flow(dp, slot))
            except DriverError:
                self.book.remove_hot_key(key)
                raise
            self.buckets[slot] = buckets

    # a key's group and flow go out per key: many keys are installed and removed one by one
    install_hot_keys = Driver.install_hot_keys
    remove_hot_keys = Driver.remove_hot_keys

    def set_weights(self, key: bytes, replicas: Sequence[ReplicaWeight]) -> None:
        buckets = self._buckets(replicas)
        with self._switch_lock:
            slot = self.book.slot_of(key)
            dropped = {s for _, s, _ in self.buckets.get(slot, [])} - {s for _, s, _ in buckets}
            with self._held(slot, bool(dropped)):
                self._send_all(lambda dp, m: self._group(dp, slot, buckets, add=False))
            self.book.set_weights(key, replicas)
            self.buckets[slot] = buckets

    @contextmanager
    def _held(self, slot: int, hold: bool):
        """While a replica leaves a group: the key held dirty in the classifier until the switch's datapath has
        dropped its cached choices (a barrier confirms the group, not the flow cache), then the synced counts put
        back as they were, so a write counted meanwhile still keeps it dirty."""
        if not hold:
            yield
            return
        synced = self.book.hold_slot(slot)
        try:
            yield
            time.sleep(DATAPATH_SETTLE)
        finally:
            try:
                self.book.restore_synced(slot, synced)
            except DriverError as err:  # left held: safe, the core's next clear settles it
                log.warning("slot %d stays dirty after its group changed: %s", slot, err)

    def remove_hot_key(self, key: bytes) -> None:
        with self._switch_lock:
            slot = self.book.slot_of(key)
            self.book.remove_hot_key(key)  # the classifier stops tagging its gets: they go home from now on
            self.buckets.pop(slot, None)
            try:
                self._send_all(lambda dp, m: m.remove_hot(dp, slot))
            except DriverError as err:  # no get is tagged for it any more: the rules are merely unused
                log.warning("rules of %r not removed from a switch (%s); unused, replaced at its next install", key,
                            err)

    def read_counters(self) -> Counters:
        """The classifier's counts, plus gets per replica from the groups' bucket counters (listed in bucket order)."""
        counters = self.book.read_counters()
        with self._switch_lock:
            keys = {slot: key for key, slot in self.book.slots.items()}
            buckets = dict(self.buckets)
        for dp in self.channel.switches():
            for reply in self.channel.ask(dp, messages.group_stats(dp)):
                for group in reply.body:
                    slot = group.group_id - 1
                    if keys.get(slot) not in counters.keys:
                        continue
                    per_replica = counters.keys[keys[slot]].per_replica
                    for (_, server, _), bucket in zip(buckets.get(slot, []), group.bucket_stats):
                        per_replica[server] = per_replica.get(server, 0) + bucket.packet_count
        return counters

    def server_macs(self) -> list[MacSighting]:
        """The MACs the classifier saw each server's TCP segments come from (since its entry was written), and the
        balanced gets to it that the switches flooded since this driver wrote their rules (its L2 flood rule's
        packets, summed over the switches)."""
        seen = self.book.server_macs()
        flooded = [0] * len(seen)
        for dp in self.channel.switches():
            now = self._floods_of(dp)
            with self._switch_lock:
                before = self._floods_before.setdefault(dp.id, now)
                if any(n < b for n, b in zip(now, before)):  # its flows were written anew (a restart): counting afresh
                    before = self._floods_before[dp.id] = [0] * len(now)
            flooded = [total + n - b for total, n, b in zip(flooded, now, before)]
        return [MacSighting(s.seen, n) for s, n in zip(seen, flooded)]

    def _floods_of(self, dp: Any) -> list[int]:
        """Each server's flood rule count on one switch."""
        return messages.flooded_counts(self.channel.ask(dp, messages.flooded_stats(dp)), self.servers)

    def close(self) -> None:
        super().close()  # the lease ends in the classifier first: every get goes home, whatever the rules say
        self.channel.close()

    def let_go(self) -> None:
        super().let_go()
        self.channel.close()

    # --- the classifier half, as BpfMapsDriver has it, but for its reloads ------------------------------------
    def _watch(self) -> None:
        while not self._stop.wait(WATCH_EVERY):
            self._reloaded()

    def _forget_switch_state(self) -> None:
        """A reloaded classifier has empty maps: the groups' record goes too (the core installs every key again)."""
        with self._switch_lock:
            self.buckets = {}

    # --- inside -------------------------------------------------------------------------------------------------
    def _buckets(self, replicas: Sequence[ReplicaWeight]) -> list[tuple[int, int, int]]:
        """(position, server, OVS weight) for each replica with a positive share: no bucket for the others."""
        live = [(position, r) for position, r in enumerate(replicas) if r.weight > 0]
        if not live:
            raise DriverError("no replica has a positive weight")
        shares = [r.weight for _, r in live]
        weights = (bucket_weights(shares) if self.settings.selection != "dp_hash"
                   else [max(1, round(65535 * s / max(shares))) for s in shares])  # dp_hash: proportional
        return [(position, r.server, w) for (position, r), w in zip(live, weights)]

    def _group(self, dp: Any, slot: int, buckets: list[tuple[int, int, int]], add: bool) -> list:
        return messages.hot_group(dp, slot, [(p, self.servers[s], w) for p, s, w in buckets],
                                  self.settings.selection, add)

    def _send_all(self, build) -> None:
        for dp in self.channel.switches():
            self.channel.send(dp, build(dp, messages))


@dataclass(frozen=True)
class Held:
    """What one switch holds, read back."""
    flows: dict[messages.FlowKey, messages.Flow]
    groups: dict[int, messages.Group]


def _dpid(dp: Any) -> str:
    return f"{getattr(dp, 'id', 0):016x}"


def _buckets_of(group: messages.Group) -> str:
    return "[" + ", ".join(f"{b.position}: weight {b.weight}" for b in group.buckets) + "]"
