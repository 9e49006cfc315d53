"""Blocking memcached clients: UDP (ours: request-id correlation, replies from any server) and TCP (pymemcache).

The UDP client behaves as the thesis's web servers did: one request at a time, blocking until the reply or a
timeout of 1 s. A reply is accepted from whichever server sends it (MBalancer may have steered the get to a
replica) and that server is recorded. Late replies to requests that timed out are dropped, never taken for the
answer to a later request.
"""
from __future__ import annotations

import socket
import time
from dataclasses import dataclass
from typing import Sequence

from mbalancer.memcache.addresses import ServerAddress
from mbalancer.memcache.frame import UDP_HEADER_SIZE, pack_udp_frame
from mbalancer.memcache.hashing import KeyHash
from mbalancer.memcache.pending import STRAY, PendingReply
from mbalancer.memcache.replies import Reply, ValuesReply, outcome_of, parse_reply
from mbalancer.memcache.requests import build_get, build_set
from mbalancer.memcache.results import NotParsed
from mbalancer.memcache.udp import REPLY_BUFFER, udp_socket

DEFAULT_TIMEOUT = 1.0  # seconds, as the thesis's web servers
MAX_UDP_REQUEST = 65507 - UDP_HEADER_SIZE  # memcached reads a UDP request from one datagram only
MAX_DATAGRAM = 65536


@dataclass(frozen=True)
class UdpResult:
    """What one UDP request came to. outcome: a replies.OUTCOMES word, or "timeout"."""

    outcome: str
    asked: ServerAddress
    answered: ServerAddress | None  # None on timeout
    latency: float  # seconds from send to the last datagram of the reply (to the timeout on a timeout)
    reply: Reply | NotParsed | None = None

    @property
    def value(self) -> bytes | None:
        """The value of a get that hit, else None."""
        if isinstance(self.reply, ValuesReply) and self.reply.items:
            return self.reply.items[0].value
        return None


class UdpClient:
    """One blocking UDP client (one socket, like one web-server thread). Servers are chosen by `key_hash` over
    `servers`, or given per call."""

    def __init__(self, servers: Sequence[ServerAddress] = (), key_hash: KeyHash | None = None,
                 timeout: float = DEFAULT_TIMEOUT, receive_buffer: int = REPLY_BUFFER):
        self.servers = list(servers)
        self.key_hash = key_hash
        self.timeout = timeout
        self.strays = 0  # datagrams dropped: late replies and replies to someone else
        self._request_id = 0
        self._socket = udp_socket(receive_buffer)

    def get(self, key: bytes, server: ServerAddress | None = None) -> UdpResult:
        return self.request(build_get(key), self._server_for(key, server))

    def set(self, key: bytes, value: bytes, flags: int = 0, exptime: int = 0,
            server: ServerAddress | None = None) -> UdpResult:
        return self.request(build_set(key, value, flags, exptime), self._server_for(key, server))

    def request(self, payload: bytes, server: ServerAddress) -> UdpResult:
        """Send one request and block until its whole reply is in or the timeout passes."""
        if len(payload) > MAX_UDP_REQUEST:
            raise ValueError(f"a {len(payload)}-byte request does not fit one UDP datagram "
                             f"({MAX_UDP_REQUEST} bytes); memcached takes it over TCP only")
        self._request_id = (self._request_id + 1) & 0xFFFF
        pending = PendingReply(self._request_id)
        sent = time.perf_counter()
        self._socket.sendto(pack_udp_frame(self._request_id, payload), server)
        deadline = sent + self.timeout
        while (left := deadline - time.perf_counter()) > 0:
            self._socket.settimeout(left)
            try:
                datagram, source = self._socket.recvfrom(MAX_DATAGRAM)
            except socket.timeout:
                break
            whole = pending.accept(datagram)
            if whole is STRAY:
                self.strays += 1
            elif whole is not None:
                latency = time.perf_counter() - sent
                reply = parse_reply(whole)
                return UdpResult(outcome_of(reply, len(whole)), server, ServerAddress(*source), latency, reply)
        return UdpResult("timeout", server, None, time.perf_counter() - sent)

    def close(self) -> None:
        self._socket.close()

    def __enter__(self) -> "UdpClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _server_for(self, key: bytes, server: ServerAddress | None) -> ServerAddress:
        if server is not None:
            return server
        if self.key_hash is None or not self.servers:
            raise ValueError("no server given and no servers/key_hash configured")
        return self.servers[self.key_hash.server_of(key)]


def tcp_client(server: ServerAddress, timeout: float = DEFAULT_TIMEOUT):
    """A pymemcache client for one server that waits for every reply (pymemcache defaults to noreply sets)."""
    from pymemcache.client.base import Client  # imported here: only TCP users pay for it

    return Client(tuple(server), connect_timeout=timeout, timeout=timeout, default_noreply=False)
