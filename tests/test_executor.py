"""The executor's retries on a fake clock: a failing delete is retried with a doubling back-off (capped), then given up
after the retry limit with one decision that says so; a retry of a key that cooled meanwhile does nothing. The
server is a closed port on 127.0.0.1 (a real connection refusal), the driver the registry's recording one."""
from __future__ import annotations

import pytest

from controller.execution import Executor
from controller.replicator import Replicator
from controller.retries import BACKOFF_FIRST, BACKOFF_MAX, KEY_LEVEL, RETRY_LIMIT, RetryKind, RetryScheduler
from dataplanes import registry
from mbalancer.memcache.addresses import ServerAddress
from mbalancer.memcache.server import free_port


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def executor():
    clock, decisions = FakeClock(), []
    unreachable = ServerAddress("127.0.0.1", free_port())  # nothing listens there
    replicator = Replicator([unreachable], timeout=0.2)
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
    executor._schedule(RetryKind.DELETE, b"gone", 0, "connection refused")  # what cool() does when a delete fails
    waits = run_until_given_up(executor)
    expected = [min(BACKOFF_FIRST * 2 ** n, BACKOFF_MAX) for n in range(RETRY_LIMIT)]
    assert waits == pytest.approx(expected)
    assert executor.next_due() is None and executor.pending_retries() == []
    give_ups = [d for d in executor.test_decisions if d[0] == "give-up"]
    assert len(give_ups) == 1 and give_ups[0][1] == b"gone"
    assert f"delete on server 0 failed {RETRY_LIMIT} times" in give_ups[0][2]


def test_a_retry_is_not_run_before_it_is_due(executor):
    executor._schedule(RetryKind.DELETE, b"gone", 0, "connection refused")
    executor.test_clock.now += BACKOFF_FIRST / 2
    executor.run_due()
    assert [r.attempt for r in executor.pending_retries()] == [0]  # untouched: not due yet


def test_a_retry_for_a_key_that_cooled_meanwhile_does_nothing(executor):
    executor._schedule(RetryKind.SETTLE, b"cooled", KEY_LEVEL, "not cleared")
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


def test_a_hot_keys_state_follows_its_record():
    from controller.hot_keys import HotKey, HotKeyState
    from controller.planner import Placement
    hot = HotKey(Placement.__new__(Placement), {0}, None, None, 0.0)
    assert hot.state is HotKeyState.DIRTY  # as installed: gets go home
    hot.dirty = False
    assert hot.state is HotKeyState.CLEAN
    hot.installed = False
    assert hot.state is HotKeyState.NOT_INSTALLED


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
