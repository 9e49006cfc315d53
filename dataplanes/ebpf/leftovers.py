"""What a killed run of the eBPF data plane left, named after its switch: the pins and the mirror link (the BPF
toolkit's), and the TCP path's link and routes (the registry's leftovers hook)."""
from __future__ import annotations

from dataplanes.bpf.program import remove_left_over as remove_program
from dataplanes.ebpf.tcp.path import remove as remove_tcp_path


def remove_left_over(name: str) -> list[str]:
    return remove_program(name) + remove_tcp_path(name)
