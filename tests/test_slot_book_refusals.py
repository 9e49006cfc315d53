"""The slot book's promise (dataplanes/slot_book.py): a refused request leaves the switches and the book as they
were, and the next request goes through. Every book call, with a refusal injected at each switch of a fabric of
three, on every tables adapter: in-memory tables, the eBPF program's maps (three programs loaded in the kernel) and
P4Runtime (three checking servers, which refuse a delete of an entry that is not there, as bmv2 does); the switches
written one after the other, and all at once (a refusal then comes while the others are being written).

Before the fix, a weight change refused by the second switch left the first holding the new ranges while the book
kept the old entry: on P4 every later change of the key then deleted ranges that were not there, for good."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

import pytest

from dataplanes.driver import DriverError, HotKeyInstall, ReplicaWeight
from dataplanes.fan_out import FanOut
from dataplanes.slot_book_driver import SlotBookDriver
from mbalancer.settings import Server

SERVERS = [Server(f"s{i}", f"10.0.0.{i + 1}", f"02:00:00:00:00:{i + 1:02x}", 11211) for i in range(3)]
SWITCHES = 3
EVEN = (ReplicaWeight(0, 0.5), ReplicaWeight(1, 0.5))
SKEWED = (ReplicaWeight(0, 0.2), ReplicaWeight(1, 0.3), ReplicaWeight(2, 0.5))
CLEAN = (b"k1", b"k2")  # installed and cleared before each request
NEW = (b"k3", b"k4")


@dataclass
class Fabric:
    driver: SlotBookDriver
    held: Callable[[int], object]  # what switch i holds, comparable
    close: Callable[[], None]


def memory_fabric() -> Fabric:
    from dataplanes.recording.fabric import SimulatedFabric
    driver = SimulatedFabric(SWITCHES)
    driver.attach(SERVERS, lambda frame: None)
    tables = driver.tables

    def held(i: int) -> object:  # a free slot's dirty state is written anew by the install that takes it
        return dict(tables[i].hot), {e.slot: tables[i].synced.get(e.slot) for e in tables[i].hot.values()}

    return Fabric(driver, held, driver.close)


def ebpf_fabric(planes: list) -> Fabric:
    """A driver on three loaded programs; it reads back what the previous test's driver left in them as it attaches
    (and keeps it, as a new leader does), so it removes those keys first: each test starts from empty tables."""
    from dataplanes import registry
    kind = registry.get("ebpf")
    driver = kind.make_driver(kind.parse_settings({"switches": [p.name for p in planes]}))
    found = driver.attach(SERVERS, lambda frame: None)
    assert driver.remove_hot_keys([f.key for f in found]) == {}
    tables = list(driver.book.switches)

    def held(i: int) -> object:  # a free slot's dirty state is written anew by the install that takes it
        hot = tables[i].held_keys()
        return hot, {e.slot: tables[i].synced(e.slot) for e in hot.values()}, [tables[i].filter_count(key)
                                                                               for key in CLEAN + NEW]

    return Fabric(driver, held, driver.close)


def p4_fabric() -> Fabric:
    from dataplanes.p4 import Settings
    from dataplanes.p4.driver import P4RuntimeDriver
    from dataplanes.p4.pipeline import Pipeline
    from tests.p4runtime_server import CheckingServer
    servers = [CheckingServer().start() for _ in range(SWITCHES)]
    driver = P4RuntimeDriver(Settings(switches=tuple(s.address for s in servers), ports=(1, 2)), Pipeline())
    driver.attach(SERVERS, lambda frame: None)

    def held(i: int) -> object:
        with servers[i].lock:
            return frozenset((k, v.SerializeToString(deterministic=True)) for k, v in servers[i].entries.items())

    def close() -> None:
        driver.close()
        for server in servers:
            server.stop()

    return Fabric(driver, held, close)


FABRICS = {"memory": memory_fabric, "ebpf": ebpf_fabric, "p4": p4_fabric}
WIDTHS = (1, SWITCHES)  # switches written at once (dataplanes/fan_out.py)


class Refusing:
    """A switch's tables adapter that refuses one method (with the adapter's own error type) and passes on the rest."""

    def __init__(self, tables: object, method: str, error: type[Exception]):
        self.tables, self.method, self.error = tables, method, error

    def __getattr__(self, name: str):
        if name == self.method:
            def refuse(*args, **kwargs):
                raise self.error(f"{name} refused by the test")
            return refuse
        return getattr(self.tables, name)


@pytest.fixture(scope="module")
def planes():
    """Three eBPF programs for the module (loading one takes seconds); each test's driver starts them afresh."""
    from dataplanes.bpf.program import DataPlane
    loaded = [DataPlane(f"refuse{os.getpid() % 10000}x{i}").load() for i in range(SWITCHES)]
    for plane in loaded:
        plane.serve([])
    yield loaded
    for plane in loaded:
        plane.unload()


@pytest.fixture(params=[(name, width) for name in sorted(FABRICS) for width in WIDTHS], ids=lambda p: f"{p[0]}-{p[1]}")
def fabric(request):
    name, width = request.param
    made = FABRICS[name](request.getfixturevalue("planes")) if name == "ebpf" else FABRICS[name]()
    book = made.driver.book
    book.fan_out = FanOut(width)  # 1: one switch after the other; 3: every switch at once
    refused = book.install_hot_keys([HotKeyInstall(key, 0, EVEN) for key in CLEAN])
    assert refused == {}
    assert book.clear_dirty_keys(book.write_stamps(list(CLEAN))) == {}
    yield made
    made.close()


def refuse_at(fabric: Fabric, switch: int, method: str) -> Callable[[], None]:
    """Switch `switch` refuses `method` until the returned function is called."""
    book = fabric.driver.book
    real = book.switches[switch]
    book.switches[switch] = Refusing(real, method, book.errors[0])

    def restore() -> None:
        book.switches[switch] = real
    return restore


def refused(call: Callable[[], object]) -> bool:
    """The call was refused: it raised DriverError, or returned a refusal for some key."""
    try:
        result = call()
    except DriverError:
        return True
    return bool(result)


# (name, the adapter method the switch refuses, the request, whether the refused request is undone everywhere; a
# refused remove or hold may leave earlier switches with the key out or held dirty: the safe side)
REQUESTS = [
    ("install", "install_keys", lambda book: book.install_hot_keys([HotKeyInstall(k, 1, SKEWED) for k in NEW]), True),
    ("weights", "set_hot", lambda book: book.set_weights(b"k1", SKEWED), True),
    ("clear", "set_synced_slots", lambda book: book.clear_dirty_keys(book.write_stamps(list(CLEAN))), True),
    ("remove", "delete_keys", lambda book: book.remove_hot_keys([b"k1"]), False),
    ("hold", "hold", lambda book: book.set_dirty(b"k1"), False),
    ("stamps", "write_counts", lambda book: book.write_stamps(list(CLEAN)) and None, True),
]


@pytest.mark.parametrize("switch", range(SWITCHES))
@pytest.mark.parametrize("name, method, request_, undone", REQUESTS, ids=[r[0] for r in REQUESTS])
def test_a_request_refused_at_any_switch_leaves_book_and_switches_as_they_were(fabric, switch, name, method,
                                                                              request_, undone):
    book = fabric.driver.book
    if name == "clear":
        for key in CLEAN:
            book.set_dirty(key)
    before = [fabric.held(i) for i in range(SWITCHES)]
    entries, free = dict(book.entries), list(book.free_slots)
    restore = refuse_at(fabric, switch, method)
    try:
        assert refused(lambda: request_(book)), f"{name} went through although switch {switch} refused"
    finally:
        restore()
    assert book.entries == entries and sorted(book.free_slots) == sorted(free), "the book moved on"
    after = [fabric.held(i) for i in range(SWITCHES)]
    if undone:
        assert after == before, f"{name} refused at switch {switch}: switches changed"
    elif book.fan_out.width == 1:
        assert after[switch:] == before[switch:], f"{name} refused at switch {switch}: later switches changed"
    else:  # every switch was written at once: the others may have taken it (the safe side), the refusing one not
        assert after[switch] == before[switch], f"{name} refused at switch {switch}: that switch changed"
    assert not refused(lambda: request_(book)), f"{name} not taken once no switch refuses"
    held = [fabric.held(i) for i in range(SWITCHES)]
    assert held[1:] == held[:-1], f"after {name}, the switches hold different tables"


def test_a_key_the_hot_keys_map_refuses_is_not_left_counted_in_its_filter_bucket():
    """The eBPF adapter counts a new key in hot_filter before hot_keys takes it (no get of it may skip the lookup);
    hot_keys full, the kernel refuses the key, and the count is taken back (before the fix it stayed: every get in
    that bucket paid the lookup, and a later install and remove of the key left it counted for good)."""
    from dataplanes.bpf.bpf_syscall import BpfError
    from dataplanes.bpf.program import DataPlane
    from dataplanes.bpf.tables import Tables, key_bucket
    from dataplanes.pipeline import MAX_HOT
    from dataplanes.slot_book import HotEntry

    plane = DataPlane(f"filter{os.getpid() % 10000}").load()
    tables = Tables(plane.pin_dir)
    try:
        entry = HotEntry(0, 0, (0,), (65536,))
        for i in range(MAX_HOT):  # fills hot_keys (MAX_HOT entries)
            tables.set_hot(b"fill%d" % i, entry)
        extra = next(b"extra%d" % i for i in range(10_000)
                     if all(key_bucket(b"extra%d" % i) != key_bucket(b"fill%d" % j) for j in range(MAX_HOT)))
        with pytest.raises(BpfError):
            tables.set_hot(extra, entry)
        assert tables.filter_count(extra) == 0
        tables.set_hot(b"fill0", HotEntry(0, 0, (1,), (65536,)))  # in place: not counted again
        assert tables.filter_count(b"fill0") == sum(key_bucket(b"fill%d" % j) == key_bucket(b"fill0")
                                                    for j in range(MAX_HOT))
    finally:
        tables.close()
        plane.unload()
