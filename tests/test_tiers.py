"""Every test module is in exactly one tier (tests/conftest.py's TIERS, the markers in setup.cfg), so a new module
cannot be left out of `make test-unit` or run there by accident (docs/testing.md)."""
from __future__ import annotations

import ast
import configparser
from pathlib import Path

import pytest

from tests.conftest import TIER_NAMES, TIERS

TESTS = Path(__file__).resolve().parent


def module_names() -> set[str]:
    return {path.stem for path in TESTS.glob("test_*.py")}


def registered_markers() -> set[str]:
    config = configparser.ConfigParser()
    config.read(TESTS.parent / "setup.cfg")
    lines = config["tool:pytest"]["markers"].strip().splitlines()
    return {line.split(":")[0].strip() for line in lines}


def tiers_declared_in(path: Path) -> list[str]:
    """Tier markers a module names itself (`pytest.mark.root` anywhere in it): the table is the one place."""
    return [node.attr for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Attribute) and node.attr in TIER_NAMES
            and isinstance(node.value, ast.Attribute) and node.value.attr == "mark"]


def test_every_test_module_has_a_tier_and_the_table_names_no_other():
    modules = module_names()
    assert sorted(modules - set(TIERS)) == [], "add these to TIERS in tests/conftest.py"
    assert sorted(set(TIERS) - modules) == [], "TIERS names modules that are gone"
    assert set(TIERS.values()) <= set(TIER_NAMES)


def test_the_tiers_are_the_registered_markers():
    assert set(TIER_NAMES) == registered_markers()


def test_no_module_marks_its_own_tier(tmp_path: Path):
    sample = tmp_path / "test_sample.py"
    sample.write_text("import pytest\npytestmark = [pytest.mark.root, pytest.mark.skipif(True, reason='x')]\n")
    assert tiers_declared_in(sample) == ["root"]  # the check sees what it forbids
    marked = {name: tiers for name in module_names() if (tiers := tiers_declared_in(TESTS / f"{name}.py"))}
    assert marked == {}, "give a module's tier in TIERS only, so it has exactly one"


def test_every_collected_test_carries_exactly_one_tier(request: pytest.FixtureRequest):
    """Of the tests this run collected (all of them under `make test`, the unit tier under `make test-unit`)."""
    wrong = {item.nodeid: tiers for item in request.session.items
             if len(tiers := [mark.name for mark in item.iter_markers() if mark.name in TIER_NAMES]) != 1}
    assert wrong == {}


def run_tiers_expressions() -> dict[str, set[str]]:
    """The two marker expressions `make test` runs side by side (tests/run_tiers.sh), each as its set of tiers."""
    found = {}
    for line in (TESTS / "run_tiers.sh").read_text().splitlines():
        name, sep, value = line.partition("=")
        if sep and name in ("offline", "network"):
            found[name] = set(value.strip('"').split(" or "))
    return found


def test_make_test_runs_every_tier_once():
    """A tier missing from both runs would never run in CI; one in both would run twice, once beside itself."""
    runs = run_tiers_expressions()
    assert set(runs) == {"offline", "network"}
    assert runs["offline"] | runs["network"] == set(TIER_NAMES) and not runs["offline"] & runs["network"]
    assert runs["network"] >= {tier for tier in TIER_NAMES if tier in ("root", "bmv2", "mininet")}


def test_the_network_streams_run_every_network_module_once():
    """`make test` runs the network tiers as two streams of modules side by side (tests/network_streams.py): a module
    in neither would never run in CI, one in both twice, and at once beside itself."""
    from tests.network_streams import NETWORK_TIERS, main, streams
    split = streams()
    network = {module for module, tier in TIERS.items() if tier in NETWORK_TIERS}
    assert set(NETWORK_TIERS) == run_tiers_expressions()["network"]
    assert sorted(split) == ["namespaces", "testbed"] and all(split.values())
    assert sorted(split["testbed"] + split["namespaces"]) == sorted(network)
    assert main(["nosuch"]) == 2
