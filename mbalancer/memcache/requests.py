"""Parse and build memcached ASCII requests (text protocol and meta commands).

`parse_request` reads one request from the start of a buffer and reports how many bytes it used, so a UDP payload
and a TCP stream (stream.py) go through the same code. Anything it cannot read comes back as NotParsed with the
reason; nothing raises.
"""
from __future__ import annotations

from dataclasses import dataclass

from mbalancer.memcache.keys import key_problem
from mbalancer.memcache.lines import BINARY_MAGICS, CRLF, MAX_VALUE, read_block, read_line, sint, uint
from mbalancer.memcache.results import NotParsed, Unreadable

RETRIEVAL = ("get", "gets")
TOUCH_RETRIEVAL = ("gat", "gats")
STORAGE = ("set", "add", "replace", "append", "prepend", "cas")
ARITHMETIC = ("incr", "decr")
META = ("mg", "ms", "md", "ma", "mn")
GETS = RETRIEVAL + TOUCH_RETRIEVAL + ("mg",)
WRITES = STORAGE + ARITHMETIC + ("delete", "touch", "ms", "md", "ma")
# Commands without keys: parsed so the monitor can tell them from garbage, otherwise ignored.
ADMIN = ("version", "stats", "flush_all", "verbosity", "quit", "shutdown", "cache_memlimit", "lru_crawler",
         "slabs", "lru", "watch", "me", "misbehave", "verbose")


@dataclass(frozen=True)
class Request:
    """One parsed request. Fields that a command does not carry are None."""

    command: str
    keys: tuple[bytes, ...] = ()
    size: int = 0  # bytes of the buffer this request used, data block included
    noreply: bool = False
    flags: int | None = None
    exptime: int | None = None
    cas: int | None = None
    delta: int | None = None  # incr/decr amount
    data: bytes | None = None
    meta_flags: tuple[bytes, ...] = ()

    @property
    def key(self) -> bytes | None:
        return self.keys[0] if self.keys else None

    @property
    def is_get(self) -> bool:
        """A read of one or more keys (get, gets, gat, gats, mg)."""
        return self.command in GETS

    @property
    def is_single_key_get(self) -> bool:
        """What the switch can balance: a plain get/gets of exactly one key."""
        return self.command in RETRIEVAL and len(self.keys) == 1

    @property
    def is_write(self) -> bool:
        """Changes the key's value or lifetime: the switch mirrors these for hot keys."""
        return self.command in WRITES


def parse_request(buf: bytes, max_value: int = MAX_VALUE) -> Request | NotParsed:
    """Parse the request at the start of `buf` (bytes or bytearray)."""
    if not buf:
        return NotParsed("empty", Unreadable.TRUNCATED)
    if buf[0] in BINARY_MAGICS:
        return NotParsed("binary protocol", Unreadable.BINARY)
    line = read_line(buf)
    if isinstance(line, NotParsed):
        return line
    tokens, size = line
    if not tokens:
        return NotParsed("empty command line")
    try:
        command = tokens[0].decode("ascii")
    except UnicodeDecodeError:
        return NotParsed("command is not ASCII", Unreadable.UNKNOWN_COMMAND)
    parser = _PARSERS.get(command)
    if parser is None:
        if command in ADMIN:
            return Request(command, size=size)
        return NotParsed(f"unknown command {command[:20]!r}", Unreadable.UNKNOWN_COMMAND)
    return parser(command, tokens[1:], buf, size, max_value)


def _retrieval(command, args, buf, size, max_value):
    if command in TOUCH_RETRIEVAL:
        exptime = sint(args[0]) if args else None
        if exptime is None:
            return NotParsed(f"{command} needs an expiry time then keys")
        args = args[1:]
    else:
        exptime = None
    if not args:
        return NotParsed(f"{command} without a key", Unreadable.INVALID_KEY)
    for key in args:
        if problem := key_problem(key):
            return NotParsed(problem, Unreadable.INVALID_KEY)
    return Request(command, tuple(args), size, exptime=exptime)


def _storage(command, args, buf, size, max_value):
    fields = 5 if command == "cas" else 4  # key flags exptime bytes [cas]
    args, noreply = _split_noreply(args)
    if len(args) != fields:
        return NotParsed(f"{command} takes key flags exptime bytes{' cas' if command == 'cas' else ''} [noreply]")
    key, flags, exptime, length = args[0], uint(args[1], 32), sint(args[2]), uint(args[3], 63)
    cas = uint(args[4], 64) if command == "cas" else None
    if problem := key_problem(key):
        return NotParsed(problem, Unreadable.INVALID_KEY)
    if None in (flags, exptime, length) or (command == "cas" and cas is None):
        return NotParsed(f"{command} has a malformed number")
    data = read_block(buf, size, length, max_value)
    if isinstance(data, NotParsed):
        return data
    return Request(command, (key,), size + length + 2, noreply, flags, exptime, cas, data=data)


def _delete(command, args, buf, size, max_value):
    args, noreply = _split_noreply(args)
    rest = args[1:]
    if not args or len(rest) > 1 or (rest and rest[0] != b"0"):
        return NotParsed("delete takes key [0] [noreply]")
    if problem := key_problem(args[0]):
        return NotParsed(problem, Unreadable.INVALID_KEY)
    return Request(command, (args[0],), size, noreply)


def _key_and_number(command, args, buf, size, max_value):
    """incr/decr <key> <delta> and touch <key> <exptime>, each with an optional noreply."""
    args, noreply = _split_noreply(args)
    if len(args) != 2:
        return NotParsed(f"{command} takes key {'exptime' if command == 'touch' else 'value'} [noreply]")
    if problem := key_problem(args[0]):
        return NotParsed(problem, Unreadable.INVALID_KEY)
    number = sint(args[1]) if command == "touch" else uint(args[1], 64)
    if number is None:
        return NotParsed(f"{command} has a malformed number")
    if command == "touch":
        return Request(command, (args[0],), size, noreply, exptime=number)
    return Request(command, (args[0],), size, noreply, delta=number)


def _meta(command, args, buf, size, max_value):
    if command == "mn":
        return Request(command, (), size)
    if not args:
        return NotParsed(f"{command} without a key", Unreadable.INVALID_KEY)
    key, rest = args[0], args[1:]
    if problem := key_problem(key):
        return NotParsed(problem, Unreadable.INVALID_KEY)
    length = None
    if command == "ms":
        length = uint(rest[0], 63) if rest else None
        if length is None:
            return NotParsed("ms takes key datalen [flags]")
        rest = rest[1:]
    if any(not flag[:1].isalpha() for flag in rest):
        return NotParsed(f"{command} has a malformed flag")
    quiet = b"q" in rest
    if length is None:
        return Request(command, (key,), size, quiet, meta_flags=tuple(rest))
    data = read_block(buf, size, length, max_value)
    if isinstance(data, NotParsed):
        return data
    return Request(command, (key,), size + length + 2, quiet, data=data, meta_flags=tuple(rest))


def _split_noreply(args: list[bytes]) -> tuple[list[bytes], bool]:
    """Split off a trailing `noreply`. A lone token stays: it is the key (`delete noreply` deletes "noreply")."""
    if len(args) > 1 and args[-1] == b"noreply":
        return args[:-1], True
    return args, False


_PARSERS = {**{c: _retrieval for c in RETRIEVAL + TOUCH_RETRIEVAL}, **{c: _storage for c in STORAGE},
            "delete": _delete, "incr": _key_and_number, "decr": _key_and_number, "touch": _key_and_number,
            **{c: _meta for c in META}}


# --- building requests (the client side) ------------------------------------------------------------------------
def build_get(*keys: bytes, command: str = "get") -> bytes:
    """`get k1 k2 ...\\r\\n`; raises ValueError for an invalid key (the caller's bug, not traffic)."""
    _check_keys(keys)
    return command.encode() + b" " + b" ".join(keys) + CRLF


def build_set(key: bytes, value: bytes, flags: int = 0, exptime: int = 0, noreply: bool = False,
              command: str = "set") -> bytes:
    """A storage command with its data block."""
    _check_keys((key,))
    tail = b" noreply" if noreply else b""
    return b"%s %s %d %d %d%s\r\n%s\r\n" % (command.encode(), key, flags, exptime, len(value), tail, value)


def _check_keys(keys: tuple[bytes, ...]) -> None:
    if not keys:
        raise ValueError("no key given")
    for key in keys:
        if problem := key_problem(key):
            raise ValueError(f"invalid memcached key {key[:40]!r}...: {problem}")
