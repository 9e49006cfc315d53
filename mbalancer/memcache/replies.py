"""Parse memcached replies: retrieval (VALUE ... END), status words, errors, numbers and meta replies."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from mbalancer.memcache.lines import BINARY_MAGICS, MAX_VALUE, read_block, read_line, uint
from mbalancer.memcache.results import NotParsed, Unreadable

STATUS_WORDS = ("STORED", "NOT_STORED", "EXISTS", "NOT_FOUND", "DELETED", "TOUCHED", "OK", "RESET")
ERROR_WORDS = ("ERROR", "CLIENT_ERROR", "SERVER_ERROR")
META_CODES = ("HD", "EN", "NF", "NS", "EX", "MN")  # meta replies without data; VA carries data


@dataclass(frozen=True)
class Item:
    key: bytes
    flags: int
    value: bytes
    cas: int | None = None


@dataclass(frozen=True)
class ValuesReply:
    """Reply to get/gets/gat/gats: the items found (none on a miss), up to END."""

    items: tuple[Item, ...]
    size: int

    @property
    def hit(self) -> bool:
        return bool(self.items)


@dataclass(frozen=True)
class StatusReply:
    """A one-line reply: STORED, NOT_FOUND, ... or ERROR / CLIENT_ERROR / SERVER_ERROR / VERSION with a message."""

    status: str
    message: str
    size: int

    @property
    def is_error(self) -> bool:
        return self.status in ERROR_WORDS


@dataclass(frozen=True)
class NumberReply:
    """incr/decr result."""

    value: int
    size: int


@dataclass(frozen=True)
class MetaReply:
    """A meta command's reply: code (VA, HD, EN, NF, NS, EX, MN), its flags, and the value for VA."""

    code: str
    flags: tuple[bytes, ...]
    value: bytes | None
    size: int


Reply = Union[ValuesReply, StatusReply, NumberReply, MetaReply]


def parse_reply(buf: bytes, max_value: int = MAX_VALUE) -> Reply | NotParsed:
    """Parse the reply at the start of `buf` (bytes or bytearray)."""
    if not buf:
        return NotParsed("empty", Unreadable.TRUNCATED)
    if buf[0] in BINARY_MAGICS:
        return NotParsed("binary protocol", Unreadable.BINARY)
    line = read_line(buf, 0)
    if isinstance(line, NotParsed):
        return line
    tokens, after = line
    if not tokens:
        return NotParsed("empty reply line")
    word = tokens[0]
    if word in (b"VALUE", b"END"):
        return _values(buf, max_value)
    if word == b"VA":
        return _meta_value(tokens, buf, after, max_value)
    text = word.decode("ascii", "replace")
    if text in META_CODES:
        return MetaReply(text, tuple(tokens[1:]), None, after)
    if text in STATUS_WORDS + ERROR_WORDS or text == "VERSION":
        return StatusReply(text, b" ".join(tokens[1:]).decode("ascii", "replace"), after)
    if len(tokens) == 1 and (number := uint(word, 64)) is not None:
        return NumberReply(number, after)
    return NotParsed(f"unknown reply {text[:20]!r}", Unreadable.UNKNOWN_COMMAND)


def _values(buf: bytes, max_value: int) -> ValuesReply | NotParsed:
    items, pos = [], 0
    while True:
        line = read_line(buf, pos)
        if isinstance(line, NotParsed):
            return line
        tokens, after = line
        if tokens == [b"END"]:
            return ValuesReply(tuple(items), after)
        if not tokens or tokens[0] != b"VALUE" or len(tokens) not in (4, 5):
            return NotParsed("expected VALUE <key> <flags> <bytes> [<cas>] or END")
        flags, length = uint(tokens[2], 32), uint(tokens[3], 63)
        cas = uint(tokens[4], 64) if len(tokens) == 5 else None
        if flags is None or length is None or (len(tokens) == 5 and cas is None):
            return NotParsed("VALUE line has a malformed number")
        value = read_block(buf, after, length, max_value)
        if isinstance(value, NotParsed):
            return value
        items.append(Item(tokens[1], flags, value, cas))
        pos = after + length + 2


def _meta_value(tokens, buf, after, max_value) -> MetaReply | NotParsed:
    length = uint(tokens[1], 63) if len(tokens) > 1 else None
    if length is None:
        return NotParsed("VA without a size")
    value = read_block(buf, after, length, max_value)
    if isinstance(value, NotParsed):
        return value
    return MetaReply("VA", tuple(tokens[2:]), value, after + length + 2)


OUTCOMES = ("hit", "miss", "stored", "not_stored", "exists", "not_found", "deleted", "touched", "number", "meta",
            "error", "malformed")


def reply_outcome(payload: bytes) -> str:
    """One word for what a reply says (one of OUTCOMES), cheap for the replies a load generator sees most: a hit is
    judged by its framing (VALUE ... END) without re-reading the value; anything else gets the full parser."""
    if payload == b"END\r\n":
        return "miss"
    if payload.startswith(b"VALUE ") and payload.endswith(b"\r\nEND\r\n"):
        return "hit"
    if payload == b"STORED\r\n":
        return "stored"
    return outcome_of(parse_reply(payload), len(payload))


def outcome_of(reply: Reply | NotParsed, payload_size: int) -> str:
    """The OUTCOMES word of a reply already parsed from a payload of `payload_size` bytes."""
    if isinstance(reply, NotParsed) or reply.size != payload_size:
        return "malformed"
    if isinstance(reply, ValuesReply):
        return "hit" if reply.hit else "miss"
    if isinstance(reply, NumberReply):
        return "number"
    if isinstance(reply, MetaReply):
        return "meta"
    if reply.is_error:
        return "error"
    return reply.status.lower() if reply.status.lower() in OUTCOMES else "error"
