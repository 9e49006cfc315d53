"""The driver interface: what the controller core asks of a data plane, whatever the switch.

The core decides and replicates; a driver only turns its requests into table writes for one kind of switch (eBPF
maps, P4Runtime entries, OpenFlow flows and groups) and hands back what the data plane saw. Servers are named by
their index in the config's server list (the order the clients hash over); `attach` gives the driver that list so
it can turn an index into MAC, IP and port. Every method may raise DriverError, and a refused request must leave
the switch and the driver as they were; the core logs it, keeps gets safe (a key whose weights cannot be written
is made dirty, or its rules removed, so its gets go home) and retries with back-off (controller/execution.py).
Drivers are made by name from the registry (dataplanes/registry.py).

Dirty state without races: the data plane counts, the core never clears blindly. A data plane counts every write
to a hot key it mirrors, and every request to a server that may hold writes it cannot read ("unsure": all hot keys
homed there). A key is dirty (its gets go home) unless the counts still equal what the core last synced it to:
the core reads a `write_stamp`, brings the copies up to date, then `clear_dirty(key, stamp)`; a write counted
after the stamp keeps the key dirty, with no read-modify-write anywhere. The stamp also says how many writes to the
key the data plane has counted since it was installed (each one copied to the controller once), so the core does
not clear a key while the copy of one of them is still on its way. And the core holds a lease (`renew_lease`): when it stops renewing (killed, hung), every hot
key acts dirty, so no crash or restart order can serve a stale copy.

The order of calls the core guarantees (so a driver never has to check it):
- `install_hot_key` only after every replica with a positive weight holds the value; it installs dirty, and the
  core clears it once it has checked the copies are still current.
- `remove_hot_key` before the extra copies are deleted; `set_weights` with weight 0 for a replica before its copy
  is deleted or while it is stale.
"""
from __future__ import annotations

import abc
import functools
import inspect
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Callable, ClassVar, Mapping, Sequence, TypeVar

from mbalancer.settings import Server

MirrorHandler = Callable[[bytes], None]  # called with each packet copied to the controller, a whole Ethernet frame
# Called when the switch came back: with no arguments when it came back empty (restarted, reloaded: every hot key is
# installed again); with (found, lost) when it came back holding hot keys (a switch agent whose controller's stream
# dropped, attached anew): `found` read back as at attach (adopted), `lost` the keys it no longer holds (installed
# again; None: every hot key not found).
ReconnectHandler = Callable[..., None]


class DriverError(RuntimeError):
    """The data plane refused or could not take a request."""


@dataclass(frozen=True)
class ReplicaWeight:
    server: int  # index into the config's servers
    weight: float  # share of the key's gets, 0..1; the weights of a key sum to 1


@dataclass(frozen=True)
class HotKeyInstall:
    """One key of install_hot_keys: install_hot_key's arguments."""
    key: bytes
    home: int
    replicas: tuple[ReplicaWeight, ...]


@dataclass(frozen=True)
class WriteStamp:
    """What the data plane had counted for one key when the core read it."""
    writes: int  # writes to the key counted (and copied to the controller) since it was installed, every switch
    counts: tuple = ()  # the driver's own record of the key's write and unsure counts (opaque to the core)


@dataclass(frozen=True)
class StreamId:
    """A TCP connection from a client to a server."""
    client_ip: str
    client_port: int
    server_ip: str
    server_port: int

    @classmethod
    def between(cls, source: str, destination: str) -> "StreamId":
        """The connection from `source` to `destination`, each "ip:port" (a segment's ends, as mbalancer.packets
        names them)."""
        client_ip, _, client_port = source.rpartition(":")
        server_ip, _, server_port = destination.rpartition(":")
        return cls(client_ip, int(client_port), server_ip, int(server_port))


class Distrust(str, Enum):
    """Why the state a new leader found for a key cannot be taken as it is: the key alone is rebuilt (a str: the
    decision log shows the value). The driver names the first five, the core the others (controller/adoption.py)."""
    LEASE_EXPIRED = "lease-expired"  # its switch's lease had run out: nobody vouched for its copies meanwhile
    LEASE_UNKNOWN = "lease-unknown"  # a switch could not tell its lease (P4: a program without the lease query)
    TABLES_DISAGREE = "tables-disagree"  # switches hold different entries for it (or one that should hold none)
    RULES_DISAGREE = "rules-disagree"  # a switch's rules for it (an OpenFlow group or flow) are not its table entry's
    NOT_PLACEABLE = "not-placeable"  # its entry names servers the config does not have
    HOME_UNREADABLE = "home-unreadable"  # its home could not be read: nothing to compare the copies with
    REPLICA_MISSING = "replica-missing"  # a replica with weight holds no copy of the home's item
    REPLICA_DIFFERS = "replica-differs"  # a replica's copy is not the home's item (value, flags or expiry)
    REPLICA_UNREADABLE = "replica-unreadable"  # a replica with weight could not be read


# What the driver did about it already: the key's rules are out of every switch (gets go home untouched).
RULES_REMOVED = frozenset({Distrust.TABLES_DISAGREE, Distrust.RULES_DISAGREE,
                           Distrust.NOT_PLACEABLE})


@dataclass(frozen=True)
class FoundKey:
    """A hot key the switches held when the driver attached (installed by a controller that stopped or was
    deposed), read back: what the data plane does with it now."""
    key: bytes
    home: int
    replicas: tuple[ReplicaWeight, ...]  # as its table weighs them (home among them)
    synced: WriteStamp | None  # clean: the counts it was cleared to (a write_stamp's counts); None: dirty or held
    distrust: Distrust | None = None  # why its state cannot be taken as it is (the driver's own reasons)

    def __post_init__(self) -> None:  # (a switch agent sends the enum as its value)
        if self.distrust is not None and not isinstance(self.distrust, Distrust):
            object.__setattr__(self, "distrust", Distrust(self.distrust))

    @property
    def servers(self) -> tuple[int, ...]:
        """Every server its entry names, the home first."""
        return tuple(dict.fromkeys((self.home, *(r.server for r in self.replicas))))


@dataclass(frozen=True)
class ForwardingEntry:
    mac: str  # destination MAC
    port: str  # switch port (interface name or port number as text)


@dataclass(frozen=True)
class MacSighting:
    """What the switches saw of one server's MAC (Driver.server_macs)."""
    seen: tuple[str, ...] = ()  # the source MACs its packets came from (one per switch that saw any), lower case
    flooded: int = 0  # gets balanced to it that were flooded: no switch knew where its configured MAC is


def merge_sightings(per_switch: Sequence[Sequence[MacSighting]]) -> list[MacSighting]:
    """Each server's sightings on every switch as one: the MACs seen anywhere, the floods summed."""
    return [MacSighting(tuple(sorted({mac for s in column for mac in s.seen})), sum(s.flooded for s in column))
            for column in zip(*per_switch)]


@dataclass
class KeyCounters:
    gets: int = 0  # gets for the key that the hot_get table matched
    home_while_dirty: int = 0  # of those, sent home because the key was dirty (or the lease out)
    mirrored: int = 0  # writes to the key copied to the controller
    per_replica: dict[int, int] = field(default_factory=dict)  # server index -> gets sent there


@dataclass
class Counters:
    keys: dict[bytes, KeyCounters] = field(default_factory=dict)
    unparsed: int = 0  # memcached-port packets forwarded untouched because the pipeline could not read them
    unsure: int = 0  # requests that made their server's hot keys dirty (they may hold writes the pipeline cannot read)
    switch: dict[str, int] = field(default_factory=dict)  # the data plane's own switch-wide counters, by name


class Driver(ABC):
    """One data plane. Implementations: dataplanes/<kind>/driver.py (recording for tests and dry runs, eBPF, P4,
    OpenFlow)."""

    name = "abstract"
    max_replicas: ClassVar[int | None] = None  # servers one hot key can be spread over (home included); None: any
    # read_counters gives each hot key's gets per replica as a switch counted them; False: no switch counts any (the
    # controller then says its measured balance is not supported, never shows a 0: controller/measured_balance.py)
    counts_gets: ClassVar[bool] = True

    @abstractmethod
    def attach(self, servers: Sequence[Server], on_mirror: MirrorHandler,
               on_reconnect: ReconnectHandler | None = None) -> list[FoundKey]:
        """Start: learn the servers, begin delivering the data plane's copies to `on_mirror` (from any thread). Hot
        keys the switches already hold were installed by a controller that stopped: the driver reads each one back
        (home, replicas and weights, slot, dirty state, whether its lease ran out) and keeps it as installed, so
        the core can adopt it as it is (no rule removed, no copy deleted; controller/adoption.py). A key whose
        switches disagree (or that a data plane cannot read back) has its rules removed here, and is returned
        with why. The switches' lease is left as it was: the core renews it once it has judged every key. A
        driver that sees its switch come back empty (restarted, reloaded) forgets what it had installed and calls
        `on_reconnect` (from any thread); the core then installs every hot key again."""

    @abstractmethod
    def install_hot_key(self, key: bytes, home: int, replicas: Sequence[ReplicaWeight]) -> None:
        """Balance gets for `key` over `replicas` (home among them) by weight; held dirty, writes mirrored."""

    @abstractmethod
    def set_weights(self, key: bytes, replicas: Sequence[ReplicaWeight]) -> None:
        """New weights for an installed key (same replica set; a weight of 0 takes a replica out)."""

    @abstractmethod
    def remove_hot_key(self, key: bytes) -> None:
        """Stop balancing and mirroring `key`: its gets and writes go to the home server untouched."""

    @abstractmethod
    def set_dirty(self, key: bytes) -> None:
        """Hold the key dirty (gets go home) until `clear_dirty`, whatever the data plane counts."""

    @abstractmethod
    def write_stamp(self, key: bytes) -> WriteStamp:
        """The key's write counts (and the home's unsure count) as the data plane has them now."""

    @abstractmethod
    def clear_dirty(self, key: bytes, stamp: WriteStamp) -> None:
        """Let the key's gets be balanced again, unless the data plane counted a write to it, or an unsure request
        to its home, after `stamp` was read."""

    @abstractmethod
    def renew_lease(self, seconds: float) -> None:
        """The core vouches for the copies for `seconds` from now; after that every hot key acts dirty."""

    @abstractmethod
    def set_forwarding(self, entries: Sequence[ForwardingEntry]) -> None:
        """The whole forwarding table (destination MAC -> port)."""

    @abstractmethod
    def read_counters(self) -> Counters:
        """Counters since attach. Called from any thread (the HTTP server's), never under the core's lock: an
        implementation guards its own bookkeeping."""

    def set_tcp_homes(self, servers: Sequence[int]) -> None:
        """The servers (indexes) whose clients' TCP connections this data plane's TCP path takes, where it has one
        (the eBPF switch: docs/dataplanes/tcp.md): those whose hot keys it balances. Until called, every server's; a
        fabric names each leaf's own. A data plane without a TCP path has nothing to do."""

    # Many keys at once (a hot-set change): the same calls, in as few switch requests as the data plane can make
    # them (P4Runtime: one WriteRequest per switch); here one by one. A key refused holds back no other: the refused
    # ones are returned with why, and are as if not asked.
    def install_hot_keys(self, installs: Sequence[HotKeyInstall]) -> dict[bytes, DriverError]:
        return _each_key([i.key for i in installs], lambda i: self.install_hot_key(i.key, i.home, i.replicas),
                         installs)

    def remove_hot_keys(self, keys: Sequence[bytes]) -> dict[bytes, DriverError]:
        return _each_key(keys, self.remove_hot_key, keys)

    def write_stamps(self, keys: Sequence[bytes]) -> dict[bytes, WriteStamp]:
        """Every key's stamp, or DriverError."""
        return {key: self.write_stamp(key) for key in keys}

    def clear_dirty_keys(self, stamps: Mapping[bytes, WriteStamp]) -> dict[bytes, DriverError]:
        return _each_key(list(stamps), lambda key: self.clear_dirty(key, stamps[key]), list(stamps))

    def stream_start(self, stream: StreamId) -> int | None:
        """Where the data plane began reading a TCP connection as a stream: the sequence number of the segment that
        ended, or may have ended, inside a command (every later segment of it is unsure and copied here until
        `resume_stream`); None when it reads the connection's segments on their own. Data planes that do not track
        connections: None (they read every segment on its own)."""
        return None

    def resume_stream(self, stream: StreamId, seq: int) -> None:
        """The controller read the connection's copies as a stream up to `seq`, and a command starts there: the
        segment that starts at `seq` may be read on its own again. Nothing if the data plane no longer tracks it."""

    def blind_stream(self, stream: StreamId) -> None:
        """The controller cannot follow the connection (not the text protocol, or a copy of it was lost): the data
        plane keeps its segments unsure and may copy them once per report (rearm_unsure) instead of each."""

    def unsure_quiet(self, server: int) -> float | None:
        """Seconds since the latest unsure request to the server whose copy may have been coalesced (the core reads
        the home's keys only once the home has had UNREADABLE_WAIT to apply it); None if the data plane copies
        every unsure request."""
        return None

    def rearm_unsure(self, server: int) -> None:
        """The core is about to check the server's hot keys: the next coalescable unsure request is copied again
        (those before are covered by this check)."""

    def server_closes(self, server: int) -> tuple:
        """How often the server's memcached closed one of the controller's connections (it may have died or
        restarted), as the data plane counted (opaque to the core; () if it does not watch). From each such close
        until `closes_handled`, the data plane balances no get to the server and holds its hot keys dirty."""
        return ()

    def closes_handled(self, server: int, closes: tuple) -> None:
        """The core has dealt with the server's closes up to `closes` (read before it took the server's copies out
        of rotation and checked its hot keys): gets may be balanced to it again where it has weight."""

    def closes_pending(self, server: int) -> bool:
        """Whether a switch counted closes of the server that nobody acknowledged (`closes_handled`): it balances no
        get to the server meanwhile. A driver never acknowledges closes itself, at attach neither: those counted
        while no controller ran (the server may have restarted empty) are the core's to handle at start (False
        where the data plane watches no closes)."""
        return False

    def server_macs(self) -> list[MacSighting] | None:
        """Per server (the index of attach's list), the MACs the switches saw its packets come from and its balanced
        gets they flooded, for the core to compare with the configured MAC (controller/mac_check.py); None where the
        data plane cannot tell."""
        return None

    def sketch_call(self, call: str, args: tuple) -> Any:
        """One call of a sketch reader (monitor/dataplane.py SketchReader: set_sketch_control, clear_sketch,
        heavy_keys, take_sketch_destinations, counters) on the first switch's hot-key sketch, for a data plane whose
        sketch only the controller can read (P4: its digests go to the P4Runtime primary); set_sketch_control's
        deadline as the nanoseconds left. Elsewhere a reader opens the switch itself."""
        raise DriverError(f"the {self.name} data plane's sketch is read from the switch itself, not through the "
                          f"controller")

    def switch_counters(self) -> list[dict[str, int]]:
        """Each switch's own counters (packets, balanced, mirrored, ...: dataplanes/pipeline.py COUNTERS), for the
        operator's tools; [] where the data plane keeps none."""
        return []

    def owned_switches(self) -> list[str]:
        """Names of the switches this driver writes to, as one controller owns them (mbalancer/ownership.py):
        `kind:name`, the same for every controller that would drive that switch. None: no switch (a dry run)."""
        return []

    def switches_gone(self) -> list[str]:
        """The switches this driver was given that are not there now (detached or unloaded: it waits for them to be
        loaded again, and then fills them anew)."""
        return []

    def close(self) -> None:
        """Stop delivering mirrors, end the lease (gets go home: nobody keeps the copies fresh any more) and release
        the data plane (tables may stay: the switch keeps forwarding)."""

    def let_go(self) -> None:
        """Stop delivering mirrors and release the data plane as it is, its lease left to run out by itself: the
        controller died or lost its connection, and the next one may adopt what the switches hold before then (a
        switch agent does this when its controller's stream ends). By default: close."""
        self.close()


# --- the interface's calls, listed once ----------------------------------------------------------------------------
# Every call but attach, close and let_go (which each side handles itself). The slot book (dataplanes/slot_book.py)
# answers HOT_KEY_CALLS for each data plane that keeps one; a driver whose calls run elsewhere forwards CALLS. The forwards
# are derived from these lists (`forwards`), never written out, so a call added here reaches every side.
HOT_KEY_CALLS = ("install_hot_key", "install_hot_keys", "set_weights", "remove_hot_key", "remove_hot_keys",
                 "set_dirty", "write_stamp", "write_stamps", "clear_dirty", "clear_dirty_keys", "renew_lease",
                 "read_counters", "switch_counters", "server_closes", "closes_handled", "closes_pending",
                 "resume_stream", "blind_stream")
SWITCH_CALLS = ("set_forwarding", "set_tcp_homes", "stream_start", "unsure_quiet", "rearm_unsure", "server_macs",
                "sketch_call", "owned_switches", "switches_gone")
CALLS = HOT_KEY_CALLS + SWITCH_CALLS
# The calls on many keys, each with its call on one (the same request, key by key).
ONE_KEY_CALLS = {"install_hot_keys": "install_hot_key", "remove_hot_keys": "remove_hot_key",
                 "write_stamps": "write_stamp", "clear_dirty_keys": "clear_dirty"}
# The calls on one key, whose first argument is the key.
KEYED_CALLS = frozenset({"install_hot_key", "set_weights", "remove_hot_key", "set_dirty", "write_stamp",
                         "clear_dirty"})

D = TypeVar("D", bound=type)


def forwards(calls: Sequence[str], through: str) -> Callable[[D], D]:
    """A class decorator: each driver call named in `calls` becomes a method of the class that hands the call's name
    and its arguments (in the interface's order) to the class's method `through(call, args)` and returns what that
    returns. Each keeps the interface's signature and doc."""
    def decorate(cls: D) -> D:
        for call in calls:
            setattr(cls, call, _forward(call, through))
        abc.update_abstractmethods(cls)
        return cls
    return decorate


def _forward(call: str, through: str) -> Callable[..., Any]:
    declared = getattr(Driver, call)
    signature = inspect.signature(declared)
    arity = len(signature.parameters) - 1  # (self)

    @functools.wraps(declared)
    def forward(self: Driver, *args: Any, **kwargs: Any) -> Any:
        if kwargs or len(args) != arity:  # (TypeError for what the interface does not take)
            bound = signature.bind(self, *args, **kwargs)
            bound.apply_defaults()
            args = bound.args[1:]
        return getattr(self, through)(call, args)
    forward.__isabstractmethod__ = False  # (wraps copied the declaration's mark)
    return forward


def _each_key(keys: Sequence[bytes], call: Callable[[Any], None], args: Sequence[Any]) -> dict[bytes, DriverError]:
    """`call` on each of `args` (the call for keys[i]); the keys whose call was refused, with why."""
    refused = {}
    for key, arg in zip(keys, args):
        try:
            call(arg)
        except DriverError as err:
            refused[key] = err
    return refused


def raise_refused(refused: Mapping[bytes, DriverError]) -> None:
    """A many-key call's answer for one key: its refusal raised (a one-key call has no other way to say no)."""
    for err in refused.values():
        raise err
