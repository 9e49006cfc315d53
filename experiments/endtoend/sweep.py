"""A whole experiment: one testbed, then per round the capacity (calibration) run and every point in every mode.

Throughput is normalised by the round's capacity run: the same clients, keys and values with the load spread
evenly over the servers, measured in the same round on the same testbed. With several rounds the figures are the
medians over rounds, with their ranges: one noisy run (a shared machine's neighbours) does not make a point.
Outputs in OUT: runs.csv (one row per run), medians.csv (one row per point and mode), summary.json (the spec,
every run, the medians), and per run a folder (in roundN/ with several rounds) with the generators' records and,
for MBalancer, the monitor's reports and the controller's final state.
"""
from __future__ import annotations

import csv
import json
import logging
from dataclasses import asdict, replace
from pathlib import Path
from typing import Callable

import numpy as np

from experiments.endtoend.measure import run_limit
from experiments.endtoend.run import RunResult, run_once
from experiments.endtoend.spec import ExperimentSpec
from topologies.testbed import Testbed

log = logging.getLogger(__name__)
Progress = Callable[[str], None]
CSV_FIELDS = ("round", "point", "mode", "replicas", "imbalance_hash", "imbalance_simulated", "imbalance_measured",
              "throughput", "normalised", "server_normalised_min", "server_normalised_max", "mean_ms", "p50_ms",
              "p99_ms", "server_mean_ms_min", "server_mean_ms_max", "answered", "timeouts", "misses", "hot_keys",
              "hot_model", "bytes_copied", "server_rates", "limit", "cpu_busy", "cpu_steal")


def run_sweep(spec: ExperimentSpec, out: Path, progress: Progress) -> dict:
    """Run `spec.rounds` rounds, each a capacity run and then every point in every mode (interleaved, so that a
    machine's drift hits every mode alike); returns the summary (also written)."""
    spec.check()
    out.mkdir(parents=True, exist_ok=True)
    runs_per_round = 1 + len(spec.hashes) * (1 + len(spec.replica_modes))
    rows: list[dict] = []
    with Testbed(spec.testbed) as bed:
        for number in range(1, spec.rounds + 1):
            folder = out if spec.rounds == 1 else out / f"round{number}"
            rows += _round(bed, spec, number, folder, _RoundProgress(progress, spec, number, runs_per_round))
    for row in rows:
        _warn_if_not_server_bound(row, spec)
    capacities = [r["throughput"] for r in rows if r["mode"] == "calibration"]
    summary = {"experiment": spec.name, "spec": spec_dict(spec), "detection": spec.detects_with(),
               "capacity": float(np.median(capacities)),
               "capacities": capacities, "runs": rows, "medians": medians(rows)}
    write_outputs(summary, out)
    return summary


class _RoundProgress:
    """Numbers a round's runs within the whole sweep: "[16/39] round 2/3: ..."."""

    def __init__(self, progress: Progress, spec: ExperimentSpec, number: int, runs_per_round: int):
        self.progress, self.done = progress, (number - 1) * runs_per_round
        self.total = spec.rounds * runs_per_round
        self.where = f"round {number}/{spec.rounds}: " if spec.rounds > 1 else ""

    def next_run(self, what: str) -> None:
        self.done += 1
        self.progress(f"[{self.done}/{self.total}] {self.where}{what}")

    def __call__(self, message: str) -> None:
        self.progress(message)


def _round(bed: Testbed, spec: ExperimentSpec, number: int, out: Path, progress: _RoundProgress) -> list[dict]:
    """One capacity run, then every point in every mode; rows normalised by this round's capacity."""
    servers = tuple(bed.addresses)
    progress.next_run("capacity run (load spread evenly)")
    capacity = run_once(bed, spec, spec.calibration(servers), "calibration", out / "capacity", progress)
    rows = [_row(capacity, capacity, spec, number)]
    for point in spec.hashes:
        workload = spec.workload(servers, point)
        runs = [("baseline", None)] + [("mbalancer", replace(spec.balancing, mode=m)) for m in spec.replica_modes]
        for mode, balancing in runs:
            label = mode + (f" ({balancing.mode} weights)" if balancing else "")
            progress.next_run(f"{point} {label}")
            folder = out / _folder(point) / (f"{mode}-{balancing.mode}" if balancing else mode)
            result = run_once(bed, spec, workload, mode, folder, progress, balancing)
            rows.append(_row(result, capacity, spec, number))
            log.info("%s %s: %.0f gets/s (%.2f of capacity), IF measured %.3f, model %.3f", point, label,
                     result.throughput, rows[-1]["normalised"], result.imbalance_measured,
                     result.imbalance_simulated)
    return rows


MEDIAN_FIELDS = ("throughput", "normalised", "imbalance_measured", "mean_ms", "p50_ms", "p99_ms", "hot_keys")
RANGE_FIELDS = ("normalised", "mean_ms")


def medians(rows: list[dict]) -> list[dict]:
    """One row per point and mode over the rounds: the median of each figure, the range of the main ones
    (`<field>_min`, `<field>_max`), timeouts and misses summed, and the limits seen ("servers", or e.g.
    "servers 2, cpu 1")."""
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault((row["point"], row["mode"], row["replicas"]), []).append(row)
    out = []
    for (point, mode, replicas), runs in groups.items():
        first = runs[0]
        merged = {"point": point, "mode": mode, "replicas": replicas, "rounds": len(runs),
                  "imbalance_hash": first["imbalance_hash"], "imbalance_simulated": first["imbalance_simulated"],
                  "hot_model": first["hot_model"],
                  "timeouts": sum(r["timeouts"] for r in runs), "misses": sum(r["misses"] for r in runs)}
        for name in MEDIAN_FIELDS:
            merged[name] = float(np.nanmedian([_number(r[name]) for r in runs]))
        for name in RANGE_FIELDS:
            values = [_number(r[name]) for r in runs]
            merged[f"{name}_min"], merged[f"{name}_max"] = float(np.nanmin(values)), float(np.nanmax(values))
        limits = [r["limit"] for r in runs]
        merged["limit"] = limits[0] if len(set(limits)) == 1 else ", ".join(
            f"{limit} {limits.count(limit)}" for limit in sorted(set(limits), key=limits.index))
        out.append(merged)
    return out


def _number(value) -> float:
    return float("nan") if value is None else float(value)


def _row(result: RunResult, capacity: RunResult, spec: ExperimentSpec, number: int) -> dict:
    """A run's figures, normalised by its round's capacity run (the whole and each server, by its even share),
    and what limited it."""
    per_server_capacity = capacity.throughput / len(result.server_rates)
    server_normalised = np.array(result.server_rates) / per_server_capacity
    server_ms = np.array(result.server_mean_ms, dtype=float)
    return {**result.to_dict(), "round": number, "normalised": result.throughput / capacity.throughput,
            "server_normalised_min": float(server_normalised.min()),
            "server_normalised_max": float(server_normalised.max()),
            "server_mean_ms_min": float(np.nanmin(server_ms)) if np.isfinite(server_ms).any() else None,
            "server_mean_ms_max": float(np.nanmax(server_ms)) if np.isfinite(server_ms).any() else None,
            "limit": run_limit(_bound_rates(result.mode, result.server_rates), spec.link_gets(), result.cores,
                               result.cpu_busy, result.cpu_steal)}


def _bound_rates(mode: str, server_rates: list[float]) -> list[float]:
    """The rates that must reach the links' capacity: the busiest server's in a run, every server's in the
    capacity run (it is the yardstick of the others)."""
    return [min(server_rates)] if mode == "calibration" else server_rates


def _warn_if_not_server_bound(row: dict, spec: ExperimentSpec) -> None:
    """Normalised throughput means something only where the servers were the bottleneck: say so where not."""
    if row["limit"] in ("servers", "unshaped"):
        return
    why = {"cpu": "a CPU of this machine was full: the figures measure the machine",
           "steal": "the hypervisor took a CPU away that often: the figures measure this VM's neighbours",
           "unknown": "no process or CPU was full either: suspect the path under test"}.get(
        row["limit"], f"{row['limit']} used a whole core: the figures measure it, not the servers")
    if row["mode"] == "calibration":
        why += "; every normalised figure of this sweep is relative to it"
    link = spec.link_gets()
    share = max(_bound_rates(row["mode"], row["server_rates"])) / link
    cores = ", ".join(f"{name} {used:.2f}" for name, used in row["cores"].items())
    run = row["mode"] + (f"/{row['replicas']}" if row["replicas"] else "") + (
        f" (round {row['round']})" if spec.rounds > 1 else "")
    log.warning("%s %s: limited by %s, not by its servers (at %.0f%% of its link's %.0f gets/s; busiest CPU %.0f%% "
                "busy, %.0f%% stolen; cores used: %s): %s", row["point"], run, row["limit"], 100 * share, link,
                100 * row["cpu_busy"], 100 * row["cpu_steal"], cores, why)


def _folder(point: str) -> str:
    return point.replace(":", "_")


def spec_dict(spec: ExperimentSpec) -> dict:
    return json.loads(json.dumps(asdict(spec), default=str))


def write_outputs(summary: dict, out: Path) -> None:
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    with open(out / "runs.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=CSV_FIELDS, extrasaction="ignore")
        writer.writeheader()
        for row in summary["runs"]:
            writer.writerow({k: (" ".join(map(str, v)) if isinstance(v, list) else v) for k, v in row.items()})
    with open(out / "medians.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(summary["medians"][0]))
        writer.writeheader()
        writer.writerows(summary["medians"])


def load_summary(out: Path) -> dict | None:
    path = out / "summary.json"
    return json.loads(path.read_text()) if path.exists() else None
