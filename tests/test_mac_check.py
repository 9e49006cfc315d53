"""Each server's configured MAC against what the switch saw (controller/mac_check.py), as pure logic."""
from __future__ import annotations

import pytest

from controller.mac_check import MacStatus, MacWatch, verdict, verdicts
from dataplanes.driver import MacSighting, merge_sightings
from mbalancer.settings import Server

CONFIGURED = "02:00:00:00:00:0a"


@pytest.mark.parametrize("sighting, status", [
    (None, MacStatus.UNSUPPORTED),
    (MacSighting(), MacStatus.UNSEEN),
    (MacSighting(("02:00:00:00:00:0A",)), MacStatus.OK),  # case does not matter
    (MacSighting((CONFIGURED,), flooded=5), MacStatus.OK),  # flooding delivered them to its port too
    (MacSighting(("02:00:00:00:00:0b",)), MacStatus.MISMATCH),
    (MacSighting((CONFIGURED, "02:00:00:00:00:0b")), MacStatus.MISMATCH),  # two switches disagree
    (MacSighting(flooded=1), MacStatus.FLOODED),  # never seen, yet its gets were flooded
])
def test_the_verdict_of_each_sighting(sighting, status):
    assert verdict(CONFIGURED.upper(), sighting).status is status


def test_a_mismatch_names_both_macs_in_one_line():
    line = verdict(CONFIGURED, MacSighting(("02:00:00:00:00:0b",))).describe(2, "s3")
    assert "\n" not in line and line.startswith("server 2 (s3): ")
    assert f"configured mac {CONFIGURED}, seen 02:00:00:00:00:0b" in line


def test_sightings_of_several_switches_merge_per_server():
    first = [MacSighting(("02:00:00:00:00:01",), 1), MacSighting()]
    second = [MacSighting(("02:00:00:00:00:01",), 2), MacSighting(("02:00:00:00:00:02",))]
    assert merge_sightings([first, second]) == [MacSighting(("02:00:00:00:00:01",), 3),
                                                MacSighting(("02:00:00:00:00:02",))]


def test_a_server_found_wrong_stays_wrong_until_a_restart():
    servers = [Server("a", "10.0.0.1", "02:00:00:00:00:01"), Server("b", "10.0.0.2", "02:00:00:00:00:02")]
    watch = MacWatch(servers)
    assert watch.update([MacSighting(), MacSighting()]) == {}
    found = watch.update([MacSighting(("02:00:00:00:00:01",)), MacSighting(("02:00:00:00:00:0b",))])
    assert list(found) == [1] and found[1].status is MacStatus.MISMATCH
    assert watch.update([MacSighting(("02:00:00:00:00:01",)), MacSighting(("02:00:00:00:00:02",))]) == {}
    assert set(watch.wrong) == {1}  # seen right later (a NIC swapped?): still out, until the controller restarts
    state = watch.state(1)
    assert state["status"] == "ok" and state["out_of_rotation"]["status"] == "mismatch"
    with pytest.raises(ValueError, match="1 servers' MACs reported for 2 servers"):
        verdicts(servers, [MacSighting()])
