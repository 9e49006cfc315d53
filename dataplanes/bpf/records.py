"""What `mbalancer switch attach` made on this box, for `detach` to remove: one JSON record per eBPF switch
(dataplanes/ebpf/standalone.py) or key classifier (dataplanes/openflow/standalone.py), written before anything is made,
and the last step every detach ends with (the pins, then the record).
"""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, TypeVar

from dataplanes.bpf.program import DataPlane

RECORDS = Path("/run/mbalancer/switches")  # /run: gone after a reboot, as the programs and their pins are
T = TypeVar("T")


def read_record(path: Path, parse: Callable[[dict], T]) -> T | None:
    """The record in the JSON file `path`, made by `parse` from its fields; None where there is none, or what is
    there is not one (cut short, of another version, not JSON)."""
    try:
        return parse(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_record(path: Path, record: Any) -> None:
    """Write `record` (a dataclass) as the JSON file `path` under RECORDS."""
    RECORDS.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(asdict(record)) + "\n")


def unload_and_forget(plane: DataPlane, record: Path) -> list[str]:
    """Unload `plane` (what the caller set on it to remove: hooks, the mirror link; then its pins) and delete its
    `record`; what was removed of the pins and the record, in words."""
    removed = [f"the pins under {plane.pin_dir}"] if plane.pin_dir.exists() else []
    plane.unload()
    if record.exists():
        record.unlink()
        removed.append("its record")
    return removed
