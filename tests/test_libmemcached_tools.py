"""libmemcached's own tools through the eBPF switch with MBalancer's controller running and their keys hot (the fault
runner's rig: three memcached servers and a client in namespaces). memccapable, a protocol conformance suite (ASCII
and binary, over TCP), passes every test it passes against a memcached direct; memcaslap (UDP load, 10% sets, gets
verified), whose keys begin with binary bytes and 0x10 bytes, has its keys read as memcached reads them: none of its
requests is unparsed or unsure, none of its verified gets wrong. (memcaslap writes each key once, with keys new to
each run, so the keys made hot are an earlier run's: tests/pipeline_fixtures.py shows such keys balanced and their
writes mirrored on every data plane.)"""
from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from dataplanes.bpf.program import available

why_not = available() if os.geteuid() == 0 else "needs root (namespaces, bpf, tc)"
if why_not is None and not (shutil.which("memccapable") and shutil.which("memcaslap")):
    why_not = "libmemcached-tools not installed (make install installs it)"
pytestmark = pytest.mark.skipif(why_not is not None, reason=f"cannot run here: {why_not}")

from experiments.benchmarks.bench_memcaslap import CONNECTIONS, hot_keys, memcaslap  # noqa: E402
from experiments.faults.rig import MEMCACHED_PORT, Rig  # noqa: E402
from mbalancer.memcache.server import MemcachedServer  # noqa: E402

HOT = 6
RESULT = re.compile(r"^(.+?)\s+\[(pass|fail|skipped)\]", re.MULTILINE)


class Verdicts(dict):
    """memccapable's verdict per test ({name: pass|skipped}; a failed test prints its [FAIL] on stderr, so its name
    runs into the next one's), with what it printed (shown when two runs differ)."""
    output = ""

    def __repr__(self) -> str:
        return f"{dict(self)!r}\n--- memccapable printed:\n{self.output}"


def memccapable(run, ip: str, port: int) -> Verdicts:
    """`run` runs a command where the client is."""
    done = run(["memccapable", "-h", ip, "-p", str(port), "-t", "5"])
    verdicts = Verdicts(RESULT.findall(done.stdout))
    verdicts.output = done.stdout + done.stderr
    assert len(verdicts) > 40, verdicts.output  # the suite ran (54 tests in libmemcached 1.0.18)
    return verdicts


@pytest.mark.parametrize("protocol", ["udp", "tcp"])
def test_memccapable_passes_through_the_switch_with_its_keys_hot_as_it_does_direct(tmp_path, protocol):
    """Over "tcp" the switch runs its TCP path: the suite's requests (ASCII and binary) pass the TCP splitter."""
    with MemcachedServer(threads=2) as direct:
        expected = memccapable(lambda cmd: subprocess.run(cmd, capture_output=True, text=True, timeout=300),
                               "127.0.0.1", direct.port)
    assert "pass" in expected.values()
    with Rig(tmp_path, HOT, avoid=-1, tag="mbc", protocol=protocol) as rig:
        server = rig.net.server_hosts[0]
        run = lambda cmd: rig.net.run(rig.net.client_hosts[0], cmd, timeout=300)  # noqa: E731
        memccapable(run, server.ip, MEMCACHED_PORT)  # its keys are written once, to be made hot
        rig.keys = hot_keys(rig, HOT)
        rig.wait_balanced()
        through_the_switch = memccapable(run, server.ip, MEMCACHED_PORT)
        state = rig.state()
    assert through_the_switch == expected, through_the_switch.output
    assert state["counters"].get("internal_errors", 0) == 0
    # its hot keys are its binary tests' (test_binary_add, ...), written in the binary protocol, which the switch does
    # not read: each such request made its server unsure (the hot keys there dirty) and was copied, not mirrored.
    # (This counted mirrored writes: the controller's own deletes at a flushed home, a bug, were all it counted.)
    switch = state["counters"]["data_plane"]["switch"]
    assert switch["unsure"] > 0 and switch["cloned"] > 0, switch
    assert "Traceback" not in (tmp_path / "controller.log").read_text()


@pytest.mark.parametrize("protocol", ["udp", "tcp"])
def test_memcaslap_keys_are_read_as_memcached_reads_them(tmp_path, protocol):
    """Over "tcp", memcaslap without -U: its gets pass the switch's TCP path (and those of its hot keys are
    balanced); every one it verifies is right."""
    with Rig(tmp_path, HOT, avoid=-1, tag="mbc", protocol=protocol) as rig:
        memcaslap(rig, 1.0, protocol)
        rig.keys = hot_keys(rig, HOT)
        assert all(key.startswith(("\x10",)) or "\x10" * 5 in key for key in rig.keys), rig.keys  # binary keys
        rig.wait_balanced()
        before = rig.state()["counters"]
        figures = memcaslap(rig, 2.0, protocol)
        after = rig.state()["counters"]
    assert figures["cmd_set"] > 0 and figures["cmd_get"] > 0
    assert figures["verify_failed"] == 0
    assert after["data_plane"]["unparsed"] == before["data_plane"]["unparsed"]
    assert after["data_plane"]["unsure"] == before["data_plane"]["unsure"]
    assert after.get("mirrors_unreadable", 0) == before.get("mirrors_unreadable", 0)
    crossed = {name: after["data_plane"]["switch"][name] - before["data_plane"]["switch"][name]
               for name in ("memcached", "tcp_gets")}
    if protocol == "udp":  # its requests did cross the switch, one datagram each
        assert crossed["memcached"] >= figures["cmd_get"] + figures["cmd_set"], crossed
    else:  # each of its gets was asked where to go (a segment may carry several requests), but for the one each
        # connection had out when memcaslap's time was up: counted as sent, its connection closed before it was read
        assert crossed["tcp_gets"] >= figures["cmd_get"] - CONNECTIONS, (crossed, figures)
