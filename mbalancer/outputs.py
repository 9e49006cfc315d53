"""Output folders: checked before a long run starts, so a typo in --out costs a line, not the run."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path


def output_problem(folder: Path) -> str | None:
    """None if `folder` exists or can be made and a file can be written in it; else why not, in a few words."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        return f"cannot make {folder}: {err.strerror or err}"
    if not folder.is_dir():
        return f"{folder} is not a folder"
    try:
        handle, probe = tempfile.mkstemp(prefix=".mbalancer-probe-", dir=folder)
        os.close(handle)
        os.unlink(probe)
    except OSError as err:
        return f"cannot write in {folder}: {err.strerror or err}"
    return None
