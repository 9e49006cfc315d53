"""The key classifier on an Open vSwitch bridge of this box, put there by one command and removed by another
(`mbalancer switch attach | detach | status --dataplane openflow`), as dataplanes/ebpf/standalone.py does for the eBPF
switch: the switch agent (or `mbalancer controller` on the box) then drives the bridge and the classifier.

attach() records what it makes in RECORDS/<name>.classifier.json before making it: each hook (port, and tc direction
or XDP) and whether it made the port's clsact qdisc. The classifier goes in beside whatever tc filters the operator
has there (its own priority, PREF); a port's XDP hook holds one program, so one taken already is refused. detach()
removes exactly what attach made: its filters, the qdiscs it made that hold nothing else, its XDP programs (by id),
the pins and the record; also after an attach that failed half way.
"""
from __future__ import annotations

import json
import subprocess
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Sequence

from dataplanes.bpf.program import (CLASSIFIER, TC_TIMEOUT, XDP_PIN, DataPlane, DataPlaneError, has_clsact,
                                    loaded_switches, remove_empty_clsact, remove_filters, run_tool, tc_filters)
from dataplanes.bpf.records import RECORDS, read_record, unload_and_forget, write_record
from dataplanes.openflow.box import DATAPATHS, BoxError, Hook, OvsBox, plan
from dataplanes.openflow.classifier import fill
from mbalancer.interfaces import interface_exists

PREF = 49152  # the classifier's tc filter priority on each hook: the operator's own filters keep theirs


@dataclass(frozen=True)
class ClassifierRecord:
    name: str
    bridge: str
    datapath: str
    ovs_rundir: str
    memcached_ports: tuple[int, ...]
    hooks: tuple[Hook, ...]
    made_qdiscs: tuple[str, ...]  # the ports whose clsact qdisc attach made
    attached_unix: float

    @staticmethod
    def read(name: str) -> "ClassifierRecord | None":
        return read_record(record_path(name), lambda raw: ClassifierRecord(
            raw["name"], raw["bridge"], raw["datapath"], raw["ovs_rundir"], tuple(raw["memcached_ports"]),
            tuple(Hook(**h) for h in raw["hooks"]), tuple(raw["made_qdiscs"]), raw["attached_unix"]))

    def write(self) -> None:
        write_record(record_path(self.name), self)

    def summary(self) -> str:
        """What is attached, in one line."""
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.attached_unix))
        return (f"key classifier {self.name} is attached to bridge {self.bridge} ({DATAPATHS[self.datapath]}; ports "
                f"{', '.join(h.port for h in self.hooks)}) since {when}")


def record_path(name: str) -> Path:
    return RECORDS / f"{name}.classifier.json"


def attached_classifiers() -> list[str]:
    return sorted(p.name.removesuffix(".classifier.json") for p in RECORDS.glob("*.classifier.json")) \
        if RECORDS.exists() else []


def attach(name: str, bridge: str, rundir: str, memcached_ports: Sequence[int], datapath: str = "") \
        -> ClassifierRecord:
    """Load the classifier as `name` and hook it where it sees every frame entering `bridge` before the switch does
    (dataplanes/openflow/box.py). BoxError or DataPlaneError, one line, with nothing left behind, if it cannot."""
    DataPlane(name, CLASSIFIER)  # checks the name
    if (known := ClassifierRecord.read(name)) is not None:
        raise BoxError(f"{known.summary()} (mbalancer switch detach --dataplane openflow --name {name})")
    if name in loaded_switches(CLASSIFIER.pin_root):
        raise BoxError(f"a key classifier named {name} is loaded already, not by this command (the testbed's?)")
    others = [r for r in map(ClassifierRecord.read, attached_classifiers()) if r and r.bridge == bridge]
    if others:
        raise BoxError(f"bridge {bridge} has a key classifier already: {others[0].summary()}")
    kind, hooks = plan(OvsBox(rundir), bridge, datapath)
    if taken := [f"{h.port} (program {_xdp_id(h.port)})" for h in hooks if h.direction == "xdp" and _xdp_id(h.port)]:
        raise BoxError(f"the XDP hook of {', '.join(taken)} holds a program already: the classifier must run there "
                       f"(the userspace datapath reads the port before tc ingress)")
    record = ClassifierRecord(name, bridge, kind, rundir, tuple(sorted(set(memcached_ports))), tuple(hooks), (),
                              round(time.time(), 3))
    record.write()
    try:
        plane = DataPlane(name, CLASSIFIER).load()
        fill(plane, record.memcached_ports)
        xdp = plane.load_xdp() if any(h.direction == "xdp" for h in hooks) else None
        for hook in hooks:
            if hook.direction == "xdp":
                run_tool(["ip", "link", "set", "dev", hook.port, "xdp", "pinned", str(xdp)],
                         f"the classifier at {hook.describe()}", TC_TIMEOUT)
                continue
            if not has_clsact(hook.port):  # recorded before it is made: detach removes it whatever happens next
                record = replace(record, made_qdiscs=record.made_qdiscs + (hook.port,))
                record.write()
                run_tool(["tc", "qdisc", "add", "dev", hook.port, "clsact"], f"clsact on {hook.port}", TC_TIMEOUT)
            run_tool(["tc", "filter", "add", "dev", hook.port, hook.direction, "pref", str(PREF), "bpf",
                      "direct-action", "object-pinned", str(plane.program_pin)], f"the classifier at {hook.describe()}",
                     TC_TIMEOUT)
    except (DataPlaneError, OSError, subprocess.SubprocessError) as err:
        detach(name)
        raise DataPlaneError(str(err)) from None
    return record


def _xdp_id(port: str) -> int:
    """The id of the XDP program on `port` (0: none)."""
    shown = subprocess.run(["ip", "-j", "link", "show", "dev", port], capture_output=True, text=True,
                           timeout=TC_TIMEOUT)
    links = json.loads(shown.stdout or "[]") if shown.returncode == 0 else []
    return int(links[0].get("xdp", {}).get("prog", {}).get("id", 0)) if links else 0


def _pinned_id(pin: Path) -> int:
    shown = subprocess.run(["bpftool", "-j", "prog", "show", "pinned", str(pin)], capture_output=True, text=True,
                           timeout=TC_TIMEOUT)
    return int(json.loads(shown.stdout).get("id", 0)) if shown.returncode == 0 else 0


def detach(name: str) -> list[str]:
    """Remove classifier `name`: its filters, the qdiscs attach made that hold nothing else, its pins and record;
    what was removed, in words ([] if there was nothing)."""
    record = ClassifierRecord.read(name)
    removed = []
    ours = _pinned_id(CLASSIFIER.pin_root / name / XDP_PIN)
    for hook in record.hooks if record else ():
        if not _interface_there(hook):
            removed.append(f"nothing at {hook.describe()} (the port is gone)")
        elif hook.direction == "xdp":
            if ours and _xdp_id(hook.port) == ours:  # a program someone put there since stays
                subprocess.run(["ip", "link", "set", "dev", hook.port, "xdp", "off"], capture_output=True,
                               timeout=TC_TIMEOUT)
                removed.append(f"the classifier at {hook.describe()}")
        else:
            if any(f.get("pref") == PREF for f in tc_filters(hook.port, hook.direction)):
                remove_filters(hook.port, hook.direction, pref=PREF)
                removed.append(f"the classifier at {hook.describe()}")
            if hook.port in record.made_qdiscs:
                remove_empty_clsact(hook.port)
    return removed + unload_and_forget(DataPlane(name, CLASSIFIER), record_path(name))


def _interface_there(hook: Hook) -> bool:
    return interface_exists(hook.port)


def status(name: str) -> dict:
    """What classifier `name` is: its bridge and hooks (from the record), the bridge's ports now without it,
    memcached ports, hot keys, lease, whether its sketch is read, counters; the eBPF switch's status shape."""
    from dataplanes.bpf.tables import Tables
    record = ClassifierRecord.read(name)
    tables = Tables(CLASSIFIER.pin_root / name)
    try:
        sketch_until_ns, _ = tables.sketch_control()
        report = {"name": name, "dataplane": "openflow", "bridge": record.bridge if record else None,
                  "datapath": record.datapath if record else None,
                  "ports": [h.port for h in record.hooks] if record else None,
                  "hooks": [{**asdict(h), "where": h.describe(), "there": _interface_there(h)}
                            for h in record.hooks] if record else None,
                  "unclassified_ports": _unclassified(record),
                  "memcached_ports": sorted(tables.memcached_ports()), "hot_keys": len(tables.held_keys()),
                  "lease_left_s": round(max(tables.lease() - time.monotonic_ns(), 0) / 1e9, 3),
                  "counters": tables.counters(), "sketch_read": sketch_until_ns > time.monotonic_ns(),
                  "attached_unix": record.attached_unix if record else None}
    finally:
        tables.close()
    return report


def _unclassified(record: ClassifierRecord | None) -> list[str] | str | None:
    """The bridge's ports that came after attach (no classifier sees their frames), or why that is not known."""
    if record is None:
        return None
    try:
        now = [i["name"] for i in OvsBox(record.ovs_rundir).interfaces(record.bridge)]
    except BoxError as err:
        return f"unknown: {err}"
    return sorted(set(now) - {h.port for h in record.hooks})


def remove_left_over(name: str) -> list[str]:
    """What a killed run left named after switch `name`: its private Open vSwitch, and a classifier attached under
    that name with its record (the registry's leftovers hook for the OpenFlow data plane)."""
    from dataplanes.openflow.ovs import remove_left_over as remove_ovs
    removed = remove_ovs(name)
    if record_path(name).exists():
        removed += [f"classifier {name}: {what}" for what in detach(name)]
    return removed
