"""UDP sockets sized for memcached replies: a 1 MB value arrives as about 750 datagrams at once."""
from __future__ import annotations

import logging
import socket

log = logging.getLogger(__name__)

SO_RCVBUFFORCE = getattr(socket, "SO_RCVBUFFORCE", 33)  # Linux; Python does not export it
REPLY_BUFFER = 8 * 1024 * 1024  # room for a 1 MB reply (each datagram costs about 2.3 KB of kernel memory)


def udp_socket(receive_buffer: int = REPLY_BUFFER) -> socket.socket:
    """An IPv4 UDP socket whose receive buffer holds a whole large reply.

    The default (net.core.rmem_max, about 208 KB) drops most datagrams of a 300 KB reply. As root the buffer is
    forced past rmem_max; otherwise it is raised as far as rmem_max allows, and large replies may time out.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, receive_buffer)
    except PermissionError:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        got = sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
        log.warning("UDP receive buffer limited to %d bytes (not root; raise net.core.rmem_max): replies over "
                    "about %d KB may be lost", got, got // 2300 * 1400 // 1024)
    return sock
