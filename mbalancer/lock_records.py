"""A small JSON record kept in a file whose flock says who holds something (mbalancer/ownership.py: a switch's
controller; topologies/claim.py: the machine's test network): written whole by the holder, read by anyone."""
from __future__ import annotations

import json
import os

MAX_RECORD = 1 << 20  # bytes read at most


def write_record(fd: int, record: dict) -> None:
    """Replace the file's record (the holder's only)."""
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(record).encode(), 0)


def read_record(fd: int) -> dict:
    """The file's record; {} if it has none, or it is being written this very moment."""
    try:
        record = json.loads(os.pread(fd, MAX_RECORD, 0) or b"{}")
    except ValueError:
        return {}
    return record if isinstance(record, dict) else {}
