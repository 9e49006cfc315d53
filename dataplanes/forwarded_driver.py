"""A driver that forwards every call of the driver interface (dataplanes/driver.py) to a driver elsewhere: the one
way both a driver in a child process (driver_process.py) and a driver behind a switch agent on another box
(dataplanes/agent/) are reached. A subclass says how a call travels (`_call`), and hands what the far driver
delivers on its own to `on_mirror` and `on_reconnect`. The far side answers with `answer`. The calls forwarded, and
those a far side takes, are the interface's list (dataplanes/driver.py CALLS), never written out here.
"""
from __future__ import annotations

from abc import abstractmethod
from typing import Any, Mapping, Sequence

from dataplanes.driver import CALLS, Driver, DriverError, FoundKey, MirrorHandler, ReconnectHandler, forwards
from mbalancer.settings import Server


@forwards(CALLS, through="_forward")
class ForwardedDriver(Driver):
    on_mirror: MirrorHandler | None = None
    on_reconnect: ReconnectHandler | None = None

    @abstractmethod
    def _call(self, method: str, args: tuple) -> Any:
        """`method` with `args` run by the far driver: its result, or DriverError with its words."""

    def attach(self, servers: Sequence[Server], on_mirror: MirrorHandler,
               on_reconnect: ReconnectHandler | None = None) -> list[FoundKey]:
        self.on_mirror, self.on_reconnect = on_mirror, on_reconnect
        return self._call("attach", (tuple(servers),))

    def _forward(self, call: str, args: tuple) -> Any:
        """A call of CALLS (each one a method of this class, derived from that list), sent as plain values: a list
        or other sequence as a tuple, a mapping as a dict (what the far side's codec takes)."""
        return self._call(call, tuple(_plain(arg) for arg in args))


def _plain(arg: Any) -> Any:
    if isinstance(arg, Mapping) and not isinstance(arg, dict):
        return dict(arg)
    if isinstance(arg, Sequence) and not isinstance(arg, (tuple, str, bytes)):
        return tuple(arg)
    return arg


# The calls a far side takes: those ForwardedDriver forwards, attach and close; anything else is refused there.
ANSWERED = frozenset({"attach", "close", *CALLS})


def answer(driver: Driver, method: str, args: tuple, on_mirror: MirrorHandler, on_reconnect: ReconnectHandler
           ) -> Any:
    """The far side: `method` of ANSWERED run on `driver` (attach with the far side's own handlers)."""
    if method not in ANSWERED:
        raise DriverError(f"no driver call {method!r}")
    if method == "attach":
        return driver.attach(args[0], on_mirror, on_reconnect)
    return getattr(driver, method)(*args)
