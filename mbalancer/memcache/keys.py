"""What memcached accepts as a key: 1 to 250 bytes, none of them a space or a control character."""
from __future__ import annotations

MAX_KEY_LENGTH = 250


def key_problem(key: bytes) -> str | None:
    """Why `key` is not a valid memcached key, or None when it is."""
    if not key:
        return "empty key"
    if len(key) > MAX_KEY_LENGTH:
        return f"key of {len(key)} bytes is over {MAX_KEY_LENGTH}"
    if any(b <= 0x20 or b == 0x7F for b in key):
        return "key contains a space or a control character"
    return None
