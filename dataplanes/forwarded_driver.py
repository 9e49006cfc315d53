"""A driver that forwards every call of the driver interface (dataplanes/driver.py) to a driver elsewhere: the one
way both a driver in a child process (driver_process.py) and a driver behind a switch agent on another box
(dataplanes/agent/) are reached. A subclass says how a call travels (`_call`), and hands what the far driver
delivers on its own to `on_mirror` and `on_reconnect`. The far side answers with `answer`.
"""
from __future__ import annotations

from abc import abstractmethod
from typing import Any, Mapping, Sequence

from dataplanes.driver import (Counters, Driver, DriverError, ForwardingEntry, HotKeyInstall, FoundKey,
                               MacSighting, MirrorHandler, ReconnectHandler, ReplicaWeight, StreamId, WriteStamp)
from mbalancer.settings import Server


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

    def install_hot_key(self, key: bytes, home: int, replicas: Sequence[ReplicaWeight]) -> None:
        self._call("install_hot_key", (key, home, tuple(replicas)))

    def install_hot_keys(self, installs: Sequence[HotKeyInstall]) -> dict[bytes, DriverError]:
        return self._call("install_hot_keys", (tuple(installs),))

    def set_weights(self, key: bytes, replicas: Sequence[ReplicaWeight]) -> None:
        self._call("set_weights", (key, tuple(replicas)))

    def remove_hot_key(self, key: bytes) -> None:
        self._call("remove_hot_key", (key,))

    def remove_hot_keys(self, keys: Sequence[bytes]) -> dict[bytes, DriverError]:
        return self._call("remove_hot_keys", (tuple(keys),))

    def set_dirty(self, key: bytes) -> None:
        self._call("set_dirty", (key,))

    def write_stamp(self, key: bytes) -> WriteStamp:
        return self._call("write_stamp", (key,))

    def write_stamps(self, keys: Sequence[bytes]) -> dict[bytes, WriteStamp]:
        return self._call("write_stamps", (tuple(keys),))

    def clear_dirty(self, key: bytes, stamp: WriteStamp) -> None:
        self._call("clear_dirty", (key, stamp))

    def clear_dirty_keys(self, stamps: Mapping[bytes, WriteStamp]) -> dict[bytes, DriverError]:
        return self._call("clear_dirty_keys", (dict(stamps),))

    def renew_lease(self, seconds: float) -> None:
        self._call("renew_lease", (seconds,))

    def set_forwarding(self, entries: Sequence[ForwardingEntry]) -> None:
        self._call("set_forwarding", (tuple(entries),))

    def read_counters(self) -> Counters:
        return self._call("read_counters", ())

    def stream_start(self, stream: StreamId) -> int | None:
        return self._call("stream_start", (stream,))

    def resume_stream(self, stream: StreamId, seq: int) -> None:
        self._call("resume_stream", (stream, seq))

    def blind_stream(self, stream: StreamId) -> None:
        self._call("blind_stream", (stream,))

    def unsure_quiet(self, server: int) -> float | None:
        return self._call("unsure_quiet", (server,))

    def rearm_unsure(self, server: int) -> None:
        self._call("rearm_unsure", (server,))

    def set_tcp_homes(self, servers: Sequence[int]) -> None:
        self._call("set_tcp_homes", (tuple(servers),))

    def server_closes(self, server: int) -> tuple:
        return self._call("server_closes", (server,))

    def closes_handled(self, server: int, closes: tuple) -> None:
        self._call("closes_handled", (server, closes))

    def server_macs(self) -> list[MacSighting] | None:
        return self._call("server_macs", ())

    def sketch_call(self, call: str, args: tuple) -> Any:
        return self._call("sketch_call", (call, tuple(args)))

    def owned_switches(self) -> list[str]:
        return self._call("owned_switches", ())

    def switches_gone(self) -> list[str]:
        return self._call("switches_gone", ())

    def switch_counters(self) -> list[dict[str, int]]:
        return self._call("switch_counters", ())


# The calls a far side takes: those ForwardedDriver forwards, and close; anything else is refused there.
CALLS = frozenset({"close"} | {name for name, value in vars(ForwardedDriver).items()
                               if callable(value) and not name.startswith("_")})


def answer(driver: Driver, method: str, args: tuple, on_mirror: MirrorHandler, on_reconnect: ReconnectHandler
           ) -> Any:
    """The far side: `method` of CALLS run on `driver` (attach with the far side's own handlers)."""
    if method not in CALLS:
        raise DriverError(f"no driver call {method!r}")
    if method == "attach":
        return driver.attach(args[0], on_mirror, on_reconnect)
    return getattr(driver, method)(*args)
