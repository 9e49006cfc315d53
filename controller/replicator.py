"""Copies of hot items between memcached servers, over meta commands (value, flags and remaining TTL kept).

One MetaClient per server, used only from the core's worker thread. Errors are returned per server, never
raised, so one dead replica does not stop the copies to the others; and a server the health checker already
finds failing is not tried at all (`unavailable`), so a hung server holds up nothing but its own copies.

Updates of a copy are conditional: each names the CAS the replica gave the copy it replaces (`ms ... C<cas>`). A
copy that timed out may still land later (the kernel delivers what was sent once the path or the server is back,
e.g. after a hang); by then the replica was refilled, its CAS changed, and the late copy is refused instead of
overwriting a newer value. A copy whose outcome is unknown is forgotten, so the next write there is a refill.
"""
from __future__ import annotations

import logging
from typing import Callable, Iterable, Sequence

from mbalancer.memcache.addresses import ServerAddress
from mbalancer.memcache.meta import Connect, ItemVersion, MetaClient, MetaError, StoredItem, tcp_connect

log = logging.getLogger(__name__)


class Replicator:
    def __init__(self, servers: Sequence[ServerAddress], timeout: float = 1.0,
                 unavailable: Callable[[int], str | None] = lambda server: None, connect: Connect = tcp_connect):
        """unavailable(server): why the server is not worth trying now, or None; connect: how a server is reached
        (TCP; mbalancer/memcache/memory.py's servers for tests that need no sockets)."""
        self.clients = [MetaClient(s, timeout, connect) for s in servers]
        self.unavailable = unavailable
        self.copy_cas: dict[tuple[bytes, int], int] = {}  # (key, server) -> the CAS the server gave our last copy
        self.copies = 0  # items written to replicas
        self.bytes_copied = 0
        self.failures = 0

    def read(self, server: int, key: bytes) -> StoredItem | None:
        """The item on `server` (None on a miss); raises MetaError if the server cannot be read."""
        return self._client(server).get(key)

    def items(self, server: int, keys: list[bytes]) -> list[StoredItem | None]:
        """Each key's item on `server` (None on a miss) in one round trip; raises MetaError."""
        return self._client(server).items(keys)

    def version(self, server: int, key: bytes) -> ItemVersion | None:
        """The item's CAS and TTL on `server` (None on a miss); raises MetaError."""
        return self._client(server).version(key)

    def versions(self, server: int, keys: list[bytes]) -> list[ItemVersion | None]:
        """The CAS and TTL of each key on `server` in one round trip; raises MetaError."""
        return self._client(server).versions(keys)

    def write(self, key: bytes, item: StoredItem, targets: Iterable[int], update: bool = False) -> dict[int, str]:
        """Store `item` on each target; `update`: only over the copy made last (conditional on its CAS; a target
        without a known copy is written as it is). Returns {server: error} for the ones that failed."""
        failed = {}
        for server in targets:
            expected = self.copy_cas.pop((key, server), None) if update else None
            self.copy_cas.pop((key, server), None)  # unknown until the write answers
            try:
                self.copy_cas[(key, server)] = self._client(server).set(key, item, expected)
                self.copies += 1
                self.bytes_copied += len(item.value)
            except (MetaError, ValueError) as err:
                failed[server] = str(err)
        self.failures += len(failed)
        return failed

    def delete(self, key: bytes, targets: Iterable[int], update: bool = False) -> dict[int, str]:
        """Delete the key on each target (absent counts as done; `update`: only the copy made last); returns
        {server: error} for failures."""
        failed = {}
        for server in targets:
            expected = self.copy_cas.pop((key, server), None) if update else None
            try:
                self._client(server).delete(key, expected)
            except MetaError as err:
                failed[server] = str(err)
        self.failures += len(failed)
        return failed

    def _client(self, server: int) -> MetaClient:
        why = self.unavailable(server)
        if why is not None:
            raise MetaError(why)
        return self.clients[server]

    def close(self) -> None:
        for client in self.clients:
            client.close()
