"""One outstanding UDP request and the datagrams of its reply: the correlation that the blocking client and the
load generator share.

A reply is matched by request id only, never by source address: when MBalancer sends a hot get to a replica, the
replica answers. Datagrams with another request id (late replies to requests that timed out, or someone else's)
are strays and are dropped.
"""
from __future__ import annotations

from mbalancer.memcache.frame import UDP_HEADER, UDP_HEADER_SIZE, reassemble

STRAY = object()  # accept(): the datagram is not part of this request's reply


class PendingReply:
    __slots__ = ("request_id", "_parts", "_total")

    def __init__(self, request_id: int):
        self.request_id = request_id & 0xFFFF
        self._parts: dict[int, bytes] = {}
        self._total = 0

    def accept(self, datagram: bytes):
        """The reply payload once all its datagrams are in; None while some are missing; STRAY if not ours."""
        if len(datagram) < UDP_HEADER_SIZE:
            return STRAY
        request_id, sequence, total, _ = UDP_HEADER.unpack_from(datagram)
        if request_id != self.request_id or sequence >= total:
            return STRAY
        if total == 1:  # the common case: a one-datagram reply
            return datagram[UDP_HEADER_SIZE:]
        if self._total and total != self._total:
            return STRAY  # inconsistent count: not a datagram of the reply we are assembling
        self._total = total
        self._parts[sequence] = datagram[UDP_HEADER_SIZE:]
        return reassemble(self._parts, total)
