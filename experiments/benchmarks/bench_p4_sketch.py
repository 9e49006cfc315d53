"""Benchmark: hot-key detection in the P4 data plane (p4src/mbalancer.p4's sketch, dataplanes/p4/sketch.py), its
accuracy and what it costs bmv2, beside the eBPF sketch's figures (bench_dataplane_sketch.py: the same traces and
scoring).

Zipf traces of gets (alpha 0.9 and 1.2 over 10^5 and 10^6 keys, --gets each) sent into a simple_switch_grpc on
veths, paced by the switch's own count of frames read (none dropped: the report's total must equal the trace), with
the sketch on for one interval read back as `mbalancer monitor` reads it (here over the driver's connection, the
P4Runtime primary; through the controller it is the same calls over HTTP). Per trace:
  recall          of the true top 10, in the reported top 10 (a key tied with the tenth within the error bound counts)
  rate error      the largest |estimate - exact| / exact over the true top 10 found
  read ms         the reader's wall time for the interval (flip, wait for the epoch's digests, read, zero, report)
  gets/s off, on  bmv2's rate for the trace's first --cost-gets gets, sketch off and on, in alternating blocks of
                  10,000 so drift cancels (bmv2 interprets the program per packet: its own limits, the ratio is the
                  figure)
  digests/get     digest samples the switch sent per get counted
Targets: recall >= 0.99 and rates within 1%. Needs root and simple_switch_grpc (make p4).
    python experiments/benchmarks/bench_p4_sketch.py [--gets 1000000] [--cost-gets 100000] [--out DIR]
Prints progress, a table and one JSON line; with --out, also p4_sketch.csv. Exit 1 if a target is missed.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

from dataplanes.p4 import Settings
from dataplanes.p4.bmv2 import Bmv2Switch
from dataplanes.p4.driver import P4RuntimeDriver
from dataplanes.p4.pipeline import Pipeline, available
from dataplanes.p4.sketch import P4Sketch
from dataplanes.p4.veth_ports import Ports
from experiments.benchmarks.bench_dataplane_sketch import TOP, TRACES, frames_of, score
from experiments.benchmarks.rows import write_csv
from experiments.workload.trace import zipf_trace
from mbalancer.config import Server
from mbalancer.progress import end_progress, stderr_progress
from monitor.dataplane import SketchReader

SERVER = ("02:00:00:00:00:02", "10.0.0.2", 11211)  # where frames_of sends its gets
CLIENT_PORT = 1
BLOCK = 10_000
PROGRESS_EVERY = 100_000  # gets between two progress lines


class Rig:
    """bmv2 on two veths (client, server), its tables written by the real driver, the sketch on its connection."""

    def __init__(self):
        tag = f"bsk{os.getpid() % 10000}"
        self.ports = Ports(tag, 2)
        self.bmv2 = Bmv2Switch(tag, self.ports.switch_ends)
        self.driver: P4RuntimeDriver | None = None

    def __enter__(self) -> "Rig":
        try:
            self.bmv2.start()
            self.driver = P4RuntimeDriver(Settings(switches=(self.bmv2.address,), ports=(1, 2)), Pipeline())
            self.driver.attach([Server("s0", SERVER[1], SERVER[0], SERVER[2])], lambda _: None)
            self.sketch = P4Sketch(self.driver.clients[0], self.driver.pipeline, [f"{SERVER[1]}:{SERVER[2]}"])
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *_) -> None:
        if self.driver is not None:
            self.driver.close()
        self.bmv2.stop()
        self.ports.close()

    def send(self, frames: list[bytes]) -> float:
        """Seconds bmv2 took to read `frames`; RuntimeError if it did not read them all."""
        started = time.monotonic()
        if not self.ports.send_paced(CLIENT_PORT, frames, lambda: self.driver.switch_counters()[0]["packets"]):
            raise RuntimeError("bmv2 did not read every frame")
        return time.monotonic() - started


def cost(rig: Rig, frames: list[bytes]) -> tuple[float, float]:
    """bmv2's gets/s with the sketch off and on, in alternating blocks."""
    spent, sent = {False: 0.0, True: 0.0}, {False: 0, True: 0}
    for block, start in enumerate(range(0, len(frames), BLOCK)):
        on = block % 2 == 1
        rig.sketch.set_sketch_control(time.monotonic_ns() + 3600 * 10**9 if on else 0, 0)
        chunk = frames[start:start + BLOCK]
        spent[on] += rig.send(chunk)
        sent[on] += len(chunk)
    rig.sketch.set_sketch_control(0, 0)
    return sent[False] / max(spent[False], 1e-9), sent[True] / max(spent[True], 1e-9)


def accuracy(rig: Rig, trace, frames: list[bytes]) -> dict:
    reader = SketchReader(rig.sketch, top=TOP, interval=3600.0)  # one interval, however long the trace takes
    reader.start()
    samples = rig.sketch.samples
    for start in range(0, len(frames), PROGRESS_EVERY):
        rig.send(frames[start:start + PROGRESS_EVERY])
        stderr_progress(f"  {min(start + PROGRESS_EVERY, len(frames)):,}/{len(frames):,} gets sent, "
                        f"{rig.sketch.samples - samples:,} digests")
    end_progress()
    started = time.monotonic()
    report = reader.read()
    read_ms = (time.monotonic() - started) * 1000
    reader.stop()
    return {**score(report, trace), "read_ms": read_ms,
            "digests_per_get": (rig.sketch.samples - samples) / max(report.total, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gets", type=int, default=1_000_000, help="gets per trace (default 1,000,000)")
    parser.add_argument("--cost-gets", type=int, default=100_000, help="gets per trace timed off/on (default 100,000)")
    parser.add_argument("--out", type=Path, help="also write p4_sketch.csv here")
    args = parser.parse_args()
    if os.geteuid() != 0 or (why := available()) is not None:
        print(f"bench_p4_sketch: cannot run: {'needs root' if os.geteuid() else why}", file=sys.stderr)
        return 2
    if not 1000 <= args.gets <= 10**7 or not 2 * BLOCK <= args.cost_gets <= args.gets:
        print(f"bench_p4_sketch: --gets from 1,000 to 10,000,000, --cost-gets from {2 * BLOCK:,} to --gets",
              file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # bmv2 and the veths are removed on the way out
    rows = []
    with Rig() as rig:
        for keys, alpha in TRACES:
            print(f"bench_p4_sketch: {args.gets:,} gets, Zipf {alpha} over {keys:,} keys ...", file=sys.stderr,
                  flush=True)
            trace = zipf_trace(keys, alpha, args.gets, seed=keys + int(alpha * 10))
            frames = frames_of(trace)
            off, on = cost(rig, frames[:args.cost_gets])
            rows.append({"keys": keys, "alpha": alpha, "gets": args.gets, **accuracy(rig, trace, frames),
                         "gets_per_s_off": off, "gets_per_s_on": on})
    print(f"{'trace':<22}{'recall':>8}{'rate error':>12}{'read ms':>9}{'gets/s off':>11}{'on':>7}{'ratio':>7}"
          f"{'digests/get':>12}")
    for r in rows:
        print(f"{'Zipf ' + str(r['alpha']) + ', ' + format(r['keys'], ',') + ' keys':<22}{r['recall']:>8.2f}"
              f"{100 * r['rate_error']:>11.2f}%{r['read_ms']:>9.0f}{r['gets_per_s_off']:>11.0f}"
              f"{r['gets_per_s_on']:>7.0f}{r['gets_per_s_on'] / r['gets_per_s_off']:>7.2f}"
              f"{r['digests_per_get']:>12.3f}")
    met = all(r["recall"] >= 0.99 and r["rate_error"] <= 0.01 and r["total"] == r["gets"] for r in rows)
    if args.out:
        write_csv(args.out, "p4_sketch.csv", rows, list(rows[0]))
    print(json.dumps({"met": met, "rows": rows}))
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
