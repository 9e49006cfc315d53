"""Benchmark: the load generator's top get rate against one memcached on loopback, over UDP and TCP, and the CPU
the generator and memcached used (target: at least 50,000 gets/s, so the generator is never the bottleneck).

Side by side in one run: the event-loop generator at several client counts, and for reference one blocking
client (our UdpClient, and pymemcache over TCP) sending requests one after another.
Prints a table and one JSON line; exit code 1 when the target is missed.
    python experiments/benchmarks/bench_load.py [--seconds S] [--server-threads T] [--target GETS_PER_S]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Callable

from experiments.workload.engine import run_load
from experiments.workload.populate import populate
from experiments.workload.records import summarise
from experiments.workload.spec import Workload
from mbalancer.memcache.addresses import ServerAddress
from mbalancer.memcache.client import UdpClient, tcp_client
from mbalancer.memcache.server import MemcachedServer

CLIENT_COUNTS = (1, 16, 64, 256)
TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu_seconds(pid: int) -> float:
    """user + system CPU seconds of a process so far (/proc/PID/stat fields 14 and 15)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def measure(run: Callable[[], tuple[int, int]], server_pid: int) -> dict:
    """Run once: answered gets/s, timeouts, and the cores used by this process (the generator) and memcached."""
    wall0, cpu0, server0 = time.perf_counter(), time.process_time(), process_cpu_seconds(server_pid)
    gets, timeouts = run()
    wall = time.perf_counter() - wall0
    return {"gets_per_s": gets / wall, "timeouts": timeouts, "generator_cores": (time.process_time() - cpu0) / wall,
            "memcached_cores": (process_cpu_seconds(server_pid) - server0) / wall}


def blocking_loop(get: Callable[[bytes], object], keys: list[bytes], seconds: float) -> tuple[int, int]:
    done, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        get(keys[done % len(keys)])
        done += 1
    return done, 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="per measurement (default 3)")
    parser.add_argument("--server-threads", type=int, default=1, help="memcached worker threads (default 1)")
    parser.add_argument("--target", type=float, default=50_000, help="gets/s the generator must reach over UDP")
    args = parser.parse_args()
    print(f"cores: {os.cpu_count()}; memcached with {args.server_threads} thread(s) on loopback; "
          f"{args.seconds:g} s per row; 1000 keys Zipf(1), 100-byte values, all hits")
    print(f"{'driver':<36} {'gets/s':>10} {'timeouts':>9} {'generator cores':>16} {'memcached cores':>16}")
    rows = []
    with MemcachedServer(threads=args.server_threads) as memcached:
        server = ServerAddress(*memcached.address)
        base = Workload(servers=(server,), keys=1000, duration=args.seconds)
        populate(base)
        pid = memcached.process.pid

        def report(name: str, protocol: str, clients: int, result: dict) -> None:
            rows.append({"driver": name, "protocol": protocol, "clients": clients, **result})
            print(f"{name:<36} {result['gets_per_s']:>10,.0f} {result['timeouts']:>9} "
                  f"{result['generator_cores']:>16.2f} "
                  f"{result['memcached_cores']:>16.2f}")

        with UdpClient() as udp:
            report("blocking UdpClient (UDP), 1 client", "udp", 1,
                   measure(lambda: blocking_loop(lambda k: udp.get(k, server), base.key_names, args.seconds), pid))
        tcp = tcp_client(server)
        report("blocking pymemcache (TCP), 1 client", "tcp", 1,
               measure(lambda: blocking_loop(tcp.get, base.key_names, args.seconds), pid))
        tcp.close()
        for protocol in ("udp", "tcp"):
            for clients in CLIENT_COUNTS:
                workload = Workload(servers=(server,), keys=1000, duration=args.seconds, clients=clients,
                                    protocol=protocol)

                def drive() -> tuple[int, int]:
                    summary = summarise(run_load(workload), workload)
                    return summary["hits"], summary["timeouts"]
                report(f"mbalancer load {protocol.upper()}, {clients} clients", protocol, clients, measure(drive, pid))
    top = {p: max(r["gets_per_s"] for r in rows if r["protocol"] == p and r["driver"].startswith("mbalancer"))
           for p in ("udp", "tcp")}
    met = top["udp"] >= args.target
    print(f"top rate: UDP {top['udp']:,.0f} gets/s, TCP {top['tcp']:,.0f} gets/s; "
          f"target UDP >= {args.target:,.0f}: {'met' if met else 'MISSED'}")
    print(json.dumps({"benchmark": "load_generator", "seconds": args.seconds, "server_threads": args.server_threads,
                      "rows": rows, "top_gets_per_s": top, "target": args.target, "met": met}))
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
