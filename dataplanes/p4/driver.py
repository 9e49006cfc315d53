"""The P4Runtime driver: the controller core's requests as P4Runtime writes to bmv2 switches running
p4src/mbalancer.p4 (dataplanes/p4/).

The hot keys are kept in the slot book every data plane shares (dataplanes/slot_book.py), written to each switch
through its P4Tables adapter (dataplanes/p4/tables.py says how the program holds them). What this driver adds is the
P4 switch's own: the pipeline, the servers, ports and sessions, forwarding, and mirrored writes arriving as PacketIns
on the stream. At attach a switch that already runs this pipeline (its cookie names the same compiled program) is
adopted: nothing is pushed, the driver's own entries are made what the config says (inserted, modified or deleted
where they differ), and its hot keys are read back as they are (dataplanes/read_back.py; P4Tables.held_keys). A
switch running another pipeline, or none, gets the pipeline pushed. A switch whose stream breaks (the connection
cut, the switch stopped or restarted) is reconnected by the driver's thread. One that went on meanwhile (this
pipeline, its hot keys still there) is adopted as at attach: every switch's keys read back into the book and handed
to the core (`on_reconnect(found, None)`, controller/adoption.py came_back), which keeps what agrees with nothing
written; the copies of writes the broken stream did not bring are not needed, as the switch counted those writes
(their keys read back dirty, and settled). One that came back empty gets the pipeline again, and so does every
other switch: the book forgets its slots and the core installs everything again.
"""
from __future__ import annotations

import logging
import time
from collections import OrderedDict
from typing import Any, Iterable, Sequence

from dataplanes.driver import DriverError, ForwardingEntry, FoundKey, StreamId
from dataplanes.fan_out import FanOut
from dataplanes.p4 import Settings
from dataplanes.p4 import entries as e
from dataplanes.p4.client import P4RuntimeClient, first_come_election_id
from dataplanes.p4.pipeline import MAX_HOT, P4Error, Pipeline
from dataplanes.p4.sketch import P4Sketch
from dataplanes.p4.tables import REPORT_LEASE_LEFT, REPORT_QUIET, P4Tables, lease_fields
from dataplanes.pipeline import own_addresses
from dataplanes.read_back import read_back
from dataplanes.slot_book import SlotBook
from dataplanes.slot_book_driver import SlotBookDriver
from mbalancer.macs import mac_text
from mbalancer.packets import LINKTYPE_ETHERNET, TCP, destination, memcached_segment
from mbalancer.settings import Server

log = logging.getLogger(__name__)
RECONNECT_EVERY = 0.5  # seconds between tries to reach a switch whose stream broke
STREAM_STARTS_KEPT = 65536  # connections whose start a copy told of (the controller follows as many)
SKETCH_CALLS = ("set_sketch_control", "clear_sketch", "heavy_keys", "take_sketch_destinations", "counters")
# the tables whose entries the driver writes from the config at attach (forward from the core's entries)
OWNED_TABLES = ("memcached_ports", "reply_ports", "servers", "server_index", "closing_servers", "trusted_sources",
                "controller_addresses")


def driver_from_settings(settings: Settings) -> "P4RuntimeDriver":
    """The registry's factory."""
    try:
        return P4RuntimeDriver(settings, Pipeline())
    except P4Error as err:
        raise DriverError(str(err)) from None


class P4RuntimeDriver(SlotBookDriver):
    name = "p4runtime"
    thread_name = "mbalancer-p4runtime"

    def __init__(self, settings: Settings, pipeline: Pipeline):
        if not settings.switches:
            raise DriverError("no P4Runtime switch given ([dataplane.p4] switches, or --switch HOST:PORT)")
        if not 0 <= settings.election_id < 1 << 64:
            raise DriverError(f"dataplane.p4.election_id: 0 to 2^64-1 (got {settings.election_id})")
        if settings.parallel < 1:
            raise DriverError(f"dataplane.p4.parallel: at least 1 switch at once (got {settings.parallel})")
        super().__init__(SlotBook("P4 data plane", (P4Error,), FanOut(settings.parallel, "mbalancer-p4-writes"),
                                  slots=MAX_HOT))
        self.settings, self.pipeline = settings, pipeline
        self.clients: list[P4RuntimeClient] = []
        self.forwarding: dict[str, int] | None = None  # destination MAC -> port, as the core gave them (None: not yet)
        self.forwarded: dict[str, dict[str, int]] = {}  # switch address -> its forward entries (MAC -> port)
        # P4Runtime arbitration: the first controller stays primary, unless elected through etcd (a higher id)
        self.election_id = settings.election_id or first_come_election_id()
        self._broken: set[int] = set()  # switches whose stream broke, by index: reached again by `_watch`
        # connection -> where its unread stretch began, as the copies of its segments carry it (registers cannot be
        # read over P4Runtime)
        self._stream_starts: OrderedDict[StreamId, int] = OrderedDict()
        self._sketch: P4Sketch | None = None  # the first switch's sketch, once a reader asks for it
        try:
            lease_fields(pipeline)  # checked now, not at attach
        except P4Error as err:
            raise DriverError(str(err)) from None

    # --- the interface, beyond the book -----------------------------------------------------------------------
    def owned_switches(self) -> list[str]:
        return [f"p4:{address}:{self.settings.device_id}" for address in self.settings.switches]

    def set_forwarding(self, entries: Sequence[ForwardingEntry]) -> None:
        with self.book.lock:
            wanted = {}
            for entry in entries:
                if not entry.port.isdigit():
                    raise DriverError(f"forwarding of {entry.mac}: a bmv2 port is a number (got {entry.port!r})")
                wanted[entry.mac.lower()] = int(entry.port)
            for client in self.clients:
                self._write(client, self._forwarding_updates(self.forwarded.get(client.address, {}), wanted),
                            "forwarding")
                self.forwarded[client.address] = dict(wanted)
            self.forwarding = wanted

    def dirty(self, key: bytes) -> bool:
        """Whether the data plane sends the key's gets home now (its counts differ from the synced ones, or it is
        held): the data plane's own test, recomputed from the twin counters."""
        with self.book.lock:
            entry = self.book.entry_of(key)
            return any(t.synced(entry.slot) != (t.writes(entry.slot), t.unsure(entry.home))
                       for t in self.book.switches)

    def sketch_call(self, call: str, args: tuple) -> Any:
        """The first switch's sketch, read through this connection: the primary, the only one its digests reach.
        set_sketch_control takes the nanoseconds left before the deadline, not a time (the caller's clock is its own).
        A reconnected switch gets a new P4Sketch (the digest turned on again; the epoch then under way is lost)."""
        if call not in SKETCH_CALLS:
            raise DriverError(f"no sketch call {call!r} (one of {', '.join(SKETCH_CALLS)})")
        with self.book.lock:
            if not self.clients or self.clients[0].down:
                raise DriverError(f"the P4 switch {self.settings.switches[0]} is not connected now")
            try:
                if self._sketch is None or self._sketch.client is not self.clients[0]:
                    servers = [f"{s.ip}:{s.port}" for s in self.book.servers]
                    self._sketch = P4Sketch(self.clients[0], self.pipeline, servers)
            except P4Error as err:
                raise DriverError(f"the sketch of {self.settings.switches[0]}: {err}") from None
            sketch = self._sketch
        if call == "set_sketch_control" and args and args[0]:  # nanoseconds left: the caller's clock is not ours
            args = (time.monotonic_ns() + args[0], *args[1:])
        try:  # outside the book's lock: a read waits for the epoch's digests
            return getattr(sketch, call)(*args)
        except P4Error as err:
            raise DriverError(f"the sketch of {self.settings.switches[0]}: {err}") from None
        except TypeError as err:
            raise DriverError(f"sketch call {call}: {err}") from None

    def read_synced(self, slot: int) -> list[tuple[int, int] | None]:
        """Each switch's `synced` entry of the slot: (writes, unsure), None where there is none."""
        with self.book.lock:
            return [t.synced(slot) for t in self.book.switches]

    # --- the switches -----------------------------------------------------------------------------------------
    def _open(self, servers: Sequence[Server]) -> list[FoundKey]:
        with self.book.lock:
            self.book.servers = tuple(servers)
            try:
                kept = []
                for address in self.settings.switches:
                    self.clients.append(self._client(address))
                    kept.append(self._prepare(self.clients[-1], adopt=True))
                self.book.use([P4Tables(c, self.pipeline) for c in self.clients])
                # (closes a switch counted before are not acknowledged here: the core handles them, closes_pending)
                return self._read_back() if any(kept) else []
            except P4Error as err:
                self._release()
                raise DriverError(str(err)) from None

    def _release(self) -> None:
        for client in self.clients:
            client.close()
        self.clients = []
        self.book.use([])

    def _client(self, address: str) -> P4RuntimeClient:
        client = P4RuntimeClient(address, self.settings.device_id, self.settings.timeout,
                                 on_packet=lambda payload, metadata: self._packet_in(address, payload, metadata),
                                 election_id=self.election_id)
        client.connect()
        return client

    def _prepare(self, client: P4RuntimeClient, adopt: bool) -> bool:
        """Make the switch ready; whether it kept its pipeline and tables. `adopt` and the switch runs this pipeline:
        adopted (`_adopt`). Otherwise the pipeline is pushed (emptying its tables) and the driver's entries written;
        hot keys a previous pipeline of the same program held go first (bmv2 swaps a pushed pipeline in only between
        packets, later)."""
        cookie = client.pipeline_cookie()
        flood = self.settings.ports or (self._flood_ports(client) if cookie is not None else ()) or range(1, 17)
        if adopt and cookie == self.pipeline.cookie:
            self._adopt(client, flood)
            return True
        if cookie == self.pipeline.cookie:
            tables = P4Tables(client, self.pipeline)
            tables.delete_keys(list(tables.held_keys().items()))
        if cookie is not None:
            self._remove_sessions(client)
        client.set_pipeline(self.pipeline)
        updates = [e.update(e.INSERT, e.clone_session(self.settings.cpu_port)),
                   e.update(e.INSERT, e.flood_group(flood))]
        updates += [e.update(e.INSERT, entity) for entity in self._owned_entries()]
        client.write(updates + self._forwarding_updates({}, self.forwarding or {}),
                     "the switch's servers, ports and sessions")
        self.forwarded[client.address] = dict(self.forwarding or {})
        return False

    def _adopt(self, client: P4RuntimeClient, flood: Sequence[int]) -> None:
        """A switch that runs this pipeline keeps it, its hot keys and their counters: the driver's own entries are
        made what the config says, each inserted, modified or deleted only where it differs (a controller that
        takes over with the same config writes nothing), the sessions modified where the switch has them. Its
        forward entries are kept as found until the core gives its own."""
        log.info("%s runs this pipeline already: its tables are adopted, not pushed again", client.address)
        tables = (*OWNED_TABLES, "forward")
        found: dict[tuple, Any] = {}
        forward_id = self.pipeline.table("forward").id
        self.forwarded[client.address] = {}
        for entity in client.read([e.table_entry(self.pipeline, t, {}) for t in tables], "the switch's own entries"):
            if entity.table_entry.table_id == forward_id:
                match = e.match_of(self.pipeline, "forward", entity)
                port = e.params_of(self.pipeline, "to_port", entity)["port"]
                self.forwarded[client.address][mac_text(match["hdr.ethernet.dst"])] = port
            else:
                found[e.entry_key(entity)] = entity
        updates = []
        for entity in self._owned_entries():
            held = found.pop(e.entry_key(entity), None)
            if held is None or e.action_of(held) != e.action_of(entity):
                updates.append(e.update(e.INSERT if held is None else e.MODIFY, entity))
        updates += [e.update(e.DELETE, entity) for entity in found.values()]  # of servers the config no longer has
        updates += self._session_updates(client, flood)
        if self.forwarding is not None:
            updates += self._forwarding_updates(self.forwarded[client.address], self.forwarding)
            self.forwarded[client.address] = dict(self.forwarding)
        client.write(updates, "the switch's servers, ports and sessions")
        if updates:
            log.info("%s: %d of the driver's entries written to match the config", client.address, len(updates))

    def _session_updates(self, client: P4RuntimeClient, flood: Sequence[int]) -> list:
        """The clone session and flood group, each inserted where the switch has none and modified where it has
        another."""
        updates = []
        for entity in (e.clone_session(self.settings.cpu_port), e.flood_group(flood)):
            try:
                held = client.read([entity], "the sessions")
            except P4Error:  # (bmv2 answers a read of a session it does not have with an error)
                held = []
            if not held:
                updates.append(e.update(e.INSERT, entity))
            elif not same_session(held[0], entity):
                updates.append(e.update(e.MODIFY, entity))
        return updates

    def _owned_entries(self) -> list:
        """The entries of OWNED_TABLES the config makes: the servers and their ports, trusted sources."""
        servers = self.book.servers
        entries = []
        for port in sorted({s.port for s in servers}):
            entries.append(e.table_entry(self.pipeline, "memcached_ports", {"hdr.ports.dst": port}, "is_memcached"))
            entries.append(e.table_entry(self.pipeline, "reply_ports", {"hdr.ports.src": port}, "NoAction"))
        for index, server in enumerate(servers):
            entries.append(e.table_entry(
                self.pipeline, "servers", {"meta.server_wanted": index}, "server_address",
                {"mac": e.mac_value(server.mac), "ip": e.ip_value(server.ip), "port": server.port}))
            entries.append(e.table_entry(
                self.pipeline, "server_index", {"hdr.ipv4.dst": e.ip_value(server.ip), "hdr.ports.dst": server.port},
                "server_is", {"server": index}))
            entries.append(e.table_entry(
                self.pipeline, "closing_servers", {"hdr.ipv4.src": e.ip_value(server.ip), "hdr.ports.src": server.port},
                "closing_server_is", {"server": index}))
        for ip in sorted(own_addresses(servers) | set(self.settings.trusted)):
            entries.append(e.table_entry(self.pipeline, "trusted_sources", {"hdr.ipv4.src": e.ip_value(ip)},
                                         "is_trusted"))
            entries.append(e.table_entry(self.pipeline, "controller_addresses", {"hdr.ipv4.dst": e.ip_value(ip)},
                                         "is_to_controller"))
        return entries

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

    def _read_back(self) -> list[FoundKey]:
        """Under the lock, the switches just handed to the book: every switch asked for its lease at once, then the
        hot keys read back and kept where the switches agree (dataplanes/read_back.py)."""
        for tables in self.book.switches:
            tables.ask_lease()
        return read_back(self.book)

    def _watch(self) -> None:
        """Reconnect switches whose stream broke; then the core adopts what they hold, or (a switch came back
        empty) every switch starts afresh and the core reinstalls."""
        while not self._stop.wait(RECONNECT_EVERY):
            with self.book.lock:
                self._broken |= {i for i, c in enumerate(self.clients) if c.down}
                down = [i for i in sorted(self._broken) if self.clients[i].down]
            if not self._broken:
                continue
            reached = self._reach(down)  # outside the lock: a switch out of reach holds up no call (renewals)
            if reached is None:
                continue
            with self.book.lock:
                for index, client in reached.items():
                    self.clients[index].close()
                    self.clients[index] = client
                try:
                    found = self._reconnect()
                except P4Error as err:
                    log.info("P4Runtime switch reached, not yet taken back: %s", err)
                    continue
                self._broken = set()
            if found is None:
                self._came_back()
            elif self.on_reconnect is not None:
                self.on_reconnect(found, None)

    def _reach(self, indexes: Sequence[int]) -> dict[int, P4RuntimeClient] | None:
        """A new client for each switch at `indexes`; None (and none kept) if one cannot be reached yet."""
        reached: dict[int, P4RuntimeClient] = {}
        try:
            for index in indexes:
                reached[index] = self._client(self.settings.switches[index])
        except P4Error as err:
            log.info("P4Runtime switch still unreachable: %s", err)
            for client in reached.values():
                client.close()
            return None
        return reached

    def _reconnect(self) -> list[FoundKey] | None:
        """Under the lock, the broken switches reached again. Where each still runs this pipeline and holds hot keys
        (its stream broke, the switch went on: `_kept`), what they hold is read back and returned for the core to
        adopt; else every switch starts afresh (None), the lease written again."""
        tables = [P4Tables(c, self.pipeline) for c in self.clients]
        if all(self._kept(tables[i]) for i in self._broken):
            return self._read_back_again(tables)
        for client in self.clients:
            self._prepare(client, adopt=False)
        self.book.came_back([P4Tables(c, self.pipeline) for c in self.clients])
        self._lease_again(range(len(self.clients)))
        return None

    def _kept(self, tables: P4Tables) -> bool:
        """Whether a switch whose stream broke went on meanwhile: it runs this pipeline and holds hot keys (or the
        book holds none). A restarted switch holds none: bootstrapped (Bmv2Switch.bootstrap) it even runs this
        pipeline, and adopting it would have every key of the other switches rebuilt for disagreeing with it."""
        return tables.client.pipeline_cookie() == self.pipeline.cookie and (
            not self.book.entries or bool(tables.held_keys()))

    def _read_back_again(self, tables: list[P4Tables]) -> list[FoundKey]:
        """Under the lock, the broken switches reached again and each kept: their driver entries made what the config
        says (`_adopt`: nothing written where they are), then every switch's hot keys read back into the book as at
        attach (dataplanes/read_back.py), with one difference: the lease is this controller's own, which it held all
        along (`book.lease_until`), not asked of the switches (none holds a later one than this controller gave).

        Why that is safe: a switch's lease stands for a controller watching its copies; a new leader that cannot
        tell whether the switch went unwatched resyncs every key. This controller watched all along (its health
        probes, its renewals), and what it missed of the broken switch, the copies of writes that crossed it, the
        switch counted (a write or unsure request counted since a key's clear makes it dirty there, lease or not):
        those keys read back dirty and are settled. A switch whose lease ran out meanwhile sent gets home, the safe
        side. Only a lease this controller ended, or let run out, makes its keys resynced (`lease-expired`)."""
        for index in sorted(self._broken):
            self._prepare(tables[index].client, adopt=True)
        self.book.use(tables)
        found = read_back(self.book, lease_until=self.book.lease_until)
        self._lease_again(self._broken)
        log.info("%d P4 switch(es) reached again, still holding their hot keys: %d read back for the core to adopt "
                 "(only the keys that disagree are rebuilt)", len(self._broken), len(found))
        return found

    def _lease_again(self, indexes: Iterable[int]) -> None:
        """The lease as last renewed, written again to the switches at `indexes` (a switch that was out of reach
        missed its renewals)."""
        if self.book.lease_until:
            for index in sorted(indexes):
                self.book.switches[index].set_lease(self.book.lease_until)

    def stream_start(self, stream: StreamId) -> int | None:
        return self._stream_starts.get(stream)

    def unsure_quiet(self, server: int) -> float | None:
        """Rearms the server's report on every switch as it asks (a rearm is harmless: the next coalescable request
        is copied, and the core checks the server's keys again)."""
        with self.book.lock:
            try:
                return min((t.unsure_report(server) for t in self.book.switches), default=None)
            except P4Error as err:
                raise DriverError(f"unsure requests of server {server}: {err}") from None

    def rearm_unsure(self, server: int) -> None:
        self.unsure_quiet(server)

    def _packet_in(self, address: str, payload: bytes, metadata: dict[int, bytes]) -> None:
        fields = self.pipeline.packet_metadata.get("packet_in", {})
        report = int.from_bytes(metadata.get(fields["report"][0], b""), "big") if "report" in fields else 0
        if report:  # an answer, no packet: a rearm's (how quiet the server is), a lease query's (µs left)
            value = int.from_bytes(metadata.get(fields["quiet_us"][0], b""), "big")
            for tables in self.book.switches:
                if tables.client.address == address:
                    if report == REPORT_QUIET:
                        tables.answer(value)
                    elif report == REPORT_LEASE_LEFT:
                        tables.lease_answer(value)
            return
        if self.on_mirror is not None and payload[12:14] == b"\x08\x00":
            self._note_stream_start(payload, metadata)  # before the core reads the copy
            self._deliver(payload)

    def _note_stream_start(self, frame: bytes, metadata: dict[int, bytes]) -> None:
        fields = self.pipeline.packet_metadata.get("packet_in", {})
        if "stream" not in fields or int.from_bytes(metadata.get(fields["stream"][0], b""), "big") != 1:
            return
        to = destination(frame, LINKTYPE_ETHERNET)
        segment = memcached_segment(frame, LINKTYPE_ETHERNET, to[1]) if to else "not IPv4"
        if isinstance(segment, str) or segment.transport != TCP:
            return
        stream = StreamId.between(segment.source, segment.destination)
        self._stream_starts[stream] = int.from_bytes(metadata.get(fields["stream_start"][0], b""), "big")
        self._stream_starts.move_to_end(stream)
        while len(self._stream_starts) > STREAM_STARTS_KEPT:
            self._stream_starts.popitem(last=False)

    # --- forwarding ---------------------------------------------------------------------------------------------
    def _forwarding_updates(self, old: dict[str, int], new: dict[str, int]) -> list:
        updates = []
        for mac, port in new.items():
            if old.get(mac) != port:
                updates.append(e.update(e.MODIFY if mac in old else e.INSERT, e.table_entry(
                    self.pipeline, "forward", {"hdr.ethernet.dst": e.mac_value(mac)}, "to_port", {"port": port})))
        updates += [e.update(e.DELETE, e.table_entry(self.pipeline, "forward", {"hdr.ethernet.dst": e.mac_value(m)}))
                    for m in old if m not in new]
        return updates

    @staticmethod
    def _write(client: P4RuntimeClient, updates: list, what: str) -> None:
        try:
            client.write(updates, what)
        except P4Error as err:
            raise DriverError(str(err)) from None


def same_session(held, wanted) -> bool:
    """Whether a clone session or multicast group read from the switch replicates to the ports wanted."""
    def replicas(entity) -> list[tuple[int, int]]:
        pre = entity.packet_replication_engine_entry
        kind = pre.WhichOneof("type")
        return sorted((r.egress_port, r.instance) for r in getattr(pre, kind).replicas)
    return replicas(held) == replicas(wanted)
