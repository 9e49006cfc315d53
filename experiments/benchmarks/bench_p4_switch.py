"""Benchmark: packets/s through bmv2 running p4src/mbalancer.p4 against the same bmv2 running a plain L2 program
(p4src/l2_forward.p4) on the same veths and traffic, side by side in one run; and the hot-set change latency through
P4Runtime against the eBPF driver's on an eBPF switch, in the same run.

Forwarding: the namespace network with the p4 data plane (simple_switch_grpc on the switch ports); the sender,
sinks, traffic kinds (cold, hot: one hot key 50/50 over two servers, mixed: Zipf 0.99 over 10,000 keys with the
10 hottest hot) and windows are those of bench_ebpf_switch.py. bmv2 is a software switch that interprets the
program per packet: these are its own limits at full offered load; target: mbalancer.p4 at >= --target-ratio (0.5)
of the L2 program's packets/s for each kind of traffic.
Hot-set change: H keys leave and H new ones come (remove, install, stamp and clear: the driver calls the core makes
once the copies are warm), timed per change, --changes times: through P4Runtime with the calls on many keys (one
request per switch each), the same one key at a time, and the eBPF driver's; target: the median change through
P4Runtime, batched, within --target-ms (10 ms).
With --instructions, also bmv2's own instructions per packet for both programs and each traffic kind, free of the
machine's load: the same network with the switch run under callgrind (valgrind), a few hundred packets of each kind
paced so that it keeps up, counted once it has worked through them (the median of 3 windows; a few minutes more).
Needs root, simple_switch_grpc and trafgen (netsniff-ng); --instructions needs valgrind.
    python experiments/benchmarks/bench_p4_switch.py [--seconds 2] [--repeats 3] [--hot 10] [--changes 10]
        [--target-ms 10] [--target-ratio 0.5] [--instructions] [--out DIR]
Prints a table and one JSON line (and with --out, p4_switch.csv); exit 1 if a kind of traffic or the batched change
missed its target.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dataplanes.driver import Driver, ForwardingEntry, HotKeyInstall, ReplicaWeight
from dataplanes.ebpf.driver import EbpfDriver
from dataplanes.bpf.program import DataPlane, compile_bpf
from dataplanes.p4 import entries as e
from dataplanes.p4.client import P4RuntimeClient
from dataplanes.p4.pipeline import BASELINE, Pipeline, available, outputs
from experiments.benchmarks.bench_ebpf_switch import (SINK_SOURCE, TRAFFIC, attach_sinks, counter, install_hot_keys,
                                                       median_of, sender_command, traffic_frames, window, write_frames)
from experiments.benchmarks.rows import write_csv
from mbalancer.config import Server
from mbalancer.progress import end_progress, stderr_progress
from topologies.netns import NamespaceNetwork


def forwarding(args: argparse.Namespace, sink: Path, tmp: Path) -> list[dict]:
    rows = []
    with NamespaceNetwork(servers=2, clients=1, tag="mbbp4", dataplane="p4") as net:
        driver, hosts = program_switch(net, sink)
        rows += measure(net, "mbalancer.p4", args, tmp)
        rows[-1]["balanced"] = driver.switch_counters()[0]["balanced"]
        # where the switch sent the hot gets, by its own per-replica counters: what arrived at the sinks (share_s2)
        # is that less what a port's queue dropped, which differs between ports on a busy machine
        sent = driver.read_counters().keys[b"hot"].per_replica
        hot = next(row for row in rows if row["traffic"] == "hot")
        hot["switch_share_s2"] = sent.get(1, 0) / max(1, sum(sent.values()))
        driver.close()
        baseline(net, hosts)
        rows += measure(net, "l2_forward.p4", args, tmp)
    return rows


def program_switch(net: NamespaceNetwork, sink: Path):
    """Sinks on the servers; the P4Runtime driver (pipeline pushed, hot keys clean, lease long) with a forwarding
    entry per host: (the driver, the hosts in port order)."""
    attach_sinks(net, sink)
    driver = install_hot_keys(net)
    hosts = net.server_hosts + net.client_hosts
    driver.set_forwarding([ForwardingEntry(h.mac, str(i + 1)) for i, h in enumerate(hosts)])
    return driver, hosts


def baseline(net: NamespaceNetwork, hosts) -> None:
    """The same switch, now running the L2 program with the same forwarding entries."""
    json_path, p4info_path = outputs(BASELINE)
    pipeline = Pipeline(p4info_path, json_path)
    client = P4RuntimeClient(net.switch.bmv2.address, 1)
    client.connect()
    try:
        client.set_pipeline(pipeline)
        client.write([e.update(e.INSERT, e.table_entry(pipeline, "forward", {"hdr.ethernet.dst": e.mac_value(h.mac)},
                                                       "to_port", {"port": i + 1})) for i, h in enumerate(hosts)]
                     + [e.update(e.INSERT, e.flood_group(range(1, len(hosts) + 2)))], "the baseline's entries")
    finally:
        client.close()


def measure(net: NamespaceNetwork, program: str, args: argparse.Namespace, tmp: Path) -> list[dict]:
    rows = []
    for kind in TRAFFIC:
        config = write_frames("trafgen", traffic_frames(net, kind), tmp, kind)
        measured = median_of(args.repeats, lambda: window(
            net, sender_command("trafgen", config, args.cpus), args.seconds,
            lambda: [counter(net, h, "rx_packets") for h in net.server_hosts]))
        rows.append({"program": program, "traffic": kind, **measured})
        print(f"  {program:>14} {kind:>6}: {rows[-1]['pps']:,.0f} packets/s on {rows[-1]['cores']:.2f} cores",
              file=sys.stderr, flush=True)
    return rows


CALLGRIND_START = 300.0  # s for the switch under callgrind to serve P4Runtime (it runs ~50x slower)
CALLGRIND_PACKETS, CALLGRIND_WARMUP, CALLGRIND_GAP = 300, 100, "10ms"  # per window; before the first; paced
CALLGRIND_IDLE = 2_000_000  # instructions in a second below which the switch has worked through its queue
CALLGRIND_DRAIN = 600  # s at most to wait for that


def instructions(args: argparse.Namespace, sink: Path, tmp: Path) -> list[dict]:
    """bmv2's own instructions per packet (callgrind): the forwarding benchmark's network, entries and traffic, each
    program in turn, the switch run under valgrind."""
    rows = []
    with NamespaceNetwork(servers=2, clients=1, tag="mbbp4i", dataplane="p4") as net:
        net.switch.bmv2.stop()
        net.switch.bmv2.start(wrapper=["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/callgrind.%p"],
                              timeout=CALLGRIND_START).bootstrap()
        driver, hosts = program_switch(net, sink)
        rows += count_instructions(net, "mbalancer.p4", tmp)
        driver.close()
        baseline(net, hosts)
        rows += count_instructions(net, "l2_forward.p4", tmp)
    return rows


def count_instructions(net: NamespaceNetwork, program: str, tmp: Path) -> list[dict]:
    pid, rows = net.switch.bmv2.process.pid, []
    for kind in TRAFFIC:
        config = write_frames("trafgen", traffic_frames(net, kind), tmp, kind)
        send_paced(net, config, CALLGRIND_WARMUP)  # a pipeline's first packets cost more
        windows = []
        for _ in range(3):
            before = drained(pid)
            send_paced(net, config, CALLGRIND_PACKETS)
            windows.append((drained(pid) - before) / CALLGRIND_PACKETS)
        rows.append({"program": program, "traffic": kind, "instructions": statistics.median(windows)})
        print(f"  {program:>14} {kind:>6}: {rows[-1]['instructions']:,.0f} instructions/packet "
              f"({', '.join(f'{w:,.0f}' for w in windows)})", file=sys.stderr, flush=True)
    return rows


def send_paced(net: NamespaceNetwork, config: Path, packets: int) -> None:
    command = sender_command("trafgen", config, 1) + ["--num", str(packets), "--gap", CALLGRIND_GAP]
    done = net.run(net.client_hosts[0], command, timeout=600)
    if done.returncode:
        raise RuntimeError(f"trafgen exited ({done.returncode}): {done.stderr.strip()[-500:]}")


def drained(pid: int) -> int:
    """The switch's instructions so far (all threads), once it has worked through what it was sent."""
    total = executed(pid)
    for _ in range(CALLGRIND_DRAIN):
        time.sleep(1)
        now = executed(pid)
        if now - total < CALLGRIND_IDLE:
            return now
        total = now
    raise RuntimeError(f"the switch under callgrind still busy after {CALLGRIND_DRAIN} s")


def executed(pid: int) -> int:
    out = subprocess.run(["callgrind_control", "-e", "Ir", str(pid)], capture_output=True, text=True,
                         timeout=60).stdout
    counts = re.findall(r"Th *\d+ +([\d,]+)", out)
    if not counts:
        raise RuntimeError(f"callgrind_control -e Ir {pid}: {out.strip()[-300:] or 'no answer'}")
    return sum(int(n.replace(",", "")) for n in counts)


def hot_set_changes(driver: Driver, servers: int, hot: int, changes: int, label: str, batched: bool) -> list[float]:
    """ms per change of the whole hot set, through `driver` (attached, lease renewed): the calls on many keys (one
    request per switch each), or the same calls one key at a time."""
    weights = tuple(ReplicaWeight(s, 1 / servers) for s in range(servers))
    sets = [[b"set%d:key:%d" % (which, i) for i in range(hot)] for which in (0, 1)]
    change_set = change_in_batches if batched else change_one_by_one
    change_set(driver, [], sets[0], weights)
    timings = []
    for change in range(changes):
        started = time.perf_counter()
        change_set(driver, sets[change % 2], sets[(change + 1) % 2], weights)
        timings.append(1000 * (time.perf_counter() - started))
        stderr_progress(f"{label}: change {change + 1}/{changes}, {timings[-1]:.1f} ms")
    end_progress()
    return timings


def change_in_batches(driver: Driver, old: list[bytes], new: list[bytes], weights: tuple[ReplicaWeight, ...]) -> None:
    """What the core does for a hot-set change once the copies are warm: remove, install, stamp, clear."""
    refused = driver.remove_hot_keys(old)
    refused.update(driver.install_hot_keys([HotKeyInstall(key, 0, weights) for key in new]))
    refused.update(driver.clear_dirty_keys(driver.write_stamps(new)))
    if refused:
        raise SystemExit(f"bench_p4_switch: the driver refused {len(refused)} keys: {next(iter(refused.values()))}")


def change_one_by_one(driver: Driver, old: list[bytes], new: list[bytes], weights: tuple[ReplicaWeight, ...]) -> None:
    for key in old:
        driver.remove_hot_key(key)
    for key in new:
        driver.install_hot_key(key, 0, weights)
        driver.clear_dirty(key, driver.write_stamp(key))


def change_latency(args: argparse.Namespace) -> list[dict]:
    servers = [Server(f"s{i}", f"10.0.0.{i + 1}", f"02:00:00:00:00:{i + 1:02x}") for i in range(2)]
    rows = []
    with NamespaceNetwork(servers=2, clients=1, tag="mbbp4c", dataplane="p4") as net:
        for batched in (True, False):
            driver = net.driver()
            found = driver.attach(servers, lambda frame: None)
            driver.remove_hot_keys([key.key for key in found])  # adopted from the driver before: each starts empty
            driver.renew_lease(3600)
            label = "p4runtime" + ("" if batched else ", one by one")
            rows.append((label, hot_set_changes(driver, 2, args.hot, args.changes, label, batched)))
            driver.close()
    plane = DataPlane("mbbench").load()
    try:
        driver = EbpfDriver([plane.pin_dir])
        driver.attach(servers, lambda frame: None)
        driver.renew_lease(3600)
        rows.append(("ebpf", hot_set_changes(driver, 2, args.hot, args.changes, "ebpf", True)))
        driver.close()
    finally:
        plane.unload()
    return [{"driver": name, "hot": args.hot, "change_ms_median": statistics.median(ms), "change_ms_max": max(ms)}
            for name, ms in rows]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="measurement window per figure (default 2)")
    parser.add_argument("--repeats", type=int, default=3, help="windows per figure, the median kept (default 3)")
    parser.add_argument("--cpus", type=int, default=1, help="trafgen processes (default 1: bmv2 needs the rest)")
    parser.add_argument("--hot", type=int, default=10, help="hot keys per change (default 10)")
    parser.add_argument("--changes", type=int, default=10, help="hot-set changes timed per driver (default 10)")
    parser.add_argument("--target-ms", type=float, default=10.0,
                        help="median hot-set change through P4Runtime, batched, allowed (default 10)")
    parser.add_argument("--target-ratio", type=float, default=0.5,
                        help="mbalancer.p4's packets/s allowed for each kind, as a fraction of L2's (default 0.5)")
    parser.add_argument("--instructions", action="store_true",
                        help="also bmv2's instructions per packet, under callgrind (valgrind; a few minutes)")
    parser.add_argument("--out", type=Path, help="also write p4_switch.csv here")
    args = parser.parse_args(argv)
    if not 0.1 <= args.seconds <= 60 or not 1 <= args.repeats <= 20 or not 1 <= args.cpus <= 64 \
            or not 1 <= args.hot <= 1000 or not 1 <= args.changes <= 1000 or not 0 < args.target_ratio <= 10:
        parser.error("--seconds 0.1-60, --repeats 1-20, --cpus 1-64, --hot 1-1000, --changes 1-1000, "
                     "--target-ratio 0-10")
    if os.geteuid() != 0:
        parser.error("needs root (namespaces, veths)")
    if args.instructions and shutil.which("callgrind_control") is None:
        parser.error("--instructions needs valgrind (callgrind_control is not on PATH)")
    if (why := available()) is not None:  # `make bench` goes on without it, saying so
        print(f"bench_p4_switch: skipped: the P4 data plane cannot run here: {why}", file=sys.stderr)
        print(json.dumps({"met": True, "skipped": why}))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        sink = compile_bpf(SINK_SOURCE, Path(tmp) / "sink.bpf.o", "the benchmark's sink")
        rows = forwarding(args, sink, Path(tmp))
        counted = instructions(args, sink, Path(tmp)) if args.instructions else []
    latency = change_latency(args)
    forwarding_met = set_ratios(rows, args.target_ratio)
    print(f"{'program':<15}{'traffic':<8}{'packets/s':>11}{'windows (low-high)':>20}{'cores':>7}{'vs L2':>7}"
          f"{'to s2':>7}")
    for r in rows:
        spread = f"{r['pps_low']:,.0f}-{r['pps_high']:,.0f}"
        print(f"{r['program']:<15}{r['traffic']:<8}{r['pps']:>11,.0f}{spread:>20}{r['cores']:>7.2f}"
              f"{_ratio_text(r['ratio']):>7}{r['share_s2']:>7.2f}")
    l2 = {r["traffic"]: r["instructions"] for r in counted if r["program"] == "l2_forward.p4"}
    for r in counted:
        print(f"{r['program']:<15}{r['traffic']:<8}{r['instructions']:>11,.0f} instructions/packet"
              f"{l2[r['traffic']] / r['instructions']:>7.2f} vs L2")
    for r in latency:
        print(f"hot-set change of {r['hot']} keys through {r['driver']}: median {r['change_ms_median']:.1f} ms, "
              f"max {r['change_ms_max']:.1f} ms")
    if args.out:
        write_csv(args.out, "p4_switch.csv", rows)
    ours = [r for r in rows if r["program"] == "mbalancer.p4"]
    ratios = ", ".join(f"{r['traffic']} {_ratio_text(r['ratio'])}" for r in ours)
    print(f"forwarding, each kind at >= {args.target_ratio:g} of L2: {'met' if forwarding_met else 'missed'} "
          f"({ratios})")
    latency_met = all(r["change_ms_median"] <= args.target_ms for r in latency if r["driver"] == "p4runtime")
    print(json.dumps({"met": forwarding_met and latency_met, "forwarding_met": forwarding_met,
                      "target_ratio": args.target_ratio, "latency_met": latency_met, "target_ms": args.target_ms,
                      "rows": rows, "instructions": counted, "hot_set_change": latency}))
    return 0 if forwarding_met and latency_met else 1


def set_ratios(rows: list[dict], target: float) -> bool:
    """Each row's packets/s as a fraction of L2's for its kind of traffic (`ratio`; None where L2 delivered nothing
    in its windows, a machine too busy to schedule the switch); whether mbalancer.p4 met `target` for every kind (a
    kind with no L2 figure did not)."""
    base = {r["traffic"]: r["pps"] for r in rows if r["program"] == "l2_forward.p4"}
    for r in rows:
        r["ratio"] = r["pps"] / base[r["traffic"]] if base[r["traffic"]] > 0 else None
    return all(r["ratio"] is not None and r["ratio"] >= target for r in rows if r["program"] == "mbalancer.p4")


def _ratio_text(ratio: float | None) -> str:
    """A fraction of L2's packets/s as the table prints it; "no L2" where L2 delivered nothing to compare with (a
    window on a machine too busy to schedule the switch): counted as missed, never a division by zero."""
    return "no L2" if ratio is None else f"{ratio:.2f}"


if __name__ == "__main__":
    sys.exit(main())
