"""A UDP relay in front of a real memcached, for client tests: it can answer from another address (as a replica
steered to by the switch would) and hold replies back (to make late replies)."""
from __future__ import annotations

import socket
import threading
import time

from mbalancer.memcache.udp import udp_socket


class UdpRelay:
    def __init__(self, upstream: tuple[str, int], answer_from_other_port: bool = False, delays: tuple = ()):
        self.upstream = upstream
        self.front = udp_socket()
        self.front.bind(("127.0.0.1", 0))
        self.front.settimeout(0.05)
        self.back = self.front
        if answer_from_other_port:
            self.back = udp_socket()
            self.back.bind(("127.0.0.1", 0))
        self.address = self.front.getsockname()
        self.answer_address = self.back.getsockname()
        self.delays = list(delays)  # seconds to hold the reply of the 1st, 2nd, ... request
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)


    def __enter__(self) -> "UdpRelay":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopping.set()
        self.thread.join(5)
        self.front.close()
        if self.back is not self.front:
            self.back.close()

    def _serve(self) -> None:
        with udp_socket() as upstream:
            upstream.settimeout(1.0)
            while not self.stopping.is_set():
                try:
                    request, client = self.front.recvfrom(65536)
                except socket.timeout:
                    continue
                upstream.sendto(request, self.upstream)
                replies = [upstream.recv(65536)]
                total = int.from_bytes(replies[0][4:6], "big")
                replies += [upstream.recv(65536) for _ in range(total - 1)]
                time.sleep(self.delays.pop(0) if self.delays else 0)
                for datagram in replies:
                    self.back.sendto(datagram, client)
