"""What keeps a hot key's gets safe when a driver call fails, and the retries that try again: the part the executor
(controller/execution.py) and coherence (controller/coherence.py) share, below both, so neither calls into the other
for it.

A failed write of weights holds the key dirty; a hold that fails too removes its rules (gets go home untouched either
way) and schedules their reinstall. A retry is scheduled with its back-off, and one past the retry limit is said to
be given up (controller/retries.py). Only the core's worker thread calls in here.
"""
from __future__ import annotations

from controller.decisions import Decide, Decision
from controller.hot_keys import HotKey, HotKeyState
from controller.retries import KEY_LEVEL, RetryKind, RetryScheduler
from dataplanes.driver import Driver, DriverError


class KeyGuard:
    def __init__(self, driver: Driver, retries: RetryScheduler, decide: Decide):
        self.driver, self.retries, self.decide = driver, retries, decide

    def schedule(self, kind: RetryKind, key: bytes, server: int, error: str, attempt: int = 0,
                 delay: float | None = None) -> None:
        """Retry `kind` after the back-off of `attempt` (or after `delay`: a wait, not a failure); past the retry
        limit, say it was given up."""
        given_up = self.retries.schedule(kind, key, server, error, attempt, delay)
        if given_up is not None:
            self.decide(Decision.GIVE_UP, key, given_up)

    def cancel(self, key: bytes, *kinds: RetryKind) -> None:
        self.retries.cancel(key, *kinds)

    def set_weights(self, key: bytes, hot: HotKey, attempt: int = 0) -> None:
        """Write the key's weights now (a replica lost its copy, or got it back); if the driver refuses, keep gets
        away from the replicas and retry."""
        if not hot.installed:
            return  # its reinstall writes the current weights
        try:
            self.driver.set_weights(key, hot.weights())
        except DriverError as err:
            self.schedule(RetryKind.RULES, key, KEY_LEVEL, str(err), attempt)
            self.protect(key, hot, f"weights not written ({err})")

    def protect(self, key: bytes, hot: HotKey, why: str) -> None:
        """Make the data plane send the key's gets home: hold it dirty, or if that fails remove its rules (and
        reinstall them later). Never raises: it is what the core does when a driver call has failed."""
        try:
            self.hold_dirty(key, hot)
            return self.decide(Decision.ERROR, key, f"{why}; key kept dirty so gets go home")
        except DriverError as err:
            dirty_error = err
        try:
            self.driver.remove_hot_key(key)
        except DriverError as err:
            return self.decide(Decision.ERROR, key, f"{why}; the data plane refused to hold it dirty ({dirty_error}) "
                                                    f"and the removal ({err}): gets may reach a stale replica until a "
                                                    f"retry lands")
        hot.move(HotKeyState.NOT_INSTALLED)
        self.cancel(key, RetryKind.RULES)
        self.schedule(RetryKind.INSTALL, key, KEY_LEVEL, str(dirty_error))
        self.decide(Decision.ERROR, key, f"{why}; holding it dirty was refused too ({dirty_error}): rules removed "
                                         f"so gets go home, reinstalling")

    def hold_dirty(self, key: bytes, hot: HotKey) -> None:
        """Hold the key dirty in the data plane (raises DriverError)."""
        self.driver.set_dirty(key)
        hot.move(HotKeyState.DIRTY)
