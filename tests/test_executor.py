"""The executor's retries on a fake clock: a failing delete is retried with a doubling back-off (capped), then given up
after the retry limit with one decision that says so; a retry of a key that cooled meanwhile does nothing. The
server is a closed port on 127.0.0.1 (a real connection refusal), the driver the registry's recording one."""
from __future__ import annotations

import pytest

from controller.execution import BACKOFF_FIRST, BACKOFF_MAX, KEY_LEVEL, RETRY_LIMIT, Executor
from controller.replicator import Replicator
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
    executor._schedule("delete", b"gone", 0, "connection refused")  # what cool() does when a delete fails
    waits = run_until_given_up(executor)
    expected = [min(BACKOFF_FIRST * 2 ** n, BACKOFF_MAX) for n in range(RETRY_LIMIT)]
    assert waits == pytest.approx(expected)
    assert executor.next_due() is None and executor.pending_retries() == []
    give_ups = [d for d in executor.test_decisions if d[0] == "give-up"]
    assert len(give_ups) == 1 and give_ups[0][1] == b"gone"
    assert f"delete on server 0 failed {RETRY_LIMIT} times" in give_ups[0][2]


def test_a_retry_is_not_run_before_it_is_due(executor):
    executor._schedule("delete", b"gone", 0, "connection refused")
    executor.test_clock.now += BACKOFF_FIRST / 2
    executor.run_due()
    assert [r.attempt for r in executor.pending_retries()] == [0]  # untouched: not due yet


def test_a_retry_for_a_key_that_cooled_meanwhile_does_nothing(executor):
    executor._schedule("settle", b"cooled", KEY_LEVEL, "not cleared")
    executor.test_clock.now += BACKOFF_FIRST
    executor.run_due()
    assert executor.pending_retries() == [] and executor.test_decisions == []
    assert executor.driver.read_counters().keys == {}  # nothing was written to the switch
