"""`mbalancer monitor`: the hot keys of live traffic (--iface), of a capture file (--pcap) or of a switch's own
sketch (--source dataplane, monitor/dataplane.py), per interval. With a --config whose data plane counts gets
itself (an eBPF switch, the OpenFlow data plane's key classifier, a P4 switch), the sketch is the default: it sees
every get at no cost to this process, where a capture must copy each one out of the kernel. A P4 switch's sketch is
read through the controller ([controller] listen, POST /sketch): its digests reach only the P4Runtime primary.

Output: with --json, one JSON object per interval on stdout, the report that mbalancer/monitor_report.py defines
field by field (FIELDS there; `mbalancer monitor --help` lists them); --push URL POSTs the same object to the
controller. Live capture says on stderr when it is listening ("capturing on ..."), so scripts can wait for it.
Exit 2 for bad options or an unreadable --pcap or --iface.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path
from typing import Callable

from dataplanes.bpf.program import CLASSIFIER, PIN_ROOT, bpffs_problem, loaded_switches
from dataplanes.bpf.tables import Tables
from monitor.capture import CaptureError, LiveCapture
from monitor.controller_sketch import ControllerSketch, SketchUnavailable
from monitor.dataplane import SKETCH_KINDS, SketchReader
from monitor.follow import GRACE, SwitchFollower, SwitchState
from monitor.sampling import AdaptiveSampling
from mbalancer.config import AUTO_REPORT_KEYS, Balancing, ConfigError, Monitoring, config_option
from mbalancer.monitor_report import FIELDS
from mbalancer.packets import SUPPORTED_LINKTYPES
from mbalancer.processes import stop_on_signals
from monitor.monitor import Monitor
from monitor.outputs import Credentials, Fanout, HttpPush, JsonLines, url_problem
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
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--iface", help="capture live on this interface, or on several: a,b,c (each request is "
                                        "counted where it arrives; needs root)")
    source.add_argument("--pcap", help="read a pcap or pcapng file; intervals follow its timestamps")
    source.add_argument("--source", choices=("dataplane",),
                        help="dataplane: read the hot keys the switch counts itself (count-min sketch in the "
                             "data plane, no packet copied; eBPF: needs root, --switch says which; P4: through the "
                             "controller of --config, no root). The default with a --config whose dataplane.kind is "
                             "ebpf, openflow or p4")
    parser.add_argument("--switch", help="--source dataplane: the eBPF switch's (or OpenFlow key classifier's) name "
                                         "(default: the config's first [dataplane.ebpf] switch or its "
                                         "dataplane.openflow.classifier, or the only one loaded)")
    parser.add_argument("--config", type=Path,
                        help="MBalancer config (TOML): the options below default to it (port: its servers'; interval "
                             "and capacity: [monitor]; top: balancing.hot; push: controller.listen's /report)")
    parser.add_argument("--port", type=int, help="memcached port (default 11211; --iface and --pcap)")
    parser.add_argument("--sample", help="live: keep 1 in K requests, in the kernel; auto (the default): every one "
                                         "while the monitor keeps up, 1 in as many as it takes once the socket drops "
                                         "requests (monitor/sampling.py)")
    parser.add_argument("--interval", type=float, help="seconds per report (default 1)")
    parser.add_argument("--top", type=int, help=f"hot keys per report, H (default 10; {AUTO_REPORT_KEYS} with "
                                                f"hot = \"auto\" in --config)")
    parser.add_argument("--capacity", type=int,
                        help="keys the summary tracks: sets the memory, not the number of distinct keys (default 1024)")
    parser.add_argument("--duration", type=float, help="live: stop after this many seconds (default: until Ctrl-C)")
    parser.add_argument("--switch-grace", type=float, default=GRACE, metavar="SECONDS",
                        help="--source dataplane, eBPF: how long the switch may stay detached (a restart, detach then "
                             "attach) before the monitor exits 1 for its supervisor to start it again (default "
                             f"{GRACE:g}); a switch back in time is read again (monitor/follow.py)")
    parser.add_argument("--json", action="store_true", help="one JSON object per interval instead of the table")
    parser.add_argument("--push", metavar="URL", action="append",
                        help="POST each report as JSON to this URL (the controller); again for each controller of a "
                             "failover group: reports go to the one that leads (the others do not listen); with "
                             "--config, its [controller] token_file and tls_* are sent as the controller asks them")
    parser.set_defaults(run=_run_monitor, fail=parser.error)


def _run_monitor(args: argparse.Namespace, fail: Fail) -> int:
    _apply_config(args, fail)
    _read_sample(args, fail)
    if not 0 < args.port < 65536:
        fail(f"--port must be 1-65535 (got {args.port})")
    if args.sample < 1 or args.top < 1 or args.capacity < args.top or not args.interval > 0:
        fail("--sample and --top must be at least 1, --capacity at least --top, --interval positive")
    if args.pcap and args.sample_given:
        fail("--sample applies to live capture only (the kernel samples); a pcap is read whole")
    if args.duration is not None and not args.duration > 0:
        fail(f"--duration must be positive (got {args.duration})")
    if not args.switch_grace > 0:
        fail(f"--switch-grace must be positive (got {args.switch_grace:g})")
    for url in args.push or ():
        if problem := url_problem(url):
            fail(f"--push: {problem}")
    if args.switch and not args.source:
        fail("--switch goes with --source dataplane")
    view = None if args.json else TerminalView(source=args.iface or args.pcap or
                                                       (f"switch {args.switch}" if args.switch else "the switch"))
    push = HttpPush(args.push, credentials=args.credentials) if args.push else None
    report_to = Fanout(view or JsonLines(), *([push] if push else []))
    if args.source:
        return _run_dataplane(args, report_to, view, push, fail)
    monitor = Monitor(report_to, port=args.port, top=args.top,
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


def _run_dataplane(args: argparse.Namespace, report_to: Fanout, view: TerminalView | None,
                   push: HttpPush | None, fail: Fail) -> int:
    if args.sample_given:
        fail("--sample applies to live capture only: the switch counts every get")
    follower = None  # a P4 switch read through its controller: the controller follows the switch
    if args.through_controller:
        args.switch, tables = f"p4 (through the controller at {args.through_controller})", \
            ControllerSketch(args.through_controller, args.credentials)
    elif os.geteuid() != 0:
        fail("--source dataplane needs root (it reads the switch's BPF maps)")
    else:
        args.switch, tables = _open_switch(args.switch, fail)
        follower = SwitchFollower(args.switch, tables, args.switch_grace)
    try:
        return _read_sketch(args, SketchReader(tables, args.top, args.interval), follower, report_to, view, push)
    except SketchUnavailable as err:
        print(f"mbalancer monitor: {err}", file=sys.stderr)
        return 1


def _read_sketch(args: argparse.Namespace, reader: SketchReader, follower: SwitchFollower | None, report_to: Fanout,
                 view: TerminalView | None, push: HttpPush | None) -> int:
    stopping = stop_on_signals()
    keys = KeyReader(view.key, stopping.set).start() if view else None
    until = time.monotonic() + (args.duration if args.duration else float("inf"))
    reader.start()
    print(f"mbalancer monitor: {READY} switch {args.switch} (its data plane counts the gets)", file=sys.stderr,
          flush=True)
    state = SwitchState.ATTACHED
    try:
        next_at = time.monotonic() + args.interval
        while state is not SwitchState.LOST and not stopping.wait(max(min(next_at, until) - time.monotonic(), 0)) \
                and time.monotonic() < until:
            state = _end_interval(reader, follower, report_to)
            next_at += args.interval
        if state is not SwitchState.LOST:
            state = _end_interval(reader, follower, report_to)  # the last, partial interval
    finally:
        try:
            reader.stop()
        except SketchUnavailable as err:  # the controller went first: the switch stops counting without it
            log.warning("the sketch was not turned off: %s", err)
        reader.tables.close()
        if keys:
            keys.close()
    if state is SwitchState.LOST:
        return 1  # its one line said why
    totals = reader.totals
    print(f"mbalancer monitor: switch {args.switch}: {totals['gets']} gets counted in the data plane, "
          f"{totals['reports']} reports" + (f", {push.sent} pushed, {push.failed} failed pushes" if push else ""),
          file=sys.stderr)
    if not totals["gets"]:
        print(f"mbalancer monitor: no get was counted: do the clients' gets pass through switch {args.switch}, to a "
              f"port it knows as memcached's (mbalancer switch status)?", file=sys.stderr)
    return 0


def _end_interval(reader: SketchReader, follower: SwitchFollower | None, report_to: Fanout) -> SwitchState:
    """Look at the switch first (the maps held open may be a detached program's), then report what its sketch
    counted: nothing while it is gone, so the controller keeps its hot keys for its return instead of cooling them on
    zeros; after a reattach the sketch is turned on in the new maps and counts from now."""
    state = follower.look() if follower else SwitchState.ATTACHED
    if follower and follower.said:
        print(f"mbalancer monitor: {follower.said}", file=sys.stderr, flush=True)
    if state is SwitchState.REATTACHED:
        reader.tables = follower.tables
        reader.start()
    elif state is SwitchState.ATTACHED:
        report_to(reader.read().to_json())
    return state


def _open_switch(name: str | None, fail: Fail) -> tuple[str, Tables]:
    """The name and tables of the switch (or key classifier) to read, or fail() saying why not."""
    if problem := bpffs_problem():
        fail(problem)
    loaded = {switch: root for root in (CLASSIFIER.pin_root, PIN_ROOT) for switch in loaded_switches(root)}
    if not name:
        if len(loaded) != 1:
            fail(f"--switch: {len(loaded)} eBPF switches are loaded ({', '.join(loaded) or 'none'}): name one")
        name = next(iter(loaded))
    if name not in loaded:
        fail(f"--switch: no eBPF switch named {name} is loaded (loaded: {', '.join(loaded) or 'none'})")
    pins = loaded[name] / name
    if not (pins / "sketch_control").exists():
        fail(f"--switch: {name} was loaded by an older MBalancer without the sketch: detach and attach it again")
    try:
        tables = Tables(pins)
    except OSError as err:
        fail(f"--switch: cannot open {name}'s tables: {err}")
    return name, tables


def _read_sample(args: argparse.Namespace, fail: Fail) -> None:
    """--sample K (fixed), auto or none (adaptive, starting at 1): args.sample the k to start with, args.adaptive."""
    args.sample_given = args.sample not in (None, "1")  # sampling asked for (live capture only)
    args.adaptive = args.sample in (None, "auto")
    if args.adaptive:
        args.sample = 1
        return
    if not args.sample.isdigit() or int(args.sample) < 1:
        fail(f"--sample: a whole number of at least 1, or auto (got {args.sample!r})")
    args.sample = int(args.sample)


def _apply_config(args: argparse.Namespace, fail: Fail) -> None:
    """Fill the options not given from --config, then from the built-in defaults."""
    config = config_option(args.config, fail) if args.config else None
    kind = config.dataplane.kind if config else None
    try:  # the controller's credentials, sent with every push and sketch call
        args.credentials = Credentials.of(config.controller) if config else Credentials()
    except ConfigError as err:
        fail(f"--config: {err}")
    controller = f"{args.credentials.scheme}://{config.controller.listen}" if config else None
    if not (args.iface or args.pcap or args.source):
        if kind not in SKETCH_KINDS:
            fail("give --iface (live capture), --pcap or --source dataplane (with a --config whose dataplane.kind is "
                 f"{' or '.join(SKETCH_KINDS)}, the switch's own sketch is the default)")
        args.source = "dataplane"
        log.info("source: the switch's own sketch (dataplane.kind = %s); --iface would capture instead", kind)
    args.through_controller = controller if args.source and kind == "p4" else None
    if args.through_controller and args.switch:
        fail("--switch: a P4 switch's sketch is read through the controller of --config ([dataplane.p4] says which)")
    if args.source and config and not args.switch:
        settings = config.dataplane.settings
        if kind == "ebpf":
            args.switch = settings.switches[0] if settings and settings.switches else None
        elif kind == "openflow":
            args.switch = settings.classifier if settings else None
    if args.port is None and config and not args.source:  # the switch knows every server's port
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
        args.push = [f"{controller}/report"]


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
    adaptive = AdaptiveSampling(capture) if args.adaptive else None
    monitor.resample = adaptive
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
    if adaptive and adaptive.range != (1, 1):
        sampling = f" and adaptive sampling, 1 in {adaptive.range[0]} to 1 in {adaptive.range[1]}"
    else:
        sampling = f" and 1-in-{args.sample} sampling" if args.sample > 1 else ""
    return (f"captured {capture.received} requests on {args.iface} (after the kernel filter{sampling}), "
            f"{capture.dropped} dropped by the kernel")
