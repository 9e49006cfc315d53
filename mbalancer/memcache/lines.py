"""Low-level reading shared by the request and reply parsers: lines, data blocks, numbers, limits."""
from __future__ import annotations

from mbalancer.memcache.results import NotParsed, Unreadable

CRLF = b"\r\n"
BINARY_MAGICS = (0x80, 0x81)  # first byte of a binary-protocol request / response
MAX_LINE = 64 * 1024  # a command or reply line, multi-gets included
MAX_VALUE = 1024 * 1024  # memcached's default item size limit (-I)


def read_line(buf: bytes, start: int = 0) -> tuple[list[bytes], int] | NotParsed:
    """Space-separated tokens of the line at `start`, and the offset just after its \\r\\n."""
    end = buf.find(CRLF, start, start + MAX_LINE + 2)
    if end < 0:
        if len(buf) - start > MAX_LINE:
            return NotParsed(f"no end of line within {MAX_LINE} bytes")
        return NotParsed("no end of line yet", Unreadable.TRUNCATED)
    return [t for t in bytes(buf[start:end]).split(b" ") if t], end + 2


def read_block(buf: bytes, start: int, length: int, max_value: int) -> bytes | NotParsed:
    """The `length` data bytes at `start`, which must be followed by \\r\\n."""
    if length > max_value:
        return NotParsed(f"value of {length} bytes is over the {max_value}-byte limit")
    if len(buf) < start + length + 2:
        return NotParsed("data block not complete", Unreadable.TRUNCATED)
    if buf[start + length:start + length + 2] != CRLF:
        return NotParsed("data block does not end with \\r\\n")
    return bytes(buf[start:start + length])


def uint(token: bytes, bits: int) -> int | None:
    """An unsigned decimal below 2**bits, or None."""
    if not token.isdigit() or len(token) > 20:
        return None
    value = int(token)
    return value if value < (1 << bits) else None


def sint(token: bytes) -> int | None:
    """A signed decimal (expiry times may be negative: already expired), or None."""
    digits = token[1:] if token[:1] == b"-" else token
    if not digits.isdigit() or len(digits) > 19:
        return None
    return int(token)
