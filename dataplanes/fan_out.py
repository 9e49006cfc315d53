"""One call on many switches at once: one request in flight per switch, at most `width` switches at a time.

A change written to 32 switches one after the other costs 32 round trips; written to each at once it costs about
one. The calls run on a bounded pool of threads (width - 1 of them, made when first needed; the calling thread
makes one of the calls itself), never more. Plain threads, as the core's rule says (ryu-manager greens them).

With width 1, or one switch, the calls are made in the caller's thread one after the other and stop at the first
refusal, as the drivers always did: the switches after it are not tried (unless the caller asks for `every`: an undo,
a call that one box down must not hold back from the others). In parallel every switch is tried, and the caller
learns of each which took the call, which refused it and why, so it can undo the ones that took it.
"""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Callable, Generic, Sequence, TypeVar

T = TypeVar("T")
DEFAULT_WIDTH = 16  # switches written at once by default: a fabric's leaves, without a thread per switch of a huge one


class NotTried:
    """In place of an outcome: the call was not made (one before it was refused, one after the other)."""

    def __repr__(self) -> str:
        return "NOT_TRIED"


NOT_TRIED = NotTried()


class Outcomes(Generic[T]):
    """Each call's outcome, in the order of the calls: its result, the error it raised, or NOT_TRIED."""

    def __init__(self, outcomes: list):
        self.outcomes = outcomes

    @property
    def done(self) -> list[int]:
        """The calls that returned."""
        return [i for i, o in enumerate(self.outcomes) if not isinstance(o, (BaseException, NotTried))]

    @property
    def failed(self) -> list[tuple[int, BaseException]]:
        """(index, error) of the calls that raised one of the errors asked for, in order."""
        return [(i, o) for i, o in enumerate(self.outcomes) if isinstance(o, BaseException)]

    def results(self) -> list[T]:
        """Every call's result; the first error (by the calls' order) raised if one failed."""
        if failed := self.failed:
            raise failed[0][1]
        return list(self.outcomes)


class FanOut:
    """Calls on many switches at once, over a bounded pool of threads; thread-safe."""

    def __init__(self, width: int = DEFAULT_WIDTH, name: str = "mbalancer-fan-out"):
        if width < 1:
            raise ValueError(f"switches written at once: at least 1 (got {width})")
        self.width, self.name = width, name
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def run(self, calls: Sequence[Callable[[], T]], errors: tuple[type[BaseException], ...], every: bool = False
            ) -> Outcomes[T]:
        """Make every call (each one switch's request); an error of `errors` is its outcome, any other is raised once
        every call has returned (in parallel, none is left running behind the caller's back). `every`: one after the
        other too, the calls after a refusal are made."""
        if every and (self.width == 1 or len(calls) <= 1):
            return _checked([_outcome(call, errors) for call in calls])
        if self.width == 1 or len(calls) <= 1:
            return self._one_after_another(calls, errors)
        pool = self._started()
        futures = [pool.submit(_outcome, call, errors) for call in calls[1:]]
        first = _outcome(calls[0], errors)  # the caller's thread makes one call itself
        wait(futures)
        return _checked([first, *(f.result() for f in futures)])

    def close(self) -> None:
        """The pool's threads end (a later run makes a new one)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False)

    def _started(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.width - 1, thread_name_prefix=self.name)
            return self._pool

    @staticmethod
    def _one_after_another(calls: Sequence[Callable[[], T]], errors: tuple[type[BaseException], ...]) -> Outcomes[T]:
        outcomes: list = [NOT_TRIED] * len(calls)
        for i, call in enumerate(calls):
            try:
                outcomes[i] = call()
            except errors as err:
                outcomes[i] = err
                break
        return Outcomes(outcomes)


class _Unexpected:
    """An error the caller did not name (a defect): raised in the caller's thread once every call has returned."""

    def __init__(self, error: BaseException):
        self.error = error


def _checked(outcomes: list) -> Outcomes:
    """The outcomes, once every call has returned; the first error nobody named (by the calls' order) raised."""
    unexpected = [o for o in outcomes if isinstance(o, _Unexpected)]
    if unexpected:
        raise unexpected[0].error
    return Outcomes(outcomes)


def _outcome(call: Callable[[], T], errors: tuple[type[BaseException], ...]):
    try:
        return call()
    except errors as err:
        return err
    except Exception as err:  # noqa: BLE001 (raised again in the caller's thread)
        return _Unexpected(err)
