"""Benchmark: memcached TCP gets through the box, side by side in one run (issue 45's setting), each phase on the
namespace topology (topologies/netns.py: two memcached servers and a client host behind the switch, which here is
the box):
  bridge      a Linux bridge: the clients' ketama ring picks the server, nothing is balanced
  twemproxy   Debian's nutcracker on the box (the root namespace), the same two servers on its ketama ring; the
              clients connect to it
  mbalancer   the eBPF switch with its TCP path (dataplanes/ebpf/tcp/) and the controller core, the 10 hottest
              keys copied to both servers (weighted)
2 servers, 1 KB values, 64 closed-loop TCP clients (`mbalancer load`), Zipf(1) over 1,000 keys. The links are not
capped here, so this measures what each way costs, not balance under a server bottleneck (`mbalancer experiment
demo --protocol tcp` does that: docs/experiments.md). Per phase:
  gets/s, busiest   the clients' gets per second, and the busiest server's share of them (memcached's cmd_get)
  box us/get        CPU of the box's own process per get (nutcracker, mb-splitter), user + system
  machine us/get    CPU of the whole machine per get: clients, servers and box share one kernel, so their softirq
                    time cannot be told apart; the ratio between phases is what holds
  p50 light         the median get at light load (1 client, keys nobody made hot), in ms
Then 10,000 idle connections through the TCP path: the splitter's memory (RSS) and the kernel's TCP memory per
connection. Targets (issue 45): the box's CPU per get at most 1/5 of twemproxy's, and at most 0.05 ms added to the
light-load p50 over the bridge. Needs root, nutcracker (install/apt-packages.txt) and `make install`.
    python experiments/benchmarks/bench_tcp.py [--seconds 6] [--light-seconds 3] [--idle 10000] [--out DIR]
Prints a table and one JSON line (and with --out, tcp.csv); exit 1 if a target is missed.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from controller.core import ControllerCore
from dataplanes.ebpf.tcp.path import TcpPath
from experiments.benchmarks.rows import write_csv
from experiments.endtoend.measure import process_jiffies
from mbalancer.config import parse_config
from mbalancer.memcache.addresses import ServerAddress
from mbalancer.memcache.client import tcp_client
from mbalancer.memcache.meta import answers
from mbalancer.processes import stop_process
from topologies.netns import ROOT_IP, NamespaceNetwork

KEYS, CLIENTS, VALUE, HOT = 1000, 64, 1000, 10
PROXY_PORT = 22122
TARGETS = {"box_cpu_ratio_to_twemproxy": 0.2, "p50_light_added_ms": 0.05}  # at most
MBALANCER = str(Path(sys.executable).with_name("mbalancer"))
TICK = os.sysconf("SC_CLK_TCK")
NUTCRACKER = """mb:
  listen: {listen}
  hash: md5
  distribution: ketama
  timeout: 2000
  servers:
{servers}
"""


def until(ready, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} not ready after {timeout:g} s")
        time.sleep(0.05)


def listening(ip: str, port: int) -> bool:
    try:
        socket.create_connection((ip, port), timeout=0.5).close()
        return True
    except OSError:
        return False


def machine_jiffies() -> int:
    """Busy CPU time of the whole machine so far (every field of /proc/stat's cpu line but idle and iowait)."""
    with open("/proc/stat") as stat:
        fields = [int(x) for x in stat.readline().split()[1:8]]
    return sum(fields) - fields[3] - fields[4]


def served(net: NamespaceNetwork) -> list[int]:
    return [int(tcp_client(ServerAddress(h.ip)).stats()[b"cmd_get"]) for h in net.server_hosts]


def load(net: NamespaceNetwork, servers: str, seconds: float, clients: int, prefix: str = "key:",
         populate: bool = False) -> dict:
    """`mbalancer load` in the client's namespace; its JSON summary."""
    out = tempfile.mkdtemp(prefix="bench-tcp-")
    try:
        command = [MBALANCER, "load", "--servers", servers, "--protocol", "tcp", "--keys", str(KEYS), "--alpha", "1",
                   "--clients", str(clients), "--value-size", str(VALUE), "--hash", "ketama", "--key-prefix", prefix,
                   "--duration", f"{seconds:g}", "--no-records", "--json", "--out", out, "--timeout", "2"]
        result = net.run(net.client_hosts[0], command + (["--populate"] if populate else []), timeout=seconds + 120)
        if result.returncode:
            raise RuntimeError(f"mbalancer load: {result.stderr.strip()[-500:]}")
        return json.loads(result.stdout.strip().splitlines()[-1]) if seconds else {}
    finally:
        shutil.rmtree(out, ignore_errors=True)


def measure(net: NamespaceNetwork, servers: str, seconds: float, box_pid: int | None) -> dict:
    """One loaded phase: gets/s, the busiest server's share, CPU per get of the box and of the machine."""
    before, box, machine = served(net), process_jiffies(box_pid) if box_pid else 0, machine_jiffies()
    summary = load(net, servers, seconds, CLIENTS)
    gets = [a - b for a, b in zip(served(net), before)]
    done = summary["answered"]
    box_us = (process_jiffies(box_pid) - box) / TICK * 1e6 / done if box_pid else 0.0
    return {"gets_per_s": round(summary["throughput"], 1), "busiest_share": round(max(gets) / sum(gets), 3),
            "box_us_per_get": round(box_us, 2),
            "machine_us_per_get": round((machine_jiffies() - machine) / TICK * 1e6 / done, 2),
            "timeouts": summary.get("timeouts", 0)}


def light_p50(net: NamespaceNetwork, servers: str, seconds: float) -> float:
    return round(load(net, servers, seconds, 1, prefix="cold:")["p50_ms"], 3)


def start_servers(net: NamespaceNetwork) -> str:
    for host in net.server_hosts:
        # (its stderr: a "getpeername" line for every connection reset before it accepted it, thousands a run)
        net.popen(host, ["memcached", "-l", host.ip, "-p", "11211", "-u", "root", "-t", "1", "-m", "64"],
                  stderr=subprocess.DEVNULL)
    for host in net.server_hosts:
        until(lambda: answers(ServerAddress(host.ip)), f"memcached on {host.name}")
    servers = ",".join(f"{h.ip}:11211" for h in net.server_hosts)
    load(net, servers, 0, 1, populate=True)
    load(net, servers, 0, 1, prefix="cold:", populate=True)
    return servers


def bridge_phases(seconds: float, light: float, tag: str) -> dict[str, dict]:
    """bridge, then twemproxy on the same network."""
    with NamespaceNetwork(servers=2, clients=1, tag=tag, dataplane="bridge") as net:
        servers = start_servers(net)
        bridge = {**measure(net, servers, seconds, None), "p50_light_ms": light_p50(net, servers, light)}
        folder = Path(tempfile.mkdtemp(prefix="bench-nutcracker-"))
        listen = f"{ROOT_IP}:{PROXY_PORT}"
        (folder / "nutcracker.yml").write_text(NUTCRACKER.format(listen=listen, servers="\n".join(
            f"   - {h.ip}:11211:1 {h.name}" for h in net.server_hosts)))
        proxy = subprocess.Popen(["nutcracker", "-c", str(folder / "nutcracker.yml"), "-o", str(folder / "log")],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # its words go to its log
        try:
            until(lambda: listening(ROOT_IP, PROXY_PORT), "nutcracker")  # (it does not know meta commands)
            for prefix in ("key:", "cold:"):  # its ring may place keys elsewhere than the clients' ketama
                load(net, listen, 0, 1, prefix=prefix, populate=True)
            twemproxy = {**measure(net, listen, seconds, proxy.pid), "p50_light_ms": light_p50(net, listen, light)}
        finally:
            stop_process(proxy)
            shutil.rmtree(folder, ignore_errors=True)
    return {"bridge": bridge, "twemproxy": twemproxy}


def mbalancer_phase(seconds: float, light: float, idle: int, tag: str) -> tuple[dict, dict]:
    """MBalancer over TCP; then the idle connections held by its splitter."""
    with NamespaceNetwork(servers=2, clients=1, tag=tag) as net:
        servers = start_servers(net)
        path = TcpPath(net.switch.plane, [11211]).start()
        config = parse_config({"servers": [{"name": h.name, "ip": h.ip, "mac": h.mac} for h in net.server_hosts],
                               "balancing": {"hot": HOT, "hysteresis": 1, "hash": "ketama"},
                               "controller": {"health_udp": False}})  # the servers speak TCP only
        core = ControllerCore(config, net.driver()).start()
        try:
            rates = [{"key": f"key:{rank}", "rate": 1000.0 / rank} for rank in range(1, HOT + 1)]
            core.submit_report({"time": time.time(), "interval": 1.0, "rate": 7500.0, "top": rates})
            until(lambda: sum(k["state"] == "clean" for k in core.state()["hot_keys"]) == HOT, "the hot keys")
            result = {**measure(net, servers, seconds, path.working_pid()),
                      "p50_light_ms": light_p50(net, servers, light)}
            idle = idle_connections(net, path, idle)
        finally:
            core.stop()
            path.stop()
    return result, idle


IDLE = r"""
import resource, socket, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (20000, 20000))
held = [socket.create_connection((sys.argv[1], 11211), timeout=10) for _ in range(int(sys.argv[2]))]
print(len(held), flush=True)
sys.stdin.read()
"""


def kernel_tcp_pages() -> int:
    with open("/proc/net/sockstat") as stat:
        for line in stat:
            if line.startswith("TCP:"):
                fields = line.split()
                return int(fields[fields.index("mem") + 1])
    return 0


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))


def idle_connections(net: NamespaceNetwork, path: TcpPath, count: int) -> dict:
    splitter = path.working_pid()  # (its supervisor, path.process, holds no connection)
    rss, pages = rss_kib(splitter), kernel_tcp_pages()
    holder = net.popen(net.client_hosts[0], [sys.executable, "-c", IDLE, net.server_hosts[0].ip, str(count)],
                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        held = int(holder.stdout.readline())
        time.sleep(1.0)  # the splitter accepts in rounds of 64
        grown_rss, grown_pages = rss_kib(splitter) - rss, kernel_tcp_pages() - pages
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    return {"connections": held, "splitter_bytes_per_connection": round(grown_rss * 1024 / held, 1),
            "kernel_tcp_bytes_per_connection": round(grown_pages * 4096 / held, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=6.0, help="seconds of load per phase")
    parser.add_argument("--light-seconds", type=float, default=3.0, help="seconds of the light load per phase")
    parser.add_argument("--idle", type=int, default=10_000, help="idle connections held through the splitter")
    parser.add_argument("--out", type=Path, help="folder for tcp.csv")
    args = parser.parse_args(argv)
    if os.geteuid() != 0 or shutil.which("nutcracker") is None:
        print("bench_tcp: needs root and nutcracker (install/apt-packages.txt)", file=sys.stderr)
        return 2
    tag = f"bt{os.getpid() % 1000}"
    phases = bridge_phases(args.seconds, args.light_seconds, tag)
    phases["mbalancer"], idle = mbalancer_phase(args.seconds, args.light_seconds, args.idle, tag)
    print(f"{'phase':10} {'gets/s':>9} {'busiest':>8} {'box us/get':>11} {'machine us/get':>15} {'p50 light ms':>13}")
    for name, row in phases.items():
        print(f"{name:10} {row['gets_per_s']:9,.0f} {row['busiest_share']:8.3f} {row['box_us_per_get']:11.2f} "
              f"{row['machine_us_per_get']:15.2f} {row['p50_light_ms']:13.3f}")
    twemproxy, mbalancer = phases["twemproxy"], phases["mbalancer"]
    figures = {"phases": phases, "idle": idle,
               "box_cpu_ratio_to_twemproxy": round(mbalancer["box_us_per_get"] / twemproxy["box_us_per_get"], 3),
               "machine_cpu_ratio_to_twemproxy": round(mbalancer["machine_us_per_get"] /
                                                       twemproxy["machine_us_per_get"], 3),
               "p50_light_added_ms": round(mbalancer["p50_light_ms"] - phases["bridge"]["p50_light_ms"], 3)}
    figures["met"] = all(figures[name] <= limit for name, limit in TARGETS.items())
    print(f"{idle['connections']:,} idle connections: {idle['splitter_bytes_per_connection']:.0f} B of the splitter's "
          f"memory and {idle['kernel_tcp_bytes_per_connection']:.0f} B of the kernel's TCP memory each")
    for name, limit in TARGETS.items():
        print(f"target {name} <= {limit}: {figures[name]} ({'met' if figures[name] <= limit else 'MISSED'})")
    print(json.dumps(figures))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        write_csv(args.out, "tcp.csv", [{"phase": name, **row} for name, row in phases.items()])
    return 0 if figures["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
