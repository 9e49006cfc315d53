"""Benchmark: one controller against many switches and servers (docs/scale.md).

First, what one request to a switch across the network costs, measured here: a real switch agent (`mbalancer switch
serve`, the recording data plane) on loopback, the median round trip of a one-key write_stamps. Then, for each
(servers, switches, H): real memcached servers on loopback (100-byte values), the real controller core, and a
simulated fabric (dataplanes/recording/fabric.py: the slot book over in-memory switches, each request taking that
round trip, the switches written one after the other as the eBPF and P4 drivers write theirs). Each round is a
monitor report whose top H keys are all new: the figure is the time from the report until every new key is copied,
installed on every switch, stamped and clean, and the old set removed; with it the requests sent per change and the
hot-set changes per second one controller sustains (1 / that time).
    python experiments/benchmarks/bench_controller_scale.py [--servers 16,64,256] [--switches 1,8,32]
        [--hot 10,100] [--rounds 3] [--rtt-ms MS] [--out results/scale]
Writes scale.csv and scale.png to --out; prints a table and one JSON line; exit 1 if a change of the smallest H took
longer than --target-ms (1 s).
"""
from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from controller.core import ControllerCore
from dataplanes.recording.fabric import SimulatedFabric
from mbalancer.config import parse_config
from mbalancer.memcache.meta import MetaClient, StoredItem
from mbalancer.memcache.server import MemcachedServer
from mbalancer.progress import end_progress, stderr_progress

VALUE = bytes(100)


def agent_round_trip_ms(calls: int = 300) -> float:
    """The median round trip of one call to a real switch agent (another process) on loopback."""
    from dataplanes.agent import Settings
    from dataplanes.agent.client import AgentDriver
    from dataplanes.agent.process import AgentProcess
    from dataplanes.driver import ReplicaWeight
    from mbalancer.memcache.server import free_port
    from mbalancer.settings import Server
    with tempfile.TemporaryDirectory() as folder:
        config, address = Path(folder) / "agent.toml", f"127.0.0.1:{free_port()}"
        config.write_text(f'[[servers]]\nname = "s1"\nip = "127.0.0.1"\nmac = "02:00:00:00:00:01"\n'
                          f'[dataplane]\nkind = "none"\n[dataplane.agent]\nlisten = "{address}"\n')
        agent = AgentProcess(config)
        try:
            driver = AgentDriver(Settings(address=address))
            driver.attach([Server("s1", "127.0.0.1", "02:00:00:00:00:01")], lambda frame: None)
            driver.install_hot_key(b"k", 0, [ReplicaWeight(0, 1.0)])
            times = []
            for _ in range(calls):
                started = time.perf_counter()
                driver.write_stamps([b"k"])
                times.append(1000 * (time.perf_counter() - started))
            driver.close()
        finally:
            agent.stop()
    return statistics.median(times)


def run_case(memcached: list[MemcachedServer], switches: int, hot: int, rounds: int, rtt_ms: float) -> dict:
    driver = SimulatedFabric(switches, rtt_ms / 1000)
    config = parse_config({"servers": [{"name": f"s{i}", "ip": "127.0.0.1", "mac": f"02:00:00:00:{i >> 8:02x}:"
                                        f"{i & 255:02x}", "port": m.port} for i, m in enumerate(memcached)],
                           "balancing": {"hot": hot, "hysteresis": 1}})
    core = ControllerCore(config, driver, probe_health=False).start()
    clients = [MetaClient(s.address) for s in config.servers]
    try:
        sets = [[b"scale:%d:%d:%d" % (switches, which, i) for i in range(hot)] for which in (0, 1)]
        for key in sets[0] + sets[1]:
            clients[core.key_hash.server_of(key)].set(key, StoredItem(VALUE, 0, -1, 0))
        core.submit_report(report_of(sets[0]))  # warm-up: the first set becomes hot
        core.wait_idle(120)
        change_ms, requests = [], []
        for round_ in range(rounds):
            new = sets[(round_ + 1) % 2]
            sent, copies = driver.requests, core.replicator.copies
            started = time.monotonic()
            core.submit_report(report_of(new))
            if not core.wait_idle(300):
                raise RuntimeError("the core did not finish a hot-set change in 300 s")
            change_ms.append(1000 * (time.monotonic() - started))
            requests.append(driver.requests - sent)
            unclean = [k for k in new if not _clean(driver, k)]
            if unclean:
                raise RuntimeError(f"{len(unclean)} of {hot} new keys are not installed clean on every switch: "
                                   f"{core.state()['decisions'][-3:]}")
            copies = core.replicator.copies - copies
        return {"servers": len(memcached), "switches": switches, "hot": hot, "rtt_ms": round(rtt_ms, 3),
                "change_ms_median": round(statistics.median(change_ms), 1), "change_ms_max": round(max(change_ms), 1),
                "requests_per_change": int(statistics.median(requests)), "copies_per_change": copies,
                "changes_per_s": round(1000 / statistics.median(change_ms), 2)}
    finally:
        core.stop()
        for client in clients:
            client.close()


def report_of(keys: list[bytes]) -> dict:
    return {"time": time.time(), "interval": 1.0, "rate": 100_000.0,
            "top": [{"key": k.decode(), "rate": 5000.0 - i} for i, k in enumerate(keys)]}


def _clean(driver: SimulatedFabric, key: bytes) -> bool:
    """Installed on every switch, and synced there (not held dirty)."""
    slot = driver.book.slots.get(key)
    return slot is not None and all(key in t.hot and t.synced.get(slot) is not None for t in driver.tables)


def write_outputs(rows: list[dict], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "scale.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for servers in sorted({r["servers"] for r in rows}):
        for hot in sorted({r["hot"] for r in rows}):
            line = sorted((r["switches"], r["change_ms_median"]) for r in rows
                          if r["servers"] == servers and r["hot"] == hot)
            ax.plot(*zip(*line), marker="o", label=f"{servers} servers, H = {hot}")
    ax.set_xlabel("switches (written one after the other)")
    ax.set_ylabel("hot-set change, ms (median)")
    ax.set_title(f"One controller: a change of all H hot keys (request round trip {rows[0]['rtt_ms']} ms)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "scale.png", dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", default="16,64,256", help="server counts (memcached on loopback)")
    parser.add_argument("--switches", default="1,8,32", help="simulated switch counts")
    parser.add_argument("--hot", default="10,100", help="H values: the hot keys that all change each round")
    parser.add_argument("--rounds", type=int, default=3, help="hot-set changes per row")
    parser.add_argument("--rtt-ms", type=float, help="a request's round trip (default: measured on a switch agent)")
    parser.add_argument("--out", type=Path, default=Path("results/scale"))
    parser.add_argument("--target-ms", type=float, default=1000.0,
                        help="every change of the smallest H within this (the controller benchmark's target)")
    args = parser.parse_args(argv)
    rtt_ms = args.rtt_ms if args.rtt_ms is not None else agent_round_trip_ms()
    print(f"a request to a switch agent on loopback: {rtt_ms:.3f} ms (median round trip)", file=sys.stderr)
    counts = [int(n) for n in args.servers.split(",")]
    memcached = [MemcachedServer(memory_mb=64).start() for _ in range(max(counts))]
    rows = []
    try:
        cases = [(n, s, h) for n in counts for h in map(int, args.hot.split(","))
                 for s in map(int, args.switches.split(","))]
        for i, (servers, switches, hot) in enumerate(cases):
            stderr_progress(f"case {i + 1}/{len(cases)}: {servers} servers, {switches} switches, H = {hot}")
            rows.append(run_case(memcached[:servers], switches, hot, args.rounds, rtt_ms))
            stderr_progress(f"case {i + 1}/{len(cases)}: {servers} servers, {switches} switches, H = {hot}: "
                            f"{rows[-1]['change_ms_median']:.0f} ms")
        end_progress()
    finally:
        for server in memcached:
            server.stop()
    print(f"{'servers':>7} {'switches':>8} {'H':>4} {'change p50 ms':>13} {'max':>7} {'requests':>8} "
          f"{'copies':>6} {'changes/s':>9}")
    for r in rows:
        print(f"{r['servers']:>7} {r['switches']:>8} {r['hot']:>4} {r['change_ms_median']:>13.1f} "
              f"{r['change_ms_max']:>7.1f} {r['requests_per_change']:>8} {r['copies_per_change']:>6} "
              f"{r['changes_per_s']:>9.2f}")
    write_outputs(rows, args.out)
    smallest = min(r["hot"] for r in rows)
    met = all(r["change_ms_max"] <= args.target_ms for r in rows if r["hot"] == smallest)
    print(json.dumps({"rtt_ms": rtt_ms, "rows": rows, "out": str(args.out), "target_ms": args.target_ms,
                      "met": met}))
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
