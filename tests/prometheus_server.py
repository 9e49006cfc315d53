"""Debian's Prometheus server (apt package prometheus), started by a test on a loopback port to scrape the
controllers it names every second, and asked through its HTTP API; stopped by PID, its data in the test's folder.
Grafana is in no registry here: running each query of each panel of install/grafana/'s dashboard through this
server's API is how the dashboard is proven (dashboard_queries gives them as Grafana would send them)."""
from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

from mbalancer.memcache.server import free_port
from mbalancer.processes import stop_process

DASHBOARD = Path(__file__).resolve().parent.parent / "install" / "grafana" / "mbalancer-dashboard.json"
SCRAPE_EVERY = "1s"
RATE_INTERVAL = "10s"  # what Grafana puts for $__rate_interval (at least four scrapes)


def available() -> str | None:
    return None if shutil.which("prometheus") else "Debian's prometheus is not installed (make install)"


class PrometheusServer:
    def __init__(self, folder: Path, targets: list[str], scrape: dict | None = None):
        """`scrape`: more of the scrape config (scheme, authorization, tls_config: a controller with credentials)."""
        self.folder = folder
        self.port = free_port()
        config = folder / "prometheus.yml"
        config.write_text(json.dumps({  # YAML is a superset of JSON
            "global": {"scrape_interval": SCRAPE_EVERY, "evaluation_interval": SCRAPE_EVERY},
            "scrape_configs": [{"job_name": "mbalancer", "static_configs": [{"targets": targets}], **(scrape or {})}]}))
        self.log = open(folder / "prometheus.log", "w")
        self.process = subprocess.Popen(
            ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={folder / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}"], stdout=self.log, stderr=subprocess.STDOUT)

    def __enter__(self) -> "PrometheusServer":
        deadline = time.monotonic() + 30
        while not self._ready():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"prometheus did not start: {(self.folder / 'prometheus.log').read_text()[-2000:]}")
            time.sleep(0.1)
        return self

    def __exit__(self, *_) -> None:
        self.stop()

    def stop(self) -> None:
        stop_process(self.process, grace=20)
        self.log.close()

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2) as reply:
                return reply.status == 200
        except OSError:
            return False

    def query(self, expr: str) -> list[dict]:
        """The series an instant query returns now (Prometheus's HTTP API)."""
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=10) as reply:
            answer = json.load(reply)
        assert answer["status"] == "success", answer
        return answer["data"]["result"]

    def targets_up(self) -> bool:
        return any(float(series["value"][1]) == 1 for series in self.query('up{job="mbalancer"}'))


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, query) for every query of every panel, with Grafana's variables put in as Grafana does."""
    dashboard = json.loads(DASHBOARD.read_text())
    return [(panel["title"], target["expr"].replace("$__rate_interval", RATE_INTERVAL))
            for panel in dashboard["panels"] for target in panel["targets"]]
