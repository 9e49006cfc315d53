"""One PNG per load run: requests per server, latency CDF, throughput over time."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from experiments.workload.records import NOT_ANSWERED, Records

THROUGHPUT_BIN = 0.1  # seconds


def latency_title(summary: dict) -> str:
    if summary["p50_ms"] is None:
        return "latency: no request was answered"
    return f"latency: p50 {summary['p50_ms']:.3f} ms, p99 {summary['p99_ms']:.3f} ms"


def plot_run(records: Records, summary: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    answered = np.frombuffer(records.answered, dtype=np.int16)
    ok = answered != NOT_ANSWERED
    fig, (servers, cdf, rate) = plt.subplots(1, 3, figsize=(15, 4.2))

    names = [row["server"] for row in summary["per_server"]]
    x = np.arange(len(names))
    servers.bar(x - 0.2, [row["asked"] for row in summary["per_server"]], 0.4, label="asked (by hash)")
    servers.bar(x + 0.2, [row["answered"] for row in summary["per_server"]], 0.4, label="answered")
    servers.set_xticks(x, names, rotation=30, ha="right", fontsize=8)
    servers.set_ylabel("requests")
    servers.set_title(f"per server (imbalance factor {summary['imbalance_factor_measured'] or 0:.3f})")
    tallest = max([row["asked"] for row in summary["per_server"]] + [1])
    servers.set_ylim(0, tallest * 1.3)  # room above the bars for the legend
    servers.legend(loc="upper center", ncol=2, fontsize=8)

    latency_ms = np.sort(np.frombuffer(records.latency, dtype=float)[ok] * 1e3)
    if latency_ms.size:
        cdf.plot(latency_ms, np.arange(1, latency_ms.size + 1) / latency_ms.size)
        cdf.set_xscale("log")
    cdf.set_xlabel("latency (ms)")
    cdf.set_ylabel("fraction of answered requests")
    cdf.set_title(latency_title(summary))
    cdf.grid(alpha=0.3)

    sent = np.frombuffer(records.sent, dtype=float)[ok]
    bins = np.arange(0, max(records.duration, THROUGHPUT_BIN) + THROUGHPUT_BIN, THROUGHPUT_BIN)
    counts, _ = np.histogram(sent, bins)
    rate.plot(bins[:-1], counts / THROUGHPUT_BIN)
    rate.set_xlabel("time (s)")
    rate.set_ylabel("answered requests / s")
    rate.set_ylim(bottom=0)
    rate.set_title(f"throughput {summary['throughput']:,.0f}/s, {summary['timeouts']} timeouts")
    rate.grid(alpha=0.3)

    fig.suptitle(f"{summary['clients']} {summary['protocol'].upper()} clients, {summary['keys']} keys "
                 f"Zipf({summary['alpha']}), hash {summary['hash']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
