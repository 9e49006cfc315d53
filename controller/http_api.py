"""The controller's HTTP interface (JSON both ways).

GET  /state       hot keys, groups, weights, replica health, counters, recent decisions with their reasons
GET  /decisions   every decision kept (the last 1000)
POST /report      a monitor report (what `mbalancer monitor --push URL/report` sends): 202, or 400 with the reason
Anything else: 404 with the list of endpoints. A thread per request (http.server), greened under eventlet.
"""
from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from controller.core import ControllerCore

log = logging.getLogger(__name__)

MAX_REPORT_BYTES = 4 * 1024 * 1024
ENDPOINTS = {"GET /state": "controller state", "GET /decisions": "decision log", "POST /report": "monitor report"}


def serve(core: ControllerCore, address: tuple[str, int]) -> ThreadingHTTPServer:
    """Bind (host, port) (port 0: any free one; see server.server_address) and return the server, not yet
    serving: run serve_forever() in a thread, shutdown() to stop."""
    host, port = address
    handler = type("Handler", (_Handler,), {"core": core})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    return server


def start_serving(server: ThreadingHTTPServer) -> ThreadingHTTPServer:
    """Serve in a daemon thread; returns the server (shutdown() stops it)."""
    threading.Thread(target=server.serve_forever, name="mbalancer-http", daemon=True).start()
    return server


class _Handler(BaseHTTPRequestHandler):
    core: ControllerCore
    server_version = "mbalancer"

    def do_GET(self) -> None:
        if self.path == "/state":
            self._reply(200, self.core.state())
        elif self.path == "/decisions":
            self._reply(200, self.core.decisions_made())
        else:
            self._reply(404, {"error": f"no such endpoint {self.path}", "endpoints": ENDPOINTS})

    def do_POST(self) -> None:
        if self.path != "/report":
            return self._reply(404, {"error": f"no such endpoint {self.path}", "endpoints": ENDPOINTS})
        length = int(self.headers.get("Content-Length") or 0)
        if not 0 < length <= MAX_REPORT_BYTES:
            return self._reply(400, {"error": f"body: give a JSON report of 1 to {MAX_REPORT_BYTES} bytes"})
        try:
            report = self.core.submit_report(json.loads(self.rfile.read(length)))
        except ValueError as err:  # a ReportError, or a JSONDecodeError
            log.warning("report refused: %s", err)
            return self._reply(400, {"error": str(err)})
        self._reply(202, {"accepted": True, "keys": len(report.top)})

    def _reply(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args) -> None:  # route http.server's access log into logging
        log.debug("%s " + format, self.address_string(), *args)
