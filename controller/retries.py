"""The executor's retries: what kinds there are, and a scheduler that keeps each pending one with its back-off.

A failed copy, delete or driver call is retried after a back-off that doubles with each failed attempt (capped),
and given up after RETRY_LIMIT attempts; a retry that waits for something on its way (not a failure) keeps its
attempt count. At most one retry is pending per (kind, key, server): scheduling it again keeps the sooner one.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Callable, Iterator

BACKOFF_FIRST = 0.1  # seconds before the first retry of a failed copy or delete; doubles each time
BACKOFF_MAX = 5.0
RETRY_LIMIT = 8  # then the failure is logged and left to the health checker / the next report
KEY_LEVEL = -1  # the server of a retry that concerns the key's rules, not one server's copy


class RetryKind(str, Enum):
    """What a retry does again (a str, so the state the HTTP interface shows reads as before)."""
    REFILL = "refill"  # copy home -> server, then give it weight (per server)
    DELETE = "delete"  # an extra copy after cool-down (per server)
    RULES = "rules"  # write the key's weights
    SETTLE = "settle"  # clear the key once the copies match
    INSTALL = "install"  # the key's rules again
    COOL = "cool"  # remove the key's rules, then its copies
    HOME_CHECK = "home-check"  # every hot key of a home that took requests nobody could read (per server)

    def __str__(self) -> str:
        return self.value


# Kinds that concern a hot key's record: dropped when the key cooled meanwhile.
KEY_RETRIES = frozenset({RetryKind.RULES, RetryKind.SETTLE, RetryKind.INSTALL, RetryKind.COOL})


@dataclass
class Retry:
    action: RetryKind
    key: bytes
    server: int  # KEY_LEVEL for a retry about the key's rules
    attempt: int = 0
    due: float = 0.0
    last_error: str = field(default="", compare=False)
    waiting: bool = False  # a wait for something on its way, not a failure: the attempt count stays

    @property
    def next_attempt(self) -> int:
        """The attempt count of this retry's own retry, should it fail (a wait counts no attempt)."""
        return self.attempt if self.waiting else self.attempt + 1


class RetryScheduler:
    """The pending retries, by (kind, key, server), on the executor's clock."""

    def __init__(self, clock: Callable[[], float]):
        self.clock = clock
        self._pending: dict[tuple[RetryKind, bytes, int], Retry] = {}

    def schedule(self, kind: RetryKind, key: bytes, server: int, error: str, attempt: int = 0,
                 delay: float | None = None) -> str | None:
        """Pend `kind` after the back-off of `attempt` (or after `delay`: a wait, not a failure). None, or why it
        was given up instead (the retry limit reached)."""
        if attempt >= RETRY_LIMIT:
            return f"{kind} on server {server} failed {attempt} times: {error}"
        due = self.clock() + (min(BACKOFF_FIRST * 2 ** attempt, BACKOFF_MAX) if delay is None else delay)
        existing = self._pending.get((kind, key, server))
        if existing is None or existing.due > due:  # else already due sooner
            self._pending[(kind, key, server)] = Retry(kind, key, server, attempt, due, error, delay is not None)
        return None

    def take_due(self) -> Iterator[Retry]:
        """The retries due now, soonest first, each removed as it is handed out; one replaced or cancelled by an
        earlier one of the same round is skipped."""
        now = self.clock()
        for retry in sorted((r for r in self._pending.values() if r.due <= now), key=lambda r: r.due):
            if self._pending.get((retry.action, retry.key, retry.server)) is not retry:
                continue
            del self._pending[(retry.action, retry.key, retry.server)]
            yield retry

    def cancel(self, key: bytes, *kinds: RetryKind) -> None:
        for pending in [k for k in self._pending if k[0] in kinds and k[1] == key]:
            del self._pending[pending]

    def cancel_server(self, server: int, kind: RetryKind) -> None:
        for pending in [k for k in self._pending if k[0] == kind and k[2] == server]:
            del self._pending[pending]

    def pending(self, kind: RetryKind, key: bytes, server: int = KEY_LEVEL) -> bool:
        return (kind, key, server) in self._pending

    def all(self) -> list[Retry]:
        return list(self._pending.values())

    def next_due(self) -> float | None:
        return min((r.due for r in self._pending.values()), default=None)
