"""`mbalancer faults`: inject faults under load and print what the clients saw (docs/experiments.md: "Faults")."""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from dataclasses import asdict
from pathlib import Path

from experiments.faults.busy import CpuHogs
from experiments.faults.coherence import SCENARIOS, Outcome, format_outcomes, run_scenario, store_initial
from experiments.faults.plot import plot_run
from experiments.faults.rig import PROTOCOLS, Rig, RigError
from experiments.faults.run import Phases, format_table, run_fault, write_buckets_csv, write_summary
from experiments.faults.scenarios import FAULTED, FAULTS
from mbalancer.outputs import output_problem
from mbalancer.progress import end_progress, stderr_progress

MAX_HOGS = 64
DATAPLANES = ("ebpf", "p4", "openflow")  # with a namespace switch; OpenFlow's controller is the Ryu app


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "faults", help="inject faults (crash, hang, UDP wedge, controller kill, ...) under load (root)",
        description="Three memcached servers and a client in namespaces behind a switch (eBPF or P4), MBalancer's "
                    "controller as its own process. For each fault and load: warm-up, fault, recovery; the client "
                    "counts per 100 ms gets answered, timeouts, stale reads (versioned values) and misses. Writes a "
                    "CSV and a PNG per run, summary.csv/json, and prints the table.")
    parser.add_argument("--out", type=Path, required=True, help="folder for the CSVs, plots and summary")
    parser.add_argument("--faults", help=f"comma-separated, of: {', '.join(FAULTS)} (default: every one the data "
                                         f"plane takes)")
    parser.add_argument("--loads", default="0.5,0.75,1", help="fractions of --rate, comma-separated")
    parser.add_argument("--rate", type=float, default=2000.0, help="gets/s at load 1 (about what one Python "
                                                                   "client sustains on a 2-core machine)")
    parser.add_argument("--write-rate", type=float, default=20.0, help="versioned sets/s to the hot keys")
    parser.add_argument("--hot", type=int, default=6, help="hot keys, none homed on the faulted server")
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds of load before the fault (default 3)")
    parser.add_argument("--fault", type=float, default=3.0, help="seconds the fault lasts (default 3)")
    parser.add_argument("--recovery", type=float, default=4.0,
                        help="seconds of load after the fault ends, to see the recovery (default 4)")
    parser.add_argument("--dataplane", choices=DATAPLANES, default="ebpf",
                        help="the switch the rig is built on (default ebpf; p4: bmv2, much slower: use --rate 500; "
                             "openflow: Open vSwitch and the key classifier, the controller under ryu-manager)")
    parser.add_argument("--protocol", choices=PROTOCOLS, default="udp",
                        help="what the clients' gets go over (default udp; tcp: through the eBPF switch's TCP path, "
                             "docs/dataplanes/tcp.md; the sets are TCP either way)")
    parser.add_argument("--hogs", type=int, default=0,
                        help="busy loops running for the whole of every run, as on a loaded machine (two on a 2-core "
                             "box: load average about 4-8); failure detection is judged under them")
    parser.add_argument("--coherence", default=",".join(SCENARIOS),
                        help="coherence paths probed after the faults, comma-separated (\"\": none), of: "
                             + ", ".join(SCENARIOS))
    parser.set_defaults(run=_run, fail=parser.error)


def _run(args: argparse.Namespace, fail) -> int:
    names = args.faults if args.faults is not None else \
        ",".join(f for f in FAULTS if args.dataplane in FAULTS[f].dataplanes)
    faults = [f.strip() for f in names.split(",") if f.strip()]
    unknown = [f for f in faults if f not in FAULTS]
    if unknown:
        fail(f"--faults: unknown {', '.join(unknown)} (known: {', '.join(FAULTS)})")
    if elsewhere := [f for f in faults if args.dataplane not in FAULTS[f].dataplanes]:
        fail(f"--faults: {', '.join(elsewhere)} not on --dataplane {args.dataplane}")
    try:
        loads = [float(x) for x in args.loads.split(",")]
    except ValueError:
        fail(f"--loads: numbers between 0 and 1, comma-separated (got {args.loads!r})")
    if not all(0 < x <= 1 for x in loads) or args.rate <= 0 or args.write_rate < 0 or args.hot < 1 \
            or not 0 <= args.hogs <= MAX_HOGS:
        fail(f"--loads in (0, 1], --rate > 0, --write-rate >= 0, --hot >= 1, --hogs from 0 to {MAX_HOGS}")
    paths = [p.strip() for p in args.coherence.split(",") if p.strip()]
    if unknown := [p for p in paths if p not in SCENARIOS]:
        fail(f"--coherence: unknown {', '.join(unknown)} (known: {', '.join(SCENARIOS)})")
    if args.protocol == "tcp" and args.dataplane != "ebpf":
        fail(f"--protocol tcp: only the eBPF switch balances TCP gets (--dataplane {args.dataplane} sends them home)")
    if os.geteuid() != 0:
        fail("needs root (network namespaces, tc, eBPF)")
    if problem := output_problem(args.out):
        fail(f"--out: {problem}")
    phases = Phases(args.warmup, args.fault, args.recovery)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt))
    results: list = []
    try:
        with CpuHogs(args.hogs):
            outcomes = _runs(args, faults, loads, paths, phases, results)
    except (RigError, RuntimeError) as err:
        end_progress()
        if results:  # the runs done are kept
            write_summary(args.out, results)
            print(format_table(results))
        print(f"mbalancer faults: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        end_progress()
        print(f"mbalancer faults: interrupted; the rig was removed ({len(results)} runs kept in {args.out})",
              file=sys.stderr)
        if results:
            write_summary(args.out, results)
        return 130
    end_progress()
    csv_path, _ = write_summary(args.out, results)
    print(format_table(results))
    if outcomes:
        print(format_outcomes(outcomes))
        (args.out / "coherence.json").write_text(json.dumps([asdict(o) for o in outcomes], indent=1))
    print(f"written: {csv_path}, summary.json, one CSV and PNG per run in {args.out}", file=sys.stderr)
    return 0


def _runs(args: argparse.Namespace, faults: list[str], loads: list[float], paths: list[str], phases: Phases,
          results: list) -> list[Outcome]:
    """Every fault at every load, each on a fresh rig (no fault leaks into the next), into `results`; then the
    coherence paths."""
    runs = [(f, load) for f in faults for load in loads]
    for done, (name, load) in enumerate(runs):
        stderr_progress(f"{name} at {load:.0%} load ({done + 1}/{len(runs)}, {phases.total:g} s each)")
        with Rig(args.out, args.hot, FAULTED, dataplane=args.dataplane, protocol=args.protocol) as rig:
            result = run_fault(rig, FAULTS[name], load, args.rate, args.write_rate, phases, args.out)
        write_buckets_csv(args.out, result)
        plot_run(args.out, result)
        results.append(result)
    return _coherence(args, paths)


def _coherence(args: argparse.Namespace, paths: list[str]) -> list[Outcome]:
    """The coherence paths, each on a fresh rig with its keys balanced (experiments/faults/coherence.py)."""
    outcomes = []
    for done, name in enumerate(paths):
        stderr_progress(f"coherence path {name} ({done + 1}/{len(paths)})")
        with Rig(args.out, args.hot, FAULTED, dataplane=args.dataplane, protocol=args.protocol) as rig:
            store_initial(rig)
            rig.wait_balanced()
            outcomes.append(run_scenario(rig, name, args.out))
    return outcomes
