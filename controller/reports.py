"""Monitor reports as the controller reads them (the JSON of monitor/monitor.py, POSTed by `mbalancer monitor --push`).

Only what the decisions need is read: when, how long, the total get rate, and the top keys with their rates.
Anything malformed is refused with a ReportError that says which field, so a bad POST gets a 400, not a crash.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from mbalancer.memcache.keys import key_from_text, key_problem


class ReportError(ValueError):
    """A report the controller cannot use; the message names the field."""


@dataclass(frozen=True)
class KeyRate:
    key: bytes
    rate: float  # gets/s over the report's interval


@dataclass(frozen=True)
class MonitorReport:
    time: float
    interval: float
    rate: float  # all gets/s the monitor saw, hot or not
    top: tuple[KeyRate, ...]  # hottest first
    kernel_dropped: int = 0

    @property
    def top_rate(self) -> float:
        return sum(k.rate for k in self.top)


def parse_report(raw: Any) -> MonitorReport:
    """Check a decoded report (a dict from JSON)."""
    if not isinstance(raw, dict):
        raise ReportError("report: must be a JSON object")
    interval = _number(raw, "interval", positive=True)
    rate = _number(raw, "rate")
    top = raw.get("top")
    if not isinstance(top, list):
        raise ReportError("top: must be a list of {key, rate}")
    keys = tuple(_key_rate(i, entry) for i, entry in enumerate(top))
    dropped = raw.get("kernel_dropped", 0)
    if not isinstance(dropped, int) or dropped < 0:
        raise ReportError("kernel_dropped: must be a count")
    ordered = tuple(sorted(keys, key=lambda k: k.rate, reverse=True))
    return MonitorReport(_number(raw, "time"), interval, max(rate, sum(k.rate for k in keys)), ordered, dropped)


def _key_rate(index: int, entry: Any) -> KeyRate:
    where = f"top[{index}]"
    if not isinstance(entry, dict) or not isinstance(entry.get("key"), str):
        raise ReportError(f"{where}: must be an object with a string key")
    try:
        key = key_from_text(entry["key"])
    except UnicodeEncodeError:
        raise ReportError(f"{where}.key: not encodable as bytes") from None
    problem = key_problem(key)
    if problem:
        raise ReportError(f"{where}.key: {problem}")
    return KeyRate(key, _number(entry, "rate", where=where))


def _number(raw: dict, name: str, positive: bool = False, where: str = "") -> float:
    value = raw.get(name)
    label = f"{where}.{name}" if where else name
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ReportError(f"{label}: must be a number (got {value!r})")
    if value < 0 or (positive and value == 0):
        raise ReportError(f"{label}: must be {'positive' if positive else 'non-negative'} (got {value})")
    return float(value)
