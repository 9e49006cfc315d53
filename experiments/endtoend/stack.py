"""MBalancer's full loop on a running testbed: the controller core with the testbed's data-plane driver, its HTTP
API, and the monitor (`mbalancer monitor`, a process) sniffing the switch ports where client requests arrive and
pushing its reports to the controller. The core runs in this process (LocalController), or inside ryu-manager
(RyuController: the Ryu app, reached over its HTTP API; the OpenFlow data plane's way, and on P4 or eBPF when asked)."""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
import urllib.request
from dataclasses import replace
from pathlib import Path

from controller.core import ControllerCore
from controller.http_api import serve, start_serving
from controller.ryu_manager import launch
from dataplanes import registry
from mbalancer.config import Balancing, Config, Controller, Monitoring, config_toml
from mbalancer.memcache.addresses import parse_server
from mbalancer.memcache.hashing import KeyHash
from mbalancer.memcache.server import free_port
from mbalancer.processes import stop_process
from topologies.testbed import Testbed

log = logging.getLogger(__name__)


RYU_START = 30.0  # seconds ryu-manager may take to serve its HTTP API with the switches connected


def post_report(url: str, top: list[tuple[bytes, float]]) -> None:
    """POST a monitor report of these (key, gets/s) to the controller's HTTP API at `url`, as `mbalancer monitor
    --push` would."""
    body = {"time": time.time(), "interval": 1.0, "rate": 1000.0,
            "top": [{"key": key.decode("latin-1"), "rate": rate} for key, rate in top]}
    request = urllib.request.Request(f"{url}/report", json.dumps(body).encode(), {"Content-Type": "application/json"})
    urllib.request.urlopen(request, timeout=5).close()  # anything but 2xx raises HTTPError


class LocalController:
    """The core and its HTTP API in this process."""

    def __init__(self, config: Config, key_hash: KeyHash, out: Path):
        driver = registry.get(config.dataplane.kind).make_driver(config.dataplane.settings)
        self.core = ControllerCore(config, driver, key_hash=key_hash)
        self.http = None
        self.pid = os.getpid()

    def start(self) -> None:
        self.core.start()
        self.http = start_serving(serve(self.core, parse_server(self.core.config.controller.listen)))

    def state(self) -> dict:
        return self.core.state()

    def report(self, top: list[tuple[bytes, float]]) -> None:
        post_report(f"http://{self.core.config.controller.listen}", top)

    def reports(self) -> int:
        return self.core.counts["reports"]

    def wait_idle(self, timeout: float) -> bool:
        return self.core.wait_idle(timeout)

    def stop(self) -> None:
        if self.http is not None:
            self.http.shutdown()
            self.http = None
        self.core.stop()


class RyuController:
    """The core inside ryu-manager (the Ryu app), with the same config; a skewed hash goes as its key table."""

    def __init__(self, config: Config, key_hash: KeyHash, out: Path):
        self.config, self.out = config, out
        self.url = f"http://{config.controller.listen}"
        (out / "mbalancer.toml").write_text(config_toml(config))
        self.homes = None
        if hasattr(key_hash, "placement"):
            self.homes = out / "homes.json"
            self.homes.write_text(json.dumps({k.decode("latin-1"): s for k, s in key_hash.placement().items()}))
        self.process: subprocess.Popen | None = None
        self.pid = 0

    def start(self) -> None:
        log_file = open(self.out / "ryu-manager.log", "w")
        self.process = launch(self.out / "mbalancer.toml", log_file, self.homes)
        log_file.close()
        self.pid = self.process.pid
        deadline = time.monotonic() + RYU_START
        while not self._ready():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"ryu-manager did not start, or no switch connected to it (see "
                                   f"{self.out}/ryu-manager.log): {self.log()[-500:]}")
            time.sleep(0.1)

    def _ready(self) -> bool:
        """The HTTP API answers, and on OpenFlow a switch has connected and been programmed (other data planes'
        drivers reach their switches themselves, before the API starts)."""
        try:
            connected = self.config.dataplane.kind != "openflow" or "hot keys installed" in self.log()
            return connected and bool(self.state())
        except OSError:
            return False

    def log(self) -> str:
        return (self.out / "ryu-manager.log").read_text()

    def state(self) -> dict:
        with urllib.request.urlopen(f"{self.url}/state", timeout=5) as reply:
            return json.load(reply)

    def report(self, top: list[tuple[bytes, float]]) -> None:
        post_report(self.url, top)

    def reports(self) -> int:
        return self.state()["counters"].get("reports", 0)

    def wait_idle(self, timeout: float) -> bool:
        """The app's state is published after each batch is handled: a report it counts has been acted on."""
        return True

    def stop(self) -> int | None:
        """Stop ryu-manager; its exit status (None if it was not running)."""
        if self.process is None:
            return None
        process, self.process = self.process, None
        stop_process(process)
        return process.returncode


class MBalancerStack:
    def __init__(self, bed: Testbed, balancing: Balancing, key_hash: KeyHash, monitor_interval: float,
                 out: Path, top: int, detection: str = "capture", controller: str = "local"):
        self.bed, self.out, self.top, self.detection = bed, out, top, detection
        port = free_port()
        self.config = Config(servers=bed.servers, balancing=replace(balancing, hash=key_hash.spec),
                             monitor=Monitoring(interval=monitor_interval),
                             controller=Controller(listen=f"127.0.0.1:{port}"), dataplane=bed.dataplane())
        kind = RyuController if controller == "ryu" else LocalController
        self.controller = kind(self.config, key_hash, out)
        self.port = port
        self.monitor: subprocess.Popen | None = None
        self._monitor_out = None

    def start(self) -> "MBalancerStack":
        try:
            self.controller.start()
            self._monitor_out = open(self.out / "monitor.jsonl", "w")
            self.monitor = subprocess.Popen(
                [sys.executable, "-m", "mbalancer.cli", "monitor", *self._monitor_source(),
                 "--json", "--interval", f"{self.config.monitor.interval:g}", "--top", str(self.top),
                 "--push", f"http://127.0.0.1:{self.port}/report"],
                stdout=self._monitor_out, stderr=subprocess.PIPE, text=True)
        except BaseException:
            self.stop()
            raise
        log.info("MBalancer running: controller on 127.0.0.1:%d, monitor %s", self.port,
                 "reading the switch's sketch" if self.detection == "sketch"
                 else "capturing on " + ",".join(self.bed.monitor_ports))
        return self

    def _monitor_source(self) -> list[str]:
        """The monitor's options for the detection: the switch's sketch (found from the config, as an operator's
        `mbalancer monitor --config` finds it) or a capture on the client ports."""
        if self.detection == "sketch":
            config_file = self.out / "mbalancer.toml"
            config_file.write_text(config_toml(self.config))
            return ["--config", str(config_file)]
        return ["--iface", ",".join(self.bed.monitor_ports)]

    def hot_keys(self) -> int:
        return len(self.controller.state()["hot_keys"])

    def state(self) -> dict:
        return self.controller.state()

    def reports(self) -> int:
        return self.controller.reports()

    def wait_acted(self, timeout: float) -> bool:
        """Wait until the controller has had the reports a key needs to turn hot (hysteresis, plus the monitor's
        first, partial interval) and has acted on them; False if that took longer than `timeout` seconds. How
        soon the monitor starts reporting depends on the machine: a fixed warm-up alone does not say."""
        deadline = time.monotonic() + timeout
        needed = self.config.balancing.hysteresis + 1
        while self.reports() < needed and time.monotonic() < deadline:
            self.check_monitor()
            time.sleep(0.05)
        return self.reports() >= needed and self.controller.wait_idle(max(deadline - time.monotonic(), 0))

    def check_monitor(self) -> None:
        """Raise if the monitor process died (its own words)."""
        if self.monitor is not None and self.monitor.poll() is not None:
            raise RuntimeError(f"the monitor exited with code {self.monitor.returncode}: "
                               f"{self.monitor.stderr.read().strip()[-500:]}")

    def stop(self, state: dict | None = None) -> dict:
        """Stop everything; returns `state` (the controller's state taken when the caller chose, e.g. as the
        measurement ended), or the final state if none was taken; it is also written to state.json."""
        if self.monitor is not None:
            stop_process(self.monitor)
            (self.out / "monitor.log").write_text(self.monitor.stderr.read())
            self.monitor = None
        if self._monitor_out is not None:
            self._monitor_out.close()
            self._monitor_out = None
        state = self.controller.state() if state is None else state
        self.controller.stop()
        (self.out / "state.json").write_text(json.dumps(state, indent=1, default=str) + "\n")
        return state
