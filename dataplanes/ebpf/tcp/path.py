"""The eBPF switch's TCP path: the TCP splitter (src/splitter.c) behind one more port of the switch.

    switch ports --(steer.h: clients' segments to servers, servers' answers to the splitter's connections)-->
    <switch>-t  <-veth->  <switch>-ts (the splitter's side: no ARP, no address)  --> mb-splitter's sockets

The splitter's sockets live in the switch's network namespace. Two policy routes make that work without an address
of its own: whatever arrives on `<switch>-ts` is local (a listener on the memcached port takes a connection to any
server; the servers' answers reach the splitter's connections, which are made from the clients' own addresses), and
whatever the splitter sends (its sockets carry the path's mark) leaves by `<switch>-ts`, into the switch, where the
pipeline reads it as any client's request and gives it its destination's MAC. Everything is named after the switch
and undone by stop(); the splitter is stopped by PID.
"""
from __future__ import annotations

import json
import logging
import select
import subprocess
import threading
from pathlib import Path
from typing import Sequence

from dataplanes.bpf.program import DataPlane, DataPlaneError, in_netns
from mbalancer.processes import stop_process

log = logging.getLogger(__name__)

HERE = Path(__file__).resolve().parent
SOURCES = sorted((HERE / "src").glob("*.[ch]"))
SPLITTER = HERE / "build" / "mb-splitter"
TABLE_BASE = 0x4D420000  # policy routing tables (and the sockets' mark): base + 2 * ifindex of the splitter's side
RULE_PREFERENCE = 1000  # before the main table's rule (32766)
STARTED_WITHIN = 10.0  # seconds the splitter may take to listen


def build(force: bool = False) -> Path:
    """gcc the splitter if it is missing or older than a source (also of the BPF structs it shares); its path."""
    shared = HERE.parent.parent / "bpf" / "src" / "structs.h"
    if not force and SPLITTER.exists() and all(s.stat().st_mtime <= SPLITTER.stat().st_mtime
                                               for s in [*SOURCES, shared]):
        return SPLITTER
    SPLITTER.parent.mkdir(exist_ok=True)
    result = subprocess.run(["gcc", "-O2", "-g", "-Wall", "-Wextra", "-Werror", "-o", str(SPLITTER),
                             *(str(s) for s in SOURCES if s.suffix == ".c"), "-lbpf"], capture_output=True, text=True)
    if result.returncode:
        raise DataPlaneError(f"compiling the TCP splitter: {result.stderr.strip()}")
    return SPLITTER


def link_of(switch: str) -> tuple[str, str]:
    """The path's two ends: (the switch's port, the splitter's side)."""
    return f"{switch}-t", f"{switch}-ts"


class TcpPath:
    """The TCP path of one loaded switch, in network namespace `netns` (None: this one); with `splitter_netns`, its
    splitter runs there, its side of the link moved in (a Mininet fabric's box: one namespace per box, as one kernel
    per box in a real fabric, where the switches' own namespace holds several)."""

    def __init__(self, plane: DataPlane, memcached_ports: Sequence[int], netns: str | None = None,
                 splitter_netns: str | None = None):
        self.plane, self.ports, self.netns = plane, tuple(memcached_ports), netns
        self.splitter_netns = splitter_netns
        self.where = splitter_netns or netns  # the splitter's namespace: its side, its routes, its sockets
        self.port, self.side = link_of(plane.name)
        self.process: subprocess.Popen | None = None
        self.table = 0

    def start(self, log_file: Path | None = None) -> "TcpPath":
        """Make the path and start the splitter: a child of this process logging here, or (`log_file`) one of its
        own session logging there, which outlives this process (`mbalancer switch attach`; stopped by PID)."""
        try:
            self._link()
            self._routes()
            self._start_splitter(log_file)
        except Exception:
            self.stop()
            raise
        return self

    def _ip(self, *args: str, what: str, in_switch: bool = False) -> str:
        """`ip ARGS` in the splitter's namespace (`in_switch`: the switch's); its output."""
        result = subprocess.run(in_netns(self.netns if in_switch else self.where) + ["ip", *args],
                                capture_output=True, text=True)
        if result.returncode:
            raise DataPlaneError(f"TCP path of {self.plane.name}: {what}: {result.stderr.strip()}")
        return result.stdout

    def _sysctl(self, netns: str | None, setting: str) -> None:
        subprocess.run(in_netns(netns) + ["sysctl", "-qw", setting], capture_output=True)

    def _link(self) -> None:
        self._ip("link", "add", self.port, "type", "veth", "peer", "name", self.side, what="its veth pair",
                 in_switch=True)
        if self.splitter_netns:
            self._ip("link", "set", self.side, "netns", self.splitter_netns, what="the splitter's side moved",
                     in_switch=True)
        self._sysctl(self.netns, f"net.ipv6.conf.{self.port}.disable_ipv6=1")
        self._sysctl(self.where, f"net.ipv6.conf.{self.side}.disable_ipv6=1")
        self._ip("link", "set", self.side, "arp", "off", "up", what="the splitter's side up")
        self._ip("link", "set", self.port, "up", what="the switch's side up", in_switch=True)
        self._sysctl(self.where, f"net.ipv4.conf.{self.side}.rp_filter=0")
        self.plane.attach(self.port, self.netns)
        port, mac, netns_id = self._read_link()
        from dataplanes.bpf.tables import Tables  # here: tables needs the bpf syscall, building does not
        tables = Tables(self.plane.pin_dir)
        try:
            tables.set_tcp_path(port, mac, self.table, netns_id)  # the splitter marks its sockets with its table
        finally:
            tables.close()

    def _read_link(self) -> tuple[int, str, int]:
        """The switch side's ifindex, the splitter side's MAC, and the splitter's namespace as the switch's numbers
        it (-1: the same)."""
        port = json.loads(self._ip("-j", "link", "show", "dev", self.port, what="its port", in_switch=True))[0]
        side = json.loads(self._ip("-j", "link", "show", "dev", self.side, what="its side"))[0]
        self.table = TABLE_BASE + 2 * port["ifindex"]
        return port["ifindex"], side["address"], port["link_netnsid"] if self.splitter_netns else -1

    def _routes(self) -> None:
        incoming, outgoing = self.table, self.table + 1
        self._ip("route", "add", "local", "0.0.0.0/0", "dev", "lo", "table", str(incoming), what="its local route")
        self._ip("rule", "add", "iif", self.side, "lookup", str(incoming), "pref", str(RULE_PREFERENCE),
                 what="the rule for what reaches the splitter")
        self._ip("route", "add", "default", "dev", self.side, "table", str(outgoing), what="its route out")
        self._ip("rule", "add", "fwmark", str(self.table), "lookup", str(outgoing), "pref", str(RULE_PREFERENCE),
                 what="the rule for what the splitter sends")

    def _start_splitter(self, log_file: Path | None) -> None:
        command = in_netns(self.where) + [str(build()), str(self.plane.pin_dir), str(self.table),
                                          *(str(p) for p in self.ports)]
        errors = open(log_file, "a") if log_file else subprocess.PIPE
        try:
            self.process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=errors,
                                            text=True, start_new_session=log_file is not None)
        finally:
            if log_file:
                errors.close()
        ready = select.select([self.process.stdout], [], [], STARTED_WITHIN)[0]
        if not ready or self.process.stdout.readline().strip() != "ready":
            try:
                self.process.wait(timeout=1 if ready else 0.01)  # its stdout closed: it is ending
            except subprocess.TimeoutExpired:
                pass
            why = "" if self.process.poll() is None else \
                self.process.stderr.read() if log_file is None else _last_line(log_file)
            raise DataPlaneError(f"TCP path of {self.plane.name}: the splitter did not start: "
                                 f"{why.strip().splitlines()[-1] if why.strip() else 'no word from it'}"
                                 + (f" (its log: {log_file})" if log_file else ""))
        log.info("TCP path of %s: splitter %d on ports %s", self.plane.name, self.process.pid,
                 ",".join(map(str, self.ports)))
        if log_file is None:
            threading.Thread(target=self._relay_log, args=(self.process,), name=f"mb-splitter-{self.plane.name}",
                             daemon=True).start()

    def working_pid(self) -> int | None:
        """The splitter itself: the child its supervisor (self.process) runs now (None: none at the moment)."""
        return splitter_child(self.process.pid) if self.process is not None else None

    @staticmethod
    def _relay_log(process: subprocess.Popen) -> None:
        """The splitter's lines into this log (read to the end: a full pipe would stop the splitter)."""
        for line in process.stderr:
            log.info("%s", line.rstrip())

    def stop(self) -> None:
        if self.process is not None:
            stop_process(self.process)
            self.process = None
        remove(self.plane.name, self.table, self.netns, self.where)
        self.table = 0


def splitter_child(supervisor: int) -> int | None:
    """The splitter process a supervisor runs now (None: none): the process whose parent it is (by /proc/N/stat:
    /proc/N/task/N/children needs a kernel option not every kernel has)."""
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == supervisor:
                return int(entry.name)
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
    return None


def _last_line(log_file: Path) -> str:
    """The log's last line (the splitter's own words for why it ended), or ""."""
    try:
        lines = log_file.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return lines[-1] if lines else ""


def remove(switch: str, table: int = 0, netns: str | None = None, splitter_netns: str | None = None) -> list[str]:
    """Undo what a TCP path made for `switch` in `netns` (its routing `table`, in `splitter_netns` if its splitter
    ran elsewhere; 0: found from its rule, as after a killed run; the splitter is stopped by its starter): what was
    there, in words."""
    removed = []
    port, side = link_of(switch)
    prefix = in_netns(splitter_netns or netns)
    if not table:
        rules = subprocess.run(prefix + ["ip", "rule", "show", "iif", side], capture_output=True, text=True).stdout
        found = rules.split("lookup ")[1].split()[0] if "lookup " in rules else ""
        table = int(found) if found.isdigit() else 0
    if table:
        for rule in (["iif", side, "lookup", str(table)], ["fwmark", str(table), "lookup", str(table + 1)]):
            subprocess.run(prefix + ["ip", "rule", "del", *rule], capture_output=True)
        for number in (table, table + 1):
            subprocess.run(prefix + ["ip", "route", "flush", "table", str(number)], capture_output=True)
        removed.append(f"the TCP path's routes (tables {table}, {table + 1})")
    if subprocess.run(in_netns(netns) + ["ip", "link", "del", port], capture_output=True).returncode == 0:
        removed.append(f"the TCP path's link {port}/{side}")
    return removed
