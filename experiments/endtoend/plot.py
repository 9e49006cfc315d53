"""The thesis's figures from a sweep's summary.

fig5_1.png  normalised throughput against the placement's imbalance factor, without MBalancer and with it (each
            replica weighting run); bars from
            the least to the most loaded server (normalised by its even share of capacity), as in the thesis;
            dashed: throughput = IF (the thesis's model), hollow markers: the model's IF with MBalancer.
fig5_2.png  average latency likewise; bars from the server with the lowest to the highest mean latency.
servers.png each server's gets/s in every run, normalised by its even share of capacity.
With several rounds, figs 5.1 and 5.2 show the medians over rounds and their bars the range over rounds.
"""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

STYLE = {"baseline": ("tab:red", "o", "without MBalancer"),
         "equal": ("tab:blue", "s", "MBalancer, equal weights (thesis)"),
         "weighted": ("tab:green", "^", "MBalancer, weighted (water-filling)")}


def _series_key(run: dict) -> str:
    return run["replicas"] if run["mode"] == "mbalancer" else run["mode"]


# (value, low, high) of each figure's bars: one run's servers, or the rounds of a point
BARS = {"servers": {"throughput": ("normalised", "server_normalised_min", "server_normalised_max"),
                    "latency": ("mean_ms", "server_mean_ms_min", "server_mean_ms_max")},
        "rounds": {"throughput": ("normalised", "normalised_min", "normalised_max"),
                   "latency": ("mean_ms", "mean_ms_min", "mean_ms_max")}}


def plot_all(summary: dict, out: Path) -> list[Path]:
    several = len(summary.get("capacities", ())) > 1
    rows = summary["medians"] if several else summary["runs"]
    runs = [r for r in rows if _series_key(r) in STYLE]
    bars = BARS["rounds" if several else "servers"]
    paths = [out / "fig5_1.png", out / "fig5_2.png", out / "servers.png"]
    _throughput(runs, summary, paths[0], bars["throughput"])
    _latency(runs, summary, paths[1], bars["latency"])
    _servers(summary["runs"], paths[2])
    return paths


def _series(runs: list[dict], series: str) -> list[dict]:
    return sorted((r for r in runs if _series_key(r) == series), key=lambda r: r["imbalance_hash"])


def _errorbars(ax, rows: list[dict], series: str, bars: tuple[str, str, str]) -> None:
    value, low, high = bars
    color, marker, label = STYLE[series]
    nudge = 0.006 * (list(STYLE).index(series) - 1)  # side by side, so the server bars do not hide each other
    x = [r["imbalance_hash"] + nudge for r in rows]
    y = [r[value] for r in rows]
    below = [max(v - (r[low] if r[low] is not None else v), 0) for v, r in zip(y, rows)]
    above = [max((r[high] if r[high] is not None else v) - v, 0) for v, r in zip(y, rows)]
    ax.errorbar(x, y, yerr=[below, above], color=color, marker=marker, capsize=4, label=label)


def _throughput(runs: list[dict], summary: dict, path: Path, bars: tuple[str, str, str]) -> None:
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for series in STYLE:
        rows = _series(runs, series)
        if rows:
            _errorbars(ax, rows, series, bars)
        if rows and series != "baseline":
            ax.scatter([r["imbalance_hash"] for r in rows], [r["imbalance_simulated"] for r in rows],
                       facecolors="none", edgecolors=STYLE[series][0], s=70, zorder=3,
                       label=f"model: IF, {series} weights")
    ax.plot([0.45, 1.0], [0.45, 1.0], ls="--", color="grey", lw=1, label="throughput = IF (model)")
    ax.set_xlabel("imbalance factor of the placement (mean / max server load)")
    ax.set_ylabel("normalised throughput")
    ax.set_title(_title(summary, "Fig 5.1: throughput"))
    ax.set_ylim(0, 1.25)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _latency(runs: list[dict], summary: dict, path: Path, bars: tuple[str, str, str]) -> None:
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for series in STYLE:
        if rows := _series(runs, series):
            _errorbars(ax, rows, series, bars)
    ax.set_xlabel("imbalance factor of the placement (mean / max server load)")
    ax.set_ylabel("average latency (ms)")
    ax.set_title(_title(summary, "Fig 5.2: latency"))
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _servers(runs: list[dict], path: Path) -> None:
    capacity = next(r for r in runs if r["mode"] == "calibration")
    share = capacity["throughput"] / len(capacity["server_rates"])
    fig, ax = plt.subplots(figsize=(max(6.4, 0.5 * len(runs) * len(capacity["server_rates"]) / 2), 4))
    width = 0.8 / len(capacity["server_rates"])
    for i, run in enumerate(runs):
        for s, rate in enumerate(run["server_rates"]):
            ax.bar(i + (s - (len(run["server_rates"]) - 1) / 2) * width, rate / share, width,
                   color=plt.cm.tab10(s % 10), label=f"server {s + 1}" if i == 0 else None)
    several = len({r.get("round", 1) for r in runs}) > 1
    ax.set_xticks(range(len(runs)), [f"{r['point']}\n{_series_key(r)}" + (f"\nround {r['round']}" if several else "")
                                     for r in runs], fontsize=7)
    ax.set_ylabel("gets/s / even share of capacity")
    ax.axhline(1.0, color="grey", ls="--", lw=1)
    ax.legend(fontsize=7, ncol=min(5, len(capacity["server_rates"])))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _title(summary: dict, what: str) -> str:
    spec, rounds = summary["spec"], len(summary.get("capacities", ()))
    hot = spec["balancing"]["hot"] or f"auto ({spec['balancing']['target']:g})"
    return (f"{what}, {spec['testbed']['servers']} servers, {spec['clients']} clients, H={hot}, "
            f"G={spec['balancing']['groups']}" + (f"\nmedian of {rounds} rounds, bars: range over rounds"
                                                  if rounds > 1 else ""))
