"""A private Open vSwitch: its own ovsdb-server and ovs-vswitchd, started and stopped by this code (no system
service), with the userspace (netdev) datapath, since this kernel may have no openvswitch module.

    with OpenVSwitch("mb") as ovs:                       # /run/mbalancer/ovs/mb: database, sockets, logs
        ovs.add_bridge("mb-of", ["veth1", "veth2"], controller="tcp:127.0.0.1:6653")
        ovs.ofctl("dump-flows", "mb-of")

Userspace TSO is switched on before ovs-vswitchd starts: without it the netdev datapath sends UDP and TCP with
bad checksums here. Bridges are fail-mode secure (the rules stay when the controller goes away: no fallback that
would flood tagged packets), start with one NORMAL rule (L2 until the controller connects and replaces every
rule), and speak OpenFlow 1.5 (select groups with a selection method) besides 1.3.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Sequence

from mbalancer.processes import kill_left_over, stop_process

RUN_ROOT = Path("/run/mbalancer/ovs")
SCHEMA = Path("/usr/share/openvswitch/vswitch.ovsschema")
START_TIMEOUT = 10.0
BRIDGES = "bridges"  # in the run directory: the bridges made, whose interfaces go when it is removed


class OvsError(RuntimeError):
    """Open vSwitch could not be started or refused a command; the message carries its own words."""


def available() -> str | None:
    """None if Open vSwitch can run here, else why not."""
    for tool in ("ovsdb-server", "ovs-vswitchd", "ovs-vsctl", "ovs-ofctl"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt openvswitch-switch, in install/apt-packages.txt)"
    return None if SCHEMA.exists() else f"{SCHEMA} is missing (apt openvswitch-common)"


def remove_left_over(name: str) -> list[str]:
    """Stop the daemons of a private Open vSwitch that a killed run left (by the PIDs in its pidfiles), delete its
    bridges' interfaces and remove its directory; what was there, named (the registry's leftovers hook)."""
    rundir = RUN_ROOT / name
    if not rundir.exists():
        return []
    for pidfile in rundir.glob("*.pid"):
        kill_left_over(pidfile, pidfile.stem)  # only if that PID is still the daemon named by its pidfile
    for bridge in (rundir / BRIDGES).read_text().split() if (rundir / BRIDGES).exists() else []:
        subprocess.run(["ip", "link", "del", bridge], capture_output=True)  # the netdev datapath's tap
    shutil.rmtree(rundir, ignore_errors=True)
    return [f"Open vSwitch {name}"]


class OpenVSwitch:
    def __init__(self, name: str):
        self.name = name
        self.rundir = RUN_ROOT / name
        self.env = dict(os.environ, OVS_RUNDIR=str(self.rundir), OVS_LOGDIR=str(self.rundir),
                        OVS_DBDIR=str(self.rundir))
        self.db = f"unix:{self.rundir}/db.sock"
        self.daemons: dict[str, subprocess.Popen] = {}  # our children, stopped by PID (never by name)

    # --- life cycle -------------------------------------------------------------------------------------------
    def start(self) -> "OpenVSwitch":
        if (problem := available()) is not None:
            raise OvsError(problem)
        remove_left_over(self.name)
        self.rundir.mkdir(parents=True)
        try:
            self._run("ovsdb-tool", "create", str(self.rundir / "conf.db"), str(SCHEMA))
            self._daemon("ovsdb-server", f"--remote=punix:{self.rundir}/db.sock", str(self.rundir / "conf.db"))
            self.vsctl("--no-wait", "init")
            self.vsctl("--no-wait", "set", "Open_vSwitch", ".", "other_config:userspace-tso-enable=true")
            self.start_switch()
        except BaseException:
            self.stop()
            raise
        return self

    def start_switch(self) -> None:
        """ovs-vswitchd (again, after stop_switch: bridges come back from the database, flows do not)."""
        self._daemon("ovs-vswitchd", self.db)
        for bridge in self.vsctl("list-br").split():
            self._wait_for_bridge(bridge)

    def stop_switch(self) -> None:
        """Stop ovs-vswitchd, as a crash would: every flow and group is gone."""
        if "ovs-vswitchd" in self.daemons:
            stop_process(self.daemons.pop("ovs-vswitchd"))

    def stop(self) -> None:
        for daemon in ("ovs-vswitchd", "ovsdb-server"):
            if daemon in self.daemons:
                stop_process(self.daemons.pop(daemon))
        remove_left_over(self.name)  # the bridges' own interfaces (taps of the netdev datapath) outlive the daemons

    def __enter__(self) -> "OpenVSwitch":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # --- bridges and commands ---------------------------------------------------------------------------------
    def add_bridge(self, bridge: str, ports: Sequence[str], controller: str) -> None:
        with open(self.rundir / BRIDGES, "a") as made:
            made.write(bridge + "\n")
        self.vsctl("add-br", bridge, "--", "set", "bridge", bridge, "datapath_type=netdev", "fail_mode=secure",
                   "protocols=OpenFlow10,OpenFlow13,OpenFlow15", "other_config:disable-in-band=true")
        for port in ports:  # QoS linux-noop: OVS leaves the port's qdisc alone (a testbed's rate caps stay)
            self.vsctl("add-port", bridge, port, "--", "set", "port", port, "qos=@noop", "--",
                       "--id=@noop", "create", "qos", "type=linux-noop")
        self.vsctl("set-controller", bridge, controller)
        self._wait_for_bridge(bridge)
        self.ofctl("add-flow", bridge, "priority=0,actions=NORMAL")  # L2 until the controller replaces every rule

    def remove_bridge(self, bridge: str) -> None:
        """The bridge and its interface go; its ports are free again."""
        self.vsctl("--if-exists", "del-br", bridge)

    def no_flood(self, bridge: str, port: str) -> None:
        """Floods (OFPP_FLOOD) leave out `port`, until ovs-vswitchd restarts. Only OpenFlow 1.0 has the port flag:
        hence that version among the bridge's protocols (a controller still speaks the highest both have)."""
        self._run("ovs-ofctl", "-O", "OpenFlow10", "mod-port", bridge, port, "no-flood")

    def _wait_for_bridge(self, bridge: str) -> None:
        """Until the bridge's management socket (ovs-ofctl's way in) exists: made a moment after the bridge."""
        deadline = time.monotonic() + START_TIMEOUT
        while not (self.rundir / f"{bridge}.mgmt").exists():
            if time.monotonic() > deadline:
                said = (self.rundir / "ovs-vswitchd.log").read_text(errors="replace").strip().splitlines()
                raise OvsError(f"bridge {bridge} has no management socket after {START_TIMEOUT:.0f} s (ovs-vswitchd's "
                               f"last words: {said[-1] if said else 'none'})")
            time.sleep(0.02)

    def vsctl(self, *args: str) -> str:
        return self._run("ovs-vsctl", f"--db={self.db}", "--timeout=10", *args)

    def ofctl(self, *args: str) -> str:
        return self._run("ovs-ofctl", "-O", "OpenFlow15", *args)

    def connected(self) -> bool:
        """True once a bridge's controller connection is up."""
        return "true" in self.vsctl("--columns=is_connected", "list", "controller")

    def _run(self, *args: str) -> str:
        result = subprocess.run(args, capture_output=True, text=True, env=self.env, timeout=START_TIMEOUT)
        if result.returncode:
            raise OvsError(f"{args[0]} {' '.join(args[1:3])}: {(result.stderr or result.stdout).strip()[-500:]}")
        return result.stdout

    def _daemon(self, name: str, *args: str) -> None:
        """Start a daemon as our child (no --detach, so it is reaped) and wait until its control socket is up."""
        pidfile = self.rundir / f"{name}.pid"
        log = open(self.rundir / f"{name}.log", "ab")
        self.daemons[name] = subprocess.Popen([name, *args, f"--pidfile={pidfile}", "-vconsole:off",
                                               f"--log-file={self.rundir}/{name}.log"],
                                              env=self.env, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        log.close()
        deadline = time.monotonic() + START_TIMEOUT
        while not list(self.rundir.glob(f"{name}.*.ctl")):
            if self.daemons[name].poll() is not None or time.monotonic() > deadline:
                raise OvsError(f"{name} did not start (see {self.rundir}/{name}.log)")
            time.sleep(0.02)
