"""The testbed's management network: one LAN, apart from the data network the switches carry, that the switch boxes'
agents, the controllers and etcd talk over, as a fleet's out-of-band network does.

The LAN is a Linux bridge (`mbmg`) in the root namespace, which is on it too (ROOT_IP), so a controller run there (the
single-controller testbed, `mbalancer experiment`) reaches every agent. A host on it is a network namespace (a named
one, or a Mininet host's) with one veth into the bridge (`<name>-mg` in the root namespace, `mg0` inside). A partition
between two hosts is a blackhole route in each for the other's address (cut, heal): their packets go nowhere, both
ways, while everything else on the LAN still flows, as when a link between two racks fails.
"""
from __future__ import annotations

from dataclasses import dataclass

from dataplanes.bpf.program import in_netns
from dataplanes.switch_nodes import sh

SUBNET = "10.0.1"  # a /24: the root namespace .1, switch box k .(2 + k), other hosts (controllers, etcd) from .200
PREFIX = 24
BRIDGE = "mbmg"
ROOT_IP = f"{SUBNET}.1"
BOX_BASE, HOST_BASE = 2, 200  # the first address of the boxes and of the other hosts
MAX_BOXES = 63


@dataclass(frozen=True)
class LanHost:
    name: str  # its root-namespace veth is `<name>-mg` (an interface name: 12 characters at most)
    netns: str  # a name under /run/netns, or a path such as /proc/PID/ns/net (a Mininet host's)
    ip: str

    @property
    def link(self) -> str:
        return f"{self.name}-mg"

    def command(self, *args: str) -> list[str]:
        """`args` run inside the host's namespace."""
        return [*in_netns(self.netns), *args]


def box_ip(number: int) -> str:
    return f"{SUBNET}.{BOX_BASE + number}"


def host_ip(number: int) -> str:
    return f"{SUBNET}.{HOST_BASE + number}"


class ManagementLan:
    """lan = ManagementLan().start(); host = lan.join("ctl0", "/proc/123/ns/net", host_ip(0)); lan.cut(a, b);
    lan.heal(a, b); lan.close() (removes the bridge, every host's veth and the namespaces it made)."""

    def __init__(self) -> None:
        self.hosts: list[LanHost] = []
        self.made_namespaces: list[str] = []
        self.started = False

    def start(self) -> "ManagementLan":
        sh("ip", "link", "add", BRIDGE, "type", "bridge")
        self.started = True
        sh("sysctl", "-qw", f"net.ipv6.conf.{BRIDGE}.disable_ipv6=1", check=False)
        sh("ip", "addr", "add", f"{ROOT_IP}/{PREFIX}", "dev", BRIDGE)
        sh("ip", "link", "set", BRIDGE, "up")
        return self

    def add_namespace(self, name: str, netns: str, ip: str) -> LanHost:
        """A named namespace made for the host (removed by close), joined to the LAN."""
        sh("ip", "netns", "add", netns)
        self.made_namespaces.append(netns)
        return self.join(name, netns, ip)

    def join(self, name: str, netns: str, ip: str) -> LanHost:
        """An existing namespace on the LAN at `ip`."""
        host = LanHost(name, netns, ip)
        target = netns if not netns.startswith("/proc/") else netns.split("/")[2]  # `ip link` takes a name or a PID
        sh("ip", "link", "add", host.link, "type", "veth", "peer", "name", "mg0", "netns", target)
        self.hosts.append(host)
        sh("sysctl", "-qw", f"net.ipv6.conf.{host.link}.disable_ipv6=1", check=False)
        sh("ip", "link", "set", host.link, "master", BRIDGE, "up")
        sh(*host.command("ip", "addr", "add", f"{ip}/{PREFIX}", "dev", "mg0"))
        for iface in ("mg0", "lo"):
            sh(*host.command("ip", "link", "set", iface, "up"))
        return host

    def cut(self, a: LanHost, b: LanHost) -> None:
        """Partition a and b from each other (both ways); the rest of the LAN still reaches both."""
        sh(*a.command("ip", "route", "add", "blackhole", f"{b.ip}/32"))
        sh(*b.command("ip", "route", "add", "blackhole", f"{a.ip}/32"))

    def heal(self, a: LanHost, b: LanHost) -> None:
        sh(*a.command("ip", "route", "del", "blackhole", f"{b.ip}/32"), check=False)
        sh(*b.command("ip", "route", "del", "blackhole", f"{a.ip}/32"), check=False)

    def close(self) -> None:
        for host in self.hosts:
            sh("ip", "link", "del", host.link, check=False)
        self.hosts.clear()
        for netns in self.made_namespaces:
            sh("ip", "netns", "del", netns, check=False)
        self.made_namespaces.clear()
        if self.started:
            sh("ip", "link", "del", BRIDGE, check=False)
            self.started = False
