"""The controller's decisions, driven directly (no I/O): hysteresis, groups, replicas, weights, auto H, reports."""
from __future__ import annotations

import numpy as np
import pytest

from controller.decisions import WARNED, Decision
from controller.hysteresis import HotKeyTracker
from controller.load import estimate_loads, imbalance_factor
from controller.placement import replica_weights, replicas_of, server_groups
from controller.planner import ChangeAction, ChangeCause, Placement, Planner
from controller.switch_counts import SwitchCounts
from dataplanes.driver import Counters, KeyCounters
from mbalancer.monitor_report import MonitorReport, ReportError, parse_report
from mbalancer.config import Balancing


def report(rates: dict[str, float], total: float | None = None, time: float = 0.0,
           servers: dict[str, float] | None = None, sent_to: dict[str, str] | None = None) -> MonitorReport:
    """servers: gets/s per destination, as the monitor measures them; sent_to: key -> destination of its gets."""
    raw = {"time": time, "interval": 1.0, "rate": total if total is not None else sum(rates.values()),
           "top": [{"key": k, "rate": r, **({"server": sent_to[k]} if sent_to and k in sent_to else {})}
                   for k, r in rates.items()]}
    if servers is not None:
        raw["servers"] = servers
    return parse_report(raw)


ADDRESSES = ["127.0.0.1:11211", "127.0.0.1:11212", "127.0.0.1:11213"]


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


def test_a_key_the_switch_has_not_counted_yet_is_not_cooled_on_a_report_alone():
    """Just installed or adopted, a key has no rate from the switch until its counters were read twice: a report
    that misses it then (the first one to a leader that just took over, seen under load on bmv2) keeps it, and the
    plan names it; once the switch has counted it, the report and the count decide as for any key."""
    planner = Planner(Balancing(hot=2, hysteresis=1), 2, homes({"a": 0, "b": 0, "c": 1}))
    installed, _ = installed_after(planner, {}, report({"a": 300.0, "b": 200.0}, 500))
    missed = report({"a": 300.0, "c": 10.0}, 600)  # b is not in it
    plan = planner.plan(missed, installed, switch_rates={b"a": 290.0}, recent={b"b"})
    assert not [c for c in plan.changes if c.action == "cool"] and plan.cools_awaiting_counts == (b"b",)
    plan = planner.plan(missed, installed, switch_rates={b"a": 290.0, b"b": 180.0}, recent={b"b"})
    assert not [c for c in plan.changes if c.action == "cool"] and plan.cools_awaiting_counts == ()  # counted: hot
    plan = planner.plan(missed, installed, switch_rates={b"a": 290.0, b"b": 0.0})
    assert [c.key for c in plan.changes if c.action == "cool"] == [b"b"] and plan.cools_awaiting_counts == ()


def test_a_cooled_key_makes_room_for_a_new_one_in_the_same_report():
    planner = Planner(Balancing(hot=1, hysteresis=1), 2, homes({"a": 0, "b": 1}))
    installed, _ = installed_after(planner, {}, report({"a": 300.0}, 1000))
    installed, changes = installed_after(planner, installed, report({"b": 300.0, "a": 10.0}, 1000))
    assert [(c.action, c.key) for c in changes] == [("cool", b"a"), ("warm", b"b")]
    assert set(installed) == {b"b"}


def test_an_empty_or_late_report_never_cools_a_key_the_switch_still_counts():
    """The switch's counters are the truth for installed keys: a report that misses them (empty, late, sampled)
    keeps them, in auto H too; once the switch counts no gets either, they cool, and the reason says both sources."""
    for balancing in (Balancing(hot=2, hysteresis=1), Balancing(hot=None, hysteresis=1, target=0.9)):
        planner = Planner(balancing, 2, homes({"a": 0, "b": 0, "c": 1}))
        installed, _ = installed_after(planner, {}, report({"a": 300.0, "b": 200.0, "c": 10.0}, 600))
        assert b"a" in installed, balancing
        for empty in (report({}, 0), report({"c": 10.0}, 600)):  # nothing seen; only a cold key seen
            plan = planner.plan(empty, installed, switch_rates={k: 250.0 for k in installed})
            assert [c for c in plan.changes if c.action == "cool"] == [], (balancing, plan.changes)
        plan = planner.plan(report({}, 0), installed, switch_rates={k: 0.0 for k in installed})
        cools = [c for c in plan.changes if c.action == "cool"]
        assert {c.key for c in cools} == set(installed), balancing
        assert "0 gets/s in the report, 0 counted by the switch" in cools[0].reason


def test_switch_counts_give_rates_and_totals_that_never_fall():
    """A key's counters start from zero when it is installed anew: its rate restarts, the running totals (what
    /metrics exports as counters) keep growing; the counters object a driver reuses is read, not kept."""
    counts = SwitchCounts()
    reused = KeyCounters(gets=100, home_while_dirty=10, mirrored=1)
    assert counts.update(Counters(keys={b"a": reused}), now=1.0) == {}  # a first read has no rate yet
    reused.gets, reused.mirrored = 300, 3
    assert counts.update(Counters(keys={b"a": reused}), now=2.0) == {b"a": 200.0}
    assert counts.snapshot.totals == {"gets": 300, "home_while_dirty": 10, "mirrored": 3}
    # cooled, then warmed again: counting from zero
    assert counts.update(Counters(keys={}), now=3.0) == {}
    assert counts.update(Counters(keys={b"a": KeyCounters(gets=50)}), now=4.0) == {}
    assert counts.snapshot.totals == {"gets": 350, "home_while_dirty": 10, "mirrored": 3}
    assert counts.update(Counters(keys={b"a": KeyCounters(gets=20)}), now=5.0) == {}  # a reset between two reads
    assert counts.snapshot.totals["gets"] == 370


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
    planner = Planner(Balancing(hot=1, hysteresis=1, mode="equal"), 3, homes({"a": 0, "cold1": 1}))
    p = planner.plan(report({"a": 90.0, "cold1": 60.0}, 150), {}).changes[0].placement
    assert p.weights == pytest.approx((1 / 3,) * 3)


def test_a_down_server_loses_its_weight_and_gets_it_back_when_up():
    planner = Planner(Balancing(hot=1, hysteresis=1), 3, homes({"a": 0}))
    installed, _ = installed_after(planner, {}, report({"a": 90.0}, 90))
    installed, changes = installed_after(planner, installed, report({"a": 90.0}, 90), down={2})
    assert [c.action for c in changes] == ["reweight"] and "server 2 out" in changes[0].reason
    assert changes[0].cause is ChangeCause.HEALTH
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
    assert changes[0].cause is ChangeCause.LOAD


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


# --- measured loads, learned homes, do no harm -------------------------------------------------------------
def test_measured_loads_replace_the_even_spread_of_cold_keys():
    # 100 cold gets/s that the estimate would spread 50/50 all went to server 1: the measure says so
    rep = report({"a": 60.0}, 160, servers={ADDRESSES[0]: 60.0, ADDRESSES[1]: 100.0})
    planner = Planner(Balancing(hot=1, hysteresis=1, mode="weighted"), 2, homes({"a": 0}), ADDRESSES[:2])
    plan = planner.plan(rep, {})
    assert plan.measured and plan.loads == pytest.approx((60.0, 100.0))
    weights = dict(zip(plan.changes[0].placement.replicas, plan.changes[0].placement.weights))
    assert weights == pytest.approx({0: 1.0, 1: 0.0})  # balancing onto the busier server would only hurt
    # ... while the estimate (no servers in the report) believed server 1 had room: 50 + 50
    blind = Planner(Balancing(hot=1, hysteresis=1, mode="weighted"), 2, homes({"a": 0})).plan(
        report({"a": 60.0}, 160), {})
    assert not blind.measured and blind.loads == pytest.approx((110.0, 50.0))


def test_balanced_keys_move_from_their_home_to_their_replicas_in_the_measured_loads():
    rep = report({"a": 80.0}, 120, servers={ADDRESSES[0]: 100.0, ADDRESSES[1]: 20.0})
    loads = estimate_loads(rep, 2, homes({"a": 0}), {b"a": ((0, 0.5), (1, 0.5))}, [100.0, 20.0])
    assert loads == pytest.approx([60.0, 60.0])


def test_a_key_s_home_is_where_the_clients_send_its_gets(caplog):
    # the configured hash says server 0; the clients (another hash) send "a" to server 2
    planner = Planner(Balancing(hot=1, hysteresis=1), 3, homes({"a": 0}), ADDRESSES)
    plan = planner.plan(report({"a": 90.0}, 90, sent_to={"a": ADDRESSES[2]}), {})
    assert plan.changes[0].placement.home == 2
    assert [key for key, _ in plan.home_notes] == [b"a"] and "configured hash says 0" in plan.home_notes[0][1]
    again = planner.plan(report({"a": 90.0}, 90, sent_to={"a": ADDRESSES[2]}), {})
    assert again.home_notes == ()  # said once
    # an unknown destination (not a configured server) teaches nothing: the hash answers
    other = Planner(Balancing(hot=1, hysteresis=1), 3, homes({"a": 0}), ADDRESSES)
    assert other.plan(report({"a": 90.0}, 90, sent_to={"a": "127.0.0.1:9"}), {}).changes[0].placement.home == 0


def test_a_weight_the_measured_load_takes_to_0_is_a_load_change_not_a_health_one():
    # "a" (home 0) is spread 50/50 over servers 0 and 1, both up; the measured load then has server 1 so busy with
    # cold gets that the water-filling leaves it out of "a": a load change (held back if it would do harm), which
    # the decision log must not call health (it read "server 1 out (health)" with every server answering)
    planner = Planner(Balancing(hot=1, hysteresis=1, mode="weighted"), 2, homes({"a": 0}), ADDRESSES[:2])
    installed = {b"a": Placement(b"a", 0, 0, (0, 1), (0.5, 0.5), 40.0)}
    rep = report({"a": 40.0}, 240, servers={ADDRESSES[0]: 20.0, ADDRESSES[1]: 220.0}, sent_to={"a": ADDRESSES[0]})
    changes = planner.plan(rep, installed).changes
    assert [(c.action, c.key, c.cause) for c in changes] == [(ChangeAction.REWEIGHT, b"a", ChangeCause.LOAD)]
    assert changes[0].placement.weights == pytest.approx((1.0, 0.0))
    assert changes[0].reason == "server 1 out (measured load)"
    # the same weight to 0 with server 1 down is health, and so is any flip when the core reweighs for health
    down = planner.plan(rep, installed, down={1}).changes
    assert [(c.cause, c.reason) for c in down] == [(ChangeCause.HEALTH, "server 1 out (health)")]
    even = report({"a": 40.0}, 80, servers={ADDRESSES[0]: 60.0, ADDRESSES[1]: 20.0}, sent_to={"a": ADDRESSES[0]})
    back = planner.reweigh(even, {b"a": Placement(b"a", 0, 0, (0, 1), (1.0, 0.0), 40.0)}, down=())
    assert [(c.cause, c.reason) for c in back] == [(ChangeCause.HEALTH, "server 1 back in (health)")]
    assert planner.plan(even, {b"a": Placement(b"a", 0, 0, (0, 1), (1.0, 0.0), 40.0)}).changes[0].cause \
        is ChangeCause.LOAD  # the same flip at a report: the load's doing


def test_a_plan_that_would_lower_the_imbalance_factor_is_held_back():
    # the hot key's home is the least loaded server: spreading it can only raise the busiest one
    mapping = {"a": 0}
    rep = report({"a": 50.0}, 250, servers={ADDRESSES[0]: 50.0, ADDRESSES[1]: 100.0, ADDRESSES[2]: 100.0})
    equal = Planner(Balancing(hot=1, hysteresis=1, mode="equal"), 3, homes(mapping), ADDRESSES).plan(rep, {})
    assert equal.imbalance_predicted < equal.imbalance_now and [c.action for c in equal.changes] == ["warm"]
    assert equal.held is None  # the thesis's mode, kept as it was for reproduction
    forced = Planner(Balancing(hot=1, hysteresis=1, mode="weighted"), 3, homes(mapping), ADDRESSES)
    forced.balancing = Balancing(hot=1, hysteresis=1, mode="harmful-test")  # any non-equal mode is guarded
    guarded = forced.plan(rep, {})
    assert guarded.changes == () and "would lower the imbalance factor" in guarded.held


def test_a_plan_held_back_keeps_its_health_reweights_by_their_cause():
    # "a" is installed over all three servers and server 2 goes down; warming "b" too would lower the factor
    mapping = {"a": 0, "b": 0}
    rep = report({"a": 50.0, "b": 40.0}, 290, servers={ADDRESSES[0]: 90.0, ADDRESSES[1]: 100.0, ADDRESSES[2]: 100.0})
    planner = Planner(Balancing(hot=2, hysteresis=1, mode="weighted"), 3, homes(mapping), ADDRESSES)
    planner.balancing = Balancing(hot=2, hysteresis=1, mode="harmful-test")  # as above: spreads to do harm
    installed = {b"a": Placement(b"a", 0, 0, (0, 1, 2), (1 / 3,) * 3, 50.0)}
    plan = planner.plan(rep, installed, down={2})
    assert plan.held is not None and "1 changes held" in plan.held  # the warm of b
    assert [(c.action, c.key, c.cause) for c in plan.changes] == [
        (ChangeAction.REWEIGHT, b"a", ChangeCause.HEALTH)]
    assert plan.changes[0].placement.weights == pytest.approx((0.5, 0.5, 0.0))


def test_a_group_larger_than_the_data_plane_holds_is_cut_to_the_least_loaded_servers():
    # ten servers in one group, a data plane holding 4 per key: the home and the 3 least loaded others
    addresses = [f"127.0.0.1:{11211 + i}" for i in range(10)]
    servers = {a: 100.0 + 10 * i for i, a in enumerate(addresses)}
    planner = Planner(Balancing(hot=1, hysteresis=1, mode="weighted"), 10, homes({"a": 7}), addresses, max_replicas=4)
    plan = planner.plan(report({"a": 50.0}, sum(servers.values()), servers=servers), {})
    placement = plan.changes[0].placement
    assert placement.replicas == (0, 1, 2, 7)
    installed, _ = installed_after(planner, {}, report({"a": 50.0}, sum(servers.values()), servers=servers))
    again = planner.plan(report({"a": 50.0}, 1000, servers={a: 100.0 for a in addresses}), installed)
    assert all(c.placement.replicas == (0, 1, 2, 7) for c in again.changes)  # an installed key keeps its servers


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
    ({"time": 0, "interval": 1, "rate": 1, "top": [], "servers": [1, 2]}, "servers"),
    ({"time": 0, "interval": 1, "rate": 1, "top": [], "servers": {"127.0.0.1:11211": "x"}}, "servers.127.0.0.1"),
    ({"time": 0, "interval": 1, "rate": 1, "top": [{"key": "a", "rate": 1, "server": 5}]}, "top[0].server"),
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


def test_the_decision_log_says_the_same_words_as_ever():
    """GET /decisions and /state read each entry's action as these strings: HTTP consumers depend on them."""
    assert {d.value for d in Decision} == {
        "warm", "cool", "reweight", "skip", "refill", "replay", "expire", "give-up", "error", "adopt", "reconcile",
        "home", "hold", "server-down", "server-up", "server-restarted", "server-mac", "server-closed"}
    assert {c.value for c in ChangeAction} <= {d.value for d in Decision}  # a change is logged as its own kind
    assert {str(d) for d in WARNED} == {"server-down", "server-up", "server-restarted", "server-mac", "error"}


def test_the_cores_queue_carries_typed_events():
    """What the worker is handed is a dataclass per kind (controller/events.py), never a bare tuple; a health change
    given as its word ("down") is typed on the way in."""
    from controller.core import ControllerCore
    from controller.events import Closed, HealthChange, Mirror, Reconnect, Report, ServerChange, Wake
    from dataplanes.recording.driver import RecordingDriver
    from mbalancer.config import parse_config
    servers = [{"name": f"s{i}", "ip": "127.0.0.1", "mac": f"02:00:00:00:00:0{i + 1}", "port": 9 + i}
               for i in range(2)]  # nothing is sent: the core is not started
    core = ControllerCore(parse_config({"servers": servers}), RecordingDriver(), probe_health=False)
    core.submit_report({"time": 1.0, "interval": 1.0, "rate": 10.0, "top": [{"key": "k", "rate": 9.0}]})
    core.submit_mirror(b"frame")
    core.submit_closed(1)
    core.submit_reconnect()
    core.submit_health(0, "down", "no answer")
    queued = core._drain()
    assert [type(e) for e in queued] == [Report, Mirror, Closed, Reconnect, Wake]
    assert queued[0].report.top[0].key == b"k" and queued[1].frame == b"frame" and queued[2].server == 1
    assert list(core._urgent) == [HealthChange(0, ServerChange.DOWN, "no answer")]
    with pytest.raises(ValueError):
        core.submit_health(0, "sideways", None)
