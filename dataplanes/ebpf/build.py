"""The eBPF data plane's build step (`make install` runs `python -m dataplanes build`): the program, and the TCP
splitter that runs beside it (dataplanes/ebpf/tcp/)."""
from __future__ import annotations

from pathlib import Path

from dataplanes.bpf import program
from dataplanes.ebpf.tcp import path


def build(force: bool = False) -> Path:
    """Both, if missing or older than their sources; the program's object."""
    built = program.build(force)
    path.build(force)
    return built
