"""Hot-key detection in the P4 data plane (p4src/mbalancer.p4's sketch, dataplanes/p4/sketch.py): Zipf traces of
gets into a running simple_switch_grpc, read back by monitor/dataplane.py's SketchReader as monitor reports, the
same reader and the same bounds as the eBPF sketch (tests/test_dataplane_sketch.py). The tables the sketch needs
(memcached ports, servers) are written by the real P4Runtime driver, whose connection is the primary the digests
go to. Frames are sent in bursts no larger than bmv2's queue, each once the switch has counted the one before, so
every get sent is a get the switch read (the report's total says so)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
from collections import Counter

import numpy as np
import pytest

from controller.core import ControllerCore
from controller.http_api import serve, start_serving
from dataplanes.p4 import Settings
from dataplanes.p4.bmv2 import Bmv2Switch
from dataplanes.p4.driver import P4RuntimeDriver
from dataplanes.p4.pipeline import Pipeline, available
from dataplanes.p4.sketch import STEP_BITS, P4Sketch
from experiments.workload.trace import tcp_frame, udp_frame, zipf_trace
from mbalancer.config import Server, config_toml, parse_config
from mbalancer.memcache.server import free_port
from monitor.cli import READY
from monitor.dataplane import SketchReader, overstatement
from dataplanes.p4.veth_ports import Ports
from tests.conftest import MBALANCER, eventually, wait_for_line

why_not = available() if os.geteuid() == 0 else "needs root (veths, bmv2 on them)"
pytestmark = pytest.mark.skipif(why_not is not None, reason=f"P4 data plane cannot run here: {why_not}")

TAG = f"p4k{os.getpid() % 10000}"
SERVERS = (("02:00:00:00:00:01", "10.0.0.1", 11211), ("02:00:00:00:00:02", "10.0.0.2", 11211))
CLIENT_PORT = 1
GETS = 100_000  # per trace, as the eBPF sketch's tests


@pytest.fixture(scope="module")
def switch():
    ports = Ports(TAG, 1 + len(SERVERS))
    bmv2 = Bmv2Switch(TAG, ports.switch_ends)
    driver = None
    try:
        bmv2.start()
        driver = P4RuntimeDriver(Settings(switches=(bmv2.address,), ports=tuple(range(1, len(SERVERS) + 2))),
                                 Pipeline())
        driver.attach([Server(f"s{i}", ip, mac, port) for i, (mac, ip, port) in enumerate(SERVERS)], lambda _: None)
        sketch = P4Sketch(driver.clients[0], driver.pipeline, [f"{ip}:{port}" for _, ip, port in SERVERS])
        yield driver, ports, sketch
    finally:
        if driver is not None:
            driver.close()
        bmv2.stop()
        ports.close()


def key_name(index: int) -> bytes:
    return b"user:%08d:profile" % index


def home_of(index: int) -> str:
    return SERVERS[index % 2][1]


def packets(driver: P4RuntimeDriver) -> int:
    return driver.switch_counters()[0]["packets"]


def send(driver: P4RuntimeDriver, ports: Ports, frames: list[bytes]) -> None:
    assert ports.send_paced(CLIENT_PORT, frames, lambda: packets(driver)), "the switch did not read every frame"


def get_frames(indices: np.ndarray) -> list[bytes]:
    cache: dict[int, bytes] = {}
    return [cache.setdefault(i, udp_frame(b"get " + key_name(i) + b"\r\n", dst=home_of(i))) for i in indices.tolist()]


# two of the eBPF sketch tests' four traces (bench_p4_sketch.py runs all four at 10^6 gets)
@pytest.mark.parametrize("keys,alpha", [(10**5, 0.9), (10**6, 1.2)])
def test_the_top_keys_and_their_counts_come_from_the_p4_switch(switch, keys, alpha):
    driver, ports, sketch = switch
    reader = SketchReader(sketch, top=10, interval=600.0)
    reader.start()
    trace = zipf_trace(keys, alpha, GETS, seed=keys + int(alpha * 10))
    send(driver, ports, get_frames(trace))
    report = reader.read()
    reader.stop()
    exact = Counter(trace.tolist())
    assert report.total == GETS  # every get the switch read was counted, once
    found = {entry.key: entry for entry in report.top}
    reported = [int(key.split(b":")[1]) for key in found]
    tenth = exact.most_common(10)[-1][1]
    truth = [index for index, _ in exact.most_common(10)]
    missed = [index for index in truth if index not in reported]  # only a tie within the sketch's error may
    assert all(exact[index] <= tenth + overstatement(GETS) for index in missed), (exact.most_common(12), reported)
    assert all(exact[index] >= tenth - overstatement(GETS) for index in reported if index not in truth)
    for index in set(truth) - set(missed):
        entry = found[key_name(index)]
        # count-min only overstates; an estimate of 2^b or more is reported every 2^(b - STEP_BITS) gets (the last
        # report may be one step short of the end)
        assert exact[index] - (exact[index] >> (STEP_BITS - 1)) - 1 <= entry.count <= exact[index] + overstatement(GETS)
        assert entry.server == f"{home_of(index)}:11211"
    per_server = Counter(home_of(i) for i in trace.tolist())
    assert {to: round(rate * report.interval) for to, rate in report.servers.items()} == \
        {f"{ip}:11211": n for ip, n in per_server.items()}


def test_what_counts_as_a_get_and_each_epoch_counts_its_own(switch):
    """UDP and TCP gets count (of a multi-key get, the first key), writes and other requests do not; a new epoch
    starts every cell again, without anything zeroing them."""
    driver, ports, sketch = switch
    reader = SketchReader(sketch, top=10, interval=600.0)
    reader.start()
    alpha = b"get alpha\r\n"
    send(driver, ports, [udp_frame(alpha, dst=SERVERS[0][1])] * 6 + [tcp_frame(alpha, dst=SERVERS[0][1])] * 4 + [
        udp_frame(b"gets alpha beta\r\n", dst=SERVERS[0][1]), udp_frame(b"set alpha 0 0 1\r\nx\r\n"),
        udp_frame(b"delete alpha\r\n"), udp_frame(b"get " + b"k" * 251 + b"\r\n"), udp_frame(alpha, dport=9999)])
    first = reader.read()
    send(driver, ports, [udp_frame(b"get beta\r\n", dst=SERVERS[1][1])] * 9)
    second = reader.read()
    send(driver, ports, [udp_frame(alpha, dst=SERVERS[0][1])] * 8)  # the cells alpha left two epochs ago
    third = reader.read()
    reader.stop()
    assert [(e.key, e.count, e.server) for e in first.top] == [(b"alpha", 11, "10.0.0.1:11211")]
    assert first.total == 11
    assert [(e.key, e.count) for e in second.top] == [(b"beta", 9)] and second.total == 9
    assert [(e.key, e.count) for e in third.top] == [(b"alpha", 8)] and third.total == 8


def test_nothing_is_counted_once_the_reader_stops(switch):
    driver, ports, sketch = switch
    reader = SketchReader(sketch, top=10, interval=600.0)
    reader.start()
    reader.stop()
    send(driver, ports, [udp_frame(b"get gamma\r\n", dst=SERVERS[0][1])] * 20)
    reader.start()
    report = reader.read()
    reader.stop()
    assert report.total == 0 and report.top == ()


def test_the_monitor_reads_a_p4_switch_through_its_controller(tmp_path):
    """`mbalancer monitor --config` on a P4 config: the controller is the switch's P4Runtime primary (the digests
    reach it only), and the monitor reads the sketch through its HTTP interface (POST /sketch), no root needed."""
    tag = TAG + "c"
    ports = Ports(tag, 1 + len(SERVERS))
    bmv2 = Bmv2Switch(tag, ports.switch_ends)
    core = http = monitor = None
    try:
        bmv2.start()
        listen = f"127.0.0.1:{free_port()}"
        config = parse_config({
            "servers": [{"name": f"s{i}", "ip": ip, "mac": mac, "port": port}
                        for i, (mac, ip, port) in enumerate(SERVERS)],
            "controller": {"listen": listen},
            "dataplane": {"kind": "p4", "p4": {"switches": [bmv2.address], "ports": [1, 2, 3]}}})
        driver = P4RuntimeDriver(config.dataplane.settings, Pipeline())
        core = ControllerCore(config, driver, probe_health=False).start()
        http = start_serving(serve(core, ("127.0.0.1", int(listen.split(":")[1]))))
        (tmp_path / "mbalancer.toml").write_text(config_toml(config))
        monitor = subprocess.Popen([str(MBALANCER), "monitor", "--config", str(tmp_path / "mbalancer.toml"), "--json",
                                    "--interval", "600", "--push", f"http://{listen}/nothing"],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wait_for_line(monitor, READY)
        send(driver, ports, [udp_frame(b"get alpha\r\n", dst=SERVERS[0][1])] * 30 +
             [udp_frame(b"get beta\r\n", dst=SERVERS[1][1])] * 12)
        monitor.send_signal(signal.SIGINT)  # the last, partial interval is reported, then it turns the sketch off
        out, err = monitor.communicate(timeout=30)
        assert monitor.returncode == 0, err
        report = [json.loads(line) for line in out.splitlines()][-1]
        assert [(e["key"], e["count"], e["server"]) for e in report["top"]] == \
            [("alpha", 30, "10.0.0.1:11211"), ("beta", 12, "10.0.0.2:11211")]
        assert report["total"] == 42
    finally:
        if monitor is not None and monitor.poll() is None:
            monitor.kill()
            monitor.wait()
        if http is not None:
            http.shutdown()
        if core is not None:
            core.stop()
        bmv2.stop()
        ports.close()



def test_the_switch_stops_counting_when_no_reader_renews_it(switch):
    """As the eBPF sketch: a reader that dies (here: one that never reads again) stops the switch's cost once its
    deadline, RENEW intervals ahead, has passed."""
    driver, ports, sketch = switch
    reader = SketchReader(sketch, top=10, interval=0.1)
    reader.start()
    assert sketch.on and eventually(lambda: not sketch.on, timeout=10)
    send(driver, ports, [udp_frame(b"get delta\r\n", dst=SERVERS[0][1])] * 20)
    assert sketch.take_sketch_destinations(0) == ({}, 0) and sketch.take_sketch_destinations(1) == ({}, 0)
