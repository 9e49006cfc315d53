"""Build, load and attach the eBPF data plane.

- build(): clang compiles bpf/mbalancer.bpf.c once, at setup (`make install` runs `python -m dataplanes build`);
  nothing is compiled at run time.
- DataPlane(name).load(): bpftool loads one copy of the program per switch and pins it and its maps under
  /sys/fs/bpf/mbalancer/<name>/, so each switch has its own tables and the driver opens them by path.
- attach(iface): a clsact qdisc and the pinned program as a direct-action ingress filter (tc object-pinned). Each
  program owns its hook only: an eBPF switch's port (ingress) may carry a neighbouring Open vSwitch's classifier
  (egress) in a fabric of mixed switches, and neither attaching nor unloading one removes the other.
- The same source built with -DMB_CLASSIFIER is the OpenFlow data plane's key classifier (CLASSIFIER: its own
  object and pin root, attached at tc egress of the wire side of a switch's ports; dataplanes/openflow/), and with
  -DMB_XDP too its XDP build (CLASSIFIER_XDP, loaded on a classifier's pinned maps by load_xdp: for ports that
  Open vSwitch's userspace datapath reads before tc ingress).
- add_mirror_link(): the veth pair `<name>-m` (switch side: writes to hot keys are cloned there) <->
  `<name>-mc` (the controller's eBPF driver reads them there); mirror_link_of() is the one place these names are
  made.
- serve(ports): attach to every port and write the ports, settings and memcached ports tables: what every switch
  does at start.
- unload(): detach from every port it attached, delete the mirror link, remove the pins (the kernel frees the
  program then).
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from mbalancer.interfaces import NETNS_NAMES, interface_exists

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "src" / "mbalancer.bpf.c"
OBJECT = HERE / "build" / "mbalancer.bpf.o"
BPFFS = Path("/sys/fs/bpf")
PIN_ROOT = BPFFS / "mbalancer"
TC_TIMEOUT = 30  # s for one tc command (it answers in milliseconds; a hung one must not hold up an unload)


@dataclass(frozen=True)
class Program:
    """One build of bpf/mbalancer.bpf.c: where its object goes, where its copies are pinned, which tc hook runs it."""
    object: Path
    pin_root: Path
    hook: str  # tc direction: ingress (a switch's ports) or egress (the wire side of another switch's ports)
    defines: tuple[str, ...] = ()


SWITCH = Program(OBJECT, PIN_ROOT, "ingress")
# The object's programs (C function names) and their pins in a switch's pin directory: the pipeline on the ports, and
# decide, which the TCP splitter asks where a get goes (dataplanes/ebpf/tcp/; not in the classifier's build).
PROGRAM_PINS = {"mbalancer": "prog", "mbalancer_decide": "decide"}
CLASSIFIER = Program(HERE / "build" / "classifier.bpf.o", BPFFS / "mbalancer-classifier", "egress", ("MB_CLASSIFIER",))
# The classifier as an XDP program (-DMB_XDP), for ports whose reader sees a frame before tc ingress (a NIC of Open
# vSwitch's userspace datapath): loaded beside the tc build, on the same pinned maps, and pinned as XDP_PIN.
CLASSIFIER_XDP = Program(HERE / "build" / "classifier-xdp.bpf.o", CLASSIFIER.pin_root, "xdp",
                         ("MB_CLASSIFIER", "MB_XDP"))
XDP_PIN = "xdp"


def mirror_link_of(switch: str) -> tuple[str, str]:
    """The mirror link's two ends: (switch side, where writes are cloned to; controller side, where the driver
    reads them)."""
    return f"{switch}-m", f"{switch}-mc"


def loaded_switches(pin_root: Path = PIN_ROOT) -> list[str]:
    """The names of the switches whose program is pinned on this machine (pin_root: the key classifiers' for
    the OpenFlow data plane's)."""
    return sorted(p.name for p in pin_root.glob("*") if (p / "prog").exists()) if pin_root.exists() else []


def remove_left_over(name: str) -> list[str]:
    """Remove the pins (switch or key classifier) and the mirror link a killed run left for switch `name`; what was
    there, named (the registry's leftovers hook)."""
    removed = []
    for pins in (PIN_ROOT / name, CLASSIFIER.pin_root / name):
        if pins.exists():
            shutil.rmtree(pins, ignore_errors=True)
            removed.append(f"pins {pins}")
    for iface in mirror_link_of(name):
        if interface_exists(iface):
            subprocess.run(["ip", "link", "del", iface], capture_output=True)
            removed.append(iface)
    return removed


class DataPlaneError(RuntimeError):
    """The program could not be built, loaded or attached; the message carries the tool's own words."""


def run_tool(args: list[str], what: str, timeout: float | None = None) -> str:
    """Run one of the tools (bpftool, clang, tc, ip): its output, or a DataPlaneError in its own words."""
    try:
        result = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise DataPlaneError(f"{what}: {args[0]} is not installed (install/apt-packages.txt; run make install)")
    except subprocess.TimeoutExpired:
        raise DataPlaneError(f"{what} failed: {args[0]} did not answer in {timeout:g} s")
    if result.returncode:
        raise DataPlaneError(f"{what} failed: {(result.stderr or result.stdout).strip()[-2000:]}")
    return result.stdout


def build(force: bool = False, program: Program = SWITCH) -> Path:
    """Compile the program if the object is missing or older than any source; returns the object's path."""
    sources = list(SOURCE.parent.glob("*"))
    target = program.object
    if not force and target.exists() and all(s.stat().st_mtime <= target.stat().st_mtime for s in sources):
        return target
    what = "the OpenFlow key classifier" if program.defines else "the eBPF data plane"
    return compile_bpf(SOURCE, target, what, program.defines)


def compile_bpf(source: Path, target: Path, what: str, defines: Sequence[str] = ()) -> Path:
    """clang a BPF C source into an object (warnings are errors); DataPlaneError with clang's words if it fails."""
    target.parent.mkdir(exist_ok=True)
    arch = subprocess.run(["gcc", "-dumpmachine"], capture_output=True, text=True).stdout.strip() or "x86_64-linux-gnu"
    run_tool(["clang", "-O2", "-g", "-Wall", "-Werror", "-target", "bpf", f"-I/usr/include/{arch}",
              *(f"-D{d}" for d in defines), "-c", str(source), "-o", str(target)], f"compiling {what}")
    return target


def available() -> str | None:
    """None if this machine can run the eBPF data plane, else why not (for tests that must skip)."""
    return unavailable(("bpftool", "tc", "clang"), (SWITCH,))


def unavailable(tools: Sequence[str], programs: Sequence[Program]) -> str | None:
    """Why `programs` cannot be loaded here with `tools` (a tool not installed, an object not built, no bpffs where
    pins last), or None: the probes of every data plane built from this source."""
    for tool in tools:
        if shutil.which(tool) is None:
            return f"{tool} is not installed (install/apt-packages.txt)"
    for program in programs:
        if not program.object.exists():
            return f"{program.object} is not built (make install builds it)"
    try:
        mount_bpffs()
    except DataPlaneError as err:
        return str(err)
    return None


def mount_bpffs() -> None:
    """Mount the machine's bpffs where it is missing (a fresh boot); DataPlaneError where pins would not last."""
    if problem := bpffs_problem():
        raise DataPlaneError(problem)
    if not _is_mount_point(BPFFS):
        run_tool(["mount", "-t", "bpf", "bpf", str(BPFFS)], "mounting bpffs")


def bpffs_problem() -> str | None:
    """Why this process cannot see the machine's pinned switches, or None. `ip netns exec` gives its command a
    mount namespace of its own with a fresh /sys: no bpffs there, and one mounted there would vanish with the
    command, pins and all, while the programs stayed on the ports."""
    if _is_mount_point(BPFFS) or not _private_mount_namespace():
        return None
    return (f"{BPFFS} is not mounted in this mount namespace (`ip netns exec` remounts /sys, so pins made here would "
            f"vanish with the command): enter the network namespace only, e.g. nsenter --net=/run/netns/BOX mbalancer "
            f"...")


def _is_mount_point(path: Path) -> bool:
    try:
        return path.stat().st_dev != path.parent.stat().st_dev
    except OSError:
        return False


def _private_mount_namespace() -> bool:
    """Whether this process has a mount namespace of its own: not the one of the machine's init, nor its parent's
    (`ip netns exec` makes one, then runs the command; init's may be unreadable in a container). False if unsure."""
    try:
        mine = os.readlink("/proc/self/ns/mnt")
    except OSError:
        return False
    for pid in (1, os.getppid()):
        try:
            if os.readlink(f"/proc/{pid}/ns/mnt") != mine:
                return True
        except OSError:
            continue
    return False


class DataPlane:
    """One switch's copy of the program (or of the classifier) and its maps."""

    def __init__(self, name: str, program: Program = SWITCH):
        if not name or "/" in name:
            raise ValueError(f"bad data plane name {name!r}")
        self.name = name
        self.program = program
        self.pin_dir = program.pin_root / name
        self.attached: list[str] = []
        self.mirror_link = False
        self.mirror_netns: str | None = None  # where the mirror link is, if not here (as attached entries say)

    @property
    def mirror_iface(self) -> str:
        """The controller's end of this switch's mirror link."""
        return mirror_link_of(self.name)[1]

    @property
    def program_pin(self) -> Path:
        return self.pin_dir / "prog"

    def load(self) -> "DataPlane":
        mount_bpffs()
        if self.pin_dir.exists():
            raise DataPlaneError(f"{self.pin_dir} exists: another switch named {self.name} is loaded "
                                 f"(remove the directory if it is left over)")
        self.pin_dir.mkdir(parents=True)
        loaded = self.pin_dir / "loaded"  # every program of the object, by function name, before their own pins
        try:
            run_tool(["bpftool", "prog", "loadall", str(build(program=self.program)), str(loaded),
                      "type", "classifier", "pinmaps", str(self.pin_dir)], f"loading the program for {self.name}")
            for function, pin in PROGRAM_PINS.items():
                if (loaded / function).exists():
                    run_tool(["bpftool", "prog", "pin", "pinned", str(loaded / function), str(self.pin_dir / pin)],
                             f"pinning {function} of {self.name}")
        except BaseException:  # a tool's refusal, or Ctrl-C/SIGTERM midway: no half-loaded pins are left behind
            shutil.rmtree(self.pin_dir, ignore_errors=True)
            raise
        finally:
            shutil.rmtree(loaded, ignore_errors=True)
        return self

    def load_xdp(self) -> Path:
        """The classifier's XDP build, loaded on this copy's pinned maps (one set of tables for both hooks) and pinned
        beside its tc program; its pin."""
        pin = self.pin_dir / XDP_PIN
        maps = [m for m in sorted(self.pin_dir.iterdir()) if m.name not in (*PROGRAM_PINS.values(), XDP_PIN)]
        run_tool(["bpftool", "prog", "load", str(build(program=CLASSIFIER_XDP)), str(pin), "type", "xdp",
                  *(arg for m in maps for arg in ("map", "name", m.name, "pinned", str(m)))],
                 f"loading the XDP classifier for {self.name}")
        return pin

    def attach(self, iface: str, netns: str | None = None) -> None:
        """Run the program on every packet arriving at `iface` (leaving it, for the classifier), in network
        namespace `netns` if given: a name under /run/netns or a path such as /proc/<pid>/ns/net."""
        prefix = in_netns(netns)
        if has_clsact(iface, netns):
            remove_filters(iface, self.program.hook, netns)
        else:
            run_tool(prefix + ["tc", "qdisc", "add", "dev", iface, "clsact"], f"clsact on {iface}")
        run_tool(prefix + ["tc", "filter", "add", "dev", iface, self.program.hook, "bpf", "direct-action",
                           "object-pinned", str(self.program_pin)], f"attaching to {iface}")
        self.attached.append(iface if not netns else f"{netns}:{iface}")

    def add_mirror_link(self) -> int:
        """Make the mirror link; returns the ifindex of its switch side (settings.controller_ifindex)."""
        switch_side = mirror_link_of(self.name)[0]
        run_tool(["ip", "link", "add", switch_side, "type", "veth", "peer", "name", self.mirror_iface],
                 f"mirror link of {self.name}")
        self.mirror_link = True
        for iface in (switch_side, self.mirror_iface):
            subprocess.run(["sysctl", "-qw", f"net.ipv6.conf.{iface}.disable_ipv6=1"], capture_output=True)
            run_tool(["ip", "link", "set", iface, "up"], f"bringing {iface} up")
        return socket.if_nametoindex(switch_side)

    def serve(self, ports: Sequence[str], mirror_ifindex: int = 0, memcached_ports: Sequence[int] = (11211,),
              flood_ports: Sequence[str] | None = None) -> None:
        """Fill the ports, settings and memcached ports tables (the driver adds each configured server's port), then
        attach to every port (root namespace); floods go out of `flood_ports` (default: every port; fewer keep
        a topology with cycles loop-free)."""
        from dataplanes.bpf.tables import Tables  # here: tables needs the bpf syscall, building does not
        tables = Tables(self.pin_dir)
        try:  # before the first port: a frame for an unknown MAC, flooded to an empty ports table, would be lost
            tables.set_ports([socket.if_nametoindex(p) for p in (ports if flood_ports is None else flood_ports)])
            tables.set_settings(mirror_ifindex)
            tables.add_memcached_ports(memcached_ports)
        finally:
            tables.close()
        for port in ports:
            self.attach(port)

    def unload(self) -> None:
        if self.mirror_link:
            subprocess.run(in_netns(self.mirror_netns) + ["ip", "link", "del", mirror_link_of(self.name)[0]],
                           capture_output=True)
            self.mirror_link = False
        for entry in self.attached:
            netns, _, iface = entry.rpartition(":")
            detach(iface, self.program.hook, netns)
        self.attached.clear()
        shutil.rmtree(self.pin_dir, ignore_errors=True)



def detach(iface: str, hook: str, netns: str | None = None) -> None:
    """Remove the filters at `hook` of `iface`, and its clsact qdisc if neither hook holds one then (a gone
    interface: nothing to do)."""
    remove_filters(iface, hook, netns)
    remove_empty_clsact(iface, netns)


def tc_filters(iface: str, hook: str, netns: str | None = None) -> list[dict]:
    """The tc filters at `hook` (ingress, egress) of `iface`, as tc shows them ([]: none, or no such interface)."""
    shown = subprocess.run(in_netns(netns) + ["tc", "-j", "filter", "show", "dev", iface, hook], capture_output=True,
                           text=True, timeout=TC_TIMEOUT)
    return json.loads(shown.stdout or "[]") if shown.returncode == 0 else []


def remove_filters(iface: str, hook: str, netns: str | None = None, pref: int | None = None) -> None:
    """Remove the tc filters at `hook` of `iface`: those of priority `pref` only, if given (a gone interface, or no
    such filter: nothing to do)."""
    subprocess.run(in_netns(netns) + ["tc", "filter", "del", "dev", iface, hook] +
                   (["pref", str(pref)] if pref is not None else []), capture_output=True, timeout=TC_TIMEOUT)


def has_clsact(iface: str, netns: str | None = None) -> bool:
    """Whether `iface` has a clsact qdisc (False for an interface that is not there)."""
    shown = subprocess.run(in_netns(netns) + ["tc", "-j", "qdisc", "show", "dev", iface], capture_output=True,
                           text=True, timeout=TC_TIMEOUT)
    return shown.returncode == 0 and any(q.get("kind") == "clsact" for q in json.loads(shown.stdout or "[]"))


def remove_empty_clsact(iface: str, netns: str | None = None) -> None:
    """Remove the clsact qdisc of `iface` if neither of its hooks holds a filter (the operator's stay, and it too)."""
    if not tc_filters(iface, "ingress", netns) and not tc_filters(iface, "egress", netns):
        subprocess.run(in_netns(netns) + ["tc", "qdisc", "del", "dev", iface, "clsact"], capture_output=True,
                       timeout=TC_TIMEOUT)


def in_netns(netns: str | None) -> list[str]:
    """The command prefix that runs a tool in network namespace `netns` (a name under /run/netns, or a path) and
    nothing else: not `ip netns exec`, which remounts /sys and so hides the pinned programs from tc."""
    if not netns:
        return []
    return ["nsenter", f"--net={netns if netns.startswith('/') else NETNS_NAMES / netns}"]
