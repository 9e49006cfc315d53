"""A simulated fabric: N switches whose hot-key tables are kept in memory (tables.py), driven through the slot book
(dataplanes/slot_book.py), the bookkeeping the eBPF and P4 drivers use for their own N switches: the recording
driver with more switches. Each request to a switch (a single call, or a call on many keys: P4Runtime's one
WriteRequest) takes `delay` seconds, what reaching a switch across the network costs; the book writes `width`
switches at once (1: one after the other), as the P4 and agent drivers do (`parallel`). For measuring one controller
against many switches and servers without them (experiments/benchmarks/bench_controller_scale.py); no packet is
forwarded and nothing is counted but the requests.

Key-range shards (docs/scale.md, "Where it would shard"): several fabrics over the same switches, each driving its
own range of slots (`slots`) through a ShardTables view, whose lease is its shard's alone; a switch serves one
request at a time, whichever controller sent it. A shard's new controller reads back the keys in its own range
(dataplanes/read_back.py) and sees no other.
"""
from __future__ import annotations

from dataplanes.fan_out import FanOut
from dataplanes.pipeline import MAX_HOT
from dataplanes.recording.driver import RecordingDriver
from dataplanes.recording.tables import MemoryTables
from dataplanes.slot_book import HotEntry


# The table calls a hot-set change makes (the one-by-one calls and the batched ones); the core's own threads send
# others whenever they run (the lease, the closes it watches, read-backs), more of them the longer a change takes.
CHANGE_CALLS = frozenset({"set_hot", "delete_hot", "install_keys", "delete_keys", "reset_key_counts", "writes",
                          "unsure", "write_counts", "hold", "set_synced", "set_synced_slots"})


def change_requests(tables: list[MemoryTables]) -> int:
    """The requests of CHANGE_CALLS sent to `tables` so far."""
    return sum(t.calls[call] for t in tables for call in CHANGE_CALLS)


class ShardTables:
    """A key-range shard's view of a switch's tables: its lease is the shard's (an election id and a lease per slot
    range, where the agent today has one per switch), its hot keys those in its range; the rest is the switch's."""

    def __init__(self, tables: MemoryTables, slots: range):
        self.tables, self.slots = tables, slots

    def set_lease(self, until_ns: int) -> None:
        self.tables._request("set_lease")
        self.tables.shard_leases[self.slots.start] = until_ns

    def lease(self) -> int:
        self.tables._request("lease")
        return self.tables.shard_leases.get(self.slots.start, 0)

    def held_keys(self) -> dict[bytes, HotEntry]:
        return {key: entry for key, entry in self.tables.held_keys().items() if entry.slot in self.slots}

    def __getattr__(self, name: str):
        return getattr(self.tables, name)


class SimulatedFabric(RecordingDriver):
    """`switches` simulated switches, each request to one taking `delay` seconds, `width` of them written at once;
    or, as a key-range shard, the `slots` range of shared `tables`."""

    name = "simulated fabric"

    def __init__(self, switches: int, delay: float = 0.0, width: int = 1,
                 tables: list[MemoryTables] | None = None, slots: range | None = None):
        super().__init__(tables if tables is not None else [MemoryTables(delay) for _ in range(switches)],
                         f"simulated fabric of {switches} switches", FanOut(width, "mbalancer-fabric"),
                         slots if slots is not None else MAX_HOT)
        self.shard = slots

    @property
    def requests(self) -> int:
        """Requests sent to every switch so far."""
        return sum(t.requests for t in self.tables)

    @property
    def change_requests(self) -> int:
        """Requests of hot-set changes sent to every switch so far (CHANGE_CALLS)."""
        return change_requests(self.tables)

    def _views(self) -> list:
        return self.tables if self.shard is None else [ShardTables(t, self.shard) for t in self.tables]
