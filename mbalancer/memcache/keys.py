"""What memcached's text protocol reads as a key: 1 to 250 bytes, none of them a space, a line end ('\\r', '\\n') or
NUL. It splits a command line on spaces alone, so every other byte, control characters included, belongs to the key
(libmemcached's memcaslap writes keys that begin with eight 0x10 bytes). memcached also takes a '\\r' inside a key;
we do not, so a request with one is one nobody reads (unsure), never a key read wrong."""
from __future__ import annotations

MAX_KEY_LENGTH = 250
_FORBIDDEN = b" \r\n\x00"


def key_problem(key: bytes) -> str | None:
    """Why `key` is not a valid memcached key, or None when it is."""
    if not key:
        return "empty key"
    if len(key) > MAX_KEY_LENGTH:
        return f"key of {len(key)} bytes is over {MAX_KEY_LENGTH}"
    if len(key.translate(None, _FORBIDDEN)) != len(key):  # in C: the monitor checks every key it sees
        return "key contains a space, a line end or a NUL byte"
    return None


def key_to_text(key: bytes) -> str:
    """A key as JSON text, reversibly: UTF-8 keys read as themselves, other bytes become lone surrogates (which
    json.dumps writes as \\udcXX escapes), so key_from_text gives back the exact bytes."""
    return key.decode("utf-8", "surrogateescape")


def key_from_text(text: str) -> bytes:
    """The key bytes of key_to_text's text."""
    return text.encode("utf-8", "surrogateescape")


def printable_key(text: str) -> str:
    """key_to_text's text made safe to print (undecodable bytes shown as \\xNN)."""
    return key_from_text(text).decode("utf-8", "backslashreplace")
