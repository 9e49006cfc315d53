"""A sweep's summary as text: a table of the runs, and the demo's one JSON line."""
from __future__ import annotations

FOCUS_COLUMNS = {
    "throughput": ("normalised throughput", lambda r: f"{r['normalised']:.3f} "
                   f"[{r['server_normalised_min']:.2f}-{r['server_normalised_max']:.2f}]"),
    "latency": ("mean latency ms [servers]", lambda r: f"{r['mean_ms']:.1f} "
                f"[{_ms(r['server_mean_ms_min'])}-{_ms(r['server_mean_ms_max'])}]"),
}


def format_runs(summary: dict, focus: str | None = None) -> str:
    """One line per run: the point, the mode, the model's IF, what was measured."""
    columns = [FOCUS_COLUMNS[focus]] if focus else list(FOCUS_COLUMNS.values())
    header = (f"{'point':<12} {'mode':<19} {'IF model':>8} {'IF measured':>11} {'gets/s':>8} "
              + " ".join(f"{title:>26}" for title, _ in columns)
              + f" {'p50 ms':>7} {'timeouts':>8} {'hot':>4} {'limit':>8}")
    lines = [f"{summary['experiment']}: capacity {summary['capacity']:,.0f} gets/s (load spread evenly); limit: what "
             f"held each run back (servers: the measure is sound; others: see the warnings)", header]
    for r in summary["runs"]:
        lines.append(f"{r['point']:<12} {label(r):<19} {r['imbalance_simulated']:>8.3f} "
                     f"{r['imbalance_measured']:>11.3f} {r['throughput']:>8,.0f} "
                     + " ".join(f"{cell(r):>26}" for _, cell in columns)
                     + f" {r['p50_ms']:>7.1f} {r['timeouts']:>8} {r['hot_keys']:>4} {r.get('limit', '-'):>8}")
        lines.append("    per server gets/s: " + ", ".join(f"{x:,.0f}" for x in r["server_rates"]))
    return "\n".join(lines)


def label(run: dict) -> str:
    return f"mbalancer/{run['replicas']}" if run["mode"] == "mbalancer" else run["mode"]


def demo_line(summary: dict) -> dict:
    """{"baseline": {...}, "mbalancer": {...}, "gain": throughput ratio} for the sweep's first point (MBalancer:
    its first replica weighting)."""
    point = next(r["point"] for r in summary["runs"] if r["mode"] == "baseline")
    by_mode: dict = {}
    for r in summary["runs"]:
        if r["point"] == point and r["mode"] in ("baseline", "mbalancer"):
            by_mode.setdefault(r["mode"], r)
    line = {mode: _figures(by_mode[mode]) for mode in ("baseline", "mbalancer")}
    line["gain"] = round(by_mode["mbalancer"]["throughput"] / by_mode["baseline"]["throughput"], 3)
    line["point"] = point
    line["replicas"] = by_mode["mbalancer"]["replicas"]
    return line


def _figures(run: dict) -> dict:
    rates = run["server_rates"]
    return {"throughput": round(run["throughput"], 1), "p50_ms": round(run["p50_ms"], 3),
            "max_server_share": round(max(rates) / sum(rates), 4) if sum(rates) else None,
            "normalised_throughput": round(run["normalised"], 4),
            "imbalance_measured": round(run["imbalance_measured"], 4),
            "imbalance_model": round(run["imbalance_simulated"], 4), "limit": run.get("limit")}


def _ms(value) -> str:
    return "-" if value is None else f"{value:.1f}"
