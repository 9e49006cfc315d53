"""The driver interface's calls are listed once (dataplanes/driver.py CALLS, HOT_KEY_CALLS), and every forward of
them is derived from that list: the slot book driver's to its book, ForwardedDriver's to a driver elsewhere (the
driver process, the switch agent), and what a far side takes. A call added to the interface but not to the list, or
a forward written out by hand, fails here."""
from __future__ import annotations

import inspect
from types import MappingProxyType
from typing import Any

import pytest

from dataplanes.driver import CALLS, HOT_KEY_CALLS, KEYED_CALLS, ONE_KEY_CALLS, Driver, DriverError, ReplicaWeight
from dataplanes.forwarded_driver import ANSWERED, ForwardedDriver, answer
from dataplanes.recording.driver import RecordingDriver
from dataplanes.slot_book import SlotBook
from dataplanes.slot_book_driver import SlotBookDriver
from mbalancer.settings import Server

SERVERS = [Server(f"s{i}", f"10.0.0.{i + 1}", f"02:00:00:00:00:0{i + 1}", 11211) for i in range(2)]


def test_the_list_names_every_call_of_the_interface_once():
    declared = {name for name, value in vars(Driver).items() if callable(value) and not name.startswith("_")}
    assert sorted(declared - {"attach", "close", "let_go"}) == sorted(CALLS)
    assert len(set(CALLS)) == len(CALLS) and set(HOT_KEY_CALLS) <= set(CALLS)
    assert set(ONE_KEY_CALLS) | set(ONE_KEY_CALLS.values()) | KEYED_CALLS <= set(HOT_KEY_CALLS)


def test_the_slot_book_answers_every_hot_key_call():
    assert [call for call in HOT_KEY_CALLS if not callable(getattr(SlotBook, call, None))] == []


@pytest.mark.parametrize("cls, calls", [(SlotBookDriver, HOT_KEY_CALLS), (ForwardedDriver, CALLS)])
def test_every_forward_is_derived_from_the_list_with_the_interfaces_signature(cls, calls):
    for call in calls:
        method = vars(cls)[call]
        assert method.__wrapped__ is getattr(Driver, call), f"{cls.__name__}.{call} is written out by hand"
        assert inspect.signature(method) == inspect.signature(getattr(Driver, call))
    assert not inspect.isabstract(RecordingDriver)
    assert ANSWERED == {"attach", "close", *CALLS}


class Sent(ForwardedDriver):
    """A forwarded driver whose calls are kept, not sent."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, tuple]] = []

    def _call(self, method: str, args: tuple) -> Any:
        self.sent.append((method, args))


def test_a_forward_sends_the_arguments_in_the_interfaces_order_as_plain_values():
    driver = Sent()
    replicas = [ReplicaWeight(0, 0.5), ReplicaWeight(1, 0.5)]
    driver.set_weights(replicas=replicas, key=b"k")
    driver.remove_hot_keys([b"a", b"b"])
    driver.clear_dirty_keys(MappingProxyType({b"a": None}))
    assert driver.sent == [("set_weights", (b"k", tuple(replicas))), ("remove_hot_keys", ((b"a", b"b"),)),
                           ("clear_dirty_keys", ({b"a": None},))]
    with pytest.raises(TypeError):
        driver.set_dirty(b"k", b"extra")  # the interface's signature holds


def test_a_far_side_answers_every_listed_call_and_refuses_any_other():
    driver = RecordingDriver()
    assert answer(driver, "attach", (tuple(SERVERS),), lambda frame: None, lambda: None) == []
    assert answer(driver, "install_hot_key", (b"k", 0, (ReplicaWeight(0, 1.0),)), None, None) is None
    assert answer(driver, "write_stamps", ((b"k",),), None, None)[b"k"].writes == 0
    assert answer(driver, "switch_counters", (), None, None)[0]["packets"] == 0
    with pytest.raises(DriverError, match="no driver call '_open'"):
        answer(driver, "_open", (), None, None)
    driver.close()
