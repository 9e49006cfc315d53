"""Benchmark: time to compute all four thesis figures at the default trial count (target: under 60 s).

Prints one line per figure (seconds, points, trials/s), the total, peak memory and the verdict, then one JSON line.
Exit code 1 when the target is missed, so scripts can gate on it.
    python experiments/benchmarks/bench_simulation.py [--trials N] [--target-seconds S]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

from experiments.simulation.figures import FIGURES, make_figure
from experiments.simulation.scenario import Scenario


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=Scenario.trials, help="trials per point (default: the CLI's)")
    parser.add_argument("--target-seconds", type=float, default=60.0)
    args = parser.parse_args()
    base = Scenario(trials=args.trials)
    print(f"cores: {os.cpu_count()}, trials per point: {base.trials}")
    print(f"{'figure':<8} {'seconds':>8} {'points':>7} {'trials/s':>10}")
    timings = {}
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        for name, spec in sorted(FIGURES.items()):
            t0 = time.perf_counter()
            make_figure(name, Path(out), base)  # CSV and PNG included: what a user waits for
            seconds = time.perf_counter() - t0
            timings[name] = seconds
            points = len(spec.x_values) * len(spec.curves)
            print(f"{name:<8} {seconds:>8.2f} {points:>7} {points * base.trials / seconds:>10.0f}")
        total = time.perf_counter() - start
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    ok = total < args.target_seconds
    print(f"{'total':<8} {total:>8.2f}   target < {args.target_seconds:.0f} s: {'met' if ok else 'MISSED'}; "
          f"peak memory {peak_mb:.0f} MB")
    print(json.dumps({"benchmark": "simulation_figures", "trials": base.trials, "seconds": timings,
                      "total_seconds": total, "target_seconds": args.target_seconds, "met": ok,
                      "peak_rss_mb": peak_mb}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
