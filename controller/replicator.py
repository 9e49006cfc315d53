"""Copies of hot items between memcached servers, over meta commands (value, flags and remaining TTL kept).

One MetaClient per server, used only from the core's worker thread. Errors are returned per server, never
raised, so one dead replica does not stop the copies to the others; and a server the health checker already
finds failing is not tried at all (`unavailable`), so a hung server holds up nothing but its own copies.

Updates of a copy are conditional: each names the CAS the replica gave the copy it replaces (`ms ... C<cas>`). A
copy that timed out may still land later (the kernel delivers what was sent once the path or the server is back,
e.g. after a hang); by then the replica was refilled, its CAS changed, and the late copy is refused instead of
overwriting a newer value. A copy whose outcome is unknown is forgotten, so the next write there is a refill.

Many keys at once (read_many, write_many, delete_many, versions_many: a hot-set change) are pipelined: `depth`
commands sent to every server they name before any reply is read, so a change costs a few round trips, not one per
copy; each key's error is still its own. A depth of 1 is one round trip per copy, one server after the other. The
calls on one key (write, delete: a push of one key's item) are those of many with one key, its servers at once.
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Iterable, Sequence

from mbalancer.memcache.addresses import ServerAddress
from mbalancer.memcache.meta import Connect, ItemVersion, MetaClient, MetaError, StoredItem, tcp_connect

log = logging.getLogger(__name__)
DEFAULT_DEPTH = 64  # commands per round trip to one server (a change of 1,000 keys on 256 servers: ~28 copies each)


class Replicator:
    def __init__(self, servers: Sequence[ServerAddress], timeout: float = 1.0,
                 unavailable: Callable[[int], str | None] = lambda server: None, depth: int = DEFAULT_DEPTH,
                 connect: Connect = tcp_connect):
        """unavailable(server): why the server is not worth trying now, or None; depth: commands sent to a server
        before its replies are read (1: one round trip each); connect: how a server is reached (TCP;
        mbalancer/memcache/memory.py's servers for tests that need no sockets)."""
        if depth < 1:
            raise ValueError(f"copies per round trip: at least 1 (got {depth})")
        self.depth = depth
        self.clients = [MetaClient(s, timeout, connect) for s in servers]
        self.unavailable = unavailable
        self.copy_cas: dict[tuple[bytes, int], int] = {}  # (key, server) -> the CAS the server gave our last copy
        self.copies = 0  # items written to replicas
        self.bytes_copied = 0
        self.failures = 0

    def read(self, server: int, key: bytes) -> StoredItem | None:
        """The item on `server` (None on a miss); raises MetaError if the server cannot be read."""
        return self._client(server).get(key)

    def items(self, server: int, keys: list[bytes]) -> list[StoredItem | None | MetaError]:
        """Each key's item on `server` (None on a miss), or that key's MetaError (the server's, if it is not worth
        trying now), pipelined."""
        return [_meta_error(outcome) for outcome in self._pipelined("get", {server: keys})[server]]

    def write(self, key: bytes, item: StoredItem, targets: Iterable[int], update: bool = False) -> dict[int, str]:
        """Store `item` on each target; `update`: only over the copy made last (conditional on its CAS; a target
        without a known copy is written as it is). Returns {server: error} for the ones that failed. (write_many
        of one key.)"""
        return self.write_many([(key, item, targets)], update).get(key, {})

    def delete(self, key: bytes, targets: Iterable[int], update: bool = False) -> dict[int, str]:
        """Delete the key on each target (absent counts as done; `update`: only the copy made last); returns
        {server: error} for failures. (delete_many of one key.)"""
        return self.delete_many([(key, targets)], update).get(key, {})

    def adopt_copy(self, key: bytes, server: int, cas: int) -> None:
        """A copy of `key` found on `server` (made before this replicator: adoption), with the CAS it holds: later
        updates there are conditional on it, as on a copy written here."""
        self.copy_cas[(key, server)] = cas

    def read_many(self, reads: Sequence[tuple[bytes, int]]) -> dict[bytes, StoredItem | None | MetaError]:
        """Each (key, its home)'s item there (None on a miss) or the MetaError of that key, pipelined per home."""
        return self._at_homes("get", reads)

    def versions_many(self, keys: Sequence[tuple[bytes, int]]) -> dict[bytes, ItemVersion | None | MetaError]:
        """Each (key, its home)'s CAS and TTL there (None on a miss) or the MetaError of that key, pipelined."""
        return self._at_homes("version", keys)

    def _at_homes(self, kind: str, pairs: Sequence[tuple[bytes, int]]) -> dict[bytes, Any]:
        """The command of `kind` for each (key, server), pipelined per server: each key's outcome, a bad key's
        ValueError as a MetaError."""
        by_server: dict[int, list[bytes]] = {}
        for key, server in pairs:
            by_server.setdefault(server, []).append(key)
        found: dict[bytes, Any] = {}
        for server, outcomes in self._pipelined(kind, by_server).items():
            found.update((key, _meta_error(o)) for key, o in zip(by_server[server], outcomes))
        return found

    def write_many(self, copies: Sequence[tuple[bytes, StoredItem, Iterable[int]]], update: bool = False
                   ) -> dict[bytes, dict[int, str]]:
        """write() of each (key, item, targets), pipelined per target server: {key: {server: error}} for the copies
        that failed (a key whose copies all took is not named)."""
        by_server: dict[int, list[tuple[bytes, StoredItem, int | None]]] = {}
        for key, item, targets in copies:
            for server in targets:
                expected = self.copy_cas.pop((key, server), None) if update else None
                self.copy_cas.pop((key, server), None)  # unknown until the write answers
                by_server.setdefault(server, []).append((key, item, expected))
        failed: dict[bytes, dict[int, str]] = {}
        for server, outcomes in self._pipelined("set", by_server).items():
            for (key, item, _), outcome in zip(by_server[server], outcomes):
                if isinstance(outcome, Exception):
                    failed.setdefault(key, {})[server] = str(outcome)
                else:
                    self.copy_cas[(key, server)] = outcome
                    self.copies += 1
                    self.bytes_copied += len(item.value)
        self.failures += sum(len(f) for f in failed.values())
        return failed

    def delete_many(self, deletes: Sequence[tuple[bytes, Iterable[int]]], update: bool = False
                    ) -> dict[bytes, dict[int, str]]:
        """delete() of each (key, targets), pipelined per target server: {key: {server: error}} for the failures."""
        by_server: dict[int, list[tuple[bytes, int | None]]] = {}
        for key, targets in deletes:
            for server in targets:
                expected = self.copy_cas.pop((key, server), None) if update else None
                by_server.setdefault(server, []).append((key, expected))
        failed: dict[bytes, dict[int, str]] = {}
        for server, outcomes in self._pipelined("delete", by_server).items():
            for (key, _), outcome in zip(by_server[server], outcomes):
                if isinstance(outcome, Exception):
                    failed.setdefault(key, {})[server] = str(outcome)
        self.failures += sum(len(f) for f in failed.values())
        return failed

    def _pipelined(self, kind: str, by_server: dict[int, list]) -> dict[int, list]:
        """The commands of `kind` (MetaClient.send_many) to each server, `depth` at a time: each round sends a chunk
        to every server, then reads their replies (with depth 1, each command's reply before the next is sent).
        Every command's outcome, per server in order (a server not worth trying: its error for each)."""
        outcomes: dict[int, list] = {}
        clients: dict[int, MetaClient] = {}
        for server, commands in by_server.items():
            try:
                clients[server] = self._client(server)
                outcomes[server] = []
            except MetaError as err:
                outcomes[server] = [err] * len(commands)
        for start in range(0, max((len(c) for c in by_server.values()), default=0), self.depth):
            chunks = {server: by_server[server][start:start + self.depth] for server in clients
                      if start < len(by_server[server])}
            if self.depth == 1:  # one round trip each
                for server, chunk in chunks.items():
                    outcomes[server] += clients[server].receive_many(clients[server].send_many(kind, chunk))
                continue
            pending = {server: clients[server].send_many(kind, chunk) for server, chunk in chunks.items()}
            for server, sent in pending.items():
                outcomes[server] += clients[server].receive_many(sent)
        return outcomes

    def _client(self, server: int) -> MetaClient:
        why = self.unavailable(server)
        if why is not None:
            raise MetaError(why)
        return self.clients[server]

    def close(self) -> None:
        for client in self.clients:
            client.close()


def _meta_error(outcome: object) -> object:
    """A bad key's ValueError as the MetaError the callers of read() handle."""
    return MetaError(str(outcome)) if isinstance(outcome, ValueError) else outcome
