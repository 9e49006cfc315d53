"""The load generator: workload checks, the key stream, and runs against real memcached servers."""
from __future__ import annotations

import csv
import json
import signal
import socket
import subprocess

import numpy as np
import pytest

from experiments.simulation.zipf import zipf_weights
from experiments.workload.engine import run_load
from experiments.workload.keystream import KeyStream
from experiments.workload.populate import PopulateError, populate
from experiments.workload.plot import latency_title
from experiments.workload.records import NOT_ANSWERED, OUTCOME_CODE, summarise
from experiments.workload.spec import Workload, WorkloadError
from mbalancer.memcache.addresses import ServerAddress
from mbalancer.memcache.server import MemcachedServer, free_port


@pytest.fixture(scope="module")
def two_servers():
    with MemcachedServer() as a, MemcachedServer() as b:
        yield (ServerAddress(*a.address), ServerAddress(*b.address))


@pytest.fixture(scope="module")
def populated(two_servers):
    workload = Workload(servers=two_servers, keys=200, value_size=50)
    assert sum(populate(workload).values()) == 200
    return workload


def nobody_listens() -> ServerAddress:
    return ServerAddress("127.0.0.1", free_port())


# --- the workload and its key stream -----------------------------------------------------------------------------
@pytest.mark.parametrize("changes, option", [({"keys": 0}, "--keys"), ({"clients": 0}, "--clients"),
                                             ({"alpha": 0}, "--alpha"), ({"duration": -1}, "--duration"),
                                             ({"set_ratio": 1.5}, "--set-ratio"), ({"timeout": 0}, "--timeout"),
                                             ({"protocol": "sctp"}, "--protocol"), ({"hash": "skewed:0.2"}, "--hash"),
                                             ({"key_prefix": "a b"}, "--key-prefix"), ({"requests": -1}, "--requests"),
                                             ({"value_size": 2 << 20}, "--value-size"), ({"keys": 10**11}, "--keys"),
                                             ({"value_size": 70000, "set_ratio": 0.1}, "--value-size")])
def test_workload_check_names_the_option(changes, option):
    workload = Workload(servers=(ServerAddress("10.0.0.1"), ServerAddress("10.0.0.2")), **changes)
    with pytest.raises(WorkloadError, match=option):
        workload.check()


def test_large_values_are_fine_for_udp_gets_and_tcp_sets():
    servers = (ServerAddress("10.0.0.1"),)
    Workload(servers=servers, value_size=1 << 20).check()
    Workload(servers=servers, value_size=1 << 20, set_ratio=0.5, protocol="tcp").check()


def test_values_name_their_key():
    workload = Workload(servers=(ServerAddress("10.0.0.1"),), value_size=20)
    assert workload.value(0) == b"key:1|key:1|key:1|ke" and workload.key_names[0] == b"key:1"


def test_key_stream_follows_zipf_and_the_mix():
    weights = zipf_weights(50, 1.0)
    stream = KeyStream(weights, set_ratio=0.2, seed=3)
    draws = [stream.draw() for _ in range(200_000)]  # spans several chunks
    counts = np.bincount([k for k, _ in draws], minlength=50)
    expected = weights * len(draws)
    chi2 = ((counts - expected) ** 2 / expected).sum()
    assert chi2 < 90  # 49 degrees of freedom: p < 1e-4 beyond this
    assert np.mean([s for _, s in draws]) == pytest.approx(0.2, abs=0.005)
    again = KeyStream(weights, set_ratio=0.2, seed=3)
    assert [again.draw() for _ in range(1000)] == draws[:1000]


# --- runs against real memcached ---------------------------------------------------------------------------------
@pytest.mark.parametrize("protocol", ["udp", "tcp"])
def test_every_request_is_answered_by_its_home(populated, protocol):
    workload = Workload(servers=populated.servers, keys=200, value_size=50, clients=16, requests=3000,
                        protocol=protocol)
    records = run_load(workload)
    assert len(records) == 3000
    keys = np.frombuffer(records.key, dtype=np.int32)
    asked = np.frombuffer(records.asked, dtype=np.int16)
    assert (asked == np.array(workload.homes)[keys]).all()
    assert records.answered == records.asked  # no switch in between: the home answers
    summary = summarise(records, workload)
    assert summary["hits"] == 3000 and summary["timeouts"] == 0 and summary["strays"] == 0
    assert 0 < summary["p50_ms"] <= summary["p95_ms"] <= summary["p99_ms"] <= summary["max_ms"]
    assert sum(r["answered"] for r in summary["per_server"]) == 3000
    # the key ranks follow Zipf: key:1 is about 1/H_200 = 17% of requests
    assert np.mean(keys == 0) == pytest.approx(zipf_weights(200, 1.0)[0], abs=0.03)


@pytest.mark.parametrize("protocol", ["udp", "tcp"])
def test_sets_are_stored_and_read_back(two_servers, protocol):
    workload = Workload(servers=two_servers, keys=50, value_size=30, clients=4, requests=1000, set_ratio=0.3,
                        protocol=protocol, key_prefix=f"sets-{protocol}:", seed=7)
    summary = summarise(run_load(workload), workload)
    assert summary["stored"] == pytest.approx(300, abs=60)
    assert summary["hits"] + summary["misses"] + summary["stored"] == 1000
    assert summary["errors"] == 0


@pytest.mark.parametrize("protocol", ["udp", "tcp"])
def test_an_unreachable_server_costs_timeouts_not_the_run(populated, protocol):
    servers = (populated.servers[0], nobody_listens())
    # a timeout a busy machine's memcached on loopback answers within (0.1 s was not, once, with two CPU hogs)
    timeout = 0.5
    workload = Workload(servers=servers, keys=200, clients=8, requests=160, timeout=timeout, protocol=protocol)
    records = run_load(workload)
    assert len(records) == 160
    asked = np.frombuffer(records.asked, dtype=np.int16)
    answered = np.frombuffer(records.answered, dtype=np.int16)
    outcome = np.frombuffer(records.outcome, dtype=np.int8)
    lost = asked == 1
    assert lost.any() and (answered[lost] == NOT_ANSWERED).all()
    failed = OUTCOME_CODE["timeout"] if protocol == "udp" else OUTCOME_CODE["unreachable"]  # TCP: refused
    assert (outcome[lost] == failed).all()
    assert (answered[~lost] == 0).all()
    latency = np.frombuffer(records.latency, dtype=float)
    assert (latency[lost] >= timeout).all() and (latency[lost] < 3 * timeout).all()  # its timeout, once


def test_tcp_timeout_reopens_the_connection(populated):
    with socket.socket() as mute:  # the kernel completes connections (up to the backlog); nothing answers
        mute.bind(("127.0.0.1", 0))
        mute.listen(1024)
        servers = (populated.servers[0], ServerAddress(*mute.getsockname()))
        workload = Workload(servers=servers, keys=200, clients=2, requests=200, timeout=0.05, protocol="tcp")
        summary = summarise(run_load(workload), workload)
    # (misses: with the mute server in the list, some keys have a new home, which was not populated)
    assert summary["timeouts"] > 0 and summary["hits"] + summary["misses"] + summary["timeouts"] == 200
    assert summary["per_server"][1]["answered"] == 0


def test_duration_bounds_the_run(populated):
    workload = Workload(servers=populated.servers, keys=200, clients=8, duration=0.5)
    records = run_load(workload)
    assert 0.5 <= records.duration < 1.5 and len(records) > 0  # stopped at the bound, give or take a busy CPU


def test_populate_reports_an_unreachable_server():
    workload = Workload(servers=(nobody_listens(),), keys=10, timeout=0.2)
    with pytest.raises(PopulateError, match="cannot populate 127.0.0.1"):
        populate(workload)


# --- the command -------------------------------------------------------------------------------------------------
def test_load_command_contract(run_cli, two_servers, tmp_path):
    servers = ",".join(map(str, two_servers))
    result = run_cli("load", "--servers", servers, "--keys", "100", "--clients", "8", "--requests", "2000",
                     "--populate", "--key-prefix", "cli:", "--out", str(tmp_path), "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    for field in ("throughput", "p50_ms", "p95_ms", "p99_ms", "per_server", "hits", "misses", "timeouts",
                  "max_server_share", "imbalance_factor_measured", "imbalance_factor_expected"):
        assert field in summary
    assert summary["requests"] == 2000 and summary["hits"] == 2000
    assert json.loads((tmp_path / "summary.json").read_text()) == summary
    with open(tmp_path / "records.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2000 and rows[0]["outcome"] == "hit" and rows[0]["key"].startswith("cli:")
    assert rows[0]["op"] == "get" and rows[0]["asked"] in servers.split(",")
    assert (tmp_path / "load.png").stat().st_size > 10_000
    assert "populated 100 keys" in result.stderr and "load " in result.stderr  # progress


def test_load_command_human_output(run_cli, populated, tmp_path):
    result = run_cli("load", "--servers", ",".join(map(str, populated.servers)), "--keys", "200", "--duration",
                     "0.3", "--no-records", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "throughput" in result.stdout and "imbalance factor" in result.stdout
    assert not (tmp_path / "records.csv").exists() and "records.csv" not in result.stdout


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_stopped_load_keeps_what_it_measured(populated, tmp_path, signum):
    from tests.conftest import MBALANCER
    process = subprocess.Popen([str(MBALANCER), "load", "--servers", ",".join(map(str, populated.servers)),
                                "--keys", "200", "--duration", "120", "--out", str(tmp_path), "--json"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(1000):  # progress lines: the run is under way
            if process.stderr.readline().startswith("load ") or process.poll() is not None:
                break
        process.send_signal(signum)
        out, err = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 0, err
    summary = json.loads(out)
    assert summary["stopped_early"] is True and 0 < summary["duration_s"] < 120 and summary["requests"] > 0
    assert json.loads((tmp_path / "summary.json").read_text())["requests"] == summary["requests"]
    with open(tmp_path / "records.csv") as f:
        assert sum(1 for _ in csv.DictReader(f)) == summary["requests"]
    assert "stopped by a signal after" in err and str(tmp_path) in err and "Traceback" not in err


@pytest.mark.parametrize("args, message", [(["--servers", "no-such-host.invalid:1"], "--servers"),
                                           (["--servers", "10.0.0.1", "--out", "/proc/mb"], "--out: cannot make"),
                                           (["--servers", "10.0.0.1", "--keys", "100000000000"], "at most 10,000,000"),
                                           (["--servers", "10.0.0.1,10.0.0.2", "--hash", "skewed:0.3"], "--hash"),
                                           (["--servers", "10.0.0.1", "--clients", "0"], "--clients"),
                                           (["--servers", "10.0.0.1", "--duration", "0"], "nothing to do")])
def test_load_command_bad_options_exit_2(run_cli, args, message):
    result = run_cli("load", *args)
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr


def test_a_server_that_answers_nothing_is_named_and_fails_the_run(run_cli, populated, tmp_path):
    """A closed port among the servers: the run ends, says which server answered nothing and why that may be,
    and exits 1 (scripts must not take it for a measurement)."""
    dead = nobody_listens()
    result = run_cli("load", "--servers", f"{populated.servers[0]},{dead}", "--keys", "200", "--duration", "1",
                     "--timeout", "0.2", "--no-records", "--out", str(tmp_path), "--json")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert f"{dead} answered none of its" in result.stderr and "memcached -U" in result.stderr
    assert str(populated.servers[0]) not in result.stderr.split("answered none")[0].splitlines()[-1]
    assert json.loads(result.stdout)["timeouts"] > 0  # what was measured is still printed


def test_a_run_with_nothing_answered_says_so_in_its_plot():
    assert latency_title({"p50_ms": None, "p99_ms": None}) == "latency: no request was answered"
    assert latency_title({"p50_ms": 0.25, "p99_ms": 1.5}) == "latency: p50 0.250 ms, p99 1.500 ms"


def test_servers_may_be_given_by_name(run_cli, populated, tmp_path):
    named = ",".join(f"localhost:{s.port}" for s in populated.servers)
    result = run_cli("load", "--servers", named, "--keys", "200", "--requests", "200", "--no-records", "--out",
                     str(tmp_path), "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["servers"] == [str(s) for s in populated.servers] and summary["hits"] == 200


def test_load_command_populate_failure_exits_1(run_cli):
    result = run_cli("load", "--servers", str(nobody_listens()), "--populate", "--duration", "0")
    assert result.returncode == 1 and "cannot populate" in result.stderr and "Traceback" not in result.stderr


def test_large_values_reassemble_under_load(two_servers):
    workload = Workload(servers=two_servers, keys=6, value_size=300_000, clients=4, requests=60,
                        key_prefix="big:")
    populate(workload)
    summary = summarise(run_load(workload), workload)
    assert summary["hits"] == 60 and summary["strays"] == 0
