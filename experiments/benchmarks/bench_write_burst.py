"""Benchmark: mirrored writes in bursts. Targets (issue "No stale read, ever"): sync latency p99 under 10 ms at
10,000 writes/s to hot keys, and the controller current again (every hot key clean) within 1 s of any burst.

Real memcached servers on loopback, the real core, the recording driver as the data plane. A writer sends quiet
meta sets (no reply) to each hot key's home at the given rate, round robin over the keys, and hands each one to the
driver as the data plane would (counted in the key's writes, copied to the core). Mirrored writes are coalesced per
key, so the core syncs each key once per batch, whatever the rate.
    python experiments/benchmarks/bench_write_burst.py [--rate 10000] [--seconds 3] [--hot 10] [--value-bytes 100]
Prints one JSON line; exit 1 if a target is missed.
"""
from __future__ import annotations

import argparse
import json
import socket
import sys
import time

from controller.core import ControllerCore
from controller.drivers.recording import RecordingDriver
from experiments.workload.trace import udp_frame
from mbalancer.config import parse_config
from mbalancer.memcache.meta import MetaClient, StoredItem
from mbalancer.memcache.requests import build_set
from mbalancer.memcache.server import MemcachedServer
from mbalancer.progress import end_progress, stderr_progress

SERVERS = 3
P99_TARGET_MS = 10.0
CURRENT_TARGET_S = 1.0


def run(rate: float, seconds: float, hot: int, value_bytes: int) -> dict:
    memcached = [MemcachedServer(memory_mb=64).start() for _ in range(SERVERS)]
    driver = RecordingDriver()
    config = parse_config({"servers": [{"name": f"s{i}", "ip": "127.0.0.1", "mac": f"02:00:00:00:02:{i:02x}",
                                        "port": m.port} for i, m in enumerate(memcached)],
                           "balancing": {"hot": hot, "hysteresis": 1}})
    core = ControllerCore(config, driver, probe_health=False).start()
    writers = [socket.create_connection(("127.0.0.1", m.port)) for m in memcached]
    try:
        keys = [b"burst:%d" % i for i in range(hot)]
        homes = {k: core.key_hash.server_of(k) for k in keys}
        for key in keys:
            MetaClient(config.servers[homes[key]].address).set(key, StoredItem(b"0" * value_bytes, 0, -1, 0))
        core.submit_report({"time": time.time(), "interval": 1.0, "rate": 1e5,
                            "top": [{"key": k.decode(), "rate": 1000.0 - i} for i, k in enumerate(keys)]})
        core.wait_idle(30)
        if len(core.executor.hot) != hot:
            raise RuntimeError(f"only {len(core.executor.hot)} of {hot} keys went hot")
        core.executor.sync_ms.clear()
        written = _write(driver, writers, config, keys, homes, rate, seconds, value_bytes)
        burst_end = time.monotonic()
        deadline = burst_end + 10
        while time.monotonic() < deadline and (core._events.unfinished_tasks or any(driver.dirty(k) for k in keys)):
            time.sleep(0.0005)
        current_after = time.monotonic() - burst_end
        latest = {k: MetaClient(config.servers[homes[k]].address).get(k).value for k in keys}
        fresh = all(MetaClient(s.address).get(k).value == latest[k] for k in keys for s in config.servers)
        syncs = sorted(core.executor.sync_ms)
        p99 = syncs[min(len(syncs) - 1, int(0.99 * len(syncs)))] if syncs else None
        return {"rate": rate, "seconds": seconds, "hot": hot, "value_bytes": value_bytes, "writes": written,
                "achieved_rate": round(written / seconds), "syncs": len(syncs),
                "writes_per_sync": round(written / max(len(syncs), 1), 1),
                "sync_ms_p50": syncs[len(syncs) // 2] if syncs else None, "sync_ms_p99": p99,
                "current_after_s": round(current_after, 4), "replicas_fresh": fresh}
    finally:
        for writer in writers:
            writer.close()
        core.stop()
        for server in memcached:
            server.stop()


def _write(driver: RecordingDriver, writers: list[socket.socket], config, keys: list[bytes], homes: dict,
           rate: float, seconds: float, value_bytes: int) -> int:
    """Quiet sets at `rate`, each also handed to the driver as the data plane's mirror; returns how many."""
    started = time.monotonic()
    count, next_at = 0, started
    while (now := time.monotonic()) < started + seconds:
        if now < next_at:
            time.sleep(min(next_at - now, 0.001))
            continue
        key = keys[count % len(keys)]
        home = config.servers[homes[key]]
        value = (b"%d|" % count).ljust(value_bytes, b"v")
        writers[homes[key]].sendall(b"ms %s %d T0 q\r\n%s\r\n" % (key, len(value), value))
        driver.mirror(udp_frame(build_set(key, value), dst=home.ip, dport=home.port), key)
        count += 1
        next_at += 1 / rate
        if count % 5000 == 0:
            stderr_progress(f"{count} writes")
    end_progress()
    return count


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=10_000.0, help="writes per second to the hot keys")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--hot", type=int, default=10)
    parser.add_argument("--value-bytes", type=int, default=100)
    args = parser.parse_args(argv)
    result = run(args.rate, args.seconds, args.hot, args.value_bytes)
    met = (result["sync_ms_p99"] is not None and result["sync_ms_p99"] <= P99_TARGET_MS
           and result["current_after_s"] <= CURRENT_TARGET_S and result["replicas_fresh"])
    print(json.dumps({**result, "p99_target_ms": P99_TARGET_MS, "current_target_s": CURRENT_TARGET_S,
                      "met": met}))
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
