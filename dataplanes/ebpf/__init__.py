"""The eBPF data plane: a tc (clsact ingress) program on every port of a Linux switch, its tables in BPF maps.

bpf/            the program in C, split Katran-style: structs.h, maps.h, parse.h, rewrite.h, sketch.h, mbalancer.bpf.c
program.py      build (clang, at install), load and pin per switch (bpftool), attach to ports (tc), unload
bpf_syscall.py  the bpf(2) calls the control side needs, through ctypes (microseconds per map write)
tables.py       the control library: every map of maps.h read and written through one class
standalone.py   a switch on this machine's own interfaces: `mbalancer switch attach | detach | status`

Its driver is controller/drivers/ebpf.py; its switch nodes are topologies/mininet_switch.py (Mininet) and
topologies/netns.py (plain namespaces).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Settings:
    """The config's [dataplane.ebpf] section."""
    switches: tuple[str, ...] = ()  # names of the loaded switches to drive; empty: every one loaded on this machine
    ports: tuple[str, ...] = ()  # this machine's interfaces `mbalancer switch attach` puts the switch on
