"""`mbalancer monitor`: the hot keys of live traffic (--iface) or of a capture file (--pcap), per interval.

Output: with --json, one JSON object per interval on stdout, the report that mbalancer/monitor_report.py defines
field by field (FIELDS there; `mbalancer monitor --help` lists them); --push URL POSTs the same object to the
controller. Live capture says on stderr when it is listening ("capturing on ..."), so scripts can wait for it.
Exit 2 for bad options or an unreadable --pcap or --iface.
"""
from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path
from typing import Callable

from monitor.capture import CaptureError, LiveCapture
from mbalancer.config import AUTO_REPORT_KEYS, Balancing, Monitoring, config_option
from mbalancer.monitor_report import FIELDS
from mbalancer.packets import SUPPORTED_LINKTYPES
from mbalancer.processes import stop_on_signals
from monitor.monitor import Monitor
from monitor.outputs import Fanout, HttpPush, JsonLines, url_problem
from monitor.terminal import KeyReader, TerminalView
from monitor.pcapfile import CaptureFile, PcapError

log = logging.getLogger(__name__)
READY = "capturing on"  # said on stderr once the live socket and its filter are in place
Fail = Callable[[str], None]


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "monitor", help="find the hot keys in live traffic or a capture file",
        description="Count memcached get requests per key (UDP and TCP) in bounded memory and report the top keys "
                    "every interval.",
        epilog="report fields (--json, --push): " + "; ".join(f"{name}: {text}" for name, text in FIELDS.items()))
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--iface", help="capture live on this interface, or on several: a,b,c (each request is "
                                        "counted where it arrives; needs root)")
    source.add_argument("--pcap", help="read a pcap or pcapng file; intervals follow its timestamps")
    parser.add_argument("--config", type=Path,
                        help="MBalancer config (TOML): the options below default to it (port: its servers'; interval "
                             "and capacity: [monitor]; top: balancing.hot; push: controller.listen's /report)")
    parser.add_argument("--port", type=int, help="memcached port (default 11211)")
    parser.add_argument("--sample", type=int, default=1, help="live: keep 1 in K requests, in the kernel (default 1)")
    parser.add_argument("--interval", type=float, help="seconds per report (default 1)")
    parser.add_argument("--top", type=int, help=f"hot keys per report, H (default 10; {AUTO_REPORT_KEYS} with "
                                                f"hot = \"auto\" in --config)")
    parser.add_argument("--capacity", type=int,
                        help="keys the summary tracks: sets the memory, not the number of distinct keys (default 1024)")
    parser.add_argument("--duration", type=float, help="live: stop after this many seconds (default: until Ctrl-C)")
    parser.add_argument("--json", action="store_true", help="one JSON object per interval instead of the table")
    parser.add_argument("--push", metavar="URL", help="POST each report as JSON to this URL (the controller)")
    parser.set_defaults(run=_run_monitor, fail=parser.error)


def _run_monitor(args: argparse.Namespace, fail: Fail) -> int:
    _apply_config(args, fail)
    if not 0 < args.port < 65536:
        fail(f"--port must be 1-65535 (got {args.port})")
    if args.sample < 1 or args.top < 1 or args.capacity < args.top or not args.interval > 0:
        fail("--sample and --top must be at least 1, --capacity at least --top, --interval positive")
    if args.pcap and args.sample != 1:
        fail("--sample applies to live capture only (the kernel samples); a pcap is read whole")
    if args.duration is not None and not args.duration > 0:
        fail(f"--duration must be positive (got {args.duration})")
    if args.push and (problem := url_problem(args.push)):
        fail(f"--push: {problem}")
    view = None if args.json else TerminalView(source=args.iface or args.pcap)
    push = HttpPush(args.push) if args.push else None
    monitor = Monitor(Fanout(view or JsonLines(), *([push] if push else [])), port=args.port, top=args.top,
                      interval=args.interval, capacity=args.capacity, sample=args.sample)
    try:
        stats = _read_pcap(monitor, args.pcap) if args.pcap else _capture(monitor, args, view)
    except (PcapError, CaptureError) as err:
        fail(str(err))
    totals = monitor.totals
    print(f"mbalancer monitor: {stats}; {totals['gets']} gets counted, {totals['skipped']} skipped, "
          f"{totals['ignored']} other traffic, {totals['reports']} reports"
          + (f", {push.sent} pushed, {push.failed} failed pushes" if push else ""), file=sys.stderr)
    if not totals["gets"]:
        print(f"mbalancer monitor: no get was counted ({totals['ignored']} packets of other traffic, "
              f"{totals['skipped']} unreadable): do the clients send their gets to port {args.port} (--port)"
              + ("" if args.pcap else f", through {args.iface}") + "?", file=sys.stderr)
    return 0


def _apply_config(args: argparse.Namespace, fail: Fail) -> None:
    """Fill the options not given from --config, then from the built-in defaults."""
    config = config_option(args.config, fail) if args.config else None
    if args.port is None and config:
        ports = sorted({s.port for s in config.servers})
        if len(ports) > 1:
            fail(f"--config: the servers use ports {', '.join(map(str, ports))}; the monitor watches one: give --port")
        args.port = ports[0]
    monitoring = config.monitor if config else Monitoring()
    hot = config.balancing.hot if config else Balancing().hot
    for name, value in (("port", 11211), ("interval", monitoring.interval), ("capacity", monitoring.capacity),
                        ("top", hot if hot is not None else AUTO_REPORT_KEYS)):
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.push is None and config:
        args.push = f"http://{config.controller.listen}/report"


def _read_pcap(monitor: Monitor, path: str) -> str:
    capture = CaptureFile(path)
    last, packets = None, 0
    for timestamp, linktype, frame in capture:
        if linktype not in SUPPORTED_LINKTYPES:
            raise PcapError(f"{path}: link type {linktype} is not supported "
                            f"(supported: {', '.join(map(str, SUPPORTED_LINKTYPES))})")
        monitor.frame(timestamp, linktype, frame)
        last, packets = timestamp, packets + 1
    monitor.finish(last)
    return f"read {packets} packets from {path}" + (" (the last one cut short)" if capture.truncated else "")


def _capture(monitor: Monitor, args: argparse.Namespace, view: TerminalView | None) -> str:
    capture = LiveCapture(args.iface.split(","), args.port, args.sample)
    monitor.source_counters = capture.update_statistics  # each report says what the kernel dropped meanwhile
    until = time.monotonic() + (args.duration if args.duration else float("inf"))
    # Ctrl-C and SIGTERM end the capture between packets (not in the middle of writing a report)
    stopping = stop_on_signals()
    keys = KeyReader(view.key, stopping.set).start() if view else None  # q quits, r/c/k sort (a terminal only)
    print(f"mbalancer monitor: {READY} {args.iface}, port {args.port}", file=sys.stderr, flush=True)
    try:
        for timestamp, frame in capture.frames(until, wake_every=args.interval / 4, stop=stopping.is_set):
            if frame is None:
                monitor.advance(timestamp)
            else:
                monitor.frame(timestamp, capture.linktype, frame)
        monitor.finish(time.time())
    finally:
        if keys:
            keys.close()
        capture.close()
    sampling = f" and 1-in-{args.sample} sampling" if args.sample > 1 else ""
    return (f"captured {capture.received} requests on {args.iface} (after the kernel filter{sampling}), "
            f"{capture.dropped} dropped by the kernel")
