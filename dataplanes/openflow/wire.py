"""Reading OpenFlow off a stream socket, for the OpenFlow driver's bridge connection (bridge_connection.py) and the
short OpenFlow 1.0 connection that sets port flags (port_flags.py)."""
from __future__ import annotations

import socket


def read_exactly(sock: socket.socket, n: int) -> bytes:
    """The next `n` bytes of the connection (OSError if it closes first)."""
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise OSError("the connection closed")
        data += chunk
    return data
