"""What a run measured: gets each server served (memcached's own counters) and what the clients saw.

Per-server load comes from the servers, not the clients: the switch answers a balanced get with the home's
address, so a client cannot tell which copy served it. Client records give throughput and latency; per-server
latency is taken over the requests whose key lives on that server (what the clients addressed to it).
"""
from __future__ import annotations

import csv
import json
import time
import os
from dataclasses import dataclass, field
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
    gets: tuple[int, ...]  # get_hits of each server
    wall: float = 0.0  # time.time(), to find the same moment in the load generators' records
    cpu: tuple = ()  # each CPU's time so far (jiffies): (busy, stolen, all)
    processes: dict = field(default_factory=dict)  # name -> CPU time so far (jiffies) of the run's own processes


def cpu_times() -> tuple[tuple[int, int, int], ...]:
    """(busy, steal, total) jiffies of each CPU, from /proc/stat: busy is everything but idle, iowait and steal
    (steal: time the hypervisor gave to someone else, which a run on a shared VM silently loses)."""
    times = []
    with open("/proc/stat") as stat:
        for line in stat:
            name, *values = line.split()
            if not (name.startswith("cpu") and name[3:].isdigit()):
                continue
            fields = [int(x) for x in values[:8]]  # user nice system idle iowait irq softirq steal
            idle, iowait, steal = fields[3], fields[4], fields[7]
            times.append((sum(fields) - idle - iowait - steal, steal, sum(fields)))
    return tuple(times)


def cpu_shares(start: "ServerSample", end: "ServerSample") -> tuple[float, float]:
    """(busy, stolen) share of the busiest CPU's time between two samples (busiest: highest busy + stolen). One
    full CPU is enough to cap a run: interrupts and softirqs of a link are often handled on one."""
    best = (float("nan"), float("nan"))
    for (b0, s0, t0), (b1, s1, t1) in zip(start.cpu, end.cpu):
        if t1 > t0:
            shares = ((b1 - b0) / (t1 - t0), (s1 - s0) / (t1 - t0))
            if not sum(best) >= sum(shares):  # also replaces the first nan
                best = shares
    return best


def process_jiffies(pid: int) -> int:
    """User plus system CPU time of a process so far (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    return int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of proc(5))


def process_cores(start: "ServerSample", end: "ServerSample") -> dict[str, float]:
    """Cores each named process kept busy between two samples (1.0: one core all the time)."""
    seconds = (end.time - start.time) * os.sysconf("SC_CLK_TCK")
    return {name: (end.processes[name] - start.processes.get(name, 0)) / seconds for name in end.processes}


def sample_servers(servers: Sequence[ServerAddress], processes: dict[str, int] | None = None) -> ServerSample:
    """Each server's get count now, with the machine's CPU time and that of `processes` (name -> pid)."""
    gets = []
    for server in servers:
        client = tcp_client(server, timeout=2.0)
        try:
            gets.append(int(client.stats()[b"get_hits"]))  # not cmd_get: the controller's health probes
            # (16 gets of a missing key every 0.1 s) would count as load; every workload key is stored
        except (OSError, MemcacheError, KeyError) as err:
            raise MeasureError(f"cannot read the counters of {server}: {err}") from None
        finally:
            client.close()
    return ServerSample(time.monotonic(), tuple(gets), time.time(), cpu_times(),
                        {name: process_jiffies(pid) for name, pid in (processes or {}).items()})


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


SERVER_BOUND = 0.95  # a server serving this share of what its link carries is the bottleneck
CORE_BOUND = 0.90  # a single-threaded process using this much of one core is the bottleneck
CPU_BOUND = 0.90  # busy plus stolen share of one CPU at which the machine itself is the bottleneck
STEAL_BOUND = 0.05  # stolen share of a CPU that alone explains a shortfall of the servers' 5%: while the
# hypervisor holds a vCPU, nothing on it runs (memcached, the links' queues), whatever the busy share says


def run_limit(server_rates: Sequence[float], link_gets: float | None, cores: dict[str, float], cpu_busy: float,
              cpu_steal: float) -> str:
    """What limited a run: "servers" (the busiest at its link's capacity: the run measures the balance), a
    process's name (one of the run's processes used a whole core: the load generators, or MBalancer's monitor or
    controller), "cpu" (one of the machine's CPUs was full), "steal" (a hypervisor took a CPU away often enough to
    explain it), "unknown" (none of these: suspect the path under test), or
    "unshaped" (uncapped links: no capacity to compare with)."""
    if link_gets is None:
        return "unshaped"
    if max(server_rates) >= SERVER_BOUND * link_gets:
        return "servers"
    busiest = max(cores, key=cores.get, default=None)
    if busiest is not None and cores[busiest] >= CORE_BOUND:
        return busiest
    if cpu_busy + cpu_steal >= CPU_BOUND:
        return "cpu"
    return "steal" if cpu_steal >= STEAL_BOUND else "unknown"
