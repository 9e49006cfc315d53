"""What a fault run stands on: three memcached servers and a client in namespaces behind the eBPF switch, and
MBalancer's controller as its own process (`mbalancer controller`, so it can be killed like a real one), fed the
same monitor report every half second (the hot keys are fixed: the run is about faults, not about finding them).
With protocol "tcp" the eBPF switch runs its TCP path, and the load and probes send their gets over TCP."""
from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from controller import ryu_manager
from mbalancer.memcache.addresses import ServerAddress
from mbalancer.memcache.hashing import make_hash
from mbalancer.memcache.meta import answers
from mbalancer.memcache.server import free_port
from mbalancer.processes import stop_process
from topologies.netns import NamespaceNetwork

log = logging.getLogger(__name__)

SERVERS = 3
MEMCACHED_PORT = 11211
PROTOCOLS = ("udp", "tcp")  # what the clients' gets go over
REPORT_EVERY = 0.5  # seconds between reports, as a monitor with a short interval would push them
START_TIMEOUT = 10.0


class RigError(RuntimeError):
    """The rig could not be built or a part of it did not start."""


class Rig:
    def __init__(self, out: Path, hot: int, avoid: int, tag: str = "mbf", dataplane: str = "ebpf",
                 protocol: str = "udp"):
        """hot: how many hot keys; avoid: the server none of them may be homed on (the one faults hit); dataplane: a
        registry name with a namespace switch (ebpf, p4, openflow); protocol: of the clients' gets (tcp: eBPF only)."""
        if protocol not in PROTOCOLS or (protocol == "tcp" and dataplane != "ebpf"):
            raise RigError(f"protocol {protocol!r}: udp, or tcp on the eBPF switch (the others send TCP gets home)")
        self.out, self.hot, self.avoid, self.tag, self.dataplane = out, hot, avoid, tag, dataplane
        self.protocol = protocol
        self.python = sys.executable
        self.net = NamespaceNetwork(servers=SERVERS, clients=1, tag=tag, dataplane=dataplane,
                                    tcp_ports=(MEMCACHED_PORT,) if protocol == "tcp" else ())
        self.memcached: list[subprocess.Popen] = []
        self.controller: subprocess.Popen | None = None
        self.hogs: list[subprocess.Popen] = []
        self.port = free_port()
        self.keys: dict[str, tuple[str, int]] = {}
        self._stop = threading.Event()
        self._reporter: threading.Thread | None = None

    # --- life cycle -----------------------------------------------------------------------------------------
    def start(self, controller: bool = True) -> "Rig":
        """Build it; `controller` False leaves the switch without one until start_controller()."""
        self.out.mkdir(parents=True, exist_ok=True)
        self.net.start()
        try:
            self.memcached = [None] * SERVERS  # type: ignore[list-item]
            for server in range(SERVERS):
                self.start_memcached(server)
            self._write_config()
            self.keys = self._pick_keys()
            if controller:
                self.start_controller()
            self._reporter = threading.Thread(target=self._report, name="fault-reports", daemon=True)
            self._reporter.start()
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        self._stop.set()
        for hog in self.hogs:
            hog.kill()
            hog.wait()
        if self.controller is not None:
            stop_process(self.controller)
        self.net.close()  # stops memcached (started through it) and removes everything it made

    def __enter__(self) -> "Rig":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # --- parts ----------------------------------------------------------------------------------------------
    def start_memcached(self, server: int) -> None:
        host = self.net.server_hosts[server]
        self.memcached[server] = self.net.popen(host, ["memcached", "-l", host.ip, "-p", str(MEMCACHED_PORT), "-U",
                                                       str(MEMCACHED_PORT), "-u", "root", "-t", "2", "-m", "64"])
        self._wait(lambda: _answers(host.ip), f"memcached on {host.name}")

    def start_controller(self) -> None:
        self.controller = self._controller_process("controller.log")
        self._wait(lambda: self.state() is not None, "the controller's HTTP API")
        for host in self.net.server_hosts:  # through the switch as the controller drives it (an OpenFlow switch
            self._wait(lambda: _answers(host.ip), f"memcached on {host.name} through the switch")  # is wiped first)

    def start_standby(self) -> subprocess.Popen:
        """A second controller on the same switches with --standby, once it says it waits (standby.log)."""
        standby = self._controller_process("standby.log", "--standby")
        self._wait(lambda: "standby:" in (self.out / "standby.log").read_text(), "the standby controller")
        return standby

    def _controller_process(self, log_name: str, *options: str) -> subprocess.Popen:
        """`mbalancer controller`, or for OpenFlow the Ryu app under ryu-manager (the same HTTP interface)."""
        log_file = open(self.out / log_name, "a")
        if self.dataplane == "openflow":
            if options:
                raise RigError(f"the Ryu app takes none of {' '.join(options)}")
            process = ryu_manager.launch(self.out / "config.toml", log_file)
        else:
            process = subprocess.Popen([self.python, "-m", "mbalancer.cli", "-v", "controller", "--config",
                                        str(self.out / "config.toml"), *options], stdout=log_file,
                                       stderr=subprocess.STDOUT)
        log_file.close()
        return process

    def state(self) -> dict | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/state", timeout=1) as reply:
                return json.load(reply)
        except (OSError, urllib.error.URLError, ValueError):
            return None

    def wait_balanced(self, timeout: float = START_TIMEOUT) -> None:
        """Until every hot key is installed and clean (its gets balanced)."""
        def ready() -> bool:
            state = self.state()
            return bool(state) and len(state["hot_keys"]) == self.hot and not any(
                k["dirty"] for k in state["hot_keys"])
        self._wait(ready, f"{self.hot} hot keys balanced")

    # --- inside ---------------------------------------------------------------------------------------------
    def _write_config(self) -> None:
        servers = "\n".join(f'[[servers]]\nname = "{h.name}"\nip = "{h.ip}"\nmac = "{h.mac}"\nport = {MEMCACHED_PORT}\n'
                            for h in self.net.server_hosts)
        settings = "".join(f"{name} = {json.dumps(value)}\n"  # strings, numbers and lists of them: TOML as JSON
                           for name, value in self.net.switch.driver_settings().items())
        (self.out / "config.toml").write_text(
            f"{servers}\n[balancing]\nhot = {self.hot}\nhysteresis = 1\n"
            f'mode = "equal"  # every replica carries a third: the faulted one is in rotation when its fault comes\n\n'
            f'[controller]\nlisten = "127.0.0.1:{self.port}"\n\n'
            f'[dataplane]\nkind = "{self.dataplane}"\n\n[dataplane.{self.dataplane}]\n{settings}')

    def _pick_keys(self) -> dict[str, tuple[str, int]]:
        hosts = self.net.server_hosts
        key_hash = make_hash("ketama", [ServerAddress(h.ip, MEMCACHED_PORT) for h in hosts])
        keys = {}
        for i in range(10_000):
            key = f"fault:{i}"
            home = key_hash.server_of(key.encode())
            if home != self.avoid:
                keys[key] = (hosts[home].ip, MEMCACHED_PORT)
            if len(keys) == self.hot:
                return keys
        raise RigError(f"no {self.hot} keys homed away from server {self.avoid}")

    def _report(self) -> None:
        """Report `keys` as they are at each report (a benchmark may change them), each with its home."""
        while not self._stop.wait(REPORT_EVERY):
            body = json.dumps({"time": 0, "interval": REPORT_EVERY, "rate": 1000.0 * (len(self.keys) + 1),
                               "top": [{"key": k, "rate": 1000.0, "server": f"{ip}:{port}"}
                                       for k, (ip, port) in self.keys.items()]}).encode()
            request = urllib.request.Request(f"http://127.0.0.1:{self.port}/report", body,
                                             {"Content-Type": "application/json"})
            try:
                urllib.request.urlopen(request, timeout=1).close()
            except (OSError, urllib.error.URLError):
                pass  # the controller is down (a fault): the next report goes to the next one

    def _wait(self, ready, what: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if ready():
                return
            time.sleep(0.05)
        raise RigError(f"{what} not ready after {START_TIMEOUT:g} s")


def _answers(ip: str) -> bool:
    return answers(ServerAddress(ip, MEMCACHED_PORT))
