"""A TCP relay on 127.0.0.1 in front of a server (a switch agent): the network between a controller and its agent,
which a test cuts (every connection through it closed at once, as a broken link ends them) and heals."""
from __future__ import annotations

import socket
import threading

CHUNK = 65536


class TcpRelay:
    """Forwards each connection made to `address` to `upstream`; `cut` ends every one, and while `held` new ones
    are closed as soon as they come."""

    def __init__(self, upstream: tuple[str, int]):
        self.upstream = upstream
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.2)
        self.address = "%s:%d" % self.listener.getsockname()
        self.held = threading.Event()
        self.cuts = 0
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="tcp-relay", daemon=True)

    def __enter__(self) -> "TcpRelay":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(5)
        self.cut()
        self.listener.close()

    def cut(self, hold: bool = False) -> None:
        """Every connection through the relay ended now; with `hold`, new ones too until `heal`."""
        if hold:
            self.held.set()
        with self._lock:
            ends, self._open = list(self._open), set()
            self.cuts += 1
        for end in ends:
            _close(end)

    def heal(self) -> None:
        self.held.clear()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self.listener.accept()
            except (socket.timeout, OSError):
                continue
            if self.held.is_set():
                _close(client)
                continue
            try:
                server = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                _close(client)
                continue
            with self._lock:
                self._open |= {client, server}
            for source, sink in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        """Bytes one way until either end closes (or is cut); then both ends closed."""
        source.settimeout(None)
        try:
            while data := source.recv(CHUNK):
                sink.sendall(data)
        except OSError:
            pass
        with self._lock:
            self._open -= {source, sink}
        _close(source)
        _close(sink)


def _close(end: socket.socket) -> None:
    try:
        end.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    end.close()
