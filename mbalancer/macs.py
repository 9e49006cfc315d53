"""MAC addresses: as the config writes them (six hex pairs split by colons, 02:00:00:00:00:01) and as switches hold
them (six bytes, or their 48-bit value in a P4 match field). The one conversion between the two, for every part."""
from __future__ import annotations

import re

MAC = re.compile(r"^[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}$")


def mac_bytes(mac: str) -> bytes:
    """A MAC as written (either case) as its six bytes; ValueError for anything else."""
    if not MAC.match(mac):
        raise ValueError(f"{mac!r} is not a MAC address like 02:00:00:00:00:01")
    return bytes.fromhex(mac.replace(":", ""))


def mac_text(mac: bytes | int) -> str:
    """mac_bytes' inverse: six bytes, or their 48-bit value, as the config writes a MAC (lower case)."""
    raw = mac.to_bytes(6, "big") if isinstance(mac, int) and 0 <= mac < 1 << 48 else mac
    if not isinstance(raw, (bytes, bytearray)) or len(raw) != 6:
        raise ValueError(f"{mac!r} holds no MAC address (6 bytes)")
    return ":".join(f"{b:02x}" for b in raw)
