"""The fault runner's scenarios as tests (experiments/faults/): three memcached servers and a client in namespaces,
the eBPF switch, the controller as its own process; a steady load of UDP gets (TCP gets through the switch's TCP path,
for the faults marked so) and versioned TCP sets to hot keys spread over all three servers while a fault hits one replica or the control plane. Asserted: counts and the order
of events, never throughput or times. No get ever returns a version older than an acknowledged set; a failed
replica leaves rotation during the fault and nothing sent afterwards goes unanswered (a reply later than the
timeout but within a second is a busy machine, not a get sent to the failed server); a replica that comes back empty
gets weight only once refilled. How long removal and refill took depends on the machine's load: `mbalancer faults`
prints those times (the 1 s removal target is judged there, not here)."""
from __future__ import annotations

import os

import pytest

from dataplanes.bpf.program import available

why_not = available() if os.geteuid() == 0 else "needs root (namespaces, bpf, tc)"
pytestmark = pytest.mark.skipif(why_not is not None, reason=f"eBPF data plane cannot run here: {why_not}")

from dataplanes import registry  # noqa: E402
from experiments.faults.rig import Rig  # noqa: E402
from experiments.faults.run import Phases, run_fault  # noqa: E402
from experiments.faults.scenarios import FAULTED, FAULTS  # noqa: E402

# phases long enough for removal and refill on a busy machine (measured with two CPU hogs: removal up to ~1.5 s;
# once, with a compiler and other tests running, a restarted replica was not yet refilled 3.5 s after its restart)
PHASES = Phases(warmup=1.5, fault=3.0, recovery=6.0)
RATE, WRITE_RATE, HOT = 600.0, 30.0, 4  # gets/s, sets/s (every set is checked by later gets), hot keys


def run(tmp_path, name: str, dataplane: str = "ebpf", protocol: str = "udp"):
    with Rig(tmp_path, HOT, FAULTED, tag="mbt", dataplane=dataplane, protocol=protocol) as rig:
        result = run_fault(rig, FAULTS[name], 1.0, RATE, WRITE_RATE, PHASES, tmp_path)
        # the TCP path balanced the gets: a run with all of them at home proves nothing (after a reload, the gets of
        # the connections the clients made again, some before the controller had named the servers to the new program)
        if protocol == "tcp":
            assert rig.state()["counters"]["data_plane"]["switch"]["tcp_balanced"] > 0
        return result


missing = {kind: registry.get(kind).available() for kind in ("p4", "openflow")}
EVERY_DATA_PLANE = ["ebpf", *(pytest.param(kind, marks=pytest.mark.skipif(why is not None, reason=f"no {kind}: {why}"))
                              for kind, why in missing.items())]


@pytest.mark.parametrize("name, protocol", [("crash", "udp"), ("hang", "udp"), ("udp_wedge", "udp"), ("crash", "tcp"),
                                            ("hang", "tcp")])
def test_a_failed_replica_leaves_rotation_in_time_and_returns_refilled(tmp_path, name, protocol):
    """Over TCP the splitter holds the gets it sent the failed replica: they cost the client its timeout, nothing
    more (the connection goes on), and later gets go elsewhere once the controller takes the replica out."""
    result = run(tmp_path, name, protocol=protocol)
    assert result.stale == 0, result.events
    assert result.writes > 0 and result.answered > 0.9 * result.gets - result.timeouts
    assert result.removed_after_s is not None, result.events  # taken out of rotation during the fault
    assert result.lost_after_removal == 0, result.events  # a late reply (a busy machine) was still answered
    assert result.restored_after_s is not None, result.events  # and given its weight back once refilled
    assert result.misses == 0  # an empty replica never got weight before its refill
    assert result.false_removals == 0, result.events  # the others kept answering, and kept their weight


def test_a_replica_that_only_answers_late_keeps_its_weight(tmp_path):
    """Its memcached shares one CPU with four busy loops: it answers late, but answers; no server leaves rotation
    (`mbalancer faults --hogs 2` measures the same with the whole machine busy)."""
    result = run(tmp_path, "cpu_hog")
    assert result.stale == 0 and result.misses == 0
    assert result.false_removals == 0 and result.removed_after_s is None, result.events


@pytest.mark.parametrize("dataplane", [*EVERY_DATA_PLANE, "ebpf+tcp"])
def test_a_replica_restarted_in_milliseconds_serves_no_miss(tmp_path, dataplane):
    """Killed and started again at once (empty), three times: back before a health probe could notice. The switch
    sees it close the controller's connections and sends it no get from that moment until the controller has
    refilled it: no get misses a key its home holds."""
    kind, _, protocol = dataplane.partition("+")
    result = run(tmp_path, "fast_restart", kind, protocol or "udp")
    assert result.stale == 0 and result.misses == 0, result.events
    assert any(e["action"] in ("server-closed", "server-restarted") for e in result.events), result.events


def test_a_killed_controller_serves_nothing_stale_and_its_successor_adopts_its_keys(tmp_path):
    result = run(tmp_path, "controller_kill")
    assert result.stale == 0
    assert result.misses == 0
    assert any(e["action"] == "adopt" for e in result.events), result.events  # the old entries were read back


@pytest.mark.parametrize("protocol", ["udp", "tcp"])
def test_a_reloaded_switch_serves_nothing_stale(tmp_path, protocol):
    """Over TCP the TCP path restarts with the program (its splitter held the old program's maps): the clients'
    connections through it end, and they connect again."""
    result = run(tmp_path, "switch_reload", protocol=protocol)
    assert result.stale == 0 and result.misses == 0
    assert any(e["action"] == "replay" for e in result.events), result.events


def test_one_controller_per_switch_and_a_standby_takes_over_with_nothing_stale(tmp_path):
    """A second controller on the switch is refused, naming the owner; a standby takes over the moment the active one
    is killed (SIGKILL) under load: no get misses, none returns an older version than an acknowledged set."""
    import subprocess
    with Rig(tmp_path, HOT, FAULTED, tag="mbt") as rig:
        second = subprocess.run([rig.python, "-m", "mbalancer.cli", "controller", "--config",
                                 str(tmp_path / "config.toml")], capture_output=True, text=True, timeout=120)
        refusal = second.stderr.strip().splitlines()[-1]
        assert second.returncode == 2 and f"driven by controller pid {rig.controller.pid}" in refusal, second.stderr
        assert "--standby" in refusal and "Traceback" not in second.stderr
        result = run_fault(rig, FAULTS["standby_takeover"], 1.0, RATE, WRITE_RATE, PHASES, tmp_path)
    assert result.stale == 0 and result.misses == 0
    standby = (tmp_path / "standby.log").read_text()
    assert "standby: ebpf:" in standby and "taking over" in standby, standby
    assert any(e["action"] == "adopt" for e in result.events), result.events  # it read back the old entries
