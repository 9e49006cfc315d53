"""The switch agent (`mbalancer switch serve`) and its controller-side driver: credentials, the protocol version,
message bounds, bad calls, arbitration between controllers by election id (a deposed controller's calls refused by
the agent itself), a controller killed and an agent restarted. The agent here runs the recording data plane (its
driver has no switch), so what is tested is the agent; tests/test_driver_contract.py drives the real eBPF switch
through an agent, and the contract's every test with it."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import pytest

from dataplanes.agent import Settings
from dataplanes.agent.client import AgentDriver
from dataplanes.agent.codec import dumps, loads
from dataplanes.agent.wire import CALL, HELLO, PROTOCOL_KEY
from dataplanes.driver import (Counters, Distrust, DriverError, HotKeyInstall, KeyCounters, FoundKey, ReplicaWeight,
                               StreamId, WriteStamp)
from dataplanes.pipeline import HeavyKey
from mbalancer.memcache.server import free_port
from mbalancer.settings import Server
from tests.certificates import certificates as _certificates
from tests.conftest import MBALANCER, eventually, process_running
from tests.switch_agent import AgentProcess, agent_config, request

SERVERS = [Server("s1", "10.0.0.1", "02:00:00:00:00:01"), Server("s2", "10.0.0.2", "02:00:00:00:00:02")]
WAIT = 15.0  # seconds any one wait below may take


@pytest.fixture
def agent(tmp_path):
    served = AgentProcess(tmp_path, "none", {})
    yield served
    served.stop()


def driver_for(agent: AgentProcess, **changes) -> AgentDriver:
    fields = {"address": agent.address, "token_file": str(agent.token_file), "timeout": 5.0, **changes}
    return AgentDriver(Settings(**fields))


def raw_call(agent: AgentProcess, body: bytes, path: str = CALL, **metadata) -> bytes:
    """A request as another program would send it; grpc.RpcError when the agent refuses it."""
    return request(agent.address, agent.token_file, path, body, **metadata)


def refusal(call) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as refused:
        call()
    return refused.value.code(), refused.value.details()


def until(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_every_value_of_the_driver_interface_crosses_the_wire_and_nothing_else_does():
    values = [None, True, 3, 0.25, "x", b"\x00\xff", (1, (2,)), [b"a"], {b"k": DriverError("no")},
              HotKeyInstall(b"k", 0, (ReplicaWeight(1, 0.5),)), WriteStamp(3, ((1, 2), (0,))), StreamId("a", 1, "b", 2),
              FoundKey(b"k", 0, (ReplicaWeight(0, 0.5), ReplicaWeight(1, 0.5)), WriteStamp(0, ((4, 1),)),
                       Distrust.LEASE_EXPIRED), Counters({b"k": KeyCounters(5, 1, 2, {0: 3})}, 1, 2, {"packets": 9}),
              HeavyKey(b"k", 7, "10.0.0.1:11211"), SERVERS[0]]
    back = loads(dumps(values))
    assert str(back[8][b"k"]) == "no" and back[:8] == values[:8] and back[9:] == values[9:]
    for bad in (b'{"$c": "Popen", "f": {}}', b'{"$b": "***"}', b"[", b'{"$d": [[1]]}', b'{"$x": 1}',
                b'{"$c": "ReplicaWeight", "f": {"nope": 1}}', b"[" * 100000):
        with pytest.raises(ValueError):
            loads(bad)
    with pytest.raises(ValueError, match="cannot send a set"):
        dumps({1, 2})


def test_a_controller_drives_the_agent_and_a_bad_call_gets_one_line(agent):
    driver = driver_for(agent, kind="none")
    assert driver.attach(SERVERS, lambda frame: None) == []
    assert driver.install_hot_keys([HotKeyInstall(b"k", 0, (ReplicaWeight(0, 0.5), ReplicaWeight(1, 0.5))),
                                    HotKeyInstall(b"x" * 251, 0, (ReplicaWeight(0, 1),))]).keys() == {b"x" * 251}
    assert driver.write_stamps([b"k"])[b"k"].writes == 0
    with pytest.raises(DriverError, match="1 to 250"):
        driver.install_hot_key(b"y" * 251, 0, [ReplicaWeight(0, 1)])
    # what no controller of ours sends: refused in one line, the agent goes on
    assert refusal(lambda: raw_call(agent, b"garbage"))[0] == grpc.StatusCode.INVALID_ARGUMENT
    assert "no record 'Popen'" in refusal(lambda: raw_call(agent, b'{"$c": "Popen", "f": {}}'))[1]
    assert refusal(lambda: raw_call(agent, dumps({"method": "read_counters", "args": ()})))[0] == \
        grpc.StatusCode.PERMISSION_DENIED  # a session that is not the primary's
    code, details = refusal(lambda: raw_call(agent, b"x" * (5 << 20)))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, details
    assert "Traceback" not in agent.log
    assert set(driver.read_counters().keys) == {b"k"}  # still serving
    driver.close()


def test_wrong_token_old_protocol_unreachable_agent_and_wrong_kind_are_refused_in_one_line(agent, tmp_path):
    wrong = tmp_path / "wrong-token"
    wrong.write_text("0123456789abcdef0123\n")
    with pytest.raises(DriverError, match="UNAUTHENTICATED: wrong or missing token") as refused:
        driver_for(agent, token_file=str(wrong))
    assert "\n" not in str(refused.value)
    code, details = refusal(lambda: raw_call(agent, b"{}", HELLO, **{PROTOCOL_KEY: "99"}))
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert details == "the controller speaks agent protocol 99, this agent 1: run the same MBalancer release on both"
    with pytest.raises(DriverError, match="runs the none data plane, not ebpf"):
        driver_for(agent, kind="ebpf")
    closed = f"127.0.0.1:{free_port()}"
    started = time.monotonic()
    with pytest.raises(DriverError, match=f"switch agent {closed}: hello: unreachable"):
        driver_for(agent, address=closed)
    assert time.monotonic() - started < 10


def test_the_highest_election_id_drives_and_a_deposed_controller_is_refused_by_the_agent(agent):
    first = driver_for(agent)
    first.attach(SERVERS, lambda frame: None)
    second = driver_for(agent)  # the same election id from another controller: a misconfiguration
    with pytest.raises(DriverError, match="ALREADY_EXISTS: .* drives this switch with election id 1"):
        second.attach(SERVERS, lambda frame: None)
    newer = driver_for(agent, election_id=5)
    newer.attach(SERVERS, lambda frame: None)
    with pytest.raises(DriverError, match="deposed by a controller with election id 5"):
        first.read_counters()
    # the agent itself refuses the old id, whatever the old controller believes
    code, details = refusal(lambda: raw_call(agent, dumps({"method": "renew_lease", "args": (30.0,)})))
    assert code == grpc.StatusCode.PERMISSION_DENIED and "the highest seen is 5" in details
    older = driver_for(agent, election_id=4)
    with pytest.raises(DriverError, match="PERMISSION_DENIED: election id 4 does not drive this switch"):
        older.attach(SERVERS, lambda frame: None)
    newer.install_hot_key(b"k", 0, [ReplicaWeight(0, 1.0)])
    newer.close()  # stopped: the next controller with id 5 need not wait
    after = driver_for(agent, election_id=5)
    after.attach(SERVERS, lambda frame: None)
    assert after.read_counters().keys == {}  # a fresh driver: what the stopped one installed is not its own
    for each in (first, second, older, after):
        each.close()
    assert "deposes" in agent.stop()


CONTROLLER = """
import sys, time
from dataplanes.agent import Settings
from dataplanes.agent.client import AgentDriver
from mbalancer.settings import Server
driver = AgentDriver(Settings(address=sys.argv[1], token_file=sys.argv[2]))
driver.attach([Server("s1", "10.0.0.1", "02:00:00:00:00:01")], lambda frame: None)
print("attached", flush=True)
time.sleep(60)
"""


def test_a_killed_controller_ends_its_lease_at_the_agent_and_the_next_one_takes_over(agent):
    controller = subprocess.Popen([sys.executable, "-c", CONTROLLER, agent.address, str(agent.token_file)],
                                  stdout=subprocess.PIPE, text=True)
    try:
        assert controller.stdout.readline().strip() == "attached"
        os.kill(controller.pid, signal.SIGKILL)
        controller.wait()
        next_one = driver_for(agent)  # the same election id: taken once the agent saw the first one go
        until(lambda: _attaches(next_one), "the agent never let the next controller in")
        next_one.close()
    finally:
        if controller.poll() is None:
            controller.kill()
            controller.wait()
    assert "left: driver let go, its lease left to run out" in agent.stop()


def _attaches(driver: AgentDriver) -> bool:
    try:
        driver.attach(SERVERS, lambda frame: None)
        return True
    except DriverError as err:
        assert "ALREADY_EXISTS" in str(err), err
        return False


def test_a_restarted_agent_is_reached_again_and_every_hot_key_installed_anew(tmp_path):
    agent = AgentProcess(tmp_path, "none", {})
    driver = driver_for(agent)
    reconnected, came_back = threading.Event(), []
    driver.attach(SERVERS, lambda frame: None, lambda *args: (came_back.append(args), reconnected.set()))
    driver.install_hot_key(b"k", 0, [ReplicaWeight(0, 1.0)])
    agent.stop()
    with pytest.raises(DriverError, match="unreachable"):
        driver.read_counters()
    again = AgentProcess(tmp_path, "none", {}, address=agent.address)
    try:
        assert reconnected.wait(WAIT), "the controller was not told the agent came back"
        assert came_back == [([], None)]  # holding nothing (a fresh agent): every key is lost, installed again
        driver.install_hot_key(b"k", 0, [ReplicaWeight(0, 1.0)])  # the fresh agent holds nothing: installed again
        driver.close()
    finally:
        again.stop()


def test_serve_refuses_a_bad_config_a_taken_port_and_an_open_address_without_credentials(tmp_path, agent):
    def serve(config: Path) -> subprocess.CompletedProcess:
        done = subprocess.run([str(MBALANCER), "switch", "serve", "--config", str(config), "--duration", "5"],
                              capture_output=True, text=True, timeout=60)
        assert "Traceback" not in done.stderr, done.stderr
        return done

    open_address = agent_config(tmp_path, "none", {}, f"0.0.0.0:{free_port()}")
    open_address.write_text(open_address.read_text().replace("token_file", "# token_file"))
    done = serve(open_address)
    assert done.returncode == 2 and done.stderr.strip().splitlines()[-1].endswith(
        "is reached from other machines: give token_file or tls_ca (anyone who reaches the port would drive the "
        "switch)"), done.stderr
    taken = agent_config(tmp_path, "none", {}, agent.address)
    done = serve(taken)
    assert done.returncode == 1 and done.stderr.strip().splitlines()[-1] == \
        f"mbalancer switch serve: cannot serve on {agent.address} (in use, or not an address of this machine)"
    as_agent = agent_config(tmp_path, "agent", {}, agent.address)
    done = serve(as_agent)
    assert done.returncode == 2 and "names the data plane this machine runs" in done.stderr


def test_tls_with_client_certificates(tmp_path):
    ca, server, client = _certificates(tmp_path)
    tls = f'tls_cert = "{server}.crt"\ntls_key = "{server}.key"\ntls_ca = "{ca}.crt"\n'
    agent = AgentProcess(tmp_path, "none", {}, extra=tls)
    try:
        driver = driver_for(agent, tls_cert=f"{client}.crt", tls_key=f"{client}.key", tls_ca=f"{ca}.crt")
        driver.attach(SERVERS, lambda frame: None)
        assert driver.read_counters().keys == {}
        driver.close()
        with pytest.raises(DriverError, match="hello: unreachable"):  # no client certificate: the handshake fails
            driver_for(agent, tls_ca=f"{ca}.crt")
        with pytest.raises(DriverError, match="unreachable"):  # plain gRPC to a TLS port
            driver_for(agent)
    finally:
        log = agent.stop()
    assert "TLS with client certificates" in log


def test_the_agent_and_its_settings_are_documented():
    root = Path(__file__).resolve().parents[1]
    docs = (root / "docs" / "deployment.md").read_text()
    example = (root / "mbalancer" / "mbalancer.example.toml").read_text()
    assert "mbalancer switch serve" in docs
    for name in Settings.__dataclass_fields__:
        assert f"{name} =" in example, f"[dataplane.agent] {name} is not in the example config"


def test_the_ryu_app_reaches_an_agent_through_a_driver_process(agent):
    """Inside ryu-manager a gRPC client would stall eventlet's hub, so the app runs this driver in a process of its
    own (registry: ryu_process), as it does the P4 driver's."""
    from dataplanes import registry
    from dataplanes.driver_process import DriverProcess
    assert registry.get("agent").ryu_process
    driver = DriverProcess("agent", Settings(address=agent.address, token_file=str(agent.token_file)))
    try:
        assert driver.attach(SERVERS, lambda frame: None) == []
        driver.install_hot_key(b"k", 0, [ReplicaWeight(0, 0.5), ReplicaWeight(1, 0.5)])
        assert driver.write_stamp(b"k").writes == 0
    finally:
        driver.close()
    assert "stopped: driver closed" in agent.stop()


def test_an_agent_started_with_stop_with_ends_when_its_starter_is_killed(tmp_path):
    """A starter (a testbed, a test) killed with SIGKILL cleans nothing up: its agents stop by themselves."""
    import json
    import os
    import signal
    import sys
    starter = subprocess.Popen([sys.executable, "-c", (
        "import json, sys, time\n"
        "from pathlib import Path\n"
        "from tests.switch_agent import AgentProcess\n"
        f"agent = AgentProcess(Path({str(tmp_path)!r}), 'none', {{}})\n"
        "print(json.dumps(agent.process.pid), flush=True)\n"
        "time.sleep(120)\n")], stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parent.parent)
    agent_pid = None
    try:
        agent_pid = json.loads(starter.stdout.readline())
        assert process_running(agent_pid)
        os.kill(starter.pid, signal.SIGKILL)
        starter.wait(timeout=30)
        assert eventually(lambda: not process_running(agent_pid), timeout=30, every=0.05), \
            "the agent outlived its starter"
    finally:
        if starter.poll() is None:
            starter.kill()
            starter.wait()
        if agent_pid is not None and process_running(agent_pid):
            os.kill(agent_pid, 9)


def test_the_reach_probe_counts_the_agents_that_answer_with_the_token(agent, tmp_path):
    """What a candidate controller publishes (controller/election.py): agents answering a Hello; a closed port and an
    agent that refuses the token are not reached."""
    from dataplanes import registry
    probe = registry.get("agent").reach_probe
    token = str(agent.token_file)
    closed = f"127.0.0.1:{free_port()}"
    assert probe(Settings(boxes=(f"{agent.address} s1", f"{closed}"), token_file=token))(2.0) == (1, 2)
    wrong = tmp_path / "wrong-token"
    wrong.write_text("not-the-agents-token-at-all\n")
    assert probe(Settings(address=agent.address, token_file=str(wrong)))(2.0) == (0, 1)
