"""Each memcached's own count of gets (`stats` cmd_get), read by one thread of the core every COUNT_EVERY seconds:
what the servers say they served, the third source beside the plan and the switch (controller/measured_balance.py).

`stats` counts nothing itself (the health probes read it ten times a second for the same reason). One connection
per server, kept open; a server that does not answer within TIMEOUT is named with why, and the others are still
read. The two latest reads of each server are replaced whole, so readers on other threads never see half a read.
"""
from __future__ import annotations

from typing import Callable, Sequence

from controller.measured_balance import GetCount, Spread, servers_spread
from mbalancer.memcache.addresses import ServerAddress
from mbalancer.memcache.meta import MetaClient, MetaError

TIMEOUT = 0.25  # seconds a server's stats may take (a hung one delays the next server's read by at most this)


class ServerGets:
    def __init__(self, addresses: Sequence[ServerAddress], clock: Callable[[], float]):
        self.clock = clock
        self._clients = [MetaClient(address, timeout=TIMEOUT) for address in addresses]
        empty: tuple[GetCount | None, ...] = (None,) * len(addresses)
        self._reads = (empty, empty, (None,) * len(addresses))  # (before, latest, error of the latest try)

    def read(self) -> None:
        """Read every server's cmd_get once (blocking: the core's own thread calls this)."""
        latest = self._reads[1]
        before, after, errors = [], [], []
        for index, client in enumerate(self._clients):
            gets, error = _cmd_get(client)
            # a server not reached starts afresh once it answers: a rate across the gap would hide the gap
            before.append(None if error else latest[index])
            after.append(None if error else GetCount(gets, self.clock()))
            errors.append(error)
        self._reads = (tuple(before), tuple(after), tuple(errors))

    def spread(self) -> Spread:
        """gets/s per server between the two latest reads (from any thread)."""
        before, latest, errors = self._reads
        return servers_spread(before, latest, errors, self.clock())

    def close(self) -> None:
        for client in self._clients:
            client.close()


def _cmd_get(client: MetaClient) -> tuple[int, str | None]:
    """The server's cmd_get, or why it cannot be had."""
    try:
        return int(client.stats()["cmd_get"]), None
    except MetaError as err:
        return 0, f"not reached ({err})"
    except (KeyError, ValueError):
        return 0, "its stats have no cmd_get: is it memcached?"
