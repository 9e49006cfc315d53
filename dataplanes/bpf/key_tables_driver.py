"""What the two drivers over BPF maps share (the eBPF switch's and the OpenFlow data plane's, whose key classifier is
the same program): the driver interface answered by their KeyTables, copies of packets handed to the core, and a
thread of the driver's own that notices a reloaded copy of the program. Each driver adds what is its own: the eBPF
one reads the copies from its mirror links, the OpenFlow one writes OpenFlow rules around the classifier's maps.
"""
from __future__ import annotations

import logging
import threading
from abc import abstractmethod
from typing import Sequence

from dataplanes.bpf.key_tables import KeyTables
from dataplanes.driver import (Counters, Driver, ForwardingEntry, LeftoverKey, MirrorHandler, ReconnectHandler,
                               ReplicaWeight, WriteStamp)
from dataplanes.pipeline import MAX_REPLICAS
from mbalancer.settings import Server

log = logging.getLogger(__name__)
WATCH_EVERY = 0.5  # seconds between checks that the maps open are still the program's (not a reloaded copy's)


class KeyTablesDriver(Driver):
    max_replicas = MAX_REPLICAS
    thread_name = "mbalancer-bpf"

    def __init__(self, keys: KeyTables):
        self.keys = keys
        self.on_mirror: MirrorHandler | None = None
        self.on_reconnect: ReconnectHandler | None = None
        self.mirrors_received = 0  # copies delivered to on_mirror
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # What tests and the HTTP state read of the bookkeeping.
    slots = property(lambda self: self.keys.slots)
    free_slots = property(lambda self: self.keys.free_slots)
    lease_until = property(lambda self: self.keys.lease_until)
    reconnects = property(lambda self: self.keys.reconnects)
    servers = property(lambda self: self.keys.servers)

    def attach(self, servers: Sequence[Server], on_mirror: MirrorHandler,
               on_reconnect: ReconnectHandler | None = None) -> list[LeftoverKey]:
        self.on_mirror, self.on_reconnect = on_mirror, on_reconnect
        leftovers = self.keys.attach(servers)
        self._thread = threading.Thread(target=self._watch, name=self.thread_name, daemon=True)
        self._thread.start()
        return leftovers

    def install_hot_key(self, key: bytes, home: int, replicas: Sequence[ReplicaWeight]) -> None:
        self.keys.install_hot_key(key, home, replicas)

    def set_weights(self, key: bytes, replicas: Sequence[ReplicaWeight]) -> None:
        self.keys.set_weights(key, replicas)

    def remove_hot_key(self, key: bytes) -> None:
        self.keys.remove_hot_key(key)

    def set_dirty(self, key: bytes) -> None:
        self.keys.set_dirty(key)

    def write_stamp(self, key: bytes) -> WriteStamp:
        return self.keys.write_stamp(key)

    def clear_dirty(self, key: bytes, stamp: WriteStamp) -> None:
        self.keys.clear_dirty(key, stamp)

    def renew_lease(self, seconds: float) -> None:
        self.keys.renew_lease(seconds)

    def set_forwarding(self, entries: Sequence[ForwardingEntry]) -> None:
        self.keys.set_forwarding(entries)

    def read_counters(self) -> Counters:
        return self.keys.read_counters()

    def close(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=2)
        self.keys.close()

    # --- for the drivers --------------------------------------------------------------------------------------
    @abstractmethod
    def _watch(self) -> None:
        """The driver's thread, until `_stop`: calls `_reloaded` every WATCH_EVERY seconds."""

    def _deliver(self, frame: bytes) -> None:
        """A copy of a packet (a mirrored write or an unsure request) to the core."""
        self.mirrors_received += 1
        try:
            self.on_mirror(frame)
        except Exception:  # the core queues; a failure there must not end the thread that read the copy
            log.exception("mirror handler failed")

    def _reloaded(self) -> bool:
        """True if a copy of the program came back with new maps: they are reopened, what the driver kept of the
        switch is forgotten, and the core is told to install every hot key again."""
        if not self.keys.reopen_if_reloaded():
            return False
        self._forget_switch_state()
        if self.on_reconnect is not None:
            self.on_reconnect()
        return True

    def _forget_switch_state(self) -> None:
        """What the driver keeps beside the maps, dropped when they come back empty (none here)."""
