"""Reading back what the switches of a slot book hold, for a controller that takes over (controller/adoption.py).

A new leader's driver opens the switches its predecessor wrote and finds their hot keys in place: each key's entry
(slot, home, replicas and weights), each switch's write and unsure counts and the counts the key was synced to
(clean, or held dirty), and each switch's lease (one that ran out, or that a switch cannot tell, and no key is
trusted as it is: each is resynced). Where every switch holds the same entry, the key is kept in the
book as installed (its slot taken, its stamps counted from now): nothing in the switches changes, and gets go on
as they went. A key the switches disagree on (another entry, missing on one, a slot two keys claim) or whose entry
names a server the config does not have cannot be kept by the book: it is deleted from every switch holding it,
and returned with why, so the core rebuilds it alone.
"""
from __future__ import annotations

import time
from collections import Counter
from typing import Sequence

from dataplanes.driver import Distrust, FoundKey, ReplicaWeight, WriteStamp
from dataplanes.pipeline import MAX_HOT, MAX_REPLICAS, WEIGHT_ONE
from dataplanes.slot_book import HotEntry, SlotBook


def read_back(book: SlotBook, now_ns: int | None = None) -> list[FoundKey]:
    """Every hot key the book's switches hold (the switches just handed in with `use`), kept in the book where they
    agree; raises what the switches' adapters raise (the caller names it)."""
    now_ns = time.monotonic_ns() if now_ns is None else now_ns
    with book.lock:
        held = [switch.held_keys() for switch in book.switches]
        leases = [switch.lease() for switch in book.switches] if any(held) else []
        lease_distrust = (Distrust.LEASE_UNKNOWN if None in leases else
                          Distrust.LEASE_EXPIRED if any(lease <= now_ns for lease in leases) else None)
        agreed, refused = _agreed(held, len(book.servers))
        found = []
        for key, (entry, why) in refused.items():
            for switch, holds in zip(book.switches, held):
                if key in holds:
                    switch.delete_hot(key, holds[key])
            found.append(FoundKey(key, entry.home, replica_weights(entry), None, why))
        entries = list(agreed.items())  # each switch's counts of every key in one call, every switch at once
        cells = [(entry.slot, entry.home) for _, entry in entries]
        counted = book.fan_out.run([lambda s=s: s.write_counts(cells) for s in book.switches],
                                   book.errors).results() if entries else []
        for i, (key, entry) in enumerate(entries):
            counts = tuple(of_switch[i] for of_switch in counted)
            clean = all(s.synced_counts(entry.slot) == c for s, c in zip(book.switches, counts))
            book.take(key, entry, tuple(writes for writes, _ in counts))
            found.append(FoundKey(key, entry.home, replica_weights(entry), WriteStamp(0, counts) if clean else None,
                                  lease_distrust))
        return found


def _agreed(held: Sequence[dict[bytes, HotEntry]], servers: int
            ) -> tuple[dict[bytes, HotEntry], dict[bytes, tuple[HotEntry, Distrust]]]:
    """The keys every switch holds alike with an entry the config can place, and the others with why not."""
    agreed: dict[bytes, HotEntry] = {}
    refused: dict[bytes, tuple[HotEntry, Distrust]] = {}
    for key in dict.fromkeys(k for holds in held for k in holds):
        entries = [holds.get(key) for holds in held]
        entry = next(e for e in entries if e is not None)
        if any(e != entry for e in entries):
            refused[key] = (entry, Distrust.TABLES_DISAGREE)
        elif not placeable(entry, servers):
            refused[key] = (entry, Distrust.NOT_PLACEABLE)
        else:
            agreed[key] = entry
    claims = Counter(entry.slot for entry in agreed.values())
    for key in [k for k, entry in agreed.items() if claims[entry.slot] > 1]:
        refused[key] = (agreed.pop(key), Distrust.TABLES_DISAGREE)
    return agreed, refused


def placeable(entry: HotEntry, servers: int) -> bool:
    """Whether the entry is one this book could have written with the config's `servers`."""
    return (0 <= entry.slot < MAX_HOT and 1 <= len(entry.servers) <= MAX_REPLICAS
            and len(entry.cumulative) == len(entry.servers)
            and all(0 <= s < servers for s in (entry.home, *entry.servers)))


def replica_weights(entry: HotEntry) -> tuple[ReplicaWeight, ...]:
    """The entry's replicas with their shares, from the cumulative weights its table holds."""
    shares, below = [], 0
    for cumulative in entry.cumulative:
        shares.append(max(cumulative - below, 0) / WEIGHT_ONE)
        below = max(below, cumulative)
    return tuple(ReplicaWeight(server, share) for server, share in zip(entry.servers, shares))
