"""The executor's transitions on a fake clock, with no socket: the registry's recording driver (the slot book over an
in-memory switch) as the data plane, and in-memory memcached servers (mbalancer/memcache/memory.py, held to the real
one by tests/test_memcache_memory.py) on the same clock. Opening a socket fails the test.

Retries, against an address where no server listens (a connection refusal): a failing delete is retried with a
doubling back-off (capped), then given up after the retry limit with one decision that says so; a retry of a key that
cooled meanwhile does nothing. Then against two servers (home 0, replica 1): polling finds a write no switch
saw and syncs it, only when due (and when busy, only once a whole interval late); a same-value write at the home is
adopted, not synced; writes that land during every sync round leave the key dirty and retried; a key whose weights
and hold are both refused loses its rules and is reinstalled; a refused install backs off doubling; a switch that
came back empty gets every key again; copies of counted writes that never come are declared lost."""
from __future__ import annotations

import socket

import pytest

from controller.coherence import MIRRORS_LOST_AFTER, SYNC_ROUNDS, UNREADABLE_WAIT
from controller.execution import COPY_LINGER, REFUSED_BACKOFF_MAX, Executor
from controller.hot_keys import HotKeyState
from controller.planner import Change, ChangeAction, ChangeCause, Placement
from controller.replicator import Replicator
from controller.retries import BACKOFF_FIRST, BACKOFF_MAX, KEY_LEVEL, RETRY_LIMIT, RetryKind, RetryScheduler
from dataplanes import registry
from dataplanes.recording.driver import RecordingDriver
from mbalancer.memcache.addresses import ServerAddress
from mbalancer.memcache.memory import MemoryNetwork
from mbalancer.memcache.meta import MetaClient, StoredItem
from mbalancer.settings import Server

SERVERS = [ServerAddress("10.0.0.1", 11211), ServerAddress("10.0.0.2", 11211)]  # in memory: never dialled


@pytest.fixture(autouse=True)
def no_sockets(monkeypatch):
    """Every server and switch here is in memory: a socket opened is a test that reached for the network."""
    def refuse(*args, **kwargs):
        raise AssertionError("the executor's tests open no socket")
    monkeypatch.setattr(socket.socket, "__init__", refuse)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def executor():
    clock, decisions = FakeClock(), []
    replicator = Replicator([SERVERS[0]], timeout=0.2, connect=MemoryNetwork().connect)  # nothing listens there
    executor = Executor(registry.get("none").make_driver(), replicator,
                        lambda action, key, why: decisions.append((action, key, why)),
                        clock=clock, sleep=lambda seconds: None, poll_every=0)
    executor.test_clock, executor.test_decisions = clock, decisions
    return executor


def run_until_given_up(executor: Executor) -> list[float]:
    """Advance the fake clock to each retry's due time and run it; the waits between attempts."""
    waits = []
    for _ in range(RETRY_LIMIT + 2):  # bounded: the limit ends it sooner
        due = executor.next_due()
        if due is None:
            break
        waits.append(round(due - executor.test_clock.now, 6))
        executor.test_clock.now = due
        executor.run_due()
    return waits


def test_a_failing_delete_backs_off_doubling_then_gives_up_once(executor):
    executor.guard.schedule(RetryKind.DELETE, b"gone", 0, "connection refused")  # what cool() does when a delete fails
    waits = run_until_given_up(executor)
    expected = [min(BACKOFF_FIRST * 2 ** n, BACKOFF_MAX) for n in range(RETRY_LIMIT)]
    assert waits == pytest.approx(expected)
    assert executor.next_due() is None and executor.pending_retries() == []
    give_ups = [d for d in executor.test_decisions if d[0] == "give-up"]
    assert len(give_ups) == 1 and give_ups[0][1] == b"gone"
    assert f"delete on server 0 failed {RETRY_LIMIT} times" in give_ups[0][2]


def test_a_retry_is_not_run_before_it_is_due(executor):
    executor.guard.schedule(RetryKind.DELETE, b"gone", 0, "connection refused")
    executor.test_clock.now += BACKOFF_FIRST / 2
    executor.run_due()
    assert [r.attempt for r in executor.pending_retries()] == [0]  # untouched: not due yet


def test_a_retry_for_a_key_that_cooled_meanwhile_does_nothing(executor):
    executor.guard.schedule(RetryKind.SETTLE, b"cooled", KEY_LEVEL, "not cleared")
    executor.test_clock.now += BACKOFF_FIRST
    executor.run_due()
    assert executor.pending_retries() == [] and executor.test_decisions == []
    assert executor.driver.read_counters().keys == {}  # nothing was written to the switch


def test_the_scheduler_keeps_the_sooner_of_two_and_a_wait_keeps_its_attempt():
    clock = FakeClock()
    retries = RetryScheduler(clock)
    assert retries.schedule(RetryKind.REFILL, b"k", 1, "refused", attempt=3) is None  # due in 0.8 s
    retries.schedule(RetryKind.REFILL, b"k", 1, "refused", attempt=0)  # due in 0.1 s: replaces it
    retries.schedule(RetryKind.REFILL, b"k", 1, "refused", attempt=5)  # later: ignored
    [pending] = retries.all()
    assert (pending.attempt, pending.due) == (0, clock.now + BACKOFF_FIRST)
    retries.schedule(RetryKind.SETTLE, b"k", KEY_LEVEL, "on its way", attempt=2, delay=0.002)
    assert retries.pending(RetryKind.SETTLE, b"k") and [r.waiting for r in retries.all()] == [False, True]
    retries.cancel(b"k", RetryKind.SETTLE)
    retries.cancel_server(1, RetryKind.REFILL)
    assert retries.all() == [] and retries.next_due() is None
    assert retries.schedule(RetryKind.COOL, b"k", KEY_LEVEL, "refused", attempt=RETRY_LIMIT) == \
        f"cool on server {KEY_LEVEL} failed {RETRY_LIMIT} times: refused"


def test_take_due_hands_out_the_due_ones_soonest_first_once():
    clock = FakeClock()
    retries = RetryScheduler(clock)
    for server, attempt in ((1, 2), (2, 0), (3, 1)):
        retries.schedule(RetryKind.DELETE, b"k", server, "refused", attempt)
    clock.now += 2 * BACKOFF_FIRST  # attempts 0 and 1 are due, attempt 2 (0.4 s) is not
    assert [r.server for r in retries.take_due()] == [2, 3]
    assert [r.server for r in retries.take_due()] == [] and [r.server for r in retries.all()] == [1]


def test_a_hot_keys_flags_follow_its_state():
    from controller.hot_keys import HotKey
    from dataplanes.driver import WriteStamp
    hot = HotKey(Placement.__new__(Placement), {0}, None, None, 0.0)
    assert hot.state is HotKeyState.COPIED and not hot.installed and hot.dirty  # copied, not yet installed
    hot.move(HotKeyState.DIRTY)
    assert hot.installed and hot.dirty  # as installed: gets go home
    hot.move(HotKeyState.CLEAN, WriteStamp(0, ((0, 0),)))
    assert hot.installed and not hot.dirty
    hot.move(HotKeyState.NOT_INSTALLED)
    assert not hot.installed and hot.dirty


def test_a_copied_set_is_read_without_state():
    from controller.mirrors import read_mirror
    from experiments.workload.trace import tcp_frame, udp_frame
    from mbalancer.memcache.requests import build_set
    servers = {("10.0.0.1", 11211): 0, ("10.0.0.2", 11211): 1}
    mirror = read_mirror(udp_frame(build_set(b"k", b"v2"), dst="10.0.0.2"), servers, [11211, 11211])
    assert (mirror.server, mirror.counted_key, mirror.writes, mirror.whole, mirror.unreadable) == \
        (1, b"k", ((b"k", b"v2"),), True, None)
    elsewhere = read_mirror(udp_frame(build_set(b"k", b"v2"), dst="10.0.0.9"), servers, [11211, 11211])
    assert elsewhere.server is None and elsewhere.unreadable
    cut = read_mirror(tcp_frame(b"set k 0 0 10\r\nv2", dst="10.0.0.1"), servers, [11211, 11211])
    assert (cut.server, cut.counted_key, cut.whole) == (0, b"k", False)  # its value continues in a later segment


# --- against memcached servers (in memory) ----------------------------------------------------------------------
KEY = b"hot:executor"
POLL_EVERY = 0.5


class LandingWrites(Replicator):
    """A replicator with a writer beside it: while `landing` > 0, a new value lands at the home
    each time the executor reads the home's CAS (the worst timing a client's writes can have)."""

    def __init__(self, servers, **kwargs):
        super().__init__(servers, **kwargs)
        self.landing = 0
        self.landed = 0

    def versions_many(self, keys):  # a fresh key's settle reads every home's CAS at once
        for key, server in keys:
            self._land(server, key)
        return super().versions_many(keys)

    def _land(self, server, key):
        if self.landing > 0 and server == 0:
            self.landing -= 1
            self.landed += 1
            self.clients[0].set(key, StoredItem(b"v-landed-%d" % self.landed, 0, -1, 0))


class Batches(RecordingDriver):
    """The recording driver, keeping which keys each read of stamps and each clear was for."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[tuple[str, tuple[bytes, ...]]] = []

    def write_stamps(self, keys):
        self.batches.append(("write_stamps", tuple(keys)))
        return super().write_stamps(keys)

    def clear_dirty_keys(self, stamps):
        self.batches.append(("clear_dirty_keys", tuple(stamps)))
        return super().clear_dirty_keys(stamps)


@pytest.fixture
def live():
    """An executor over two servers, the recording driver attached, the key stored at its home (server 0)."""
    clock, decisions = FakeClock(), []
    network = MemoryNetwork(clock)
    for address in SERVERS:
        network.start(address)
    addresses = SERVERS
    MetaClient(addresses[0], connect=network.connect).set(KEY, StoredItem(b"v1", 7, -1, 0))
    driver = Batches()
    driver.attach([Server(f"s{i}", a.host, f"02:00:00:00:00:0{i + 1}", a.port) for i, a in enumerate(addresses)],
                  on_mirror=lambda frame: None)
    driver.renew_lease(3600)
    executor = Executor(driver, LandingWrites(addresses, timeout=1.0, connect=network.connect),
                        lambda action, key, why: decisions.append((action, key, why)),
                        clock=clock, sleep=clock.sleep, poll_every=POLL_EVERY)
    executor.test_clock, executor.test_decisions, executor.test_network = clock, decisions, network
    return executor


def warm(executor: Executor, weights=(0.5, 0.5), keys=(KEY,)) -> None:
    executor.apply(tuple(Change(ChangeAction.WARM, key, Placement(key, 0, 0, (0, 1), weights), ChangeCause.HOT, "test")
                         for key in keys))


def at(executor: Executor, server: int) -> StoredItem | None:
    return client(executor, server).get(KEY)


def client(executor: Executor, server: int) -> MetaClient:
    return MetaClient(SERVERS[server], connect=executor.test_network.connect)


def actions(executor: Executor) -> list[str]:
    return [a for a, _, _ in executor.test_decisions]


def calls(executor: Executor) -> list[str]:
    return [c.method for c in executor.driver.calls if c.key == KEY]


def run_retries(executor: Executor) -> None:
    """Advance the fake clock to each due retry and run it, until none is left (bounded)."""
    for _ in range(RETRY_LIMIT * 4):
        due = executor.next_due()
        if due is None:
            return
        executor.test_clock.now = max(executor.test_clock.now, due)
        executor.run_due()
    raise AssertionError(f"retries never ended: {executor.pending_retries()}")


def test_warm_copies_installs_dirty_then_clears(live):
    warm(live)
    assert at(live, 1).value == b"v1" and at(live, 1).flags == 7
    assert calls(live)[:2] == ["install_hot_key", "write_stamp"] and "clear_dirty" in calls(live)
    assert dict(live.hot_keys())[KEY].state is HotKeyState.CLEAN and not live.driver.dirty(KEY)


def cool(executor: Executor, keys=(KEY,)) -> None:
    executor.apply(tuple(Change(ChangeAction.COOL, key, None, ChangeCause.HOT, "test") for key in keys))


def test_a_cooled_keys_copies_stay_until_gets_balanced_before_its_rules_went_are_answered(live):
    """A get a switch balanced just before the rules went may wait in a busy replica's queue: deleted at once, its
    copy was gone when the get was read (a miss in a leaf-spine demo under load). The copies go COPY_LINGER later,
    every key's in one pipelined round; a warm before that keeps them."""
    keys = (KEY, b"hot:2")
    client(live, 0).set(keys[1], StoredItem(b"v", 0, -1, 0))
    warm(live, keys=keys)
    cool(live, keys=keys)
    assert not live.driver.table and at(live, 1).value == b"v1"  # rules gone, copies kept
    live.test_clock.now += COPY_LINGER / 2
    live.run_due()
    assert at(live, 1).value == b"v1"
    live.test_clock.now += COPY_LINGER / 2
    live.run_due()
    assert at(live, 1) is None and client(live, 1).get(keys[1]) is None and at(live, 0).value == b"v1"
    assert live.next_due() is None
    warm(live)
    cool(live)
    warm(live)  # hot again before its copies went: they stay, and no delete is left to take them later
    live.test_clock.now += 2 * COPY_LINGER
    live.run_due()
    assert at(live, 1).value == b"v1" and live.driver.table[KEY]


@pytest.mark.parametrize("written_again", [False, True])
def test_a_home_back_from_a_restart_gets_weight_again_and_is_never_written_or_deleted(live, written_again):
    """The home is refilled like a replica once it answers again, but the home is where copies come from: its
    "refill" deleted the key there when it came back empty, racing a client's write (memccapable's addq failed
    through the switch), and a client's write after the restart left it without weight for good (its CAS never
    matched the one the copies were made from)."""
    warm(live)
    live.server_down(0)
    client(live, 0).delete(KEY)  # back empty ...
    if written_again:
        client(live, 0).set(KEY, StoredItem(b"v-after", 0, -1, 0))  # ... and a client wrote the key again
    live.server_up(0)
    sent = []
    for name in ("write_many", "delete_many"):
        real = getattr(live.replicator, name)
        setattr(live.replicator, name, lambda batch, *a, _real=real, **k: sent.extend(batch) or _real(batch, *a, **k))
    run_retries(live)
    assert not [entry for entry in sent if 0 in entry[-1]], sent  # no write or delete to the home
    assert (at(live, 0).value if written_again else at(live, 0)) == (b"v-after" if written_again else None)
    assert {r.server: r.weight for r in live.driver.table[KEY].replicas}[0] > 0


def test_keys_installed_together_settle_in_one_read_of_stamps_and_one_clear(live):
    keys = (KEY, b"hot:2", b"hot:3")
    for key in keys[1:]:
        client(live, 0).set(key, StoredItem(b"v", 0, -1, 0))
    warm(live, keys=keys)
    assert live.driver.batches == [("write_stamps", keys), ("clear_dirty_keys", keys)]
    assert all(dict(live.hot_keys())[key].state is HotKeyState.CLEAN and not live.driver.dirty(key) for key in keys)


def test_a_key_whose_home_changed_goes_round_again_and_the_others_clear_together(live):
    """The same round for one key or many: the step of the key whose home changed pushes the home's item, the
    others are cleared in one call, and that key's next round is a batch of one."""
    keys = (KEY, b"hot:2", b"hot:3")
    for key in keys[1:]:
        client(live, 0).set(key, StoredItem(b"v", 0, -1, 0))
    live.replicator.landing = 1  # lands on the first key's home as its step reads it
    warm(live, keys=keys)
    assert live.driver.batches == [("write_stamps", keys), ("clear_dirty_keys", keys[1:]),
                                   ("write_stamps", keys[:1]), ("clear_dirty_keys", keys[:1])]
    assert at(live, 1).value == b"v-landed-1" and not any(live.driver.dirty(key) for key in keys)


def test_a_copied_write_settles_its_key_in_the_same_round(live):
    warm(live)
    live.driver.batches.clear()
    live.driver.count_write(KEY)  # the data plane counted the write and copied it
    live.count_mirror(KEY, 0)
    client(live, 0).set(KEY, StoredItem(b"v2", 7, -1, 0))
    live.sync_batch({KEY: (b"v2", live.test_clock.now)}, {})
    assert live.driver.batches == [("write_stamps", (KEY,)), ("clear_dirty_keys", (KEY,))]
    assert at(live, 1).value == b"v2" and not live.driver.dirty(KEY)


def test_a_mirrored_write_that_lands_late_at_its_home_leaves_no_old_copy_clean(live):
    """The copy came, but the write itself is held up on its way to the home (a busy OpenFlow switch under load):
    after SYNC_WAIT the key stays dirty (gets go home) and is settled once the write had time to land. It was
    cleared with the home's old item at once, and a get after the write's STORED read the old value at a replica."""
    warm(live)
    live.driver.count_write(KEY)
    live.count_mirror(KEY, 0)
    live.sync_batch({KEY: (b"v2", live.test_clock.now)}, {})  # not at the home yet
    assert live.driver.dirty(KEY) and dict(live.hot_keys())[KEY].state is HotKeyState.DIRTY
    client(live, 0).set(KEY, StoredItem(b"v2", 7, -1, 0))  # it lands
    run_retries(live)
    assert at(live, 1).value == b"v2" and not live.driver.dirty(KEY)


def test_a_mirrored_write_that_never_lands_leaves_its_key_dirty_only_for_a_while(live):
    """An add of an existing key, copied but refused at the home: the key is settled with the home's item."""
    warm(live)
    live.driver.count_write(KEY)
    live.count_mirror(KEY, 0)
    live.sync_batch({KEY: (b"refused", live.test_clock.now)}, {})
    assert live.driver.dirty(KEY)
    run_retries(live)
    assert at(live, 1).value == b"v1" and not live.driver.dirty(KEY)


def test_polling_finds_a_write_no_switch_saw_only_when_due(live):
    warm(live)
    client(live, 0).set(KEY, StoredItem(b"v2", 7, -1, 0))  # around the switch: no mirror
    live.poll()
    assert live.unseen_writes == 0 and at(live, 1).value == b"v1"  # not due yet
    live.test_clock.now = live.coherence.next_poll
    live.poll(idle=False)
    assert live.unseen_writes == 0  # busy: waits until a whole interval late
    live.test_clock.now = live.coherence.next_poll + POLL_EVERY
    live.poll(idle=False)
    assert live.unseen_writes == 1 and at(live, 1).value == b"v2"
    assert calls(live).index("set_dirty") < len(calls(live)) - 1 - calls(live)[::-1].index("clear_dirty")
    assert dict(live.hot_keys())[KEY].state is HotKeyState.CLEAN and not live.driver.dirty(KEY)
    assert any("without a write the switch saw" in why for _, _, why in live.test_decisions)


def test_a_same_value_write_at_home_is_adopted_not_synced(live):
    warm(live)
    before = dict(live.hot_keys())[KEY].synced_cas
    new_cas = client(live, 0).set(KEY, StoredItem(b"v1", 7, -1, 0))  # same value and flags
    live.test_clock.now = live.coherence.next_poll
    live.poll()
    assert new_cas != before and dict(live.hot_keys())[KEY].synced_cas == new_cas
    assert (live.cas_moves, live.unseen_writes) == (1, 0) and "set_dirty" not in calls(live)


def test_writes_landing_during_every_sync_round_leave_the_key_dirty_and_retried(live):
    live.replicator.landing = SYNC_ROUNDS
    warm(live)
    assert live.replicator.landed == SYNC_ROUNDS
    assert dict(live.hot_keys())[KEY].state is HotKeyState.DIRTY and live.driver.dirty(KEY)
    assert "clear_dirty" not in calls(live)
    assert [(r.action, r.last_error) for r in live.pending_retries()] == [
        (RetryKind.SETTLE, "writes kept landing during the sync")]
    assert "left dirty (written during the copy)" in live.test_decisions[-1][2]
    run_retries(live)  # the writer stopped: the retry settles it
    assert at(live, 1).value == b"v-landed-%d" % SYNC_ROUNDS and not live.driver.dirty(KEY)


def test_refused_weights_and_hold_remove_the_rules_then_reinstall_them(live):
    warm(live)
    live.driver.refuse("set_weights", KEY)
    live.driver.refuse("set_dirty", KEY)
    live.server_down(1)
    assert KEY not in live.driver.table and dict(live.hot_keys())[KEY].state is HotKeyState.NOT_INSTALLED
    assert {r.action for r in live.pending_retries()} == {RetryKind.INSTALL}
    run_retries(live)
    entry = live.driver.table[KEY]
    assert [(r.server, r.weight) for r in entry.replicas] == [(0, 1.0), (1, 0.0)]  # the replica is down
    assert dict(live.hot_keys())[KEY].state is HotKeyState.CLEAN and not live.driver.dirty(KEY)


def test_a_refused_install_backs_off_doubling_and_deletes_the_copies(live):
    live.driver.refuse("install_hot_key", KEY, times=3)
    waits = []
    for attempt in range(1, 4):
        warm(live)
        assert at(live, 1) is None and KEY not in dict(live.hot_keys())
        waits.append(live.refused[KEY].due - live.test_clock.now)
        installs = calls(live).count("install_hot_key")
        warm(live)  # before it is due: not tried, nothing copied
        assert calls(live).count("install_hot_key") == installs and at(live, 1) is None
        live.test_clock.now = live.refused[KEY].due
    assert waits == pytest.approx([min(BACKOFF_FIRST * 2 ** n, REFUSED_BACKOFF_MAX) for n in (1, 2, 3)])
    warm(live)
    assert dict(live.hot_keys())[KEY].state is HotKeyState.CLEAN and KEY not in live.refused


def test_a_switch_that_came_back_empty_gets_every_key_again(live):
    warm(live)
    live.driver.reconnect()  # the switch restarted empty
    live.replay()
    assert KEY in live.driver.table and not live.driver.dirty(KEY)
    assert calls(live).count("install_hot_key") == 2 and actions(live)[-1] == "replay"


def test_copies_of_counted_writes_that_never_come_are_declared_lost(live):
    warm(live)
    live.driver.count_write(KEY)  # the data plane counted a write whose copy never reaches the core
    hot = dict(live.hot_keys())[KEY]
    hot.move(HotKeyState.DIRTY)
    live.driver.set_dirty(KEY)
    assert live.coherence.settle([KEY]) == set()  # waits for the copy
    assert [r.action for r in live.pending_retries()] == [RetryKind.SETTLE]
    live.test_clock.now += MIRRORS_LOST_AFTER
    run_retries(live)
    assert live.mirrors_lost == 1 and not live.driver.dirty(KEY)
    assert any("never reached the controller" in why for _, _, why in live.test_decisions)


def test_a_home_is_read_only_once_its_latest_unreadable_request_had_time_to_land(live):
    """Two requests nobody could read, 3 ms apart: the check the first one scheduled comes 5 ms after it, only 2 ms
    after the second, which the home may not have applied yet; the key stays dirty until 5 ms after the second."""
    warm(live)
    live.driver.unsure(0, b"")
    live.sync_batch({}, {0: True})
    live.test_clock.now += 0.003
    live.driver.unsure(0, b"")
    live.sync_batch({}, {0: True})
    second = live.test_clock.now
    live.test_clock.now += UNREADABLE_WAIT - 0.003  # the first one's check is due
    live.run_due()
    assert live.driver.dirty(KEY) and dict(live.hot_keys())[KEY].dirty  # not read at its home yet
    run_retries(live)
    assert live.test_clock.now >= second + UNREADABLE_WAIT and not live.driver.dirty(KEY)
