"""The classifier's tags: a locally administered unicast MAC written in place of a real one (see the C program's
mb_tag). Layout: 0e, kind, index (16 bits), entropy (16 bits; a get's request hash, MB_TAG_ENTROPY_BITS of it).

GET(slot)      destination of a clean single-key get of the hot key in `slot`: the switch picks a replica
COPY(server)   destination of a packet the controller must see (a write to a hot key, an unsure request): the
               switch restores `server`'s MAC, copies it to the controller and forwards it
REPLY(home)    source of a reply to a get this switch may have balanced: the switch writes home's MAC, IP, port
BALANCED       source of a get the switch balanced (its group writes it, not the classifier): no switch learns the
               client's MAC from a get that a fabric's home leaf sent back up to a spine, on the wrong port
"""
from __future__ import annotations

from mbalancer.macs import mac_bytes, mac_text

FIRST = 0x0e
GET, COPY, REPLY, BALANCED = 1, 2, 3, 4
KINDS = (GET, COPY, REPLY, BALANCED)
ENTROPY_BITS = 10  # as MB_TAG_ENTROPY_BITS in dataplanes/bpf/src/mbalancer.bpf.c
ANY_TAG = ("0e:00:00:00:00:00", "ff:00:00:00:00:00")  # (value, mask): every tagged MAC


def tag(kind: int, index: int, entropy: int = 0) -> str:
    if kind not in KINDS or not 0 <= index < 1 << 16 or not 0 <= entropy < 1 << 16:
        raise ValueError(f"no tag kind {kind} index {index} entropy {entropy}")
    raw = bytes([FIRST, kind, index >> 8, index & 0xff, entropy >> 8, entropy & 0xff])
    return mac_text(raw)


def tag_match(kind: int, index: int) -> tuple[str, str]:
    """(value, mask) matching every tag of this kind and index, whatever its entropy."""
    return tag(kind, index), "ff:ff:ff:ff:00:00"


def parse_tag(mac: str) -> tuple[int, int, int] | None:
    """(kind, index, entropy) of a tag, None for any other MAC."""
    raw = mac_bytes(mac)
    if raw[0] != FIRST or raw[1] not in KINDS:
        return None
    return raw[1], raw[2] << 8 | raw[3], raw[4] << 8 | raw[5]
