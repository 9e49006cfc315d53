"""P4Runtime entities by name: table entries, counter reads, the clone session and the flood group. Every value is
checked against its width in the P4Info and encoded canonically (dataplanes/p4/client.py encode)."""
from __future__ import annotations

import ipaddress
from typing import Sequence

from p4.v1 import p4runtime_pb2

from dataplanes.p4.client import P4RuntimeError, encode
from dataplanes.p4.pipeline import FLOOD_GROUP, MIRROR_SESSION, Pipeline
from mbalancer.macs import mac_bytes

Match = dict[str, "int | tuple[int, int]"]  # field -> exact value, or (low, high) for a range

INSERT, MODIFY, DELETE = p4runtime_pb2.Update.INSERT, p4runtime_pb2.Update.MODIFY, p4runtime_pb2.Update.DELETE


def table_entry(pipeline: Pipeline, table: str, match: Match, action: str | None = None,
                params: dict[str, int] | None = None, priority: int = 0, metadata: bytes = b"") -> p4runtime_pb2.Entity:
    """An entity holding one entry of `table`; `action` None: the entry's key only (a delete, a read). `metadata`:
    bytes the switch keeps with the entry for the controller and gives back when it is read (P4Runtime's
    TableEntry.metadata; the program never sees them)."""
    spec = pipeline.table(table)
    entity = p4runtime_pb2.Entity()
    entry = entity.table_entry
    entry.table_id = spec.id
    entry.priority = priority
    entry.metadata = metadata
    for name, value in match.items():
        if name not in spec.fields:
            raise P4RuntimeError(f"table {table} has no match field {name!r}")
        field_id, width = spec.fields[name]
        field = entry.match.add(field_id=field_id)
        if isinstance(value, tuple):
            field.range.low, field.range.high = encode(value[0], width), encode(value[1], width)
        else:
            field.exact.value = encode(value, width)
    if action is not None:
        if action not in spec.actions:
            raise P4RuntimeError(f"table {table} has no action {action!r}")
        act = pipeline.action(action)
        entry.action.action.action_id = act.id
        for name, value in (params or {}).items():
            param_id, width = act.params[name]
            entry.action.action.params.add(param_id=param_id, value=encode(value, width))
    return entity


def default_action(pipeline: Pipeline, table: str, action: str, params: dict[str, int] | None = None
                   ) -> p4runtime_pb2.Entity:
    """The default action of `table` (written with MODIFY: a table always has one)."""
    entity = table_entry(pipeline, table, {}, action, params)
    entity.table_entry.is_default_action = True
    return entity


def digest_entry(pipeline: Pipeline, name: str, max_timeout_ns: int, max_list_size: int) -> p4runtime_pb2.Entity:
    """The digest `name` turned on: its samples sent in lists of up to `max_list_size`, none held longer than
    `max_timeout_ns`; never deduplicated (ack_timeout_ns 0: no acknowledgement is needed)."""
    entity = p4runtime_pb2.Entity()
    entry = entity.digest_entry
    entry.digest_id = pipeline.digest(name)
    entry.config.max_timeout_ns = max_timeout_ns
    entry.config.max_list_size = max_list_size
    entry.config.ack_timeout_ns = 0
    return entity


def update(kind: int, entity: p4runtime_pb2.Entity) -> p4runtime_pb2.Update:
    return p4runtime_pb2.Update(type=kind, entity=entity)


def counter_read(pipeline: Pipeline, counter: str, index: int | None = None) -> p4runtime_pb2.Entity:
    """A read of one cell of `counter`, or of every cell (index None)."""
    entity = p4runtime_pb2.Entity()
    entity.counter_entry.counter_id = pipeline.counter(counter)
    if index is not None:
        entity.counter_entry.index.index = index
    return entity


def counter_write(pipeline: Pipeline, counter: str, index: int, packets: int = 0) -> p4runtime_pb2.Entity:
    """A cell of `counter` set to `packets` (a reused slot's counters start again)."""
    entity = counter_read(pipeline, counter, index)
    entity.counter_entry.data.packet_count = packets
    return entity


def clone_session(cpu_port: int) -> p4runtime_pb2.Entity:
    """The program's clone session (mirrored writes) to the CPU port: PacketIns."""
    entity = p4runtime_pb2.Entity()
    session = entity.packet_replication_engine_entry.clone_session_entry
    session.session_id = MIRROR_SESSION
    session.replicas.add(egress_port=cpu_port, instance=1)
    return entity


def flood_group(ports: Sequence[int]) -> p4runtime_pb2.Entity:
    """The multicast group a frame for an unknown destination is flooded to (its own port pruned in egress)."""
    entity = p4runtime_pb2.Entity()
    group = entity.packet_replication_engine_entry.multicast_group_entry
    group.multicast_group_id = FLOOD_GROUP
    for port in ports:
        group.replicas.add(egress_port=port, instance=1)
    return entity


def mac_value(mac: str) -> int:
    """A MAC's value in a match field or parameter (macs.mac_text reads it back)."""
    return int.from_bytes(mac_bytes(mac), "big")


def ip_value(ip: str) -> int:
    return int(ipaddress.IPv4Address(ip))


def key_value(key: bytes) -> int:
    """A memcached key as hot_keys matches it: its bytes as one big-endian number (with its length beside)."""
    return int.from_bytes(key, "big")


# --- reading entities back, by name ----------------------------------------------------------------------------
def match_of(pipeline: Pipeline, table: str, entity: p4runtime_pb2.Entity) -> Match:
    """A read table entry's match fields by name: exact -> value, range -> (low, high)."""
    names = {field_id: name for name, (field_id, _) in pipeline.table(table).fields.items()}
    found: Match = {}
    for field in entity.table_entry.match:
        kind = field.WhichOneof("field_match_type")
        if kind == "range":
            found[names[field.field_id]] = (number(field.range.low), number(field.range.high))
        elif kind == "exact":
            found[names[field.field_id]] = number(field.exact.value)
    return found


def params_of(pipeline: Pipeline, action: str, entity: p4runtime_pb2.Entity) -> dict[str, int]:
    """A read table entry's action parameters by name (empty if its action is another)."""
    act = pipeline.action(action)
    taken = entity.table_entry.action.action
    if taken.action_id != act.id:
        return {}
    names = {param_id: name for name, (param_id, _) in act.params.items()}
    return {names[p.param_id]: number(p.value) for p in taken.params}


def entry_key(entity: p4runtime_pb2.Entity) -> tuple:
    """What names a table entry in its table (its table, match and priority): an entry read back and one to write
    are the same entry where their keys are equal."""
    entry = entity.table_entry
    fields = []
    for field in entry.match:  # by value: a switch may give a value back padded to its field's bytes
        if field.WhichOneof("field_match_type") == "range":
            fields.append((field.field_id, number(field.range.low), number(field.range.high)))
        else:
            fields.append((field.field_id, number(field.exact.value)))
    return entry.table_id, tuple(sorted(fields)), entry.priority


def action_of(entity: p4runtime_pb2.Entity) -> tuple:
    """A table entry's action and parameters by value, and its metadata: what a MODIFY would change."""
    action = entity.table_entry.action.action
    return (action.action_id, tuple(sorted((p.param_id, number(p.value)) for p in action.params)),
            entity.table_entry.metadata)


def number(value: bytes) -> int:
    return int.from_bytes(value, "big")
