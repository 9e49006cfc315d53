"""The imbalance-factor model: known answers, a plain-Python reference, and the thesis's trends."""
from dataclasses import replace

import numpy as np
import pytest

from experiments.simulation.figures import FIGURES, compute_figure
from experiments.simulation.placement import place, server_loads
from controller.load import imbalance_factor
from experiments.simulation.remedies import extra_servers_to_match, make_remedy
from experiments.simulation.scenario import Scenario, ScenarioError, simulate, smallest_hot_for
from experiments.simulation.zipf import hot_share, zipf_weights


# --- known answers --------------------------------------------------------------------------------------------
def test_ten_hottest_of_a_thousand_keys_take_39_percent():
    # Thesis, chapter 4: H_10 / H_1000 = 2.93 / 7.49 = 0.39.
    assert hot_share(10, 1000, 1.0) == pytest.approx(0.3913, abs=1e-4)
    assert round(hot_share(10, 1000, 1.0), 2) == 0.39


def test_zipf_weights_are_normalised_and_decreasing():
    w = zipf_weights(1000, 0.9)
    assert w.sum() == pytest.approx(1.0)
    assert (np.diff(w) < 0).all()
    assert w[0] / w[9] == pytest.approx(10 ** 0.9)


@pytest.mark.parametrize("mode", ["equal", "weighted", "move"])
def test_one_server_is_always_balanced(mode):
    summary = simulate(Scenario(servers=1, mode=mode, trials=50)).summary()
    assert summary["imbalance_factor"] == pytest.approx(1.0)
    assert summary["baseline"]["mean"] == pytest.approx(1.0)


@pytest.mark.parametrize("mode", ["equal", "weighted"])
def test_every_key_hot_in_one_group_is_perfect_balance(mode):
    summary = simulate(Scenario(servers=10, keys=200, hot=200, groups=1, mode=mode, trials=50)).summary()
    assert summary["imbalance_factor"] == pytest.approx(1.0)
    assert summary["ci95"][0] == pytest.approx(1.0)


def test_no_hot_keys_changes_nothing():
    outcome = simulate(Scenario(hot=0, trials=100))
    assert outcome.remedied == pytest.approx(outcome.baseline)
    assert outcome.extra_servers == pytest.approx(0)


def test_thesis_setting_lands_in_the_thesis_range():
    # Chapter 3: with 10 servers the imbalance factor runs between 40% and 60%; 10 hot keys fix much of it.
    summary = simulate(Scenario(trials=2000)).summary()
    assert 0.4 < summary["baseline"]["mean"] < 0.6
    assert summary["imbalance_factor"] > summary["baseline"]["mean"] + 0.25
    assert summary["ci95"][0] < summary["imbalance_factor"] < summary["ci95"][1]
    assert summary["extra_copies"] == 90  # 10 keys, 9 new copies each
    assert 2 <= summary["extra_servers_equivalent"]["mean"] <= 10  # "equivalent to adding 2-10 servers"


# --- the vectorised model against a plain-Python reference ------------------------------------------------------
def _reference_imbalance(weights, homes, servers, hot, groups, mode):
    """One trial, written out the slow, obvious way. Keys become hot one at a time, hottest first, each placed
    given the loads at that moment (keys not yet hot still count at their homes)."""
    size = servers // groups
    loads = [0.0] * servers
    for key, w in enumerate(weights):
        loads[homes[key]] += w
    if mode == "move":
        for key in range(hot):
            loads[homes[key]] -= weights[key]
            target = min(range(servers), key=lambda s: loads[s])
            loads[target] += weights[key]
        return (sum(loads) / servers) / max(loads)
    group_hot = [0.0] * groups
    for key in range(hot):
        loads[homes[key]] -= weights[key]
        if mode == "equal":
            g = min(range(groups), key=lambda g: group_hot[g])
        else:
            g = min(range(groups), key=lambda g: group_hot[g] + sum(loads[g * size:(g + 1) * size]))
        group_hot[g] += weights[key]
    final = []
    for g in range(groups):
        members = loads[g * size:(g + 1) * size]
        if mode == "equal":
            final += [x + group_hot[g] / size for x in members]
        else:  # the lowest maximum over the group: bisection on the water level
            lo, hi = 0.0, max(members) + group_hot[g]
            for _ in range(200):
                mid = (lo + hi) / 2
                lo, hi = (mid, hi) if sum(max(0.0, mid - x) for x in members) < group_hot[g] else (lo, mid)
            final += [max(x, hi) for x in members]
    return (sum(final) / servers) / max(final)


@pytest.mark.parametrize("mode,groups", [("equal", 1), ("equal", 2), ("equal", 3), ("weighted", 1),
                                         ("weighted", 3), ("move", 1)])
def test_vectorised_model_matches_reference(mode, groups):
    weights = zipf_weights(60, 1.0)
    placement = place(weights, servers=6, trials=40, seed=5, kept=60)
    assert placement.loads == pytest.approx(server_loads(placement.homes, weights, 6))
    remedy = make_remedy(placement, mode, groups)
    for key in range(8):
        remedy.add(weights[key], placement.homes[:, key])
    got = imbalance_factor(remedy.loads())
    for trial in range(40):
        expected = _reference_imbalance(list(weights), list(placement.homes[trial]), 6, 8, groups, mode)
        assert got[trial] == pytest.approx(expected, abs=1e-7), trial


def test_weighted_never_loses_to_equal_on_the_same_assignments():
    equal = simulate(Scenario(mode="equal", trials=500))
    weighted = simulate(Scenario(mode="weighted", trials=500))
    assert (weighted.remedied >= equal.remedied - 1e-12).all()


def test_extra_servers_matches_adding_copies_one_at_a_time():
    rng = np.random.default_rng(9)
    loads = rng.dirichlet(np.ones(6), size=30)
    target = loads.max(axis=1) * rng.uniform(0.3, 1.0, size=30)
    counted = extra_servers_to_match(loads, target)
    for row in range(30):
        copies = [1] * 6
        while max(l / c for l, c in zip(loads[row], copies)) > target[row] + 1e-12:
            busiest = max(range(6), key=lambda s: loads[row][s] / copies[s])
            copies[busiest] += 1
        assert counted[row] == sum(copies) - 6


def test_extra_copies_count_the_group_not_the_home():
    # G = 2 groups of 5: a key copied to a group holding its home adds 4 copies, otherwise 5.
    outcome = simulate(Scenario(groups=2, trials=400))
    assert ((outcome.extra_copies >= 40) & (outcome.extra_copies <= 50)).all()
    assert outcome.extra_copies.mean() == pytest.approx(45, abs=1.0)


# --- Monte Carlo behaviour --------------------------------------------------------------------------------------
def test_same_seed_same_answer_other_seed_other_answer():
    a = simulate(Scenario(trials=100, seed=7)).summary()
    b = simulate(Scenario(trials=100, seed=7)).summary()
    c = simulate(Scenario(trials=100, seed=8)).summary()
    assert a == b
    assert a["imbalance_factor"] != c["imbalance_factor"]


def test_confidence_interval_shrinks_with_the_square_root_of_trials():
    narrow = simulate(Scenario(trials=1600)).summary()["ci95"]
    wide = simulate(Scenario(trials=100)).summary()["ci95"]
    ratio = (narrow[1] - narrow[0]) / (wide[1] - wide[0])
    assert 0.15 < ratio < 0.40  # 1 / sqrt(16) = 0.25


def test_remedies_compare_on_identical_assignments():
    # The assignment depends on (seed, servers, keys) only, so the baseline is the same whatever the remedy.
    a = simulate(Scenario(mode="equal", hot=5, trials=200))
    b = simulate(Scenario(mode="move", hot=20, alpha=1.0, trials=200))
    assert a.baseline == pytest.approx(b.baseline)


# --- auto H -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["equal", "weighted"])
def test_auto_hot_is_the_smallest_h_that_reaches_the_target(mode):
    base = Scenario(mode=mode, trials=300)
    outcome, facts = smallest_hot_for(base, 0.9)
    assert facts["reached"]
    h = outcome.scenario.hot
    assert simulate(replace(base, hot=h)).summary()["imbalance_factor"] >= 0.9
    for smaller in range(h):
        assert simulate(replace(base, hot=smaller)).summary()["imbalance_factor"] < 0.9
    assert outcome.summary()["extra_copies"] == h * 9


def test_auto_hot_reports_an_unreachable_target():
    # Moving keys can never beat the hottest key alone on one server: 0.1 / 0.134 = 0.75 at 10 servers.
    outcome, facts = smallest_hot_for(Scenario(mode="move", trials=50), 0.9)
    assert outcome is None and not facts["reached"]
    assert facts["best_imbalance_factor"] < 0.8


# --- bad settings -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("changes,field", [
    ({"servers": 0}, "--servers"), ({"keys": -3}, "--keys"), ({"hot": 1001}, "--hot"), ({"hot": -1}, "--hot"),
    ({"groups": 3}, "--groups"), ({"alpha": 0.0}, "--alpha"), ({"alpha": -1.0}, "--alpha"),
    ({"alpha": float("nan")}, "--alpha"), ({"mode": "bogus"}, "--mode"), ({"trials": 0}, "--trials"),
    ({"seed": -1}, "--seed"),
])
def test_impossible_settings_name_the_parameter(changes, field):
    with pytest.raises(ScenarioError, match=field):
        simulate(replace(Scenario(trials=10), **changes))


# --- the thesis's trends ----------------------------------------------------------------------------------------
def _curve(rows, label):
    return [r["mean"] for r in rows if r["curve"] == label]


def test_fig_3_1_imbalance_improves_with_more_keys_and_mbalancer_lifts_it():
    rows = compute_figure(FIGURES["3.1"], Scenario(trials=300))
    base, equal = _curve(rows, "no MBalancer"), _curve(rows, "MBalancer (equal)")
    assert all(b2 > b1 for b1, b2 in zip(base, base[1:]))  # grows (logarithmically) with N
    assert all(e > b + 0.2 for b, e in zip(base, equal))
    assert all(w >= e - 1e-9 for w, e in zip(_curve(rows, "MBalancer (weighted)"), equal))


def test_fig_3_2_more_servers_is_worse_and_moving_keys_does_not_fix_it():
    rows = compute_figure(FIGURES["3.2"], Scenario(trials=300))
    base, equal, move = (_curve(rows, label) for label in ("no MBalancer", "MBalancer (equal)",
                                                          "move hot keys (no copies)"))
    assert all(b2 < b1 for b1, b2 in zip(base, base[1:]))
    assert all(e > b for b, e in zip(base, equal))
    assert all(m <= e + 1e-9 for m, e in zip(move[6:], equal[6:]))  # from 10 servers on, moving trails
    assert move[-1] - base[-1] < 0.02  # at 100 servers moving "almost never helps"


def test_fig_3_3_more_servers_need_more_extra_servers():
    rows = compute_figure(FIGURES["3.3"], Scenario(trials=300))
    equal = _curve(rows, "match MBalancer (equal)")
    assert equal[-1] > equal[0]
    assert 2 <= equal[FIGURES["3.3"].x_values.index(10)] <= 10


def test_fig_4_3_two_groups_cost_nothing_and_many_groups_cost_less_with_more_servers():
    rows = compute_figure(FIGURES["4.3"], Scenario(trials=300))
    g1, g2, g10 = (_curve(rows, f"G={g} (equal)") for g in (1, 2, 10))
    assert max(abs(a - b) for a, b in zip(g1, g2)) < 0.01
    penalty = [a - b for a, b in zip(g1, g10)]
    assert all(p > 0 for p in penalty)
    assert penalty[-1] < penalty[0]
