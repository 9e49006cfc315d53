"""Benchmark: one controller against many switches and servers (docs/scale.md).

First, what one request to a switch across the network costs, measured here: a real switch agent (`mbalancer switch
serve`, the recording data plane) on loopback, the median round trip of a one-key write_stamps. Then, for each
(servers, switches, H): real memcached servers on loopback (100-byte values), the real controller core, and a
simulated fabric (dataplanes/recording/fabric.py: the slot book over in-memory switches, each request taking that
round trip). Each case runs twice, side by side: "one by one" (the switches written one after the other, each copy
its own round trip: [dataplane.p4] parallel = 1, [controller] copy_depth = 1) and "parallel" (every switch at once,
--parallel of them, one request in flight each; --depth copies per round trip to each server). Each round is a
monitor report whose top H keys are all new: the figure is the time from the report until every new key is copied,
installed on every switch, stamped and clean, and the old set removed; with it the requests the change sent (not
the lease's and read-backs the core's own threads send meanwhile: fabric.py CHANGE_CALLS), the
hot-set changes per second one controller sustains (1 / that time), and the new keys that left the common path
(settled alone instead of with the batch: one stamp read and one clear for all), with why.
    python experiments/benchmarks/bench_controller_scale.py [--servers 16,64,256] [--switches 1,8,32]
        [--hot 10,100] [--rounds 3] [--rtt-ms MS] [--paths one-by-one,parallel] [--parallel 32] [--depth 64]
        [--out results/scale]
Writes scale.csv and scale.png to --out; prints a table and one JSON line; exit 1 if a change of the smallest H took
longer than --target-ms (1 s), or the parallel path missed a target of issue 47 for a case it ran (H = 100: 100 ms;
H = 1,000: 1 s).
"""
from __future__ import annotations

import argparse
import csv
from collections import Counter
import json
import statistics
import sys
import tempfile
import time
import zlib
from pathlib import Path

from controller.core import ControllerCore
from dataplanes.pipeline import MAX_HOT
from dataplanes.recording.fabric import SimulatedFabric, change_requests
from dataplanes.recording.tables import MemoryTables
from mbalancer.config import parse_config
from mbalancer.memcache.meta import MetaClient, StoredItem
from mbalancer.memcache.server import MemcachedServer
from mbalancer.progress import end_progress, stderr_progress

VALUE = bytes(100)
PATHS = ("one-by-one", "parallel")
TARGETS_MS = {100: 100.0, 1000: 1000.0}  # issue 47: a change of H keys, on the parallel path, whatever the fabric


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


def run_case(memcached: list[MemcachedServer], switches: int, hot: int, rounds: int, rtt_ms: float,
             path: str = "parallel", parallel: int = 32, depth: int = 64) -> dict:
    """One (servers, switches, H) on one path: the changes' times, requests, copies and keys settled alone."""
    width, depth = (1, 1) if path == "one-by-one" else (parallel, depth)
    driver = SimulatedFabric(switches, rtt_ms / 1000, width)
    config = parse_config({"servers": [{"name": f"s{i}", "ip": "127.0.0.1", "mac": f"02:00:00:00:{i >> 8:02x}:"
                                        f"{i & 255:02x}", "port": m.port} for i, m in enumerate(memcached)],
                           "balancing": {"hot": hot, "hysteresis": 1}, "monitor": {"capacity": max(hot, 1024)},
                           "controller": {"copy_depth": depth}})
    core = ControllerCore(config, driver, probe_health=False).start()
    clients = [MetaClient(s.address) for s in config.servers]
    try:
        sets = [[b"scale:%d:%d:%d" % (switches, which, i) for i in range(hot)] for which in (0, 1)]
        for key in sets[0] + sets[1]:
            clients[core.key_hash.server_of(key)].set(key, StoredItem(VALUE, 0, -1, 0))
        core.submit_report(report_of(sets[0]))  # warm-up: the first set becomes hot
        core.wait_idle(120)
        change_ms, requests, alone = [], [], Counter()
        for round_ in range(rounds):
            new = sets[(round_ + 1) % 2]
            sent, copies = driver.change_requests, core.replicator.copies
            alone_before = Counter(core.executor.settled_alone)
            started = time.monotonic()
            core.submit_report(report_of(new))
            if not core.wait_idle(300):
                raise RuntimeError("the core did not finish a hot-set change in 300 s")
            change_ms.append(1000 * (time.monotonic() - started))
            requests.append(driver.change_requests - sent)
            unclean = [k for k in new if not _clean(driver, k)]
            if unclean:
                raise RuntimeError(f"{len(unclean)} of {hot} new keys are not installed clean on every switch: "
                                   f"{core.state()['decisions'][-3:]}")
            copies = core.replicator.copies - copies
            alone += Counter(core.executor.settled_alone) - alone_before
        return {"path": path, "servers": len(memcached), "switches": switches, "hot": hot, "rtt_ms": round(rtt_ms, 3),
                "parallel": width, "copy_depth": depth,
                "change_ms_median": round(statistics.median(change_ms), 1), "change_ms_max": round(max(change_ms), 1),
                "requests_per_change": int(statistics.median(requests)), "copies_per_change": copies,
                "changes_per_s": round(1000 / statistics.median(change_ms), 2),
                "settled_alone_per_change": round(sum(alone.values()) / rounds, 1),
                "settled_alone_why": "; ".join(f"{why}: {n}" for why, n in alone.most_common()) or "none"}
    finally:
        core.stop()
        for client in clients:
            client.close()


def run_sharded(memcached: list[MemcachedServer], switches: int, hot: int, shards: int, rounds: int, rtt_ms: float,
                parallel: int = 32, depth: int = 64) -> dict:
    """Key-range shards (docs/scale.md): `shards` controllers over the same switches, each owning a range of the key
    hash and of every switch's slots, each changing its H / shards keys when its report comes (all at once); then
    one shard's controller fails over (stopped, a new one started on its range, which removes what it finds there
    and installs anew) while the other shards' entries on every switch are compared before and after."""
    delay, per_shard = rtt_ms / 1000, hot // shards
    tables = [MemoryTables(delay) for _ in range(switches)]
    ranges = [range(s * MAX_HOT // shards, (s + 1) * MAX_HOT // shards) for s in range(shards)]
    config = parse_config({"servers": [{"name": f"s{i}", "ip": "127.0.0.1", "mac": f"02:00:00:00:{i >> 8:02x}:"
                                        f"{i & 255:02x}", "port": m.port} for i, m in enumerate(memcached)],
                           "balancing": {"hot": per_shard, "hysteresis": 1},
                           "monitor": {"capacity": max(per_shard, 1024)}, "controller": {"copy_depth": depth}})

    def start(shard: int) -> ControllerCore:
        return ControllerCore(config, SimulatedFabric(switches, delay, parallel, tables, ranges[shard]),
                              probe_health=False).start()

    cores = [start(shard) for shard in range(shards)]
    clients = [MetaClient(s.address) for s in config.servers]
    try:
        sets = [[_shard_keys(f"shard:{switches}:{which}", shard, shards, per_shard) for shard in range(shards)]
                for which in (0, 1)]
        for key in (key for which in sets for keys in which for key in keys):
            clients[cores[0].key_hash.server_of(key)].set(key, StoredItem(VALUE, 0, -1, 0))
        _change_all(cores, sets[0])  # warm-up
        change_ms, requests = [], []
        for round_ in range(rounds):
            sent = change_requests(tables)
            change_ms.append(_change_all(cores, sets[(round_ + 1) % 2]))
            requests.append(change_requests(tables) - sent)
        current = sets[rounds % 2]
        _check_clean(cores, current)
        victim = 0
        others = _entries_outside(tables, ranges[victim])
        cores[victim].stop()
        started = time.monotonic()
        cores[victim] = start(victim)
        _change_all([cores[victim]], [current[victim]])
        failover_ms = 1000 * (time.monotonic() - started)
        _check_clean(cores, current)
        return {"shards": shards, "servers": len(memcached), "switches": switches, "hot": hot,
                "change_ms_median": round(statistics.median(change_ms), 1), "change_ms_max": round(max(change_ms), 1),
                "requests_per_change": int(statistics.median(requests)),
                "failover_rebuild_ms": round(failover_ms, 1), "other_shards_keys": sum(map(len, others)),
                "other_shards_untouched": _entries_outside(tables, ranges[victim]) == others}
    finally:
        for core in cores:
            core.stop()
        for client in clients:
            client.close()


def _shard_keys(prefix: str, shard: int, shards: int, count: int) -> list[bytes]:
    """`count` keys whose hash falls in the shard's range of the key space."""
    keys = (b"%s:%d" % (prefix.encode(), i) for i in range(100 * count * shards))
    return [key for key in keys if zlib.crc32(key) * shards >> 32 == shard][:count]


def _change_all(cores: list[ControllerCore], sets: list[list[bytes]]) -> float:
    """Every core's report at once; ms until every core is idle again."""
    started = time.monotonic()
    for core, keys in zip(cores, sets):
        core.submit_report(report_of(keys))
    for core in cores:
        if not core.wait_idle(300):
            raise RuntimeError("a shard's core did not finish its hot-set change in 300 s")
    return 1000 * (time.monotonic() - started)


def _check_clean(cores: list[ControllerCore], sets: list[list[bytes]]) -> None:
    for core, keys in zip(cores, sets):
        if unclean := [k for k in keys if not _clean(core.driver, k)]:
            raise RuntimeError(f"{len(unclean)} of a shard's keys are not installed clean on every switch")


def _entries_outside(tables: list[MemoryTables], slots: range) -> list[dict]:
    """Per switch, every hot key outside `slots` with its entry and synced counts."""
    return [{key: (entry, t.synced.get(entry.slot)) for key, entry in t.hot.items() if entry.slot not in slots}
            for t in tables]


def report_of(keys: list[bytes]) -> dict:
    rates = [1000.0 + len(keys) - i for i in range(len(keys))]  # hottest first, every one hot
    return {"time": time.time(), "interval": 1.0, "rate": 2 * sum(rates),
            "top": [{"key": k.decode(), "rate": rate} for k, rate in zip(keys, rates)]}


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
    fig, ax = plt.subplots(figsize=(8, 5))
    cases = [(n, h) for n in sorted({r["servers"] for r in rows}) for h in sorted({r["hot"] for r in rows})]
    for path, style in zip(PATHS, ("--", "-")):  # a case has one colour: dashed one by one, solid in parallel
        for colour, (servers, hot) in enumerate(cases):
            line = sorted((r["switches"], r["change_ms_median"]) for r in rows
                          if r["servers"] == servers and r["hot"] == hot and r["path"] == path)
            if line:
                ax.plot(*zip(*line), style, marker="o", color=f"C{colour % 10}",
                        label=f"{path}: {servers} servers, H = {hot}")
    ax.set_xlabel("switches")
    ax.set_ylabel("hot-set change, ms (median)")
    ax.set_yscale("log")
    ax.set_title(f"One controller: a change of all H hot keys (request round trip {rows[0]['rtt_ms']} ms)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
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
    parser.add_argument("--paths", default=",".join(PATHS), help="one-by-one, parallel or both (side by side)")
    parser.add_argument("--parallel", type=int, default=32, help="the parallel path: switches written at once")
    parser.add_argument("--depth", type=int, default=64, help="the parallel path: copies per round trip to a server")
    parser.add_argument("--shards", type=int, default=0,
                        help="also: this many key-range controllers over the most switches, at each H (0: none)")
    parser.add_argument("--out", type=Path, default=Path("results/scale"))
    parser.add_argument("--target-ms", type=float, default=1000.0,
                        help="every change of the smallest H within this (the controller benchmark's target)")
    args = parser.parse_args(argv)
    paths = args.paths.split(",")
    if not set(paths) <= set(PATHS) or args.parallel < 1 or args.depth < 1:
        parser.error(f"--paths: {' and/or '.join(PATHS)}; --parallel and --depth: at least 1")
    rtt_ms = args.rtt_ms if args.rtt_ms is not None else agent_round_trip_ms()
    print(f"a request to a switch agent on loopback: {rtt_ms:.3f} ms (median round trip)", file=sys.stderr)
    counts = [int(n) for n in args.servers.split(",")]
    memcached = [MemcachedServer(memory_mb=64).start() for _ in range(max(counts))]
    rows = []
    try:
        cases = [(n, s, h, path) for n in counts for h in map(int, args.hot.split(","))
                 for s in map(int, args.switches.split(",")) for path in paths]
        for i, (servers, switches, hot, path) in enumerate(cases):
            what = f"case {i + 1}/{len(cases)}: {servers} servers, {switches} switches, H = {hot}, {path}"
            stderr_progress(what)
            rows.append(run_case(memcached[:servers], switches, hot, args.rounds, rtt_ms, path, args.parallel,
                                 args.depth))
            stderr_progress(f"{what}: {rows[-1]['change_ms_median']:.0f} ms")
        sharded = []
        for hot in (map(int, args.hot.split(",")) if args.shards else ()):
            switches = max(map(int, args.switches.split(",")))
            stderr_progress(f"{args.shards} key-range shards: {max(counts)} servers, {switches} switches, H = {hot}")
            sharded.append(run_sharded(memcached, switches, hot, args.shards, args.rounds, rtt_ms, args.parallel,
                                       args.depth))
        end_progress()
    finally:
        for server in memcached:
            server.stop()
    print(f"{'path':>10} {'servers':>7} {'switches':>8} {'H':>5} {'change p50 ms':>13} {'max':>8} {'requests':>8} "
          f"{'copies':>6} {'changes/s':>9} {'alone':>5} {'x faster':>8}")
    for r in rows:
        print(f"{r['path']:>10} {r['servers']:>7} {r['switches']:>8} {r['hot']:>5} {r['change_ms_median']:>13.1f} "
              f"{r['change_ms_max']:>8.1f} {r['requests_per_change']:>8} {r['copies_per_change']:>6} "
              f"{r['changes_per_s']:>9.2f} {r['settled_alone_per_change']:>5g} {_speedup(rows, r):>8}")
    for r in rows:
        if r["settled_alone_per_change"]:
            print(f"left the common path ({r['path']}, {r['servers']} servers, {r['switches']} switches, H = "
                  f"{r['hot']}): {r['settled_alone_why']}")
    for r in sharded:
        print(f"{r['shards']} key-range shards, {r['servers']} servers, {r['switches']} switches, H = {r['hot']}: "
              f"change p50 {r['change_ms_median']:g} ms (max {r['change_ms_max']:g}), {r['requests_per_change']} "
              f"requests; one shard's failover rebuilt in {r['failover_rebuild_ms']:g} ms, the other shards' "
              f"{r['other_shards_keys']} switch entries {'untouched' if r['other_shards_untouched'] else 'CHANGED'}")
    write_outputs(rows, args.out)
    smallest = min(r["hot"] for r in rows)
    targets = [{"path": r["path"], "servers": r["servers"], "switches": r["switches"], "hot": r["hot"],
                "target_ms": TARGETS_MS[r["hot"]], "change_ms_max": r["change_ms_max"],
                "met": r["change_ms_max"] <= TARGETS_MS[r["hot"]]}
               for r in rows if r["path"] == "parallel" and r["hot"] in TARGETS_MS]
    for t in targets:
        print(f"target H = {t['hot']} on {t['switches']} switches, {t['servers']} servers: <= {t['target_ms']:g} ms; "
              f"slowest change {t['change_ms_max']:g} ms: {'met' if t['met'] else 'MISSED'}")
    met = all(r["change_ms_max"] <= args.target_ms for r in rows if r["hot"] == smallest) and \
        all(t["met"] for t in targets)
    met = met and all(r["other_shards_untouched"] for r in sharded)
    print(json.dumps({"rtt_ms": rtt_ms, "rows": rows, "targets": targets, "sharded": sharded, "out": str(args.out),
                      "target_ms": args.target_ms, "met": met}))
    return 0 if met else 1


def _speedup(rows: list[dict], row: dict) -> str:
    """The parallel path's change time against the one-by-one path's of the same case, where both ran."""
    if row["path"] != "parallel":
        return ""
    old = [r for r in rows if r["path"] == "one-by-one" and all(r[k] == row[k] for k in ("servers", "switches", "hot"))]
    return f"{old[0]['change_ms_median'] / row['change_ms_median']:.1f}" if old else ""


if __name__ == "__main__":
    sys.exit(main())
