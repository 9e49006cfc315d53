"""The typed "not parsed" result every parser returns instead of raising."""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Unreadable(Enum):
    """What kind of bytes a parser could not read: what logic and counters read (the reason's text is for people)."""
    TRUNCATED = "truncated"  # a valid beginning: more bytes may complete it
    BINARY = "binary protocol"
    INVALID_KEY = "invalid key"  # a key memcached does not take, or none where one is needed
    UNKNOWN_COMMAND = "unknown command"  # a command (or reply) that is not memcached's
    MALFORMED = "malformed"  # a known command or reply, not well formed: arguments, numbers, data block, length


@dataclass(frozen=True)
class NotParsed:
    """Bytes a parser could not read as memcached: what kind, and why in words."""

    reason: str
    kind: Unreadable = Unreadable.MALFORMED

    @property
    def incomplete(self) -> bool:
        """The bytes so far are a valid beginning; more may complete them (a TCP stream waits for more, a UDP
        datagram is final, so there it means truncated)."""
        return self.kind is Unreadable.TRUNCATED

    def __bool__(self) -> bool:  # `if result:` reads as "was it parsed?"
        return False
