"""MBalancer's full loop on a running testbed: the controller core with the testbed's data-plane driver (in this
process), its HTTP API, and the monitor (`mbalancer monitor`, a process) sniffing the switch ports where client
requests arrive and pushing its reports to the controller."""
from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from controller.core import ControllerCore
from controller.drivers import make_driver
from controller.http_api import serve, start_serving
from mbalancer.config import Balancing, Config, Controller, Monitoring
from mbalancer.memcache.hashing import KeyHash
from mbalancer.memcache.server import free_port
from mbalancer.processes import stop_process
from topologies.testbed import Testbed

log = logging.getLogger(__name__)


class MBalancerStack:
    def __init__(self, bed: Testbed, balancing: Balancing, key_hash: KeyHash, monitor_interval: float,
                 out: Path, top: int):
        self.bed, self.out, self.top = bed, out, top
        port = free_port()
        self.config = Config(servers=bed.servers, balancing=replace(balancing, hash=key_hash.spec),
                             monitor=Monitoring(interval=monitor_interval),
                             controller=Controller(listen=f"127.0.0.1:{port}"), dataplane=bed.dataplane())
        self.core = ControllerCore(self.config, make_driver(self.config.dataplane), key_hash=key_hash)
        self.port = port
        self.http = None
        self.monitor: subprocess.Popen | None = None
        self._monitor_out = None

    def start(self) -> "MBalancerStack":
        try:
            self.core.start()
            self.http = start_serving(serve(self.core, ("127.0.0.1", self.port)))
            self._monitor_out = open(self.out / "monitor.jsonl", "w")
            self.monitor = subprocess.Popen(
                [sys.executable, "-m", "mbalancer.cli", "monitor", "--iface", ",".join(self.bed.monitor_ports),
                 "--json", "--interval", f"{self.config.monitor.interval:g}", "--top", str(self.top),
                 "--push", f"http://127.0.0.1:{self.port}/report"],
                stdout=self._monitor_out, stderr=subprocess.PIPE, text=True)
        except BaseException:
            self.stop()
            raise
        log.info("MBalancer running: controller on 127.0.0.1:%d, monitor on %s", self.port,
                 ",".join(self.bed.monitor_ports))
        return self

    def hot_keys(self) -> int:
        return len(self.core.state()["hot_keys"])

    def wait_acted(self, timeout: float) -> bool:
        """Wait until the controller has had the reports a key needs to turn hot (hysteresis, plus the monitor's
        first, partial interval) and has acted on them; False if that took longer than `timeout` seconds. How
        soon the monitor starts reporting depends on the machine: a fixed warm-up alone does not say."""
        deadline = time.monotonic() + timeout
        needed = self.config.balancing.hysteresis + 1
        while self.core.counts["reports"] < needed and time.monotonic() < deadline:
            self.check_monitor()
            time.sleep(0.05)
        return self.core.counts["reports"] >= needed and self.core.wait_idle(max(deadline - time.monotonic(), 0))

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
        state = self.core.state() if state is None else state
        if self.http is not None:
            self.http.shutdown()
            self.http.server_close()
            self.http = None
        self.core.stop()
        (self.out / "state.json").write_text(json.dumps(state, indent=1, default=str) + "\n")
        return state
