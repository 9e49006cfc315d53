"""The monitor on real traffic: pcap and pcapng written by tcpdump and scapy, live capture on loopback, the push
to the controller, and bad input on the command line."""
from __future__ import annotations

import http.server
import io
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import termios
import threading
import time
from collections import Counter

import numpy as np
import pytest

from experiments.workload.engine import run_load
from experiments.workload.populate import populate
from experiments.workload.spec import Workload
from experiments.workload.trace import get_frames
from mbalancer.memcache.addresses import ServerAddress
from mbalancer.memcache.server import MemcachedServer, free_port
from monitor.cli import READY
from monitor.monitor import MAX_EMPTY_REPORTS
from monitor.sampling import MAX_SAMPLE, AdaptiveSampling
from monitor.terminal import KeyReader, TerminalView
from tests.conftest import wait_for_line

REQUESTS = 20_000


@pytest.fixture(scope="module")
def server():
    with MemcachedServer() as memcached:
        address = ServerAddress(*memcached.address)
        populate(Workload(servers=(address,), keys=500))
        yield address


def drive(server: ServerAddress, requests: int = REQUESTS, protocol: str = "udp") -> Counter:
    """Run the load generator; returns how many gets each key got."""
    workload = Workload(servers=(server,), keys=500, clients=8, requests=requests, protocol=protocol)
    records = run_load(workload)
    return Counter(f"key:{k + 1}" for k in records.key)


class Tcpdump:
    def __init__(self, path, port: int):
        self.process = subprocess.Popen(["tcpdump", "-i", "lo", "--immediate-mode", "-B", "131072", "-U", "-s", "0", "-w", str(path),
                                         f"udp dst port {port} or tcp dst port {port}"],
                                        stderr=subprocess.PIPE, text=True)
        assert "listening on" in self.process.stderr.readline()

    def stop(self) -> str:
        time.sleep(0.2)
        self.process.send_signal(signal.SIGINT)
        return self.process.communicate(timeout=10)[1]


@pytest.fixture(scope="module")
def captured(server, tmp_path_factory):
    """A pcap written by tcpdump of REQUESTS gets (UDP) and 2000 (TCP), and the exact count per key."""
    path = tmp_path_factory.mktemp("pcap") / "memcached.pcap"
    tcpdump = Tcpdump(path, server.port)
    counts = drive(server) + drive(server, 2000, "tcp")
    stats = tcpdump.stop()
    assert "0 packets dropped by kernel" in stats.splitlines(), stats
    return path, counts


def monitor_json(run_cli, *args):
    result = run_cli("monitor", *args, "--json")
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()], result.stderr


def test_pcap_from_tcpdump_counts_every_get(run_cli, captured, server):
    path, counts = captured
    reports, stderr = monitor_json(run_cli, "--pcap", str(path), "--port", str(server.port), "--top", "10")
    assert sum(r["total"] for r in reports) == sum(counts.values())
    assert "0 skipped" in stderr
    # intervals follow the capture's timestamps: one-second windows, the last one partial
    assert all(r["interval"] == pytest.approx(1.0) for r in reports[:-1])
    merged = Counter()
    for report in reports:
        merged.update({t["key"]: t["count"] for t in report["top"]})
    for key, _ in counts.most_common(5):
        assert merged[key] == pytest.approx(counts[key], rel=0.05)


def test_pcapng_gives_the_same_counts(run_cli, captured, server, tmp_path):
    from scapy.utils import PcapNgWriter, rdpcap
    path, counts = captured
    pcapng = tmp_path / "memcached.pcapng"
    with PcapNgWriter(str(pcapng)) as writer:
        for packet in rdpcap(str(path)):
            writer.write(packet)
    reports, _ = monitor_json(run_cli, "--pcap", str(pcapng), "--port", str(server.port))
    assert sum(r["total"] for r in reports) == sum(counts.values())


def test_a_pcap_cut_short_is_read_up_to_the_cut(run_cli, captured, server, tmp_path):
    path, counts = captured
    cut = tmp_path / "cut.pcap"
    whole = path.read_bytes()
    position = 24  # walk the records to cut inside the data of the first one past half the file
    while position < len(whole) // 2:
        position += 16 + struct.unpack_from("<I", whole, position + 8)[0]
    cut.write_bytes(whole[:position + 16 + 5])
    reports, stderr = monitor_json(run_cli, "--pcap", str(cut), "--port", str(server.port))
    assert 0.4 < sum(r["total"] for r in reports) / sum(counts.values()) < 0.6
    assert "cut short" in stderr


@pytest.mark.parametrize("content, message", [(None, "cannot open"), (b"", "not a pcap"),
                                              (b"hello world, not a capture", "not a pcap"),
                                              (b"\xd4\xc3\xb2\xa1\x02\x00", "header cut short"),
                                              (b"\x0a\x0d\x0d\x0a\x1c\x00\x00\x00\x00\x00\x00\x00", "byte-order")])
def test_missing_or_corrupt_pcap_exits_2(run_cli, tmp_path, content, message):
    path = tmp_path / "bad.pcap"
    if content is not None:
        path.write_bytes(content)
    result = run_cli("monitor", "--pcap", str(path))
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("args, message", [(["--iface", "nosuch0"], "no network interface"),
                                           (["--pcap", "x", "--sample", "2"], "live capture only"),
                                           (["--pcap", "x", "--sample", "auto"], "live capture only"),
                                           (["--iface", "lo", "--sample", "0"], "--sample: a whole number"),
                                           (["--iface", "lo", "--sample", "often"], "or auto (got 'often')"),
                                           (["--iface", "lo", "--top", "0"], "--top"),
                                           (["--iface", "lo", "--port", "0"], "--port"),
                                           (["--pcap", "x", "--push", "htp://x/report"], "--push: an http:// URL"),
                                           (["--pcap", "x", "--push", "http://127.0.0.1:99999/"], "--push: the port")])
def test_bad_options_exit_2(run_cli, args, message):
    result = run_cli("monitor", *args)
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr


def live_monitor(server: ServerAddress, *options: str):
    from tests.conftest import MBALANCER
    return started_monitor([str(MBALANCER), "monitor", "--iface", "lo", "--port", str(server.port), "--json",
                            "--interval", "0.5", *options])


def started_monitor(command: list[str]) -> subprocess.Popen:
    """A live monitor, once it says its socket is listening."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    process.early_stderr = wait_for_line(process, READY)
    return process


def finish(process) -> tuple[list[dict], str]:
    time.sleep(0.8)  # let the last interval close
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=10)
    assert process.returncode == 0, err
    return [json.loads(line) for line in out.splitlines()], process.early_stderr + err


def test_live_capture_counts_every_get(server):
    process = live_monitor(server, "--sample", "1")  # fixed: no sampling, whatever the socket drops
    counts = drive(server)
    reports, stderr = finish(process)
    # every get accounted for: counted, or lost in the socket's buffer and said so (a busy machine may drop a few;
    # how many the monitor keeps up with is bench_monitor.py's figure)
    dropped = sum(r["kernel_dropped"] for r in reports)
    assert sum(r["kernel_received"] for r in reports) == REQUESTS
    assert sum(r["total"] for r in reports) + dropped == REQUESTS
    assert f"{dropped} dropped by the kernel" in stderr
    hottest = max((t for r in reports for t in r["top"]), key=lambda t: t["count"])
    assert hottest["key"] == counts.most_common(1)[0][0] == "key:1"


def test_live_capture_sampled_in_the_kernel(server):
    process = live_monitor(server, "--sample", "4")
    drive(server)
    reports, stderr = finish(process)
    assert "1-in-4 sampling" in stderr
    captured = int(stderr.split("captured ")[1].split()[0])
    assert captured == pytest.approx(REQUESTS / 4, rel=0.1)
    assert sum(r["total"] for r in reports) == pytest.approx(REQUESTS, rel=0.1)


class FakeCapture:
    sample = 1

    def set_sample(self, sample: int) -> None:
        self.sample = sample


def test_adaptive_sampling_rises_with_drops_and_comes_back_once_calm():
    capture = FakeCapture()
    adaptive = AdaptiveSampling(capture)
    assert adaptive.next_sample(10_000, 50, busy=1.0)[0] == 1  # 0.5% dropped: tolerated
    k, why = adaptive.next_sample(10_000, 6_000, busy=1.0)  # 4,000 got through: 1 in ceil(10000 / 2800)
    assert k == 4 and "dropped 6000 of 10000 requests (60%)" in why
    capture.sample = k
    assert adaptive.next_sample(10_000, 200, busy=1.0)[0] == 8  # still dropping: at least doubles
    capture.sample = 8
    assert [adaptive.next_sample(2_000, 0, busy=0.1)[0] for _ in range(3)] == [8, 8, 4]  # calm for 3 intervals
    capture.sample = 4
    assert [adaptive.next_sample(2_000, 0, busy=b)[0] for b in (0.1, 0.9, 0.1, 0.1)] == [4, 4, 4, 4]  # busy: anew
    assert adaptive.next_sample(10**9, 10**9 - 1, busy=1.0)[0] == MAX_SAMPLE


def test_a_monitor_that_falls_behind_samples_in_the_kernel_and_says_so(server):
    """The monitor is stopped while 150,000 gets pass (more than its socket buffer holds): the kernel drops the
    rest, the next interval samples 1 in k >= 2, and the run's summary says so."""
    process = live_monitor(server)  # --sample auto, the default
    os.kill(process.pid, signal.SIGSTOP)
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            frame = struct.pack("!HHHH", 1, 0, 1, 0) + b"get key:1\r\n"
            for _ in range(150_000):
                sock.sendto(frame, ("127.0.0.1", server.port))
    finally:
        os.kill(process.pid, signal.SIGCONT)
    reports, stderr = finish(process)
    dropping = next(i for i, r in enumerate(reports) if r["kernel_dropped"] > 0.01 * r["kernel_received"])
    assert reports[dropping]["sample"] == 1 and reports[dropping + 1]["sample"] >= 2, reports
    assert "sampling 1 in" in stderr and "adaptive sampling, 1 in 1 to 1 in" in stderr


class Collector(http.server.BaseHTTPRequestHandler):
    bodies: list = []

    def do_POST(self):
        length = int(self.headers["Content-Length"])
        Collector.bodies.append((self.headers["Content-Type"], json.loads(self.rfile.read(length))))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_reports_are_pushed_to_the_controller(run_cli, captured, server):
    path, _ = captured
    httpd = http.server.HTTPServer(("127.0.0.1", 0), Collector)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}/monitor"
        reports, stderr = monitor_json(run_cli, "--pcap", str(path), "--port", str(server.port), "--push", url)
    finally:
        httpd.shutdown()
    assert [body for _, body in Collector.bodies] == reports
    assert {kind for kind, _ in Collector.bodies} == {"application/json"}
    assert f"{len(reports)} pushed, 0 failed" in stderr


def test_reports_go_to_the_controller_of_a_failover_group_that_listens(run_cli, captured, server):
    """Two --push URLs, the first a standby (a closed port: only the leader listens): every report reaches the
    leader, none counts as failed."""
    path, _ = captured
    Collector.bodies.clear()
    httpd = http.server.HTTPServer(("127.0.0.1", 0), Collector)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        leader = f"http://127.0.0.1:{httpd.server_address[1]}/report"
        reports, stderr = monitor_json(run_cli, "--pcap", str(path), "--port", str(server.port),
                                       "--push", f"http://127.0.0.1:{free_port()}/report", "--push", leader)
    finally:
        httpd.shutdown()
    assert [body for _, body in Collector.bodies] == reports
    assert f"{len(reports)} pushed, 0 failed" in stderr and "reports now go to " + leader in stderr


def test_a_failing_push_is_not_fatal(run_cli, captured, server):
    path, _ = captured
    reports, stderr = monitor_json(run_cli, "--pcap", str(path), "--port", str(server.port), "--push",
                                   "http://127.0.0.1:9/none")
    assert reports and f"0 pushed, {len(reports)} failed" in stderr


def test_no_get_counted_hints_at_the_port(run_cli, captured, server):
    path, _ = captured
    result = run_cli("monitor", "--pcap", str(path), "--port", str(server.port + 1), "--json")
    assert result.returncode == 0 and "no get was counted" in result.stderr
    assert f"port {server.port + 1} (--port)" in result.stderr


def test_a_gap_in_a_pcap_costs_a_few_empty_reports_not_thousands(run_cli, tmp_path):
    """Two gets a day apart (a corrupt or stitched capture): at most MAX_EMPTY_REPORTS reports for the gap."""
    frames = get_frames(np.array([0, 1]))
    path = tmp_path / "gap.pcap"
    with open(path, "wb") as out:
        out.write(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1))
        for seconds, frame in ((1000, frames[0]), (1000 + 86_400, frames[1])):
            out.write(struct.pack("<IIII", seconds, 0, len(frame), len(frame)) + frame)
    reports, stderr = monitor_json(run_cli, "--pcap", str(path))
    assert len(reports) <= MAX_EMPTY_REPORTS + 1 and "empty intervals reported" in stderr
    assert sum(r["total"] for r in reports) >= 1


def test_terminal_view(run_cli, captured, server):
    path, _ = captured
    result = run_cli("monitor", "--pcap", str(path), "--port", str(server.port), "--top", "3")
    assert result.returncode == 0 and "key:1 " in result.stdout and "gets/s" in result.stdout
    assert np.all([line.count("%") == 1 for line in result.stdout.splitlines() if line.strip().startswith("1 ")])


def test_live_capture_on_several_interfaces_counts_each_request_once():
    """Two clients on a switch (a Linux bridge in namespaces): captured on both client ports at once, every get is
    counted once, where it enters; the server's port (where the gets only leave) adds nothing."""
    import os

    from topologies.netns import NamespaceNetwork
    if os.geteuid() != 0:
        pytest.skip("needs root (network namespaces)")
    client = ("import socket, sys, time\n"
              "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
              "def get(key): s.sendto(b'\\x00\\x01\\x00\\x00\\x00\\x01\\x00\\x00get ' + key + b'\\r\\n', ('10.0.0.1', 11211))\n"
              "get(b'arp'); time.sleep(0.3)  # resolve the server's MAC first: nothing queued, nothing dropped\n"
              "for i in range(int(sys.argv[1])): get(sys.argv[2].encode())\n")
    with NamespaceNetwork(servers=1, clients=2, tag="mbmon", dataplane="bridge") as net:
        c1, c2 = net.client_hosts
        ports = f"{c1.port},{c2.port},{net.server_hosts[0].port}"
        process = started_monitor([sys.executable, "-m", "mbalancer.cli", "monitor", "--iface", ports, "--json",
                                   "--interval", "0.5"])
        for host, count, key in ((c1, 300, "one"), (c2, 200, "two")):
            assert net.run(host, [sys.executable, "-c", client, str(count), key]).returncode == 0
        reports, _ = finish(process)
    counts = Counter()
    for report in reports:
        counts.update({t["key"]: t["count"] for t in report["top"]})
    assert (counts["one"], counts["two"], counts["arp"]) == (300, 200, 2)


def test_several_interfaces_need_existing_ones(run_cli):
    result = run_cli("monitor", "--iface", "lo,no-such-if0", "--duration", "1")
    assert result.returncode == 2 and "no-such-if0" in result.stderr


def _report(rates: dict[str, float]) -> dict:
    total = sum(rates.values())
    return {"rate": total, "interval": 1.0, "packets": int(total), "skipped": {}, "ignored": 0, "sample": 1,
            "top": [{"key": k, "rate": r, "share": r / total, "error": 0} for k, r in rates.items()]}


def test_the_terminal_view_shows_the_interval_before_and_sorts_by_key():
    out = io.StringIO()
    view = TerminalView(out=out, source="eth0")
    view(_report({"key:a": 100.0, "key:b": 50.0}))
    view(_report({"key:b": 300.0, "key:c": 10.0}))
    rows = [line.split() for line in view.lines()[2:]]
    assert [(r[1], r[2], r[3], r[4]) for r in rows] == [("key:b", "300.0", "50.0", "+250"),
                                                        ("key:c", "10.0", "-", "new")]
    assert view.key("k") and [line.split()[1] for line in view.lines()[2:]] == ["key:b", "key:c"]
    assert view.key("c") and view.sort == "c" and not view.key("q")
    assert out.getvalue().count("mbalancer monitor eth0") == 2 + 2  # each report, and each sort, redrawn


def test_keys_are_read_from_a_terminal_and_q_quits():
    master, slave = os.openpty()
    with os.fdopen(slave, "r") as terminal:
        before = termios.tcgetattr(terminal)
        seen, quit_called = [], threading.Event()
        reader = KeyReader(lambda char: seen.append(char) or char != "q", quit_called.set, stdin=terminal).start()
        os.write(master, b"kq")
        assert quit_called.wait(10) and seen == ["k", "q"]
        reader.close()
        assert termios.tcgetattr(terminal) == before  # the terminal is given back as it was
    os.close(master)


def test_intervals_close_on_time_under_traffic_that_never_lets_up():
    """A socket that is never empty (traffic faster than the monitor reads) still gives the monitor a tick at least
    every `wake_every`, so every interval's report goes out: a kernel socket pair, kept full by a sender thread
    while the reader takes its time over each frame."""
    import socket
    import threading
    from monitor.capture import LiveCapture
    reader, writer = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    reader.setblocking(False)
    writer.settimeout(0.5)
    capture = LiveCapture.__new__(LiveCapture)
    capture.sock = reader
    sending = threading.Event()
    sending.set()

    def send() -> None:
        while sending.is_set():
            try:
                writer.send(b"x" * 64)
            except (socket.timeout, OSError):
                pass  # the buffer is full: the reader is behind, as wanted
    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    try:
        ticks, frames, give_up = 0, 0, time.monotonic() + 10
        for _, frame in capture.frames(time.monotonic() + 2.0, wake_every=0.1):
            if time.monotonic() > give_up:  # frames() ends at 2 s; one that never looks at the clock would not
                break
            if frame is None:
                ticks += 1
            else:
                frames += 1
                time.sleep(0.0002)  # slower than the sender: the socket stays full
        assert frames > 100 and ticks >= 4, (frames, ticks)  # 2 s at 0.1 s: about 20; before the fix, 0
    finally:
        sending.clear()
        sender.join(2)
        reader.close()
        writer.close()
