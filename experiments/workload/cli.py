"""`mbalancer load`: drive memcached servers with a Zipf workload and record every request.

Output contract: `--json` prints one JSON object (see records.summarise: throughput, p50_ms/p95_ms/p99_ms,
per_server, hits, misses, timeouts, imbalance factors); OUT/records.csv has one row per request, OUT/summary.json
the same object, OUT/load.png the plots. Progress goes to stderr. Exit 2 for bad options (an --out that cannot be
written included), 1 when a server answered none of its requests (named, with the likely reason) or fails.
Ctrl-C or SIGTERM ends the run early: the outputs hold what was measured until then (summary: stopped_early).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Callable

from experiments.workload.engine import run_load
from experiments.workload.plot import plot_run
from experiments.workload.populate import PopulateError, populate
from experiments.workload.records import summarise, write_csv
from experiments.workload.spec import PROTOCOLS, Workload, WorkloadError
from mbalancer.memcache.addresses import parse_servers
from mbalancer.memcache.hashing import HASH_KINDS
from mbalancer.outputs import output_problem
from mbalancer.processes import stop_on_signals
from mbalancer.progress import end_progress, stderr_progress

Fail = Callable[[str], None]


def register(commands: argparse._SubParsersAction) -> None:
    d = Workload(servers=())
    load = commands.add_parser(
        "load", help="Zipf workload from C blocking memcached clients, every request recorded",
        description="Drive memcached servers with C closed-loop clients (one request at a time, each waiting for "
                    "its reply or timeout) asking for N keys of Zipf(alpha) popularity, and record every request.")
    load.add_argument("--servers", required=True, help="host:port,host:port,... in hash order")
    load.add_argument("--keys", type=int, default=d.keys, help=f"keys N (default {d.keys})")
    load.add_argument("--alpha", type=float, default=d.alpha, help=f"Zipf exponent (default {d.alpha})")
    load.add_argument("--clients", type=int, default=d.clients, help=f"concurrent clients C (default {d.clients})")
    load.add_argument("--duration", type=float, default=d.duration, help=f"seconds (default {d.duration:g})")
    load.add_argument("--requests", type=int, help="stop after this many requests instead of a duration")
    load.add_argument("--value-size", type=int, default=d.value_size, help=f"bytes (default {d.value_size})")
    load.add_argument("--set-ratio", type=float, default=d.set_ratio,
                      help=f"share of requests that are sets (default {d.set_ratio:g})")
    load.add_argument("--hash", default=d.hash, help=f"key -> server: {', '.join(HASH_KINDS)} (default {d.hash})")
    load.add_argument("--protocol", default=d.protocol, choices=PROTOCOLS, help=f"default {d.protocol}")
    load.add_argument("--timeout", type=float, default=d.timeout, help=f"seconds per request (default {d.timeout:g})")
    load.add_argument("--seed", type=int, default=d.seed, help=f"random seed of the key sequence (default {d.seed})")
    load.add_argument("--key-prefix", default=d.key_prefix, help=f"keys are PREFIX1..PREFIXN (default {d.key_prefix})")
    load.add_argument("--populate", action="store_true",
                      help="first store every key on its home server over TCP (with --duration 0: only that)")
    load.add_argument("--out", type=Path, default=Path("results/load"),
                      help="folder for records.csv, summary.json, load.png (default results/load)")
    load.add_argument("--no-records", action="store_true", help="skip records.csv (large for long runs)")
    load.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    load.add_argument("--started-file", type=Path,
                      help="create this file once the first requests are out (a runner that starts several "
                           "generators measures from when all have started)")
    load.set_defaults(run=_run_load, fail=load.error)


def _run_load(args: argparse.Namespace, fail: Fail) -> int:
    workload = _workload(args, fail)
    load_nothing = workload.requests == 0 or (workload.requests is None and workload.duration == 0)
    if load_nothing and not args.populate:
        fail("nothing to do: --duration 0 or --requests 0 only makes sense with --populate")
    if problem := output_problem(args.out):
        fail(f"--out: {problem}")
    if args.populate and not _populate(workload):
        return 1
    if load_nothing:
        return 0
    try:
        records = run_load(workload, stderr_progress, stop=stop_on_signals(),
                           on_start=args.started_file.touch if args.started_file else lambda: None)
    except OSError as err:
        print(f"mbalancer load: cannot run the clients: {err}", file=sys.stderr)
        return 1
    end_progress()
    summary = summarise(records, workload)
    _write_outputs(args, records, workload, summary)
    if records.stopped_early:  # like ping: an interrupted run still reports what it measured
        print(f"mbalancer load: stopped by a signal after {records.duration:.1f} s; what was measured is in "
              f"{args.out}", file=sys.stderr)
    print(json.dumps(summary) if args.json else format_summary(summary, args.out, not args.no_records))
    return 1 if _report_silent_servers(summary) else 0


def _report_silent_servers(summary: dict) -> bool:
    """Say which servers answered none of the requests they were sent, and the likely reason; True if any."""
    if not summary["requests"]:
        print(f"mbalancer load: no request finished within the run (each waits up to --timeout "
              f"{summary['timeout_s']:g} s for its reply): run longer", file=sys.stderr)
        return True
    silent = [row for row in summary["per_server"] if row["asked"] and not row["answered"]]
    udp = summary["protocol"] == "udp"
    for row in silent:
        print(f"mbalancer load: {row['server']} answered none of its {row['asked']} requests: is memcached running "
              f"there" + (", with UDP enabled (`memcached -U <port>`; it is off by default since 1.5.6)?"
                          if udp else "?"), file=sys.stderr)
    return bool(silent)


def _workload(args: argparse.Namespace, fail: Fail) -> Workload:
    """The checked workload, or exit 2 naming the bad option."""
    try:
        servers = tuple(parse_servers(args.servers))
    except ValueError as err:
        fail(f"--servers: {err}")
    workload = Workload(servers=servers, keys=args.keys, alpha=args.alpha, clients=args.clients,
                        duration=args.duration, requests=args.requests, value_size=args.value_size,
                        set_ratio=args.set_ratio, hash=args.hash, protocol=args.protocol, timeout=args.timeout,
                        seed=args.seed, key_prefix=args.key_prefix)
    try:
        workload.check()
    except WorkloadError as err:
        fail(str(err))
    return workload


def _populate(workload: Workload) -> bool:
    try:
        stored = populate(workload, stderr_progress)
    except PopulateError as err:
        print(f"mbalancer load: {err}", file=sys.stderr)
        return False
    end_progress()
    print(f"populated {sum(stored.values())} keys of {workload.value_size} bytes: "
          + ", ".join(f"{server} {n}" for server, n in stored.items()), file=sys.stderr)
    return True


def _write_outputs(args: argparse.Namespace, records, workload: Workload, summary: dict) -> None:
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    if not args.no_records:
        write_csv(records, workload, args.out / "records.csv")
    plot_run(records, summary, args.out / "load.png")


def format_summary(s: dict, out: Path, with_records: bool = True) -> str:
    """Human-readable summary of a run."""
    def ms(value):
        return "-" if value is None else f"{value:.3f} ms"
    lines = [
        f"{s['clients']} {s['protocol'].upper()} clients, {s['keys']} keys Zipf({s['alpha']}), hash {s['hash']}, "
        f"{s['duration_s']:.2f} s",
        f"  throughput       {s['throughput']:,.0f} answered requests/s ({s['answered']} of {s['requests']})",
        f"  latency          p50 {ms(s['p50_ms'])}  p95 {ms(s['p95_ms'])}  p99 {ms(s['p99_ms'])}",
        f"  outcomes         {s['hits']} hits, {s['misses']} misses, {s['stored']} stored, {s['timeouts']} timeouts, "
        f"{s['errors']} errors, {s['unreachable']} unreachable",
        f"  imbalance factor {s['imbalance_factor_measured'] or 0:.3f} measured, "
        f"{s['imbalance_factor_expected']:.3f} expected from the hash and Zipf weights",
        "  per server       " + ", ".join(f"{r['server']} {100 * r['share']:.1f}%" for r in s["per_server"]),
        f"  written          {out}/summary.json, {'records.csv, ' if with_records else ''}load.png",
    ]
    return "\n".join(lines)
