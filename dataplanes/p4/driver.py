"""The P4Runtime driver: the controller core's requests as P4Runtime writes to bmv2 switches running
p4src/mbalancer.p4 (dataplanes/p4/).

Each switch gets the pipeline at attach (a switch that already ran it is first read for the hot keys a previous
controller left: they are reported, and the fresh pipeline holds none). Every hot-key request is written to every
switch. A hot key is a `hot_keys` entry (slot, home), its weights `replicas` entries (a range of the request hash
per replica), its synced counts a `synced` entry (none: held dirty). The data plane counts writes per slot and
unsure requests per server in registers, which P4Runtime cannot read; each has a twin counter (key_mirrored,
server_unsure) that the stamp reads. The lease is renewed by a PacketOut (the switch adds it to its own clock).
Mirrored writes arrive as PacketIns on the stream. A switch whose stream breaks (stopped, restarted) is
reconnected by the driver's thread: the pipeline goes back on every switch, the driver forgets its slots and asks
the core to install everything again.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Sequence

from dataplanes.driver import (Counters, Driver, DriverError, ForwardingEntry, KeyCounters, LeftoverKey,
                               MirrorHandler, ReconnectHandler, ReplicaWeight, WriteStamp)
from dataplanes.p4 import Settings
from dataplanes.p4 import entries as e
from dataplanes.p4.client import P4RuntimeClient
from dataplanes.p4.pipeline import P4Error, Pipeline
from dataplanes.pipeline import COUNTERS, MAX_HOT, MAX_KEY, MAX_REPLICAS, cumulative_weights, own_addresses
from mbalancer.settings import Server

log = logging.getLogger(__name__)
RECONNECT_EVERY = 0.5  # seconds between tries to reach a switch whose stream broke


def driver_from_settings(settings: Settings) -> "P4RuntimeDriver":
    """The registry's factory."""
    try:
        return P4RuntimeDriver(settings, Pipeline())
    except P4Error as err:
        raise DriverError(str(err)) from None


class P4RuntimeDriver(Driver):
    name = "p4runtime"
    max_replicas = MAX_REPLICAS

    def __init__(self, settings: Settings, pipeline: Pipeline):
        if not settings.switches:
            raise DriverError("no P4Runtime switch given ([dataplane.p4] switches, or --switch HOST:PORT)")
        self.settings, self.pipeline = settings, pipeline
        self.servers: tuple[Server, ...] = ()
        self.clients: list[P4RuntimeClient] = []
        self.on_mirror: MirrorHandler | None = None
        self.on_reconnect: ReconnectHandler | None = None
        self.lease_us = 0
        self.reconnects = 0
        self.forwarding: dict[str, int] = {}  # destination MAC -> port, as written
        self._reset_slots()
        self._lock = threading.RLock()  # the core's worker, the HTTP threads (counters), the reconnect thread
        self._down: set[int] = set()  # switches whose stream broke
        self.election_id = time.time_ns() // 1000  # P4Runtime arbitration: the newest controller is primary
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        packet_out = pipeline.packet_metadata.get("packet_out", {})
        if set(packet_out) != {"op", "lease_us"}:
            raise DriverError(f"the compiled program's packet_out has {sorted(packet_out)}, not op and lease_us")
        self._op, self._lease = packet_out["op"], packet_out["lease_us"]

    # --- the interface --------------------------------------------------------------------------------------
    def attach(self, servers: Sequence[Server], on_mirror: MirrorHandler,
               on_reconnect: ReconnectHandler | None = None) -> list[LeftoverKey]:
        self.servers = tuple(servers)
        self.on_mirror, self.on_reconnect = on_mirror, on_reconnect
        leftovers: dict[bytes, LeftoverKey] = {}
        with self._lock:
            try:
                for index, address in enumerate(self.settings.switches):
                    client = self._client(index, address)
                    self.clients.append(client)
                    leftovers.update({k.key: k for k in self._prepare(client)})
            except P4Error as err:
                self._close_clients()
                raise DriverError(str(err)) from None
        if leftovers:
            log.warning("removed %d hot keys a previous controller left in the switches: their gets go home",
                        len(leftovers))
        self._thread = threading.Thread(target=self._reconnect_loop, name="mbalancer-p4runtime", daemon=True)
        self._thread.start()
        return list(leftovers.values())

    def install_hot_key(self, key: bytes, home: int, replicas: Sequence[ReplicaWeight]) -> None:
        with self._lock:
            if key in self.slots:
                raise DriverError(f"{key!r} is already installed")
            if not 1 <= len(key) <= MAX_KEY:
                raise DriverError(f"key of {len(key)} bytes: the P4 data plane takes 1 to {MAX_KEY}")
            if not self.free_slots:
                raise DriverError(f"all {MAX_HOT} hot-key slots are in use")
            servers, ranges = self._check_replicas(replicas), self._ranges(replicas)
            slot = self.free_slots.pop()
            try:
                # the slot's write count before this key (the twin of a register nobody can reset); the other
                # counters of the slot start again from 0
                bases = tuple(self._count(c, "key_mirrored", slot) for c in self.clients)
                self._write_all(self._counter_resets(slot), f"reset the counters of slot {slot}")
                self._write_all([*self._range_updates(slot, (), ranges, servers),
                                 e.update(e.INSERT, self._hot_entry(key, slot, home))], f"install {key!r}")
            except (DriverError, P4Error) as err:
                self._write_all([*self._delete_updates(key, slot), *self._range_updates(slot, ranges, (), servers)],
                                f"undo {key!r}", quiet=True)
                self.free_slots.append(slot)
                raise DriverError(str(err)) from None
            self.slots[key], self.homes[key], self.key_servers[key] = slot, home, servers
            self.write_bases[key], self.ranges[key] = bases, ranges

    def set_weights(self, key: bytes, replicas: Sequence[ReplicaWeight]) -> None:
        with self._lock:
            slot = self._slot(key)
            servers = self._check_replicas(replicas)
            if servers != self.key_servers[key]:
                raise DriverError(f"weights of {key!r}: the replica set changed ({servers} vs "
                                  f"{self.key_servers[key]})")
            old, new = self.ranges[key], self._ranges(replicas)
            try:
                self._write_all(self._range_updates(slot, old, new, servers), f"weights of {key!r}")
            except DriverError:  # bmv2 applies a batch update by update: put back what was there
                self._write_all(self._range_updates(slot, new, old, servers), f"restore {key!r}", quiet=True)
                raise
            self.ranges[key] = new

    def remove_hot_key(self, key: bytes) -> None:
        with self._lock:
            slot = self._slot(key)
            self._write_all(self._delete_updates(key, slot), f"remove {key!r}")
            for table in (self.slots, self.homes, self.key_servers, self.write_bases, self.ranges):
                table.pop(key, None)
            self.synced.discard(slot)
            self.free_slots.append(slot)

    def set_dirty(self, key: bytes) -> None:
        with self._lock:
            slot = self._slot(key)
            if slot in self.synced:
                self._write_all([e.update(e.DELETE, self._synced_entry(slot))], f"hold {key!r} dirty")
                self.synced.discard(slot)

    def write_stamp(self, key: bytes) -> WriteStamp:
        with self._lock:
            slot, home = self._slot(key), self.homes[key]
            try:
                counts = tuple((self._count(c, "key_mirrored", slot), self._count(c, "server_unsure", home))
                               for c in self.clients)
            except P4Error as err:
                raise DriverError(f"write counts of {key!r}: {err}") from None
            return WriteStamp(sum(w for w, _ in counts) - sum(self.write_bases[key]), counts)

    def clear_dirty(self, key: bytes, stamp: WriteStamp) -> None:
        with self._lock:
            slot = self._slot(key)
            if len(stamp.counts) != len(self.clients):
                raise DriverError(f"clear {key!r}: the stamp is from before a switch was reconnected")
            kind = e.MODIFY if slot in self.synced else e.INSERT
            for client, (writes, unsure) in zip(self.clients, stamp.counts):
                self._write(client, [e.update(kind, self._synced_entry(slot, writes, unsure))], f"clear {key!r}")
            self.synced.add(slot)

    def renew_lease(self, seconds: float) -> None:
        with self._lock:
            self.lease_us = min(int(seconds * 1e6), (1 << 32) - 1) if seconds > 0 else 0
            try:
                for index, client in enumerate(self.clients):
                    if index not in self._down:
                        self._send_lease(client)
            except P4Error as err:
                raise DriverError(f"lease: {err}") from None

    def set_forwarding(self, entries: Sequence[ForwardingEntry]) -> None:
        with self._lock:
            wanted = {}
            for entry in entries:
                if not entry.port.isdigit():
                    raise DriverError(f"forwarding of {entry.mac}: a bmv2 port is a number (got {entry.port!r})")
                wanted[entry.mac.lower()] = int(entry.port)
            self._write_all(self._forwarding_updates(self.forwarding, wanted), "forwarding")
            self.forwarding = wanted

    def read_counters(self) -> Counters:
        counters = Counters()
        with self._lock:
            try:
                for index, client in enumerate(self.clients):
                    if index not in self._down:
                        self._add_counts(index, client, counters)
            except P4Error as err:
                raise DriverError(f"reading counters: {err}") from None
        return counters

    def switch_counters(self) -> list[dict[str, int]]:
        """Each switch's own counters (packets, balanced, mirrored, ...)."""
        with self._lock:
            return [self._switch_counts(c) for c in self.clients]

    def dirty(self, key: bytes) -> bool:
        """Whether the data plane sends the key's gets home now (its counts differ from the synced ones, or it is
        held): the data plane's own test, recomputed from the twin counters."""
        with self._lock:
            slot = self._slot(key)
            if slot not in self.synced:
                return True
            synced = self.read_synced(slot)
            return any(s != (self._count(c, "key_mirrored", slot), self._count(c, "server_unsure", self.homes[key]))
                       for c, s in zip(self.clients, synced))

    def read_synced(self, slot: int) -> list[tuple[int, int] | None]:
        """Each switch's `synced` entry of the slot: (writes, unsure), None where there is none."""
        found = []
        for client in self.clients:
            read = client.read([self._synced_entry(slot)], "synced")
            params = [{p.param_id: int.from_bytes(p.value, "big") for p in r.table_entry.action.action.params}
                      for r in read]
            written, unsure = (self.pipeline.action("synced_to").params[n][0] for n in ("written", "unsure_count"))
            found.append((params[0][written], params[0][unsure]) if params else None)
        return found

    def close(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=2)
        with self._lock:
            self.lease_us = 0
            for index, client in enumerate(self.clients):
                if index not in self._down:
                    try:
                        self._send_lease(client)  # gets go home: nobody keeps the copies fresh any more
                    except P4Error as err:  # the switch is gone already: nothing left to balance
                        log.info("lease not ended: %s", err)
            self._close_clients()

    # --- the switches ---------------------------------------------------------------------------------------
    def _client(self, index: int, address: str) -> P4RuntimeClient:
        client = P4RuntimeClient(address, self.settings.device_id, self.settings.timeout,
                                 on_packet=self._packet_in, on_down=lambda: self._mark_down(index),
                                 election_id=self.election_id)
        client.connect()
        return client

    def _prepare(self, client: P4RuntimeClient) -> list[LeftoverKey]:
        """Read what a previous controller left, push the pipeline, write what the driver owns there."""
        cookie = client.pipeline_cookie()
        leftovers = self._leftovers(client) if cookie == self.pipeline.cookie else []
        flood = self.settings.ports or (self._flood_ports(client) if cookie is not None else ()) or range(1, 17)
        if leftovers:  # their rules go first: bmv2 swaps a pushed pipeline in only between packets, later
            client.write([e.update(e.DELETE, e.table_entry(
                self.pipeline, "hot_keys", {"meta.key_len": len(k.key), "meta.key": e.key_value(k.key)}))
                for k in leftovers], "removing the hot keys left")
        if cookie is not None:
            self._remove_sessions(client)
        client.set_pipeline(self.pipeline)
        updates = [e.update(e.INSERT, e.clone_session(self.settings.cpu_port)),
                   e.update(e.INSERT, e.flood_group(flood))]
        for port in sorted({s.port for s in self.servers}):
            updates.append(e.update(e.INSERT, e.table_entry(self.pipeline, "memcached_ports", {"hdr.ports.dst": port},
                                                            "is_memcached")))
            updates.append(e.update(e.INSERT, e.table_entry(self.pipeline, "reply_ports", {"hdr.ports.src": port},
                                                            "NoAction")))
        for index, server in enumerate(self.servers):
            updates.append(e.update(e.INSERT, e.table_entry(
                self.pipeline, "servers", {"meta.server_wanted": index}, "server_address",
                {"mac": e.mac_value(server.mac), "ip": e.ip_value(server.ip), "port": server.port})))
            updates.append(e.update(e.INSERT, e.table_entry(
                self.pipeline, "server_index", {"hdr.ipv4.dst": e.ip_value(server.ip), "hdr.ports.dst": server.port},
                "server_is", {"server": index})))
        for ip in sorted(own_addresses(self.servers) | set(self.settings.trusted)):
            updates.append(e.update(e.INSERT, e.table_entry(self.pipeline, "trusted_sources",
                                                            {"hdr.ipv4.src": e.ip_value(ip)}, "is_trusted")))
        updates += self._forwarding_updates({}, self.forwarding)
        client.write(updates, "the switch's servers, ports and sessions")
        if self.lease_us:
            self._send_lease(client)
        return leftovers

    def _flood_ports(self, client: P4RuntimeClient) -> list[int]:
        """The ports of the switch's flood group as it has it (its start wrote it: in a fabric, a flood tree)."""
        try:
            found = client.read([e.flood_group(())], "the flood group")
        except P4Error:
            return []
        return [r.egress_port for g in found for r in g.packet_replication_engine_entry.multicast_group_entry.replicas]

    def _remove_sessions(self, client: P4RuntimeClient) -> None:
        """Delete the flood group and clone session a previous pipeline had: bmv2 keeps its multicast nodes across a
        pipeline push while PI forgets them, and the new group's would be added to the old (measured: every flooded
        frame left twice)."""
        for entity in (e.clone_session(self.settings.cpu_port), e.flood_group(())):
            try:
                client.write([e.update(e.DELETE, entity)], "removing the previous sessions")
            except P4Error as err:
                log.debug("nothing to remove: %s", err)

    def _leftovers(self, client: P4RuntimeClient) -> list[LeftoverKey]:
        """The hot keys in the switch's tables (a previous controller's), with the servers of their ranges."""
        fields = self.pipeline.table("hot_keys").fields
        hot = self.pipeline.action("hot").params
        keys: dict[int, tuple[bytes, int]] = {}  # slot -> key, home
        for entity in client.read([e.table_entry(self.pipeline, "hot_keys", {})], "the hot keys left"):
            match = {m.field_id: int.from_bytes(m.exact.value, "big") for m in entity.table_entry.match}
            params = {p.param_id: int.from_bytes(p.value, "big") for p in entity.table_entry.action.action.params}
            key = match[fields["meta.key"][0]].to_bytes(match[fields["meta.key_len"][0]], "big")
            keys[params[hot["slot"][0]]] = (key, params[hot["home"][0]])
        slot_id = self.pipeline.table("replicas").fields["meta.slot"][0]
        server_id = self.pipeline.action("to_replica").params["server"][0]
        servers: dict[int, set[int]] = {}
        for entity in client.read([e.table_entry(self.pipeline, "replicas", {})], "the replicas left"):
            match = {m.field_id: m for m in entity.table_entry.match}
            params = {p.param_id: int.from_bytes(p.value, "big") for p in entity.table_entry.action.action.params}
            servers.setdefault(int.from_bytes(match[slot_id].exact.value, "big"), set()).add(params[server_id])
        return [LeftoverKey(key, home, tuple(sorted(servers.get(slot, set()) | {home})))
                for slot, (key, home) in keys.items()]

    def _mark_down(self, index: int) -> None:
        with self._lock:
            self._down.add(index)

    def _reconnect_loop(self) -> None:
        while not self._stop.wait(RECONNECT_EVERY):
            with self._lock:
                if not self._down:
                    continue
                try:
                    self._reconnect()
                except P4Error as err:
                    log.info("P4Runtime switch still unreachable: %s", err)
                    continue
            log.warning("a P4Runtime switch came back: its tables were empty; installing every hot key again")
            if self.on_reconnect is not None:
                self.on_reconnect()

    def _reconnect(self) -> None:
        """Under the lock: reconnect the broken switches, then start every switch afresh (the core reinstalls)."""
        for index in sorted(self._down):
            old = self.clients[index]
            old.close()
            self.clients[index] = self._client(index, self.settings.switches[index])
            self._down.discard(index)
        for client in self.clients:
            self._prepare(client)
        self._reset_slots()
        self.reconnects += 1

    def _close_clients(self) -> None:
        for client in self.clients:
            client.close()
        self.clients = []

    def _packet_in(self, payload: bytes, metadata: dict[int, bytes]) -> None:
        if self.on_mirror is not None and payload[12:14] == b"\x08\x00":
            self.on_mirror(payload)

    def _send_lease(self, client: P4RuntimeClient) -> None:
        """A PacketOut the switch adds to its own clock; returns once the switch has counted it (a PacketOut is
        sent on the stream without a reply: an ended lease must be over when renew_lease returns)."""
        before = self._count(client, "lease_renewals", 0)
        client.packet_out(b"", {self._op[0]: e.encode(1, self._op[1]),
                                self._lease[0]: e.encode(self.lease_us, self._lease[1])})
        deadline = time.monotonic() + self.settings.timeout
        while self._count(client, "lease_renewals", 0) == before:
            if time.monotonic() > deadline:
                raise P4Error(f"{client.address}: the switch did not take the lease within {self.settings.timeout:g} s")
            time.sleep(0.001)

    # --- entries --------------------------------------------------------------------------------------------
    def _reset_slots(self) -> None:
        self.slots: dict[bytes, int] = {}
        self.homes: dict[bytes, int] = {}
        self.key_servers: dict[bytes, tuple[int, ...]] = {}
        self.write_bases: dict[bytes, tuple[int, ...]] = {}
        self.ranges: dict[bytes, tuple[tuple[int, int, int], ...]] = {}  # (low, high, position) written per key
        self.synced: set[int] = set()  # slots with a synced entry
        self.free_slots = list(range(MAX_HOT - 1, -1, -1))

    def _slot(self, key: bytes) -> int:
        if key not in self.slots:
            raise DriverError(f"{key!r} is not installed")
        return self.slots[key]

    def _check_replicas(self, replicas: Sequence[ReplicaWeight]) -> tuple[int, ...]:
        if not 1 <= len(replicas) <= MAX_REPLICAS:
            raise DriverError(f"{len(replicas)} replicas: the P4 data plane holds 1 to {MAX_REPLICAS} per key")
        for r in replicas:
            if not 0 <= r.server < len(self.servers):
                raise DriverError(f"server {r.server} is not in the config's {len(self.servers)} servers")
        return tuple(r.server for r in replicas)

    def _hot_entry(self, key: bytes, slot: int, home: int):
        return e.table_entry(self.pipeline, "hot_keys", {"meta.key_len": len(key), "meta.key": e.key_value(key)},
                             "hot", {"slot": slot, "home": home})

    @staticmethod
    def _ranges(replicas: Sequence[ReplicaWeight]) -> tuple[tuple[int, int, int], ...]:
        """(low, high, position) of the 16-bit request hash per replica, as wide as its weight; none for weight 0."""
        ranges, low = [], 0
        for position, high in enumerate(cumulative_weights([r.weight for r in replicas])):
            if high > low:
                ranges.append((low, high - 1, position))
            low = max(low, high)
        return tuple(ranges)

    def _range_updates(self, slot: int, old: Sequence[tuple[int, int, int]], new: Sequence[tuple[int, int, int]],
                       servers: Sequence[int]) -> list:
        """From the `old` ranges to the `new`: old ones deleted first (a point between ranges goes home, never to a
        replica that lost its weight)."""
        updates = [e.update(e.DELETE, self._range_entry(slot, lo, hi)) for lo, hi, _ in old]
        return updates + [e.update(e.INSERT, self._range_entry(slot, lo, hi, servers[p], p)) for lo, hi, p in new]

    def _range_entry(self, slot: int, low: int, high: int, server: int | None = None, position: int = 0):
        if server is None:
            return e.table_entry(self.pipeline, "replicas", {"meta.slot": slot, "meta.point": (low, high)},
                                 priority=1)
        return e.table_entry(self.pipeline, "replicas", {"meta.slot": slot, "meta.point": (low, high)},
                             "to_replica", {"server": server, "position": position}, priority=1)

    def _delete_updates(self, key: bytes, slot: int) -> list:
        """hot_keys first (its gets and writes go home untouched from then on), then the slot's other entries."""
        updates = [e.update(e.DELETE, e.table_entry(self.pipeline, "hot_keys",
                                                    {"meta.key_len": len(key), "meta.key": e.key_value(key)}))]
        updates += [e.update(e.DELETE, self._range_entry(slot, lo, hi)) for lo, hi, _ in self.ranges.get(key, ())]
        if slot in self.synced:
            updates.append(e.update(e.DELETE, self._synced_entry(slot)))
        return updates

    def _synced_entry(self, slot: int, writes: int | None = None, unsure: int | None = None):
        if writes is None:
            return e.table_entry(self.pipeline, "synced", {"meta.slot": slot})
        return e.table_entry(self.pipeline, "synced", {"meta.slot": slot}, "synced_to",
                             {"written": writes, "unsure_count": unsure})

    def _counter_resets(self, slot: int) -> list:
        resets = [e.counter_write(self.pipeline, name, slot) for name in ("key_gets", "key_home_while_dirty")]
        resets += [e.counter_write(self.pipeline, "key_per_replica", slot * MAX_REPLICAS + p)
                   for p in range(MAX_REPLICAS)]
        return [e.update(e.MODIFY, r) for r in resets]

    def _forwarding_updates(self, old: dict[str, int], new: dict[str, int]) -> list:
        updates = []
        for mac, port in new.items():
            if old.get(mac) != port:
                updates.append(e.update(e.MODIFY if mac in old else e.INSERT, e.table_entry(
                    self.pipeline, "forward", {"hdr.ethernet.dst": e.mac_value(mac)}, "to_port", {"port": port})))
        updates += [e.update(e.DELETE, e.table_entry(self.pipeline, "forward", {"hdr.ethernet.dst": e.mac_value(m)}))
                    for m in old if m not in new]
        return updates

    def _write(self, client: P4RuntimeClient, updates: list, what: str) -> None:
        try:
            client.write(updates, what)
        except P4Error as err:
            raise DriverError(str(err)) from None

    def _write_all(self, updates: list, what: str, quiet: bool = False) -> None:
        """The same updates to every switch."""
        for client in self.clients:
            try:
                client.write(updates, what)
            except P4Error as err:
                if not quiet:
                    raise DriverError(str(err)) from None
                log.info("%s: %s", what, err)

    # --- counters -------------------------------------------------------------------------------------------
    def _count(self, client: P4RuntimeClient, counter: str, index: int) -> int:
        read = client.read([e.counter_read(self.pipeline, counter, index)], counter)
        return read[0].counter_entry.data.packet_count if read else 0

    def _switch_counts(self, client: P4RuntimeClient) -> dict[str, int]:
        read = client.read([e.counter_read(self.pipeline, "switch_counters"), e.counter_read(self.pipeline, "cloned")],
                           "switch counters")
        cloned_id = self.pipeline.counter("cloned")
        counts = dict.fromkeys(COUNTERS, 0)  # switch_counters holds them in the eBPF program's order
        for entity in read:
            entry = entity.counter_entry
            if entry.counter_id == cloned_id:
                counts["cloned"] += entry.data.packet_count
            elif entry.index.index < len(COUNTERS) and COUNTERS[entry.index.index] != "cloned":
                counts[COUNTERS[entry.index.index]] += entry.data.packet_count
        return counts

    def _add_counts(self, index: int, client: P4RuntimeClient, counters: Counters) -> None:
        switch = self._switch_counts(client)
        counters.unparsed += switch["unparsed"]
        counters.unsure += switch["unsure"]
        for name, value in switch.items():
            counters.switch[name] = counters.switch.get(name, 0) + value
        for key, slot in self.slots.items():
            servers = self.key_servers[key]
            reads = [e.counter_read(self.pipeline, name, slot)
                     for name in ("key_gets", "key_home_while_dirty", "key_mirrored")]
            reads += [e.counter_read(self.pipeline, "key_per_replica", slot * MAX_REPLICAS + p)
                      for p in range(len(servers))]
            values = [r.counter_entry.data.packet_count for r in client.read(reads, f"counters of {key!r}")]
            total = counters.keys.setdefault(key, KeyCounters())
            total.gets += values[0]
            total.home_while_dirty += values[1]
            total.mirrored += values[2] - self.write_bases[key][index]
            for server, n in zip(servers, values[3:]):
                total.per_replica[server] = total.per_replica.get(server, 0) + n
