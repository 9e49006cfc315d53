"""The driver base of every data plane that keeps its hot keys in a slot book (dataplanes/slot_book.py): the eBPF
switch, the OpenFlow data plane's key classifier, the P4 switch. It answers the driver interface's hot-key calls
from the book, hands copies of packets to the core, and runs a thread of the driver's own that notices switches
that came back empty. Each data plane adds what is its own: how its switches are reached (`_open`, `_release`),
what its thread watches (`_watch`), forwarding, and any record it keeps beside the book (`_forget_switch_state`).
"""
from __future__ import annotations

import logging
import threading
from abc import abstractmethod
from typing import Mapping, Sequence

from dataplanes.driver import (Counters, Driver, DriverError, HotKeyInstall, LeftoverKey, MirrorHandler,
                               ReconnectHandler, ReplicaWeight, StreamId, WriteStamp)
from dataplanes.pipeline import MAX_REPLICAS
from dataplanes.slot_book import SlotBook
from mbalancer.settings import Server

log = logging.getLogger(__name__)
WATCH_EVERY = 0.5  # seconds between checks that the switches are still the ones the book wrote to


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
               on_reconnect: ReconnectHandler | None = None) -> list[LeftoverKey]:
        self.on_mirror, self.on_reconnect = on_mirror, on_reconnect
        leftovers = self._open(servers)
        if leftovers:
            log.warning("removed %d hot keys a previous controller left in the %s: their gets go home",
                        len(leftovers), self.book.what)
        self._thread = threading.Thread(target=self._watch, name=self.thread_name, daemon=True)
        self._thread.start()
        return leftovers

    def install_hot_key(self, key: bytes, home: int, replicas: Sequence[ReplicaWeight]) -> None:
        self.book.install_hot_key(key, home, replicas)

    def install_hot_keys(self, installs: Sequence[HotKeyInstall]) -> dict[bytes, DriverError]:
        return self.book.install_hot_keys(installs)

    def set_weights(self, key: bytes, replicas: Sequence[ReplicaWeight]) -> None:
        self.book.set_weights(key, replicas)

    def remove_hot_key(self, key: bytes) -> None:
        self.book.remove_hot_key(key)

    def remove_hot_keys(self, keys: Sequence[bytes]) -> dict[bytes, DriverError]:
        return self.book.remove_hot_keys(keys)

    def set_dirty(self, key: bytes) -> None:
        self.book.set_dirty(key)

    def write_stamp(self, key: bytes) -> WriteStamp:
        return self.book.write_stamp(key)

    def write_stamps(self, keys: Sequence[bytes]) -> dict[bytes, WriteStamp]:
        return self.book.write_stamps(keys)

    def clear_dirty(self, key: bytes, stamp: WriteStamp) -> None:
        self.book.clear_dirty(key, stamp)

    def clear_dirty_keys(self, stamps: Mapping[bytes, WriteStamp]) -> dict[bytes, DriverError]:
        return self.book.clear_dirty_keys(stamps)

    def renew_lease(self, seconds: float) -> None:
        self.book.renew_lease(seconds)

    def server_closes(self, server: int) -> tuple:
        return self.book.server_closes(server)

    def closes_handled(self, server: int, closes: tuple) -> None:
        self.book.closes_handled(server, closes)

    def resume_stream(self, stream: StreamId, seq: int) -> None:
        self.book.resume_stream(stream, seq)

    def blind_stream(self, stream: StreamId) -> None:
        self.book.blind_stream(stream)

    def read_counters(self) -> Counters:
        return self.book.read_counters()

    def switch_counters(self) -> list[dict[str, int]]:
        """Each switch's own counters (packets, balanced, mirrored, ...)."""
        return self.book.switch_counters()

    def close(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=2)
        with self.book.lock:
            self.book.end_lease()
            self._release()
        self.book.fan_out.close()

    # --- for the drivers --------------------------------------------------------------------------------------
    @abstractmethod
    def _open(self, servers: Sequence[Server]) -> list[LeftoverKey]:
        """Reach the switches, hand them to the book (`book.use`), write what the driver owns there (servers, ports),
        remove the hot keys an earlier controller left and return them."""

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
