"""What memcached accepts as a key: 1 to 250 bytes, none of them a space or a control character."""
from __future__ import annotations

MAX_KEY_LENGTH = 250
_FORBIDDEN = bytes(range(0x21)) + b"\x7f"  # space and control characters


def key_problem(key: bytes) -> str | None:
    """Why `key` is not a valid memcached key, or None when it is."""
    if not key:
        return "empty key"
    if len(key) > MAX_KEY_LENGTH:
        return f"key of {len(key)} bytes is over {MAX_KEY_LENGTH}"
    if len(key.translate(None, _FORBIDDEN)) != len(key):  # in C: the monitor checks every key it sees
        return "key contains a space or a control character"
    return None
