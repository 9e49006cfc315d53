"""Fill the servers with every key of a workload before a run, over TCP (pymemcache), each key on its home."""
from __future__ import annotations

import logging
from typing import Callable

from pymemcache.exceptions import MemcacheError

from experiments.workload.spec import Workload
from mbalancer.memcache.client import tcp_client

log = logging.getLogger(__name__)
BATCH = 500  # keys per pipelined set_many


class PopulateError(RuntimeError):
    """A server could not be reached or refused to store keys."""


def populate(workload: Workload, progress: Callable[[str], None] | None = None) -> dict[str, int]:
    """Store every key's value on its home server; returns keys stored per server."""
    by_server: dict[int, list[int]] = {i: [] for i in range(len(workload.servers))}
    for key, home in enumerate(workload.homes):
        by_server[home].append(key)
    stored = {}
    done = 0
    for index, keys in by_server.items():
        server = workload.servers[index]
        client = tcp_client(server, timeout=max(workload.timeout, 5.0))
        try:
            for start in range(0, len(keys), BATCH):
                batch = {workload.key_names[k]: workload.value(k) for k in keys[start:start + BATCH]}
                failed = client.set_many(batch, noreply=False)
                if failed:
                    raise PopulateError(f"{server} did not store {len(failed)} keys, e.g. {failed[0]!r}")
                done += len(batch)
                if progress:
                    progress(f"populate {done}/{workload.keys} keys")
        except (OSError, MemcacheError) as err:
            raise PopulateError(f"cannot populate {server}: {err}") from None
        finally:
            client.close()
        stored[str(server)] = len(keys)
        log.info("populated %s with %d keys of %d bytes", server, len(keys), workload.value_size)
    return stored
