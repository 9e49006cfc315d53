"""`mbalancer switch attach | detach | status`: the eBPF data plane on this machine's own interfaces, for a Linux
box that forwards between memcached clients and servers (docs/deployment.md), or with `--dataplane openflow` the key
classifier on the ports of one of this box's Open vSwitch bridges (dataplanes/openflow/standalone.py); `mbalancer
switch serve`: the switch agent, this box's data plane driven by a controller on another (dataplanes/agent/).

attach takes the ports from --ports or the config's [dataplane.ebpf] ports, the memcached ports from the config's
servers (or --memcached-port), the name from --name, the config's first [dataplane.ebpf] switch, or mb0; with
--dataplane openflow (the default when the config's [dataplane] kind is openflow) the bridge from --bridge or
[dataplane.openflow] bridge or connect, the name from [dataplane.openflow] classifier. Exit 2
for bad options, 1 when the kernel or a tool refuses (its own words), 0 otherwise; detach of a switch that is not
there says so and exits 0 (it is what was asked).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Callable

from mbalancer.config import config_option
from mbalancer.ownership import Ownership

Fail = Callable[[str], None]
DEFAULT_NAME = "mb0"


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "switch", help="the eBPF switch on this machine's interfaces, or the key classifier on an Open vSwitch bridge: "
                       "attach, detach, status; serve: its agent",
        description="Run MBalancer's eBPF data plane on interfaces of this machine, or its key classifier on the ports "
                    "of an Open vSwitch bridge (--dataplane openflow), remove it, or show it (root); serve this "
                    "machine's data plane to a controller elsewhere.")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    serve = actions.add_parser("serve", help="the switch agent: serve this machine's data plane ([dataplane] kind) "
                                             "to controllers elsewhere, as [dataplane.agent] says")
    serve.add_argument("--config", type=Path, required=True, help="MBalancer config (TOML)")
    serve.add_argument("--listen", help="host:port to serve on (default: [dataplane.agent] listen)")
    serve.add_argument("--duration", type=float, help="stop after this many seconds (default: until SIGTERM)")
    serve.add_argument("--stop-with", type=int, metavar="PID",
                       help="stop when process PID, which started this one, ends (tests and testbeds that start "
                            "their agents: killed, they leave none behind); not for systemd")
    serve.set_defaults(run=_serve, fail=serve.error)
    attach = actions.add_parser("attach", help="load the program and attach it to the ports (openflow: to every port "
                                               "of the bridge, where it sees each frame before Open vSwitch does)")
    attach.add_argument("--ports", help="interfaces to switch between, comma-separated (default: the config's "
                                        "[dataplane.ebpf] ports)")
    attach.add_argument("--memcached-port", type=int, action="append",
                        help="memcached port to balance (repeatable; default: the config's servers' ports, or 11211)")
    tcp = attach.add_mutually_exclusive_group()
    tcp.add_argument("--tcp", action="store_true", default=None,
                     help="balance clients' TCP gets, or fail: the TCP path's splitter runs on this machine (default: "
                          "the config's [dataplane.ebpf] tcp, or wherever it can; docs/dataplanes/tcp.md)")
    tcp.add_argument("--no-tcp", dest="tcp", action="store_false", help="no TCP path: clients' TCP gets go home")
    detach = actions.add_parser("detach", help="remove the program, its mirror link and its pins")
    detach.add_argument("--all", action="store_true", help="every switch (or key classifier) on this machine")
    status = actions.add_parser("status", help="ports, hot keys, lease and counters of each switch")
    status.add_argument("--json", action="store_true", help="one JSON object per switch")
    for sub in (attach, detach, status):
        sub.add_argument("--config", type=Path, help="MBalancer config (TOML)")
        sub.add_argument("--dataplane", choices=("ebpf", "openflow"),
                         help="ebpf: the eBPF switch; openflow: the key classifier on an Open vSwitch bridge (default: "
                              "the config's [dataplane] kind if openflow, else ebpf)")
        sub.add_argument("--bridge", help="openflow: the Open vSwitch bridge (default: [dataplane.openflow] bridge, or "
                                          "the one its connect names)")
        sub.add_argument("--ovs-rundir", help="openflow: Open vSwitch's run directory, where db.sock is (default: "
                                              "[dataplane.openflow] ovs_rundir, or /var/run/openvswitch)")
        sub.add_argument("--name", help=f"switch name (default: the config's first [dataplane.ebpf] switch, or "
                                        f"{DEFAULT_NAME}; openflow: the key classifier's, [dataplane.openflow] "
                                        f"classifier or of0)")
        sub.set_defaults(run=_run, fail=sub.error)


def _run(args: argparse.Namespace, fail: Fail) -> int:
    if _dataplane(args, fail) == "openflow":
        return _run_openflow(args, fail)
    if args.bridge or args.ovs_rundir:
        fail("--bridge and --ovs-rundir are for --dataplane openflow")
    settings, servers = _from_config(args, fail)
    name = args.name or (settings.switches[0] if settings and settings.switches else DEFAULT_NAME)
    if os.geteuid() != 0:
        fail("needs root (tc, bpftool, bpffs)")
    from dataplanes.bpf import program
    if (problem := program.available()) is not None:
        print(f"mbalancer switch: the eBPF data plane cannot run here: {problem}", file=sys.stderr)
        return 1
    try:
        if args.action == "attach":
            return _attach(args, name, settings, servers, fail)
        if args.action == "detach":
            return _detach(program.loaded_switches() if args.all else [name])
        return _status([args.name] if args.name else program.loaded_switches(), args.json)
    except BrokenPipeError:
        raise  # the reader of the output went away: mbalancer's main ends quietly
    except (program.DataPlaneError, OSError, ValueError) as err:
        print(f"mbalancer switch {args.action}: {err}", file=sys.stderr)
        return 1


def _serve(args: argparse.Namespace, fail: Fail) -> int:
    """Serve [dataplane] kind's driver until SIGTERM or Ctrl-C; exit 2 for a bad config, 1 when it cannot serve."""
    import logging
    from dataclasses import replace
    from dataplanes import registry
    from dataplanes.agent.server import AgentError, SwitchAgent
    from dataplanes.driver import DriverError
    from mbalancer.processes import stop_on_signals, stop_with_parent
    from mbalancer.settings import ConfigError
    config = config_option(args.config, fail)
    kind = config.dataplane.kind
    if kind == "agent":
        fail("--config: [dataplane] kind names the data plane this machine runs (ebpf, p4, openflow, none), not "
             "agent")
    settings = dict(config.dataplane.sections).get("agent") or registry.get("agent").parse_settings(None)
    if args.listen:
        settings = replace(settings, listen=args.listen)
    logging.getLogger("dataplanes").setLevel(logging.INFO)  # what the agent and its driver did, in its log
    stop = stop_on_signals()
    if args.stop_with is not None:
        stop_with_parent(args.stop_with, stop)
    try:
        agent = SwitchAgent(kind, config.dataplane.settings, settings)
    except ConfigError as err:
        fail(f"--config: {err}")
    except (DriverError, registry.UnknownDataPlane) as err:
        print(f"mbalancer switch serve: the {kind} data plane: {err}", file=sys.stderr)
        return 1
    try:
        port = agent.start()
    except AgentError as err:
        agent.stop()
        print(f"mbalancer switch serve: {err}", file=sys.stderr)
        return 1
    print(f"mbalancer switch serve: the {kind} data plane on {settings.listen.rpartition(':')[0]}:{port}; "
          f"Ctrl-C stops", file=sys.stderr, flush=True)
    stop.wait(args.duration)
    agent.stop()
    return 0


def _dataplane(args: argparse.Namespace, fail: Fail) -> str:
    """--dataplane; else the config's kind; else, for status and detach, openflow where only key classifiers are
    attached on this machine (no eBPF switch)."""
    if args.dataplane:
        return args.dataplane
    if args.config:
        return "openflow" if config_option(args.config, fail).dataplane.kind == "openflow" else "ebpf"
    from dataplanes.bpf.program import loaded_switches
    from dataplanes.openflow.standalone import attached_classifiers
    only_classifiers = args.action != "attach" and attached_classifiers() and not loaded_switches()
    return "openflow" if only_classifiers else "ebpf"


def _run_openflow(args: argparse.Namespace, fail: Fail) -> int:
    """attach, detach or status of the key classifier on an Open vSwitch bridge; exit 1 with one line when the box
    refuses (no such bridge, ovs-vswitchd not running, a port the classifier cannot see first, ...)."""
    from dataplanes import registry
    from dataplanes.bpf import program
    from dataplanes.openflow import Settings, standalone
    from dataplanes.openflow.box import BoxError
    config = config_option(args.config, fail) if args.config else None
    settings = (dict(config.dataplane.sections).get("openflow") if config else None) or Settings()
    if args.action == "attach" and (args.ports or args.tcp is not None):
        fail("--ports and --tcp are the eBPF switch's: the classifier goes on every port of --bridge")
    name = args.name or settings.classifier
    bridge, rundir = settings.box()
    bridge, rundir = args.bridge or bridge, args.ovs_rundir or rundir
    if args.action == "attach" and not bridge:
        fail("--bridge: give the Open vSwitch bridge (or [dataplane.openflow] bridge or connect in --config)")
    if settings.datapath not in ("", "system", "netdev"):
        fail(f"--config: dataplane.openflow.datapath: system or netdev (got {settings.datapath!r})")
    if os.geteuid() != 0:
        fail("needs root (tc, bpftool, bpffs, Open vSwitch)")
    if (problem := program.available() or registry.get("openflow").available()) is not None:
        print(f"mbalancer switch: the OpenFlow data plane cannot run here: {problem}", file=sys.stderr)
        return 1
    try:
        if args.action == "attach":
            servers = config.servers if config else ()
            ports = args.memcached_port or sorted({s.port for s in servers}) or [11211]
            record = standalone.attach(name, bridge, rundir, ports, settings.datapath)
            print(f"mbalancer switch: key classifier {name} attached to bridge {bridge} ({record.datapath} datapath): "
                  + "; ".join(f"{h.port}: {h.describe()}" for h in record.hooks)
                  + f"; memcached port(s) {', '.join(map(str, record.memcached_ports))}; the switch agent drives it "
                    f"with [dataplane.openflow] classifier = \"{name}\" (undo: mbalancer switch detach --dataplane "
                    f"openflow --name {name})", file=sys.stderr)
            return 0
        names = ([args.name] if args.name else standalone.attached_classifiers()) if args.action == "status" or \
            args.all else [name]
        if not names:
            print("mbalancer switch: no key classifier is attached on this machine", file=sys.stderr)
        for each in names:
            if args.action == "detach":
                _warn_owner(f"openflow-classifier:{each}")
                removed = standalone.detach(each)
                print(f"mbalancer switch: {each}: " + (f"removed {'; '.join(removed)}" if removed else
                                                       "nothing to remove (not attached)"), file=sys.stderr)
                continue
            if each not in program.loaded_switches(program.CLASSIFIER.pin_root):
                print(f"mbalancer switch: no key classifier named {each} is loaded", file=sys.stderr)
                return 1
            report = standalone.status(each)
            print(json.dumps(report) if args.json else _format_classifier(report))
        return 0
    except BrokenPipeError:
        raise
    except (BoxError, program.DataPlaneError, OSError, ValueError) as err:
        print(f"mbalancer switch {args.action}: {err}", file=sys.stderr)
        return 1


def _warn_owner(owned: str) -> None:
    owner = Ownership.holder(owned)
    if owner is not None:  # its hot keys stay in its state, and it keeps copying, until it is stopped
        print(f"mbalancer switch: warning: {owner.describe()}: it loses the switch now, and says so in its "
              f"/state; stop it too (systemctl stop mbalancer-controller or mbalancer-agent)", file=sys.stderr)


def _format_classifier(report: dict) -> str:
    counters = report["counters"]
    busy = ", ".join(f"{k} {v:,}" for k, v in counters.items() if v)
    hooks = "; ".join(f"{h['port']}: {h['where']}" + ("" if h["there"] else " (GONE)") for h in report["hooks"]) \
        if report["hooks"] is not None else "unknown (not attached by this command)"
    unclassified = report["unclassified_ports"]
    extra = f"; WITHOUT the classifier (added since attach: attach again): {', '.join(unclassified)}" \
        if isinstance(unclassified, list) and unclassified else f"; ports now {unclassified}" \
        if isinstance(unclassified, str) else ""
    return (f"{report['name']}: bridge {report['bridge']} ({report['datapath']} datapath); {hooks}{extra}; "
            f"memcached port(s) {', '.join(map(str, report['memcached_ports']))}; {report['hot_keys']} hot keys; "
            f"lease {report['lease_left_s']:g} s left; hot-key sketch "
            f"{'read by a monitor' if report['sketch_read'] else 'off'}\n  counters: {busy or 'all zero'}")


def _from_config(args: argparse.Namespace, fail: Fail) -> tuple:
    if not args.config:
        return None, ()
    config = config_option(args.config, fail)
    return dict(config.dataplane.sections).get("ebpf"), config.servers


def _attach(args: argparse.Namespace, name: str, settings, servers, fail: Fail) -> int:
    from dataplanes.ebpf import standalone
    ports = [p.strip() for p in args.ports.split(",") if p.strip()] if args.ports else \
        list(settings.ports if settings else ())
    if not ports:
        fail("--ports: give the interfaces to switch between (or [dataplane.ebpf] ports in --config)")
    memcached_ports = args.memcached_port or sorted({s.port for s in servers}) or [11211]
    if not all(0 < p < 65536 for p in memcached_ports):
        fail(f"--memcached-port: 1-65535 (got {memcached_ports})")
    record = standalone.attach(name, ports, memcached_ports, args.tcp if args.tcp is not None else
                               settings.tcp if settings else None)
    tcp = f"; TCP gets balanced by splitter {record.splitter_pid}" if record.tcp else \
        f"; TCP gets go home, no TCP path ({record.tcp_missing}; --no-tcp says so on purpose)" if record.tcp_missing \
        else ""
    print(f"mbalancer switch: {name} attached to {', '.join(record.ports)}; memcached port(s) "
          f"{', '.join(map(str, record.memcached_ports))}{tcp}; the controller drives it with --driver ebpf "
          f"(undo: mbalancer switch detach {_same_switch(args, name)})", file=sys.stderr)
    return 0


def _same_switch(args: argparse.Namespace, name: str) -> str:
    """The options that name this switch again, as they were given (the config, or the name)."""
    return f"--config {args.config}" + (f" --name {name}" if args.name else "") if args.config else f"--name {name}"


def _detach(names: list[str]) -> int:
    from dataplanes.ebpf import standalone
    from dataplanes.ebpf.driver import owned_name
    if not names:
        print("mbalancer switch: no switch is loaded on this machine", file=sys.stderr)
    for name in names:
        _warn_owner(owned_name(name))
        removed = standalone.detach(name)
        print(f"mbalancer switch: {name}: " + (f"removed {'; '.join(removed)}" if removed else "nothing to remove "
                                                  "(not attached)"), file=sys.stderr)
    return 0


def _status(names: list[str], as_json: bool) -> int:
    from dataplanes.bpf import program
    from dataplanes.ebpf import standalone
    loaded = program.loaded_switches()
    if not names:
        print("mbalancer switch: no switch is loaded on this machine", file=sys.stderr)
    for name in names:
        if name not in loaded:
            print(f"mbalancer switch: no switch named {name} is loaded", file=sys.stderr)
            return 1
        report = standalone.status(name)
        print(json.dumps(report) if as_json else _format(report))
    return 0


def _splitter_text(splitter: dict | None) -> str:
    if splitter is None:
        return ""
    if splitter.get("missing"):
        return f"; no TCP path: {splitter['missing']}"
    return f"; TCP splitter {splitter['pid']} " + ("running" if splitter["running"] else
                                                  f"NOT running (its log: {splitter['log']})")


def _format(report: dict) -> str:
    counters = report["counters"]
    busy = ", ".join(f"{k} {v:,}" for k, v in counters.items() if v)
    ports = ", ".join(report["ports"]) if report["ports"] is not None else "unknown (not attached by this command)"
    if report.get("netns"):
        ports += f" (in network namespace {report['netns']})"
    return (f"{report['name']}: ports {ports}; memcached port(s) {', '.join(map(str, report['memcached_ports']))}; "
            f"{report['hot_keys']} hot keys; lease {report['lease_left_s']:g} s left; {report['learned_macs']} MACs "
            f"learned; hot-key sketch {'read by a monitor' if report['sketch_read'] else 'off'}"
            f"{_splitter_text(report['tcp_splitter'])}\n"
            f"  counters: {busy or 'all zero'}")
