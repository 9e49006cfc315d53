"""A whole experiment: one testbed, the capacity (calibration) run, then every point in both modes.

Throughput is normalised by the capacity run: the same clients, keys and values with the load spread evenly over
the servers, measured in the same sweep on the same testbed. Outputs in OUT: runs.csv (one row per run),
summary.json (the spec and every run), and per run a folder with the generators' records and, for MBalancer,
the monitor's reports and the controller's final state.
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
CSV_FIELDS = ("point", "mode", "replicas", "imbalance_hash", "imbalance_simulated", "imbalance_measured", "throughput",
              "normalised", "server_normalised_min", "server_normalised_max", "mean_ms", "p50_ms", "p99_ms",
              "server_mean_ms_min", "server_mean_ms_max", "answered", "timeouts", "misses", "hot_keys",
              "bytes_copied", "server_rates", "limit", "cpu_busy", "cpu_steal")


def run_sweep(spec: ExperimentSpec, out: Path, progress: Progress) -> dict:
    """Run every point of `spec` in both modes after a capacity run; returns the summary (also written)."""
    spec.check()
    out.mkdir(parents=True, exist_ok=True)
    total = 1 + len(spec.hashes) * (1 + len(spec.replica_modes))
    with Testbed(spec.testbed) as bed:
        servers = tuple(bed.addresses)
        progress(f"[1/{total}] capacity run (load spread evenly)")
        capacity = run_once(bed, spec, spec.calibration(servers), "calibration", out / "capacity", progress)
        rows = [_row(capacity, capacity, spec)]
        done = 1
        for point in spec.hashes:
            workload = spec.workload(servers, point)
            runs = [("baseline", None)] + [("mbalancer", replace(spec.balancing, mode=m)) for m in spec.replica_modes]
            for mode, balancing in runs:
                done += 1
                label = mode + (f" ({balancing.mode} weights)" if balancing else "")
                progress(f"[{done}/{total}] {point} {label}")
                folder = out / _folder(point) / (f"{mode}-{balancing.mode}" if balancing else mode)
                result = run_once(bed, spec, workload, mode, folder, progress, balancing)
                rows.append(_row(result, capacity, spec))
                log.info("%s %s: %.0f gets/s (%.2f of capacity), IF measured %.3f, model %.3f", point, label,
                         result.throughput, rows[-1]["normalised"], result.imbalance_measured,
                         result.imbalance_simulated)
    for row in rows:
        _warn_if_not_server_bound(row, spec)
    summary = {"experiment": spec.name, "spec": spec_dict(spec), "capacity": capacity.throughput, "runs": rows}
    write_outputs(summary, out)
    return summary


def _row(result: RunResult, capacity: RunResult, spec: ExperimentSpec) -> dict:
    """A run's figures, normalised by the capacity run (the whole and each server, by its even share), and what
    limited it."""
    per_server_capacity = capacity.throughput / len(result.server_rates)
    server_normalised = np.array(result.server_rates) / per_server_capacity
    server_ms = np.array(result.server_mean_ms, dtype=float)
    return {**result.to_dict(), "normalised": result.throughput / capacity.throughput,
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
    run = row["mode"] + (f"/{row['replicas']}" if row["replicas"] else "")
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


def load_summary(out: Path) -> dict | None:
    path = out / "summary.json"
    return json.loads(path.read_text()) if path.exists() else None
