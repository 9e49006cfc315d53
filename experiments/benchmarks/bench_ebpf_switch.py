"""Benchmark: packets/s, and packets/s per busy core, through the eBPF switch against a Linux bridge on the same
veths, side by side in one run (target: the eBPF switch at >= 0.9 of the bridge, each at its own maximum); with
--openflow, Open vSwitch's userspace datapath (the OpenFlow data plane: key classifier on the links, the Ryu app's
rules) on the same traffic too, for what it costs against the eBPF switch (no target).

Sender: netsniff-ng's trafgen in the client namespace sends a fixed set of frames round robin from a TX ring, on
every core (--cpus); `--sender tcpreplay` is the old sender for comparison (a write() per packet). First row: the
sender alone, its frames dropped as they leave (the switch's port to the client set down). Far end: each server's
interface counts what reaches it (rx_packets) and a tc ingress program drops it (bpf/sink.bpf.c), so the servers'
own stack does not share the CPUs with the switch. A figure is measured over --seconds once the servers receive
(after a warm-up); CPU is the busy time of every core in /proc/stat (steal excluded) over the same window (sender,
switch and sink: all on this machine), so Mpps per core = packets received / core-seconds busy.
Traffic: cold (gets of a key that is not hot: parsed, looked up, forwarded), hot (gets of one hot key spread 50/50
over two servers: each rewritten), mixed (Zipf 0.99 over 10,000 keys, the 10 hottest hot). Needs root, trafgen
(netsniff-ng) or tcpreplay, and the built program (make install).
    python experiments/benchmarks/bench_ebpf_switch.py [--seconds 2] [--repeats 3] [--sender trafgen] [--out DIR]
Prints a table and one JSON line (and with --out, switch.csv); exit 1 if a ratio is under the target.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from scapy.all import IP, UDP, Ether, Raw

from dataplanes.driver import ReplicaWeight
from dataplanes.bpf.program import compile_bpf
from dataplanes.bpf.tables import Tables
from experiments.benchmarks.rows import write_csv
from experiments.endtoend.measure import cpu_times
from experiments.workload.trace import write_pcap, write_trafgen, zipf_trace
from mbalancer.config import Server
from mbalancer.processes import stop_process
from monitor.dataplane import SketchReader
from topologies.netns import Host, NamespaceNetwork

SINK_SOURCE = Path(__file__).resolve().parent / "bpf" / "sink.bpf.c"
TRAFFIC = ("cold", "hot", "mixed")  # then mixed again with the hot-key sketch on
MIXED_KEYS, MIXED_HOT, MIXED_FRAMES = 10_000, 10, 5_000
WARMUP = 0.5  # s of traffic before a window opens
START_TIMEOUT = 60.0  # s for a sender to reach the servers (trafgen parses its config first)


def get_frame(client: Host, home: Host, key: bytes, request_id: int) -> bytes:
    payload = (request_id % 65536).to_bytes(2, "big") + b"\x00\x00\x00\x01\x00\x00get " + key + b"\r\n"
    return bytes(Ether(src=client.mac, dst=home.mac) / IP(src=client.ip, dst=home.ip) / UDP(sport=40000, dport=11211)
                 / Raw(payload))


def mixed_key(index: int) -> bytes:
    return b"key:%05d" % index


def traffic_frames(net: NamespaceNetwork, kind: str) -> list[bytes]:
    """The frames the sender repeats: distinct request ids, so the replica choice spreads."""
    client, servers = net.client_hosts[0], net.server_hosts
    if kind == "mixed":
        keys = zipf_trace(MIXED_KEYS, 0.99, MIXED_FRAMES, seed=7)
        return [get_frame(client, servers[i % 2], mixed_key(i), n) for n, i in enumerate(keys.tolist())]
    return [get_frame(client, servers[0], kind.encode(), n) for n in range(1000)]


def install_hot_keys(net: NamespaceNetwork):
    """The eBPF switch's hot keys: `hot`, and the mixed traffic's hottest (homes alternate), each spread 50/50."""
    driver = net.driver()
    driver.attach([Server(h.name, h.ip, h.mac) for h in net.server_hosts], lambda frame: None)
    hot = [(b"hot", 0)] + [(mixed_key(i), i % 2) for i in range(MIXED_HOT)]
    for key, home in hot:
        driver.install_hot_key(key, home, [ReplicaWeight(0, 0.5), ReplicaWeight(1, 0.5)])
    driver.renew_lease(3600)  # no core here to renew it
    for key, _ in hot:
        driver.clear_dirty(key, driver.write_stamp(key))
    return driver


def attach_sinks(net: NamespaceNetwork, sink: Path) -> None:
    for host in net.server_hosts:
        net.run(host, ["tc", "qdisc", "add", "dev", "eth0", "clsact"])  # there already with the OpenFlow classifier
        result = net.run(host, ["tc", "filter", "add", "dev", "eth0", "ingress", "bpf", "direct-action", "obj",
                                str(sink), "sec", "tc"])
        if result.returncode:
            # the machine, not the benchmark: one line, as a tool says it (tc says it over several)
            raise SystemExit(f"bench_ebpf_switch: the sink did not load on {host.name}: "
                             f"{' '.join(result.stderr.split())}")


def teach_server_macs(net: NamespaceNetwork) -> None:
    """Each server sends a frame through the switch (an ARP request, as ping begins), so the switch knows which port
    each server is behind. Otherwise a get to a server it never heard from is flooded to both, and the split counted
    at the servers depends on which one a stray frame taught it (seen: 0.666 to s2, s1 unknown)."""
    client = net.client_hosts[0]
    for host in net.server_hosts:
        net.run(host, ["ping", "-c", "1", "-W", "1", client.ip])  # its reply goes to the sink: the ARP is what counts


def counter(net: NamespaceNetwork, host: Host, name: str) -> int:
    return int(net.run(host, ["cat", f"/sys/class/net/eth0/statistics/{name}"]).stdout)


class Sending:
    """A sender running in the client namespace until the block ends (its whole process group: trafgen forks one
    process per CPU)."""

    def __init__(self, net: NamespaceNetwork, command: list[str]):
        self.net, self.command = net, command

    def __enter__(self) -> "Sending":
        self.process = subprocess.Popen(["ip", "netns", "exec", self.net.client_hosts[0].netns, *self.command],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                        start_new_session=True)
        return self

    def alive(self) -> bool:
        return self.process.poll() is None

    def why_stopped(self) -> str:
        return f"{self.command[0]} exited ({self.process.returncode}): {self.process.stderr.read().strip()[-500:]}"

    def __exit__(self, *exc) -> None:
        stop_process(self.process, group=True)


def sender_command(sender: str, config: Path, cpus: int, qdisc: bool = False) -> list[str]:
    """qdisc: through the kernel's qdisc layer (and so tc egress, where the OpenFlow data plane's key classifier
    sits on the client's link, as every socket's traffic goes); trafgen bypasses it by default."""
    if sender == "trafgen":
        return ["trafgen", "--dev", "eth0", "--conf", str(config), "--cpus", str(cpus), "--no-sock-mem",
                "--notouch-irq", "--no-cpu-stats"] + (["--qdisc-path"] if qdisc else [])
    return ["tcpreplay", "-q", "-i", "eth0", "--topspeed", "--loop", "0", str(config)]


def write_frames(sender: str, frames: list[bytes], tmp: Path, kind: str) -> Path:
    path = tmp / f"{kind}.{'cfg' if sender == 'trafgen' else 'pcap'}"
    (write_trafgen if sender == "trafgen" else write_pcap)(path, frames)
    return path


def window(net: NamespaceNetwork, command: list[str], seconds: float, count) -> dict:
    """Run the sender; once `count()` (a list of per-server counts) moves, warm up, then measure a window."""
    with Sending(net, command) as sending:
        deadline, first = time.monotonic() + START_TIMEOUT, sum(count())
        while sum(count()) == first:
            if not sending.alive():
                raise RuntimeError(sending.why_stopped())
            if time.monotonic() > deadline:
                raise RuntimeError(f"{command[0]}: nothing arrived within {START_TIMEOUT:g} s")
            time.sleep(0.05)
        time.sleep(WARMUP)
        before, cpu_before, started = count(), cpu_times(), time.perf_counter()
        time.sleep(seconds)
        after, cpu_after, elapsed = count(), cpu_times(), time.perf_counter() - started
        if not sending.alive():
            raise RuntimeError(sending.why_stopped())
    received = [b - a for a, b in zip(before, after)]
    cores = sum((b1 - b0) / max(t1 - t0, 1) for (b0, _, t0), (b1, _, t1) in zip(cpu_before, cpu_after))
    pps = sum(received) / elapsed
    return {"pps": pps, "cores": cores, "pps_per_core": pps / max(cores, 1e-9),
            "share_s2": received[1] / max(sum(received), 1) if len(received) > 1 else 0.0}


def sender_alone(net: NamespaceNetwork, args: argparse.Namespace, tmp: Path) -> dict:
    """The sender's own rate: the switch's port to the client down, so every frame is dropped as it leaves."""
    client = net.client_hosts[0]
    config = write_frames(args.sender, traffic_frames(net, "cold"), tmp, "alone")
    subprocess.run(["ip", "link", "set", client.port, "down"], check=True)
    try:
        return window(net, sender_command(args.sender, config, args.cpus), args.seconds,
                      lambda: [counter(net, client, "tx_dropped") + counter(net, client, "tx_packets")])
    finally:
        subprocess.run(["ip", "link", "set", client.port, "up"], check=True)


def openflow_hot_keys(net: NamespaceNetwork, tmp: Path):
    """The Ryu app (ryu-manager) on the network's Open vSwitch, the same hot keys made hot the way the controller
    makes them (values at their homes, a report, copies), before the sinks go on. Health probes every 60 s and a
    150 s lease: the servers cannot answer probes once the sinks drop everything."""
    from dataplanes import registry
    from experiments.endtoend.stack import RyuController
    from mbalancer.config import Balancing, Config, Controller, DataPlane
    from mbalancer.memcache.hashing import make_hash
    from mbalancer.memcache.meta import MetaClient, MetaError, StoredItem
    from mbalancer.memcache.server import free_port
    servers = tuple(Server(h.name, h.ip, h.mac) for h in net.server_hosts)
    settings = registry.get("openflow").parse_settings(net.switch.driver_settings())
    config = Config(servers, Balancing(hot=1 + MIXED_HOT, hysteresis=1, mode="equal"),
                    controller=Controller(listen=f"127.0.0.1:{free_port()}", health_interval=60, lease=150,
                                          poll_interval=0),
                    dataplane=DataPlane("openflow", (("openflow", settings),)))
    for host in net.server_hosts:
        net.popen(host, ["memcached", "-l", host.ip, "-p", "11211", "-U", "11211", "-u", "root", "-t", "1"])
    key_hash = make_hash("ketama", [s.address for s in servers])
    controller = RyuController(config, key_hash, tmp)
    controller.start()
    keys = [b"hot"] + [mixed_key(i) for i in range(MIXED_HOT)]
    deadline = time.monotonic() + START_TIMEOUT
    for key in keys:
        while True:
            try:
                MetaClient(servers[key_hash.server_of(key)].address).set(key, StoredItem(b"v" * 10, 0, -1, 0))
                break
            except (MetaError, OSError):
                if time.monotonic() > deadline:
                    raise RuntimeError("memcached did not answer through the OpenFlow switch")
                time.sleep(0.1)
    controller.report([(key, 100.0 - i) for i, key in enumerate(keys)])
    while sum(not k["dirty"] for k in controller.state()["hot_keys"]) < len(keys):
        if time.monotonic() > deadline:
            controller.stop()
            raise RuntimeError(f"the Ryu app did not install the hot keys: {controller.state()['decisions'][-3:]}")
        time.sleep(0.1)
    return controller


def run_dataplane(dataplane: str, args: argparse.Namespace, sink: Path, tmp: Path) -> list[dict]:
    with NamespaceNetwork(servers=2, clients=1, tag=f"mbb{dataplane[:2]}", dataplane=dataplane) as net:
        controller = openflow_hot_keys(net, tmp) if dataplane == "openflow" else None
        try:
            return measure_dataplane(net, dataplane, args, sink, tmp, controller)
        except RuntimeError as err:  # a sender that stopped, nothing that arrived, a switch that did not answer
            raise SystemExit(f"bench_ebpf_switch: {dataplane}: {err}") from None
        finally:
            if controller is not None:
                controller.stop()


def measure_dataplane(net: NamespaceNetwork, dataplane: str, args: argparse.Namespace, sink: Path, tmp: Path,
                      controller) -> list[dict]:
    rows = []
    attach_sinks(net, sink)
    teach_server_macs(net)
    driver = install_hot_keys(net) if dataplane == "ebpf" else None
    if dataplane == "bridge":
        rows.append({"dataplane": "sender alone", "traffic": "cold",
                     **median_of(args.repeats, lambda: sender_alone(net, args, tmp))})
        report(rows[-1])
    for kind in TRAFFIC:
        config = write_frames(args.sender, traffic_frames(net, kind), tmp, kind)
        command = sender_command(args.sender, config, args.cpus, qdisc=dataplane == "openflow")
        measured = median_of(args.repeats, lambda: window(
            net, command, args.seconds, lambda: [counter(net, h, "rx_packets") for h in net.server_hosts]))
        rows.append({"dataplane": dataplane, "traffic": kind, **measured})
        report(rows[-1])
    if driver is not None:
        rows[-1]["balanced"] = driver.switch_counters()[0]["balanced"]
        rows.append(mixed_with_sketch(net, args, tmp))
        report(rows[-1])
        driver.close()
    if controller is not None:
        rows[-1]["balanced"] = controller.state()["counters"]["data_plane"]["switch"]["balanced"]
    return rows


def mixed_with_sketch(net: NamespaceNetwork, args: argparse.Namespace, tmp: Path) -> dict:
    """The mixed traffic again with the switch's hot-key sketch counting (read as `mbalancer monitor --source
    dataplane` reads it): its cost at the switch's own rate, and whether it finds the top 10 of what was sent."""
    frames = traffic_frames(net, "mixed")
    command = sender_command(args.sender, write_frames(args.sender, frames, tmp, "mixed"), args.cpus)
    sent = Counter(zipf_trace(MIXED_KEYS, 0.99, MIXED_FRAMES, seed=7).tolist())  # the frames' keys, as repeated
    tables = Tables(net.switch.plane.pin_dir)
    reader = SketchReader(tables, top=10, interval=3600.0)
    try:
        reader.start()
        measured = window(net, command, args.seconds,
                          lambda: [counter(net, h, "rx_packets") for h in net.server_hosts])
        found = reader.read()
    finally:
        reader.stop()
        tables.close()
    truth = [index for index, _ in sent.most_common(10)]
    shares = {int(e.key.split(b":")[1]): e.share for e in found.top}
    errors = [abs(shares[i] - sent[i] / MIXED_FRAMES) / (sent[i] / MIXED_FRAMES) for i in truth if i in shares]
    return {"dataplane": "ebpf", "traffic": "mixed+sketch", **measured, "sketch_gets": found.total,
            "sketch_recall": sum(i in shares for i in truth) / 10, "sketch_share_error": max(errors, default=1.0)}


def median_of(repeats: int, measure) -> dict:
    """Each figure's median over `repeats` windows, and the lowest and highest packets/s (how much one moved)."""
    runs = [measure() for _ in range(repeats)]
    return {**{name: statistics.median(run[name] for run in runs) for name in runs[0]},
            "pps_low": min(run["pps"] for run in runs), "pps_high": max(run["pps"] for run in runs)}


def report(row: dict) -> None:
    print(f"  {row['dataplane']:>12} {row['traffic']:>12}: {row['pps'] / 1e6:.3f} Mpps on {row['cores']:.2f} cores",
          file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="measurement window per figure (default 2)")
    parser.add_argument("--repeats", type=int, default=3, help="windows per figure, the median kept (default 3)")
    parser.add_argument("--sender", choices=("trafgen", "tcpreplay"), default="trafgen",
                        help="trafgen (TX ring, default) or tcpreplay (write() per packet)")
    parser.add_argument("--cpus", type=int, default=os.cpu_count() or 1, help="trafgen processes (default: cores)")
    parser.add_argument("--target", type=float, default=0.9, help="eBPF / bridge packets/s needed (default 0.9)")
    parser.add_argument("--openflow", action="store_true",
                        help="also Open vSwitch's userspace datapath with the Ryu app (the OpenFlow data plane)")
    parser.add_argument("--out", type=Path, help="also write switch.csv here")
    args = parser.parse_args(argv)
    if not 0.1 <= args.seconds <= 60 or not 1 <= args.repeats <= 20 or not 1 <= args.cpus <= 64:
        parser.error("--seconds 0.1-60, --repeats 1-20, --cpus 1-64")
    with tempfile.TemporaryDirectory() as tmp:
        sink = compile_bpf(SINK_SOURCE, Path(tmp) / "sink.bpf.o", "the benchmark's sink")
        rows = run_dataplane("bridge", args, sink, Path(tmp)) + run_dataplane("ebpf", args, sink, Path(tmp))
        if args.openflow:
            rows += run_dataplane("openflow", args, sink, Path(tmp))
    bridge = {r["traffic"]: r for r in rows if r["dataplane"] == "bridge"}
    bridge["mixed+sketch"] = bridge["mixed"]
    for row in rows:
        base = bridge.get(row["traffic"]) if row["dataplane"] in ("ebpf", "openflow") else None
        row["ratio"] = row["pps"] / base["pps"] if base else None
        row["ratio_per_core"] = row["pps_per_core"] / base["pps_per_core"] if base else None
    print(f"{'data plane':<13}{'traffic':<13}{'Mpps':>7}{'cores':>7}{'Mpps/core':>10}{'vs bridge':>10}"
          f"{'per core':>9}{'to s2':>7}")
    for r in rows:
        ratios = f"{r['ratio']:>10.2f}{r['ratio_per_core']:>9.2f}" if r["ratio"] else f"{'':>19}"
        print(f"{r['dataplane']:<13}{r['traffic']:<13}{r['pps'] / 1e6:>7.3f}{r['cores']:>7.2f}"
              f"{r['pps_per_core'] / 1e6:>10.3f}{ratios}{r['share_s2']:>7.2f}")
    sketch = next(r for r in rows if r["traffic"] == "mixed+sketch")
    ebpf = {r["traffic"]: r for r in rows if r["dataplane"] == "ebpf"}
    for r in (r for r in rows if r["dataplane"] == "openflow"):
        print(f"openflow {r['traffic']}: {r['pps'] / ebpf[r['traffic']]['pps']:.2f} of the eBPF switch's packets/s, "
              f"{r['pps_per_core'] / ebpf[r['traffic']]['pps_per_core']:.2f} per core")
    print(f"sketch at {sketch['pps'] / 1e6:.3f} Mpps: {sketch['sketch_gets']:,} gets counted, top-10 recall "
          f"{sketch['sketch_recall']:.2f}, shares within {100 * sketch['sketch_share_error']:.1f}% of what was sent")
    met = all(r["ratio"] >= args.target for r in rows if r["ratio"] is not None and r["dataplane"] == "ebpf")
    if args.out:
        write_csv(args.out, "switch.csv", rows)
    print(json.dumps({"met": met, "target": args.target, "sender": args.sender, "rows": rows}))
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
