"""An eBPF switch on this machine's own interfaces, made by one command and removed by another (`mbalancer switch
attach | detach | status`), for a Linux box that forwards between memcached clients and servers.

attach() records what it makes in RECORDS/<name>.json before making it (ports, memcached ports, the mirror link),
so detach(), from another process and at any later time, removes exactly that, also after an attach that failed
half way. The program forwards among its ports itself (L2, learning; tc ingress runs before a bridge would see the
frame), so ports that are members of a Linux bridge are taken over while attached and given back at detach.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

from mbalancer.interfaces import IFNAMSIZ, NETNS_NAMES, interface_exists, namespace_name, network_namespace
from mbalancer.processes import runs
from dataplanes.bpf.program import PIN_ROOT, DataPlane, DataPlaneError, loaded_switches, mirror_link_of
from dataplanes.bpf.records import RECORDS, read_record, unload_and_forget, write_record
from dataplanes.ebpf.tcp.path import SPLITTER, TcpPath
from dataplanes.ebpf.tcp.path import remove as remove_tcp_path


@dataclass(frozen=True)
class SwitchRecord:
    name: str
    ports: tuple[str, ...]
    memcached_ports: tuple[int, ...]
    attached_unix: float
    # the network namespace the ports are in (pins are machine-wide, ports are not): its inode, its /run/netns name
    netns_inode: int = 0
    netns: str = ""
    tcp: bool = False  # with its TCP path (dataplanes/ebpf/tcp/): the splitter's pid and routing table once made
    splitter_pid: int = 0
    tcp_table: int = 0
    tcp_missing: str = ""  # why an attach that would have made the TCP path did not (TCP gets go home)

    @staticmethod
    def read(name: str) -> "SwitchRecord | None":
        return read_record(_record_path(name), lambda raw: SwitchRecord(
            raw["name"], tuple(raw["ports"]), tuple(raw["memcached_ports"]), raw["attached_unix"],
            int(raw.get("netns_inode", 0)), str(raw.get("netns", "")), bool(raw.get("tcp", False)),
            int(raw.get("splitter_pid", 0)), int(raw.get("tcp_table", 0)), str(raw.get("tcp_missing", ""))))

    def namespace_text(self) -> str:
        return f"network namespace {self.netns}" if self.netns else "the machine's own network namespace"

    def write(self) -> None:
        write_record(_record_path(self.name), self)


def _record_path(name: str) -> Path:
    return RECORDS / f"{name}.json"


def attach(name: str, ports: Sequence[str], memcached_ports: Sequence[int], tcp: bool | None = None) -> SwitchRecord:
    """Load the program as switch `name`, attach it to every port, make its mirror link, and its TCP path (the
    splitter runs on after this process, logging to RECORDS/<name>.splitter.log): `tcp` None where it can (if it
    cannot, the record's tcp_missing says why), True or fail, False not at all. DataPlaneError (with nothing left
    behind) if any step that must succeed fails."""
    DataPlane(name)  # checks the name
    if len(mirror_link_of(name)[1]) > IFNAMSIZ:
        raise DataPlaneError(f"switch name {name!r} too long: at most {IFNAMSIZ - 3} characters (its mirror link "
                             f"is named {mirror_link_of(name)[1]!r}; Linux interface names hold {IFNAMSIZ})")
    missing = [port for port in ports if not interface_exists(port)]
    if not ports or missing:
        raise DataPlaneError(f"no such interface: {', '.join(missing)}" if missing else "give at least one port")
    if len(set(ports)) != len(ports):
        raise DataPlaneError("a port is listed twice")
    if name in loaded_switches() or _record_path(name).exists():
        raise DataPlaneError(f"a switch named {name} is attached already (mbalancer switch detach --name {name})")
    inode, netns = network_namespace()
    taken = {port: other.name for other in map(SwitchRecord.read, loaded_switches())
             if other and other.netns_inode in (0, inode) for port in other.ports}
    if clash := [f"{port} (switch {taken[port]})" for port in ports if port in taken]:
        raise DataPlaneError(f"ports belong to another switch: {', '.join(clash)}")
    record = SwitchRecord(name, tuple(ports), tuple(sorted(set(memcached_ports))), round(time.time(), 3), inode,
                          netns, tcp is not False)
    record.write()
    plane = DataPlane(name)
    try:
        plane.load()
        if record.tcp:  # before the ports: a connection opened in between would bypass the splitter for its life
            record = _start_tcp_path(plane, record, required=tcp is True)
        plane.serve(list(ports), plane.add_mirror_link(), record.memcached_ports)
    except (DataPlaneError, OSError) as err:
        detach(name)
        raise DataPlaneError(str(err)) from None
    return record


def _start_tcp_path(plane: DataPlane, record: SwitchRecord, required: bool) -> SwitchRecord:
    """The record with the TCP path made and its splitter running; unless `required`, with why it could not be made
    instead (the splitter not built, the port taken by a memcached on this box, ...): TCP gets then go home."""
    path = TcpPath(plane, record.memcached_ports)
    try:
        path.start(_splitter_log(record.name))
    except (DataPlaneError, OSError, subprocess.SubprocessError) as err:
        if required:
            raise DataPlaneError(str(err)) from None
        record = replace(record, tcp=False, tcp_missing=str(err))
    else:
        record = replace(record, splitter_pid=path.process.pid, tcp_table=path.table)
    record.write()
    return record


def detach(name: str) -> list[str]:
    """Remove switch `name`: its tc filters (the clsact qdisc of each recorded port), its mirror link, its pins
    and its record; returns what was removed, in words ([] if there was nothing)."""
    record = SwitchRecord.read(name)
    plane = DataPlane(name)
    removed = []
    where = _where_attached(record)
    if where == GONE:
        removed.append(f"nothing on its ports ({record.namespace_text()} is gone, and its ports with it)")
    elif where:  # the ports are in another namespace: removed there, as `ip netns exec` would not see the pins
        plane.attached = [f"{where}:{port}" for port in record.ports]
        plane.mirror_link, plane.mirror_netns = True, where
        removed.append(f"the program on {', '.join(record.ports)} and the mirror link in {record.namespace_text()}")
    else:
        if record:
            plane.attached = [port for port in record.ports if interface_exists(port)]
            removed.append(f"the program on {', '.join(plane.attached) or 'no port left'}")
        if interface_exists(mirror_link_of(name)[0]):
            plane.mirror_link = True
            removed.append(f"the mirror link {'/'.join(mirror_link_of(name))}")
    if record and record.tcp:
        removed += _stop_splitter(record) if where == GONE else _remove_tcp_path(record, where)
    return removed + unload_and_forget(plane, _record_path(name))


def _splitter_state(record: SwitchRecord | None) -> dict | None:
    """The TCP path's splitter as the record names it (None: the switch has no TCP path; why not, if it was to have
    one)."""
    if record is not None and record.tcp_missing:
        return {"pid": 0, "running": False, "missing": record.tcp_missing}
    if record is None or not record.tcp:
        return None
    return {"pid": record.splitter_pid, "running": runs(record.splitter_pid, SPLITTER.name),
            "log": str(_splitter_log(record.name))}


def _splitter_log(name: str) -> Path:
    return RECORDS / f"{name}.splitter.log"


def _remove_tcp_path(record: SwitchRecord, where: str | None) -> list[str]:
    """Stop the splitter and undo its routes and link."""
    return _stop_splitter(record) + remove_tcp_path(record.name, record.tcp_table, where)


def _stop_splitter(record: SwitchRecord) -> list[str]:
    """Stop the splitter by its pid, if that is still the splitter (also when its namespace is gone: the splitter
    alone keeps that namespace alive)."""
    if not runs(record.splitter_pid, SPLITTER.name):
        return []
    os.kill(record.splitter_pid, signal.SIGTERM)
    return [f"the TCP splitter (pid {record.splitter_pid})"]


GONE = "gone"  # _where_attached: the namespace the switch was attached in no longer exists


def _where_attached(record: SwitchRecord | None) -> str | None:
    """Where the switch's ports are, seen from here: None (this namespace, or not known), the path of the named
    namespace they are in, or GONE. DataPlaneError if they are in another namespace that cannot be entered by name."""
    here, _ = network_namespace()
    if record is None or record.netns_inode in (0, here):
        return None
    if record.netns and namespace_name(record.netns_inode) == record.netns:
        return str(NETNS_NAMES / record.netns)
    if record.netns:
        return GONE
    raise DataPlaneError(f"switch {record.name} was attached in {record.namespace_text()}, not this one: detach it "
                         f"from there")


def status(name: str) -> dict:
    """What switch `name` is: its ports (from the record), memcached ports, hot keys, lease, whether its hot-key
    sketch is being read, and counters."""
    from dataplanes.bpf.tables import Tables  # needs the bpf syscall; importing the module does not
    record = SwitchRecord.read(name)
    tables = Tables(PIN_ROOT / name)
    try:
        lease_ns = tables.lease()
        sketch_until_ns, _ = tables.sketch_control()
        hot = tables.held_keys()
        report = {"name": name, "ports": list(record.ports) if record else None,
                  "netns": record.netns if record else None,  # "": the machine's own (or one with no name)
                  "memcached_ports": sorted(tables.memcached_ports()), "hot_keys": len(hot),
                  "lease_left_s": round(max(lease_ns - time.monotonic_ns(), 0) / 1e9, 3),
                  "learned_macs": len(tables.forward()), "counters": tables.counters(),
                  "sketch_read": sketch_until_ns > time.monotonic_ns(),  # a `monitor --source dataplane` renews it
                  "attached_unix": record.attached_unix if record else None,
                  "tcp_splitter": _splitter_state(record)}
    finally:
        tables.close()
    return report


