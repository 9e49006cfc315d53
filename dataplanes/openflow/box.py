"""An Open vSwitch box as `mbalancer switch attach --dataplane openflow` finds it: the bridge, its datapath, its ports,
and where on each port the key classifier must run so that it sees a frame before the switch does.

Where that is depends on who reads the port (docs/dataplanes/openflow.md, "On your own Open vSwitch box"):
- the kernel datapath (datapath_type system) takes a port's frames in its rx handler, which the kernel runs after
  tc ingress: the classifier at tc ingress of the port itself;
- the userspace datapath (netdev) reads a port with an AF_PACKET socket, which the kernel feeds before tc ingress, so
  a mark made there would come too late: the classifier's XDP build on the port (XDP runs before AF_PACKET sees the
  frame; native where the driver has it, else generic), NIC or veth alike;
- an internal port (the bridge's own, a tap of the userspace datapath) carries what this box's stack sends into the
  switch through its transmit path: tc egress of the port itself, on either datapath;
- DPDK, AF_XDP, tunnel and patch ports hand frames to Open vSwitch where no kernel hook sees them first: refused.
Every port must get it: a write that reached a hot key's home through a port without the classifier would not be
counted, and a replica could serve a stale value.
"""
from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path


DEFAULT_RUNDIR = "/var/run/openvswitch"  # where Debian's openvswitch-switch keeps db.sock and <bridge>.mgmt
DATAPATHS = {"system": "the kernel datapath", "netdev": "the userspace datapath"}
TIMEOUT = 10  # seconds an ovs-vsctl or ovs-appctl call may take


class BoxError(RuntimeError):
    """The bridge cannot take the classifier (one line, saying why)."""


@dataclass(frozen=True)
class Hook:
    """Where the classifier runs for one port of the bridge: on the port's own interface, at `direction`."""
    port: str
    direction: str  # tc ingress or egress, or xdp

    def describe(self) -> str:
        return f"XDP of {self.port}" if self.direction == "xdp" else f"tc {self.direction} of {self.port}"


class OvsBox:
    """The Open vSwitch of this box, reached through its run directory (db.sock, ovs-vswitchd's pidfile)."""

    def __init__(self, rundir: str = DEFAULT_RUNDIR):
        self.rundir = rundir
        self.env = dict(os.environ, OVS_RUNDIR=rundir)

    def vsctl(self, *args: str) -> str:
        return self._run(["ovs-vsctl", f"--db=unix:{self.rundir}/db.sock", f"--timeout={TIMEOUT}", *args],
                         f"ovsdb-server at unix:{self.rundir}/db.sock")

    def check_running(self) -> None:
        """BoxError unless ovsdb-server and ovs-vswitchd both answer."""
        if not Path(self.rundir, "db.sock").exists():
            raise BoxError(f"no Open vSwitch database at unix:{self.rundir}/db.sock (is openvswitch-switch running? "
                           f"another run directory: --ovs-rundir or [dataplane.openflow] ovs_rundir)")
        self.vsctl("show")
        self._run(["ovs-appctl", "-t", "ovs-vswitchd", f"--timeout={TIMEOUT}", "version"],
                  f"ovs-vswitchd (pidfile {self.rundir}/ovs-vswitchd.pid)", "ovs-vswitchd is not running: ")

    def datapath(self, bridge: str) -> str:
        """"system" or "netdev"; BoxError if there is no such bridge."""
        if subprocess.run(["ovs-vsctl", f"--db=unix:{self.rundir}/db.sock", f"--timeout={TIMEOUT}", "br-exists",
                           bridge], env=self.env, capture_output=True, timeout=TIMEOUT + 5).returncode == 2:
            bridges = self.vsctl("list-br").split()
            raise BoxError(f"no bridge {bridge} in this Open vSwitch (its bridges: {', '.join(bridges) or 'none'})")
        kind = self.vsctl("get", "bridge", bridge, "datapath_type").strip('"') or "system"  # "": the kernel's
        if kind not in DATAPATHS:
            raise BoxError(f"bridge {bridge} has datapath_type {kind}: only system (the kernel's) and netdev "
                           f"(userspace) are known")
        return kind

    def interfaces(self, bridge: str) -> list[dict]:
        """The bridge's interfaces, its own internal one included: name, type, ofport, error."""
        names = self.vsctl("list-ifaces", bridge).split() + [bridge]
        raw = json.loads(self.vsctl("--format=json", "--columns=name,type,ofport,error", "list", "interface", *names))
        return [dict(zip(raw["headings"], (_value(v) for v in row))) for row in raw["data"]]

    def _run(self, args: list[str], who: str, prefix: str = "") -> str:
        try:
            result = subprocess.run(args, env=self.env, capture_output=True, text=True, timeout=TIMEOUT + 5)
        except FileNotFoundError:
            raise BoxError(f"{args[0]} is not installed (apt openvswitch-switch)") from None
        except subprocess.TimeoutExpired:
            raise BoxError(f"{prefix}{who} did not answer within {TIMEOUT} s") from None
        if result.returncode:
            said = (result.stderr or result.stdout).strip().splitlines()
            raise BoxError(f"{prefix}{who}: {said[-1] if said else f'exit {result.returncode}'}")
        return result.stdout.strip()


def _value(cell):
    """An OVSDB JSON cell: ["set", []] is empty, a one-element set its element."""
    if isinstance(cell, list) and cell and cell[0] == "set":
        return cell[1][0] if len(cell[1]) == 1 else None
    return cell


def plan(box: OvsBox, bridge: str, datapath: str = "") -> tuple[str, list[Hook]]:
    """The bridge's datapath and a hook for every one of its interfaces; BoxError (one line) for a bridge that is
    not there, not of `datapath` (if given), or has a port the classifier cannot see first."""
    box.check_running()
    kind = box.datapath(bridge)
    if datapath and datapath != kind:
        raise BoxError(f"bridge {bridge} runs {DATAPATHS[kind]} (datapath_type {kind}), not "
                       f"{DATAPATHS.get(datapath, datapath)} as [dataplane.openflow] datapath says")
    hooks = [hook_of(bridge, kind, interface) for interface in box.interfaces(bridge)]
    return kind, hooks


def hook_of(bridge: str, datapath: str, interface: dict) -> Hook:
    name, kind = interface["name"], interface["type"] or "system"
    if interface.get("error") or interface.get("ofport") in (None, -1):
        raise BoxError(f"port {name} of bridge {bridge} is gone ({interface.get('error') or 'no OpenFlow port'}): "
                       f"remove it (ovs-vsctl del-port {bridge} {name}) or bring its interface back")
    if kind in ("internal", "tap"):
        return Hook(name, "egress")
    if kind != "system":
        raise BoxError(f"port {name} of bridge {bridge} is of type {kind}: its frames reach Open vSwitch where no "
                       f"kernel hook sees them first, so no key classifier can run for it")
    return Hook(name, "ingress" if datapath == "system" else "xdp")
