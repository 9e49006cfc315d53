"""Copies of hot items between memcached servers, over meta commands (value, flags and remaining TTL kept).

One MetaClient per server, used only from the core's worker thread. Errors are returned per server, never
raised, so one dead replica does not stop the copies to the others.
"""
from __future__ import annotations

import logging
from typing import Iterable, Sequence

from mbalancer.memcache.addresses import ServerAddress
from mbalancer.memcache.meta import MetaClient, MetaError, StoredItem

log = logging.getLogger(__name__)


class Replicator:
    def __init__(self, servers: Sequence[ServerAddress], timeout: float = 1.0):
        self.clients = [MetaClient(s, timeout) for s in servers]
        self.copies = 0  # items written to replicas
        self.bytes_copied = 0
        self.failures = 0

    def read(self, server: int, key: bytes) -> StoredItem | None:
        """The item on `server` (None on a miss); raises MetaError if the server cannot be read."""
        return self.clients[server].get(key)

    def cas(self, server: int, key: bytes) -> int | None:
        """The item's CAS on `server` (None on a miss); raises MetaError."""
        return self.clients[server].cas(key)

    def write(self, key: bytes, item: StoredItem, targets: Iterable[int]) -> dict[int, str]:
        """Store `item` on each target; returns {server: error} for the ones that failed."""
        failed = {}
        for server in targets:
            try:
                self.clients[server].set(key, item)
                self.copies += 1
                self.bytes_copied += len(item.value)
            except (MetaError, ValueError) as err:
                failed[server] = str(err)
        self.failures += len(failed)
        return failed

    def delete(self, key: bytes, targets: Iterable[int]) -> dict[int, str]:
        """Delete the key on each target (absent counts as done); returns {server: error} for failures."""
        failed = {}
        for server in targets:
            try:
                self.clients[server].delete(key)
            except MetaError as err:
                failed[server] = str(err)
        self.failures += len(failed)
        return failed

    def close(self) -> None:
        for client in self.clients:
            client.close()
