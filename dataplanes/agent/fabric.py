"""A fabric of switch boxes driven as one data plane: `[dataplane.agent] boxes`, one switch agent per box.

Where a hot key's gets are balanced: at its home's leaf, the one switch that every request to the home passes,
writes included. That switch alone holds the key's rules, so it counts every write before the home sees it (the
key's gets turn dirty at once, as on one switch: no get after a write can reach a copy the controller has not
synced), and it mirrors each write exactly once. Balancing at the client's leaf instead would leave a leaf that a
write never crossed balancing gets to copies that write made stale, until the controller heard of it. The balanced
get carries the home's index in its IP ID (dataplanes/bpf/src/rewrite.h), so the replica's switch, which the reply
leaves through first, makes the reply seem to come from the home. Spines hold no key: they forward.

Every call of the driver interface goes to the box holding the key (or the server) it names; the lease, the
counters and attach go to every box. A call on many keys goes to every box it names at once, one call in flight per
box (`parallel` boxes at a time, dataplanes/fan_out.py), so a change costs about one round trip, not one per box.
A box that comes back empty (its agent restarted, its switch reloaded) has its keys forgotten here, and the core
installs those keys again; one that comes back holding its keys (its agent's stream dropped and came back: attached
anew, it read them back) hands them to the core to adopt, as at attach, and the keys it lost are installed again. The
other boxes' keys are not touched either way.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import replace
from typing import Any, Callable, Iterator, Mapping, Sequence, TypeVar

from dataplanes.agent import Settings
from dataplanes.agent.client import AgentDriver, answers
from dataplanes.driver import (RULES_REMOVED, Counters, Distrust, Driver, DriverError, ForwardingEntry, FoundKey,
                               HotKeyInstall, MacSighting, MirrorHandler, ReconnectHandler, ReplicaWeight, StreamId,
                               WriteStamp, merge_sightings, raise_refused)
from dataplanes.fan_out import FanOut
from dataplanes.reach import count_answering
from mbalancer.settings import ConfigError, Server

log = logging.getLogger(__name__)
T = TypeVar("T")
# data planes whose program names the home to the replica's switch (FABRIC_CASES); none: the recording driver
FABRIC_KINDS = ("ebpf", "p4", "openflow", "none")


def driver_from_settings(settings: Settings) -> Driver:
    """The registry's factory for `kind = "agent"`: one agent's driver (address), or a fabric's (boxes); DriverError
    (one line) if an agent cannot be reached or runs another kind."""
    try:
        return FabricDriver(settings) if settings.boxes else AgentDriver(settings)
    except ConfigError as err:
        raise DriverError(str(err)) from None


def boxes_reached(settings: Settings, timeout: float) -> tuple[int, int]:
    """The registry's reach probe for `kind = "agent"`: (agents that answer within `timeout`, agents), asked at once."""
    addresses = [parse_box(entry)[0] for entry in settings.boxes] if settings.boxes else [settings.address]
    return count_answering(addresses, lambda address: answers(replace(settings, address=address), timeout))


def parse_box(entry: str) -> tuple[str, tuple[str, ...]]:
    """One entry of `boxes`: "host:port srv1 srv2" -> (address, the servers cabled to that box)."""
    words = entry.split()
    if not words or ":" not in words[0]:
        raise ConfigError(f"dataplane.agent.boxes: {entry!r} is not \"host:port [server ...]\"")
    return words[0], tuple(words[1:])


class FabricDriver(Driver):
    name = "fabric"

    def __init__(self, settings: Settings, connect: Callable[[Settings], Driver] = AgentDriver):
        boxes = [parse_box(entry) for entry in settings.boxes]
        if settings.parallel < 1:
            raise ConfigError(f"dataplane.agent.parallel: at least 1 box at once (got {settings.parallel})")
        self.fan_out = FanOut(settings.parallel, "mbalancer-fabric")
        named = [name for _, names in boxes for name in names]
        if twice := sorted({name for name in named if named.count(name) > 1}):
            raise ConfigError(f"dataplane.agent.boxes: {', '.join(twice)} cabled to more than one box")
        self.racks = [names for _, names in boxes]
        self.boxes: list[Driver] = []
        try:
            for address, _ in boxes:
                self.boxes.append(connect(replace(settings, address=address, boxes=())))
        except DriverError:
            self.close()
            raise
        kinds = {getattr(box, "kind", box.name) for box in self.boxes}  # an agent's: what it serves
        if not kinds <= set(FABRIC_KINDS):
            self.close()
            raise DriverError(f"a fabric balances at the home's leaf, which the {', '.join(sorted(kinds))} data "
                              f"plane cannot do yet (the replica's switch must learn the home from the get): run "
                              f"{' or '.join(FABRIC_KINDS)} on every box")
        limits = [box.max_replicas for box in self.boxes if box.max_replicas is not None]
        self.max_replicas = min(limits) if limits else None
        self.lock = threading.Lock()
        self.held: dict[bytes, int] = {}  # hot key -> the box holding its rules
        self.box_of: list[int] = []  # server index -> its box
        self.box_at: dict[tuple[str, int], int] = {}  # a server's (ip, port) -> its box
        self.on_reconnect: ReconnectHandler | None = None

    # --- routing ---------------------------------------------------------------------------------------------
    def _key_box(self, key: bytes) -> Driver:
        with self.lock:
            if key not in self.held:
                raise DriverError(f"{key!r} is not installed")
            return self.boxes[self.held[key]]

    def _by_box(self, keys: Sequence[bytes], refused: dict[bytes, DriverError]) -> dict[int, list[bytes]]:
        groups: dict[int, list[bytes]] = {}
        with self.lock:
            for key in keys:
                if key in self.held:
                    groups.setdefault(self.held[key], []).append(key)
                else:
                    refused[key] = DriverError(f"{key!r} is not installed")
        return groups

    def _server_box(self, server: int) -> Driver:
        return self.boxes[self.box_of[server]]

    def _stream_box(self, stream: StreamId) -> Driver | None:
        box = self.box_at.get((stream.server_ip, stream.server_port))
        return None if box is None else self.boxes[box]

    # --- the driver interface --------------------------------------------------------------------------------
    def attach(self, servers: Sequence[Server], on_mirror: MirrorHandler,
               on_reconnect: ReconnectHandler | None = None) -> list[FoundKey]:
        where = {name: box for box, names in enumerate(self.racks) for name in names}
        unknown = sorted(set(where) - {s.name for s in servers})
        if unknown:
            raise DriverError(f"dataplane.agent.boxes names {', '.join(unknown)}, not a server of the config")
        if nowhere := [s.name for s in servers if s.name not in where]:
            raise DriverError(f"{', '.join(nowhere)} cabled to no box of dataplane.agent.boxes: its hot keys would "
                              f"have no switch to balance them")
        self.box_of = [where[s.name] for s in servers]
        self.box_at = {(s.ip, s.port): where[s.name] for s in servers}
        self.on_reconnect = on_reconnect
        found: dict[bytes, dict[int, FoundKey]] = {}  # key -> box -> as that box read it back
        for index, box in enumerate(self.boxes):
            for key in box.attach(servers, on_mirror,
                                  lambda *came_back, index=index: self._came_back(index, *came_back)):
                found.setdefault(key.key, {})[index] = key
            box.set_tcp_homes(self._rack(index))
        log.info("fabric: %d boxes, servers by box: %s", len(self.boxes),
                 "; ".join(f"box {i + 1}: {' '.join(names) or 'none (spine)'}" for i, names in enumerate(self.racks)))
        return [self._adopted(key, by_box) for key, by_box in found.items()]

    def _adopted(self, key: bytes, by_box: dict[int, FoundKey]) -> FoundKey:
        """A key read back from the boxes: held where its home's leaf alone holds it (and holds it whole); else its
        rules go from every box that has them (another leaf balancing it would miss the writes from other racks)."""
        home_box = next((self.box_of[f.home] for f in by_box.values() if 0 <= f.home < len(self.box_of)), None)
        only = by_box.get(home_box) if list(by_box) == [home_box] else None
        if only is not None and only.distrust not in RULES_REMOVED:
            with self.lock:
                self.held[key] = home_box
            return only
        for box, f in by_box.items():
            if f.distrust not in RULES_REMOVED:
                refused = self.boxes[box].remove_hot_keys([key])
                if refused:
                    log.warning("fabric: box %d: %r, held where it should not be, not removed: %s", box + 1, key,
                                refused[key])
        first = by_box.get(home_box) or next(iter(by_box.values()))
        why = first.distrust if first.distrust in RULES_REMOVED else Distrust.TABLES_DISAGREE
        return FoundKey(key, first.home, first.replicas, None, why)

    def _rack(self, index: int) -> list[int]:
        """The servers cabled to box `index`: the homes whose TCP connections its TCP path takes (at the home's
        leaf, where their hot keys are balanced; a client's leaf passes them on)."""
        return [server for server, box in enumerate(self.box_of) if box == index]

    def _came_back(self, index: int, found: Sequence[FoundKey] | None = None, lost: Sequence[bytes] | None = None
                   ) -> None:
        """Box `index` came back: empty (found None), or holding `found` (read back, as at attach) without `lost`
        (None: every key it had and did not find). The core adopts what it holds and installs again what it lost."""
        try:  # an agent attached anew (restarted) has forgotten them; a reloaded switch has them from its driver
            self.boxes[index].set_tcp_homes(self._rack(index))
        except DriverError as err:
            log.warning("fabric: box %d: the TCP path's homes not set again (%s): its TCP path takes every "
                        "connection until they are", index + 1, err)
        with self.lock:
            had = [key for key, box in self.held.items() if box == index]
            self.held = {key: box for key, box in self.held.items() if box != index}
        adopted = [self._adopted(key.key, {index: key}) for key in found or ()]
        held = {key.key for key in adopted}
        lost = [key for key in had if key not in held] if lost is None else list(lost)
        if self.on_reconnect is not None:
            self.on_reconnect(adopted, lost)

    def install_hot_keys(self, installs: Sequence[HotKeyInstall]) -> dict[bytes, DriverError]:
        refused: dict[bytes, DriverError] = {}
        fresh: dict[int, list[HotKeyInstall]] = {}
        again: list[HotKeyInstall] = []
        with self.lock:
            for install in installs:
                (again if install.key in self.held else fresh.setdefault(self.box_of[install.home], [])
                 ).append(install)
        for box, refused_here in self._per_box(fresh, lambda box, batch: box.install_hot_keys(batch)):
            refused.update(refused_here)
            with self.lock:
                self.held.update({i.key: box for i in fresh[box] if i.key not in refused_here})
        for install in again:  # a box that kept the key while another came back empty
            try:
                self.set_weights(install.key, install.replicas)
                self.set_dirty(install.key)
            except DriverError as err:
                refused[install.key] = err
        return refused

    def install_hot_key(self, key: bytes, home: int, replicas: Sequence[ReplicaWeight]) -> None:
        raise_refused(self.install_hot_keys([HotKeyInstall(key, home, tuple(replicas))]))

    def set_weights(self, key: bytes, replicas: Sequence[ReplicaWeight]) -> None:
        self._key_box(key).set_weights(key, replicas)

    def remove_hot_keys(self, keys: Sequence[bytes]) -> dict[bytes, DriverError]:
        refused: dict[bytes, DriverError] = {}
        groups = self._by_box(keys, refused)
        for box, refused_here in self._per_box(groups, lambda box, batch: box.remove_hot_keys(batch)):
            refused.update(refused_here)
            with self.lock:
                for key in groups[box]:
                    if key not in refused_here:
                        self.held.pop(key, None)
        return refused

    def remove_hot_key(self, key: bytes) -> None:
        raise_refused(self.remove_hot_keys([key]))

    def set_dirty(self, key: bytes) -> None:
        self._key_box(key).set_dirty(key)

    def write_stamp(self, key: bytes) -> WriteStamp:
        return self._key_box(key).write_stamp(key)

    def write_stamps(self, keys: Sequence[bytes]) -> dict[bytes, WriteStamp]:
        refused: dict[bytes, DriverError] = {}
        stamps: dict[bytes, WriteStamp] = {}
        for _, stamps_here in self._per_box(self._by_box(keys, refused), lambda box, batch: box.write_stamps(batch)):
            stamps.update(stamps_here)
        raise_refused(refused)
        return stamps

    def clear_dirty(self, key: bytes, stamp: WriteStamp) -> None:
        self._key_box(key).clear_dirty(key, stamp)

    def clear_dirty_keys(self, stamps: Mapping[bytes, WriteStamp]) -> dict[bytes, DriverError]:
        refused: dict[bytes, DriverError] = {}
        groups = self._by_box(list(stamps), refused)
        for _, refused_here in self._per_box(
                groups, lambda box, batch: box.clear_dirty_keys({key: stamps[key] for key in batch})):
            refused.update(refused_here)
        return refused

    def renew_lease(self, seconds: float) -> None:
        self._every(lambda box: box.renew_lease(seconds))

    def set_forwarding(self, entries: Sequence[ForwardingEntry]) -> None:
        if entries:
            raise DriverError("a fabric's switches learn where each MAC is: [[forwarding]] names one switch's ports")

    def read_counters(self) -> Counters:
        total = Counters()
        for counters in self.fan_out.run([box.read_counters for box in self.boxes], (DriverError,)).results():
            total.keys.update(counters.keys)  # a key is on one box
            total.unparsed += counters.unparsed
            total.unsure += counters.unsure
            for name, value in counters.switch.items():
                total.switch[name] = total.switch.get(name, 0) + value
        return total

    def switch_counters(self) -> list[dict[str, int]]:
        per_box = self.fan_out.run([box.switch_counters for box in self.boxes], (DriverError,)).results()
        return [counts for counts_of_box in per_box for counts in counts_of_box]

    def stream_start(self, stream: StreamId) -> int | None:
        box = self._stream_box(stream)
        return box.stream_start(stream) if box else None

    def resume_stream(self, stream: StreamId, seq: int) -> None:
        if box := self._stream_box(stream):
            box.resume_stream(stream, seq)

    def blind_stream(self, stream: StreamId) -> None:
        if box := self._stream_box(stream):
            box.blind_stream(stream)

    def unsure_quiet(self, server: int) -> float | None:
        return self._server_box(server).unsure_quiet(server)

    def rearm_unsure(self, server: int) -> None:
        self._server_box(server).rearm_unsure(server)

    def server_closes(self, server: int) -> tuple:
        return self._server_box(server).server_closes(server)

    def closes_handled(self, server: int, closes: tuple) -> None:
        """The server's own box takes `closes` (what the core read before its check); every other box that counted
        one of its closes (a box its segments to the controller pass) acknowledges what it counted: else that box
        would balance no get to the server for good. A close counted anywhere after the check began is counted by
        the server's own box too, which the next probe compares."""
        own = self._server_box(server)
        own.closes_handled(server, closes)
        others = [box for box in self.boxes if box is not own]
        self.fan_out.run([lambda box=box: _acknowledge_pending(box, server) for box in others], (DriverError,)) \
            .results()

    def closes_pending(self, server: int) -> bool:
        """Pending on any box (every box counts the closes that pass it), every box asked at once."""
        return any(self.fan_out.run([lambda box=box: box.closes_pending(server) for box in self.boxes],
                                    (DriverError,)).results())

    def server_macs(self) -> list[MacSighting] | None:
        """Merged over the boxes (each server's own leaf sees its TCP segments); None if a box cannot tell."""
        per_box = [box.server_macs() for box in self.boxes]
        return None if any(s is None for s in per_box) else merge_sightings(per_box)

    def sketch_call(self, call: str, args: tuple) -> Any:
        raise DriverError("a fabric's gets enter at every leaf, and a sketch is one switch's: detect by capture")

    def owned_switches(self) -> list[str]:
        return [name for box in self.boxes for name in box.owned_switches()]

    def switches_gone(self) -> list[str]:
        return [name for box in self.boxes for name in box.switches_gone()]

    def close(self) -> None:
        self._each_box(lambda box: box.close())

    def let_go(self) -> None:
        self._each_box(lambda box: box.let_go())

    def _each_box(self, end: Callable[[Driver], None]) -> None:
        """Every box closed or let go, one after the other (a box that refuses holds back no other)."""
        for box in self.boxes:
            try:
                end(box)
            except DriverError as err:
                log.info("closing a box: %s", err)
        self.fan_out.close()

    def _every(self, call: Callable[[Driver], None]) -> None:
        """`call` on every box at once; the first refusal raised once all were asked (one box down holds back no
        other, one after the other too)."""
        outcomes = self.fan_out.run([lambda box=box: call(box) for box in self.boxes], (DriverError,), every=True)
        if outcomes.failed:
            raise outcomes.failed[0][1]

    def _per_box(self, groups: Mapping[int, list], call: Callable[[Driver, list], T]) -> Iterator[tuple[int, T]]:
        """`call(box, its batch)` for each box of `groups`, every box at once; yields (box index, what it returned)
        for each box that answered, then raises the first box's DriverError if one raised (one after the other, the
        boxes after it are not asked: as before)."""
        order = list(groups)
        outcomes = self.fan_out.run([lambda b=b: call(self.boxes[b], groups[b]) for b in order], (DriverError,))
        for i in outcomes.done:
            yield order[i], outcomes.outcomes[i]
        if outcomes.failed:
            raise outcomes.failed[0][1]


def _acknowledge_pending(box: Driver, server: int) -> None:
    """One box's closes of the server acknowledged as it counted them now, where any is pending."""
    if box.closes_pending(server):
        box.closes_handled(server, box.server_closes(server))
