"""What the two drivers over BPF maps share beyond the slot book driver (dataplanes/slot_book_driver.py): the eBPF
switch's and the OpenFlow data plane's, whose key classifier is the same program. Their book is a KeyTables (the
maps of every copy of the program), forwarding goes into the maps, and a reloaded copy is noticed by its pins.
"""
from __future__ import annotations

from typing import Sequence

from dataplanes.bpf.key_tables import KeyTables
from dataplanes.driver import ForwardingEntry, FoundKey, StreamId
from dataplanes.slot_book_driver import SlotBookDriver
from mbalancer.settings import Server


class BpfMapsDriver(SlotBookDriver):
    book: KeyTables

    def set_forwarding(self, entries: Sequence[ForwardingEntry]) -> None:
        self.book.set_forwarding(entries)

    def stream_start(self, stream: StreamId) -> int | None:
        return self.book.stream_start(stream)

    def unsure_quiet(self, server: int) -> float | None:
        return self.book.unsure_quiet(server)

    def rearm_unsure(self, server: int) -> None:
        self.book.rearm_unsure(server)

    def set_tcp_homes(self, servers: Sequence[int]) -> None:
        self.book.set_tcp_homes(servers)

    def switches_gone(self) -> list[str]:
        return [p.name for p in self.book.pin_dirs if not (p / "prog").exists()]

    def _open(self, servers: Sequence[Server]) -> list[FoundKey]:
        return self.book.attach(servers)

    def _release(self) -> None:
        self.book.close()

    def _reloaded(self) -> bool:
        """True if a copy of the program came back with new maps (reopened; the core told to install again)."""
        if not self.book.reopen_if_reloaded():
            return False
        self._came_back()
        return True
