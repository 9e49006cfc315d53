"""The monitor report, defined once: what `mbalancer monitor` writes (--json lines, --push bodies) and what the
controller reads (POST /report).

FIELDS documents every field (the monitor's --help and the README point here); MonitorReport.to_json() writes a
report; parse_report() reads one back and refuses anything malformed with a ReportError naming the field, so a bad
POST gets a 400, not a crash. Only time, interval, rate and top are required: the rest describes the capture and
has defaults, so a hand-written or third-party report of the hot keys is enough for the controller.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from mbalancer.memcache.keys import key_from_text, key_problem, key_to_text

FIELDS = {
    "time": "end of the interval, in seconds (capture time; a pcap's own timestamps)",
    "interval": "length of the interval in seconds",
    "total": "gets counted in the interval, scaled by sample",
    "rate": "gets/s of the interval (total / interval)",
    "top": "the hottest keys, hottest first: objects with key, count, rate, share, error",
    "top[].key": "the key as text (bytes that are not UTF-8 kept as surrogate escapes, so any key survives JSON)",
    "top[].count": "estimated gets of the key, scaled by sample",
    "top[].rate": "gets/s of the key",
    "top[].share": "the key's part of all gets counted",
    "top[].error": "how much count may overstate the truth (Space-Saving bound; with --source dataplane the "
                   "count-min sketch's, exceeded with probability e^-4)",
    "top[].server": "ip:port the clients sent the key's gets to (its home as they hash it; \"\" if not seen)",
    "servers": "gets/s per ip:port the clients sent them to (before any rewrite: the load as the clients spread it)",
    "packets": "frames read in the interval",
    "sample": "1 in sample requests was kept (sampled in the kernel); counts are scaled back",
    "skipped": "memcached-port payloads that are not readable requests, by reason",
    "ignored": "frames of other traffic",
    "kernel_received": "live capture only: packets the kernel's filter passed to the socket",
    "kernel_dropped": "live capture only: packets the socket lost for lack of buffer (counts are short by that much)",
}


MAX_SERVERS = 4096  # destinations one report may list
MAX_RATE = 1e9  # gets/s: more than any link carries (100 Gbit/s of the smallest gets); sums stay finite


class ReportError(ValueError):
    """A report that cannot be used; the message names the field."""


@dataclass(frozen=True)
class KeyRate:
    key: bytes
    rate: float  # gets/s over the report's interval
    count: float = 0.0
    share: float = 0.0
    error: float = 0.0
    server: str = ""  # ip:port its gets were sent to

    def to_json(self) -> dict[str, Any]:
        return {"key": key_to_text(self.key), "count": self.count, "rate": self.rate, "share": self.share,
                "error": self.error, "server": self.server}


@dataclass(frozen=True)
class MonitorReport:
    time: float
    interval: float
    rate: float  # all gets/s the monitor saw, hot or not
    top: tuple[KeyRate, ...]  # hottest first
    total: float = 0.0
    packets: int = 0
    sample: int = 1
    skipped: dict[str, int] = field(default_factory=dict)
    ignored: int = 0
    kernel_received: int | None = None  # live capture only
    kernel_dropped: int | None = None
    servers: dict[str, float] = field(default_factory=dict)  # gets/s per destination ip:port

    @property
    def top_rate(self) -> float:
        return sum(k.rate for k in self.top)

    def to_json(self) -> dict[str, Any]:
        report = {"time": self.time, "interval": self.interval, "total": self.total, "rate": self.rate,
                  "top": [k.to_json() for k in self.top], "packets": self.packets, "sample": self.sample,
                  "skipped": dict(self.skipped), "ignored": self.ignored, "servers": dict(self.servers)}
        for name in ("kernel_received", "kernel_dropped"):
            if getattr(self, name) is not None:
                report[name] = getattr(self, name)
        return report


def parse_report(raw: Any) -> MonitorReport:
    """Check a decoded report (a dict from JSON); fields it does not know are ignored (newer monitors may add
    some). Top keys come back hottest first, and the rate is at least the sum of the top keys' rates."""
    if not isinstance(raw, dict):
        raise ReportError("report: must be a JSON object")
    interval = _number(raw, "interval", positive=True)
    rate = _number(raw, "rate", most=MAX_RATE)
    top = raw.get("top")
    if not isinstance(top, list):
        raise ReportError("top: must be a list of {key, rate}")
    keys = tuple(sorted((_key_rate(i, entry) for i, entry in enumerate(top)), key=lambda k: k.rate, reverse=True))
    skipped = raw.get("skipped", {})
    if not isinstance(skipped, dict) or not all(isinstance(k, str) and _is_count(v) for k, v in skipped.items()):
        raise ReportError("skipped: must be an object of reason -> count")
    servers = raw.get("servers", {})
    if not isinstance(servers, dict) or len(servers) > MAX_SERVERS:
        raise ReportError(f"servers: must be an object of ip:port -> gets/s (at most {MAX_SERVERS})")
    servers = {str(to): _number(servers, to, where="servers", most=MAX_RATE) for to in servers}
    return MonitorReport(
        time=_number(raw, "time"), interval=interval, rate=max(rate, sum(k.rate for k in keys)), top=keys,
        servers=servers,
        total=_number(raw, "total", default=0.0), packets=_count(raw, "packets", 0), sample=_count(raw, "sample", 1),
        skipped=dict(skipped), ignored=_count(raw, "ignored", 0),
        kernel_received=_count(raw, "kernel_received", None), kernel_dropped=_count(raw, "kernel_dropped", None))


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
    server = entry.get("server", "")
    if not isinstance(server, str) or len(server) > 64:
        raise ReportError(f"{where}.server: must be a string ip:port")
    extras = (_number(entry, name, where=where, default=0.0) for name in ("count", "share", "error"))
    return KeyRate(key, _number(entry, "rate", where=where, most=MAX_RATE), *extras, server)


def _number(raw: dict, name: str, positive: bool = False, where: str = "", default: float | None = None,
            most: float | None = None) -> float:
    label = f"{where}.{name}" if where else name
    if name not in raw and default is not None:
        return default
    value = raw.get(name)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ReportError(f"{label}: must be a number (got {value!r})")
    if value < 0 or (positive and value == 0):
        raise ReportError(f"{label}: must be {'positive' if positive else 'non-negative'} (got {value})")
    if most is not None and value > most:
        raise ReportError(f"{label}: at most {most:g} (got {value:g})")
    return float(value)


def _count(raw: dict, name: str, default: int | None) -> int | None:
    if name not in raw:
        return default
    if not _is_count(raw[name]):
        raise ReportError(f"{name}: must be a count (got {raw[name]!r})")
    return raw[name]


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
