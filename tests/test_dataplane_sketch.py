"""Hot-key detection in the eBPF data plane (bpf/sketch.h): the program in the kernel counts the gets of Zipf traces
(BPF_PROG_TEST_RUN, one run per packet), and monitor/dataplane.py reads them back as monitor reports; then
`mbalancer monitor --source dataplane` end to end."""
from __future__ import annotations

import json
import os
import signal
import subprocess
from collections import Counter

import numpy as np
import pytest

from dataplanes.bpf.bpf_syscall import obj_get, prog_test_run
from dataplanes.bpf.program import DataPlane, available
from dataplanes.ebpf.standalone import status
from dataplanes.bpf.tables import Tables
from experiments.workload.trace import tcp_frame, udp_frame, zipf_trace
from monitor.cli import READY
from monitor.dataplane import SketchReader, overstatement
from tests.conftest import MBALANCER, wait_for_line

why_not = available() if os.geteuid() == 0 else "needs root (bpf syscall, bpffs)"
pytestmark = pytest.mark.skipif(why_not is not None, reason=f"eBPF data plane cannot run here: {why_not}")

SERVERS = ("10.0.0.1", "10.0.0.2")
GETS = 100_000  # per trace


@pytest.fixture(scope="module")
def switch():
    plane = DataPlane(f"sketch{os.getpid()}").load()
    tables = Tables(plane.pin_dir)
    tables.add_memcached_ports([11211])
    prog = obj_get(str(plane.program_pin))
    yield plane, tables, prog
    os.close(prog)
    tables.close()
    plane.unload()


def key_name(index: int) -> bytes:
    return b"user:%08d:profile" % index


def home_of(index: int) -> str:
    return SERVERS[index % 2]


def send_gets(prog: int, indices: np.ndarray) -> None:
    frames: dict[int, bytes] = {}
    for index in indices.tolist():
        frame = frames.get(index)
        if frame is None:
            frame = frames[index] = udp_frame(b"get " + key_name(index) + b"\r\n", dst=home_of(index))
        prog_test_run(prog, frame)


@pytest.mark.parametrize("keys,alpha", [(10**5, 0.9), (10**5, 1.2), (10**6, 0.9), (10**6, 1.2)])
def test_the_top_keys_and_their_counts_come_from_the_data_plane(switch, keys, alpha):
    _, tables, prog = switch
    reader = SketchReader(tables, top=10, interval=60.0)  # counts until 3 intervals ahead: all of the trace
    reader.start()
    trace = zipf_trace(keys, alpha, GETS, seed=keys + int(alpha * 10))
    send_gets(prog, trace)
    report = reader.read()
    reader.stop()
    exact = Counter(trace.tolist())
    found = {entry.key: entry for entry in report.top}
    reported = [int(key.split(b":")[1]) for key in found]
    tenth = exact.most_common(10)[-1][1]
    # recall of the top 10 is 1, but for ties: a key may stand in for another only if both are within the sketch's
    # error bound of the tenth count
    truth = [index for index, _ in exact.most_common(10)]
    missed = [index for index in truth if index not in reported]
    assert all(exact[index] <= tenth + overstatement(GETS) for index in missed), (exact.most_common(12), reported)
    assert all(exact[index] >= tenth - overstatement(GETS) for index in reported if index not in truth)
    for index in set(truth) - set(missed):
        entry = found[key_name(index)]
        assert exact[index] <= entry.count <= exact[index] * 1.05  # a count-min estimate only overstates
        assert entry.count - exact[index] <= overstatement(GETS) and entry.error == overstatement(GETS)
        assert entry.server == f"{home_of(index)}:11211"
    assert report.total == GETS
    assert report.servers.keys() == {f"{ip}:11211" for ip in SERVERS}
    per_server = Counter(home_of(i) for i in trace.tolist())
    assert {to: round(rate * report.interval) for to, rate in report.servers.items()} == \
        {f"{ip}:11211": n for ip, n in per_server.items()}


def test_nothing_is_counted_while_no_reader_renews_the_sketch(switch):
    plane, tables, prog = switch
    reader = SketchReader(tables, top=10, interval=1.0)
    reader.start()
    assert status(plane.name)["sketch_read"]  # `mbalancer switch status` says so
    reader.stop()  # the deadline is now past: the program skips the sketch
    assert not status(plane.name)["sketch_read"]
    send_gets(prog, np.zeros(50, dtype=int))
    reader.start()  # clears whatever an earlier reader left, and counts from now on
    report = reader.read()
    reader.stop()
    assert report.total == 0 and report.top == ()


def test_what_counts_as_a_get(switch):
    """UDP and TCP gets count (of a multi-key get, the first key); writes, other requests and gets an earlier switch
    balanced do not; each epoch reports only its own gets."""
    _, tables, prog = switch
    reader = SketchReader(tables, top=10, interval=1.0)
    reader.start()
    frames = [udp_frame(b"get alpha\r\n"), tcp_frame(b"get alpha\r\n"), udp_frame(b"gets alpha beta\r\n"),
              udp_frame(b"set alpha 0 0 1\r\nx\r\n"), udp_frame(b"delete alpha\r\n"), udp_frame(b"get " + b"k" * 251
                                                                                                + b"\r\n"),
              udp_frame(b"get alpha\r\n", dport=9999)]
    balanced = bytearray(udp_frame(b"get alpha\r\n"))
    balanced[20] |= 0x80  # the IPv4 reserved flag: balanced by a switch on the path
    for frame in frames + [bytes(balanced)]:
        prog_test_run(prog, frame)
    first = reader.read()
    prog_test_run(prog, udp_frame(b"get beta\r\n"))
    second = reader.read()
    reader.stop()
    assert {e.key: e.count for e in first.top} == {b"alpha": 3}
    assert first.total == 3 and first.skipped == {"unparsed": 1}  # the 251-byte key
    assert {e.key: e.count for e in second.top} == {b"beta": 1} and second.total == 1


def test_monitor_source_dataplane_end_to_end(switch):
    plane, _, prog = switch
    command = [str(MBALANCER), "monitor", "--source", "dataplane", "--switch", plane.name, "--json",
               "--interval", "0.3", "--top", "5"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        early = wait_for_line(process, READY)
        hot = udp_frame(b"get hot:key\r\n", dst=SERVERS[1])
        for _ in range(2000):
            prog_test_run(prog, hot)
        send_gets(prog, np.arange(300))
    finally:
        process.send_signal(signal.SIGINT)  # the last interval is read at exit: every get above is reported
        out, err = process.communicate(timeout=30)
    assert process.returncode == 0, early + err
    reports = [json.loads(line) for line in out.splitlines()]
    assert sum(r["total"] for r in reports) == 2300
    assert sum(t["count"] for r in reports for t in r["top"] if t["key"] == "hot:key") == 2000
    assert all(t["server"] == "10.0.0.2:11211" for r in reports for t in r["top"] if t["key"] == "hot:key")
    assert "2300 gets counted in the data plane" in err


def test_a_config_naming_an_ebpf_switch_makes_its_sketch_the_default_source(switch, run_cli, tmp_path):
    plane, _, prog = switch
    config = tmp_path / "mbalancer.toml"
    servers = '[[servers]]\nname = "s1"\nip = "10.0.0.2"\nmac = "02:00:00:00:00:02"\n'
    config.write_text(servers + f'[dataplane]\nkind = "ebpf"\n[dataplane.ebpf]\nswitches = ["{plane.name}"]\n'
                      '[controller]\nlisten = "127.0.0.1:1"\n')  # a closed port: the pushes fail, counted
    result = run_cli("monitor", "--config", str(config), "--json", "--duration", "0.5", "--interval", "0.2")
    assert result.returncode == 0, result.stderr
    assert f"capturing on switch {plane.name}" in result.stderr and "pushed" in result.stderr, result.stderr
    config.write_text(servers)  # no data plane that counts: say what to give
    result = run_cli("monitor", "--config", str(config))
    assert result.returncode == 2 and "give --iface" in result.stderr and "ebpf or openflow" in result.stderr


@pytest.mark.parametrize("args,message", [
    (["--source", "dataplane", "--switch", "no-such-switch"], "no eBPF switch named no-such-switch"),
    (["--source", "dataplane", "--sample", "2"], "--sample applies to live capture only"),
    (["--pcap", "x.pcap", "--switch", "s1"], "--switch goes with --source dataplane"),
    (["--source", "other"], "invalid choice"),
    ([], "give --iface (live capture), --pcap or --source dataplane"),
])
def test_bad_dataplane_options_exit_2(switch, run_cli, args, message):
    result = run_cli("monitor", *args)
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr
