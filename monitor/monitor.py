"""Frames in, one report per interval out.

Time comes from the frames (capture time, or the pcap's own timestamps), so a pcap replays its intervals exactly
as they happened, whatever the reading speed. Counts from a 1-in-k sampled capture are multiplied by k.
"""
from __future__ import annotations

import logging
from collections import Counter
from typing import Any, Callable

from mbalancer.memcache.keys import printable_key
from mbalancer.memcache.segment_keys import get_keys
from mbalancer.monitor_report import KeyRate, MonitorReport
from mbalancer.packets import memcached_segment
from monitor.heavy_hitters import SpaceSaving

log = logging.getLogger(__name__)
Report = dict[str, Any]  # a MonitorReport as JSON (mbalancer/monitor_report.py defines every field)
# Frame outcomes that are other traffic, not broken memcached: counted apart from "skipped".
IGNORED = ("not IPv4", "other port", "not UDP or TCP", "IPv4 fragment")
# Empty intervals reported at most for one gap in the traffic: enough for any hysteresis to cool every key. Live
# capture wakes every quarter interval, so only a pcap's gap (or a corrupt timestamp) reaches it.
MAX_EMPTY_REPORTS = 10
KEY_DESTINATIONS = 65536  # keys per interval whose destination is remembered (a hot key shows up early in one)


class Monitor:
    def __init__(self, on_report: Callable[[Report], None], port: int = 11211, top: int = 10,
                 interval: float = 1.0, capacity: int = 1024, sample: int = 1,
                 source_counters: Callable[[], dict[str, int]] | None = None):
        if interval <= 0 or top < 1 or capacity < top or sample < 1:
            raise ValueError("interval > 0, top >= 1, capacity >= top and sample >= 1 are required")
        self.on_report = on_report
        self.source_counters = source_counters  # live capture: the kernel's received/dropped of each interval
        # live capture with adaptive sampling: given each report, returns the k of the next interval
        self.resample: Callable[[Report], int] | None = None
        self.port, self.top, self.interval, self.sample = port, top, interval, sample
        self.summary = SpaceSaving(capacity)
        self.window_start: float | None = None
        self.packets = 0  # frames in this window
        self.skipped: Counter = Counter()  # memcached-port payloads that are not readable requests, by reason
        self.ignored = 0  # other traffic
        self.destinations: Counter = Counter()  # gets per "ip:port" the clients sent them to, this window
        self.key_destination: dict[bytes, str] = {}  # where each key's gets go (the first seen), this window
        self.totals: Counter = Counter()  # over the whole run: packets, gets, skipped, ignored, reports

    def frame(self, timestamp: float, linktype: int, frame: bytes) -> None:
        self.advance(timestamp)
        self.packets += 1
        segment = memcached_segment(frame, linktype, self.port)
        if isinstance(segment, str):
            if segment in IGNORED:
                self.ignored += 1
            else:
                self.skipped[segment] += 1
            return
        keys = get_keys(segment)
        if isinstance(keys, str):
            self.skipped[keys] += 1
        elif keys:
            self.summary.add(keys)
            self.destinations[segment.destination] += len(keys)
            if len(self.key_destination) < KEY_DESTINATIONS:
                for key in keys:
                    self.key_destination.setdefault(key, segment.destination)

    def advance(self, now: float) -> None:
        """Close every interval that ended before `now`, reporting each."""
        if self.window_start is None:
            self.window_start = now
            return
        reports = 0
        while now >= self.window_start + self.interval:
            if reports == MAX_EMPTY_REPORTS:  # a long silence in a pcap: jump to the interval `now` is in
                skipped = (now - self.window_start) // self.interval
                log.warning("no traffic for %.0f s before t=%.3f: %d empty intervals reported, %d skipped",
                            now - self.window_start + reports * self.interval, now, reports, skipped)
                self.window_start += skipped * self.interval
                break
            self._report(self.window_start + self.interval)
            reports += 1

    def finish(self, now: float | None = None) -> None:
        """Report the last, partial interval (end of a pcap, or of a live run)."""
        if self.window_start is None:
            return
        end = now if now is not None else self.window_start + self.interval
        if end > self.window_start:
            self._report(end)

    def _report(self, end: float) -> None:
        hitters = self.summary.top(self.top)  # merges the pending batch, so total is complete
        length = end - self.window_start
        total = self.summary.total * self.sample
        report = MonitorReport(
            time=end, interval=length, total=total, rate=total / length,
            top=tuple(KeyRate(h.key, h.count * self.sample / length, h.count * self.sample,
                              h.count / max(self.summary.total, 1), h.error * self.sample,
                              self.key_destination.get(h.key, "")) for h in hitters),
            servers={to: n * self.sample / length for to, n in sorted(self.destinations.items())},
            packets=self.packets, sample=self.sample, skipped=dict(self.skipped), ignored=self.ignored,
            **(self.source_counters() if self.source_counters else {})).to_json()
        self.totals.update(packets=self.packets, gets=self.summary.total, ignored=self.ignored, reports=1,
                           skipped=sum(self.skipped.values()))
        log.info("interval ending %.3f: %d gets, top %s", end, total,
                 ", ".join(f"{printable_key(t['key'])} {100 * t['share']:.1f}%" for t in report["top"][:3]))
        self.window_start = end
        self.packets, self.ignored = 0, 0
        self.skipped = Counter()
        self.destinations, self.key_destination = Counter(), {}
        self.summary.reset()
        if self.resample is not None:
            self.sample = self.resample(report)
        self.on_report(report)
