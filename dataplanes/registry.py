"""The data planes MBalancer runs on, by name: the one list that `mbalancer controller --driver` and the config's
[dataplane] section, the testbed and the namespace topology (switch nodes), `make install` (build steps) and the
tests all read.

An entry names its parts by import path ("module:attribute") and loads them only when asked, so reading the
registry imports nothing heavy (no Mininet, no bpf syscall), and a kind that has not landed still has a name and a
reason. Adding a data plane is one entry here plus its own folder dataplanes/<name>/: its program (or a pointer to
it), control library, driver (driver.py) and switch nodes (netns_switch.py, mininet_switch.py). Every part named
here is under dataplanes/.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from mbalancer.settings import ConfigError, parse_section


class UnknownDataPlane(ValueError):
    """A name that is not in the registry, or a kind that cannot do what was asked; the message says which."""


@dataclass(frozen=True)
class DataPlaneKind:
    name: str
    summary: str
    settings: str | None = None  # its config section [dataplane.<name>]: a dataclass whose fields have defaults
    driver: str | None = None  # factory(settings) -> dataplanes.driver.Driver; None: no controller (plain switch)
    mininet_switch: str | None = None  # a Mininet switch class with driver_settings(net) -> dict
    namespace_switch: str | None = None  # a switch for topologies/netns.py: start(ports), close(), driver_settings()
    build: str | None = None  # run by `make install` (python -m dataplanes build)
    check: str | None = None  # () -> None if it can run on this machine, else why not
    missing: str | None = None  # not landed: why the name is refused
    # why, inside ryu-manager, its driver runs in a process of its own (dataplanes/driver_process.py; None: in the app)
    ryu_process: str | None = None
    leftovers: str | None = None  # (switch name) -> [what it removed]: what a killed run left, named after a switch
    # (settings, timeout) -> (switches answering, switches): what a candidate controller could drive now (its election
    # prefers the one that reaches most: controller/election.py); None: the kind's switches are not told apart
    reach: str | None = None

    def available(self) -> str | None:
        """None if this kind can run here, else why not."""
        if self.missing:
            return self.missing
        return load(self.check)() if self.check else None

    def settings_class(self) -> type | None:
        return load(self.settings) if self.settings else None

    def parse_settings(self, raw: dict[str, Any] | None) -> Any:
        """Its settings from its config section (a dict; None or empty: the defaults); ConfigError naming the
        field for a bad one."""
        where = f"dataplane.{self.name}"
        if not self.settings:
            if raw:
                raise ConfigError(f"{where}: the {self.name} data plane takes no settings")
            return None
        return parse_section(raw or {}, where, self.settings_class())

    def make_driver(self, settings: Any = None):
        """The controller's driver for this kind, with its settings (None: the defaults)."""
        self._require(self.driver, "drive it from the controller")
        return load(self.driver)(self.parse_settings(None) if settings is None else settings)

    def reach_probe(self, settings: Any):
        """() -> (switches answering, switches) for these settings, or None if this kind has no probe."""
        if not self.reach:
            return None
        probe = load(self.reach)
        return lambda timeout: probe(settings, timeout)

    def mininet_switch_class(self) -> type:
        self._require(self.mininet_switch, "run as a Mininet switch")
        return load(self.mininet_switch)

    def namespace_switch_class(self) -> type:
        self._require(self.namespace_switch, "run in the namespace topology")
        return load(self.namespace_switch)

    def _require(self, part: str | None, what: str) -> None:
        if self.missing:
            raise UnknownDataPlane(f"data plane {self.name}: {self.missing}")
        if part is None:
            raise UnknownDataPlane(f"data plane {self.name} cannot {what}")


KINDS: dict[str, DataPlaneKind] = {kind.name: kind for kind in (
    DataPlaneKind(
        "ebpf", "tc (clsact) eBPF program on every port of a Linux switch, tables in BPF maps (the default)",
        settings="dataplanes.ebpf:Settings", driver="dataplanes.ebpf.driver:driver_from_settings",
        mininet_switch="dataplanes.ebpf.mininet_switch:EbpfSwitch",
        namespace_switch="dataplanes.ebpf.netns_switch:EbpfPorts",
        build="dataplanes.ebpf.build:build", check="dataplanes.bpf.program:available",
        leftovers="dataplanes.ebpf.leftovers:remove_left_over"),
    DataPlaneKind(
        "none", "no switch: the slot book over switch tables kept in memory (dry runs, tests)",
        driver="dataplanes.recording.driver:driver_from_settings"),
    DataPlaneKind(
        "bridge", "a plain Linux bridge: forwarding only, no MBalancer (the benchmarks' baseline)",
        namespace_switch="dataplanes.bridge.netns_switch:BridgePorts"),
    DataPlaneKind(
        "p4", "P4 (p4src/mbalancer.p4) on bmv2's simple_switch_grpc, driven through P4Runtime",
        settings="dataplanes.p4:Settings", driver="dataplanes.p4.driver:driver_from_settings",
        mininet_switch="dataplanes.p4.mininet_switch:P4Switch", namespace_switch="dataplanes.p4.netns_switch:Bmv2Ports",
        build="dataplanes.p4.pipeline:build", check="dataplanes.p4.pipeline:available",
        leftovers="dataplanes.p4.bmv2:remove_left_over", reach="dataplanes.p4.client:switches_reached",
        ryu_process="its P4Runtime client (gRPC) blocks in C, which stalls ryu-manager's eventlet hub (measured: "
                    "the app hung at its first P4Runtime call and ignored SIGTERM)"),
    DataPlaneKind(
        "openflow", "Open vSwitch (userspace datapath) driven by the Ryu app; an eBPF key classifier on its links",
        settings="dataplanes.openflow:Settings", driver="dataplanes.openflow.driver:driver_from_settings",
        mininet_switch="dataplanes.openflow.mininet_switch:OpenflowSwitch",
        namespace_switch="dataplanes.openflow.netns_switch:OvsPorts",
        build="dataplanes.openflow.classifier:build",
        check="dataplanes.openflow.classifier:available",
        leftovers="dataplanes.openflow.standalone:remove_left_over"),
    DataPlaneKind(
        "agent", "any of the above on another box, served by its switch agent (mbalancer switch serve) over gRPC",
        settings="dataplanes.agent:Settings", driver="dataplanes.agent.fabric:driver_from_settings",
        reach="dataplanes.agent.fabric:boxes_reached",
        ryu_process="its gRPC client blocks in C, which stalls ryu-manager's eventlet hub (as the P4 driver's)"),
)}


# Other names a kind answers to: `p4runtime` is what the design and the driver call the P4 data plane.
ALIASES = {"p4runtime": "p4"}


def get(name: str) -> DataPlaneKind:
    """The kind called `name` (or an alias of it); UnknownDataPlane naming the choices otherwise."""
    name = ALIASES.get(name, name)
    if name not in KINDS:
        raise UnknownDataPlane(f"unknown data plane {name!r} (choose from {', '.join(KINDS)})")
    return KINDS[name]


def names(part: str = "", aliases: bool = False) -> list[str]:
    """The names of the kinds that have `part` (driver, mininet_switch, namespace_switch, build), landed or not;
    with `aliases`, their other names too."""
    found = [k.name for k in KINDS.values() if not part or getattr(k, part) is not None or k.missing]
    return found + [alias for alias, name in ALIASES.items() if name in found] if aliases else found


def load(path: str) -> Any:
    """The attribute named by "module:attribute"."""
    module, _, attribute = path.partition(":")
    return getattr(importlib.import_module(module), attribute)


def remove_left_over(switch: str) -> list[str]:
    """Remove what any data plane left named after `switch` (a killed run's); what was there, named."""
    return [what for kind in KINDS.values() if kind.leftovers for what in load(kind.leftovers)(switch)]
