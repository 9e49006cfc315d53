"""Run bmv2's simple_switch_grpc on a set of interfaces, for topologies and tests.

The switch starts without a program (--no-p4): the driver pushes p4src/mbalancer.p4 over P4Runtime, as it would
to any switch. Its P4Runtime server listens on 127.0.0.1 (a free port unless one is given); its log goes to a
file under /run/mbalancer/bmv2/<name>.log. bmv2 forwards frames as they are, so the hosts behind it must send
real checksums: `no_checksum_offload` turns the kernel's offload off on an interface (a veth's default leaves UDP
checksums to the receiver, which bmv2 is not). The switch runs with jemalloc's malloc where it is installed
(`preloaded_malloc`).
"""
from __future__ import annotations

import ctypes.util
import functools
import logging
import os
import socket
import subprocess
import time
from pathlib import Path
from typing import Sequence

from dataplanes.p4.pipeline import SWITCH, P4Error
from mbalancer.processes import kill_left_over, stop_process

log = logging.getLogger(__name__)
RUN_DIR = Path("/run/mbalancer/bmv2")
START_TIMEOUT = 15.0  # seconds for the P4Runtime server to accept connections
# bmv2 copies two GMP big numbers, each malloc'd and freed, for every field it writes (~100 pairs per packet of
# mbalancer.p4): jemalloc's per-thread caches make them cheap, ~20% more packets/s on one core than glibc's malloc
# (docs/dataplanes/p4.md, "Rates")
MALLOC = "jemalloc"


@functools.cache
def preloaded_malloc() -> str | None:
    """The malloc library simple_switch_grpc is started with (LD_PRELOAD), None: glibc's (said once, with why)."""
    library = ctypes.util.find_library(MALLOC)
    if library is None:
        log.warning("bmv2: lib%s is not installed (`make install` installs it): the switch runs on glibc's malloc, about "
                    "20%% fewer packets/s", MALLOC)
    else:
        log.info("bmv2: the switch runs with %s's malloc (%s preloaded): bmv2 mallocs per field it writes", MALLOC,
                 library)
    return library


def switch_environment() -> dict[str, str]:
    environment = dict(os.environ)
    library = preloaded_malloc()
    if library is not None:
        environment["LD_PRELOAD"] = " ".join(filter(None, [library, environment.get("LD_PRELOAD")]))
    return environment


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Bmv2Switch:
    """simple_switch_grpc with port i + 1 on interfaces[i] (or the port numbers given)."""

    def __init__(self, name: str, interfaces: Sequence[str], device_id: int = 1, cpu_port: int = 255,
                 grpc_port: int | None = None, port_numbers: Sequence[int] | None = None, log_level: str = "warn",
                 flood_ports: Sequence[int] | None = None, grpc_host: str = "127.0.0.1"):
        """grpc_host: the address P4Runtime listens on (another than loopback: its switch agent runs elsewhere)."""
        self.name, self.interfaces, self.grpc_host = name, list(interfaces), grpc_host
        self.device_id, self.cpu_port = device_id, cpu_port
        self.grpc_port = grpc_port or free_port()
        self.port_numbers = list(port_numbers or range(1, len(self.interfaces) + 1))
        # the ports its flood group has (all by default; a fabric leaves some out: a loop-free flood tree)
        self.flood_ports = list(self.port_numbers if flood_ports is None else flood_ports)
        self.process: subprocess.Popen | None = None
        self.log, self.log_level = RUN_DIR / name, log_level

    @property
    def address(self) -> str:
        return f"{self.grpc_host}:{self.grpc_port}"

    def start(self, wrapper: Sequence[str] = (), timeout: float = START_TIMEOUT) -> "Bmv2Switch":
        """wrapper: a command the switch runs under (a profiler: bench_p4_switch.py --instructions runs it under
        callgrind), given `timeout` seconds to serve P4Runtime."""
        RUN_DIR.mkdir(parents=True, exist_ok=True)
        command = [*wrapper, SWITCH, "--device-id", str(self.device_id), "--thrift-port", str(free_port()), "--no-p4",
                   "--log-file", str(self.log), "--log-level", self.log_level, "--log-flush"]
        for number, iface in zip(self.port_numbers, self.interfaces):
            command += ["-i", f"{number}@{iface}"]
        command += ["--", "--grpc-server-addr", self.address, "--cpu-port", str(self.cpu_port)]
        try:
            self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                            env=switch_environment())
        except FileNotFoundError:
            raise P4Error(f"{SWITCH} is not on PATH (`make p4` builds it)") from None
        pidfile(self.name).write_text(f"{self.process.pid}\n")  # a killed run's switch is stopped by the next
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                error = self.process.stderr.read().decode(errors="replace").strip().splitlines()
                self.process = None
                raise P4Error(f"{SWITCH} {self.name} exited: {error[-1] if error else 'no message'}")
            try:
                socket.create_connection((self.grpc_host, self.grpc_port), timeout=0.5).close()
                return self
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise P4Error(f"{SWITCH} {self.name}: no P4Runtime server at {self.address} within {timeout:g} s")

    def bootstrap(self) -> "Bmv2Switch":
        """Push p4src/mbalancer.p4 and its flood group, so the switch forwards L2 (learned, flooded) before a
        controller attaches (Open vSwitch's bootstrap NORMAL rule, the same idea); the controller's driver finds
        this pipeline and takes over, keeping the flood group's ports. It arbitrates with the lowest election id:
        a controller that is (or becomes) primary meanwhile wins, and the bootstrap gives way."""
        from dataplanes.p4 import entries as e
        from dataplanes.p4.client import P4RuntimeClient, P4RuntimeError
        from dataplanes.p4.pipeline import Pipeline
        pipeline = Pipeline()
        client = P4RuntimeClient(self.address, self.device_id, election_id=1)
        try:
            client.connect()
            client.set_pipeline(pipeline)
            client.write([e.update(e.INSERT, e.flood_group(self.flood_ports))], "the flood group")
        except P4RuntimeError as err:  # a controller is primary: it programs the switch
            log.info("%s: bootstrap left to the controller (%s)", self.name, err)
        finally:
            client.close()
        return self

    def stop(self) -> None:
        if self.process is not None:
            stop_process(self.process)
            self.process = None
        pidfile(self.name).unlink(missing_ok=True)

    def restart(self) -> None:
        """Stop and start again on the same address: the switch comes back empty, as after a crash."""
        self.stop()
        self.start()


def pidfile(name: str) -> Path:
    return RUN_DIR / f"{name}.pid"


def remove_left_over(name: str) -> list[str]:
    """Stop the simple_switch_grpc a killed run left (by the PID in its pidfile, if that is still the switch); what
    was there, named (the registry's leftovers hook)."""
    path = pidfile(name)
    if not path.exists():
        return []
    kill_left_over(path, SWITCH)
    path.unlink(missing_ok=True)
    return [f"bmv2 {name}"]


def no_checksum_offload(iface: str, netns: str | None = None) -> None:
    """Make the kernel compute checksums before frames leave `iface` (bmv2 does not complete them)."""
    prefix = ["ip", "netns", "exec", netns] if netns else []
    done = subprocess.run([*prefix, "ethtool", "-K", iface, "tx", "off"], capture_output=True, text=True)
    if done.returncode:
        raise P4Error(f"ethtool -K {iface} tx off: {done.stderr.strip()}")
