"""Hot keys from the eBPF switch itself (`mbalancer monitor --source dataplane`): no packet is copied to user space.

The program counts every get's key in a count-min sketch and keeps the keys with the largest estimates as
candidates, per epoch (dataplanes/bpf/src/sketch.h). Each interval the reader here flips the epoch, waits for
packets already in the program to finish, reads the finished epoch (candidates, gets per destination), zeroes it
for its next turn and writes the same report as the capture-based monitor. The switch counts only while a reader
renews the sketch's deadline (RENEW intervals ahead), so a reader that dies stops the cost within seconds.
"""
from __future__ import annotations

import math
import time

from dataplanes.bpf.tables import SKETCH_BITS
from mbalancer.monitor_report import KeyRate, MonitorReport

# data planes that count gets themselves (openflow: in its key classifier; p4: read through the controller)
SKETCH_KINDS = ("ebpf", "openflow", "p4")
RENEW = 3  # intervals ahead the deadline is set at each read
SETTLE = 0.002  # s after a flip before the finished epoch is read: a program run takes microseconds


def overstatement(total: int) -> int:
    """How much a count-min estimate may overstate a key's count among `total` gets: e * total / width, exceeded
    with probability e^-rows (2% with 4 rows)."""
    return math.ceil(math.e * total / (1 << SKETCH_BITS))


class SketchReader:
    """Reports from one switch's sketch. start() turns counting on, read() ends an interval, stop() turns it off."""

    def __init__(self, tables, top: int, interval: float):  # the eBPF Tables, a P4Sketch or a ControllerSketch
        if top < 1 or not interval > 0:
            raise ValueError("top >= 1 and interval > 0 are required")
        self.tables, self.top, self.interval = tables, top, interval
        self.epoch = 0
        self.window_start = 0.0
        self.counters: dict[str, int] = {}
        self.totals = {"gets": 0, "reports": 0}

    def start(self) -> None:
        for epoch in (0, 1):  # whatever an earlier reader left
            self.tables.clear_sketch(epoch)
            self.tables.take_sketch_destinations(epoch)
        self.epoch = 0
        self._renew()
        self.counters = self.tables.counters()
        self.window_start = time.time()

    def stop(self) -> None:
        self.tables.set_sketch_control(0, self.epoch)

    def read(self) -> MonitorReport:
        """End the interval now: flip the epoch and report the one that finished."""
        finished = self.epoch
        self.epoch ^= 1
        self._renew()
        end = time.time()
        time.sleep(SETTLE)
        candidates = self.tables.heavy_keys(finished, self.top)
        destinations, elsewhere = self.tables.take_sketch_destinations(finished)
        self.tables.clear_sketch(finished)
        counters, before = self.tables.counters(), self.counters
        self.counters = counters
        length = max(end - self.window_start, 1e-6)
        self.window_start = end
        total = sum(destinations.values()) + elsewhere  # in `servers` only where the switch could tell
        error = overstatement(total)
        top = tuple(KeyRate(h.key, h.count / length, h.count, h.count / max(total, 1), error, h.server)
                    for h in candidates)
        seen = {name: counters[name] - before.get(name, 0) for name in ("packets", "memcached", "unparsed")}
        self.totals["gets"] += total
        self.totals["reports"] += 1
        return MonitorReport(time=end, interval=length, total=total, rate=total / length, top=top,
                             servers={to: n / length for to, n in sorted(destinations.items())},
                             packets=seen["memcached"], skipped={"unparsed": seen["unparsed"]} if seen["unparsed"]
                             else {}, ignored=seen["packets"] - seen["memcached"])

    def _renew(self) -> None:
        self.tables.set_sketch_control(time.monotonic_ns() + int(RENEW * self.interval * 1e9), self.epoch)
