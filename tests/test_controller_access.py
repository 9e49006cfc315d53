"""Who may use the controller's HTTP API (controller/access.py, controller/tls_front.py): every endpoint without
credentials, with a wrong token, with a certificate of another CA; the read-only metrics_listen; keys hidden; the
monitor pushing with the config's credentials; a 1 MB body and slow clients that block nobody. All on 127.0.0.1."""
from __future__ import annotations

import json
import logging
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from controller.access import Access, access_for, hide_keys, key_hash, reader_access
from controller.core import ControllerCore
from controller.http_api import serve, start_serving
from dataplanes.recording.driver import RecordingDriver
from experiments.workload.trace import get_frames, write_pcap, zipf_trace
from mbalancer.config import ConfigError, parse_config
from mbalancer.memcache.meta import MetaClient, StoredItem
from mbalancer.memcache.server import free_port
from tests.certificates import certificates
from tests.conftest import MBALANCER, eventually
from tests.prometheus_server import PrometheusServer, available as prometheus_missing
from tests.test_controller_http import server_table

TOKEN = "a-secret-of-the-controller-0123456789"
REPORT = json.dumps({"time": 1.0, "interval": 1.0, "rate": 500.0,
                     "top": [{"key": "user:42:session", "rate": 400.0}]}).encode()
SKETCH = b'{"call": "counters", "args": []}'
# every endpoint, with what it answers once the credentials pass (the recording driver has no sketch: 503)
ENDPOINTS = [("GET", "/state", None, 200), ("GET", "/decisions", None, 200), ("GET", "/metrics", None, 200),
             ("POST", "/report", REPORT, 202), ("POST", "/sketch", SKETCH, 503), ("GET", "/nothing", None, 404)]
WAIT = 20.0  # seconds any one request may take before the test fails (bounds, not speeds)


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("certs")
    ca, server, client = certificates(folder / "ours")
    _, _, stranger = certificates(folder / "other")  # a client certificate another CA signed
    token = folder / "controller.token"
    token.write_text(TOKEN + "\n")
    return {"ca": ca, "server": server, "client": client, "stranger": stranger, "token": token}


@pytest.fixture(scope="module")
def core(memcached_pair):
    config = parse_config({"servers": server_table(memcached_pair), "balancing": {"hot": 1, "hysteresis": 1}})
    core = ControllerCore(config, RecordingDriver(), probe_health=False).start()
    yield core
    core.stop()


def settings(certs: dict[str, Path], token: bool = True, tls: bool = False, **more):
    """[controller] with the token file and/or HTTPS with client certificates."""
    table = {"token_file": str(certs["token"])} if token else {}
    if tls:
        table.update(tls_cert=f"{certs['server']}.crt", tls_key=f"{certs['server']}.key", tls_ca=f"{certs['ca']}.crt")
    return parse_config({"servers": [{"name": "s", "ip": "127.0.0.1", "mac": "02:00:00:00:00:01"}],
                         "controller": {**table, **more}}).controller


class Api:
    """A running HTTP API on 127.0.0.1 with `access`; stopped by the fixture."""

    def __init__(self, core: ControllerCore, access: Access, read_only: bool = False, body_timeout: int = 2):
        self.access = access
        self.http = start_serving(serve(core, ("127.0.0.1", 0), body_timeout, access, read_only))
        self.port = self.http.server_address[1]
        self.url = f"{self.http.scheme}://127.0.0.1:{self.port}"


@pytest.fixture
def apis():
    started: list[Api] = []

    def start(*args, **kwargs) -> Api:
        started.append(Api(*args, **kwargs))
        return started[-1]
    yield start
    for api in started:
        api.http.shutdown()


def client_context(certs: dict[str, Path], who: str | None = "client") -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=f"{certs['ca']}.crt")
    if who:
        context.load_cert_chain(f"{certs[who]}.crt", f"{certs[who]}.key")
    return context


def call(url: str, method: str = "GET", body: bytes | None = None, token: str | None = None,
         context: ssl.SSLContext | None = None) -> tuple[int, bytes]:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    request = urllib.request.Request(url, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=WAIT, context=context) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def refused_counts(url: str, token: str | None = None, context: ssl.SSLContext | None = None) -> dict[str, float]:
    status, text = call(url + "/metrics", token=token, context=context)
    assert status == 200
    return {line.split('"')[1]: float(line.rsplit(" ", 1)[1]) for line in text.decode().splitlines()
            if line.startswith("mbalancer_http_refused_total{")}


# --- starting ---------------------------------------------------------------------------------------------------------
def test_off_loopback_with_neither_a_token_nor_client_certificates_the_controller_refuses_to_start(run_cli, tmp_path):
    config = tmp_path / "mbalancer.toml"
    config.write_text('[[servers]]\nname = "s"\nip = "127.0.0.1"\nmac = "02:00:00:00:00:01"\n'
                      f'[controller]\nlisten = "0.0.0.0:{free_port()}"\n')
    result = run_cli("controller", "--config", str(config), "--duration", "1", timeout=60)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert "controller.listen: 0.0.0.0:" in last and "is reached from other machines: give token_file or tls_ca" in last


def test_credentials_that_cannot_be_used_are_named_in_one_line(certs, tmp_path):
    short = tmp_path / "short.token"
    short.write_text("tiny\n")
    for table, field in (({"token_file": str(short)}, "controller.token_file"),
                         ({"token_file": str(tmp_path / "none")}, "controller.token_file"),
                         ({"tls_cert": f"{certs['server']}.crt", "tls_key": f"{certs['client']}.key"},
                          "controller.tls_cert"),
                         ({"tls_ca": f"{certs['ca']}.crt"}, "controller.tls_ca")):
        with pytest.raises(ConfigError, match=field) as refused:
            access_for(settings(certs, token=False, **table), "127.0.0.1:1")
        assert "\n" not in str(refused.value)
    with pytest.raises(ConfigError, match="tls_cert and tls_key go together"):
        settings(certs, token=False, tls_cert="x.crt")
    assert access_for(settings(certs, token=False), "127.0.0.1:8080").token is None  # loopback: nothing needed


# --- a token ----------------------------------------------------------------------------------------------------------
def test_every_endpoint_refuses_a_missing_or_wrong_token_in_one_line_and_counts_it(core, certs, apis, caplog):
    api = apis(core, access_for(settings(certs), "127.0.0.1:0"))
    caplog.set_level(logging.WARNING, logger="controller.access")
    for method, path, body, answer in ENDPOINTS:
        for token, why in ((None, "no token"), ("not-the-secret-at-all-000", "wrong token"),
                           (TOKEN + "x", "wrong token")):
            status, reply = call(api.url + path, method, body, token)
            assert status == 401, (method, path, token)
            assert json.loads(reply)["error"].startswith(why + ": ") and b"\n" not in reply.strip()
        assert call(api.url + path, method, body, TOKEN)[0] == answer, (method, path)
    counts = refused_counts(api.url, TOKEN)
    assert counts == {"no_token": len(ENDPOINTS), "wrong_token": 2 * len(ENDPOINTS), "tls": 0}
    assert "refused GET /state from 127.0.0.1: no token" in caplog.text


def test_a_flood_of_refusals_logs_a_line_a_second_at_most(core, certs, apis, caplog):
    api = apis(core, access_for(settings(certs), "127.0.0.1:0"))
    caplog.set_level(logging.WARNING, logger="controller.access")
    for _ in range(50):
        assert call(api.url + "/report", "POST", REPORT)[0] == 401
    lines = [r for r in caplog.records if r.name == "controller.access"]
    assert 1 <= len(lines) < 10
    assert refused_counts(api.url, TOKEN)["no_token"] == 50


# --- TLS with client certificates -------------------------------------------------------------------------------------
def tls_refused(url: str, context: ssl.SSLContext | None) -> None:
    """A request over this context (None: plain HTTP) fails: the handshake is refused."""
    with pytest.raises(OSError):  # urllib's URLError, ssl.SSLError, a connection reset
        call(url, context=context)


def test_every_endpoint_over_https_needs_a_client_certificate_of_the_ca(core, certs, apis):
    api = apis(core, access_for(settings(certs, token=False, tls=True), "127.0.0.1:0"))
    assert api.url.startswith("https://")
    ours = client_context(certs)
    for method, path, body, answer in ENDPOINTS:
        assert call(api.url + path, method, body, context=ours)[0] == answer, (method, path)
        for who in (None, "stranger"):  # no certificate; one another CA signed
            tls_refused(api.url + path, client_context(certs, who))
    tls_refused(f"http://127.0.0.1:{api.port}/state", None)  # plain HTTP to the HTTPS port
    assert eventually(lambda: refused_counts(api.url, context=ours)["tls"] == 2 * len(ENDPOINTS) + 1)


def test_with_both_a_valid_certificate_still_needs_the_token(core, certs, apis):
    api = apis(core, access_for(settings(certs, tls=True), "127.0.0.1:0"))
    ours = client_context(certs)
    assert call(api.url + "/state", context=ours)[0] == 401
    assert call(api.url + "/state", token="not-the-secret-at-all-000", context=ours)[0] == 401
    assert call(api.url + "/state", token=TOKEN, context=ours)[0] == 200
    tls_refused(api.url + "/state", client_context(certs, "stranger"))
    assert eventually(lambda: refused_counts(api.url, TOKEN, ours) == {"no_token": 1, "wrong_token": 1, "tls": 1})


# --- reads ------------------------------------------------------------------------------------------------------------
def test_metrics_listen_serves_reads_without_credentials_and_refuses_writes(core, certs, apis):
    main = apis(core, access_for(settings(certs), "127.0.0.1:0"))
    reads = apis(core, reader_access(main.access), read_only=True)
    for path in ("/metrics", "/state", "/decisions"):
        assert call(reads.url + path)[0] == 200
        assert call(main.url + path)[0] == 401
    for path, body in (("/report", REPORT), ("/sketch", SKETCH)):
        status, reply = call(reads.url + path, "POST", body)
        assert status == 403 and "serves reads only" in json.loads(reply)["error"]
    assert refused_counts(reads.url)["no_token"] == 3  # the main listener's refusals, seen from the reads' one


def test_hidden_keys_show_as_hashes_only(core, certs, apis, memcached_pair):
    api = apis(core, access_for(settings(certs, hide_keys=True), "127.0.0.1:0"))
    home = core.key_hash.server_of(b"user:42:session")
    MetaClient(core.config.servers[home].address).set(b"user:42:session", StoredItem(b"v", 0, -1, 0))
    assert call(api.url + "/report", "POST", REPORT, TOKEN)[0] == 202
    assert core.wait_idle()
    hashed = key_hash(b"user:42:session")
    for path in ("/state", "/decisions", "/metrics"):
        status, text = call(api.url + path, token=TOKEN)
        assert status == 200 and b"user:42" not in text and hashed.encode() in text, path
    state = json.loads(call(api.url + "/state", token=TOKEN)[1])
    assert [k["key"] for k in state["hot_keys"]] == [hashed]


def test_hiding_keys_replaces_them_where_texts_quote_them_and_nowhere_else():
    data = {"hot_keys": [{"key": "a"}, {"key": "user:7"}], "counters": {"data_plane": {"keys": {"user:7": {}}}},
            "decisions": [{"key": "user:7", "reason": "warm user:7: a plan (user:7)"}], "note": "a banana"}
    hidden = hide_keys(data)
    assert hidden["counters"]["data_plane"]["keys"] == {key_hash(b"user:7"): {}}
    assert hidden["decisions"][0]["reason"] == (f"warm {key_hash(b'user:7')}: {key_hash(b'a')} plan "
                                                f"({key_hash(b'user:7')})")
    assert hidden["note"] == f"{key_hash(b'a')} banana"  # a key standing alone is hidden; inside a word it is not


@pytest.mark.skipif(prometheus_missing() is not None, reason=str(prometheus_missing()))
def test_prometheus_scrapes_through_the_token_and_a_client_certificate(core, certs, apis, tmp_path):
    """The default: reads take the credentials, which Prometheus sends (Debian's prometheus, on 127.0.0.1)."""
    api = apis(core, access_for(settings(certs, tls=True), "127.0.0.1:0"))
    scrape = {"scheme": "https", "authorization": {"credentials_file": str(certs["token"])},
              "tls_config": {"ca_file": f"{certs['ca']}.crt", "cert_file": f"{certs['client']}.crt",
                             "key_file": f"{certs['client']}.key"}}
    with PrometheusServer(tmp_path, [f"127.0.0.1:{api.port}"], scrape) as prometheus:
        assert eventually(prometheus.targets_up, timeout=30)
        assert prometheus.query("mbalancer_hot_keys")
    (tmp_path / "bare").mkdir()
    bare = {"scheme": "https", "tls_config": {"ca_file": f"{certs['ca']}.crt"}}  # no token, no client certificate
    with PrometheusServer(tmp_path / "bare", [f"127.0.0.1:{api.port}"], bare) as prometheus:
        assert eventually(lambda: [s["value"][1] for s in prometheus.query('up{job="mbalancer"}')] == ["0"], 30)


def test_the_ryu_app_takes_the_token_and_refuses_https_in_one_line(certs, tmp_path, memcached_pair):
    """ryu-manager's HTTP API is controller/http_api.py's respond on Ryu's WSGI server: the same token, no TLS."""
    from controller.ryu_manager import launch
    from mbalancer.processes import stop_process
    listen = f"127.0.0.1:{free_port()}"
    servers = "".join(f'[[servers]]\nname = "{s["name"]}"\nip = "{s["ip"]}"\nmac = "{s["mac"]}"\nport = {s["port"]}\n'
                      for s in server_table(memcached_pair))
    config = tmp_path / "ryu.toml"
    config.write_text(servers + f'[controller]\nlisten = "{listen}"\ntoken_file = "{certs["token"]}"\n')
    log = tmp_path / "ryu.log"
    with open(log, "w") as out:
        process = launch(config, out)
    try:
        assert eventually(lambda: process.poll() is not None or _answers(f"http://{listen}/state"), 60), \
            log.read_text()
        assert call(f"http://{listen}/state")[0] == 401
        assert call(f"http://{listen}/report", "POST", REPORT, "not-the-secret-at-all-000")[0] == 401
        assert call(f"http://{listen}/state", token=TOKEN)[0] == 200
    finally:
        stop_process(process, grace=20)
    config.write_text(servers + f'[controller]\nlisten = "{listen}"\ntls_cert = "{certs["server"]}.crt"\n'
                      f'tls_key = "{certs["server"]}.key"\n')
    with open(log, "w") as out:
        process = launch(config, out)
    assert process.wait(timeout=60) != 0
    said = log.read_text()
    assert "mbalancer: controller.tls_cert: the Ryu app's HTTP server (Ryu's WSGI) serves no HTTPS" in said
    assert "Traceback" not in said


def _answers(url: str) -> bool:
    """Whether anything answers HTTP at `url` (any status)."""
    try:
        call(url)
        return True
    except OSError:
        return False


# --- the monitor ------------------------------------------------------------------------------------------------------
def test_the_monitor_pushes_with_the_configs_token_and_certificate(memcached_pair, certs, tmp_path):
    """`mbalancer controller` with HTTPS, client certificates and a token, `mbalancer monitor` with its own config:
    the reports get in; with a wrong token they are refused and counted, and the monitor says why."""
    port, reads = free_port(), free_port()
    servers = "".join(f'[[servers]]\nname = "{s["name"]}"\nip = "{s["ip"]}"\nmac = "{s["mac"]}"\nport = {s["port"]}\n'
                      for s in server_table(memcached_pair))
    controller_config = tmp_path / "controller.toml"
    controller_config.write_text(
        servers + f'[balancing]\nhot = 3\nhysteresis = 1\n[controller]\nlisten = "127.0.0.1:{port}"\n'
        f'metrics_listen = "127.0.0.1:{reads}"\ntoken_file = "{certs["token"]}"\n'
        f'tls_cert = "{certs["server"]}.crt"\ntls_key = "{certs["server"]}.key"\ntls_ca = "{certs["ca"]}.crt"\n')
    monitor_config = tmp_path / "monitor.toml"
    wrong = tmp_path / "wrong.token"
    wrong.write_text("another-secret-0123456789\n")
    pcap = tmp_path / "gets.pcap"
    write_pcap(pcap, get_frames(zipf_trace(100, 1.0, 20_000, seed=3)), rate=10_000)
    controller = subprocess.Popen([str(MBALANCER), "controller", "--config", str(controller_config)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        assert eventually(lambda: _answers(f"http://127.0.0.1:{reads}/state"), timeout=30), controller.poll()

        def monitor(token: Path) -> subprocess.CompletedProcess:
            monitor_config.write_text(
                servers + f'[controller]\nlisten = "127.0.0.1:{port}"\ntoken_file = "{token}"\n'
                f'tls_cert = "{certs["client"]}.crt"\ntls_key = "{certs["client"]}.key"\n'
                f'tls_ca = "{certs["ca"]}.crt"\n')
            return subprocess.run([str(MBALANCER), "monitor", "--pcap", str(pcap), "--json", "--port", "11211",
                                   "--config", str(monitor_config)], capture_output=True, text=True, timeout=60)
        done = monitor(certs["token"])
        assert done.returncode == 0 and ", 0 failed pushes" in done.stderr, done.stderr
        assert eventually(lambda: json.loads(call(f"http://127.0.0.1:{reads}/state")[1])["counters"]["reports"] == 2)
        done = monitor(wrong)
        assert done.returncode == 0 and "401: wrong token" in done.stderr and "0 pushed, 2 failed" in done.stderr
        metrics = call(f"http://127.0.0.1:{reads}/metrics")[1].decode()
        assert 'mbalancer_http_refused_total{reason="wrong_token"} 2.0' in metrics
    finally:
        controller.terminate()
        _, stderr = controller.communicate(timeout=20)
    assert controller.returncode == 0, stderr
    assert f"https://127.0.0.1:{port}/state" in stderr and "HTTPS with client certificates and a token" in stderr
    assert "Traceback" not in stderr


@pytest.mark.parametrize("body, message", [
    (b"{not json", b"Expecting"), (b"[" * 100_000 + b"]" * 100_000, b"nested too deep"),
    (b'{"time": 1, "interval": 1, "rate": 1e308, "top": []}', b"rate: at most"),
])
def test_behind_the_token_bad_reports_still_get_a_400(core, certs, apis, body, message):
    api = apis(core, access_for(settings(certs), "127.0.0.1:0"))
    status, reply = call(api.url + "/report", "POST", body, TOKEN)
    assert status == 400 and message in reply
    assert call(api.url + "/report", "POST", body)[0] == 401  # and without it, a 401 before the body is read


def test_the_controller_decides_while_a_flood_of_requests_is_refused(core, certs, apis):
    """2,000 requests without the token, from 4 clients at once, while reports with it come in: each refused request
    gets its 401, and every report is decided."""
    api = apis(core, access_for(settings(certs), "127.0.0.1:0"))
    before = core.counts["reports"]

    def flood() -> list[int]:
        return [call(api.url + "/report", "POST", REPORT)[0] for _ in range(500)]
    with ThreadPoolExecutor(4) as pool:
        floods = [pool.submit(flood) for _ in range(4)]
        for n in range(5):
            report = json.loads(REPORT)
            assert call(api.url + "/report", "POST", json.dumps({**report, "time": 10.0 + n}).encode(), TOKEN)[0] == 202
        statuses = [status for f in floods for status in f.result(timeout=120)]
    assert statuses == [401] * 2000
    assert core.wait_idle() and core.counts["reports"] == before + 5


# --- clients that hold on ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("tls", [False, True], ids=["token", "https"])
def test_a_megabyte_body_and_slow_clients_block_nobody(core, certs, apis, tls):
    """While one client sends 1 MB slowly, 30 others stall in their requests (or, over HTTPS, in their handshakes),
    every other client is answered; each stalled one is closed by the server, within a bound."""
    api = apis(core, access_for(settings(certs, tls=tls), "127.0.0.1:0"), body_timeout=2)
    context = client_context(certs) if tls else None
    slow = [socket.create_connection(("127.0.0.1", api.port), timeout=WAIT) for _ in range(30)]
    try:
        with ThreadPoolExecutor(1) as pool:
            big = pool.submit(_send_slowly, api, context, b"{" + b" " * (1 << 20))
            for connection in slow:
                connection.sendall(b"\x16\x03\x01" if tls else b"POST /report HTTP/1.1\r\n")  # then nothing
            for _ in range(5):
                assert call(api.url + "/state", token=TOKEN, context=context)[0] == 200
                assert call(api.url + "/state", context=context)[0] == 401
            assert big.result(timeout=WAIT).startswith(b"HTTP/1.0 400")  # it was read whole, and answered
        for connection in slow:
            assert _closed_by_server(connection)
    finally:
        for connection in slow:
            connection.close()


def _closed_by_server(connection: socket.socket) -> bool:
    """Read until the server closes (whatever it sends first: nothing, an HTTP 4xx); a bounded wait."""
    for _ in range(100):
        if not connection.recv(65536):  # WAIT s at most each (the socket's timeout): socket.timeout fails the test
            return True
    return False


def _send_slowly(api: Api, context: ssl.SSLContext | None, body: bytes) -> bytes:
    """POST `body` (not JSON) in 64 KB pieces a tenth of a second apart; the first bytes of the answer."""
    connection = socket.create_connection(("127.0.0.1", api.port), timeout=WAIT)
    if context is not None:
        connection = context.wrap_socket(connection, server_hostname="127.0.0.1")
    with connection:
        connection.sendall(f"POST /report HTTP/1.0\r\nAuthorization: Bearer {TOKEN}\r\n"
                           f"Content-Length: {len(body)}\r\n\r\n".encode())
        for start in range(0, len(body), 1 << 16):
            connection.sendall(body[start:start + (1 << 16)])
            time.sleep(0.1)
        return connection.recv(65536)
