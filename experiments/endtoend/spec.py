"""What an end-to-end experiment runs: the testbed, the workload, MBalancer's settings, the phases, the points.

The thesis's chapter 5 scaled to a 2-core machine (presets below):
- 64 blocking UDP clients (1 s timeout) on two client hosts, 1000 keys of Zipf(1) popularity, H = 10, G = 1;
- two memcached servers; a skewed hash dials the imbalance factor (IF, mean load / max load) over 0.5..1;
- the servers are the bottleneck because their links are capped: the thesis's 100 KB values on 1 Gbit/s links
  become 10 KB values on 100 Mbit/s links, the same 0.8 ms to send one value, at a tenth of the packets/s (which
  2 shared cores can forward, replicate and generate without becoming the bottleneck themselves).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from experiments.workload.spec import PROTOCOLS, Workload, WorkloadError
from dataplanes.agent.fabric import FABRIC_KINDS
from mbalancer.config import AUTO_REPORT_KEYS, REPLICA_MODES, Balancing
from mbalancer.memcache.addresses import ServerAddress
from monitor.dataplane import SKETCH_KINDS
from topologies.shapes import LinkSpec
from topologies.testbed import TestbedSpec

MEMCACHED_DATAGRAM = 1400  # memcached sends a UDP reply in datagrams of at most this payload (its 8-byte frame incl.)
DATAGRAM_HEADERS = 8 + 20 + 14  # UDP, IPv4, Ethernet: what a capped link carries on top of each datagram
REPLY_FRAMING = 40  # "VALUE <key> <flags> <bytes>\r\n" ... "\r\nEND\r\n" around the value
TCP_SEGMENT = 1448  # a TCP reply's payload per segment (MSS 1460 less the timestamp option) ...
SEGMENT_HEADERS = 32 + 20 + 14  # ... and TCP (with options), IPv4, Ethernet on top of each
CALIBRATION_ALPHA = 0.01  # near-uniform popularity: with the skewed hash at IF 1, every server is equally busy
DETECTIONS = ("auto", "sketch", "capture")
CONTROLLERS = ("auto", "local", "ryu")
AUTO_TARGET = 0.97  # `--hot auto`'s target IF: a margin over the 0.95 of capacity it is meant to reach


@dataclass(frozen=True)
class ExperimentSpec:
    name: str
    testbed: TestbedSpec
    hashes: tuple[str, ...]  # one point per hash: "skewed:0.6", "ketama", ...
    clients: int = 64  # in all, split over the client hosts
    keys: int = 1000
    alpha: float = 1.0
    value_size: int = 10_000
    timeout: float = 1.0
    balancing: Balancing = field(default_factory=lambda: Balancing(hot=10, groups=1, hysteresis=2))
    # MBalancer's runs per point, by replica weighting: "equal" (the thesis) and/or "weighted" (water-filling)
    replica_modes: tuple[str, ...] = ("equal",)
    monitor_interval: float = 1.0
    # How the monitor finds the hot keys: "sketch" (the switch counts gets itself, `mbalancer monitor`'s default on
    # the data planes that can), "capture" (packets copied from the client ports to the monitor), "auto": the first
    detection: str = "auto"
    # Where the controller core runs: "local" (in the experiment's process, as `mbalancer controller`), "ryu" (the
    # Ryu app inside ryu-manager), "auto": ryu on openflow with one switch (it connects to Ryu), local elsewhere
    controller: str = "auto"
    warmup: float = 4.0  # seconds of load before measuring: MBalancer finds and copies the hot keys then
    measure: float = 8.0  # seconds measured
    rounds: int = 1  # times the whole sweep runs, capacity run included; figures are the medians over rounds
    protocol: str = "udp"  # the clients' gets: "udp", or "tcp" (the eBPF switch's TCP path balances them)

    def check(self) -> None:
        """Raise ValueError naming the first impossible setting (before any network is built)."""
        self.testbed.check()
        if self.clients < self.testbed.clients:
            raise ValueError(f"clients ({self.clients}) must be at least the client hosts ({self.testbed.clients})")
        if self.warmup < 0 or self.measure <= 0:
            raise ValueError(f"warm-up must be >= 0 and measurement > 0 s (got {self.warmup}, {self.measure})")
        if self.balancing.hot is None and self.balancing.target is None:
            raise ValueError('H "auto" (balancing.hot) needs a target imbalance factor, so the model can pick H')
        if self.balancing.hot is not None and self.balancing.hot < 1:
            raise ValueError(f"balancing.hot must be at least 1 or auto (got {self.balancing.hot})")
        if not 1 <= self.rounds <= 20:
            raise ValueError(f"rounds must be 1..20 (got {self.rounds})")
        if not self.replica_modes or any(m not in REPLICA_MODES for m in self.replica_modes):
            raise ValueError(f"replica modes must be among {', '.join(REPLICA_MODES)} (got {self.replica_modes})")
        if self.detection not in DETECTIONS:
            raise ValueError(f"detection must be one of {', '.join(DETECTIONS)} (got {self.detection!r})")
        if self.detects_with() == "sketch" and self.testbed.dataplane not in SKETCH_KINDS:
            raise ValueError(f"the {self.testbed.dataplane} data plane has no sketch of its own: detect by capture")
        if self.detects_with() == "sketch" and self.testbed.topology != "single":
            raise ValueError("the monitor reads one switch's sketch, and a leaf-spine's gets enter at every leaf: "
                             "detect by capture")
        if self.controller not in CONTROLLERS:
            raise ValueError(f"controller must be one of {', '.join(CONTROLLERS)} (got {self.controller!r})")
        if self.testbed.dataplane == "openflow" and not self.testbed.agents and self.runs_controller() != "ryu":
            raise ValueError("the openflow data plane's switches are driven by the Ryu app (or by switch agents, on a "
                             "leaf-spine): controller ryu")
        if not self.hashes:
            raise ValueError("no point to run: give at least one hash")
        if self.protocol not in PROTOCOLS or self.testbed.tcp != (self.protocol == "tcp"):
            raise ValueError(f"protocol must be one of {', '.join(PROTOCOLS)}, tcp with the switch's TCP path (got "
                             f"{self.protocol!r})")
        fake = tuple(ServerAddress(f"10.0.0.{i + 1}") for i in range(self.testbed.servers))
        try:
            for spec in self.hashes:
                self.workload(fake, spec).check()
            self.calibration(fake).check()
        except WorkloadError as err:
            raise ValueError(str(err)) from None

    def workload(self, servers: tuple[ServerAddress, ...], hash_spec: str, host: int = 0) -> Workload:
        """The whole workload (host=0), or the share one client host runs (its clients, its own key sequence)."""
        whole = Workload(servers=servers, keys=self.keys, alpha=self.alpha, clients=self.clients,
                         duration=self.warmup + self.measure, value_size=self.value_size, hash=hash_spec,
                         timeout=self.timeout, protocol=self.protocol)
        return whole if not host else replace(whole, clients=self.clients_of(host), seed=host)

    def calibration(self, servers: tuple[ServerAddress, ...]) -> Workload:
        """The servers' capacity run: same clients, keys and values, popularity near-uniform, load even."""
        return replace(self.workload(servers, "skewed:1"), alpha=CALIBRATION_ALPHA)

    def link_gets(self) -> float | None:
        """Gets/s one server's capped link carries: its rate over the bytes of one reply on the wire (None when
        the server links are not capped)."""
        rate = self.testbed.server_link.rate_mbit
        if rate is None:
            return None
        payload = self.value_size + REPLY_FRAMING
        if self.protocol == "tcp":
            return rate * 1e6 / 8 / (payload + -(-payload // TCP_SEGMENT) * SEGMENT_HEADERS)
        datagrams = -(-payload // (MEMCACHED_DATAGRAM - 8))
        return rate * 1e6 / 8 / (payload + datagrams * (8 + DATAGRAM_HEADERS))

    def detects_with(self) -> str:
        """"sketch" or "capture": the detection asked for, or with "auto" what the data plane does best."""
        if self.detection != "auto":
            return self.detection
        one_switch = self.testbed.topology == "single"
        return "sketch" if one_switch and self.testbed.dataplane in SKETCH_KINDS else "capture"

    def runs_controller(self) -> str:
        """"local" or "ryu": where the core runs (the one asked for, or with "auto" the data plane's own way)."""
        if self.controller != "auto":
            return self.controller
        return "ryu" if self.testbed.dataplane == "openflow" and not self.testbed.agents else "local"

    def most_hot(self) -> int:
        """Keys per monitor report: H, or with H "auto" the most the controller may choose."""
        return self.balancing.hot if self.balancing.hot is not None else AUTO_REPORT_KEYS

    def clients_of(self, host: int) -> int:
        """Clients on client host `host` (1-based): an even split, the first hosts take the remainder."""
        hosts = self.testbed.clients
        return self.clients // hosts + (host <= self.clients % hosts)


def _chapter5(name: str, **changes) -> ExperimentSpec:
    base = ExperimentSpec(
        name=name,
        testbed=TestbedSpec(servers=2, clients=2, server_link=LinkSpec(rate_mbit=100)),
        hashes=tuple(f"skewed:{f:g}" for f in (0.5, 0.6, 0.7, 0.8, 0.9, 1.0)), replica_modes=("equal", "weighted"))
    return replace(base, **changes)


PRESETS: dict[str, ExperimentSpec] = {
    # Figs 5.1 and 5.2 come from the same sweep: throughput and latency of the same runs.
    "fig5.1": _chapter5("fig5.1"),
    "fig5.2": _chapter5("fig5.2"),
    # Ten servers with the clients' usual ketama hash; links capped so the total capacity stays that of two.
    # G = 2 (groups of 5): with G = 1 a hot key would need 10 replicas, the eBPF data plane holds 8 per key.
    "ketama10": _chapter5("ketama10", hashes=("ketama",), balancing=Balancing(hot=10, groups=2, hysteresis=2),
                          testbed=TestbedSpec(servers=10, clients=2, server_link=LinkSpec(rate_mbit=20))),
    # The README's main job: one point, the default (weighted) replica weights, short phases.
    "demo": _chapter5("demo", hashes=("skewed:0.7",), replica_modes=("weighted",), warmup=4.0, measure=6.0),
}
SWEEP_FIGURES = {"fig5.1": "throughput", "fig5.2": "latency"}

# bmv2 interprets the P4 program per packet: on the 2-core reference machine simple_switch_grpc (log level warn)
# filled a core at ~1,100 of the demo's 10 KB gets/s (about 9 frames each: request and reply datagrams), so the
# runs measured the switch, not the servers. On the p4 data plane the server links are capped so that together they
# carry at most this much (the demo: 2 x 16 Mbit/s, ~190 gets/s per server, the switch at about a third of its
# limit), and the clients scaled by the same factor, so that requests queue at the servers as long as at full rate
# (64 clients at 16 Mbit/s waited ~330 ms at the busy server, past the controller's health timeout): the servers
# stay the bottleneck the experiment is about, at the same latencies.
P4_SERVER_MBIT = 32.0


def on_dataplane(spec: ExperimentSpec, dataplanes: tuple[str, ...]) -> ExperimentSpec:
    """The spec run on another data plane, its rates scaled to what the slowest switch carries (p4: P4_SERVER_MBIT).
    Several make a mixed fabric: the leaves take them in turn; the spines, which hold no key and only forward, the
    first (so the operator picks what forwards between the leaves)."""
    testbed = replace(spec.testbed, dataplane=dataplanes[0], leaf_dataplanes=dataplanes if len(dataplanes) > 1 else ())
    link, clients = testbed.server_link, spec.clients
    if "p4" in dataplanes and link.rate_mbit is not None and link.rate_mbit * testbed.servers > P4_SERVER_MBIT:
        factor = P4_SERVER_MBIT / (link.rate_mbit * testbed.servers)
        testbed = replace(testbed, server_link=replace(link, rate_mbit=link.rate_mbit * factor))
        clients = max(4 * testbed.clients, round(spec.clients * factor))
    return replace(spec, testbed=testbed, clients=clients)


def on_protocol(spec: ExperimentSpec, protocol: str) -> ExperimentSpec:
    """The spec with the clients' gets over `protocol`: over TCP, the switch runs its TCP path."""
    return replace(spec, protocol=protocol, testbed=replace(spec.testbed, tcp=protocol == "tcp"))


def on_topology(spec: ExperimentSpec, topology: str, leaves: int | None = None,
                spines: int | None = None) -> ExperimentSpec:
    """The spec run on another topology. A leaf-spine (ebpf, p4, openflow, or leaves of several of them) is a fabric
    of boxes, each switch behind its own switch agent (topologies/agents.py), each hot key balanced at its home's
    leaf."""
    testbed = replace(spec.testbed, topology=topology,
                      leaves=spec.testbed.leaves if leaves is None else leaves,
                      spines=spec.testbed.spines if spines is None else spines,
                      agents=topology == "leafspine" and set(spec.testbed.dataplanes()) <= set(FABRIC_KINDS))
    return replace(spec, testbed=testbed)
