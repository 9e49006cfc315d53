"""The typed "not parsed" result every parser returns instead of raising."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class NotParsed:
    """Bytes a parser could not read as memcached, and why.

    incomplete: the bytes so far are a valid beginning; more may complete them (a TCP stream waits for more,
    a UDP datagram is final, so there it means truncated).
    """

    reason: str
    incomplete: bool = False

    def __bool__(self) -> bool:  # `if result:` reads as "was it parsed?"
        return False
