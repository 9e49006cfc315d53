"""What a run measured: gets each server served (memcached's own counters) and what the clients saw.

Per-server load comes from the servers, not the clients: the switch answers a balanced get with the home's
address, so a client cannot tell which copy served it. Client records give throughput and latency; per-server
latency is taken over the requests whose key lives on that server (what the clients addressed to it).
"""
from __future__ import annotations

import csv
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
from pymemcache.exceptions import MemcacheError

from mbalancer.memcache.addresses import ServerAddress
from mbalancer.memcache.client import tcp_client


class MeasureError(RuntimeError):
    """A server's counters could not be read."""


@dataclass(frozen=True)
class ServerSample:
    time: float  # monotonic
    gets: tuple[int, ...]  # cmd_get of each server
    wall: float = 0.0  # time.time(), to find the same moment in the load generators' records


def sample_servers(servers: Sequence[ServerAddress]) -> ServerSample:
    gets = []
    for server in servers:
        client = tcp_client(server, timeout=2.0)
        try:
            gets.append(int(client.stats()[b"cmd_get"]))
        except (OSError, MemcacheError, KeyError) as err:
            raise MeasureError(f"cannot read the counters of {server}: {err}") from None
        finally:
            client.close()
    return ServerSample(time.monotonic(), tuple(gets), time.time())


def server_rates(start: ServerSample, end: ServerSample) -> np.ndarray:
    """Gets per second each server served between two samples."""
    return (np.array(end.gets) - np.array(start.gets)) / (end.time - start.time)


@dataclass
class ClientRecords:
    """The rows of the load generators' records.csv files that fall in the measurement window."""

    latency_ms: np.ndarray
    asked: np.ndarray  # server index the request was addressed to (its key's home)
    answered: np.ndarray  # bool
    outcome: np.ndarray  # outcome names
    window: float  # seconds

    @property
    def throughput(self) -> float:
        return float(self.answered.sum()) / self.window

    def latency_by_server(self, servers: int) -> np.ndarray:
        """Mean latency (ms) of the answered requests addressed to each server (nan for a server asked nothing)."""
        means = np.full(servers, np.nan)
        for i in range(servers):
            chosen = self.answered & (self.asked == i)
            if chosen.any():
                means[i] = self.latency_ms[chosen].mean()
        return means


def read_client_records(folders: Sequence[Path], servers: Sequence[ServerAddress], start: ServerSample,
                        end: ServerSample) -> ClientRecords:
    """Rows sent between two server samples, from each load generator's folder (records.csv, and summary.json for
    the wall-clock time its rows count from): the clients' window is the servers' window, whenever each started."""
    index = {str(s): i for i, s in enumerate(servers)}
    latency, asked, answered, outcome = [], [], [], []
    for folder in folders:
        started = json.loads((folder / "summary.json").read_text())["started_unix"]
        low, high = start.wall - started, end.wall - started
        with open(folder / "records.csv", newline="") as rows:
            for row in csv.DictReader(rows):
                if low <= float(row["time_s"]) < high:
                    latency.append(float(row["latency_ms"]))
                    asked.append(index.get(row["asked"], -1))
                    answered.append(bool(row["answered"]))
                    outcome.append(row["outcome"])
    return ClientRecords(np.array(latency), np.array(asked, dtype=int), np.array(answered, dtype=bool),
                         np.array(outcome), end.wall - start.wall)
