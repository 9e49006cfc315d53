"""The faults the runner injects, each with its way back. They hit server s3 (index 2, a replica of every hot key
the load uses and the home of none) or the control plane.

Each fault is a pair of functions over the running Rig: `inject` at the start of the fault phase, `recover` at its
end. What each stands for:
    crash           memcached killed (SIGKILL); back: started again, empty
    fast_restart    memcached killed and started again at once (back, empty, in tens of ms), three times 0.5 s apart;
                    back: nothing to do
    hang            memcached stopped (SIGSTOP), the process and its sockets stay; back: SIGCONT
    cpu_hog         memcached shares its CPU with four busy loops; back: they stop
    slow_link       the link to the server shaped to 200 kbit/s (tc tbf): its replies queue; back: unshaped
    udp_wedge       a 30-byte datagram ("set x 0 0 1000000" and 3 bytes) wedges a memcached 1.6 UDP reader (TCP
                    still answers); sent until every reader is wedged; back: memcached restarted
    controller_kill the controller process killed (SIGKILL); back: started again (it reads back the old entries)
    standby_takeover a standby controller started (--standby), then the active one killed (SIGKILL): the standby
                    takes over the moment it dies; back: nothing to do
    switch_reload   the data plane unloaded and loaded again (every table empty); back: nothing to do
"""
from __future__ import annotations

import os
import signal
import struct
import subprocess
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from experiments.faults.busy import BUSY_LOOP

if TYPE_CHECKING:
    from experiments.faults.rig import Rig

FAULTED = 2  # the server the faults hit: s3
HOGS = 4


@dataclass(frozen=True)
class Fault:
    name: str
    inject: Callable[["Rig"], None]
    recover: Callable[["Rig"], None]
    server: int | None = FAULTED  # the server it takes out (None: the control plane)
    healthy: bool = False  # the server only answers late: taking it out of rotation is a false removal
    dataplanes: tuple[str, ...] = ("ebpf", "p4", "openflow")  # the rigs it can be injected on


def _crash(rig: "Rig") -> None:
    rig.memcached[FAULTED].kill()
    rig.memcached[FAULTED].wait()


def _restart(rig: "Rig") -> None:
    if rig.memcached[FAULTED].poll() is None:
        rig.memcached[FAULTED].kill()
        rig.memcached[FAULTED].wait()
    rig.start_memcached(FAULTED)


FAST_RESTARTS = 3  # restarts of the fast_restart fault
FAST_RESTART_GAP = 0.5  # seconds between them


def _restart_fast(rig: "Rig") -> None:
    """Killed and started again at once, a few times: each time it is back, empty, within tens of milliseconds,
    before a health probe would notice it was gone."""
    for attempt in range(FAST_RESTARTS):
        if attempt:
            time.sleep(FAST_RESTART_GAP)
        rig.memcached[FAULTED].kill()
        rig.memcached[FAULTED].wait()
        rig.start_memcached(FAULTED)


def _hang(rig: "Rig") -> None:
    os.kill(rig.memcached[FAULTED].pid, signal.SIGSTOP)


def _resume(rig: "Rig") -> None:
    os.kill(rig.memcached[FAULTED].pid, signal.SIGCONT)


def _hog(rig: "Rig") -> None:
    cpu = str(max(os.sched_getaffinity(0)))
    subprocess.run(["taskset", "-a", "-p", "-c", cpu, str(rig.memcached[FAULTED].pid)], capture_output=True,
                   check=True)
    rig.hogs = [subprocess.Popen(["taskset", "-c", cpu, *BUSY_LOOP]) for _ in range(HOGS)]


def _unhog(rig: "Rig") -> None:
    for hog in rig.hogs:
        hog.kill()
        hog.wait()
    rig.hogs = []
    all_cpus = ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))
    subprocess.run(["taskset", "-a", "-p", "-c", all_cpus, str(rig.memcached[FAULTED].pid)], capture_output=True)


def _shape(rig: "Rig") -> None:
    port = rig.net.server_hosts[FAULTED].port
    subprocess.run(["tc", "qdisc", "add", "dev", port, "root", "tbf", "rate", "200kbit", "burst", "8kbit",
                    "latency", "200ms"], capture_output=True, text=True, check=True)


def _unshape(rig: "Rig") -> None:
    subprocess.run(["tc", "qdisc", "del", "dev", rig.net.server_hosts[FAULTED].port, "root"], capture_output=True)


WEDGE_TRIES = 30  # wedge datagrams at most, each followed by a probe


def _wedge(rig: "Rig") -> None:
    """A datagram that wedges memcached: a set announcing a 1 MB value with 3 bytes of it, over UDP. It wedges the
    worker that reads it (which then takes every datagram it reads as more of the value); memcached runs a UDP reader
    per worker thread on one socket, so another worker may still answer. Sent again until a probe get goes unanswered
    twice in a row: the whole listener wedged, the same fault in every run."""
    host = rig.net.server_hosts[FAULTED]
    datagram = struct.pack("!HHHH", 1, 0, 1, 0) + b"set x 0 0 1000000\r\nabc"
    probe = struct.pack("!HHHH", 2, 0, 1, 0) + b"get x\r\n"
    code = "\n".join([
        "import socket",
        "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)",
        "s.settimeout(0.05)",
        "silent = 0",
        f"for _ in range({WEDGE_TRIES}):",
        f"    s.sendto({datagram!r}, ({host.ip!r}, 11211))",
        f"    s.sendto({probe!r}, ({host.ip!r}, 11211))",
        "    try:",
        "        s.recv(2048)",
        "        silent = 0",
        "    except socket.timeout:",
        "        silent += 1",
        "        if silent == 2:",
        "            break",
    ])
    rig.net.run(rig.net.client_hosts[0], [rig.python, "-c", code])


def _kill_controller(rig: "Rig") -> None:
    rig.controller.kill()
    rig.controller.wait()


def _kill_controller_under_standby(rig: "Rig") -> None:
    standby = rig.start_standby()
    _kill_controller(rig)
    rig.controller = standby  # serves the same address once it has taken over


def _start_controller(rig: "Rig") -> None:
    rig.start_controller()


def _reload_switch(rig: "Rig") -> None:
    rig.net.switch.reload()


def _nothing(rig: "Rig") -> None:
    pass


FAULTS = {f.name: f for f in (
    Fault("crash", _crash, _restart),
    Fault("fast_restart", _restart_fast, _nothing),
    Fault("hang", _hang, _resume),
    Fault("cpu_hog", _hog, _unhog, healthy=True),
    Fault("slow_link", _shape, _unshape),
    Fault("udp_wedge", _wedge, _restart),
    Fault("controller_kill", _kill_controller, _start_controller, server=None),
    Fault("standby_takeover", _kill_controller_under_standby, _nothing, server=None, dataplanes=("ebpf",)),
    Fault("switch_reload", _reload_switch, _nothing, server=None, dataplanes=("ebpf", "p4")),
)}

