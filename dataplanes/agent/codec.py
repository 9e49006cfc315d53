"""The driver interface's values as JSON: what a switch agent and its controller send each other.

JSON has no bytes, tuples, dicts with bytes keys or records, so those are tagged: {"$b": base64}, {"$t": [...]},
{"$d": [[key, value], ...]}, {"$c": "ReplicaWeight", "f": {...}} for the records the interface names (and only
those: a name not in RECORDS is refused, never imported), {"$e": text} for a DriverError in a result.
"""
from __future__ import annotations

import base64
import binascii
import dataclasses
import json
from typing import Any

from dataplanes.driver import (Counters, DriverError, ForwardingEntry, HotKeyInstall, KeyCounters, FoundKey,
                               MacSighting, ReplicaWeight, StreamId, WriteStamp)
from dataplanes.pipeline import HeavyKey
from mbalancer.settings import Server

RECORDS = {cls.__name__: cls for cls in (Counters, ForwardingEntry, HeavyKey, HotKeyInstall, KeyCounters,
                                         FoundKey, MacSighting, ReplicaWeight, Server, StreamId, WriteStamp)}


class CodecError(ValueError):
    """Bytes that are not a message of this codec; the message says what was wrong."""


def dumps(value: Any) -> bytes:
    return json.dumps(_encode(value), separators=(",", ":")).encode()


def loads(data: bytes) -> Any:
    try:
        return _decode(json.loads(data))
    except (ValueError, RecursionError, UnicodeDecodeError) as err:
        raise CodecError(f"not a message: {err}") from None


def _encode(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, bytes):
        return {"$b": base64.b64encode(value).decode()}
    if isinstance(value, tuple):
        return {"$t": [_encode(v) for v in value]}
    if isinstance(value, list):
        return [_encode(v) for v in value]
    if isinstance(value, dict):
        return {"$d": [[_encode(k), _encode(v)] for k, v in value.items()]}
    if isinstance(value, DriverError):
        return {"$e": str(value)}
    if type(value).__name__ in RECORDS and dataclasses.is_dataclass(value):
        return {"$c": type(value).__name__,
                "f": {f.name: _encode(getattr(value, f.name)) for f in dataclasses.fields(value)}}
    raise CodecError(f"cannot send a {type(value).__name__}")


def _decode(value: Any) -> Any:
    if isinstance(value, list):
        return [_decode(v) for v in value]
    if not isinstance(value, dict):
        return value
    if "$b" in value:
        try:
            return base64.b64decode(value["$b"], validate=True)
        except (binascii.Error, TypeError):
            raise CodecError("bad base64") from None
    if "$t" in value:
        return tuple(_decode(v) for v in _list(value["$t"]))
    if "$d" in value:
        pairs = [_decode(p) for p in _list(value["$d"])]
        if not all(isinstance(p, list) and len(p) == 2 for p in pairs):
            raise CodecError("a dict is a list of [key, value] pairs")
        try:
            return {k: v for k, v in pairs}
        except TypeError:
            raise CodecError("a dict key that cannot be one") from None
    if "$e" in value:
        return DriverError(str(value["$e"]))
    if "$c" in value:
        return _record(value)
    raise CodecError(f"an object with none of the tags $b $t $d $e $c: {sorted(value)[:4]}")


def _record(value: dict) -> Any:
    cls = RECORDS.get(value["$c"]) if isinstance(value["$c"], str) else None
    fields = value.get("f")
    if cls is None or not isinstance(fields, dict):
        raise CodecError(f"no record {str(value['$c'])[:40]!r} (one of {', '.join(sorted(RECORDS))})")
    try:
        return cls(**{name: _decode(v) for name, v in fields.items()})
    except TypeError as err:
        raise CodecError(f"{cls.__name__}: {err}") from None


def _list(value: Any) -> list:
    if not isinstance(value, list):
        raise CodecError(f"expected a list, got {type(value).__name__}")
    return value
