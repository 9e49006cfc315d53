"""Benchmark: packets/s through the eBPF switch against the same topology forwarded by a Linux bridge (no
program), in one run (target ratio >= 0.9).

A client namespace replays a pcap with tcpreplay at top speed through the switch to two server namespaces; the
figure is what the servers' interfaces received per second. Rows: hot-key gets (each one parsed, looked up,
rewritten to a replica chosen by weight, checksums fixed), cold gets (parsed and looked up, forwarded), and the
bridge carrying the same cold gets. Needs root, tcpreplay, clang-built program (make install).
    python experiments/benchmarks/bench_ebpf_switch.py [--packets 200000] [--repeats 3]
Prints a table and one JSON line; exit 1 if the ratio is under the target.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from scapy.all import IP, UDP, Ether, Raw

from controller.driver import ReplicaWeight
from experiments.workload.trace import write_pcap
from mbalancer.config import Server
from topologies.netns import NamespaceNetwork


def frames(net: NamespaceNetwork, key: bytes, count: int) -> list[bytes]:
    client, home = net.client_hosts[0], net.server_hosts[0]
    base = (Ether(src=client.mac, dst=home.mac) / IP(src=client.ip, dst=home.ip) / UDP(sport=40000, dport=11211))
    return [bytes(base / Raw(i.to_bytes(2, "big") + b"\x00\x00\x00\x01\x00\x00get " + key + b"\r\n"))
            for i in range(min(count, 65536))]


def received(net: NamespaceNetwork) -> int:
    return sum(int(net.run(h, ["cat", "/sys/class/net/eth0/statistics/rx_packets"]).stdout) for h in net.server_hosts)


def replay(net: NamespaceNetwork, pcap: Path, loops: int) -> float:
    """Packets per second that reached the servers."""
    before = received(net)
    started = time.perf_counter()
    result = net.run(net.client_hosts[0], ["tcpreplay", "-q", "-i", "eth0", "--topspeed", "--loop", str(loops),
                                           str(pcap)], timeout=600)
    if result.returncode:
        raise RuntimeError(f"tcpreplay: {result.stderr.strip()}")
    elapsed = time.perf_counter() - started
    time.sleep(0.2)
    return (received(net) - before) / elapsed


def run_dataplane(dataplane: str, packets: int, repeats: int, tmp: Path) -> dict[str, float]:
    rates: dict[str, float] = {}
    with NamespaceNetwork(servers=2, clients=1, tag=f"mbb{dataplane[:2]}", dataplane=dataplane) as net:
        kinds = ["cold"] if dataplane == "bridge" else ["hot", "cold"]
        if dataplane == "ebpf":
            driver = net.driver()
            driver.attach([Server(h.name, h.ip, h.mac) for h in net.server_hosts], lambda frame: None)
            driver.install_hot_key(b"hot", 0, [ReplicaWeight(0, 0.5), ReplicaWeight(1, 0.5)])
            driver.renew_lease(3600)  # no core here to renew it
            driver.clear_dirty(b"hot", driver.write_stamp(b"hot"))
        for kind in kinds:
            pcap = tmp / f"{kind}.pcap"
            batch = frames(net, b"hot" if kind == "hot" else b"cold", 10_000)
            write_pcap(pcap, batch)
            loops = max(packets // len(batch), 1)
            replay(net, pcap, 1)  # warm-up: ARP-free (static MACs), caches, learning
            rates[kind] = statistics.median(replay(net, pcap, loops) for _ in range(repeats))
            print(f"  {dataplane:>6} {kind:>4}: {rates[kind]:,.0f} packets/s", file=sys.stderr, flush=True)
        if dataplane == "ebpf":
            counters = driver.switch_counters()[0]
            rates["balanced"] = counters["balanced"]
            driver.close()
    return rates


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--packets", type=int, default=200_000, help="packets per measurement")
    parser.add_argument("--repeats", type=int, default=3, help="measurements per row (median)")
    parser.add_argument("--target", type=float, default=0.9, help="eBPF / bridge rate needed")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        bridge = run_dataplane("bridge", args.packets, args.repeats, Path(tmp))
        ebpf = run_dataplane("ebpf", args.packets, args.repeats, Path(tmp))
    rows = {"bridge_cold_pps": bridge["cold"], "ebpf_cold_pps": ebpf["cold"], "ebpf_hot_pps": ebpf["hot"],
            "ratio_cold": ebpf["cold"] / bridge["cold"], "ratio_hot": ebpf["hot"] / bridge["cold"],
            "hot_gets_balanced": int(ebpf["balanced"])}
    print(f"{'path':<28} {'packets/s':>12} {'vs bridge':>9}")
    print(f"{'Linux bridge, cold gets':<28} {bridge['cold']:>12,.0f} {1.0:>9.2f}")
    print(f"{'eBPF switch, cold gets':<28} {ebpf['cold']:>12,.0f} {rows['ratio_cold']:>9.2f}")
    print(f"{'eBPF switch, hot gets':<28} {ebpf['hot']:>12,.0f} {rows['ratio_hot']:>9.2f}")
    met = min(rows["ratio_cold"], rows["ratio_hot"]) >= args.target
    print(json.dumps({**rows, "target": args.target, "met": met}))
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
