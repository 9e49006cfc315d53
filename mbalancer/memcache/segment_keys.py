"""The keys a request segment asks for (gets: the monitor) or changes (writes: the controller's mirrors), read
with the shared protocol module.

A UDP datagram is one memcached frame; a TCP segment is read on its own, request after request, as mctop and
memkeys do: a request split across segments is lost, which for small get requests is rare and with 1-in-k
sampling unavoidable anyway. Gets of several keys count once per key.
"""
from __future__ import annotations

from typing import Callable

from mbalancer.memcache.frame import parse_udp_frame
from mbalancer.memcache.keys import key_problem
from mbalancer.memcache.lines import read_line
from mbalancer.memcache.requests import WRITES, Request, parse_request
from mbalancer.memcache.results import NotParsed, Unreadable
from mbalancer.packets import UDP, Segment

MAX_REQUESTS_PER_SEGMENT = 1000  # bound the work one packet can cause
WHOLE_VALUE_WRITES = ("set", "cas", "ms")  # writes whose data is the key's new value
# why a segment could not be read, as counted: each kind of failure that has a name of its own ("not memcached" else)
COUNTED = {Unreadable.BINARY: "binary protocol", Unreadable.TRUNCATED: "truncated request",
           Unreadable.INVALID_KEY: "invalid key"}


def get_keys(segment: Segment) -> list[bytes] | str:
    """Keys asked for by the get requests in the segment, or why nothing could be read."""
    payload = _request_bytes(segment)
    if isinstance(payload, str):
        return payload
    single = _single_get(payload)
    if single is not None:
        return single
    found = _parse_all(payload)
    return found if isinstance(found, str) else found[0]


def written_keys(segment: Segment) -> tuple[list[tuple[bytes, bytes | None]], bool] | str:
    """(key, new value) of each write in the segment (set, delete, incr, ...; the value only for writes that
    replace it whole: set, cas, ms), and whether every byte of the segment was read as whole requests (if not, it
    may hold writes nobody can name); or why nothing could be read.

    A mirrored set whose value continues in later TCP segments still names its key on its command line, so a
    request cut short is read from that line alone (value unknown)."""
    payload = _request_bytes(segment)
    if isinstance(payload, str):
        return payload
    return _parse_all(payload, write_of)


def first_written_key(segment: Segment) -> bytes | None:
    """The key of the segment's first request if that request is a write, read from its command line alone (as
    the data plane reads it, which counts a write per packet by that key); else None."""
    payload = _request_bytes(segment)
    if isinstance(payload, str):
        return None
    found = _write_of_line(payload)
    return found[0][0] if found else None


def _request_bytes(segment: Segment) -> bytes | str:
    """The request bytes: a UDP datagram without its memcached frame header, a TCP segment as it is."""
    if segment.transport != UDP:
        return segment.payload
    frame = parse_udp_frame(segment.payload)
    if isinstance(frame, NotParsed):
        return "bad UDP frame"
    if frame[0].total != 1:
        return "multi-datagram request"
    return frame[1]


def _single_get(payload: bytes) -> list[bytes] | None:
    """Fast path for what most traffic is: `get <key>\\r\\n`."""
    if payload[:4] == b"get " and payload[-2:] == b"\r\n":
        key = payload[4:-2]
        if key_problem(key) is None:
            return [key]
    return None


def _parse_all(payload: bytes, pick: Callable[[Request], list] = lambda r: list(r.keys) if r.is_get else []
               ) -> tuple[list, bool] | str:
    """What `pick` takes from each request in the payload (by default: the keys of gets), and whether the
    whole payload was read."""
    found: list = []
    position = 0
    for _ in range(MAX_REQUESTS_PER_SEGMENT):
        if position >= len(payload):
            break
        request = parse_request(payload[position:])
        if isinstance(request, NotParsed):
            if pick is write_of and request.incomplete:
                found.extend(_write_of_line(payload[position:]))
            if found or position:
                break  # what was read stays; the rest continues in another segment or is garbage
            return _why(request)
        found.extend(pick(request))
        position += request.size
    return found, position >= len(payload)


def write_of(request: Request) -> list[tuple[bytes, bytes | None]]:
    """[(key, new value or None)] if the request is a write (the value only for set, cas, ms), else []. A get that
    sets a TTL (gat, gats; mg with T, N or I) changes its keys too, value unchanged: (key, None) for each."""
    if request.command in ("gat", "gats") or (request.command == "mg" and any(
            flag[:1] in (b"T", b"N", b"I") for flag in request.meta_flags)):
        return [(key, None) for key in request.keys]
    if not request.is_write:
        return []
    return [(request.key, request.data if request.command in WHOLE_VALUE_WRITES else None)]


def _write_of_line(buf: bytes) -> list[tuple[bytes, None]]:
    """The key on a write's command line when its data block is not all here."""
    line = read_line(buf)
    if isinstance(line, NotParsed) or len(line[0]) < 2 or line[0][0].decode("ascii", "replace") not in WRITES:
        return []
    return [(line[0][1], None)] if key_problem(line[0][1]) is None else []


def _why(failure: NotParsed) -> str:
    """A few fixed reasons (they become counter names), by the kind of failure, not the parser's detailed message."""
    return COUNTED.get(failure.kind, "not memcached")
