"""A hot-set change at fleet scale (issue 47): every switch written at once, one request in flight per switch, and
the copies pipelined per server, with each key's outcome still its own. Behaviour only (who holds what, which
key failed, that the requests overlap), never speed: bench_controller_scale.py measures that.

Concurrency is shown without timing: a switch (or box) that meets the others at a barrier before it answers can
only answer if every switch was asked at once; asked one after the other, the first waits alone and is refused."""
from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import pytest

from controller.core import ControllerCore
from controller.replicator import Replicator
from dataplanes.driver import DriverError, HotKeyInstall, ReplicaWeight
from dataplanes.fan_out import NOT_TRIED, FanOut
from dataplanes.recording.driver import RecordingDriver
from dataplanes.recording.fabric import SimulatedFabric
from dataplanes.recording.tables import MemoryTables, TablesError
from mbalancer.config import parse_config
from mbalancer.memcache.addresses import ServerAddress
from mbalancer.memcache.client import tcp_client
from mbalancer.memcache.meta import MetaClient, MetaError, StoredItem
from mbalancer.memcache.server import MemcachedServer
from mbalancer.settings import Server

REPO = Path(__file__).resolve().parents[1]
SWITCHES = 4
MEET = 10.0  # seconds a switch waits for the others at the barrier (a bound, not a speed: they meet at once)
SERVERS = [Server(f"s{i}", f"10.0.0.{i + 1}", f"02:00:00:00:00:{i + 1:02x}", 11211) for i in range(3)]
EVEN = (ReplicaWeight(0, 0.5), ReplicaWeight(1, 0.5))


# --- the fan-out ----------------------------------------------------------------------------------------------------
def test_one_after_another_stops_at_the_first_refusal_in_parallel_every_call_is_made():
    made = []

    def call(i):
        def run():
            made.append(i)
            if i == 1:
                raise RuntimeError("refused")
            return i * 10
        return run

    serial = FanOut(1).run([call(i) for i in range(4)], (RuntimeError,))
    assert made == [0, 1] and serial.done == [0] and serial.outcomes[2:] == [NOT_TRIED, NOT_TRIED]
    made.clear()
    fan_out = FanOut(4)
    parallel = fan_out.run([call(i) for i in range(4)], (RuntimeError,))
    fan_out.close()
    assert sorted(made) == [0, 1, 2, 3] and parallel.done == [0, 2, 3]
    assert [i for i, _ in parallel.failed] == [1] and parallel.outcomes[3] == 30
    with pytest.raises(RuntimeError, match="refused"):
        parallel.results()


@pytest.mark.parametrize("width", [1, 4])
def test_every_call_is_made_past_a_refusal_when_asked_and_a_defect_is_raised_after_the_last(width):
    """An undo, a call that one switch down must not hold back from the others (FanOut.run every=True)."""
    made = []

    def call(i, error=None):
        def run():
            made.append(i)
            if error is not None:
                raise error
            return i
        return run

    fan_out = FanOut(width)
    try:
        outcomes = fan_out.run([call(0), call(1, RuntimeError("refused")), call(2), call(3)], (RuntimeError,),
                               every=True)
        assert sorted(made) == [0, 1, 2, 3] and outcomes.done == [0, 2, 3] and [i for i, _ in outcomes.failed] == [1]
        made.clear()
        with pytest.raises(KeyError):
            fan_out.run([call(0, KeyError("a defect")), call(1, RuntimeError("refused")), call(2)], (RuntimeError,),
                        every=True)
        assert sorted(made) == [0, 1, 2]
    finally:
        fan_out.close()


def test_an_error_nobody_named_is_raised_once_every_call_has_returned():
    done = threading.Event()

    def late():
        done.wait(MEET)
        return "late"

    def broken():
        done.set()
        raise KeyError("a defect")

    fan_out = FanOut(2)
    with pytest.raises(KeyError):
        fan_out.run([broken, late], (RuntimeError,))
    fan_out.close()
    assert done.is_set()


def test_the_pool_is_bounded_by_the_width():
    width, calls = 3, 12
    inside, most, lock = [0], [0], threading.Lock()
    gate = threading.Barrier(width, timeout=MEET)

    def call(meet: bool):
        def run():
            with lock:
                inside[0] += 1
                most[0] = max(most[0], inside[0])
            try:
                if meet:  # the first `width` calls can only return together: they run at once
                    gate.wait()
            finally:
                with lock:
                    inside[0] -= 1
        return run

    fan_out = FanOut(width, "bounded")
    fan_out.run([call(i < width) for i in range(calls)], (threading.BrokenBarrierError,)).results()
    workers = [t for t in threading.enumerate() if t.name.startswith("bounded")]
    fan_out.close()
    assert most[0] == width and len(workers) == width - 1  # the caller's thread makes one call itself


# --- the slot book over many switches -------------------------------------------------------------------------------
class Meeting(MemoryTables):
    """A simulated switch that answers a call on many keys only once every switch of the fabric has one in flight
    (and checks it never has two at once); `refuse` makes it refuse after the others have written theirs."""

    def __init__(self, barrier: threading.Barrier):
        super().__init__()
        self.barrier, self.refuse, self.in_flight, self.most_in_flight = barrier, None, 0, 0

    def _meet(self, method: str) -> None:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            self.barrier.wait()
        except threading.BrokenBarrierError:
            raise TablesError(f"{method}: the other switches were not asked at the same time") from None
        finally:
            self.in_flight -= 1
        if self.refuse == method:
            raise TablesError(f"{method} refused by the test")

    def install_keys(self, entries):
        self._meet("install_keys")
        return super().install_keys(entries)

    def delete_keys(self, entries):
        self._meet("delete_keys")
        return super().delete_keys(entries)

    def write_counts(self, slot_homes):
        self._meet("write_counts")
        return super().write_counts(slot_homes)

    def set_synced_slots(self, synced):
        self._meet("set_synced_slots")
        return super().set_synced_slots(synced)


def meeting_fabric(width: int, meet: float = MEET) -> tuple[SimulatedFabric, list[Meeting]]:
    driver = SimulatedFabric(SWITCHES, width=width)
    barrier = threading.Barrier(SWITCHES, timeout=meet)
    driver.tables = [Meeting(barrier) for _ in range(SWITCHES)]
    driver.attach(SERVERS, lambda frame: None)
    for tables in driver.tables:
        tables.calls.clear()  # what the change sends, not what attach read back
    return driver, driver.tables


def test_a_change_reaches_every_switch_with_one_request_in_flight_per_switch():
    driver, tables = meeting_fabric(SWITCHES)
    keys = [b"k%d" % i for i in range(5)]
    try:
        assert driver.install_hot_keys([HotKeyInstall(k, 0, EVEN) for k in keys]) == {}
        assert driver.clear_dirty_keys(driver.write_stamps(keys)) == {}
        assert all(set(t.hot) == set(keys) and all(t.synced[driver.book.slots[k]] is not None for k in keys)
                   for t in tables)
        assert driver.remove_hot_keys(keys[:2]) == {}
        assert all(set(t.hot) == set(keys[2:]) for t in tables)
        # one request per switch per call on many keys, and never two at once to one switch
        assert [t.requests for t in tables] == [4] * SWITCHES and {t.most_in_flight for t in tables} == {1}
    finally:
        driver.close()


def test_asked_one_after_the_other_the_switches_never_meet():
    """The check above can fail: with a width of 1 the first switch waits alone and refuses."""
    driver, tables = meeting_fabric(1, meet=0.2)  # one after the other they never meet, however long they wait
    try:
        refused = driver.install_hot_keys([HotKeyInstall(b"k", 0, EVEN)])
        assert "not asked at the same time" in str(refused[b"k"])
        assert all(t.hot == {} for t in tables) and driver.book.entries == {}
    finally:
        driver.close()


@pytest.mark.parametrize("switch", range(SWITCHES))
def test_an_install_refused_by_any_switch_while_the_others_write_is_undone_everywhere(switch):
    driver, tables = meeting_fabric(SWITCHES)
    try:
        assert driver.install_hot_keys([HotKeyInstall(b"old", 0, EVEN)]) == {}
        free = sorted(driver.book.free_slots)
        before = [dict(t.hot) for t in tables]
        tables[switch].refuse = "install_keys"  # it refuses once every switch has the batch in flight
        refused = driver.install_hot_keys([HotKeyInstall(k, 1, EVEN) for k in (b"new1", b"new2")])
        assert set(refused) == {b"new1", b"new2"}  # the batch, then each key alone: refused by that switch
        assert all("refused by the test" in str(err) for err in refused.values())
        assert [dict(t.hot) for t in tables] == before and sorted(driver.book.free_slots) == free
        assert set(driver.book.entries) == {b"old"}
        tables[switch].refuse = None
        assert driver.install_hot_keys([HotKeyInstall(b"new1", 1, EVEN)]) == {}
        assert all(set(t.hot) == {b"old", b"new1"} for t in tables)
    finally:
        driver.close()


@pytest.mark.parametrize("switch", range(SWITCHES))
def test_a_clear_refused_by_any_switch_leaves_every_switch_holding_the_key_dirty(switch):
    driver, tables = meeting_fabric(SWITCHES)
    try:
        assert driver.install_hot_keys([HotKeyInstall(b"k", 0, EVEN)]) == {}
        stamps = driver.write_stamps([b"k"])
        slot = driver.book.slots[b"k"]
        tables[switch].refuse = "set_synced_slots"
        assert b"k" in driver.clear_dirty_keys(stamps)
        assert [t.synced[slot] for t in tables] == [None] * SWITCHES  # held dirty on every switch: gets go home
    finally:
        driver.close()


def test_counters_are_two_requests_per_switch_whatever_the_hot_keys():
    driver = SimulatedFabric(SWITCHES, width=SWITCHES)
    driver.attach(SERVERS, lambda frame: None)
    try:
        assert driver.install_hot_keys([HotKeyInstall(b"k%d" % i, 0, EVEN) for i in range(50)]) == {}
        before = [t.requests for t in driver.tables]
        counters = driver.read_counters()
        assert len(counters.keys) == 50 and [t.requests - b for t, b in zip(driver.tables, before)] == [2] * SWITCHES
    finally:
        driver.close()


# --- a fabric of boxes ----------------------------------------------------------------------------------------------
class MeetingBox(RecordingDriver):
    """A box's driver that installs only once every box holding a key of the batch has its call in flight."""

    def __init__(self, barrier: threading.Barrier, refuse: bool = False):
        super().__init__()
        self.barrier, self.refuse = barrier, refuse

    def install_hot_keys(self, installs):
        try:
            self.barrier.wait()
        except threading.BrokenBarrierError:
            raise DriverError("the other boxes were not asked at the same time") from None
        if self.refuse:
            raise DriverError("this box is unreachable (test)")
        return super().install_hot_keys(installs)


def fabric_of(boxes: list[RecordingDriver], parallel: int):
    from dataplanes.agent import Settings
    from dataplanes.agent.fabric import FabricDriver
    made = iter(boxes)
    fabric = FabricDriver(Settings(boxes=tuple(f"10.0.1.{i + 2}:9600 s{i}" for i in range(len(boxes))),
                                   parallel=parallel), connect=lambda settings: next(made))
    fabric.attach(SERVERS, lambda frame: None)
    return fabric


def test_a_fabric_writes_its_boxes_at_once_each_key_at_its_homes_box():
    barrier = threading.Barrier(3, timeout=MEET)
    boxes = [MeetingBox(barrier) for _ in range(3)]
    fabric = fabric_of(boxes, parallel=3)
    try:
        assert fabric.install_hot_keys([HotKeyInstall(b"k%d" % home, home, EVEN) for home in range(3)]) == {}
        assert [set(box.table) for box in boxes] == [{b"k0"}, {b"k1"}, {b"k2"}]
        assert fabric.clear_dirty_keys(fabric.write_stamps([b"k0", b"k1", b"k2"])) == {}
        assert not any(box.dirty(b"k%d" % i) for i, box in enumerate(boxes))
    finally:
        fabric.close()


def test_a_box_that_fails_while_the_others_install_is_raised_and_the_others_keys_are_kept():
    barrier = threading.Barrier(3, timeout=MEET)
    boxes = [MeetingBox(barrier), MeetingBox(barrier, refuse=True), MeetingBox(barrier)]
    fabric = fabric_of(boxes, parallel=3)
    try:
        with pytest.raises(DriverError, match="unreachable"):
            fabric.install_hot_keys([HotKeyInstall(b"k%d" % home, home, EVEN) for home in range(3)])
        assert [set(box.table) for box in boxes] == [{b"k0"}, set(), {b"k2"}]
        assert set(fabric.remove_hot_keys([b"k0", b"k1", b"k2"])) == {b"k1"}  # never installed
        assert [set(box.table) for box in boxes] == [set(), set(), set()]
    finally:
        fabric.close()


# --- pipelined copies on real memcached -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def trio():
    """A home that takes 2 MB items and two replicas that take 1 MB: a 1.5 MB value is copied nowhere."""
    started = [MemcachedServer(max_item="2m").start(), MemcachedServer().start(), MemcachedServer().start()]
    yield [ServerAddress(*s.address) for s in started]
    for server in started:
        server.stop()


@pytest.fixture
def replicator(trio):
    for address in trio:
        tcp_client(address).flush_all()
    made = Replicator(trio, timeout=2.0, depth=3)  # 3 per round trip: the 10 keys below take four
    yield made
    made.close()


def items(count: int) -> dict[bytes, StoredItem]:
    return {b"pipe:%d" % i: StoredItem(b"value-%d-" % i * (i + 1), i, -1 if i % 2 else 3600 + i, 0)
            for i in range(count)}


def test_every_key_is_copied_with_its_value_flags_and_ttl(trio, replicator):
    wanted = items(10)
    assert replicator.write_many([(k, item, [1, 2]) for k, item in wanted.items()]) == {}
    for server in (1, 2):
        client = MetaClient(trio[server])
        held = client.get_many(list(wanted))
        for (key, item), copy in zip(wanted.items(), held):
            assert (copy.value, copy.flags) == (item.value, item.flags), key
            assert (copy.ttl == -1) if item.ttl == -1 else 3590 <= copy.ttl <= item.ttl, key
    assert replicator.copies == 20 and replicator.failures == 0
    assert all(replicator.copy_cas[(k, s)] > 0 for k in wanted for s in (1, 2))  # later updates are conditional


def test_a_copy_adopted_from_before_is_updated_only_while_it_is_the_copy_found(trio, replicator):
    """A copy made before this replicator (adoption: by the controller before) is updated as one written here: only
    over the copy found, so a write that landed there since is not overwritten."""
    found = MetaClient(trio[1]).set(b"pipe:found", StoredItem(b"v1", 0, -1, 0))
    replicator.adopt_copy(b"pipe:found", 1, found)
    assert replicator.write(b"pipe:found", StoredItem(b"v2", 0, -1, 0), [1], update=True) == {}
    assert MetaClient(trio[1]).get(b"pipe:found").value == b"v2"
    replicator.adopt_copy(b"pipe:found", 1, found)  # not the copy there now (v2's)
    assert set(replicator.write(b"pipe:found", StoredItem(b"v3", 0, -1, 0), [1], update=True)) == {1}
    assert MetaClient(trio[1]).get(b"pipe:found").value == b"v2"


def test_a_copy_that_fails_is_that_keys_alone(trio, replicator):
    wanted = items(6)
    big = StoredItem(b"x" * 1_500_000, 0, -1, 0)  # over the replicas' item size: memcached refuses that one
    copies = [(k, item, [1, 2]) for k, item in wanted.items()]
    copies.insert(3, (b"pipe:big", big, [1, 2]))
    copies.insert(5, (b"bad key", wanted[b"pipe:0"], [1]))  # not a key: never sent
    failed = replicator.write_many(copies)
    assert set(failed) == {b"pipe:big", b"bad key"} and set(failed[b"pipe:big"]) == {1, 2}
    assert "too large" in failed[b"pipe:big"][1] and list(failed[b"bad key"]) == [1]
    for server in (1, 2):
        assert [c.value for c in MetaClient(trio[server]).get_many(list(wanted))] == [i.value for i in wanted.values()]


def test_an_update_refused_for_one_key_leaves_the_others_updated(trio, replicator):
    wanted = items(5)
    assert replicator.write_many([(k, item, [1]) for k, item in wanted.items()]) == {}
    MetaClient(trio[1]).set(b"pipe:2", StoredItem(b"refilled meanwhile", 0, -1, 0))  # its CAS moved
    newer = {k: StoredItem(b"newer " + item.value, item.flags, -1, 0) for k, item in wanted.items()}
    failed = replicator.write_many([(k, item, [1]) for k, item in newer.items()], update=True)
    assert list(failed) == [b"pipe:2"] and "not the one expected" in failed[b"pipe:2"][1]
    held = dict(zip(newer, MetaClient(trio[1]).get_many(list(newer))))
    assert {k: c.value for k, c in held.items()} == {**{k: i.value for k, i in newer.items()},
                                                     b"pipe:2": b"refilled meanwhile"}


def test_reads_and_deletes_in_one_go_report_each_key(trio, replicator):
    wanted = items(4)
    for key, item in wanted.items():
        MetaClient(trio[0]).set(key, item)
    found = replicator.read_many([(k, 0) for k in wanted] + [(b"pipe:missing", 0), (b"bad key", 0)])
    assert {k: found[k].value for k in wanted} == {k: i.value for k, i in wanted.items()}
    assert found[b"pipe:missing"] is None and isinstance(found[b"bad key"], MetaError)
    assert replicator.delete_many([(k, [0]) for k in wanted] + [(b"bad key", [0])]).keys() == {b"bad key"}
    assert MetaClient(trio[0]).get_many(list(wanted)) == [None] * 4


def test_a_server_gone_fails_every_key_sent_to_it_and_no_other():
    home, gone = MemcachedServer().start(), MemcachedServer().start()
    replicator = Replicator([ServerAddress(*home.address), ServerAddress(*gone.address)], timeout=1.0, depth=2)
    try:
        wanted = items(5)
        assert replicator.write_many([(k, i, [1]) for k, i in wanted.items()]) == {}
        gone.stop()
        failed = replicator.write_many([(k, i, [0, 1]) for k, i in wanted.items()])
        assert set(failed) == set(wanted) and all(set(f) == {1} for f in failed.values())
        assert [c.value for c in MetaClient(ServerAddress(*home.address)).get_many(list(wanted))] == \
            [i.value for i in wanted.values()]
    finally:
        replicator.close()
        home.stop()


def test_a_pipelined_batch_is_one_exchange_not_one_per_key(trio):
    """What makes a change a few round trips: a whole batch is written before any reply is read."""
    client, sent = MetaClient(trio[1]), []
    real = client._connected

    def counting():
        sock = real()
        return Counting(sock, sent)
    client._connected = counting
    assert all(isinstance(cas, int) for cas in client.set_many([(k, i, None) for k, i in items(8).items()]))
    assert len(sent) == 1


class Counting:
    """A socket that counts what is sent through it."""

    def __init__(self, sock, sent):
        self.sock, self.sent = sock, sent

    def sendall(self, data):
        self.sent.append(len(data))
        return self.sock.sendall(data)

    def __getattr__(self, name):
        return getattr(self.sock, name)


# --- the core: a change of many keys, copies pipelined --------------------------------------------------------------
def test_a_hot_set_change_copies_every_key_and_reports_a_failed_copy_for_its_key_only(trio):
    config = parse_config({"servers": [{"name": f"s{i}", "ip": a.host, "mac": f"02:00:00:00:00:0{i + 1}",
                                        "port": a.port} for i, a in enumerate(trio)],
                           "balancing": {"hot": 12, "hysteresis": 1, "mode": "equal"},
                           "controller": {"copy_depth": 4}})
    core = ControllerCore(config, RecordingDriver(), probe_health=False).start()
    try:
        keys = [k for k in (b"change:%d" % i for i in range(200)) if core.key_hash.server_of(k) == 0][:12]
        values = {k: b"v-%s" % k for k in keys}
        values[keys[5]] = b"y" * 1_500_000  # stored at its home, too large for the replicas
        for key, value in values.items():
            MetaClient(trio[0]).set(key, StoredItem(value, 9, -1, 0))
        core.submit_report({"time": time.time(), "interval": 1.0, "rate": 10_000.0,
                            "top": [{"key": k.decode(), "rate": 1000.0 - i} for i, k in enumerate(keys)]})
        assert core.wait_idle(30)
        warmed = {d["key"]: d["reason"] for d in core.decisions_made() if d["action"] == "warm"}
        skipped = {d["key"]: d["reason"] for d in core.decisions_made() if d["action"] == "skip"}
        assert set(warmed) == {k.decode() for k in keys if k != keys[5]}
        assert "no replica took the copy" in skipped[keys[5].decode()] and "too large" in skipped[keys[5].decode()]
        for server in (1, 2):
            held = MetaClient(trio[server]).get_many(keys)
            assert {k: (c.value, c.flags) for k, c in zip(keys, held) if c is not None} == \
                {k: (values[k], 9) for k in keys if k != keys[5]}
        assert not any(core.driver.dirty(k) for k in keys if k != keys[5])
        assert core.state()["counters"]["settled_alone"] == {}
    finally:
        core.stop()


# --- limits -----------------------------------------------------------------------------------------------------------
def test_each_programs_hot_key_slots_are_the_controllers():
    from dataplanes.p4.pipeline import MAX_HOT as P4_MAX_HOT
    from dataplanes.pipeline import MAX_HOT
    ebpf = re.search(r"#define MB_MAX_HOT (\d+)", (REPO / "dataplanes/bpf/src/structs.h").read_text())
    p4 = re.search(r"#define MB_MAX_HOT (\d+)", (REPO / "p4src/headers.p4").read_text())
    assert int(ebpf.group(1)) == MAX_HOT >= 10_000 and int(p4.group(1)) == P4_MAX_HOT
    assert SimulatedFabric(1).book.max_hot == MAX_HOT


def test_a_key_range_shards_new_controller_reads_back_its_own_range_and_no_other():
    """The simulated sharding of docs/scale.md: two controllers' fabrics over the same switches, each in its range
    of slots; the first's successor reads back the first's keys (dataplanes/read_back.py) and sees none of the
    second's, whose entries and lease stay as they were."""
    tables = [MemoryTables() for _ in range(3)]
    shards = [range(0, 100), range(100, 200)]
    first, second = (SimulatedFabric(3, width=3, tables=tables, slots=slots) for slots in shards)
    for driver, keys in ((first, [b"a1", b"a2"]), (second, [b"b1", b"b2"])):
        assert driver.attach(SERVERS, lambda frame: None) == []
        assert driver.install_hot_keys([HotKeyInstall(k, 0, EVEN) for k in keys]) == {}
        assert driver.clear_dirty_keys(driver.write_stamps(keys)) == {}
        driver.renew_lease(60)
    assert {first.book.slots[b"a1"], first.book.slots[b"a2"]} <= set(shards[0])
    before = [{k: (e, t.synced[e.slot]) for k, e in t.hot.items()} for t in tables]
    first.let_go()  # killed: its lease left to run out; the other shard's is its own
    assert all(t.shard_leases[0] > 0 and t.shard_leases[100] > 0 for t in tables)
    successor = SimulatedFabric(3, width=3, tables=tables, slots=shards[0])
    found = successor.attach(SERVERS, lambda frame: None)
    try:
        assert sorted(k.key for k in found) == [b"a1", b"a2"] and all(k.distrust is None for k in found)
        assert all(k.synced is not None for k in found)  # clean as the first left them
        assert [{k: (e, t.synced[e.slot]) for k, e in t.hot.items()} for t in tables] == before  # nothing rewritten
        assert successor.book.slots == first.book.slots
        first.close()  # (the first's own book, gone with it)
    finally:
        successor.close()
        second.close()
    assert all(t.shard_leases[0] == 0 and t.shard_leases[100] == 0 for t in tables)
