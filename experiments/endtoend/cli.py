"""`mbalancer experiment NAME --out DIR`: the thesis's chapter 5 end to end on a Mininet testbed (needs root).

NAME: fig5.1 (throughput) and fig5.2 (latency) run the same sweep (the second reuses the first's runs when DIR
holds a sweep of identical settings), ketama10 (ten servers, ketama hash), demo (one point, short: `make demo`).
--hot auto lets the controller pick H per point; --rounds N repeats the sweep and reports medians with ranges.
Writes DIR/runs.csv, medians.csv, summary.json, fig5_1.png, fig5_2.png, servers.png and a folder per run; progress on
stderr; the demo ends with one JSON line on stdout. Exit 2 for bad options, 1 when a run fails, 130 when
interrupted (everything the run made is removed either way).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from dataclasses import replace
from pathlib import Path
from typing import Callable

from experiments.endtoend.plot import plot_all
from experiments.endtoend.report import demo_line, format_runs
from experiments.endtoend.spec import (AUTO_TARGET, CONTROLLERS, DETECTIONS, PRESETS, SWEEP_FIGURES, ExperimentSpec,
                                       on_dataplane, on_protocol, on_topology)
from experiments.endtoend.sweep import load_summary, run_sweep, spec_dict
from experiments.workload.spec import PROTOCOLS
from mbalancer.config import REPLICA_MODES, Balancing, config_option
from mbalancer.outputs import output_problem
from mbalancer.progress import end_progress, stderr_progress
from topologies.shapes import TOPOLOGIES

Fail = Callable[[str], None]
DATAPLANES = ("ebpf", "openflow", "p4")  # what --dataplane takes


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "experiment", help="the thesis's Figs 5.1/5.2 end to end on Mininet (root)",
        description="Build a Mininet testbed (eBPF switch, memcached servers with capped links, client hosts), then "
                    "run every point with and without MBalancer (monitor -> controller -> replication -> data "
                    "plane) and compare throughput, latency and per-server load.")
    parser.add_argument("name", choices=sorted(PRESETS), help="which experiment")
    parser.add_argument("--out", type=Path, required=True, help="folder for the CSV, JSON and plots")
    parser.add_argument("--config", type=Path,
                        help="MBalancer config (TOML): its [balancing] and [monitor] are used; its servers are not "
                             "(the testbed makes them)")
    parser.add_argument("--points", help="imbalance factors to run instead of the preset's, e.g. 0.5,0.7,0.9 "
                                         "(the skewed hash dials them)")
    parser.add_argument("--warmup", type=float, help="seconds of load before measuring")
    parser.add_argument("--measure", type=float, help="seconds measured per run")
    parser.add_argument("--hot", help='H: hot keys per report, a number, or "auto": the fewest that reach --target')
    parser.add_argument("--target", type=float,
                        help=f"with --hot auto: the imbalance factor to reach (default {AUTO_TARGET:g})")
    parser.add_argument("--modes", help="MBalancer's replica weightings to run, comma-separated: "
                                        f"{', '.join(REPLICA_MODES)} (default: the preset's)")
    parser.add_argument("--rounds", type=int, help="run the whole sweep this many times, interleaved, and report "
                                                   "medians with ranges (default 1; 3 on a noisy machine)")
    parser.add_argument("--dataplane",
                        help="the switch: ebpf (default), openflow (Open vSwitch, the Ryu app in ryu-manager) or p4 "
                             "(bmv2 over P4Runtime, at the lower rates a software switch carries); with --topology "
                             "leafspine several, comma-separated, make a mixed fabric: the leaves take them in turn, "
                             "the spines the first (e.g. ebpf,openflow: leaf1 eBPF, leaf2 Open vSwitch)")
    parser.add_argument("--topology", choices=TOPOLOGIES,
                        help="single (one switch, the default) or leafspine: two tiers, servers and clients dealt "
                             "over the leaves; every switch on a box of its own behind its switch agent, each get "
                             "balanced at its home's leaf")
    parser.add_argument("--leaves", type=int, help="leaves of the leaf-spine (default 2)")
    parser.add_argument("--spines", type=int, help="spines of the leaf-spine (default 2)")
    parser.add_argument("--detect", choices=DETECTIONS[1:],
                        help="how the monitor finds the hot keys: sketch (the switch counts every get itself; the "
                             "default on ebpf and openflow with one switch) or capture (the client ports' packets "
                             "copied to the monitor; the default on p4 and leafspine)")
    parser.add_argument("--controller", choices=CONTROLLERS[1:],
                        help="where the controller core runs: ryu (the Ryu app inside ryu-manager; the default, and "
                             "the only way, on one openflow switch) or local (in this process, as `mbalancer "
                             "controller`; the default elsewhere)")
    parser.add_argument("--protocol", choices=PROTOCOLS,
                        help="the clients' gets over udp (the default) or tcp (the eBPF switch balances them through "
                             "its TCP path: docs/dataplanes/tcp.md)")
    parser.add_argument("--rerun", action="store_true", help="run even if OUT holds a sweep of these settings")
    parser.set_defaults(run=_run_experiment, fail=parser.error)


def _run_experiment(args: argparse.Namespace, fail: Fail) -> int:
    spec = _spec(args, fail)
    if os.geteuid() != 0:
        fail("the testbed needs root (network namespaces, tc, eBPF)")
    if why := spec.testbed.unavailable():
        fail(f"--dataplane: {why}")
    if problem := output_problem(args.out):
        fail(f"--out: {problem}")
    previous = load_summary(args.out)
    if previous and not args.rerun and _same_settings(previous, spec):
        print(f"mbalancer experiment: reusing the runs in {args.out}/summary.json (same settings; --rerun to run "
              f"again)", file=sys.stderr)
        summary = previous
    else:
        summary = _sweep(spec, args.out)
        if summary is None:
            return 130
        if isinstance(summary, str):
            print(f"mbalancer experiment: {summary}", file=sys.stderr)
            return 1
    plots = plot_all(summary, args.out)
    print(format_runs(summary, SWEEP_FIGURES.get(spec.name)))
    print(f"written: {args.out}/runs.csv, summary.json, " + ", ".join(p.name for p in plots), file=sys.stderr)
    if spec.name == "demo":
        print(json.dumps(demo_line(summary)))
    return 0


def _sweep(spec: ExperimentSpec, out: Path) -> dict | str | None:
    """The summary; an error message if a run failed; None if interrupted. The testbed is gone either way."""
    signal.signal(signal.SIGTERM, _interrupt)  # a kill cleans up like Ctrl-C
    try:
        return run_sweep(spec, out, stderr_progress)
    except KeyboardInterrupt:
        end_progress()
        print("mbalancer experiment: interrupted; the testbed was removed", file=sys.stderr)
        return None
    except (RuntimeError, OSError, ValueError) as err:
        end_progress()
        return f"{type(err).__name__}: {err}"
    finally:
        end_progress()


def _interrupt(*_) -> None:
    raise KeyboardInterrupt


def _spec(args: argparse.Namespace, fail: Fail) -> ExperimentSpec:
    spec = PRESETS[args.name]
    changes: dict = {}
    if args.config:
        config = config_option(args.config, fail)
        changes.update(balancing=config.balancing, monitor_interval=config.monitor.interval)
    if args.points:
        try:
            changes["hashes"] = tuple(f"skewed:{float(x):g}" for x in args.points.split(","))
        except ValueError:
            fail(f"--points: comma-separated imbalance factors, e.g. 0.5,0.7 (got {args.points!r})")
    if args.hot is not None or args.target is not None:
        changes["balancing"] = _hot(changes.get("balancing", spec.balancing), args, fail)
    if args.modes is not None:
        changes["replica_modes"] = tuple(m.strip() for m in args.modes.split(","))
    if args.rounds is not None:
        changes["rounds"] = args.rounds
    if args.warmup is not None:
        changes["warmup"] = args.warmup
    if args.detect is not None:
        changes["detection"] = args.detect
    if args.controller is not None:
        changes["controller"] = args.controller
    if args.measure is not None:
        changes["measure"] = args.measure
    spec = replace(spec, **changes)
    if args.dataplane is not None:
        spec = on_dataplane(spec, _dataplanes(args.dataplane, args.topology, fail))
    if (args.leaves is not None or args.spines is not None) and (args.topology or spec.testbed.topology) != "leafspine":
        fail("--leaves and --spines go with --topology leafspine")
    if args.topology is not None:
        spec = on_topology(spec, args.topology, args.leaves, args.spines)
    if args.protocol is not None:
        spec = on_protocol(spec, args.protocol)
    try:
        spec.check()
    except ValueError as err:
        fail(str(err))
    return spec


def _dataplanes(text: str, topology: str | None, fail: Fail) -> tuple[str, ...]:
    """--dataplane KIND or, on a leaf-spine, KIND,KIND,...: the data planes, each one the testbed runs."""
    kinds = tuple(word.strip() for word in text.split(","))
    if unknown := [kind for kind in kinds if kind not in DATAPLANES]:
        fail(f"--dataplane: {', '.join(map(repr, unknown))} is not one of {', '.join(DATAPLANES)}")
    if len(kinds) > 1 and topology != "leafspine":
        fail("--dataplane: several data planes make a mixed fabric: they go with --topology leafspine")
    return kinds


def _hot(balancing: Balancing, args: argparse.Namespace, fail: Fail) -> Balancing:
    """--hot N or auto, --target: the balancing they ask for."""
    if args.hot == "auto" or (args.hot is None and args.target is not None):
        target = args.target if args.target is not None else balancing.target or AUTO_TARGET
        if not 0 < target <= 1:
            fail(f"--target: an imbalance factor in (0, 1] (got {target:g})")
        return replace(balancing, hot=None, target=target)
    if args.target is not None:
        fail("--target goes with --hot auto")
    if not args.hot.isdigit() or int(args.hot) < 1:
        fail(f'--hot: a number of keys of at least 1, or "auto" (got {args.hot!r})')
    return replace(balancing, hot=int(args.hot), target=None)


def _same_settings(summary: dict, spec: ExperimentSpec) -> bool:
    old, new = dict(summary.get("spec", {})), spec_dict(spec)
    old.pop("name", None)
    new.pop("name", None)
    return old == new
