"""The controller's HTTP interface (JSON both ways).

GET  /state       hot keys, groups, weights, replica health, counters, recent decisions with their reasons
GET  /decisions   every decision kept (the last 1000)
POST /report      a monitor report (what `mbalancer monitor --push URL/report` sends): 202, or 400 with the reason
A known path with another method: 405 (with Allow); anything else: 404 with the list of endpoints. A body that
does not arrive within BODY_TIMEOUT seconds ends the connection. Replies are strict JSON: a figure that is not a
number (NaN, infinity) goes out as null. A thread per request (http.server), greened under eventlet.
"""
from __future__ import annotations

import json
import logging
import math
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

from controller.core import ControllerCore

log = logging.getLogger(__name__)

MAX_REPORT_BYTES = 4 * 1024 * 1024
BODY_TIMEOUT = 5.0  # seconds a client may take to send its request: a stalled one does not hold a thread forever
ENDPOINTS = {"GET /state": "controller state", "GET /decisions": "decision log", "POST /report": "monitor report"}


def serve(core: ControllerCore, address: tuple[str, int], body_timeout: float = BODY_TIMEOUT) -> ThreadingHTTPServer:
    """Bind (host, port) (port 0: any free one; see server.server_address) and return the server, not yet
    serving: run serve_forever() in a thread, shutdown() to stop."""
    host, port = address
    handler = type("Handler", (_Handler,), {"core": core, "timeout": body_timeout})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    return server


def start_serving(server: ThreadingHTTPServer) -> ThreadingHTTPServer:
    """Serve in a daemon thread; returns the server (shutdown() stops it)."""
    threading.Thread(target=server.serve_forever, name="mbalancer-http", daemon=True).start()
    return server


Reply = tuple[int, Any, dict[str, str]]  # status, JSON body, extra headers


def respond(core: ControllerCore, method: str, path: str, length: str, read: Callable[[int], bytes],
            client: str = "?") -> Reply | None:
    """The answer to one request, whichever server carries it (http.server here, Ryu's WSGI in the Ryu app):
    `length` is the Content-Length header as sent, `read(n)` the body. None: the body never came (OSError from
    `read`), so there is nobody to answer."""
    if method == "GET" and path == "/state":
        return 200, core.state(), {}
    if method == "GET" and path == "/decisions":
        return 200, core.decisions_made(), {}
    if method != "POST" or path != "/report":
        return _wrong_method(method, path)
    if not length.isdigit() or not 0 < int(length) <= MAX_REPORT_BYTES:
        return 400, {"error": f"Content-Length: give a JSON report of 1 to {MAX_REPORT_BYTES} bytes "
                              f"(got {length[:20]!r})"}, {}
    try:
        body = read(int(length))
    except OSError as err:  # the body's sender stalled (BODY_TIMEOUT) or went away
        log.warning("report from %s not received: %s", client, err)
        return None
    try:
        report = core.submit_report(json.loads(body))
    except (ValueError, RecursionError) as err:  # a ReportError, bad JSON, or JSON nested too deep
        why = "JSON nested too deep" if isinstance(err, RecursionError) else str(err)
        log.warning("report refused: %s", why)
        return 400, {"error": why}, {}
    return 202, {"accepted": True, "keys": len(report.top)}, {}


def _wrong_method(method: str, path: str) -> Reply:
    """405 naming the allowed methods where the path exists, else 404 listing every endpoint."""
    allowed = [route.split()[0] for route in ENDPOINTS if route.split()[1] == path]
    if not allowed:
        return 404, {"error": f"no such endpoint {path}", "endpoints": ENDPOINTS}, {}
    return 405, {"error": f"{method} {path}: use {', '.join(allowed)}", "endpoints": ENDPOINTS}, \
        {"Allow": ", ".join(allowed)}


def encode(body: Any) -> bytes:
    """Strict JSON: a figure that is not a number goes out as null."""
    return json.dumps(json_safe(body), allow_nan=False).encode()


class _Handler(BaseHTTPRequestHandler):
    core: ControllerCore
    server_version = "mbalancer"
    timeout: float  # seconds, applied to the connection's socket by StreamRequestHandler (see serve)

    def _answer(self) -> None:
        reply = respond(self.core, self.command, self.path, self.headers.get("Content-Length", ""), self.rfile.read,
                        self.address_string())
        if reply is None:
            self.close_connection = True
            return
        status, body, headers = reply
        data = encode(body)
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _answer

    def log_message(self, format: str, *args) -> None:  # route http.server's access log into logging
        log.debug("%s " + format, self.address_string(), *args)


def json_safe(value: Any) -> Any:
    """`value` with every float that JSON cannot carry (NaN, infinity) as None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value
