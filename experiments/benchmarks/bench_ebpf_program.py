"""Benchmark: what the eBPF program alone costs per packet, on every path, at key lengths 8..250 bytes.

The program runs in the kernel with BPF_PROG_TEST_RUN on real maps (a switch loaded for the benchmark, with its
mirror link, hot keys installed through the control library), timed by the kernel itself. Two figures per path:
  warm    the mean of a run repeated 1000 times on the same packet (caches warm, as in a busy switch), the least
          of 7 such calls (noise only adds): the figure the targets mean. A balanced get cannot be repeated
          (the kernel reruns the program on the packet it rewrote, which is then "already balanced"), so
          hot = warm dirty + (single hot - single dirty): the dirty get takes the same parse and lookup and differs
          only by the rewrite.
  single  the median of single runs, each on a fresh copy of the packet: includes what a lone packet pays after
          the syscall (cold caches; about 500 ns here even for a packet nothing parses).
Paths:
  cold      a get for a key that is not hot (parsed, looked up, forwarded home)
  hot       a get for a clean hot key (parsed, looked up, a replica chosen, destination rewritten, checksums fixed)
  dirty     a get for a hot key with a write pending (forwarded home)
  write     a set of a hot key (forwarded, counted, cloned to the mirror link)
  reply     a server's reply to a client (the reply source rule looked up)
  unparsed  UDP to a port that is not memcached's (forwarded by MAC, nothing parsed)
sketch    the get paths again, warm, with the hot-key sketch counting (bpf/sketch.h; it runs only while a reader such
          as `mbalancer monitor --source dataplane` renews it): what in-data-plane detection adds per get
Targets, warm: cold get <= 150 ns with a 16-byte key, <= 300 ns with a 250-byte key; a rewritten hot get <= 300 ns
with a 40-byte key. Also printed: the instructions the verifier walked to accept the program (its limit is 1M).
Needs root and the built program (make install).
    python experiments/benchmarks/bench_ebpf_program.py [--runs 2000] [--repeat 1000] [--lengths 8,16,40,100,250]
Prints both tables and one JSON line; exit 1 if a target is missed.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time

from scapy.all import IP, UDP, Ether, Raw

from dataplanes.bpf.bpf_syscall import VERIFIER_LIMIT, obj_get, prog_test_run, prog_verified_insns
from dataplanes.bpf.program import DataPlane, available
from dataplanes.bpf.tables import HotEntry, Tables
from dataplanes.pipeline import cumulative_weights

CLIENT = ("02:00:00:00:00:aa", "10.0.0.100")
SERVERS = (("02:00:00:00:00:01", "10.0.0.1"), ("02:00:00:00:00:02", "10.0.0.2"))
PORTS = {CLIENT[0]: 1, SERVERS[0][0]: 2, SERVERS[1][0]: 3}  # where each host is (ifindex 1..3 exist: lo, ...)
PATHS = ("cold", "hot", "dirty", "write", "reply", "unparsed")
SKETCH_PATHS = ("cold", "dirty")  # gets that can be rerun as themselves (a balanced one cannot)
TARGETS = {("cold", 16): 150.0, ("cold", 250): 300.0, ("hot", 40): 300.0}  # ns
TC_ACT_REDIRECT = 7  # the program's verdict for a packet it sends out of a port


def key_of(path: str, length: int) -> bytes:
    """A key of `length` bytes, one per path and length (hot keys must not be shared between paths)."""
    stem = f"{path}{length}-".encode()
    return (stem + b"x" * length)[:length]


def frame(src: tuple, dst: tuple, sport: int, dport: int, payload: bytes) -> bytes:
    return bytes(Ether(src=src[0], dst=dst[0]) / IP(src=src[1], dst=dst[1]) / UDP(sport=sport, dport=dport)
                 / Raw(payload))


def packet(path: str, length: int) -> bytes:
    key = key_of(path, length)
    header = b"\x00\x07\x00\x00\x00\x01\x00\x00"  # request id 7, datagram 0 of 1
    if path == "write":
        return frame(CLIENT, SERVERS[0], 40000, 11211, header + b"set " + key + b" 0 0 5\r\nhello\r\n")
    if path == "reply":
        return frame(SERVERS[0], CLIENT, 11211, 40000, header + b"VALUE " + key + b" 0 5\r\nhello\r\nEND\r\n")
    if path == "unparsed":
        return frame(CLIENT, SERVERS[0], 40000, 9999, header + b"get " + key + b"\r\n")
    return frame(CLIENT, SERVERS[0], 40000, 11211, header + b"get " + key + b"\r\n")


def install(tables: Tables, lengths: list[int], mirror_ifindex: int) -> None:
    """The benchmark's switch state: two servers, a lease, and the hot keys of the hot, dirty and write paths."""
    tables.set_settings(controller_ifindex=mirror_ifindex)
    tables.set_lease(time.monotonic_ns() + 3600 * 10**9)
    tables.add_memcached_ports([11211])
    for index, (mac, ip) in enumerate(SERVERS):
        tables.set_server(index, mac, ip, 11211)
    place_hosts(tables)
    slot = 0
    for length in lengths:
        for path in ("hot", "dirty", "write"):
            tables.set_hot(key_of(path, length), HotEntry(slot, 0, (0, 1), tuple(cumulative_weights((0.0, 1.0)))))
            tables.set_synced(slot, tables.writes(slot), tables.unsure(0))
            if path == "dirty":
                tables.hold(slot)
            slot += 1


def check_paths(prog: int, tables: Tables, lengths: list[int]) -> str | None:
    """None if each packet takes the path it is named after (a hot get is sent to the replica, a dirty one home,
    every packet forwarded); else what went wrong: figures of another path would mean nothing."""
    for n in lengths:
        for path in PATHS:
            place_hosts(tables)
            run = prog_test_run(prog, packet(path, n))
            if run.verdict != TC_ACT_REDIRECT:
                return f"{path} {n} B: verdict {run.verdict}, not forwarded"
            destination = socket.inet_ntoa(run.packet[30:34])
            expected = SERVERS[1][1] if path == "hot" else (CLIENT[1] if path == "reply" else SERVERS[0][1])
            if destination != expected:
                return f"{path} {n} B: sent to {destination}, not {expected}"
    return None


def single(prog: int, tables: Tables, frame_bytes: bytes, runs: int) -> float:
    """Median ns of `runs` single runs, each on a fresh copy of the frame."""
    durations = []
    for _ in range(runs):
        place_hosts(tables)
        durations.append(prog_test_run(prog, frame_bytes).duration_ns)
    return statistics.median(durations)


def warm(prog: int, tables: Tables, frame_bytes: bytes, repeat: int) -> float:
    """Mean ns per run of `repeat` runs on the same packet: the least of 7 such calls (a shared machine's noise
    only ever adds time)."""
    means = []
    for _ in range(7):
        place_hosts(tables)
        means.append(prog_test_run(prog, frame_bytes, repeat=repeat).duration_ns)
    return min(means)


def measure(prog: int, tables: Tables, lengths: list[int], runs: int, repeat: int) -> list[dict]:
    rows = []
    for n in lengths:
        figures = {path: {"single": single(prog, tables, packet(path, n), runs)} for path in PATHS}
        for path in PATHS:
            if path != "hot":  # a rewritten get cannot be rerun as itself
                figures[path]["warm"] = warm(prog, tables, packet(path, n), repeat)
        figures["hot"]["warm"] = figures["dirty"]["warm"] + figures["hot"]["single"] - figures["dirty"]["single"]
        rows += [{"path": path, "key_bytes": n, "ns": f["warm"], "single_ns": f["single"]}
                 for path, f in figures.items()]
    return rows


def place_hosts(tables: Tables) -> None:
    """Every host back behind its port: a test run arrives on ifindex 0, and the program learns its source there
    (a reply to a client learned at 0 would then be dropped as sent back where it came from)."""
    for mac, ifindex in PORTS.items():
        tables.set_forward(mac, ifindex)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2000, help="single runs per figure (default 2000)")
    parser.add_argument("--repeat", type=int, default=1000, help="runs per warm figure (default 1000)")
    parser.add_argument("--lengths", default="8,16,40,100,250", help="key lengths in bytes, comma-separated")
    args = parser.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    if os.geteuid() != 0 or (why := available()) is not None:
        print(f"bench_ebpf_program: cannot run: {'needs root' if os.geteuid() else why}", file=sys.stderr)
        return 2
    if not all(1 <= n <= 250 for n in lengths) or args.runs < 1 or args.repeat < 1:
        print("bench_ebpf_program: key lengths 1..250, --runs and --repeat at least 1", file=sys.stderr)
        return 2
    plane = DataPlane(f"bench{os.getpid()}").load()
    tables, prog = Tables(plane.pin_dir), obj_get(str(plane.program_pin))
    verified = prog_verified_insns(prog)
    try:
        install(tables, lengths, plane.add_mirror_link())  # writes are cloned there, as in a switch
        if problem := check_paths(prog, tables, lengths):
            print(f"bench_ebpf_program: a packet took the wrong path: {problem}", file=sys.stderr)
            return 1
        rows = measure(prog, tables, lengths, args.runs, args.repeat)
        tables.set_sketch_control(time.monotonic_ns() + 3600 * 10**9, 0)  # the sketch counts from now on
        sketch_rows = [{"path": path, "key_bytes": n, "ns": warm(prog, tables, packet(path, n), args.repeat)}
                       for n in lengths for path in SKETCH_PATHS]
        tables.set_sketch_control(0, 0)
    finally:
        os.close(prog)
        tables.close()
        plane.unload()
    for title, field in (("warm: mean of repeated runs", "ns"), ("single: median of fresh single runs", "single_ns")):
        print(f"{'path':<9}" + "".join(f"{f'{n} B key':>11}" for n in lengths) + f"   ns per packet, {title}")
        for path in PATHS:
            print(f"{path:<9}" + "".join(f"{r[field]:>11,.0f}" for r in rows if r["path"] == path))
    figures = {(r["path"], r["key_bytes"]): r["ns"] for r in rows}
    print(f"{'path':<9}" + "".join(f"{f'{n} B key':>11}" for n in lengths) + "   ns per packet, warm, sketch on "
          "(added by the sketch)")
    for path in SKETCH_PATHS:
        print(f"{path:<9}" + "".join(f"{r['ns']:>6,.0f} ({r['ns'] - figures[(path, r['key_bytes'])]:+4,.0f})"
                                     for r in sketch_rows if r["path"] == path))
    print(f"the verifier walked {verified:,} instructions of its {VERIFIER_LIMIT:,} to accept the program")
    checked = {f"{path} {n} B": {"ns": figures[(path, n)], "target": target}
               for (path, n), target in TARGETS.items() if (path, n) in figures}
    met = all(c["ns"] <= c["target"] for c in checked.values())
    print(json.dumps({"met": met, "targets": checked, "rows": rows, "sketch_rows": sketch_rows, "runs": args.runs,
                      "repeat": args.repeat, "verified_insns": verified}))
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
