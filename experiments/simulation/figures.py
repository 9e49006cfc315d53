"""The thesis's figures 3.1, 3.2, 3.3 and 4.3, each written as a tidy CSV and a PNG with the thesis's axes.

Every figure also carries a `weighted` curve (water-filling replica shares), which the thesis did not have.
At each x value all curves are computed on the same random assignments (common random numbers), so the gaps
between curves are not sampling noise.
"""
from __future__ import annotations

import csv
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterable

from experiments.simulation.scenario import Estimate, Scenario, simulate_on

SERVER_COUNTS = (2, 3, 4, 5, 6, 8, 10, 15, 20, 30, 40, 50, 60, 80, 100)
CSV_COLUMNS = ("figure", "curve", "mode", "servers", "keys", "hot", "groups", "alpha", "trials", "seed",
               "metric", "mean", "ci95_low", "ci95_high")


@dataclass(frozen=True)
class Curve:
    """One line of a figure: a remedy (`mode` None for none) and the metric plotted for it."""

    label: str
    mode: str | None
    groups: int = 1
    metric: str = "imbalance_factor"  # or "extra_servers": copies of the busiest servers that match it
    style: dict = field(default_factory=dict, compare=False, hash=False)


@dataclass(frozen=True)
class FigureSpec:
    name: str
    title: str
    x_param: str  # the Scenario field on the x axis
    x_values: tuple[int, ...]
    curves: tuple[Curve, ...]
    y_label: str
    log_x: bool = False
    fixed: dict = field(default_factory=dict)  # Scenario fields held constant (beyond the command's own)


_BASE = {"color": "0.45", "marker": "o"}
_EQUAL = {"color": "tab:blue", "marker": "s"}
_WEIGHTED = {"color": "tab:orange", "marker": "^", "linestyle": "--"}
_IF_LABEL = "imbalance factor (mean load / max load)"
_GROUP_COLORS = ("tab:blue", "tab:green", "tab:red", "tab:purple")


def _group_curves(groups: Iterable[int]) -> tuple[Curve, ...]:
    curves = []
    for g, color in zip(groups, _GROUP_COLORS):
        curves.append(Curve(f"G={g} (equal)", "equal", g, style={"color": color, "marker": "s"}))
        curves.append(Curve(f"G={g} (weighted)", "weighted", g,
                            style={"color": color, "marker": "^", "linestyle": "--"}))
    return tuple(curves)


FIGURES: dict[str, FigureSpec] = {
    "3.1": FigureSpec(
        "3.1", "Imbalance factor vs number of keys (10 servers, H=10)", "keys",
        (100, 200, 500, 1000, 2000, 5000, 10_000, 20_000, 50_000, 100_000),
        (Curve("no MBalancer", None, style=_BASE), Curve("MBalancer (equal)", "equal", style=_EQUAL),
         Curve("MBalancer (weighted)", "weighted", style=_WEIGHTED)),
        _IF_LABEL, log_x=True, fixed={"servers": 10}),
    "3.2": FigureSpec(
        "3.2", "Imbalance factor vs number of servers (1000 keys, H=10)", "servers", SERVER_COUNTS,
        (Curve("no MBalancer", None, style=_BASE),
         Curve("move hot keys (no copies)", "move", style={"color": "tab:red", "marker": "x", "linestyle": ":"}),
         Curve("MBalancer (equal)", "equal", style=_EQUAL), Curve("MBalancer (weighted)", "weighted", style=_WEIGHTED)),
        _IF_LABEL, log_x=True, fixed={"keys": 1000}),
    "3.3": FigureSpec(
        "3.3", "Extra servers (copies of the busiest) to match MBalancer (1000 keys, H=10)", "servers",
        SERVER_COUNTS,
        (Curve("match MBalancer (equal)", "equal", metric="extra_servers", style=_EQUAL),
         Curve("match MBalancer (weighted)", "weighted", metric="extra_servers", style=_WEIGHTED)),
        "additional servers needed", log_x=True, fixed={"keys": 1000}),
    "4.3": FigureSpec(
        "4.3", "Imbalance factor with G groups (1000 keys, H=10)", "servers",
        (10, 20, 30, 40, 50, 60, 70, 80, 90, 100), _group_curves((1, 2, 5, 10)),
        _IF_LABEL, fixed={"keys": 1000}),
}


def compute_figure(spec: FigureSpec, base: Scenario,
                   progress: Callable[[str], None] | None = None) -> list[dict]:
    """Rows of the figure's CSV: one per (x value, curve)."""
    rows = []
    for i, x in enumerate(spec.x_values, 1):
        point = replace(base, **spec.fixed, **{spec.x_param: x})
        if progress:
            progress(f"fig {spec.name}: {spec.x_param}={x} ({i}/{len(spec.x_values)})")
        placement = point.placement(kept=point.hot)
        for curve in spec.curves:
            scenario = replace(point, mode=curve.mode or "equal", groups=curve.groups)
            scenario.check()
            outcome = simulate_on(scenario, placement)
            samples = {"imbalance_factor": outcome.remedied if curve.mode else outcome.baseline,
                       "extra_servers": outcome.extra_servers}[curve.metric]
            rows.append(_row(spec, curve, scenario, Estimate.of(samples)))
    return rows


def _row(spec: FigureSpec, curve: Curve, s: Scenario, est: Estimate) -> dict:
    return {"figure": spec.name, "curve": curve.label, "mode": curve.mode or "none", "servers": s.servers,
            "keys": s.keys, "hot": s.hot if curve.mode else 0, "groups": s.groups, "alpha": s.alpha,
            "trials": s.trials, "seed": s.seed, "metric": curve.metric, "mean": est.mean,
            "ci95_low": est.low, "ci95_high": est.high}


def write_csv(rows: list[dict], path: Path) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        writer.writerows(rows)


def plot(spec: FigureSpec, rows: list[dict], path: Path, base: Scenario) -> None:
    """Draw the figure: mean with 95% confidence bars per curve."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for number, curve in enumerate(spec.curves):
        mine = [r for r in rows if r["curve"] == curve.label]
        xs = [_nudged(r[spec.x_param], number, spec) for r in mine]
        means = [r["mean"] for r in mine]
        err = [[r["mean"] - r["ci95_low"] for r in mine], [r["ci95_high"] - r["mean"] for r in mine]]
        ax.errorbar(xs, means, yerr=err, label=curve.label, capsize=2, markersize=4, **curve.style)
    if spec.log_x:
        ax.set_xscale("log")
        ax.minorticks_off()  # ticks at the values computed, labelled as numbers (not 10^k)
    ax.set_xticks(spec.x_values, [f"{x:,}" for x in spec.x_values], fontsize=8, rotation=45 if spec.log_x else 0)
    ax.set_xlabel(f"number of {spec.x_param}")
    ax.set_ylabel(spec.y_label)
    if spec.curves[0].metric == "imbalance_factor":
        ax.set_ylim(0, 1.05)
    else:
        ax.set_ylim(bottom=0)
    ax.set_title(f"Fig {spec.name}: {spec.title}", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, ncol=2 if len(spec.curves) > 4 else 1)
    fig.text(0.99, 0.01, f"Zipf alpha={base.alpha}, {base.trials} trials, seed {base.seed}; bars: 95% CI",
             ha="right", va="bottom", fontsize=7, color="0.4")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


NUDGE = 0.007  # of the x range (of a decade on log axes) between neighbouring curves: no curve hides another


def _nudged(x: float, number: int, spec: FigureSpec) -> float:
    """x shifted a little per curve, the curves centred on the true x."""
    offset = NUDGE * (number - (len(spec.curves) - 1) / 2)
    if spec.log_x:
        return x * 10 ** offset
    return x + offset * (max(spec.x_values) - min(spec.x_values))


def make_figure(name: str, out: Path, base: Scenario, progress: Callable[[str], None] | None = None) -> list[Path]:
    """Compute figure `name` and write fig<name>.csv and fig<name>.png into `out`; returns the paths."""
    spec = FIGURES[name]
    out.mkdir(parents=True, exist_ok=True)
    rows = compute_figure(spec, base, progress)
    csv_path, png_path = out / f"fig{name}.csv", out / f"fig{name}.png"
    write_csv(rows, csv_path)
    plot(spec, rows, png_path, base)
    return [csv_path, png_path]

