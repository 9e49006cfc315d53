"""The controller's HTTP interface (JSON both ways).

GET  /state       hot keys, groups, weights, replica health, counters, recent decisions with their reasons
GET  /decisions   every decision kept (the last 1000)
GET  /metrics     the same figures for Prometheus (its text format; controller/metrics.py)
POST /report      a monitor report (what `mbalancer monitor --push URL/report` sends): 202, or 400 with the reason
POST /sketch      {"call": ..., "args": [...]}: one call of a sketch reader on the data plane's hot-key sketch, for a
                  data plane only the controller can read it on (P4: digests reach the P4Runtime primary only);
                  `mbalancer monitor` makes them (monitor/controller_sketch.py): 200 {"result": ...}, 400 for a bad
                  call, 503 when the data plane refuses it (why, in one line)
A known path with another method: 405 (with Allow); anything else: 404 with the list of endpoints. Replies other
than /metrics are strict JSON: a figure that is not a number (NaN, infinity) goes out as null.

Who may ask (controller/access.py): with a token or client certificates configured, every request must carry them,
or it gets 401 in one line before anything else is looked at (its body is not read); HTTPS is ended in
controller/tls_front.py. A read-only listener (metrics_listen) serves the GETs without credentials and refuses the
POSTs with 403. With hide_keys, /state, /decisions and /metrics name keys by hash.

`respond` answers a request whatever carries it: here waitress (a maintained WSGI server: requests are read
asynchronously and handed whole to a small thread pool, so a slow, stalled or vanishing client holds no thread and
prints no traceback; a connection silent for BODY_TIMEOUT seconds is closed; the listen backlog holds BACKLOG
connections), in the Ryu app Ryu's own WSGI server.
"""
from __future__ import annotations

import json
import logging
import math
import shutil
import tempfile
import threading
from http import HTTPStatus
from pathlib import Path
from typing import Any, Callable, Iterable

from waitress.server import create_server

from controller.access import REFUSED, Access, hide_keys
from controller.core import ControllerCore
from controller.metrics import CONTENT_TYPE as METRICS_TYPE, exposition
from controller.tls_front import TlsFront, peer_of
from dataplanes.driver import DriverError

log = logging.getLogger(__name__)

MAX_REPORT_BYTES = 4 * 1024 * 1024
BODY_TIMEOUT = 5  # seconds a connection may stay silent (a stalled request body included); whole seconds (waitress)
BACKLOG = 4096  # connections the kernel queues before the server accepts them (the kernel caps it at somaxconn)
THREADS = 4  # requests answered at once (each answer is a short read of the core's state)
CONNECTIONS = 10_000  # open connections at most
ENDPOINTS = {"GET /state": "controller state", "GET /decisions": "decision log", "GET /metrics": "Prometheus metrics",
             "POST /report": "monitor report", "POST /sketch": "the data plane's sketch, read through the controller"}
JSON = "application/json"


class HttpServer:
    """The HTTP interface on waitress, bound at construction (so a taken port fails at once), served by start().
    With HTTPS (access.tls), waitress listens on a Unix socket of its own and controller/tls_front.py on `address`."""

    def __init__(self, core: ControllerCore, address: tuple[str, int], body_timeout: int = BODY_TIMEOUT,
                 access: Access | None = None, read_only: bool = False):
        access = access or Access()
        host, port = address
        self._folder: str | None = None
        self._front: TlsFront | None = None
        listen: dict[str, Any] = {"host": host, "port": port, "ipv4": ":" not in host, "ipv6": ":" in host}
        if access.tls:
            self._folder = tempfile.mkdtemp(prefix="mbalancer-http-")  # 0700: nobody else reaches the socket
            inner = str(Path(self._folder) / "http.sock")
            listen = {"unix_socket": inner, "unix_socket_perms": "600"}
        try:
            if access.tls:
                self._front = TlsFront(address, access, listen["unix_socket"], max(1, int(body_timeout)), BACKLOG,
                                       CONNECTIONS)
            self._server = create_server(
                wsgi_app(core, access, read_only), **listen, threads=THREADS,
                backlog=BACKLOG, connection_limit=CONNECTIONS, channel_timeout=max(1, int(body_timeout)),
                cleanup_interval=1, asyncore_loop_timeout=1,
                asyncore_use_poll=True,  # select() stops at file descriptor 1024: a thousand clients passed it
                max_request_body_size=MAX_REPORT_BYTES, ident="mbalancer", expose_tracebacks=False,
                clear_untrusted_proxy_headers=True)
        except OSError:  # the address is taken, or not this machine's: nothing left behind
            if self._front is not None:
                self._front.shutdown()
            if self._folder is not None:
                shutil.rmtree(self._folder, ignore_errors=True)
            raise
        if self._front is not None:
            self._server.fix_addr = peer_of  # the client's address, which the relay's socket name carries
            self.server_address: tuple[str, int] = self._front.server_address
        else:
            self.server_address = (self._server.effective_host, self._server.effective_port)
        self.scheme = "https" if access.tls else "http"
        self._thread: threading.Thread | None = None

    def start(self) -> "HttpServer":
        self._thread = threading.Thread(target=self._server.run, name="mbalancer-http", daemon=True)
        self._thread.start()
        if self._front is not None:
            self._front.start()
        return self

    def shutdown(self) -> None:
        """Stop listening, close every connection, stop the worker threads."""
        if self._front is not None:
            self._front.shutdown()
        server = self._server
        server.task_dispatcher.shutdown(timeout=2)
        if self._thread is not None and self._thread.is_alive():
            # Closed from the serving loop's own thread (waitress runs a trigger's thunks there): closed from this one,
            # the listener could go while the loop accepts a connection, and waitress logs a traceback for it. Only
            # there, even if it is slow to end: two threads closing the trigger may close its fd twice, the second
            # time another server's that took the number meanwhile.
            server.trigger.pull_trigger(lambda: _close_channels(server))
            self._thread.join(timeout=3)
        else:
            _close_channels(server)  # never served, or its loop ended: nothing else closes them
        self._thread = None  # a second shutdown pulls no trigger (closed: its fd number may be another's by then)
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)


def _close_channels(server) -> None:
    """Close the listener, the trigger and every client connection: waitress's loop ends once none is left."""
    for channel in list(server._map.values()):
        channel.close()


def serve(core: ControllerCore, address: tuple[str, int], body_timeout: int = BODY_TIMEOUT,
          access: Access | None = None, read_only: bool = False) -> HttpServer:
    """Bind (host, port) (port 0: any free one; see server_address) and return the server, not yet serving:
    start_serving() serves it, shutdown() stops it. `access`: the credentials every request needs (none: open);
    read_only: GETs only (metrics_listen)."""
    return HttpServer(core, address, body_timeout, access, read_only)


def start_serving(server: HttpServer) -> HttpServer:
    """Serve in a daemon thread; returns the server (shutdown() stops it)."""
    return server.start()


def wsgi_app(core: ControllerCore, access: Access | None = None, read_only: bool = False) -> Callable:
    """The interface as a WSGI application: every method and path goes to `respond`."""
    def app(environ: dict, start_response: Callable) -> Iterable[bytes]:
        reply = respond(core, environ["REQUEST_METHOD"], environ.get("PATH_INFO", ""),
                        environ.get("CONTENT_LENGTH", ""), environ["wsgi.input"].read, environ.get("REMOTE_ADDR", "?"),
                        environ.get("HTTP_AUTHORIZATION", ""), access, read_only)
        if reply is None:
            reply = 400, {"error": "the request body did not arrive"}, {}
        status, body, headers = reply
        data = body if isinstance(body, bytes) else encode(body)
        headers = {"Content-Type": JSON, **headers, "Content-Length": str(len(data))}
        start_response(f"{status} {HTTPStatus(status).phrase}", list(headers.items()))
        return [data]
    return app


Reply = tuple[int, Any, dict[str, str]]  # status, body (JSON data, or bytes sent as they are), extra headers


def respond(core: ControllerCore, method: str, path: str, length: str, read: Callable[[int], bytes],
            client: str = "?", authorization: str = "", access: Access | None = None,
            read_only: bool = False) -> Reply | None:
    """The answer to one request, whichever server carries it (waitress here, Ryu's WSGI in the Ryu app):
    `length` is the Content-Length header as sent, `read(n)` the body, `authorization` its Authorization header,
    checked against `access` (None: open) before anything else. None: the body never came (OSError from `read`), so
    there is nobody to answer."""
    access = access or Access()
    if (why := access.refusal(authorization)) is not None:
        access.refuse(why, f"{method[:10]} {path[:100]}", client)
        return 401, {"error": f"{why}: {REFUSED[why]}"}, {"WWW-Authenticate": 'Bearer realm="mbalancer"'}
    if method == "GET" and path == "/state":
        return 200, hide_keys(core.state()) if access.hide_keys else core.state(), {}
    if method == "GET" and path == "/decisions":
        decisions = core.decisions_made()
        return 200, hide_keys(decisions) if access.hide_keys else decisions, {}
    if method == "GET" and path == "/metrics":
        return 200, exposition(core, access.hide_keys, access.refused), {"Content-Type": METRICS_TYPE}
    if method == "POST" and read_only and path in ("/report", "/sketch"):
        return 403, {"error": f"POST {path}: this address (controller.metrics_listen) serves reads only: post to "
                              f"controller.listen, with its credentials"}, {}
    if method != "POST" or path not in ("/report", "/sketch"):
        return _wrong_method(method, path)
    if not length.isdigit() or not 0 < int(length) <= MAX_REPORT_BYTES:
        return 400, {"error": f"Content-Length: give a JSON body of 1 to {MAX_REPORT_BYTES} bytes "
                              f"(got {length[:20]!r})"}, {}
    try:
        body = read(int(length))
    except OSError as err:  # the body's sender stalled (BODY_TIMEOUT) or went away
        log.warning("%s from %s not received: %s", path, client, err)
        return None
    if path == "/sketch":
        return _sketch(core, body)
    try:
        report = core.submit_report(json.loads(body))
    except (ValueError, RecursionError) as err:  # a ReportError, bad JSON, or JSON nested too deep
        why = "JSON nested too deep" if isinstance(err, RecursionError) else str(err)
        log.warning("report refused: %s", why)
        return 400, {"error": why}, {}
    return 202, {"accepted": True, "keys": len(report.top)}, {}


def _sketch(core: ControllerCore, body: bytes) -> Reply:
    """A sketch reader's call, passed to the driver; heavy keys go out with their keys in hex."""
    try:
        request = json.loads(body)
        call, args = request["call"], request.get("args", [])
        if not isinstance(call, str) or not isinstance(args, list) or \
                not all(isinstance(a, int) and not isinstance(a, bool) for a in args):
            raise ValueError
    except (ValueError, RecursionError, TypeError, KeyError):
        return 400, {"error": 'give {"call": NAME, "args": [whole numbers]}'}, {}
    try:
        result = core.driver.sketch_call(call, tuple(args))
    except DriverError as err:
        return 503, {"error": str(err)}, {}
    if call == "heavy_keys":
        result = [{"key": h.key.hex(), "count": h.count, "server": h.server} for h in result]
    return 200, {"result": result}, {}


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


def json_safe(value: Any) -> Any:
    """`value` with every float that JSON cannot carry (NaN, infinity) as None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value
