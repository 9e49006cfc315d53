"""The keys a request segment asks for, read with the shared protocol module.

A UDP datagram is one memcached frame; a TCP segment is read on its own, request after request, as mctop and
memkeys do: a request split across segments is lost, which for small get requests is rare and with 1-in-k
sampling unavoidable anyway. Gets of several keys count once per key.
"""
from __future__ import annotations

from mbalancer.memcache.frame import parse_udp_frame
from mbalancer.memcache.keys import key_problem
from mbalancer.memcache.requests import parse_request
from mbalancer.memcache.results import NotParsed
from monitor.frames import UDP, Segment

MAX_REQUESTS_PER_SEGMENT = 1000  # bound the work one packet can cause


def get_keys(segment: Segment) -> list[bytes] | str:
    """Keys asked for by the get requests in the segment, or why nothing could be read."""
    payload = segment.payload
    if segment.transport == UDP:
        frame = parse_udp_frame(payload)
        if isinstance(frame, NotParsed):
            return "bad UDP frame"
        if frame[0].total != 1:
            return "multi-datagram request"
        payload = frame[1]
    single = _single_get(payload)
    if single is not None:
        return single
    return _parse_all(payload)


def _single_get(payload: bytes) -> list[bytes] | None:
    """Fast path for what most traffic is: `get <key>\\r\\n`."""
    if payload[:4] == b"get " and payload[-2:] == b"\r\n":
        key = payload[4:-2]
        if key_problem(key) is None:
            return [key]
    return None


def _parse_all(payload: bytes) -> list[bytes] | str:
    keys: list[bytes] = []
    position = 0
    for _ in range(MAX_REQUESTS_PER_SEGMENT):
        if position >= len(payload):
            break
        request = parse_request(payload[position:])
        if isinstance(request, NotParsed):
            if keys or position:
                break  # what was read stays; the rest continues in another segment or is garbage
            return _why(request)
        if request.is_get:
            keys.extend(request.keys)
        position += request.size
    return keys


def _why(failure: NotParsed) -> str:
    """A few fixed reasons (they become counter names), not the parser's detailed message."""
    if failure.reason == "binary protocol":
        return "binary protocol"
    if failure.incomplete:
        return "truncated request"
    if "key" in failure.reason:
        return "invalid key"
    return "not memcached"
