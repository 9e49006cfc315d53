"""Adaptive sampling in the kernel for live capture (`--sample auto`, the default).

A capture that cannot keep up loses requests in its socket's buffer, and a monitor that loses them at random
still ranks keys right, but one that falls behind reports late and wrong. So when the kernel says the socket
dropped more than DROP_TOLERATED of an interval's requests, the next interval keeps only 1 in k of them (the
kernel's random number, in the socket filter), k chosen so that what got through fits with HEADROOM to spare;
once the monitor is idle again (no drop and under CALM_CPU of a core for CALM_REPORTS intervals) k halves. k
changes only between two intervals, counts are scaled by their interval's k, and each report carries its k
(`sample`) and what the kernel received and dropped.
"""
from __future__ import annotations

import logging
import math
import time
from typing import Any, Protocol

log = logging.getLogger(__name__)

MAX_SAMPLE = 1024
DROP_TOLERATED = 0.01  # share of an interval's requests the socket may drop before k rises
HEADROOM = 0.7  # k aims at this share of what the monitor got through in the interval that dropped
CALM_CPU = 0.35  # of a core: below this for CALM_REPORTS intervals without a drop, k halves
CALM_REPORTS = 3


class Resampled(Protocol):
    sample: int

    def set_sample(self, sample: int) -> None: ...


class AdaptiveSampling:
    """Called with each report of a live capture; sets the capture's next k and returns it (the monitor scales the
    next interval's counts by it)."""

    def __init__(self, capture: Resampled, floor: int = 1):
        self.capture, self.floor = capture, floor
        self.calm = 0
        self.range = (capture.sample, capture.sample)  # the smallest and largest k used
        self._cpu, self._wall = time.process_time(), time.monotonic()

    def __call__(self, report: dict[str, Any]) -> int:
        cpu, wall = time.process_time(), time.monotonic()
        busy = (cpu - self._cpu) / max(wall - self._wall, 1e-6)
        self._cpu, self._wall = cpu, wall
        k, why = self.next_sample(report.get("kernel_received", 0), report.get("kernel_dropped", 0), busy)
        if k != self.capture.sample:
            log.warning("sampling 1 in %d requests from now (was 1 in %d): %s", k, self.capture.sample, why)
            self.capture.set_sample(k)
            self.range = (min(self.range[0], k), max(self.range[1], k))
        return k

    def next_sample(self, received: int, dropped: int, busy: float) -> tuple[int, str]:
        """k for the next interval, and why, from this one's requests through the filter (dropped included), those
        dropped, and the monitor's CPU in cores."""
        k = self.capture.sample
        if received and dropped > DROP_TOLERATED * received:
            self.calm = 0
            kept = max(received - dropped, 1)
            wanted = min(MAX_SAMPLE, max(2 * k, math.ceil(k * received / (kept * HEADROOM))))
            return wanted, f"the socket dropped {dropped} of {received} requests ({100 * dropped / received:.0f}%)"
        if dropped == 0 and busy < CALM_CPU and k > self.floor:
            self.calm += 1
            if self.calm >= CALM_REPORTS:
                self.calm = 0
                return max(self.floor, k // 2), f"no drop and {busy:.2f} of a core for {CALM_REPORTS} intervals"
            return k, ""
        self.calm = 0
        return k, ""
