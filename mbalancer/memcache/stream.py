"""Incremental parsing of a TCP byte stream: requests or replies that arrive split across segments."""
from __future__ import annotations

from typing import Callable, Generic, TypeVar

from mbalancer.memcache.lines import CRLF, MAX_LINE, MAX_VALUE
from mbalancer.memcache.results import NotParsed

T = TypeVar("T")


class StreamParser(Generic[T]):
    """Feed it segments in order; it returns every complete message, and a NotParsed for each stretch it had to skip.

    parse: parse_request or parse_reply. After bytes it cannot read it resynchronises at the next line end, so one
    bad command costs that command, not the connection. The buffer never holds more than one message's worth.
    """

    def __init__(self, parse: Callable[[bytes], T | NotParsed], max_value: int = MAX_VALUE) -> None:
        self._parse = parse
        self._max_buffer = MAX_LINE + max_value + 2
        self._buf = bytearray()

    @property
    def pending(self) -> int:
        """Bytes held while waiting for the rest of a message."""
        return len(self._buf)

    def feed(self, data: bytes) -> list[T | NotParsed]:
        self._buf += data
        out: list[T | NotParsed] = []
        while self._buf:
            result = self._parse(self._buf)
            if not isinstance(result, NotParsed):
                out.append(result)
                del self._buf[:result.size]
            elif result.incomplete and len(self._buf) <= self._max_buffer:
                break
            else:
                out.append(NotParsed(result.reason) if result.incomplete else result)  # (over the limit)
                self._skip_line()
        return out

    def _skip_line(self) -> None:
        end = self._buf.find(CRLF)
        del self._buf[:end + 2 if end >= 0 else len(self._buf)]
