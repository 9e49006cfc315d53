"""Defects an outside reading of the core found (issue 46), each held by a test that failed before its fix:
- the check for writes that go around the switch ran only when some event woke the core's worker;
- GET /state answered 500 when a switch box could not be reached.
(The slot book's refusals are tests/test_slot_book_refusals.py.)"""
from __future__ import annotations

import json
import urllib.request

from controller.core import ControllerCore
from controller.http_api import serve, start_serving
from dataplanes.agent import Settings
from dataplanes.agent.client import AgentDriver
from dataplanes.recording.driver import RecordingDriver
from mbalancer.config import parse_config
from mbalancer.memcache.meta import MetaClient, StoredItem
from tests.conftest import eventually
from tests.switch_agent import AgentProcess

POLL = 0.2  # s: controller.poll_interval in these tests
WAIT = 15.0  # s any one wait may take (the poll is due every POLL: a busy machine is slower, never wrong)


def servers_of(pair) -> list[dict]:
    return [{"name": f"s{i}", "ip": "127.0.0.1", "mac": f"02:00:00:00:00:0{i + 1}", "port": s.port}
            for i, s in enumerate(pair)]


def made_hot(core: ControllerCore, key: bytes, value: bytes) -> int:
    """The key set at its home, reported hot, copied and cleared; its home."""
    home = core.key_hash.server_of(key)
    MetaClient(core.config.servers[home].address).set(key, StoredItem(value, 0, -1, 0))
    core.submit_report({"time": 1.0, "interval": 1.0, "rate": 100.0, "top": [{"key": key.decode(), "rate": 90.0}]})
    assert core.wait_idle()
    assert eventually(lambda: [k["state"] for k in core.state()["hot_keys"]] == ["clean"], WAIT)
    return home


def test_a_write_around_the_switch_is_found_by_the_poll_with_no_other_event(memcached_pair):
    """Nothing wakes the worker here (no monitor, no probes, no mirrors): only the poll's own schedule finds the
    write made at the home itself, and the replica gets the new value."""
    config = parse_config({"servers": servers_of(memcached_pair), "balancing": {"hot": 1, "hysteresis": 1},
                           "controller": {"poll_interval": POLL}})
    core = ControllerCore(config, RecordingDriver(), probe_health=False).start()
    try:
        home = made_hot(core, b"around", b"old")
        replica = 1 - home
        assert MetaClient(config.servers[replica].address).get(b"around").value == b"old"
        MetaClient(config.servers[home].address).set(b"around", StoredItem(b"new", 0, -1, 0))  # no switch saw it
        assert eventually(lambda: MetaClient(config.servers[replica].address).get(b"around").value == b"new", WAIT), \
            "the write at the home was never found: the poll did not run"
        assert core.executor.unseen_writes == 1
        assert eventually(lambda: [k["state"] for k in core.state()["hot_keys"]] == ["clean"], WAIT)
    finally:
        core.stop()


def test_state_answers_while_the_switch_agent_cannot_be_reached(memcached_pair, tmp_path):
    agent = AgentProcess(tmp_path, "none", {})
    config = parse_config({"servers": servers_of(memcached_pair)})
    driver = AgentDriver(Settings(address=agent.address, token_file=str(agent.token_file), timeout=2.0))
    core = ControllerCore(config, driver, probe_health=False).start()
    http = start_serving(serve(core, ("127.0.0.1", 0)))
    try:
        assert core.state()["switches_gone"] == []
        agent.stop()
        state = core.state()
        assert state["switches_gone"] is None and "unreachable" in state["switches_unknown"], state
        with urllib.request.urlopen(f"http://127.0.0.1:{http.server_address[1]}/state", timeout=10) as reply:
            assert reply.status == 200 and "unreachable" in json.loads(reply.read())["switches_unknown"]
    finally:
        http.shutdown()
        core.stop()


class SteppedClock:
    """The core's clock, moved by the test."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_state_and_metrics_say_how_old_the_report_and_the_counters_are(memcached_pair):
    """issue 50: a stopped monitor left stale numbers with nothing to tell; now /state and /metrics give the last
    report's age and the counters', and /state names what is stale."""
    clock = SteppedClock()
    config = parse_config({"servers": servers_of(memcached_pair), "monitor": {"interval": 1.0}})
    core = ControllerCore(config, RecordingDriver(), clock=clock, probe_health=False).start()
    http = start_serving(serve(core, ("127.0.0.1", 0)))
    try:
        assert core.state()["freshness"]["stale"] == []  # just started
        clock.now += 5.0
        assert "no monitor has reported" in " ".join(core.state()["freshness"]["stale"])
        core.submit_report({"time": 1.0, "interval": 1.0, "rate": 100.0, "top": []})
        assert core.wait_idle()
        clock.now += 1.0
        fresh = core.state()["freshness"]
        assert fresh["last_report_age_s"] == 1.0 and not any("report" in why for why in fresh["stale"]), fresh
        clock.now += 9.0  # the monitor stopped
        stale = core.state()["freshness"]
        assert stale["last_report_age_s"] == 10.0 and "no monitor report for 10.0 s" in stale["stale"][0], stale
        with urllib.request.urlopen(f"http://127.0.0.1:{http.server_address[1]}/metrics", timeout=10) as reply:
            text = reply.read().decode()
        assert "mbalancer_report_age_seconds 10.0" in text and "mbalancer_switch_counters_age_seconds" in text
    finally:
        http.shutdown()
        core.stop()
