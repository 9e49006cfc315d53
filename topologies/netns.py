"""A single switch with memcached servers and clients in plain network namespaces (no Mininet needed).

    clients c1..cm, servers s1..sn (each its own namespace, eth0 10.0.0.x/24)
        each host's eth0 <-veth-> a switch port in the root namespace
    root namespace: port `<tag>-r` with 10.0.0.254/24 so the controller reaches the servers (through the switch).

The switch is a data plane from the registry (dataplanes/registry.py) that has a namespace switch: `ebpf` (the
program on every port's ingress, plus its mirror link), `openflow` (a private Open vSwitch on the ports, the key
classifier at egress of every link's far end: the hosts' eth0 and `<tag>-r`; ryu-manager started by whoever drives
it), `p4` (bmv2's simple_switch_grpc on the ports, its P4Runtime server on 127.0.0.1) or `bridge` (a Linux bridge:
the benchmarks' baseline). `driver()`
gives the controller's driver for it. Everything it makes is named after `tag` and removed by close(), also after
a failed start; processes started with `popen` are stopped by PID.
"""
from __future__ import annotations

import subprocess
from dataclasses import dataclass, field

from typing import Any

from dataplanes import registry
from dataplanes.switch_nodes import sh
from mbalancer.processes import stop_process
from topologies.claim import Made, NetworkClaim

SUBNET = "10.0.0"
ROOT_IP = f"{SUBNET}.254"


@dataclass(frozen=True)
class Host:
    name: str
    netns: str
    ip: str
    mac: str
    port: str  # the switch port it is wired to


@dataclass
class NamespaceNetwork:
    servers: int = 2
    clients: int = 1
    tag: str = "mb"
    dataplane: str = "ebpf"  # a registry name with a namespace switch: ebpf, openflow, or bridge (benchmark baseline)
    tcp_ports: tuple[int, ...] = ()  # memcached ports whose TCP gets the switch balances (eBPF only: its TCP path)
    hosts: list[Host] = field(default_factory=list)
    processes: list[subprocess.Popen] = field(default_factory=list)
    switch: Any = None  # the data plane's namespace switch, once started
    claim: NetworkClaim | None = None

    @property
    def server_hosts(self) -> list[Host]:
        return [h for h in self.hosts if h.name.startswith("s")]

    @property
    def client_hosts(self) -> list[Host]:
        return [h for h in self.hosts if h.name.startswith("c")]

    def driver(self):
        """The controller's driver for this network's switch (the registry's, with this switch's settings)."""
        kind = registry.get(self.dataplane)
        return kind.make_driver(kind.parse_settings(self.switch.driver_settings()))

    def start(self) -> "NamespaceNetwork":
        if len(self.tag) > 8:
            raise ValueError("tag: at most 8 characters (interface names are short)")
        switch_class = registry.get(self.dataplane).namespace_switch_class()  # refuses a name without one
        if self.tcp_ports and self.dataplane != "ebpf":
            raise ValueError(f"tcp_ports: only the eBPF switch balances TCP gets, not {self.dataplane} "
                             f"(docs/dataplanes/tcp.md)")
        self.claim = NetworkClaim(f"namespace network {self.tag}").take()
        try:
            self.claim.record(self._made())
            self._build(switch_class)
        except Exception:
            self.close()
            raise
        return self

    def _host_names(self) -> list[str]:
        return [f"s{i + 1}" for i in range(self.servers)] + [f"c{i + 1}" for i in range(self.clients)]

    def _made(self) -> Made:
        names = self._host_names()
        return Made(interfaces=[f"{self.tag}-{n}" for n in names] + [f"{self.tag}-r", f"{self.tag}-br"],
                    namespaces=[f"{self.tag}-{n}" for n in names], switches=[self.tag])

    def _build(self, switch_class: type) -> None:
        for number, name in enumerate(self._host_names(), 1):
            host = Host(name, f"{self.tag}-{name}", f"{SUBNET}.{number}", f"02:00:00:00:00:{number:02x}",
                        f"{self.tag}-{name}")
            sh("ip", "netns", "add", host.netns)
            sh("ip", "link", "add", host.port, "type", "veth", "peer", "name", "eth0", "netns", host.netns)
            ns = ("ip", "netns", "exec", host.netns)
            sh(*ns, "ip", "link", "set", "eth0", "address", host.mac)
            sh(*ns, "ip", "addr", "add", f"{host.ip}/24", "dev", "eth0")
            sh(*ns, "ip", "link", "set", "eth0", "up")
            sh(*ns, "ip", "link", "set", "lo", "up")
            self.hosts.append(host)
        root = f"{self.tag}-r"
        sh("ip", "link", "add", root, "type", "veth", "peer", "name", f"{self.tag}-rp")
        sh("ip", "addr", "add", f"{ROOT_IP}/24", "dev", root)
        ports = [h.port for h in self.hosts] + [f"{self.tag}-rp"]
        for iface in ports + [root]:
            sh("sysctl", "-qw", f"net.ipv6.conf.{iface}.disable_ipv6=1", check=False)  # no IPv6 chatter
            sh("ip", "link", "set", iface, "up")
        self.switch = switch_class(self.tag, tcp_ports=self.tcp_ports) if self.tcp_ports else switch_class(self.tag)
        self.switch.start(ports, [(h.netns, "eth0") for h in self.hosts] + [(None, root)])

    def popen(self, host: Host, command: list[str], **kwargs) -> subprocess.Popen:
        """Start a process inside a host's namespace; close() stops it."""
        process = subprocess.Popen(["ip", "netns", "exec", host.netns, *command], **kwargs)
        self.processes.append(process)
        return process

    def run(self, host: Host, command: list[str], timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(["ip", "netns", "exec", host.netns, *command], capture_output=True, text=True,
                              timeout=timeout)

    def close(self) -> None:
        for process in self.processes:
            stop_process(process)
        self.processes.clear()
        if self.switch is not None:
            self.switch.close()
            self.switch = None
        for iface in [f"{self.tag}-r"] + [h.port for h in self.hosts]:
            sh("ip", "link", "del", iface, check=False)
        for host in self.hosts:
            sh("ip", "netns", "del", host.netns, check=False)
        self.hosts.clear()
        if self.claim is not None:
            self.claim.release()
            self.claim = None

    def __enter__(self) -> "NamespaceNetwork":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()
