"""Each server's configured MAC against what the switch saw (controller/mac_check.py), as pure logic; and the one
conversion of a MAC between as written and as switches hold it (mbalancer/macs.py)."""
from __future__ import annotations

import pytest

from controller.mac_check import MacStatus, MacWatch, verdict, verdicts
from dataplanes.driver import MacSighting, merge_sightings
from mbalancer.macs import mac_bytes, mac_text
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


def test_gets_flooded_to_a_server_never_seen_take_it_out_only_if_they_go_on_being_flooded():
    """A switch that has not learned a server's MAC yet (just attached, restarted) floods a few of its gets until
    the server's first frame through it: reported as flooded, not taken out. A wrong MAC floods every get balanced to
    it: flooded at two checks in a row, more at the second, it is out."""
    servers = [Server("a", "10.0.0.1", "02:00:00:00:00:01"), Server("b", "10.0.0.2", "02:00:00:00:00:02")]
    watch = MacWatch(servers)
    assert watch.update([MacSighting(), MacSighting(flooded=2)]) == {}
    assert watch.state(1)["status"] == "flooded" and watch.state(1)["out_of_rotation"] is None
    assert watch.update([MacSighting(), MacSighting(flooded=2)]) == {}  # the switch learned it: no more floods
    assert watch.update([MacSighting(), MacSighting(("02:00:00:00:00:02",), flooded=2)]) == {}
    assert watch.wrong == {}
    other = MacWatch(servers)
    assert other.update([MacSighting(), MacSighting(flooded=1)]) == {}
    found = other.update([MacSighting(), MacSighting(flooded=3)])
    assert list(found) == [1] and found[1].status is MacStatus.FLOODED and found[1].flooded == 3


# --- a MAC as written and as switches hold it ------------------------------------------------------------------------
def test_a_mac_goes_to_its_bytes_or_value_and_back_as_the_config_writes_it():
    assert mac_bytes(CONFIGURED) == mac_bytes(CONFIGURED.upper()) == b"\x02\x00\x00\x00\x00\x0a"
    assert mac_text(mac_bytes(CONFIGURED.upper())) == CONFIGURED  # lower case, as switches report them
    assert mac_text(0x02000000000a) == CONFIGURED  # a P4 match field's value
    assert mac_text(0xffffffffffff) == "ff:ff:ff:ff:ff:ff" and mac_text(0) == "00:00:00:00:00:00"


@pytest.mark.parametrize("written", ["02:00:00:00:0a", "02:00:00:00:00:00:0a", "2:0:0:0:0:a", "02-00-00-00-00-0a",
                                     "02:00:00:00:00:0g", ""])
def test_what_is_not_a_mac_is_refused_in_one_line(written):
    with pytest.raises(ValueError, match="is not a MAC address like 02:00:00:00:00:01"):
        mac_bytes(written)


@pytest.mark.parametrize("held", [b"\x02" * 5, b"\x02" * 8, 1 << 48])
def test_what_holds_no_mac_is_refused(held):
    with pytest.raises(ValueError, match="holds no MAC address"):
        mac_text(held)
