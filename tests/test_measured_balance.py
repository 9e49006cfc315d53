"""Balance as the plan estimates it next to the switch's and the servers' measurements (controller/measured_balance.py):
the pure computation, then a controller with real memcached servers and a switch played by the recording driver,
read through /state and /metrics. The switch and servers measured for real: tests/test_measured_balance_network.py."""
from __future__ import annotations

import json
import shutil
import subprocess
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from controller.core import ControllerCore
from controller.http_api import serve, start_serving
from controller.measured_balance import (UNSUPPORTED, GetCount, Spread, balance_state, gets_rate, plan_spread,
                                         servers_spread, switch_spread)
from controller.planner import Placement
from controller.switch_counts import Snapshot, SwitchCounts
from dataplanes.driver import Counters, KeyCounters
from dataplanes.recording.driver import RecordingDriver
from mbalancer.config import parse_config
from mbalancer.memcache.client import tcp_client
from tests.conftest import eventually

HOT = {b"k": Placement(b"k", 0, 0, (0, 1, 2), (1 / 3, 1 / 3, 1 / 3))}  # home 0, spread evenly over 3
CLIENTS = [600.0, 200.0, 200.0]  # where the clients sent their gets: 300 of server 0's are the hot key's


def read(replica_rates: dict, error: str | None = None) -> Snapshot:
    return Snapshot(Counters(), replica_rates=replica_rates, read_at=1.0, error=error)


def test_gets_the_switch_did_not_move_stay_at_home():
    """The issue's TCP case: the plan moved the hot key, the switch counted none of its gets."""
    plan = plan_spread([300.0, 350.0, 350.0], 0.5, HOT, {b"k": 300.0})
    switch = switch_spread(CLIENTS, HOT, read({}), 0.7)
    assert plan.imbalance == pytest.approx(1000 / 3 / 350) and plan.balanced == pytest.approx(200.0)
    assert switch.loads == (600.0, 200.0, 200.0) and switch.balanced == 0.0
    assert switch.shares[0] == pytest.approx(0.6) and switch.imbalance == pytest.approx(1000 / 3 / 600)
    state = balance_state([plan, switch])
    assert state["switch"]["busiest_share"] == 0.6 and state["switch"]["age_s"] == 0.7
    assert state["plan_minus_measured"]["switch"] == pytest.approx(plan.imbalance - switch.imbalance, abs=1e-4)


def test_gets_the_switch_moved_leave_the_home_as_counted():
    switch = switch_spread(CLIENTS, HOT, read({b"k": {0: 100.0, 1: 100.0, 2: 100.0}}), 0.2)
    assert switch.loads == (400.0, 300.0, 300.0) and switch.balanced == 200.0
    # a key cooled since the read moves nothing; a server index the config lacks moves nothing either
    cooled = switch_spread(CLIENTS, {}, read({b"k": {0: 100.0, 1: 100.0}}), 0.2)
    assert cooled.loads == tuple(CLIENTS) and cooled.balanced == 0.0
    odd = switch_spread(CLIENTS, HOT, read({b"k": {7: 50.0}}), 0.2)
    assert odd.loads == tuple(CLIENTS) and odd.balanced == 50.0


@pytest.mark.parametrize("clients, counts, supported, why", [
    (CLIENTS, read({}), False, UNSUPPORTED),
    (CLIENTS, Snapshot(), True, "the switch's counters not read yet"),
    (CLIENTS, Snapshot(error="reading counters: gone"), True, "reading counters: gone"),
    (None, read({b"k": {1: 10.0}}), True, "the last monitor report does not say where the clients sent"),
])
def test_a_switch_figure_that_cannot_be_had_says_why_never_zero(clients, counts, supported, why):
    spread = switch_spread(clients, HOT, counts, 1.0, supported)
    assert spread.loads is None and spread.imbalance is None and spread.shares is None
    assert why in spread.unavailable
    assert spread.as_state()["gets_per_s"] is None and spread.as_state()["imbalance"] is None
    if clients is None:  # the gets it balanced are known still
        assert spread.balanced == 10.0


def test_the_servers_own_counts_give_rates_between_two_reads():
    assert gets_rate(GetCount(100, 1.0), GetCount(400, 2.5)) == 200.0
    assert gets_rate(None, GetCount(100, 1.0)) is None  # read once
    assert gets_rate(GetCount(500, 1.0), GetCount(10, 2.0)) is None  # restarted: its count began again
    spread = servers_spread([GetCount(0, 1.0), GetCount(0, 1.0)], [GetCount(700, 2.0), GetCount(300, 2.0)],
                            [None, None], now=2.5)
    assert spread.loads == (700.0, 300.0) and spread.shares == (0.7, 0.3) and spread.age_s == 0.5
    missing = servers_spread([GetCount(0, 1.0), None], [GetCount(700, 2.0), None], [None, "not reached (refused)"],
                             now=3.0)
    assert missing.loads is None and missing.unavailable == "server 1: not reached (refused)"


def test_no_plan_yet_says_so():
    spread = plan_spread(None, 4.0, {}, {})
    assert spread.loads is None and "no monitor report" in spread.unavailable
    assert balance_state([spread, Spread("servers", (1.0, 1.0))])["plan_minus_measured"] == {"servers": None}


def test_switch_counts_give_each_replicas_rate():
    counts = SwitchCounts()
    counts.update(Counters(keys={b"k": KeyCounters(gets=10, per_replica={0: 4, 1: 6})}), now=1.0)
    counts.update(Counters(keys={b"k": KeyCounters(gets=310, per_replica={0: 104, 1: 206})}), now=3.0)
    assert counts.snapshot.replica_rates == {b"k": {0: 50.0, 1: 100.0}}
    counts.failed("reading counters: gone")
    assert counts.snapshot.error == "reading counters: gone" and counts.snapshot.read_at == 3.0


# --- a controller: real memcached servers, the switch played by the recording driver ------------------------------

@pytest.fixture
def controller(memcached_pair):
    servers = [{"name": f"s{i}", "ip": "127.0.0.1", "mac": f"02:00:00:00:00:0{i + 1}", "port": s.port}
               for i, s in enumerate(memcached_pair)]
    config = parse_config({"servers": servers, "balancing": {"hot": 1, "hysteresis": 1, "mode": "equal"},
                           "controller": {"poll_interval": 0}})
    driver = RecordingDriver()
    core = ControllerCore(config, driver, probe_health=True).start()  # probes: loopback servers of this test
    http = start_serving(serve(core, ("127.0.0.1", 0)))
    yield core, driver, f"http://127.0.0.1:{http.server_address[1]}", memcached_pair
    http.shutdown()
    core.stop()


def make_hot(core, servers) -> int:
    """Key `k` hot (2/3 of the clients' gets go to its home, half of them for it); returns its home."""
    home = core.key_hash.server_of(b"k")
    tcp_client(servers[home].address).set(b"k", b"v")
    measured = {f"127.0.0.1:{s.port}": 300.0 if i == home else 100.0 for i, s in enumerate(servers)}
    for second in (1.0, 2.0):  # the second report's plan has the key balanced "now"
        core.submit_report({"time": second, "interval": 1.0, "rate": 400.0, "servers": measured,
                            "top": [{"key": "k", "rate": 200.0}]})
        assert core.wait_idle() and b"k" in core.executor.hot
    return home


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as reply:
        return reply.read()


def metrics(url: str) -> dict[tuple[str, tuple], float]:
    text = get(url + "/metrics").decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_a_data_plane_without_counters_says_so_and_the_servers_are_measured(controller):
    core, driver, url, servers = controller
    home = make_hot(core, servers)
    client = tcp_client(servers[home].address)

    def home_serves_all() -> bool:  # gets the servers count themselves (the controller's probes count none)
        for _ in range(50):
            client.get(b"k")
        shares = json.loads(get(url + "/state"))["balance"]["servers"]["shares"]
        return shares is not None and shares[home] > 0.95
    assert eventually(home_serves_all, 10, every=0.1)
    balance = json.loads(get(url + "/state"))["balance"]
    assert balance["plan"]["imbalance"] == pytest.approx(1.0) and balance["plan"]["balanced_gets_per_s"] == 100.0
    assert balance["switch"]["unavailable"] == UNSUPPORTED and balance["switch"]["gets_per_s"] is None
    assert balance["plan_minus_measured"]["switch"] is None
    assert balance["servers"]["age_s"] < 3
    found = metrics(url)
    assert found[("mbalancer_load_available", (("source", "switch"),))] == 0
    assert ("mbalancer_load_imbalance_factor", (("source", "switch"),)) not in found  # absent, not 0
    assert found[("mbalancer_load_imbalance_factor", (("source", "plan"),))] == pytest.approx(1.0)
    assert found[("mbalancer_load_available", (("source", "servers"),))] == 1


def test_counters_the_switch_gives_are_measured(controller):
    core, driver, url, servers = controller
    driver.counts_gets = True  # the recording driver plays a switch that counted the key's gets
    home = make_hot(core, servers)
    other = 1 - home
    driver.counters = Counters(keys={b"k": KeyCounters(gets=0, per_replica={home: 0, other: 0})})
    assert eventually(lambda: core.switch_counts.snapshot.counters is driver.counters, 5)
    driver.counters = Counters(keys={b"k": KeyCounters(gets=200, per_replica={home: 100, other: 100})})
    assert eventually(lambda: core.switch_counts.snapshot.counters is driver.counters, 5)
    switch = json.loads(get(url + "/state"))["balance"]["switch"]
    assert switch["unavailable"] is None and switch["balanced_gets_per_s"] > 0
    moved = switch["balanced_gets_per_s"]
    assert switch["gets_per_s"][home] == pytest.approx(max(300.0 - moved, 0), abs=0.2)
    assert switch["gets_per_s"][other] == pytest.approx(100.0 + moved, abs=0.2)
    found = metrics(url)
    labels = (("address", f"127.0.0.1:{servers[other].port}"), ("name", f"s{other}"), ("server", str(other)),
              ("source", "switch"))
    assert found[("mbalancer_load_gets_per_second", labels)] == pytest.approx(100.0 + moved, abs=0.2)
    assert found[("mbalancer_load_available", (("source", "switch"),))] == 1


# --- the documented alert rules, run by Prometheus's own rule tester -----------------------------------------------

DEPLOYMENT = Path(__file__).resolve().parent.parent / "docs" / "deployment.md"
ALERT = "MbalancerBalanceNotAsPlanned"


def documented_rules() -> str:
    """The Prometheus rule file docs/deployment.md gives, as written there."""
    blocks = DEPLOYMENT.read_text().split("```yaml\n")[1:]
    found = [block.split("```")[0] for block in blocks if ALERT in block]
    assert len(found) == 1, f"{ALERT} is in {len(found)} yaml blocks of {DEPLOYMENT}"
    return found[0]


def series(source: str, values: str) -> dict:
    return {"series": f'mbalancer_load_imbalance_factor{{source="{source}"}}', "values": values}


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool missing (Debian's prometheus package)")
def test_the_documented_alert_fires_when_plan_and_measurement_differ_by_over_a_tenth(tmp_path):
    summary = ("the plan's imbalance factor and the one measured by the switch differ by 0.5: the switch does not "
               "balance what the plan moves (/state balance)")
    fires = {"exp_labels": {"source": "switch"}, "exp_annotations": {"summary": summary}}
    promtool_passes(tmp_path, [{
        "interval": "10s",
        "input_series": [series("plan", "1x12"), series("switch", "0.5x12"), series("servers", "0.95x12")],
        "alert_rule_test": [{"eval_time": "20s", "alertname": ALERT, "exp_alerts": []},  # not for 30 s yet
                            {"eval_time": "60s", "alertname": ALERT, "exp_alerts": [fires]}]}, {
        "interval": "10s",  # within 0.1 of the plan: quiet
        "input_series": [series("plan", "1x12"), series("switch", "0.92x12"), series("servers", "0.95x12")],
        "alert_rule_test": [{"eval_time": "60s", "alertname": ALERT, "exp_alerts": []}]}])


def promtool_passes(tmp_path, tests: list[dict]) -> None:
    """Prometheus's rule tester runs `tests` against the documented rule file."""
    (tmp_path / "rules.yml").write_text(documented_rules())
    (tmp_path / "tests.yml").write_text(json.dumps({"rule_files": ["rules.yml"], "evaluation_interval": "10s",
                                                    "tests": tests}))  # YAML is a superset of JSON
    result = subprocess.run(["promtool", "test", "rules", str(tmp_path / "tests.yml")], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool missing (Debian's prometheus package)")
def test_the_documented_alert_fires_while_gets_are_flooded_and_not_after(tmp_path):
    flooded = 'mbalancer_server_flooded_gets_total{name="s3"}'
    summary = ("gets balanced to s3 were flooded: the switch does not know where its configured mac is (a wrong mac, "
               "or a server not seen yet)")
    promtool_passes(tmp_path, [{
        "interval": "10s",
        "input_series": [{"series": flooded, "values": "0 0 5 9 9 9 9 9 9 9 9 9 9 9"}],  # 9 flooded, then none more
        "alert_rule_test": [
            {"eval_time": "10s", "alertname": "MbalancerGetsFlooded", "exp_alerts": []},
            {"eval_time": "40s", "alertname": "MbalancerGetsFlooded",
             "exp_alerts": [{"exp_labels": {"name": "s3"}, "exp_annotations": {"summary": summary}}]},
            {"eval_time": "130s", "alertname": "MbalancerGetsFlooded", "exp_alerts": []}]}])
