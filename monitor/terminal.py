"""The monitor's live table, like mctop: each interval's top keys next to the interval before, sortable from the
keyboard.

On a terminal the screen is redrawn each interval and keys act at once: `r` sorts by gets/s (the default), `c` by
the change since the previous interval, `k` by key, `q` quits (as Ctrl-C does). Elsewhere (a pipe, a file) each
report is printed as a table after the last one.
"""
from __future__ import annotations

import os
import select
import sys
import termios
import threading
import tty
from typing import Callable, TextIO

from mbalancer.memcache.keys import printable_key
from monitor.monitor import Report

SORTS = {"r": "gets/s", "c": "change", "k": "key"}
CLEAR = "\x1b[H\x1b[2J"


class TerminalView:
    def __init__(self, out: TextIO = sys.stdout, source: str = ""):
        self.out, self.source = out, source
        self.redraw = out.isatty()
        self.sort = "r"
        self.report: Report | None = None  # the latest, redrawn when the sort changes
        self.previous: dict[str, float] = {}  # gets/s of each key in the interval before it
        self.lock = threading.Lock()  # reports come from the capture loop, keys from the key reader

    def __call__(self, report: Report) -> None:
        with self.lock:
            if self.report is not None:
                self.previous = {hitter["key"]: hitter["rate"] for hitter in self.report["top"]}
            self.report = report
            self._draw()

    def key(self, char: str) -> bool:
        """React to a key; False for quit."""
        if char == "q":
            return False
        if char in SORTS:
            with self.lock:
                self.sort = char
                if self.report is not None:
                    self._draw()
        return True

    def lines(self) -> list[str]:
        report = self.report
        lines = [f"mbalancer monitor {self.source}  {report['rate']:,.0f} gets/s over {report['interval']:.2f} s  "
                 f"packets {report['packets']}  skipped {sum(report['skipped'].values())}  other traffic "
                 f"{report['ignored']}" + (f"  sample 1/{report['sample']}" if report["sample"] > 1 else ""),
                 f"{'#':>3} {'key':<40} {'gets/s':>12} {'before':>12} {'change':>9} {'share':>7} {'± gets':>9}"]
        for rank, hitter in enumerate(self._sorted(report["top"]), 1):
            before = self.previous.get(hitter["key"])
            change = "new" if before is None else f"{hitter['rate'] - before:+,.0f}"
            lines.append(f"{rank:>3} {printable_key(hitter['key'])[:40]:<40} {hitter['rate']:>12,.1f} "
                         f"{'-' if before is None else f'{before:,.1f}':>12} {change:>9} "
                         f"{100 * hitter['share']:>6.2f}% {hitter['error']:>9}")
        if self.redraw:
            lines.append(f"sorted by {SORTS[self.sort]}; keys: r gets/s, c change, k key, q quit")
        return lines

    def _sorted(self, top: list[dict]) -> list[dict]:
        if self.sort == "k":
            return sorted(top, key=lambda h: h["key"])
        if self.sort == "c":
            return sorted(top, key=lambda h: h["rate"] - self.previous.get(h["key"], 0.0), reverse=True)
        return sorted(top, key=lambda h: h["rate"], reverse=True)

    def _draw(self) -> None:
        text = "\n".join(self.lines())
        print(CLEAR + text if self.redraw else text + "\n", file=self.out, flush=True)


class KeyReader:
    """Reads single keys from a terminal's stdin in a thread (cbreak mode, restored at close) and hands each to
    `on_key`; when it returns False, calls `on_quit`. Does nothing where stdin is not a terminal."""

    def __init__(self, on_key: Callable[[str], bool], on_quit: Callable[[], None], stdin: TextIO = sys.stdin):
        self.on_key, self.on_quit, self.stdin = on_key, on_quit, stdin
        self.saved = None
        self.closed = threading.Event()

    def start(self) -> "KeyReader":
        if not self.stdin.isatty():
            return self
        self.saved = termios.tcgetattr(self.stdin)
        tty.setcbreak(self.stdin)
        threading.Thread(target=self._read, name="monitor-keys", daemon=True).start()
        return self

    def _read(self) -> None:
        fd = self.stdin.fileno()  # unbuffered: a buffered read could hold a key select() then never reports
        try:
            while not self.closed.is_set():
                if select.select([fd], [], [], 0.2)[0] and not self.on_key(os.read(fd, 1).decode(errors="replace")):
                    self.on_quit()
                    return
        except (OSError, ValueError):  # the terminal went away: no more keys, the monitor goes on
            return

    def close(self) -> None:
        self.closed.set()
        if self.saved is not None:
            termios.tcsetattr(self.stdin, termios.TCSADRAIN, self.saved)
            self.saved = None
