"""Data-plane drivers by name (`mbalancer controller --driver NAME`)."""
from __future__ import annotations

from controller.driver import Driver

DRIVERS = ("ebpf", "none")  # P4Runtime and OpenFlow follow


def make_driver(name: str) -> Driver:
    """A driver by name; ValueError naming the choices for an unknown one."""
    if name == "ebpf":
        return _ebpf_driver()
    if name == "none":
        from controller.drivers.recording import RecordingDriver
        return RecordingDriver()
    raise ValueError(f"unknown driver {name!r} (choose from {', '.join(DRIVERS)})")


def _ebpf_driver() -> Driver:
    """Every eBPF switch loaded on this machine (pinned under /sys/fs/bpf/mbalancer/), with its mirror link
    `<switch>-mc` where there is one (topologies/mininet_switch.py and topologies/netns.py make them)."""
    from pathlib import Path

    from controller.drivers.ebpf import EbpfDriver
    from topologies.ebpf.program import PIN_ROOT
    switches = sorted(p for p in PIN_ROOT.glob("*") if (p / "prog").exists()) if PIN_ROOT.exists() else []
    if not switches:
        raise ValueError(f"no eBPF switch is loaded (nothing under {PIN_ROOT}): start a topology first")
    mirrors = [f"{p.name}-mc" for p in switches if Path(f"/sys/class/net/{p.name}-mc").exists()]
    return EbpfDriver(switches, mirrors)
