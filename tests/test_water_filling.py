"""Water-filling: the replica split that minimises the maximum load."""
import numpy as np
import pytest

from controller.water_filling import water_fill, water_fill_weights, water_level


def test_pours_into_the_least_loaded_first():
    added = water_fill(np.array([0.1, 0.4, 0.2]), 0.3)
    # Level 0.3: server 0 gets 0.2, server 2 gets 0.1, the server above the level gets nothing.
    assert added == pytest.approx([0.2, 0.0, 0.1])


def test_enough_mass_fills_everything_to_one_level():
    loads = np.array([0.1, 0.4, 0.2])
    added = water_fill(loads, 1.0)
    assert loads + added == pytest.approx([0.5667, 0.5667, 0.5667], abs=1e-4)


def test_zero_mass_adds_nothing_and_weights_fall_back_to_equal():
    assert water_fill(np.array([0.3, 0.1]), 0.0) == pytest.approx([0, 0])
    assert water_fill_weights(np.array([0.3, 0.1]), 0.0) == pytest.approx([0.5, 0.5])


def test_ties_and_a_single_server():
    assert water_fill(np.array([0.2, 0.2, 0.2]), 0.3) == pytest.approx([0.1, 0.1, 0.1])
    assert water_fill(np.array([0.7]), 0.3) == pytest.approx([0.3])


def _reference_level(loads, mass):
    """Bisection on sum(max(0, L - load)) = mass: slow, obviously right."""
    lo, hi = min(loads), max(loads) + mass
    for _ in range(200):
        mid = (lo + hi) / 2
        if sum(max(0.0, mid - x) for x in loads) < mass:
            lo = mid
        else:
            hi = mid
    return hi


def test_batched_levels_match_a_bisection_reference():
    rng = np.random.default_rng(3)
    loads = rng.random((200, 7))
    mass = rng.random(200) * 2
    levels = water_level(loads, mass)
    added = water_fill(loads, mass)
    for row in range(200):
        assert levels[row] == pytest.approx(_reference_level(list(loads[row]), mass[row]), abs=1e-9)
    assert added.sum(axis=1) == pytest.approx(mass)
    assert (added >= 0).all()


def test_no_other_split_has_a_lower_maximum():
    rng = np.random.default_rng(4)
    loads, mass = rng.random(5), 0.8
    best = (loads + water_fill(loads, mass)).max()
    for _ in range(2000):
        split = rng.dirichlet(np.ones(5)) * mass
        assert (loads + split).max() >= best - 1e-12


def test_bad_input_is_refused():
    with pytest.raises(ValueError):
        water_level(np.array([0.1, 0.2]), -0.1)
    with pytest.raises(ValueError):
        water_level(np.zeros((3, 0)), np.zeros(3))
