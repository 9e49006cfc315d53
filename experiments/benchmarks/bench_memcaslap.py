"""Benchmark: what MBalancer costs a real benchmark client, libmemcached's memcaslap (UDP, or --protocol tcp through
the switch's TCP path; 10% sets, 10% of gets verified), through the eBPF switch: side by side in one run, each round in this order,
  switch alone            the data plane with no controller (nothing hot: every request parsed and forwarded)
  controller, none hot    the controller running, its report naming no hot key
  controller, 10 hot      ten of memcaslap's keys hot: an earlier run's (memcaslap writes every key once, keys new
                          to each run, and reads each for a short while: none is ever really hot)
memcaslap writes keys that begin with eight 0x10 bytes, which memcached reads as key bytes: the data plane must
read them so too (else every write is copied to the controller as unreadable). Target: the controller costs the
client < 5% of its throughput when nothing is hot. Also printed: the controller's CPU (cores) and the reads
memcaslap found wrong (verify_failed) or missing.

The rig is the fault runner's (experiments/faults/rig.py): three memcached servers and a client in namespaces behind
the eBPF switch, the controller as its own process. Needs root, memcaslap (libmemcached-tools) and `make install`.
    python experiments/benchmarks/bench_memcaslap.py [--seconds 4] [--rounds 2] [--out DIR]
Prints a table and one JSON line (and with --out, memcaslap.csv); exit 1 if the target is missed.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import shutil
import socket
import statistics
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path

from experiments.benchmarks.rows import write_csv
from experiments.endtoend.measure import process_jiffies
from experiments.faults.rig import MEMCACHED_PORT, Rig, RigError
from mbalancer.memcache.keys import key_to_text
from mbalancer.processes import stop_process

PHASES = ("switch alone", "controller, none hot", "controller, 10 hot")
HOT = 10
TARGET = 0.95  # the client's throughput with the controller and nothing hot, against the switch alone
FIELDS = ("TPS", "cmd_get", "cmd_set", "get_misses", "verify_failed", "packet_drop", "udp_timeout")
REQUIRED = FIELDS[:5]  # the last two only over UDP
RUN_GRACE = 30.0  # seconds memcaslap may take beyond --seconds before it is stopped
RUN_ATTEMPTS = 3  # memcaslap 1.0's UDP client aborts now and then on a busy machine (an assertion on reply order)


PROTOCOLS = {"udp": ["-U"], "tcp": [], "binary": ["-B"]}  # memcaslap's options for each
CONNECTIONS = 24  # memcaslap's concurrency: a request out on each when its time is up is counted, never answered


def memcaslap(rig: Rig, seconds: float, protocol: str = "udp") -> dict[str, int]:
    """One memcaslap run from the client namespace against the three servers; its final figures. 24 clients,
    each cycling 2,000 keys of 200-byte values: every key fits in memory (no eviction takes a hot key). The text
    protocol over UDP or TCP (the switch's TCP path balances its gets when the rig runs it), or the binary protocol
    over TCP (which MBalancer cannot read: every request is unsure)."""
    servers = ",".join(f"{h.ip}:{MEMCACHED_PORT}" for h in rig.net.server_hosts)
    command = ["memcaslap", "-s", servers, *PROTOCOLS[protocol], "-t", f"{seconds:g}s", "-T", "3", "-c",
               str(CONNECTIONS), "-w", "2k", "-X", "200", "-v", "0.1"]
    for attempt in range(RUN_ATTEMPTS):
        run = rig.net.run(rig.net.client_hosts[0], command, timeout=seconds + RUN_GRACE)
        found = {name: re.search(rf"{name}: (\d+)", run.stdout) for name in FIELDS}
        if run.returncode == 0 and all(found[name] for name in REQUIRED):
            return {name: int(match.group(1)) if match else 0 for name, match in found.items()}
        why = (run.stderr or run.stdout).strip()[-300:]
        if run.returncode >= 0:  # it ran and said why: trying again would say the same
            break
        print(f"memcaslap aborted (signal {-run.returncode}), run {attempt + 1} of {RUN_ATTEMPTS}: {why}",
              file=sys.stderr)
    raise RuntimeError(f"memcaslap failed (exit {run.returncode}): {why}")


def hot_keys(rig: Rig, count: int) -> dict[str, tuple[str, int]]:
    """`count` keys the servers hold (the client's own), taken from each server in turn, with the server that holds
    each (memcached's own key dump)."""
    held = [[(key_to_text(key), (host.ip, MEMCACHED_PORT)) for key in dump_keys(host.ip, count)]
            for host in rig.net.server_hosts]
    in_turn = [entry for row in itertools.zip_longest(*held) for entry in row if entry is not None]
    if len(in_turn) < count:
        raise RuntimeError(f"the servers hold {len(in_turn)} keys, not the {count} to make hot")
    return dict(in_turn[:count])


def dump_keys(ip: str, most: int, timeout: float = 5.0) -> list[bytes]:
    """Up to `most` keys a memcached server holds (lru_crawler metadump: a line per key, URL-encoded, then END)."""
    keys: list[bytes] = []
    rest, ended = b"", False
    with socket.create_connection((ip, MEMCACHED_PORT), timeout=timeout) as conn:
        conn.sendall(b"lru_crawler metadump all\r\n")
        deadline = time.monotonic() + timeout
        while not ended and len(keys) < most and time.monotonic() < deadline:
            chunk = conn.recv(65536)
            if not chunk:
                break
            *lines, rest = (rest + chunk).split(b"\n")
            ended = b"END\r" in lines
            keys += [urllib.parse.unquote_to_bytes(line.split(b" ")[0][4:]) for line in lines
                     if line.startswith(b"key=")]
    return keys[:most]


def controller_cpu(rig: Rig) -> float:
    """CPU seconds the controller process has used (user + system)."""
    return 0.0 if rig.controller is None else process_jiffies(rig.controller.pid) / os.sysconf("SC_CLK_TCK")


def enter(rig: Rig, phase: str, keys: dict[str, tuple[str, int]]) -> None:
    """Set the rig up for `phase`."""
    if phase == "switch alone":
        if rig.controller is not None:
            stop_process(rig.controller)
            rig.controller = None
        rig.keys = {}
        return
    if rig.controller is None:
        rig.keys = {}
        rig.start_controller()
    if phase == "controller, 10 hot":
        rig.keys = keys
        rig.wait_balanced()
    else:
        time.sleep(1.0)  # a report or two: the controller settles with nothing hot


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=4.0, help="length of each memcaslap run")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of the three phases")
    parser.add_argument("--out", type=Path, help="directory for memcaslap.csv (and the rig's logs)")
    parser.add_argument("--protocol", choices=PROTOCOLS, default="udp",
                        help="memcaslap's: udp (default), tcp (the text protocol, through the switch's TCP path), or "
                             "binary (over TCP, unreadable to MBalancer: what that costs)")
    args = parser.parse_args(argv)
    if shutil.which("memcaslap") is None:
        print("memcaslap not found: install libmemcached-tools (make install does)", file=sys.stderr)
        return 2
    out = args.out or Path(tempfile.mkdtemp(prefix="mb-memcaslap-"))
    try:
        rows = measure(args, out)
    except (RigError, RuntimeError) as err:
        print(f"bench_memcaslap: {err}", file=sys.stderr)
        return 2
    return report(rows, args.out)


def measure(args: argparse.Namespace, out: Path) -> list[dict]:
    """The three phases, --rounds times, on one rig."""
    rows = []
    rig = Rig(out, HOT, avoid=-1, tag="mbm", protocol="tcp" if args.protocol == "tcp" else "udp").start(
        controller=False)
    try:
        print("populating with memcaslap ...", flush=True)
        memcaslap(rig, 2.0, args.protocol)
        keys = hot_keys(rig, HOT)
        print(f"hot keys (memcaslap's own): {[k.encode('utf-8', 'surrogateescape')[:12] for k in keys]} ...")
        for round_number in range(args.rounds):
            for phase in PHASES:
                enter(rig, phase, keys)
                cpu = controller_cpu(rig)
                started = time.monotonic()
                figures = memcaslap(rig, args.seconds, args.protocol)
                cores = (controller_cpu(rig) - cpu) / (time.monotonic() - started)
                rows.append({"round": round_number, "phase": phase, **figures, "controller_cores": round(cores, 3)})
                print(f"round {round_number} {phase:22} {figures['TPS']:>8} ops/s  controller {cores:.2f} core  "
                      f"misses {figures['get_misses']}  verify_failed {figures['verify_failed']}", flush=True)
    finally:
        rig.close()
    return rows


def report(rows: list[dict], out: Path | None) -> int:
    median = {phase: statistics.median(r["TPS"] for r in rows if r["phase"] == phase) for phase in PHASES}
    alone = median["switch alone"]
    print(f"\n{'phase':24}{'ops/s (median)':>16}{'vs switch alone':>17}{'controller cores':>18}")
    for phase in PHASES:
        cores = statistics.median(r["controller_cores"] for r in rows if r["phase"] == phase)
        print(f"{phase:24}{median[phase]:>16,.0f}{median[phase] / alone:>17.3f}{cores:>18.2f}")
    ratio = median["controller, none hot"] / alone
    summary = {"bench": "memcaslap", "ops_per_s": median, "none_hot_vs_alone": round(ratio, 3),
               "hot_vs_alone": round(median["controller, 10 hot"] / alone, 3),
               "verify_failed": sum(r["verify_failed"] for r in rows), "target": TARGET, "met": ratio >= TARGET,
               "rows": rows}
    print(json.dumps(summary))
    if out:
        write_csv(out, "memcaslap.csv", rows)
    if ratio < TARGET:
        print(f"MISSED: with the controller and nothing hot the client keeps {ratio:.3f} of its throughput "
              f"(target {TARGET})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
