"""A sweep's summary as text: a table of the runs, and the demo's one JSON line."""
from __future__ import annotations

FOCUS_COLUMNS = {
    "throughput": ("normalised throughput", lambda r: f"{r['normalised']:.3f} "
                   f"[{r['server_normalised_min']:.2f}-{r['server_normalised_max']:.2f}]"),
    "latency": ("mean latency ms [servers]", lambda r: f"{r['mean_ms']:.1f} "
                f"[{_ms(r['server_mean_ms_min'])}-{_ms(r['server_mean_ms_max'])}]"),
}


MEDIAN_COLUMNS = {
    "throughput": ("normalised median [rounds]", lambda r: f"{r['normalised']:.3f} "
                   f"[{r['normalised_min']:.2f}-{r['normalised_max']:.2f}]"),
    "latency": ("mean ms median [rounds]", lambda r: f"{r['mean_ms']:.1f} "
                f"[{_ms(r['mean_ms_min'])}-{_ms(r['mean_ms_max'])}]"),
}


DETECTED_BY = {"sketch": "the switch's own sketch", "capture": "capturing the client ports"}


def format_runs(summary: dict, focus: str | None = None) -> str:
    """One line per run: the point, the mode, the model's IF, what was measured; with several rounds, then one
    line per point and mode with the medians over rounds and their ranges."""
    lines = [f"{summary['experiment']}: capacity {summary['capacity']:,.0f} gets/s (load spread evenly"
             + (f"; median of {', '.join(f'{c:,.0f}' for c in summary['capacities'])}"
                if len(summary.get("capacities", ())) > 1 else "")
             + "); limit: what held each run back (servers: the measure is sound; others: see the warnings); "
             "hot: hot keys installed / the model's H"
             + (f"; hot keys found by {DETECTED_BY[summary['detection']]}" if summary.get("detection") else "")]
    lines += _table(summary["runs"], _columns(FOCUS_COLUMNS, focus), per_server=True)
    if len(summary.get("capacities", ())) > 1:
        lines += ["", f"medians over {len(summary['capacities'])} rounds (each run normalised by its round's capacity)"]
        lines += _table(summary["medians"], _columns(MEDIAN_COLUMNS, focus), per_server=False)
    return "\n".join(lines)


def _columns(columns: dict, focus: str | None) -> list:
    return [columns[focus]] if focus else list(columns.values())


def _table(rows: list[dict], columns: list, per_server: bool) -> list[str]:
    lines = [f"{'point':<12} {'mode':<19} {'IF model':>8} {'IF measured':>11} {'gets/s':>8} "
             + " ".join(f"{title:>26}" for title, _ in columns)
             + f" {'p50 ms':>7} {'timeouts':>8} {'hot':>6} {'limit':>8}"]
    for r in rows:
        hot = f"{r['hot_keys']:.0f}/{r['hot_model']}" if r["mode"] == "mbalancer" else "-"
        lines.append(f"{r['point']:<12} {label(r):<19} {r['imbalance_simulated']:>8.3f} "
                     f"{r['imbalance_measured']:>11.3f} {r['throughput']:>8,.0f} "
                     + " ".join(f"{cell(r):>26}" for _, cell in columns)
                     + f" {r['p50_ms']:>7.1f} {r['timeouts']:>8} {hot:>6} {r.get('limit', '-'):>8}")
        if per_server:
            lines.append("    per server gets/s: " + ", ".join(f"{x:,.0f}" for x in r["server_rates"]))
    return lines


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
    line["detection"] = summary.get("detection")
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
