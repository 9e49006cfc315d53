"""A running experiment network: a Mininet topology on a chosen data plane, memcached on every server host.

    with Testbed(TestbedSpec(servers=2, clients=2)) as bed:
        bed.servers        # the controller config's [[servers]] (name, ip, mac, port), in hash order
        bed.popen(bed.client_hosts[0], [...])   # a process in a host; stopped by PID at close
        bed.monitor_ports  # switch ports where client requests arrive (what the monitor sniffs)

Everything it makes (namespaces, links, qdiscs, pinned programs, processes) goes at close(), also after a failed
start. A run killed with SIGKILL leaves its root-namespace links and pinned programs; the next start removes them
(topologies/claim.py: one network per machine, and what it made written down before it is made).
"""
from __future__ import annotations

import logging
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Callable

from dataplanes import registry
from dataplanes.agent.fabric import FABRIC_KINDS
from dataplanes.switch_nodes import peer_intf
from mbalancer.config import DataPlane, Server
from mbalancer.memcache.addresses import ServerAddress
from mbalancer.memcache.server import MemcachedServer
from mbalancer.processes import stop_process
from topologies.agents import SwitchAgents
from topologies.management import MAX_BOXES, ROOT_IP, LanHost, ManagementLan, host_ip
from topologies.claim import Made, NetworkClaim
from topologies.shapes import (CONTROLLER_HOST, CONTROLLER_IP, MAX_CONTROLLER_HOSTS, TOPOLOGIES, LeafSpineTopo,
                               LinkSpec, SingleSwitchTopo, TopologyError, controller_hosts)

log = logging.getLogger(__name__)

MEMCACHED_PORT = 11211


@dataclass(frozen=True)
class TestbedSpec:
    topology: str = "single"  # or "leafspine"
    servers: int = 2
    clients: int = 2
    leaves: int = 2
    spines: int = 2
    dataplane: str = "ebpf"  # a data plane of the registry with a Mininet switch (a mixed fabric: its spines')
    # A mixed fabric (leafspine with agents): the leaves' data planes, dealt in turn from leaf1 (ebpf, openflow:
    # leaf1 eBPF, leaf2 Open vSwitch, leaf3 eBPF ...); empty: every switch runs `dataplane`
    leaf_dataplanes: tuple[str, ...] = ()
    agents: bool = False  # every switch on a box of its own, driven through its switch agent (topologies/agents.py)
    # hosts for a failover group's controllers (ctl1..), each on the data network and the management LAN: with agents
    controllers: int = 0
    server_link: LinkSpec = LinkSpec()
    client_link: LinkSpec = LinkSpec()
    fabric_link: LinkSpec = LinkSpec()
    memcached_threads: int = 1
    memcached_memory_mb: int = 64
    # the switch's TCP path: clients' TCP gets balanced too (eBPF: one switch, or a fabric of boxes, each leaf taking
    # the connections to its own servers: docs/dataplanes/tcp.md)
    tcp: bool = False

    def check(self) -> None:
        if self.topology not in TOPOLOGIES:
            raise TopologyError(f"topology must be one of {', '.join(TOPOLOGIES)} (got {self.topology!r})")
        for kind in self.dataplanes():
            try:
                registry.get(kind).mininet_switch_class()
            except registry.UnknownDataPlane as err:
                raise TopologyError(f"{err}; the testbed runs on {', '.join(registry.names('mininet_switch'))}") \
                    from None
        self._check_mixed()
        if "openflow" in self.dataplanes() and self.topology != "single" and not self.agents:
            raise TopologyError("a leaf-spine of OpenFlow switches runs with a switch agent per switch (agents): "
                                "one ryu-manager would balance a hot key's gets at every switch they cross")
        if self.topology == "leafspine" and not (1 <= self.leaves and 1 <= self.spines and
                                                 self.leaves + self.spines <= MAX_BOXES):
            raise TopologyError(f"a leaf-spine needs at least one leaf and one spine, {MAX_BOXES} switches at most "
                                f"(got {self.leaves} and {self.spines})")
        if self.tcp and (self.dataplanes() != ("ebpf",) or (self.topology != "single" and not self.agents)):
            raise TopologyError("TCP gets are balanced by the eBPF switch's TCP path, on one switch or in a fabric of "
                                "boxes (agents), at the home's leaf (the other data planes' TCP gets go home: "
                                "docs/dataplanes/tcp.md)")
        if self.controllers and not self.agents:
            raise TopologyError("controller hosts reach the switches over the management LAN: they need agents")
        if not 0 <= self.controllers <= MAX_CONTROLLER_HOSTS:
            raise TopologyError(f"at most {MAX_CONTROLLER_HOSTS} controller hosts (got {self.controllers})")
        for name in ("server_link", "client_link", "fabric_link"):
            getattr(self, name).check(name.replace("_", " "))
        if self.memcached_threads < 1 or self.memcached_memory_mb < 8:
            raise TopologyError("memcached needs at least 1 thread and 8 MB")

    def _check_mixed(self) -> None:
        if not self.leaf_dataplanes:
            return
        if self.topology != "leafspine" or not self.agents:
            raise TopologyError("leaves of different data planes make a fabric of boxes: a leafspine with a switch "
                                "agent per switch (agents), which one controller drives whatever each box runs")
        if outside := [kind for kind in self.dataplanes() if kind not in FABRIC_KINDS]:
            raise TopologyError(f"the {', '.join(outside)} data plane cannot be a box of a fabric (the fabric's are "
                                f"{', '.join(k for k in FABRIC_KINDS if k != 'none')})")
        if len(self.leaf_dataplanes) > self.leaves:
            raise TopologyError(f"{len(self.leaf_dataplanes)} leaf data planes for {self.leaves} leaves: every "
                                f"kind listed needs a leaf of its own")

    def dataplanes(self) -> tuple[str, ...]:
        """Every data plane the testbed's switches run, the spines' first."""
        return tuple(dict.fromkeys((self.dataplane, *self.leaf_dataplanes)))

    def dataplane_of(self, switch: str) -> str:
        """The data plane of switch `switch` (leafN takes the N-th of leaf_dataplanes, in turn)."""
        if self.leaf_dataplanes and switch.startswith("leaf"):
            return self.leaf_dataplanes[(int(switch[len("leaf"):]) - 1) % len(self.leaf_dataplanes)]
        return self.dataplane

    def unavailable(self) -> str | None:
        """None if every data plane of the testbed can run on this machine, else why the first cannot (one line)."""
        for kind in self.dataplanes():
            if (why := registry.get(kind).available()) is not None:
                return f"the {kind} data plane cannot run here: {why}"
        return None

    def topo(self):
        links = {"server_link": self.server_link, "client_link": self.client_link, "controllers": self.controllers}
        if self.topology == "single":
            return SingleSwitchTopo(servers=self.servers, clients=self.clients, **links)
        return LeafSpineTopo(servers=self.servers, clients=self.clients, leaves=self.leaves, spines=self.spines,
                             fabric_link=self.fabric_link, **links)


@dataclass
class Testbed:
    spec: TestbedSpec
    net: Any = None
    memcached: list[MemcachedServer] = field(default_factory=list)
    processes: list[subprocess.Popen] = field(default_factory=list)
    claim: NetworkClaim | None = None
    agents: SwitchAgents | None = None
    lan: ManagementLan | None = None  # with agents: the management network (topologies/management.py)
    made: Made = field(default_factory=Made)  # what the claim records

    # --- life cycle -------------------------------------------------------------------------------------------
    def start(self) -> "Testbed":
        self.spec.check()
        if why := self.spec.unavailable():
            raise TopologyError(why)
        self.claim = NetworkClaim("testbed").take()
        try:
            self._build()
            self._start_memcached()
        except BaseException:
            self.close()
            raise
        return self

    def _build(self) -> None:
        from mininet.link import TCLink
        from mininet.net import Mininet

        topo = self.spec.topo()
        self.made = _root_namespace_made(topo)
        if self.spec.agents:
            self.lan = ManagementLan()
            self.agents = SwitchAgents(Path(tempfile.mkdtemp(prefix="mbalancer-agents-")), self.lan,
                                       {name: self.spec.dataplane_of(name) for name in topo.switches()},
                                       [CONTROLLER_IP, *(h.ip for h in controller_hosts(self.spec.controllers))])
            boxes = self.agents.made()
            self.made.interfaces += boxes.interfaces
            self.made.namespaces += boxes.namespaces
        self.claim.record(self.made)
        if self.lan is not None:
            self.lan.start()  # before the switches: bmv2 serves P4Runtime on the LAN's root address, for its agent
        self.net = Mininet(topo=topo, switch=self._switch_maker(), link=TCLink, controller=None,
                           autoSetMacs=False, waitConnected=False)
        self.net.start()
        mixed_with_bmv2 = "p4" in self.spec.dataplanes() and len(self.spec.dataplanes()) > 1
        for node in self.net.hosts:
            node.cmd("sysctl -qw net.ipv6.conf.all.disable_ipv6=1" if node.inNamespace else
                     f"sysctl -qw net.ipv6.conf.{node.defaultIntf().name}.disable_ipv6=1")
            if mixed_with_bmv2:  # any host's frames may cross a bmv2 leaf, which leaves checksums as they came
                node.cmd(f"ethtool -K {node.defaultIntf().name} tx off")
        for switch in self.net.switches:
            for intf in switch.intfList():
                subprocess.run(["sysctl", "-qw", f"net.ipv6.conf.{intf.name}.disable_ipv6=1"], capture_output=True)
        self._check_shaping()
        if self.agents is not None:
            self.agents.start(self.net)
            for number, host in enumerate(self.controller_hosts):
                self.lan.join(host.name, f"/proc/{host.pid}/ns/net", host_ip(number))
        log.info("testbed: %s topology, %d servers, %d clients, %s data plane, server links %s",
                 self.spec.topology, self.spec.servers, self.spec.clients,
                 ", ".join(f"{s.name} {self.spec.dataplane_of(s.name)}" for s in self.net.switches)
                 if self.spec.leaf_dataplanes else self.spec.dataplane, self.spec.server_link)

    def _switch_maker(self) -> Callable[..., Any]:
        """What Mininet builds each switch node with: its data plane's Mininet switch class, with the options that
        kind takes here; in a mixed fabric, a constructor choosing the class by the node's name."""
        makers = {kind: self._switch_of(kind) for kind in self.spec.dataplanes()}
        if len(makers) == 1:
            return makers[self.spec.dataplane]
        return lambda name, **params: makers[self.spec.dataplane_of(name)](name, **params)

    def _switch_of(self, kind: str) -> Callable[..., Any]:
        switch = registry.get(kind).mininet_switch_class()
        if self.lan is not None and kind == "p4":
            switch = partial(switch, grpc_host=ROOT_IP)  # its agent reaches P4Runtime on the LAN's root address
        if self.spec.tcp:
            switch = partial(switch, tcp=True, tcp_in_box=self.agents is not None)
        return switch

    def _check_shaping(self) -> None:
        """Mininet only prints tc's errors; a cap that silently did not apply would void the experiment."""
        for link in self.net.links:
            options = link.intf1.params
            for intf in (link.intf1, link.intf2):
                qdiscs = intf.node.cmd(f"tc qdisc show dev {intf.name}")
                if "bw" in options and "htb" not in qdiscs:
                    raise TopologyError(f"the rate cap on {intf.name} did not apply (tc: {qdiscs.strip()!r}): "
                                        f"the kernel needs the htb qdisc")
                if "delay" in options and "netem" not in qdiscs:
                    raise TopologyError(f"the delay on {intf.name} did not apply: this kernel has no netem qdisc "
                                        f"(sch_netem); run without a link delay")

    def _start_memcached(self) -> None:
        for host in self.server_hosts:
            server = MemcachedServer(host=host.IP(), port=MEMCACHED_PORT, threads=self.spec.memcached_threads,
                                     memory_mb=self.spec.memcached_memory_mb, launcher=host.popen)
            self.memcached.append(server)
            server.start()  # readiness probed from here, through the controller's port and the switch

    def close(self) -> None:
        for server in self.memcached:
            server.stop()
        self.memcached.clear()
        for process in self.processes:
            stop_process(process)
        self.processes.clear()
        if self.agents is not None:
            self.agents.stop_agents()
        if self.net is not None:
            net, self.net = self.net, None
            net.stop()
        if self.agents is not None:
            self.agents.close()
            shutil.rmtree(self.agents.folder, ignore_errors=True)
            self.agents = None
        if self.lan is not None:
            self.lan.close()
            self.lan = None
        if self.claim is not None:
            self.claim.release()
            self.claim = None

    def __enter__(self) -> "Testbed":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def reload_dataplane(self) -> None:
        """Every switch gets a fresh program and empty tables: no hot key or learned state left from a run (and a
        fresh agent, which the new mirror link moves in for)."""
        if self.agents is not None:
            self.agents.stop_agents()
        for switch in self.net.switches:
            switch.reload()
        if self.agents is not None:
            self.agents.start_agents(self.net)

    # --- what experiments use ---------------------------------------------------------------------------------
    def lan_namespace(self, name: str) -> LanHost:
        """A namespace of its own on the management LAN (`mb<name>`, e.g. etcd's), removed when the testbed closes,
        or by the next testbed's claim if this one is killed."""
        if self.lan is None:
            raise TopologyError("the management LAN comes with agents=True")
        taken = {h.ip for h in self.lan.hosts}
        ip = next(ip for ip in map(host_ip, range(MAX_CONTROLLER_HOSTS, 50)) if ip not in taken)
        host = LanHost(name, f"mb{name}", ip)
        self.made.interfaces.append(host.link)
        self.made.namespaces.append(host.netns)
        self.claim.record(self.made)
        return self.lan.add_namespace(host.name, host.netns, host.ip)

    def lan_host(self, name: str) -> LanHost:
        """A host on the management LAN by name: a switch's box, a controller host (ctl1..), or a lan_namespace."""
        found = [h for h in (self.lan.hosts if self.lan else []) if h.name == name]
        if not found:
            raise TopologyError(f"no host {name!r} on the management LAN")
        return found[0]

    @property
    def switch_class(self) -> type:
        return registry.get(self.spec.dataplane).mininet_switch_class()

    def dataplane(self) -> DataPlane:
        """The config's [dataplane] for this network: its kind, with settings naming its switches."""
        if self.agents is not None:
            racks: dict[str, list[str]] = {}
            for host in self.server_hosts:
                racks.setdefault(peer_intf(host.defaultIntf()).node.name, []).append(host.name)
            kind = registry.get("agent")
            return DataPlane(kind.name, ((kind.name, kind.parse_settings(self.agents.settings(racks))),))
        kind = registry.get(self.spec.dataplane)
        return DataPlane(kind.name, ((kind.name, kind.parse_settings(self.switch_class.driver_settings(self.net))),))

    @property
    def server_hosts(self) -> list:
        return [h for h in self.net.hosts if h.name.startswith("srv")]

    @property
    def controller_hosts(self) -> list:
        """The failover group's controller hosts (TestbedSpec.controllers), in namespaces."""
        return [h for h in self.net.hosts if h.name.startswith("ctl")]

    @property
    def client_hosts(self) -> list:
        return [h for h in self.net.hosts if h.name.startswith("cli")]

    @property
    def servers(self) -> list[Server]:
        return [Server(name=h.name, ip=h.IP(), mac=h.MAC(), port=MEMCACHED_PORT) for h in self.server_hosts]

    @property
    def addresses(self) -> list[ServerAddress]:
        return [s.address for s in self.servers]

    @property
    def monitor_ports(self) -> list[str]:
        """The switch ports the clients' links end on: every request enters the network there once."""
        return [peer_intf(host.defaultIntf()).name for host in self.client_hosts]

    @property
    def controller_port(self) -> str:
        return self.net.get(CONTROLLER_HOST).defaultIntf().name

    def popen(self, host, args: list[str], **kwargs) -> subprocess.Popen:
        """Start a process in a host; close() stops it (by PID) if it is still running."""
        process = host.popen(args, **kwargs)
        self.processes.append(process)
        return process


def _root_namespace_made(topo) -> Made:
    """The names Mininet will give the root namespace's link ends (switches, hosts outside a namespace): known
    from the topology before anything exists, as Mininet names a port `<node>-eth<port number>`."""
    in_root = {name for name in topo.nodes() if topo.isSwitch(name) or not topo.nodeInfo(name).get("inNamespace", True)}
    ends = []
    for a, b in topo.links():
        port_a, port_b = topo.port(a, b)
        ends += [f"{node}-eth{port}" for node, port in ((a, port_a), (b, port_b)) if node in in_root]
    return Made(interfaces=ends, switches=topo.switches())
