"""One fault run: warm-up, fault, recovery, under a steady load of gets and versioned sets; then what it came to.

Per 100 ms: gets sent and answered, timeouts, stale reads, misses, sets (experiments/faults/load.py counts them in
the client). Per run: the totals, how long the controller took to take the faulted server out of rotation and to
put it back, and the timeouts and misses after each of those moments, read from the controller's own decisions.
"""
from __future__ import annotations

import csv
import json
import select
import subprocess
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

from experiments.faults.busy import load_average
from experiments.faults.load import LOST_AFTER
from experiments.faults.rig import Rig, RigError
from experiments.faults.scenarios import FAULTED, Fault

BUCKET_FIELDS = ("t", "sent", "answered", "timeouts", "late", "stale", "misses", "writes", "write_errors")
READY_TIMEOUT = 15.0
INJECT_LIMIT = 120.0  # the load's own bound past the phases (the runner stops it after the recovery phase)


@dataclass(frozen=True)
class Phases:
    warmup: float = 3.0
    fault: float = 3.0
    recovery: float = 4.0

    @property
    def total(self) -> float:
        return self.warmup + self.fault + self.recovery


@dataclass
class Result:
    fault: str
    load: float  # fraction of the full rate
    rate: float  # gets per second offered
    gets: int
    answered: int
    timeouts: int
    stale: int
    misses: int
    writes: int
    write_errors: int
    removed_after_s: float | None  # fault -> the controller's server-down (None: it never decided so)
    restored_after_s: float | None  # recovery -> the last refill that gave the server its weight back
    timeouts_after_removal: int  # from the server-down decision to the end of the fault phase
    lost_after_removal: int  # of those, never answered (or after LOST_AFTER), sent early enough to tell
    misses_after_restore: int  # gets answered "not found" after the server got weight back
    false_removals: int  # server-down decisions about a server that was answering (another, or a busy one)
    load_average: float  # the machine's, at the end of the run (1 minute)
    fault_at: float  # when the fault began, seconds into the run (the warmup's length, once the runner woke)
    recovered_at: float  # when the recovery began (later than warmup + fault when injecting took a while)
    events: list[dict]  # the controller's decisions about the faulted server, with t relative to the run


def run_fault(rig: Rig, fault: Fault, load: float, full_rate: float, write_rate: float, phases: Phases,
              out: Path) -> Result:
    buckets_file = out / f"{fault.name}-{int(load * 100)}.jsonl"
    client = rig.net.popen(rig.net.client_hosts[0], [
        rig.python, "-m", "experiments.faults.load", "--keys", json.dumps(rig.keys), "--rate", f"{full_rate * load:g}",
        "--write-rate", f"{write_rate:g}", "--duration", f"{phases.total + INJECT_LIMIT:g}", "--out", str(buckets_file),
        "--protocol", rig.protocol],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    _wait_ready(client)  # every key written: now they can be copied
    rig.wait_balanced()
    started = time.time()
    client.stdin.write("go\n")
    client.stdin.flush()
    # Each phase lasts its length from the moment it really begins: injecting may take seconds on a loaded machine (a
    # killed memcached's exit waited for, wedge datagrams sent until it holds), and so may a restart; a load of fixed
    # length would then end before the controller had refilled the server, and the run would miss the refill.
    time.sleep(phases.warmup)
    fault_at = time.time() - started
    fault.inject(rig)
    time.sleep(phases.fault)
    recovered_at = time.time() - started
    fault.recover(rig)
    time.sleep(max(0.0, started + recovered_at + phases.recovery - time.time()))
    client.terminate()  # the load stops (SIGTERM) and writes its buckets
    client.wait(timeout=30)
    buckets = [json.loads(line) for line in buckets_file.read_text().splitlines()]
    decisions = _decisions(rig, started)
    return _result(fault, load, full_rate * load, buckets, _events(decisions, fault), fault_at, recovered_at,
                   _false_removals(decisions, fault))


def _wait_ready(client: subprocess.Popen) -> None:
    """Until the client has written version 1 of every key and says "ready"."""
    if select.select([client.stdout], [], [], READY_TIMEOUT)[0] and client.stdout.readline().strip() == "ready":
        return
    client.kill()
    raise RigError(f"the load client did not start within {READY_TIMEOUT:g} s (exit {client.wait()})")


def _decisions(rig: Rig, started: float) -> list[dict]:
    """The controller's decisions during the run, t relative to its start."""
    with urllib.request.urlopen(f"http://127.0.0.1:{rig.port}/decisions", timeout=2) as reply:
        decisions = json.load(reply)
    return [{"t": round(d["time"] - started, 3), "action": d["action"], "reason": d["reason"]}
            for d in decisions if d["time"] >= started]


def _events(decisions: list[dict], fault: Fault) -> list[dict]:
    """The decisions about the faulted server (or all, for a control-plane fault)."""
    marker = f"server {FAULTED} "
    return [d for d in decisions
            if fault.server is None or marker in d["reason"] or d["action"] in ("replay", "adopt", "reconcile")]


def _false_removals(decisions: list[dict], fault: Fault) -> int:
    """Servers taken out of rotation that were answering all along: any but the faulted one, and the faulted one
    too if the fault only slows it (a control-plane fault takes no server out)."""
    faulted = f"server {fault.server} " if fault.server is not None and not fault.healthy else None
    return sum(1 for d in decisions if d["action"] == "server-down" and (faulted is None or faulted not in d["reason"]))


def _result(fault: Fault, load: float, rate: float, buckets: list[dict], events: list[dict], fault_at: float,
            recovered_at: float, false_removals: int) -> Result:
    total = {f: sum(b[f] for b in buckets) for f in BUCKET_FIELDS[1:]}
    down = None if fault.healthy else \
        next((e["t"] for e in events if e["action"] == "server-down" and e["t"] >= fault_at), None)
    refills = [e["t"] for e in events if e["action"] == "refill" and e["t"] >= recovered_at]
    restored = max(refills) if refills else None
    return Result(
        fault.name, load, rate, total["sent"], total["answered"], total["timeouts"], total["stale"], total["misses"],
        total["writes"], total["write_errors"],
        None if down is None else round(down - fault_at, 3),
        None if restored is None else round(restored - recovered_at, 3),
        sum(b["timeouts"] for b in buckets if down is not None and down + 0.1 <= b["t"] < recovered_at),
        sum(b["timeouts"] - b["late"] for b in buckets
            if down is not None and down + 0.1 <= b["t"] < recovered_at - LOST_AFTER),  # a hung server answers at its end
        sum(b["misses"] for b in buckets if restored is not None and b["t"] >= restored),
        false_removals, load_average(), round(fault_at, 3), round(recovered_at, 3), events)


def write_buckets_csv(out: Path, result: Result) -> Path:
    source = out / f"{result.fault}-{int(result.load * 100)}.jsonl"
    path = source.with_suffix(".csv")
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, BUCKET_FIELDS)
        writer.writeheader()
        for line in source.read_text().splitlines():
            writer.writerow(json.loads(line))
    return path


SUMMARY_FIELDS = ("fault", "load", "rate", "gets", "answered", "timeouts", "stale", "misses", "writes",
                  "write_errors", "removed_after_s", "restored_after_s", "timeouts_after_removal",
                  "lost_after_removal", "misses_after_restore", "false_removals", "load_average")


def write_summary(out: Path, results: list[Result]) -> tuple[Path, Path]:
    csv_path, json_path = out / "summary.csv", out / "summary.json"
    with csv_path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, SUMMARY_FIELDS)
        writer.writeheader()
        for result in results:
            writer.writerow({f: getattr(result, f) for f in SUMMARY_FIELDS})
    json_path.write_text(json.dumps([asdict(r) for r in results], indent=1))
    return csv_path, json_path


def format_table(results: list[Result]) -> str:
    """The summary as a Markdown table (as in docs/experiments.md)."""
    lines = ["| fault | load | gets | timeouts | stale | misses | removed after | restored after | timeouts after "
             "removal | misses after restore | false removals | load average |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r.fault} | {r.load:.0%} | {r.gets:,} | {r.timeouts:,} | {r.stale} | {r.misses} | "
                     f"{_seconds(r.removed_after_s)} | {_seconds(r.restored_after_s)} | {r.timeouts_after_removal} | "
                     f"{r.misses_after_restore} | {r.false_removals} | {r.load_average:.1f} |")
    return "\n".join(lines)


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"
