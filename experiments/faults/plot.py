"""One PNG per fault run, next to its CSV: answered gets/s over time (top), and timeouts, stale reads and misses
per 100 ms (bottom); the fault phase shaded, the controller's server-down (red) and last refill (green) marked."""
from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from experiments.faults.run import Result  # noqa: E402

BUCKET_SECONDS = 0.1


def plot_run(out: Path, result: Result) -> Path:
    source = out / f"{result.fault}-{int(result.load * 100)}.jsonl"
    buckets = [json.loads(line) for line in source.read_text().splitlines()]
    t = [b["t"] for b in buckets]
    figure, (top, bottom) = plt.subplots(2, 1, figsize=(9, 5.5), sharex=True, height_ratios=(2, 1.4))
    top.plot(t, [b["answered"] / BUCKET_SECONDS for b in buckets], color="tab:blue", label="answered gets/s")
    top.plot(t, [b["sent"] / BUCKET_SECONDS for b in buckets], color="0.6", lw=0.8, ls=":", label="offered gets/s")
    top.set_ylabel("gets/s")
    for name, color in (("timeouts", "tab:orange"), ("stale", "tab:red"), ("misses", "tab:purple")):
        bottom.plot(t, [b[name] for b in buckets], color=color, label=name, drawstyle="steps-post")
    bottom.set_ylabel("per 100 ms")
    bottom.set_xlabel("seconds")
    for ax in (top, bottom):
        ax.axvspan(result.fault_at, result.recovered_at, color="0.9", zorder=0)
        if result.removed_after_s is not None:
            ax.axvline(result.fault_at + result.removed_after_s, color="tab:red", ls="--", lw=1)
        if result.restored_after_s is not None:
            ax.axvline(result.recovered_at + result.restored_after_s, color="tab:green", ls="--", lw=1)
        ax.legend(loc="upper right", fontsize=8)
    top.set_title(f"{result.fault} at {result.load:.0%} load: stale {result.stale}, timeouts {result.timeouts}, "
                  f"misses {result.misses} (shaded: fault; red: server out; green: back with weight)", fontsize=9)
    path = source.with_suffix(".png")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
