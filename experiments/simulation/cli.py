"""`mbalancer simulate imbalance|figure` and `mbalancer demo` (the simulation's headline until the Mininet demo).

Output contract (scripts depend on it): `simulate imbalance --json` prints one JSON object with
`imbalance_factor` (the mean over trials), `ci95` ([low, high]) and `inputs`, plus the comparisons described in
Outcome.summary. `simulate figure N --out DIR` writes DIR/figN.csv and DIR/figN.png.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Callable

from experiments.simulation.figures import FIGURES, make_figure
from mbalancer.outputs import output_problem
from mbalancer.progress import end_progress, stderr_progress
from experiments.simulation.headline import format_headline, headline
from experiments.simulation.remedies import REMEDY_MODES
from experiments.simulation.scenario import Outcome, Scenario, ScenarioError, simulate, smallest_hot_for

Fail = Callable[[str], None]  # argparse's error(): prints usage and the message, exits with code 2


def register(commands: argparse._SubParsersAction) -> None:
    """Add `simulate` and `demo` to the top-level command parser."""
    simulate_parser = commands.add_parser("simulate", help="Monte Carlo model of hot keys and their remedies")
    kinds = simulate_parser.add_subparsers(dest="kind", required=True, metavar="KIND")

    imbalance = kinds.add_parser("imbalance", help="imbalance factor of one setting",
                                 description="Imbalance factor (mean/max server load) of one setting, "
                                             "with no remedy and with the chosen remedy.")
    _scenario_arguments(imbalance)
    imbalance.add_argument("--hot", default="10", help="hot keys H, or 'auto' with --target (default 10)")
    imbalance.add_argument("--target", type=float, help="with --hot auto: the imbalance factor to reach")
    imbalance.add_argument("--json", action="store_true", help="print one JSON object")
    imbalance.set_defaults(run=_run_imbalance, fail=imbalance.error)

    figure = kinds.add_parser("figure", help="one of the thesis's figures as CSV and PNG",
                              description="Write figN.csv and figN.png for the thesis's figure N.")
    figure.add_argument("name", choices=sorted(FIGURES) + ["all"], help="figure number, or all")
    figure.add_argument("--out", type=Path, required=True, help="output folder")
    figure.add_argument("--trials", type=int, default=Scenario.trials, help="random assignments per point")
    figure.add_argument("--seed", type=int, default=Scenario.seed, help=f"random seed (default {Scenario.seed})")
    figure.add_argument("--alpha", type=float, default=Scenario.alpha, help="Zipf exponent (default 1.0)")
    figure.add_argument("--hot", type=int, default=Scenario.hot, help="hot keys H (default 10)")
    figure.set_defaults(run=_run_figure, fail=figure.error)

    demo = commands.add_parser("demo", help="the model's headline gain, printed and plotted (make simulation)",
                               description="Print the headline table for the thesis's setting and write "
                                           "all figures under OUT/simulation.")
    demo.add_argument("--out", type=Path, default=Path("results"), help="output folder (default results)")
    demo.add_argument("--trials", type=int, default=Scenario.trials,
                      help=f"random assignments per point (default {Scenario.trials})")
    demo.add_argument("--seed", type=int, default=Scenario.seed, help=f"random seed (default {Scenario.seed})")
    demo.set_defaults(run=_run_demo, fail=demo.error)


def _scenario_arguments(parser: argparse.ArgumentParser) -> None:
    d = Scenario()
    parser.add_argument("--servers", type=int, default=d.servers, help=f"memcached servers n (default {d.servers})")
    parser.add_argument("--keys", type=int, default=d.keys, help=f"keys N (default {d.keys})")
    parser.add_argument("--groups", type=int, default=d.groups, help=f"replica groups G, dividing n (default {d.groups})")
    parser.add_argument("--alpha", type=float, default=d.alpha, help=f"Zipf exponent (default {d.alpha})")
    parser.add_argument("--mode", default=d.mode, help=f"remedy: {', '.join(REMEDY_MODES)} (default {d.mode})")
    parser.add_argument("--trials", type=int, default=d.trials, help=f"random assignments (default {d.trials})")
    parser.add_argument("--seed", type=int, default=d.seed, help=f"random seed (default {d.seed})")


def _run_imbalance(args: argparse.Namespace, fail: Fail) -> int:
    auto = args.hot == "auto"
    if not auto and not args.hot.lstrip("-").isdigit():
        fail(f"--hot must be a whole number or 'auto' (got {args.hot!r})")
    if auto != (args.target is not None):
        fail("--target goes with --hot auto, and --hot auto needs --target")
    scenario = Scenario(servers=args.servers, keys=args.keys, hot=0 if auto else int(args.hot),
                        groups=args.groups, alpha=args.alpha, mode=args.mode, trials=args.trials, seed=args.seed)
    try:
        if auto:
            outcome, search = smallest_hot_for(scenario, args.target)
        else:
            outcome, search = simulate(scenario), None
    except ScenarioError as err:
        fail(str(err))
    if outcome is None:
        print(f"mbalancer: imbalance factor {search['target']} not reached with up to {search['searched_up_to']} "
              f"hot keys (best {search['best_imbalance_factor']:.4f} at H={search['best_hot']})", file=sys.stderr)
        if args.json:
            print(json.dumps({"auto": search, "inputs": asdict(scenario)}))
        return 1
    report = outcome.summary()
    if search:
        report["auto"] = search
    print(json.dumps(report) if args.json else format_imbalance(outcome, report))
    return 0


def format_imbalance(outcome: Outcome, report: dict) -> str:
    """Human-readable report of one setting."""
    s = outcome.scenario
    base, gain, extra = report["baseline"], report["gain"], report["extra_servers_equivalent"]
    lines = [
        f"{s.servers} servers, {s.keys} keys (Zipf {s.alpha}), H={s.hot} hot keys, G={s.groups}, "
        f"mode {s.mode}, {s.trials} trials, seed {s.seed}",
        f"  {'imbalance factor, no remedy':<38} {base['mean']:.4f}  95% CI [{base['ci95'][0]:.4f}, {base['ci95'][1]:.4f}]",
        f"  {'imbalance factor, ' + s.mode:<38} {report['imbalance_factor']:.4f}  "
        f"95% CI [{report['ci95'][0]:.4f}, {report['ci95'][1]:.4f}]",
        f"  {'throughput gain':<38} {gain['mean']:.3f}x",
        f"  {'share of gets to the hot keys':<38} {report['hot_share']:.4f}",
        f"  {'extra copies stored':<38} {report['extra_copies']:.1f} ({100 * report['memory_overhead']:.2f}% of keys)",
        f"  {'same max load by adding servers':<38} {extra['mean']:.2f} copies of the busiest servers",
    ]
    if "auto" in report:
        lines.insert(1, f"  smallest H reaching {report['auto']['target']}: {s.hot}")
    return "\n".join(lines)


def _run_figure(args: argparse.Namespace, fail: Fail) -> int:
    base = Scenario(trials=args.trials, seed=args.seed, alpha=args.alpha, hot=args.hot)
    names = sorted(FIGURES) if args.name == "all" else [args.name]
    written = []
    try:
        base.check(hot_may_be_open=True)
        if problem := output_problem(args.out):
            fail(f"--out: {problem}")
        for name in names:  # each point is checked again with its own keys, before anything is written
            for path in make_figure(name, args.out, base, progress=stderr_progress):
                print(path)
                written.append(path)
    except ScenarioError as err:
        fail(str(err))
    except KeyboardInterrupt:
        end_progress()
        print(f"mbalancer simulate: interrupted; {len(written)} file(s) written in {args.out} before that",
              file=sys.stderr)
        return 130
    return 0


def _run_demo(args: argparse.Namespace, fail: Fail) -> int:
    base = Scenario(trials=args.trials, seed=args.seed)
    try:
        base.check()
    except ScenarioError as err:
        fail(str(err))
    if problem := output_problem(args.out / "simulation"):
        fail(f"--out: {problem}")
    rows = headline(base)
    print(format_headline(base, rows))
    out = args.out / "simulation"
    written = [p for name in sorted(FIGURES) for p in make_figure(name, out, base, progress=stderr_progress)]
    print("\nfigures:", *[str(p) for p in written if p.suffix == ".png"], sep="\n  ")
    equal = next(o for label, o in rows if label.startswith("MBalancer, equal"))
    summary = equal.summary()
    print(json.dumps({"baseline": {"imbalance_factor": summary["baseline"]["mean"]},
                      "mbalancer": {"imbalance_factor": summary["imbalance_factor"]},
                      "gain": summary["gain"]["mean"], "source": "simulation"}))
    return 0
