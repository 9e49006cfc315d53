"""An in-process P4Runtime server that checks every message against the committed P4Info and keeps the entries it
accepts: for the P4Runtime driver's message encoding where no bmv2 is installed (CI). It is no switch: it forwards
nothing and counts nothing; tests/test_p4_program.py and the driver contract run the driver against bmv2.

The behaviours it plays: a PacketOut adds one to the counter `lease_renewals` (the driver waits for that count
when it renews the lease); a rearm (op 2) is answered; a lease query (op 3) is answered with the microseconds left
of the latest lease (op 1), as p4src/mbalancer.p4 does, unless made without it (`lease_query=False`: a program
that drops it). What it refuses, as bmv2's server does: unknown table, field, action or parameter ids;
an action the table does not take; values wider than their field or not in canonical form; a range or exact match
on the wrong kind of field; INSERT of an entry that exists, MODIFY or DELETE of one that does not (a batch goes on
past a refused update and names each, as bmv2's does); writes from a controller that is not primary (the primary:
the highest election id among the open streams).
"""
from __future__ import annotations

import threading
import time
from concurrent import futures

import grpc
from google.rpc import status_pb2
from p4.config.v1 import p4info_pb2
from p4.v1 import p4runtime_pb2, p4runtime_pb2_grpc


MATCH_KINDS = {p4info_pb2.MatchField.EXACT: "exact", p4info_pb2.MatchField.RANGE: "range"}


class Refused(Exception):
    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code = code


def canonical(value: bytes, bitwidth: int, what: str) -> None:
    if not value or (len(value) > 1 and value[0] == 0):
        raise Refused(grpc.StatusCode.INVALID_ARGUMENT, f"{what}: {value.hex()} is not canonical")
    if int.from_bytes(value, "big") >= 1 << bitwidth:
        raise Refused(grpc.StatusCode.INVALID_ARGUMENT, f"{what}: {value.hex()} is wider than {bitwidth} bits")


class CheckingServer(p4runtime_pb2_grpc.P4RuntimeServicer):
    def __init__(self, sizes: dict[str, int] | None = None, lease_query: bool = True):
        """sizes: tables held smaller than the P4Info says, by name (an INSERT past it is RESOURCE_EXHAUSTED);
        lease_query: answer op 3."""
        self.sizes = sizes or {}
        self.lease_query = lease_query
        self.lease_until = 0  # time.monotonic_ns() until which the latest lease PacketOut runs
        self.requests = {"write": 0, "read": 0}  # Write and Read RPCs taken
        self.p4info: p4info_pb2.P4Info | None = None
        self.cookie: int | None = None
        self.entries: dict[tuple, p4runtime_pb2.TableEntry] = {}
        self.pre: dict[tuple, p4runtime_pb2.PacketReplicationEngineEntry] = {}
        self.counter_writes: list[p4runtime_pb2.CounterEntry] = []
        self.packet_outs: list[p4runtime_pb2.PacketOut] = []
        self.primary = 0
        self.elections: set[int] = set()
        self.writes: list[p4runtime_pb2.WriteRequest] = []  # every Write request taken, as it came
        self.lock = threading.Lock()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        p4runtime_pb2_grpc.add_P4RuntimeServicer_to_server(self, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")  # the port the kernel gives: none to race for

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> "CheckingServer":
        self.server.start()
        return self

    def stop(self) -> None:
        self.server.stop(0)

    # --- the service ----------------------------------------------------------------------------------------
    def StreamChannel(self, request_iterator, context):
        mine = None  # this stream's election id: the primary is the highest among the open streams
        try:
            for request in request_iterator:
                kind = request.WhichOneof("update")
                if kind == "arbitration":
                    with self.lock:
                        self.elections.discard(mine)
                        mine = request.arbitration.election_id.low
                        self.elections.add(mine)
                        self.primary = max(self.elections)
                    reply = p4runtime_pb2.StreamMessageResponse()
                    reply.arbitration.CopyFrom(request.arbitration)
                    reply.arbitration.election_id.low = self.primary  # as the spec says: the primary's
                    reply.arbitration.status.code = 0 if mine == self.primary else 6  # ALREADY_EXISTS: a backup
                    yield reply
                elif kind == "packet":
                    with self.lock:
                        self.packet_outs.append(request.packet)
                        answer = self._answer(request.packet)
                    if answer is not None:
                        yield answer
        finally:
            with self.lock:  # a closed stream's controller is gone: the next highest is primary
                self.elections.discard(mine)
                self.primary = max(self.elections, default=0)

    def SetForwardingPipelineConfig(self, request, context):
        self._primary(request.election_id.low, context)
        with self.lock:
            self.p4info = request.config.p4info
            self.cookie = request.config.cookie.cookie
            self.entries.clear()
            self.pre.clear()
        return p4runtime_pb2.SetForwardingPipelineConfigResponse()

    def GetForwardingPipelineConfig(self, request, context):
        if self.p4info is None:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "no pipeline")
        reply = p4runtime_pb2.GetForwardingPipelineConfigResponse()
        reply.config.cookie.cookie = self.cookie
        return reply

    def Write(self, request, context):
        """Every update applied in order, past a refused one; if any was refused, the batch fails with one
        p4.v1.Error per update in the status details (OK for those applied), as bmv2's server answers."""
        self._primary(request.election_id.low, context)
        self.requests["write"] += 1
        errors = []
        with self.lock:
            self.writes.append(request)
            for update in request.updates:
                try:
                    self._apply(update)
                    errors.append(p4runtime_pb2.Error(canonical_code=0))
                except Refused as err:
                    errors.append(p4runtime_pb2.Error(canonical_code=err.code.value[0], message=str(err)))
        if any(error.canonical_code for error in errors):
            status = status_pb2.Status(code=grpc.StatusCode.UNKNOWN.value[0])
            for error in errors:
                status.details.add().Pack(error)
            context.set_trailing_metadata((("grpc-status-details-bin", status.SerializeToString()),))
            context.abort(grpc.StatusCode.UNKNOWN, "")
        return p4runtime_pb2.WriteResponse()

    def Read(self, request, context):
        reply = p4runtime_pb2.ReadResponse()
        self.requests["read"] += 1
        with self.lock:
            for entity in request.entities:
                if entity.HasField("table_entry"):
                    wanted = entity.table_entry
                    for entry in self.entries.values():
                        if entry.table_id == wanted.table_id and (not wanted.match or self._key(entry) ==
                                                                  self._key(wanted)):
                            reply.entities.add().table_entry.CopyFrom(entry)
                elif entity.HasField("packet_replication_engine_entry"):
                    found = self.pre.get(self._pre_key(entity.packet_replication_engine_entry))
                    if found is not None:
                        reply.entities.add().packet_replication_engine_entry.CopyFrom(found)
                elif entity.HasField("counter_entry"):
                    counter = self._counter(entity.counter_entry.counter_id)
                    indexes = ([entity.counter_entry.index.index] if entity.counter_entry.HasField("index")
                               else range(counter.size))
                    for index in indexes:
                        found = reply.entities.add().counter_entry
                        found.counter_id, found.index.index = counter.preamble.id, index
                        renewals = counter.preamble.name.endswith(".lease_renewals")
                        found.data.packet_count = self._ops(1) if renewals else 0
        yield reply

    # --- PacketOuts, as the program takes them (p4src/headers.p4 packet_out) ---------------------------------
    def _metadata(self, header: str) -> dict[str, int]:
        return {m.name: m.id for h in self.p4info.controller_packet_metadata if h.preamble.name == header
                for m in h.metadata} if self.p4info is not None else {}

    def _op(self, packet) -> int | None:
        op = self._metadata("packet_out").get("op")
        return next((int.from_bytes(m.value, "big") for m in packet.metadata if m.metadata_id == op), None)

    def _ops(self, op: int) -> int:
        return sum(1 for packet in self.packet_outs if self._op(packet) == op)

    def _answer(self, packet) -> p4runtime_pb2.StreamMessageResponse | None:
        """As the switch answers: a rearm (op 2) with a PacketIn, report 1, nothing unsure ever; a lease query
        (op 3) with report 2 and the lease's microseconds left. A lease (op 1) is taken."""
        op = self._op(packet)
        if op == 1:
            lease_us = next(int.from_bytes(m.value, "big") for m in packet.metadata
                            if m.metadata_id == self._metadata("packet_out")["lease_us"])
            self.lease_until = time.monotonic_ns() + lease_us * 1000
        if op == 2:
            report, value = b"\x01", b"\xff" * 6
        elif op == 3 and self.lease_query:
            left = max(self.lease_until - time.monotonic_ns(), 0) // 1000
            report, value = b"\x02", left.to_bytes(6, "big")
        else:
            return None
        fields = self._metadata("packet_in")
        reply = p4runtime_pb2.StreamMessageResponse()
        reply.packet.metadata.add(metadata_id=fields["report"], value=report)
        reply.packet.metadata.add(metadata_id=fields["quiet_us"], value=value)
        return reply

    # --- checks ---------------------------------------------------------------------------------------------
    def _primary(self, election_low: int, context) -> None:
        if election_low != self.primary:
            context.abort(grpc.StatusCode.PERMISSION_DENIED, "not primary")

    def _apply(self, update: p4runtime_pb2.Update) -> None:
        entity = update.entity
        if entity.HasField("table_entry"):
            self._check_entry(entity.table_entry, update.type != p4runtime_pb2.Update.DELETE)
            self._room(entity.table_entry.table_id, update.type)
            self._store(self.entries, (entity.table_entry.table_id, self._key(entity.table_entry)),
                        entity.table_entry, update.type)
        elif entity.HasField("packet_replication_engine_entry"):
            pre = entity.packet_replication_engine_entry
            self._store(self.pre, self._pre_key(pre), pre, update.type)
        elif entity.HasField("counter_entry"):
            counter = self._counter(entity.counter_entry.counter_id)
            if entity.counter_entry.index.index >= counter.size:
                raise Refused(grpc.StatusCode.OUT_OF_RANGE, f"counter {counter.preamble.name}: index out of range")
            self.counter_writes.append(entity.counter_entry)
        else:
            raise Refused(grpc.StatusCode.UNIMPLEMENTED, f"entity {entity.WhichOneof('entity')}")

    @staticmethod
    def _pre_key(pre: p4runtime_pb2.PacketReplicationEngineEntry) -> tuple:
        return pre.WhichOneof("type"), pre.clone_session_entry.session_id or pre.multicast_group_entry.multicast_group_id

    @staticmethod
    def _store(store: dict, key: tuple, value, kind: int) -> None:
        exists = key in store
        if kind == p4runtime_pb2.Update.INSERT and exists:
            raise Refused(grpc.StatusCode.ALREADY_EXISTS, f"{key} exists")
        if kind in (p4runtime_pb2.Update.MODIFY, p4runtime_pb2.Update.DELETE) and not exists:
            raise Refused(grpc.StatusCode.NOT_FOUND, f"{key} does not exist")
        if kind == p4runtime_pb2.Update.DELETE:
            del store[key]
        else:
            store[key] = value

    def _room(self, table_id: int, kind: int) -> None:
        table = self._table(table_id)
        size = self.sizes.get(table.preamble.name.split(".")[-1], table.size)
        if kind == p4runtime_pb2.Update.INSERT and size and sum(k[0] == table_id for k in self.entries) >= size:
            raise Refused(grpc.StatusCode.RESOURCE_EXHAUSTED, f"table {table.preamble.name} is full ({size})")

    def _table(self, table_id: int) -> p4info_pb2.Table:
        for table in self.p4info.tables:
            if table.preamble.id == table_id:
                return table
        raise Refused(grpc.StatusCode.NOT_FOUND, f"no table {table_id}")

    def _counter(self, counter_id: int) -> p4info_pb2.Counter:
        for counter in self.p4info.counters:
            if counter.preamble.id == counter_id:
                return counter
        raise Refused(grpc.StatusCode.NOT_FOUND, f"no counter {counter_id}")

    def _check_entry(self, entry: p4runtime_pb2.TableEntry, with_action: bool) -> None:
        table = self._table(entry.table_id)
        fields = {f.id: f for f in table.match_fields}
        for match in entry.match:
            if match.field_id not in fields:
                raise Refused(grpc.StatusCode.INVALID_ARGUMENT, f"{table.preamble.name}: no field {match.field_id}")
            field = fields[match.field_id]
            kind = match.WhichOneof("field_match_type")
            if MATCH_KINDS.get(field.match_type) != kind:
                wanted = p4info_pb2.MatchField.MatchType.Name(field.match_type)
                raise Refused(grpc.StatusCode.INVALID_ARGUMENT, f"{field.name}: a {kind} match on a {wanted} field")
            values = [match.exact.value] if kind == "exact" else [match.range.low, match.range.high]
            for value in values:
                canonical(value, field.bitwidth, field.name)
        if len(entry.match) != len(fields):
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT, f"{table.preamble.name}: {len(entry.match)} of "
                                                            f"{len(fields)} match fields")
        has_range = any(f.match_type == p4info_pb2.MatchField.RANGE for f in fields.values())
        if has_range != (entry.priority > 0):
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT, f"{table.preamble.name}: priority {entry.priority}")
        if not with_action:
            return
        action_id = entry.action.action.action_id
        if action_id not in {ref.id for ref in table.action_refs}:
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT, f"{table.preamble.name} does not take action {action_id}")
        action = next(a for a in self.p4info.actions if a.preamble.id == action_id)
        params = {p.id: p for p in action.params}
        if sorted(p.param_id for p in entry.action.action.params) != sorted(params):
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT, f"{action.preamble.name}: parameters")
        for param in entry.action.action.params:
            canonical(param.value, params[param.param_id].bitwidth, params[param.param_id].name)

    @staticmethod
    def _key(entry: p4runtime_pb2.TableEntry) -> tuple:
        return tuple(sorted(m.SerializeToString() for m in entry.match)) + (entry.priority,)

