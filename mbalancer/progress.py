"""Progress lines for long-running commands, on stderr so stdout stays clean for results (--json)."""
from __future__ import annotations

import sys


def stderr_progress(line: str) -> None:
    """Progress on one rewritten terminal line (plain lines when stderr is not a terminal)."""
    end = "\r" if sys.stderr.isatty() else "\n"
    print(f"{line:<60}", end=end, file=sys.stderr, flush=True)


def end_progress() -> None:
    """Move past the rewritten line so what follows starts on a fresh one."""
    if sys.stderr.isatty():
        print(file=sys.stderr, flush=True)
