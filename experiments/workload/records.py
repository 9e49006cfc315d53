"""One row per request, and what they add up to: the JSON summary and the CSV.

Rows are appended to typed arrays (a few bytes each, cheap per request); numpy does the arithmetic at the end.
"""
from __future__ import annotations

import csv
from array import array
from pathlib import Path
from typing import Any

import numpy as np

from controller.load import imbalance_factor
from experiments.workload.spec import Workload
from mbalancer.memcache.addresses import ServerAddress
from mbalancer.memcache.replies import OUTCOMES as REPLY_OUTCOMES

OUTCOMES = REPLY_OUTCOMES + ("timeout", "unreachable")
OUTCOME_CODE = {name: code for code, name in enumerate(OUTCOMES)}
NOT_ANSWERED = -1
CSV_COLUMNS = ("time_s", "client", "op", "key", "asked", "answered", "latency_ms", "outcome")


class Records:
    """Requests as they complete. Servers are indices into `sources`: first the configured servers, then any
    other address that answered (a replica steered to by the switch, for instance)."""

    def __init__(self, servers: tuple[ServerAddress, ...]):
        self.sources: list[ServerAddress] = list(servers)
        self.source_index = {server: i for i, server in enumerate(servers)}
        self.sent = array("d")  # seconds since the start of the run
        self.client = array("i")
        self.key = array("i")
        self.is_set = array("b")
        self.asked = array("h")
        self.answered = array("h")
        self.latency = array("d")  # seconds
        self.outcome = array("b")
        self.strays = 0  # datagrams dropped as not answering the request outstanding
        self.duration = 0.0
        self.started_unix = 0.0  # wall clock when `sent` was 0: lines runs up with other clocks on the machine
        self.stopped_early = False  # ended by a signal before its duration or request count

    def add(self, sent: float, client: int, key: int, is_set: bool, asked: int, answered: int, latency: float,
            outcome: int) -> None:
        self.sent.append(sent)
        self.client.append(client)
        self.key.append(key)
        self.is_set.append(is_set)
        self.asked.append(asked)
        self.answered.append(answered)
        self.latency.append(latency)
        self.outcome.append(outcome)

    def index_of(self, source: tuple[str, int]) -> int:
        """Index of an answering address, registering addresses never seen before."""
        index = self.source_index.get(source)
        if index is None:
            address = ServerAddress(*source)
            index = self.source_index[address] = len(self.sources)
            self.sources.append(address)
        return index

    def __len__(self) -> int:
        return len(self.outcome)


def summarise(records: Records, workload: Workload) -> dict[str, Any]:
    """Throughput, latency percentiles, outcomes and per-server load of a run, as one JSON-ready dict."""
    outcome = np.frombuffer(records.outcome, dtype=np.int8)
    answered = np.frombuffer(records.answered, dtype=np.int16)
    ok = answered != NOT_ANSWERED
    latency_ms = np.frombuffer(records.latency, dtype=float)[ok] * 1e3
    counts = {name: int((outcome == code).sum()) for code, name in enumerate(OUTCOMES)}
    n_sources = len(records.sources)
    asked = np.bincount(np.frombuffer(records.asked, dtype=np.int16), minlength=n_sources)
    got = np.bincount(answered[ok], minlength=n_sources)
    total = int(got.sum())
    duration = records.duration or float("nan")
    share = got / max(total, 1)
    return {
        "protocol": workload.protocol, "servers": [str(s) for s in workload.servers], "keys": workload.keys,
        "alpha": workload.alpha, "clients": workload.clients, "hash": workload.key_hash.spec,
        "value_size": workload.value_size, "set_ratio": workload.set_ratio, "timeout_s": workload.timeout,
        "seed": workload.seed,
        "duration_s": records.duration, "started_unix": records.started_unix, "stopped_early": records.stopped_early,
        "requests": len(records),
        "answered": total,
        "throughput": total / duration,
        **_latency(latency_ms),
        "hits": counts["hit"], "misses": counts["miss"], "stored": counts["stored"],
        "timeouts": counts["timeout"], "unreachable": counts["unreachable"],
        "errors": counts["error"] + counts["malformed"] + counts["not_stored"],
        "outcomes": {name: n for name, n in counts.items() if n},
        "strays": records.strays,
        "per_server": [{"server": str(s), "asked": int(asked[i]), "answered": int(got[i]), "share": float(share[i])}
                       for i, s in enumerate(records.sources)],
        "max_server_share": float(share.max()) if total else 0.0,
        "imbalance_factor_measured": float(imbalance_factor(got[:len(workload.servers)].astype(float)))
        if total else None,
        "imbalance_factor_expected": expected_imbalance(workload),
    }


def _latency(latency_ms: np.ndarray) -> dict[str, float | None]:
    if latency_ms.size == 0:
        return {"mean_ms": None, "p50_ms": None, "p95_ms": None, "p99_ms": None, "max_ms": None}
    p50, p95, p99 = np.percentile(latency_ms, [50, 95, 99])
    return {"mean_ms": float(latency_ms.mean()), "p50_ms": float(p50), "p95_ms": float(p95), "p99_ms": float(p99),
            "max_ms": float(latency_ms.max())}


def expected_imbalance(workload: Workload) -> float:
    """Imbalance factor the hash gives this Zipf workload with no remedy (what the thesis's model predicts)."""
    loads = np.bincount(workload.homes, weights=workload.weights(), minlength=len(workload.servers))
    return float(imbalance_factor(loads))


def write_csv(records: Records, workload: Workload, path: Path) -> None:
    """One row per request: time_s, client, op, key, asked, answered, latency_ms, outcome."""
    names = [k.decode() for k in workload.key_names]
    sources = [str(s) for s in records.sources]
    ops = ("get", "set")
    with open(path, "w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(CSV_COLUMNS)
        for sent, client, key, is_set, asked, answered, latency, outcome in zip(
                records.sent, records.client, records.key, records.is_set, records.asked, records.answered,
                records.latency, records.outcome):
            writer.writerow((f"{sent:.6f}", client, ops[is_set], names[key], sources[asked],
                             sources[answered] if answered != NOT_ANSWERED else "",
                             f"{latency * 1e3:.4f}", OUTCOMES[outcome]))
