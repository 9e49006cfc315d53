"""Paths by which a replica could serve what its home no longer holds, each driven through the real eBPF switch (and
the P4 and OpenFlow ones for the split writes and a restarted home) with real memcached and the controller as its own
process (the fault runner's rig), and probed by a client sending gets of the key through the switch while it reads
the home directly (experiments/faults/coherence.py, probe.py). The gets go over UDP, and on the eBPF switch with its
TCP path ("ebpf+tcp") over TCP too, where the writes pass the TCP splitter on their way home.
Asserted: no get returns the home's earlier value once the home shows the change; never how fast."""
from __future__ import annotations

import os

import pytest

from dataplanes.bpf.program import available

why_not = available() if os.geteuid() == 0 else "needs root (namespaces, bpf, tc)"
pytestmark = pytest.mark.skipif(why_not is not None, reason=f"eBPF data plane cannot run here: {why_not}")

from dataplanes import registry  # noqa: E402
from experiments.faults.coherence import (Probe, judge, run_probes, run_scenario,  # noqa: E402
                                          store_initial)
from experiments.faults.rig import Rig  # noqa: E402
from experiments.faults.scenarios import FAULTED  # noqa: E402
from tests.conftest import eventually  # noqa: E402

HOT = 2


missing = {kind: why_not or registry.get(kind).available() for kind in ("p4", "openflow")}
on_every_data_plane = pytest.mark.parametrize("rig", ["ebpf", "ebpf+tcp", *(
    pytest.param(kind, marks=pytest.mark.skipif(why is not None, reason=f"no {kind} data plane: {why}"))
    for kind, why in missing.items())], indirect=True)
over_udp_and_tcp = pytest.mark.parametrize("rig", ["ebpf", "ebpf+tcp"], indirect=True)


@pytest.fixture
def rig(tmp_path, request):
    """The rig (on the eBPF switch, gets over UDP, unless the test asks for another: "kind" or "kind+tcp") with its
    hot keys holding the initial value at their homes, balanced."""
    dataplane, _, protocol = getattr(request, "param", "ebpf").partition("+")
    with Rig(tmp_path, HOT, FAULTED, tag="mbp", dataplane=dataplane, protocol=protocol or "udp") as built:
        store_initial(built)
        built.wait_balanced()
        if built.protocol == "tcp":  # the TCP path really balances: a test of it cannot pass with every get at home
            key = next(iter(built.keys))
            before = tcp_balanced(built)
            run_probes(built, key, [Probe("gets", b"mn\r\n", seconds=0.3)], tmp_path)
            assert tcp_balanced(built) > before
        yield built


def tcp_balanced(rig: Rig) -> int:
    """TCP gets the switch sent to another server than the one the client addressed, so far."""
    return rig.state()["counters"]["data_plane"]["switch"]["tcp_balanced"]


@pytest.mark.parametrize("rig, line, cut", [
    *(("ebpf", line, cut) for line, cut in [("gat 1 {key}", None), ("gats 1 {key}", None), ("mg {key} v T1", None),
                                            ("mg {key} T1", None), ("mg {key} v T1", 4), ("mg {key} v T1", -4),
                                            ("gat 1 {key}", -2)]),
    ("ebpf+tcp", "mg {key} v T1", None), ("ebpf+tcp", "mg {key} v T1", 4), ("ebpf+tcp", "gat 1 {key}", -2)],
    indirect=["rig"])
def test_a_ttl_shortened_at_the_home_expires_every_copy_with_it(rig, tmp_path, line, cut):
    """Whole, or cut in two TCP segments 0.1 s apart (inside the key, inside the flags, between the line's end); over
    the TCP path the change itself passes the splitter (a meta get that touches goes home: only reads are balanced)."""
    key = next(iter(rig.keys))
    request = line.format(key=key).encode() + b"\r\n"
    whole = Probe(line, request, seconds=3.0)
    probes = [whole if cut is None else Probe(f"{line} cut at {cut}", request[:cut], request[cut:], 0.1, 3.0)]
    results = run_probes(rig, key, probes, tmp_path)
    outcome = judge("ttl", probes, results)
    assert results[0]["reply"].startswith(("VALUE", "VA", "HD")), results[0]["reply"]
    assert outcome.changed == 1, results[0]["home"]  # the home expired it (memcached counts whole seconds)
    assert outcome.gets_after_change > 0 and outcome.stale == 0, outcome  # gone from the home: gone everywhere
    decided = lambda: [d for d in rig.state()["decisions"] if d["key"] == key]  # noqa: E731
    # the copy of the change reaches the controller through the switch: on a busy machine after the probe ended
    assert eventually(lambda: any(d["action"] == "expire" for d in decided()), timeout=30, every=0.5), decided()


def test_a_touch_to_a_long_ttl_keeps_the_key_balanced(rig, tmp_path):
    """The control: a TTL made longer is copied, and the key is balanced again (not held at home)."""
    key = next(iter(rig.keys))
    results = run_probes(rig, key, [Probe("touch", f"touch {key} 3600\r\n".encode(), seconds=2.0)], tmp_path)
    assert results[0]["reply"] == "TOUCHED\r\n"
    assert all(value == "v1" for _, value in results[0]["gets"])
    hot = {k["key"]: k for k in rig.state()["hot_keys"]}[key]
    assert not hot["dirty"], hot


@over_udp_and_tcp
@pytest.mark.parametrize("tail", [b"mn", b"zz"])
def test_a_write_split_across_segments_is_never_served_stale(rig, tmp_path, tail):
    """`set k 0 0 15\\r\\nv=0000000005;` and, 100 ms later on the same connection, the value's last two bytes: a tail
    that reads as a whole harmless command by itself (`mn`) is no different from one that does not (`zz`)."""
    key = next(iter(rig.keys))
    probes = [Probe("split", f"set {key} 0 0 15\r\nv=0000000005;".encode(), tail + b"\r\n", 0.1, 2.0)]
    results = run_probes(rig, key, probes, tmp_path)
    outcome = judge("split", probes, results)
    assert results[0]["reply"] == "STORED\r\n", results[0]["reply"]
    assert outcome.changed == 1 and outcome.gets_after_change > 0 and outcome.stale == 0, outcome


@on_every_data_plane
def test_writes_split_at_every_point_are_never_served_stale(rig, tmp_path):
    """The TCP stream view is right by construction: no tail, however harmless it looks, is read on its own."""
    outcome = run_scenario(rig, "split_sweep", tmp_path)
    assert outcome.changed == outcome.probes  # every write landed at the home
    assert outcome.stale == 0, outcome
    # connections were followed (one that closed before the controller read its copies is forgotten by the data
    # plane at its FIN, and its copies are read one by one); the TCP splitter sends each write home only once it
    # holds all of it, so over TCP no write reaches the switch's stream view in pieces
    assert rig.state()["counters"]["stream_boundaries_proven"] > 0 or rig.protocol == "tcp"


@on_every_data_plane
def test_a_home_restarted_empty_is_empty_everywhere(rig, tmp_path):
    """The home killed and started again at once: its copies must not serve what it no longer holds."""
    outcome = run_scenario(rig, "home_restart", tmp_path)
    assert outcome.changed == 1 and outcome.gets_after_change > 0, outcome  # the home came back empty
    assert outcome.stale == 0, outcome
