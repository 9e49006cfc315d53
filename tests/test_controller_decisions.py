"""The controller's decisions, driven directly (no I/O): hysteresis, groups, replicas, weights, auto H, reports."""
from __future__ import annotations

import numpy as np
import pytest

from controller.hysteresis import HotKeyTracker
from controller.load import estimate_loads, imbalance_factor
from controller.placement import replica_weights, replicas_of, server_groups
from controller.planner import Placement, Planner
from mbalancer.monitor_report import MonitorReport, ReportError, parse_report
from mbalancer.config import Balancing


def report(rates: dict[str, float], total: float | None = None, time: float = 0.0) -> MonitorReport:
    raw = {"time": time, "interval": 1.0, "rate": total if total is not None else sum(rates.values()),
           "top": [{"key": k, "rate": r} for k, r in rates.items()]}
    return parse_report(raw)


def homes(mapping: dict[str, int]):
    return lambda key: mapping[key.decode()]


def installed_after(planner: Planner, installed: dict, rep: MonitorReport, down=()) -> tuple[dict, list]:
    """Apply a plan the way the core would if every copy succeeded."""
    plan = planner.plan(rep, installed, down)
    installed = dict(installed)
    for change in plan.changes:
        if change.action == "cool":
            del installed[change.key]
        else:
            installed[change.key] = change.placement
    return installed, list(plan.changes)


# --- hysteresis ---------------------------------------------------------------------------------------------
def test_a_key_warms_only_after_n_reports_in_a_row():
    tracker = HotKeyTracker(3)
    assert tracker.update([b"a"], []) == ([], [])
    assert tracker.update([b"a"], []) == ([], [])
    assert tracker.update([b"a"], []) == ([b"a"], [])


def test_a_break_in_the_streak_starts_it_again():
    tracker = HotKeyTracker(2)
    tracker.update([b"a"], [])
    tracker.update([], [])
    assert tracker.update([b"a"], []) == ([], [])
    assert tracker.update([b"a"], []) == ([b"a"], [])


def test_a_hot_key_cools_only_after_n_reports_out():
    tracker = HotKeyTracker(2)
    assert tracker.update([], [b"a"]) == ([], [])
    assert tracker.update([b"a"], [b"a"]) == ([], [])  # back in: the count restarts
    assert tracker.update([], [b"a"]) == ([], [])
    assert tracker.update([], [b"a"]) == ([], [b"a"])


def test_a_key_at_the_edge_of_the_top_h_does_not_flap():
    planner = Planner(Balancing(hot=2, hysteresis=2), 2, homes({"a": 0, "b": 1, "c": 0}))
    installed: dict = {}
    flips = 0
    for i in range(20):
        edge = {"b": 50.0} if i % 2 else {"c": 50.0}  # b and c take turns at rank 2
        installed, changes = installed_after(planner, installed, report({"a": 100.0, **edge}, 1000))
        flips += sum(c.key != b"a" for c in changes if c.action in ("warm", "cool"))
    assert set(installed) == {b"a"} and flips == 0


# --- the plan -----------------------------------------------------------------------------------------------
def test_the_top_h_keys_become_hot_with_reasons_and_no_more_than_h():
    planner = Planner(Balancing(hot=2, hysteresis=1), 2, homes({"a": 0, "b": 1, "c": 0}))
    plan = planner.plan(report({"a": 300.0, "b": 200.0, "c": 100.0}, 1000), {})
    assert [(c.action, c.key) for c in plan.changes] == [("warm", b"a"), ("warm", b"b")]
    assert "top 2" in plan.changes[0].reason and "300 gets/s" in plan.changes[0].reason
    assert plan.imbalance_predicted > plan.imbalance_now


def test_a_cooled_key_makes_room_for_a_new_one_in_the_same_report():
    planner = Planner(Balancing(hot=1, hysteresis=1), 2, homes({"a": 0, "b": 1}))
    installed, _ = installed_after(planner, {}, report({"a": 300.0}, 1000))
    installed, changes = installed_after(planner, installed, report({"b": 300.0, "a": 10.0}, 1000))
    assert [(c.action, c.key) for c in changes] == [("cool", b"a"), ("warm", b"b")]
    assert set(installed) == {b"b"}


def test_the_home_is_always_a_replica_even_outside_its_group():
    planner = Planner(Balancing(hot=1, hysteresis=1, groups=2), 4, homes({"a": 3}))
    # Load servers 2 and 3 (group 1) so the least loaded group is group 0, which does not hold the home.
    plan = planner.plan(report({"a": 100.0}, 100), {})
    placement = plan.changes[0].placement
    assert placement.group == 0 and placement.replicas == (0, 1, 3)
    assert sum(placement.weights) == pytest.approx(1) and placement.weights == pytest.approx((1 / 3,) * 3)


def test_new_hot_keys_go_to_the_least_loaded_group():
    # Four servers in two groups; cold keys put 80 gets/s on group 1 (servers 2, 3), nothing on group 0.
    mapping = {"a": 0, "b": 1, "cold2": 2, "cold3": 3}
    planner = Planner(Balancing(hot=2, hysteresis=1, groups=2), 4, homes(mapping))
    plan = planner.plan(report({"a": 100.0, "b": 90.0, "cold2": 40.0, "cold3": 40.0}, 270), {})
    placements = {c.key: c.placement for c in plan.changes}
    assert placements[b"a"].group == 0  # 0 < 80
    assert placements[b"b"].group == 1  # group 0 now carries a's 100 > 80
    assert placements[b"b"].replicas == (1, 2, 3)  # its home (1) joins group 1


def test_weighted_mode_pours_the_hot_load_onto_the_least_loaded_replicas():
    mapping = {"a": 0, "cold1": 1, "cold2": 2}
    planner = Planner(Balancing(hot=1, hysteresis=1, mode="weighted"), 3, homes(mapping))
    plan = planner.plan(report({"a": 90.0, "cold1": 60.0, "cold2": 0.0}, 150), {})
    p = plan.changes[0].placement
    weights = dict(zip(p.replicas, p.weights))
    # base loads 0, 60, 0: water level 45 -> 45 on server 0 and 2, none on the busy server 1
    assert weights == pytest.approx({0: 0.5, 1: 0.0, 2: 0.5})
    assert plan.imbalance_predicted == pytest.approx(50 / 60)


def test_equal_mode_gives_each_replica_the_same_share():
    planner = Planner(Balancing(hot=1, hysteresis=1), 3, homes({"a": 0, "cold1": 1}))
    p = planner.plan(report({"a": 90.0, "cold1": 60.0}, 150), {}).changes[0].placement
    assert p.weights == pytest.approx((1 / 3,) * 3)


def test_a_down_server_loses_its_weight_and_gets_it_back_when_up():
    planner = Planner(Balancing(hot=1, hysteresis=1), 3, homes({"a": 0}))
    installed, _ = installed_after(planner, {}, report({"a": 90.0}, 90))
    installed, changes = installed_after(planner, installed, report({"a": 90.0}, 90), down={2})
    assert [c.action for c in changes] == ["reweight"] and "server 2 out" in changes[0].reason
    assert installed[b"a"].weights == pytest.approx((0.5, 0.5, 0.0))
    installed, changes = installed_after(planner, installed, report({"a": 90.0}, 90))
    assert "server 2 back in" in changes[0].reason and installed[b"a"].weights == pytest.approx((1 / 3,) * 3)


def test_a_new_key_is_not_balanced_when_only_its_home_is_up():
    planner = Planner(Balancing(hot=1, hysteresis=1), 2, homes({"a": 0}))
    assert planner.plan(report({"a": 90.0}, 90), {}, down={1}).changes == ()


def test_small_weight_moves_are_not_written():
    mapping = {"a": 0, "cold1": 1}
    planner = Planner(Balancing(hot=1, hysteresis=1, mode="weighted"), 2, homes(mapping))
    installed, _ = installed_after(planner, {}, report({"a": 100.0, "cold1": 50.0}, 150))
    _, changes = installed_after(planner, installed, report({"a": 100.0, "cold1": 52.0}, 152))
    assert changes == []
    _, changes = installed_after(planner, installed, report({"a": 100.0, "cold1": 80.0}, 180))
    assert [c.action for c in changes] == ["reweight"] and "moved the weights" in changes[0].reason


def test_auto_h_takes_the_fewest_keys_that_reach_the_target():
    # Ten keys all homed on server 0 of 2; each hot key balanced halves its load on server 0.
    mapping = {f"k{i}": 0 for i in range(10)}
    rates = {f"k{i}": 100.0 - 5 * i for i in range(10)}
    total = sum(rates.values())
    planner = Planner(Balancing(hot=None, target=0.9, hysteresis=1), 2, homes(mapping))
    plan = planner.plan(report(rates, total), {})
    h = plan.hot_target
    assert plan.imbalance_predicted >= 0.9
    fewer = Planner(Balancing(hot=h - 1, hysteresis=1), 2, homes(mapping)).plan(report(rates, total), {})
    assert fewer.imbalance_predicted < 0.9
    assert len(plan.changes) == h


# --- load estimate, placement helpers -----------------------------------------------------------------------
def test_loads_put_top_keys_at_home_or_spread_and_the_rest_evenly():
    rep = report({"a": 60.0, "b": 20.0}, 100)
    loads = estimate_loads(rep, 2, homes({"a": 0, "b": 1}), {b"a": ((0, 0.5), (1, 0.5))})
    assert loads == pytest.approx([10 + 30, 10 + 30 + 20])
    assert imbalance_factor(np.zeros(3)) == 1.0


def test_groups_replicas_and_weights_helpers():
    assert server_groups(6, 3) == [(0, 1), (2, 3), (4, 5)]
    with pytest.raises(ValueError):
        server_groups(5, 2)
    assert replicas_of(4, (0, 1)) == (0, 1, 4)
    assert replica_weights("equal", (0, 1, 2), np.zeros(3), 10, usable=[True, False, True]) == (0.5, 0.0, 0.5)
    with pytest.raises(ValueError):
        replica_weights("equal", (0,), np.zeros(1), 1, usable=[False])


# --- reports ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("raw, field", [
    ([], "report"),
    ({"time": 0, "interval": 0, "rate": 1, "top": []}, "interval"),
    ({"time": 0, "interval": 1, "rate": "x", "top": []}, "rate"),
    ({"time": 0, "interval": 1, "rate": 1}, "top"),
    ({"time": 0, "interval": 1, "rate": 1, "top": [{"key": "a b", "rate": 1}]}, "top[0].key"),
    ({"time": 0, "interval": 1, "rate": 1, "top": [{"key": "k" * 251, "rate": 1}]}, "top[0].key"),
    ({"time": 0, "interval": 1, "rate": 1, "top": [{"key": "a", "rate": float("nan")}]}, "top[0].rate"),
    ({"time": 0, "interval": 1, "rate": 1, "top": [{"rate": 1}]}, "top[0]"),
    ({"time": 0, "interval": 1, "rate": 1, "top": [], "kernel_dropped": -1}, "kernel_dropped"),
])
def test_a_bad_report_is_refused_naming_the_field(raw, field):
    with pytest.raises(ReportError, match=f"^{field.replace('[', '.').replace(']', '.')}"):
        parse_report(raw)


def test_report_keys_round_trip_any_bytes_through_json():
    import json

    from mbalancer.memcache.keys import key_to_text
    key = b"caf\xc3\xa9:\xff\x80"
    raw = json.loads(json.dumps({"time": 0, "interval": 1, "rate": 5,
                                 "top": [{"key": key_to_text(key), "rate": 5}]}))
    assert parse_report(raw).top[0].key == key


def test_placement_gives_driver_weights():
    p = Placement(b"a", 0, 0, (0, 1), (0.25, 0.75))
    assert [(r.server, r.weight) for r in p.replica_weights()] == [(0, 0.25), (1, 0.75)]
