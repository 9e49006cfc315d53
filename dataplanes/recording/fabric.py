"""A simulated fabric: N switches whose hot-key tables are kept in memory (tables.py), driven through the slot book
(dataplanes/slot_book.py), the bookkeeping the eBPF and P4 drivers use for their own N switches: the recording
driver with more switches. Each request to a switch (a single call, or a call on many keys: P4Runtime's one
WriteRequest) takes `delay` seconds, what reaching a switch across the network costs; the book writes the switches
one after the other, as the real drivers do. For measuring one controller against many switches and servers without
them (experiments/benchmarks/bench_controller_scale.py); no packet is forwarded and nothing is counted but the
requests.
"""
from __future__ import annotations

from dataplanes.recording.driver import RecordingDriver
from dataplanes.recording.tables import MemoryTables


class SimulatedFabric(RecordingDriver):
    """`switches` simulated switches, each request to one taking `delay` seconds."""

    name = "simulated fabric"

    def __init__(self, switches: int, delay: float = 0.0):
        super().__init__([MemoryTables(delay) for _ in range(switches)], f"simulated fabric of {switches} switches")

    @property
    def requests(self) -> int:
        """Requests sent to every switch so far."""
        return sum(t.requests for t in self.tables)
