"""The experiment topologies as Mininet Topos: one switch, or two tiers of leaves and spines.

Every topology has the same address plan, so the controller's config and the load generator do not care which
one runs: servers srv1..srvN at 10.0.0.1..N, clients cli1..cliM after them, MACs 02:00:00:00:00:xx, and a port
for the controller (`mbctl`, root namespace, 10.0.0.254) through which it reaches the servers to copy hot keys, and,
for a failover group, hosts in namespaces for more controllers (`ctl1`.. at 10.0.0.253 down, on the same switch).

Links: the servers' links carry the cap that makes the servers the bottleneck (LinkSpec: rate in Mbit/s, delay);
clients' links and the links between switches are uncapped unless asked.
"""
from __future__ import annotations

from dataclasses import dataclass

from mininet.topo import Topo

SUBNET = "10.0.0"
PREFIX = 24
CONTROLLER_HOST = "mbctl"
CONTROLLER_IP = f"{SUBNET}.254"
MAX_HOSTS = 250  # host numbers 1..250; .254 is the controller's port
MAX_CONTROLLER_HOSTS = 3  # ctl1..ctl3 at .253, .252, .251


class TopologyError(ValueError):
    """An impossible topology; the message names the option."""


@dataclass(frozen=True)
class LinkSpec:
    """Shaping of a link, both directions: rate in Mbit/s (htb) and one-way delay in ms (netem); None = none."""

    rate_mbit: float | None = None
    delay_ms: float | None = None

    def check(self, where: str) -> None:
        if self.rate_mbit is not None and not 0 < self.rate_mbit <= 100_000:
            raise TopologyError(f"{where} rate must be in (0, 100000] Mbit/s (got {self.rate_mbit})")
        if self.delay_ms is not None and not 0 <= self.delay_ms <= 10_000:
            raise TopologyError(f"{where} delay must be in [0, 10000] ms (got {self.delay_ms})")

    @property
    def shaped(self) -> bool:
        return self.rate_mbit is not None or bool(self.delay_ms)

    def link_options(self) -> dict:
        """Keyword arguments of Mininet's TCLink (empty: a plain veth link)."""
        options: dict = {}
        if self.rate_mbit is not None:
            options["bw"] = self.rate_mbit
        if self.delay_ms:
            options["delay"] = f"{self.delay_ms:g}ms"
        return options


@dataclass(frozen=True)
class HostAddress:
    name: str
    ip: str
    mac: str


def host_plan(servers: int, clients: int) -> tuple[list[HostAddress], list[HostAddress]]:
    """(servers, clients) with their names and addresses, numbered in that order."""
    if servers < 1 or clients < 1:
        raise TopologyError(f"need at least one server and one client (got {servers} and {clients})")
    if servers + clients > MAX_HOSTS:
        raise TopologyError(f"at most {MAX_HOSTS} hosts in all (got {servers + clients})")
    names = [f"srv{i + 1}" for i in range(servers)] + [f"cli{i + 1}" for i in range(clients)]
    hosts = [HostAddress(name, f"{SUBNET}.{n}", f"02:00:00:00:00:{n:02x}") for n, name in enumerate(names, 1)]
    return hosts[:servers], hosts[servers:]


class _PlannedTopo(Topo):
    """Adds the planned hosts and the controller's port; subclasses wire them to switches."""

    def _host(self, host: HostAddress) -> str:
        return self.addHost(host.name, ip=f"{host.ip}/{PREFIX}", mac=host.mac)

    def _controller_ports(self, switch: str, controllers: int) -> None:
        """The root namespace's port, and `controllers` hosts of a failover group's controllers."""
        if not 0 <= controllers <= MAX_CONTROLLER_HOSTS:
            raise TopologyError(f"at most {MAX_CONTROLLER_HOSTS} controller hosts (got {controllers})")
        self.addHost(CONTROLLER_HOST, ip=f"{CONTROLLER_IP}/{PREFIX}", mac="02:00:00:00:00:fe", inNamespace=False)
        self.addLink(CONTROLLER_HOST, switch)
        for host in controller_hosts(controllers):
            self.addLink(self._host(host), switch)


def controller_hosts(count: int) -> list[HostAddress]:
    """The failover group's controller hosts, ctl1 at .253 down."""
    return [HostAddress(f"ctl{i + 1}", f"{SUBNET}.{253 - i}", f"02:00:00:00:00:{253 - i:02x}") for i in range(count)]


class SingleSwitchTopo(_PlannedTopo):
    """n servers and m clients on one switch `sw1`."""

    def build(self, servers: int = 2, clients: int = 2, server_link: LinkSpec = LinkSpec(),
              client_link: LinkSpec = LinkSpec(), controllers: int = 0) -> None:
        server_hosts, client_hosts = host_plan(servers, clients)
        switch = self.addSwitch("sw1", dpid="1")
        for host in server_hosts:
            self.addLink(self._host(host), switch, **server_link.link_options())
        for host in client_hosts:
            self.addLink(self._host(host), switch, **client_link.link_options())
        self._controller_ports(switch, controllers)


class LeafSpineTopo(_PlannedTopo):
    """Two tiers: every leaf links to every spine; servers and clients are dealt round-robin over the leaves
    (servers from leaf1 up, clients from the last leaf down, so they mostly sit apart and cross a spine).

    Floods (broadcasts, unknown destinations) follow a tree through spine1 only: `flood_exclude` (a switch
    option) keeps the leaves from flooding to the other spines, so no frame can circle leaf-spine-leaf-spine."""

    def build(self, servers: int = 2, clients: int = 2, leaves: int = 2, spines: int = 2,
              server_link: LinkSpec = LinkSpec(), client_link: LinkSpec = LinkSpec(),
              fabric_link: LinkSpec = LinkSpec(), controllers: int = 0) -> None:
        if leaves < 1 or spines < 1:
            raise TopologyError(f"a leaf-spine needs at least one leaf and one spine (got {leaves} and {spines})")
        server_hosts, client_hosts = host_plan(servers, clients)
        spine_names = [self.addSwitch(f"spine{i + 1}", dpid=f"{0x100 + i:x}") for i in range(spines)]
        leaf_names = [self.addSwitch(f"leaf{i + 1}", dpid=f"{0x200 + i:x}", flood_exclude=tuple(spine_names[1:]))
                      for i in range(leaves)]
        for leaf in leaf_names:
            for spine in spine_names:
                self.addLink(leaf, spine, **fabric_link.link_options())
        for i, host in enumerate(server_hosts):
            self.addLink(self._host(host), leaf_names[i % leaves], **server_link.link_options())
        for i, host in enumerate(client_hosts):
            self.addLink(self._host(host), leaf_names[-1 - i % leaves], **client_link.link_options())
        self._controller_ports(leaf_names[0], controllers)


TOPOLOGIES = ("single", "leafspine")

