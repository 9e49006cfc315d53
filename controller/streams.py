"""The controller's view of TCP connections the data plane reads as streams.

A TCP segment that ends, or may end, inside a command (a value cut at a segment boundary, pipelined commands, a
request the data plane cannot read) makes the data plane track its connection: every later segment of it is
unsure, whatever it looks like (`mn\\r\\n` may be the last bytes of a value), and copied here. This reads those
copies in order, as memcached reads the connection: the writes they complete, and where a command starts. When
every byte so far has been read as whole commands, it proves that boundary to the data plane (`resume_stream`),
and the connection's next segment is read on its own again. When it cannot follow the connection (a copy missing,
bytes it cannot read), it proves nothing: the connection's segments stay unsure until it ends. docs/coherence.md
has the rule.
"""
from __future__ import annotations

import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable

from dataplanes.driver import Driver, DriverError, StreamId
from mbalancer.memcache.requests import parse_request
from mbalancer.memcache.results import NotParsed
from mbalancer.memcache.segment_keys import write_of
from mbalancer.memcache.stream import StreamParser
from mbalancer.packets import TCP, Segment

log = logging.getLogger(__name__)

MAX_STREAMS = 65536  # connections followed at once (the data plane tracks as many); the longest idle goes first
STALLED_AFTER = 30.0  # s: a connection cut inside a command this long holds its server's keys no longer
SEQ_SPACE = 1 << 32

Writes = list[tuple[bytes, bytes | None]]


@dataclass
class _Stream:
    expected: int  # the sequence number of the next byte
    seen_at: float  # when its last segment was read
    parser: StreamParser = field(default_factory=lambda: StreamParser(parse_request))


class TcpStreams:
    def __init__(self, driver: Driver, clock: Callable[[], float] = time.monotonic):
        self.driver = driver
        self.clock = clock
        self._streams: OrderedDict[StreamId, _Stream] = OrderedDict()
        self._cut: set[StreamId] = set()  # of those, the ones cut inside a command (what mid_command looks at)
        self.resumed = 0  # boundaries proven to the data plane
        self.lost = 0  # segments of a tracked connection that could not be followed
        self.blinded = 0  # connections left to the data plane's coalesced copies

    def read(self, segment: Segment) -> tuple[Writes, bool] | str | None:
        """A copied request segment: None if its connection is not read as a stream (read the segment on its own);
        else (the writes it completed, True), or why the connection cannot be followed (its server's hot keys must
        be checked at the home)."""
        if segment.transport != TCP or segment.seq is None:
            return None
        stream_id = StreamId.between(segment.source, segment.destination)
        stream = self._streams.get(stream_id)
        if stream is not None and _before(segment.seq + len(segment.payload), stream.expected + 1):
            return [], True  # a retransmission of bytes already read
        if stream is None or segment.seq != stream.expected:
            stream = self._start(stream_id, segment)
            if not isinstance(stream, _Stream):
                return stream
        return self._follow(stream_id, stream, segment.payload)

    def _start(self, stream_id: StreamId, segment: Segment) -> _Stream | str | None:
        """Begin following the connection at this segment if the data plane began tracking it here."""
        self._forget(stream_id)
        try:
            start = self.driver.stream_start(stream_id)
        except DriverError as err:
            self.lost += 1
            return f"the data plane's record of the connection not read: {err}"
        if start is None:
            return None
        if start != segment.seq:
            self.lost += 1
            self._blind(stream_id)
            return "a copy of the connection's earlier bytes is missing: it stays unsure until it ends"
        stream = _Stream(segment.seq, self.clock())
        self._streams[stream_id] = stream
        while len(self._streams) > MAX_STREAMS:
            self._forget(next(iter(self._streams)))
        return stream

    def _blind(self, stream_id: StreamId) -> None:
        """Not followed from here: the data plane keeps the connection unsure and copies its segments once per check
        of the server's keys instead of each (a binary-protocol client writes at full speed)."""
        try:
            self.driver.blind_stream(stream_id)
            self.blinded += 1
        except DriverError as err:
            log.warning("the data plane did not take %s as unfollowable: %s (its segments are still copied)",
                        stream_id, err)

    def _forget(self, stream_id: StreamId) -> None:
        self._streams.pop(stream_id, None)
        self._cut.discard(stream_id)

    def mid_command(self, server_ip: str, server_port: int) -> bool:
        """True while a connection to the server is cut inside a command: its next segment may complete a write, so
        the server's hot keys are not cleared before it has been read (one stalled longer than STALLED_AFTER no
        longer counts: its client is gone or stuck, and the write, if it ever ends, is unsure then)."""
        recent = self.clock() - STALLED_AFTER
        return any((i.server_ip, i.server_port) == (server_ip, server_port) and self._streams[i].seen_at >= recent
                   for i in self._cut)

    def _follow(self, stream_id: StreamId, stream: _Stream, payload: bytes) -> tuple[Writes, bool] | str:
        self._streams.move_to_end(stream_id)
        stream.seen_at = self.clock()
        stream.expected = (stream.expected + len(payload)) % SEQ_SPACE
        writes: Writes = []
        for request in stream.parser.feed(payload):
            if isinstance(request, NotParsed):  # where memcached goes on after bytes it rejects is its own
                self._forget(stream_id)
                self.lost += 1
                self._blind(stream_id)
                return f"the connection holds bytes that are not a request ({request.reason}): it stays unsure"
            writes += write_of(request)
        if stream.parser.pending:
            self._cut.add(stream_id)
        else:
            self._cut.discard(stream_id)
            try:
                self.driver.resume_stream(stream_id, stream.expected)
                self.resumed += 1
            except DriverError as err:
                log.warning("the data plane did not take a command boundary of %s: %s (its segments stay unsure)",
                            stream_id, err)
        return writes, True


def _before(a: int, b: int) -> bool:
    """True if sequence number a comes before b (RFC 1982 arithmetic on 32 bits)."""
    return 0 < (b - a) % SEQ_SPACE < SEQ_SPACE // 2
