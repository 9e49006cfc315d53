"""A data plane's driver in a process of its own, behind the same driver interface (dataplanes/driver.py).

Why: ryu-manager monkey-patches threads and sockets for eventlet, and a driver whose client blocks in C stalls its
hub (the P4Runtime driver's gRPC: the Ryu app hung at its first call and ignored SIGTERM). The Ryu app makes such a
driver here: a child process (`python -m dataplanes.driver_process FD`, nothing patched) runs the registry's driver
of that kind, and DriverProcess forwards each call of the interface (ForwardedDriver: the calls derived from
dataplanes/driver.py CALLS) over a socket pair, one at a time: a pickled (method, arguments) in, the result or the
DriverError's text out. What the driver delivers on its own (copies to on_mirror, on_reconnect) comes back as events
on the same socket, read by one thread here that hands them to the core's callbacks (which only queue). The child
ends when the socket does: with close(), or when this process dies.
"""
from __future__ import annotations

import logging
import pickle
import queue
import socket
import struct
import subprocess
import sys
import threading
import time
from typing import Any

from dataplanes.driver import Driver, DriverError
from dataplanes.forwarded_driver import ForwardedDriver, answer
from mbalancer.processes import stop_process

log = logging.getLogger(__name__)
CALL_TIMEOUT = 30.0  # seconds a call may take in the child (the driver's own timeouts are shorter)
START_TIMEOUT = 30.0  # seconds the child may take to import and make its driver
LENGTH = struct.Struct("!I")
MAX_MESSAGE = 64 << 20  # a frame, a counters snapshot: far less; a corrupt length is refused, not allocated


def send(sock: socket.socket, message: tuple) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    sock.sendall(LENGTH.pack(len(data)) + data)


def receive(sock: socket.socket) -> tuple | None:
    """The next message, None when the other end closed (or sent a length no message has)."""
    head = _exactly(sock, LENGTH.size)
    if head is None or not 0 < (size := LENGTH.unpack(head)[0]) <= MAX_MESSAGE:
        return None
    data = _exactly(sock, size)
    return None if data is None else pickle.loads(data)  # from our own child or parent, over a socket pair


def _exactly(sock: socket.socket, size: int) -> bytes | None:
    chunks, left = [], size
    while left:
        try:
            chunk = sock.recv(min(left, 1 << 20))
        except OSError:
            return None
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


class DriverProcess(ForwardedDriver):
    """The driver of data plane `kind`, with `settings`, running in a child process."""

    def __init__(self, kind: str, settings: Any = None):
        self.kind, self.settings = kind, settings
        self._results: queue.Queue[tuple] = queue.Queue()
        self._lock = threading.Lock()  # one call at a time
        self._calls = 0  # numbers the calls: a result that comes after its call gave up answers no later one
        ours, theirs = socket.socketpair()
        self._sock = ours
        self.process = subprocess.Popen([sys.executable, "-m", "dataplanes.driver_process", str(theirs.fileno())],
                                        pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL)
        theirs.close()
        self._reader = threading.Thread(target=self._read, name=f"mbalancer-{kind}-driver-process", daemon=True)
        self._reader.start()
        try:
            made = self._call("make", (kind, settings), START_TIMEOUT)
        except DriverError:
            self.close()
            raise
        self.name, self.max_replicas = made["name"], made["max_replicas"]

    def close(self) -> None:
        """The driver closes in the child (its lease ended there), then the child exits."""
        if self.process.poll() is None:
            try:
                self._call("close", ())
            except DriverError as err:
                log.info("closing the %s driver process: %s", self.kind, err)
        self._sock.close()
        stop_process(self.process, asked=True)  # (closed, its end of the socket sees the end: it exits)

    # --- inside ----------------------------------------------------------------------------------------------
    def _call(self, method: str, args: tuple, timeout: float = CALL_TIMEOUT) -> Any:
        with self._lock:
            self._calls += 1
            try:
                send(self._sock, ("call", self._calls, method, args))
            except OSError as err:
                raise DriverError(f"the {self.kind} driver process is gone ({err})") from None
            deadline = time.monotonic() + timeout
            while True:
                try:
                    outcome, number, value = self._results.get(timeout=max(deadline - time.monotonic(), 0))
                except queue.Empty:
                    raise DriverError(f"the {self.kind} driver process did not answer {method} within "
                                      f"{timeout:g} s") from None
                if number in (self._calls, None):  # None: the process ended
                    break
        if outcome == "error":
            raise DriverError(value)
        return value

    def _read(self) -> None:
        while (message := receive(self._sock)) is not None:
            kind = message[0]
            if kind in ("result", "error"):
                self._results.put(message)
            elif kind == "mirror" and self.on_mirror is not None:
                self.on_mirror(message[1])
            elif kind == "reconnect" and self.on_reconnect is not None:
                self.on_reconnect(*message[1:])
        self._results.put(("error", None, f"the {self.kind} driver process exited"))


# --- the child -------------------------------------------------------------------------------------------------
class _Child:
    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.send_lock = threading.Lock()  # the driver's threads send copies while the main loop answers
        self.driver: Driver | None = None

    def send(self, message: tuple) -> None:
        with self.send_lock:
            try:
                send(self.sock, message)
            except OSError:
                pass  # the parent is gone: the main loop sees the socket end and stops

    def serve(self) -> None:
        method = None
        while (message := receive(self.sock)) is not None:
            _, number, method, args = message
            try:
                self.send(("result", number, self.answer(method, args)))
            except (DriverError, ValueError) as err:  # ValueError: an unknown kind, bad settings
                self.send(("error", number, str(err)))
            except Exception as err:  # a bug in a driver: said in one line, the child goes on
                log.exception("%s failed", method)
                self.send(("error", number, f"{method}: {type(err).__name__}: {err}"))
            if method == "close":
                break
        if self.driver is not None and method != "close":
            self.driver.close()  # the parent died: end the lease as a stopped controller does

    def answer(self, method: str, args: tuple) -> Any:
        if method == "make":
            from dataplanes import registry
            kind, settings = args
            self.driver = registry.get(kind).make_driver(settings)
            return {"name": self.driver.name, "max_replicas": self.driver.max_replicas}
        if self.driver is None:
            raise DriverError(f"the driver process takes no {method!r} before its driver is made")
        return answer(self.driver, method, args, lambda frame: self.send(("mirror", frame)),
                      lambda *came_back: self.send(("reconnect", *came_back)))


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    sock = socket.socket(fileno=int(sys.argv[1]))
    sock.setblocking(True)  # an eventlet parent made its end non-blocking; this end is the child's alone
    try:
        _Child(sock).serve()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
