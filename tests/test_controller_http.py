"""The controller's HTTP interface and command: reports in, state out, and the monitor pushing to a live controller."""
from __future__ import annotations

import json
import logging
import re
import socket
import struct
import subprocess
import threading
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from controller.core import ControllerCore
from dataplanes.recording.driver import RecordingDriver
from controller.http_api import json_safe, serve, start_serving
from experiments.workload.trace import get_frames, write_pcap, zipf_trace
from mbalancer.config import config_toml, parse_config
from mbalancer.memcache.addresses import ServerAddress
from mbalancer.memcache.hashing import KetamaHash
from mbalancer.memcache.keys import key_to_text
from mbalancer.memcache.meta import MetaClient, StoredItem
from mbalancer.memcache.server import free_port
from tests.conftest import MBALANCER, eventually


def server_table(servers) -> list[dict]:
    return [{"name": f"s{i}", "ip": "127.0.0.1", "mac": f"02:00:00:00:00:0{i + 1}", "port": s.port}
            for i, s in enumerate(servers)]


@pytest.fixture
def api(memcached_pair):
    config = parse_config({"servers": server_table(memcached_pair), "balancing": {"hot": 1, "hysteresis": 1}})
    core = ControllerCore(config, RecordingDriver(), probe_health=False).start()
    http = start_serving(serve(core, ("127.0.0.1", 0)))
    yield core, f"http://127.0.0.1:{http.server_address[1]}"
    http.shutdown()
    core.stop()


def call(url: str, body: bytes | None = None) -> tuple[int, object]:
    request = urllib.request.Request(url, data=body, method="POST" if body is not None else "GET",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=5) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_a_posted_report_makes_a_key_hot_and_the_state_shows_it(api):
    core, url = api
    home = core.key_hash.server_of(b"popular")
    MetaClient(core.config.servers[home].address).set(b"popular", StoredItem(b"v", 0, -1, 0))
    status, body = call(url + "/report", json.dumps(
        {"time": 1.0, "interval": 1.0, "rate": 500.0, "top": [{"key": "popular", "rate": 400.0}]}).encode())
    assert (status, body) == (202, {"accepted": True, "keys": 1})
    assert core.wait_idle()
    status, state = call(url + "/state")
    assert status == 200
    assert [k["key"] for k in state["hot_keys"]] == ["popular"]
    hot = state["hot_keys"][0]
    assert hot["home"] == home and not hot["dirty"]
    assert sorted(r["server"] for r in hot["replicas"]) == [0, 1]
    assert state["servers"][home]["estimated_gets_per_s"] > 0
    assert state["servers"][home]["mac_check"]["status"] == "not supported by this data plane"  # no switch
    assert state["plan"]["imbalance_predicted"] >= state["plan"]["imbalance_now"]
    assert {"uptime", "driver", "config", "retries", "counters", "decisions"} <= set(state)
    status, decisions = call(url + "/decisions")
    assert status == 200 and decisions[-1]["action"] == "warm" and decisions[-1]["key"] == "popular"
    assert state["servers"][home]["measured_gets_per_s"] is None and state["plan"]["loads"].startswith("estimated")
    measured = {f"{s.ip}:{s.port}": 100.0 * (i + 1) for i, s in enumerate(core.config.servers)}
    call(url + "/report", json.dumps({"time": 2.0, "interval": 1.0, "rate": 300.0, "servers": measured,
                                      "top": [{"key": "popular", "rate": 80.0}]}).encode())
    assert core.wait_idle()
    state = call(url + "/state")[1]
    assert [s["measured_gets_per_s"] for s in state["servers"]] == [100.0, 200.0] and state["plan"]["loads"] == \
        "measured"


def metrics(url: str) -> dict[tuple[str, tuple], float]:
    """GET /metrics, parsed by prometheus-client's own parser: (sample name, sorted labels) -> value."""
    with urllib.request.urlopen(url + "/metrics", timeout=5) as reply:
        assert reply.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = reply.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_metrics_say_what_the_state_says_in_prometheus_text(api):
    core, url = api
    key = b"hot\xff\xfe"  # not UTF-8: a label value must still be text
    home = core.key_hash.server_of(key)
    MetaClient(core.config.servers[home].address).set(key, StoredItem(b"v", 0, -1, 0))
    measured = {f"{s.ip}:{s.port}": 100.0 if i == home else 20.0 for i, s in enumerate(core.config.servers)}
    report = {"time": 1.0, "interval": 1.0, "rate": 120.0, "servers": measured,
              "top": [{"key": key_to_text(key), "rate": 90.0}]}
    assert call(url + "/report", json.dumps(report).encode())[0] == 202
    assert core.wait_idle()
    found = metrics(url)
    label = "hot\\xff\\xfe"  # as the label reads once parsed
    weights = {dict(labels)["server"]: v for (name, labels), v in found.items()
               if name == "mbalancer_hot_key_replica_weight" and dict(labels)["key"] == label}
    assert set(weights) == {"0", "1"} and abs(sum(weights.values()) - 1) < 1e-3
    assert found[("mbalancer_hot_keys", ())] == 1
    assert found[("mbalancer_decisions_total", (("kind", "warm"),))] == 1
    assert found[("mbalancer_reports_total", ())] == 1
    assert found[("mbalancer_imbalance_factor", (("spread", "without"),))] == pytest.approx(60 / 100)
    assert found[("mbalancer_imbalance_factor", (("spread", "now"),))] == pytest.approx(0.6)  # none installed yet
    assert found[("mbalancer_imbalance_factor", (("spread", "planned"),))] == pytest.approx(1.0, abs=0.01)
    servers = {dict(labels)["server"]: v for (name, labels), v in found.items() if name == "mbalancer_server_up"}
    assert servers == {"0": 1.0, "1": 1.0}
    assert found[("mbalancer_sync_seconds_count", ())] == 0 and ("mbalancer_sync_seconds_bucket",
                                                               (("le", "+Inf"),)) in found
    assert ("process_cpu_seconds_total", ()) in found
    assert call(url + "/report", json.dumps({**report, "time": 2.0}).encode())[0] == 202  # now it is spread
    assert core.wait_idle()
    found = metrics(url)
    assert found[("mbalancer_imbalance_factor", (("spread", "now"),))] == pytest.approx(1.0, abs=0.01)
    shares = [v for (name, _), v in found.items() if name == "mbalancer_server_share"]
    assert sorted(shares) == pytest.approx([0.5, 0.5], abs=0.01)


@pytest.mark.parametrize("body, message", [
    (b"{not json", "Expecting"),
    (b'{"time": 1, "interval": 1, "rate": 5}', "top:"),
    (b'{"time": 1, "interval": -1, "rate": 5, "top": []}', "interval:"),
])
def test_a_bad_report_gets_a_400_naming_the_problem(api, body, message):
    core, url = api
    status, reply = call(url + "/report", body)
    assert status == 400 and message in reply["error"]
    assert core.counts["bad_reports"] >= (0 if message == "Expecting" else 1)


@pytest.mark.parametrize("body, status, message", [
    (b"{not json", 400, '{"call": NAME'),
    (b"[1, 2]", 400, '{"call": NAME'),
    (b'{"args": [0]}', 400, '{"call": NAME'),
    (b'{"call": "heavy_keys", "args": ["0"]}', 400, "whole numbers"),
    (b'{"call": "heavy_keys", "args": [true]}', 400, "whole numbers"),
    (b'{"call": "heavy_keys", "args": [0, 10]}', 503, "read from the switch itself"),  # the recording driver's
])
def test_the_sketch_endpoint_refuses_bad_calls_and_data_planes_read_elsewhere(api, body, status, message):
    """POST /sketch passes a sketch reader's call to the driver (the P4 switch's: tests/test_p4_sketch.py)."""
    _, url = api
    got, reply = call(url + "/sketch", body)
    assert got == status and message in reply["error"], reply


def test_unknown_paths_list_the_endpoints_and_wrong_methods_get_405(api):
    _, url = api
    status, reply = call(url + "/nothing")
    assert status == 404 and "GET /state" in reply["endpoints"]
    status, reply = call(url + "/state", b"{}")
    assert status == 405 and "use GET" in reply["error"]
    for method, path, allowed in (("PUT", "/state", "GET"), ("DELETE", "/report", "POST"), ("GET", "/report", "POST")):
        reply = raw_request(url, f"{method} {path} HTTP/1.0\r\n\r\n".encode())
        assert reply.startswith(b"HTTP/1.0 405") and f"Allow: {allowed}".encode() in reply, (method, path)


def raw_request(url: str, data: bytes, wait: float = 10.0) -> bytes:
    """Send `data` as is on a new connection; everything the server sends until it closes (at most `wait` s)."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=wait) as connection:
        connection.sendall(data)
        chunks = []
        while chunk := connection.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


@pytest.mark.parametrize("head, body, status, message", [
    ("Content-Length: abc", b"{}", 400, b"Content-Length"),
    ("Content-Length: -5", b"{}", 400, b"Content-Length"),
    ("Content-Length: 99999999999", b"{}", 413, b"exceeds max_body of 4194304"),
    (None, b"[" * 100_000 + b"]" * 100_000, 400, b"nested too deep"),
    (None, b'{"time": 1, "interval": 1, "rate": 1e308, "top": []}', 400, b"rate: at most"),
    (None, b'{"time": 1, "interval": 1, "rate": NaN, "top": []}', 400, b"rate: must be a number"),
    (None, b'{"time": 1, "interval": 1, "rate": 5, "top": [{"key": "k", "rate": 1e300}]}', 400,
     b"top[0].rate: at most"),
])
def test_hostile_requests_get_a_4xx_not_a_traceback(api, head, body, status, message):
    core, url = api
    head = head or f"Content-Length: {len(body)}"
    reply = raw_request(url, f"POST /report HTTP/1.0\r\n{head}\r\n\r\n".encode() + body)
    assert reply.startswith(b"HTTP/1.0 %d" % status) and message in reply, reply[:300]
    assert b"Traceback" not in reply
    assert call(url + "/state")[0] == 200  # and the controller still serves


@pytest.mark.parametrize("line", [b"garbage\r\n\r\n", b"\x16\x03\x01\x00\xa5\x01\x00\r\n\r\n",
                                  b"GET /state HTTP/1\r\n\r\n", b"\r\n\r\n" * 3 + b"BREW /coffee\r\n\r\n"])
def test_a_garbage_request_line_gets_a_status_line(api, line):
    """Not HTTP (a typo, a TLS hello to the plain-text port): an HTTP 4xx with its status line, not a bare body."""
    _, url = api
    reply = raw_request(url, line)
    assert re.match(rb"HTTP/1\.[01] 4\d\d ", reply), reply[:200]
    assert b"Traceback" not in reply and b"<html" not in reply.lower()


def test_a_stalled_body_ends_the_connection(api):
    core, _ = api
    http = start_serving(serve(core, ("127.0.0.1", 0), body_timeout=1))
    url = f"http://127.0.0.1:{http.server_address[1]}"
    # closed by the server (an empty reply); had it waited, our own 10 s wait would end the test with an error
    reply = raw_request(url, b"POST /report HTTP/1.0\r\nContent-Length: 100\r\n\r\n{\"time\"")
    assert reply == b""
    assert call(url + "/state")[0] == 200
    http.shutdown()


def test_replies_are_strict_json():
    assert json.dumps(json_safe({"a": [float("nan"), 1.5, {"b": float("inf")}], "c": "x"}), allow_nan=False) == \
        '{"a": [null, 1.5, {"b": null}], "c": "x"}'


def test_bad_config_exits_2_naming_the_field(run_cli, tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('[[servers]]\nname = "a"\nip = "10.0.0.1"\nmac = "nonsense"\n')
    result = run_cli("controller", "--config", str(path))
    assert result.returncode == 2 and "servers[0].mac" in result.stderr
    result = run_cli("controller", "--config", str(tmp_path / "missing.toml"))
    assert result.returncode == 2 and "cannot read" in result.stderr


def test_a_server_down_is_warned_without_verbose(run_cli, memcached_pair, tmp_path):
    """No -v: an operator still hears that a server stopped answering (a closed port on 127.0.0.1 here)."""
    table = server_table(memcached_pair[:1]) + [{"name": "gone", "ip": "127.0.0.1", "mac": "02:00:00:00:00:09",
                                          "port": free_port()}]
    config = tmp_path / "mbalancer.toml"
    config.write_text("".join(f'[[servers]]\nname = "{s["name"]}"\nip = "{s["ip"]}"\nmac = "{s["mac"]}"\n'
                              f'port = {s["port"]}\n' for s in table)
                      + f'[controller]\nlisten = "127.0.0.1:{free_port()}"\n')
    result = run_cli("controller", "--config", str(config), "--duration", "3", timeout=60)
    assert result.returncode == 0, result.stderr
    warned = [line for line in result.stderr.splitlines() if "WARNING" in line and "server-down" in line]
    assert len(warned) == 1 and "(gone)" in warned[0] and "s0" not in warned[0]


def test_the_monitor_pushes_reports_to_a_running_controller(memcached_pair, tmp_path):
    """The real loop minus the switch: pcap -> mbalancer monitor --push -> mbalancer controller -> copies."""
    addresses = [MetaClient(ServerAddress("127.0.0.1", s.port)) for s in memcached_pair]
    ketama = KetamaHash([c.server for c in addresses])
    for index in range(10):
        key = b"key:%d" % index
        addresses[ketama.server_of(key)].set(key, StoredItem(b"value %d" % index, 0, -1, 0))
    port = free_port()
    config = tmp_path / "mbalancer.toml"
    config.write_text("".join(f'[[servers]]\nname = "{s["name"]}"\nip = "{s["ip"]}"\nmac = "{s["mac"]}"\n'
                              f'port = {s["port"]}\n' for s in server_table(memcached_pair))
                      + f'[balancing]\nhot = 3\nhysteresis = 2\n[controller]\nlisten = "127.0.0.1:{port}"\n')
    pcap = tmp_path / "gets.pcap"
    write_pcap(pcap, get_frames(zipf_trace(100, 1.0, 40_000, seed=3)), rate=10_000)
    controller = subprocess.Popen([str(MBALANCER), "-v", "controller", "--config", str(config)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        assert eventually(lambda: _reachable(url + "/state")), "controller did not start"
        monitor = subprocess.run([str(MBALANCER), "monitor", "--pcap", str(pcap), "--json", "--top", "3",
                                  "--push", url + "/report"], capture_output=True, text=True, timeout=60)
        assert monitor.returncode == 0, monitor.stderr
        assert eventually(lambda: len(call(url + "/state")[1]["hot_keys"]) == 3)
        state = call(url + "/state")[1]
        assert sorted(k["key"] for k in state["hot_keys"]) == ["key:0", "key:1", "key:2"]
        assert state["counters"]["reports"] == 4
        for index in range(3):
            assert all(c.get(b"key:%d" % index).value == b"value %d" % index for c in addresses)
    finally:
        controller.terminate()
        _, stderr = controller.communicate(timeout=10)
    assert controller.returncode == 0
    assert "warm key:0" in stderr  # -v logs each decision with its reason


def _reachable(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=1).close()
        return True
    except OSError:
        return False


def test_a_thousand_simultaneous_connections_are_all_answered(api):
    """The listen backlog and the server hold 1,000 clients connecting at once: none is refused or left waiting."""
    _, url = api
    port = int(url.rsplit(":", 1)[1])
    connections = [socket.socket() for _ in range(1000)]
    try:
        for connection in connections:
            connection.setblocking(False)
            connection.connect_ex(("127.0.0.1", port))
        answers, pending, deadline = {}, set(range(len(connections))), time.monotonic() + 120
        for index, connection in enumerate(connections):
            connection.setblocking(True)
            connection.settimeout(60)
            connection.sendall(b"GET /state HTTP/1.0\r\n\r\n")
        while pending and time.monotonic() < deadline:  # bounded: every connection answers or the time is up
            for index in list(pending):
                chunks = []
                while chunk := connections[index].recv(65536):
                    chunks.append(chunk)
                answers[index] = b"".join(chunks)
                pending.discard(index)
        assert not pending and all(a.startswith(b"HTTP/1.0 200") for a in answers.values())
    finally:
        for connection in connections:
            connection.close()


def test_clients_that_reset_or_stall_print_no_traceback_and_starve_nobody(api, caplog, capfd):
    _, url = api
    port = int(url.rsplit(":", 1)[1])
    stalled = []
    try:
        for _ in range(50):  # slow clients: a request line, then nothing
            connection = socket.create_connection(("127.0.0.1", port), timeout=10)
            connection.sendall(b"POST /report HTTP/1.1\r\nContent-Length: 100\r\n\r\n{")
            stalled.append(connection)
        for request in (b"GET /state HTTP/1.0\r\n\r\n", b"POST /report HTTP/1.0\r\nContent-Length: 50\r\n\r\n{"):
            connection = socket.create_connection(("127.0.0.1", port), timeout=10)  # reset mid-way: RST, no FIN
            connection.sendall(request)
            connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            connection.close()
        assert call(url + "/state")[0] == 200  # served while 50 clients stall
    finally:
        for connection in stalled:
            connection.close()
    assert call(url + "/decisions")[0] == 200
    assert not [r for r in caplog.records if r.exc_info or "Traceback" in r.getMessage()]
    assert "Traceback" not in capfd.readouterr().err


def test_the_monitor_says_in_one_line_when_the_p4_switchs_controller_is_not_there(run_cli, tmp_path):
    config = parse_config({"servers": [{"name": "s0", "ip": "127.0.0.1", "mac": "02:00:00:00:00:01", "port": 11211}],
                           "controller": {"listen": f"127.0.0.1:{free_port()}"}, "dataplane": {"kind": "p4"}})
    (tmp_path / "mbalancer.toml").write_text(config_toml(config))
    done = run_cli("monitor", "--config", str(tmp_path / "mbalancer.toml"), "--json", "--duration", "1")
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1].startswith("mbalancer monitor: the controller at http://127.0.0.1:")
    assert "Traceback" not in done.stderr


def test_shutting_down_while_clients_connect_logs_no_traceback(api, caplog):
    """A deposed leader stops its HTTP server while monitors still connect: the listener is closed by the serving
    loop itself, so waitress never accepts on a socket another thread closed (it logged that with a traceback)."""
    core, _ = api
    for _ in range(20):
        http = start_serving(serve(core, ("127.0.0.1", 0)))
        address = ("127.0.0.1", http.server_address[1])
        stop = time.monotonic() + 5

        def connect() -> None:
            while time.monotonic() < stop:  # until the port is closed, at most 5 s
                try:
                    socket.create_connection(address, timeout=1).close()
                except OSError:
                    return

        clients = [threading.Thread(target=connect) for _ in range(4)]
        for client in clients:
            client.start()
        time.sleep(0.05)
        with caplog.at_level(logging.WARNING, logger="waitress"):
            http.shutdown()
        stop = 0
        for client in clients:
            client.join(timeout=5)
        assert not [r for r in caplog.records if r.exc_info], caplog.text[-2000:]
