"""The driver base of every data plane that keeps its hot keys in a slot book (dataplanes/slot_book.py): the eBPF
switch, the OpenFlow data plane's key classifier, the P4 switch, and the recording driver's in-memory switches. It
answers the driver interface's hot-key calls from the book (dataplanes/driver.py HOT_KEY_CALLS: each a method derived
from that list), hands copies of packets to the core, and runs a thread of the driver's own that notices switches
that came back empty. Each data plane adds what is its own: how its switches are reached (`_open`, `_release`),
what its thread watches (`_watch`), forwarding, and any record it keeps beside the book (`_forget_switch_state`).
"""
from __future__ import annotations

import logging
import threading
from abc import abstractmethod
from typing import Any, Sequence

from dataplanes.driver import (HOT_KEY_CALLS, RULES_REMOVED, Driver, FoundKey, MirrorHandler, ReconnectHandler,
                               forwards)
from dataplanes.pipeline import MAX_REPLICAS
from dataplanes.slot_book import SlotBook
from mbalancer.settings import Server

log = logging.getLogger(__name__)
WATCH_EVERY = 0.5  # seconds between checks that the switches are still the ones the book wrote to


@forwards(HOT_KEY_CALLS, through="_to_book")
class SlotBookDriver(Driver):
    max_replicas = MAX_REPLICAS
    thread_name = "mbalancer-driver"

    def __init__(self, book: SlotBook):
        self.book = book
        self.on_mirror: MirrorHandler | None = None
        self.on_reconnect: ReconnectHandler | None = None
        self.mirrors_received = 0  # copies delivered to on_mirror
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # What tests and the HTTP state read of the bookkeeping.
    slots = property(lambda self: self.book.slots)
    free_slots = property(lambda self: self.book.free_slots)
    lease_until = property(lambda self: self.book.lease_until)
    reconnects = property(lambda self: self.book.reconnects)
    servers = property(lambda self: self.book.servers)

    def attach(self, servers: Sequence[Server], on_mirror: MirrorHandler,
               on_reconnect: ReconnectHandler | None = None) -> list[FoundKey]:
        self.on_mirror, self.on_reconnect = on_mirror, on_reconnect
        found = self._open(servers)
        if found:
            removed = [f for f in found if f.distrust in RULES_REMOVED]
            log.info("read back %d hot keys a previous controller left in the %s (%d removed: %s)", len(found),
                     self.book.what, len(removed), ", ".join(sorted({f.distrust.value for f in removed})) or "none")
        self._thread = threading.Thread(target=self._watch, name=self.thread_name, daemon=True)
        self._thread.start()
        return found

    def _to_book(self, call: str, args: tuple) -> Any:
        """A call of HOT_KEY_CALLS (each one a method of this class, derived from that list): the book's answer."""
        return getattr(self.book, call)(*args)

    def close(self) -> None:
        self._let_go(end_lease=True)

    def let_go(self) -> None:
        self._let_go(end_lease=False)

    def _let_go(self, end_lease: bool) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=2)
        with self.book.lock:
            if end_lease:
                self.book.end_lease()
            self._release()
        self.book.fan_out.close()

    # --- for the drivers --------------------------------------------------------------------------------------
    @abstractmethod
    def _open(self, servers: Sequence[Server]) -> list[FoundKey]:
        """Reach the switches, hand them to the book (`book.use`), write what the driver owns there (servers, ports),
        read back the hot keys an earlier controller left (dataplanes/read_back.py) and return them."""

    @abstractmethod
    def _release(self) -> None:
        """Let go of the switches (under the book's lock, the lease already ended)."""

    @abstractmethod
    def _watch(self) -> None:
        """The driver's thread, until `_stop`: notices switches that came back empty and calls `_came_back`."""

    def _deliver(self, frame: bytes) -> None:
        """A copy of a packet (a mirrored write or an unsure request) to the core."""
        self.mirrors_received += 1
        try:
            self.on_mirror(frame)
        except Exception:  # the core queues; a failure there must not end the thread that read the copy
            log.exception("mirror handler failed")

    def _came_back(self) -> None:
        """Switches returned empty and the book has them again (`book.came_back`): what the driver kept of them is
        forgotten, and the core is told to install every hot key again."""
        log.warning("the %s came back empty: installing every hot key again", self.book.what)
        self._forget_switch_state()
        if self.on_reconnect is not None:
            self.on_reconnect()

    def _forget_switch_state(self) -> None:
        """What the driver keeps beside the book, dropped when the switches come back empty (none here)."""
