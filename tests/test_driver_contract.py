"""The core/driver contract (dataplanes/driver.py), tested once for every driver in the registry: each is driven
through install, weights, dirty state (write stamps, writes and unsure requests the data plane counts, the lease),
remove, refused requests and keys left by an earlier controller (read back and kept), and asked where a get goes
(faucet's way of asking a fake table; for the eBPF driver the real program answers, in the kernel, through
BPF_PROG_TEST_RUN)."""
from __future__ import annotations

import os
import random
import threading
import time
from dataclasses import dataclass
from typing import Callable

import pytest

from dataplanes.driver import (RULES_REMOVED, Distrust, Driver, DriverError, HotKeyInstall, MacSighting,
                               ReplicaWeight)
from dataplanes.recording.driver import RecordingDriver
from dataplanes import registry
from tests.switch_agent import AgentProcess
from mbalancer.config import Server
from mbalancer.macs import mac_text

SERVERS = [Server(f"s{i}", f"10.0.0.{i + 1}", f"02:00:00:00:00:{i + 1:02x}", 11211) for i in range(10)]
UNTOUCHED = -1  # route(): the get left the switch as it came (to its home)


@dataclass
class Harness:
    driver: Driver
    route: Callable[[bytes, int, int], int]  # (key, home, request id) -> the server it reaches, or UNTOUCHED
    reload: Callable[[], None]  # the switch comes back empty
    send: Callable[[bytes, int], None]  # a client's request (payload) to a server passes the switch
    successor: Callable[[], Driver]  # a new driver on the same switch (a controller that restarted)
    close: Callable[[int], None]  # a server's memcached closes the controller's connection through the switch


def recording_harness():
    driver = RecordingDriver()

    def route(key: bytes, home: int, request_id: int) -> int:
        server = driver.route(key, request_id)
        return UNTOUCHED if server is None else server

    def send(payload: bytes, server: int) -> None:  # what the data plane counts, as the eBPF program does
        words = payload.split(b"\r\n")[0].split(b" ")
        whole = payload.count(b"\r\n") == (2 if words[0] == b"set" else 1) and payload.endswith(b"\r\n")
        key = words[1] if len(words) > 1 and words[0] in (b"set", b"delete") else None
        entry = driver.table.get(key)
        if entry is not None and entry.home == server:
            driver.mirror(b"", key)
        if not whole:
            driver.unsure(server, b"")

    yield Harness(driver, route, driver.reconnect, send, driver.successor, driver.count_close)


def ebpf_harness():
    from tests.conftest import run_program
    from dataplanes.bpf.program import DataPlane
    from tests.pipeline_fixtures import CONTROLLER, closing, request_to

    plane = DataPlane(f"contract{os.getpid()}").load()
    plane.serve([])
    settings = registry.get("ebpf").parse_settings({"switches": [plane.name], "trusted": [CONTROLLER[1]]})
    driver = registry.get("ebpf").make_driver(settings)
    by_ip = {s.ip: i for i, s in enumerate(SERVERS)}

    def route(key: bytes, home: int, request_id: int) -> int:
        packet = request_to(SERVERS[home], b"get " + key + b"\r\n", request_id)
        out = run_program(plane.program_pin, packet)
        return UNTOUCHED if out == packet else by_ip[".".join(str(b) for b in out[30:34])]

    def reload() -> None:
        plane.unload()
        plane.load()
        plane.serve([])

    def send(payload: bytes, server: int) -> None:
        run_program(plane.program_pin, request_to(SERVERS[server], payload, udp=False))

    def successor() -> Driver:
        return registry.get("ebpf").make_driver(settings)

    try:
        yield Harness(driver, route, reload, send, successor,
                      lambda server: run_program(plane.program_pin, closing(SERVERS[server])))
    finally:
        driver.close()
        plane.unload()


def openflow_harness():
    """The OpenFlow driver: the real key classifier in the kernel, the switch a recorded flow table."""
    from dataplanes.openflow.driver import OpenflowDriver
    from tests.conftest import run_program
    from dataplanes.bpf.program import CLASSIFIER, DataPlane
    from dataplanes.openflow import Settings
    from tests.openflow_switch import RecordedSwitch
    from tests.pipeline_fixtures import CONTROLLER, closing, request_to

    plane = DataPlane(f"contract{os.getpid()}", CLASSIFIER).load()
    switch = RecordedSwitch()
    settings = Settings(classifier=plane.name, trusted=(CONTROLLER[1],))
    driver = OpenflowDriver(settings, switch)
    by_ip = {s.ip: i for i, s in enumerate(SERVERS)}

    def run(packet: bytes) -> bytes:
        return run_program(plane.program_pin, packet)

    def route(key: bytes, home: int, request_id: int) -> int:
        packet = request_to(SERVERS[home], b"get " + key + b"\r\n", request_id)
        out = run(packet)
        if out == packet:
            return UNTOUCHED
        ip = switch.pick(mac_text(out[:6]))
        assert ip is not None, "a get was tagged for a key the switch has no group for"
        return by_ip[ip]

    def reload() -> None:
        plane.unload()
        plane.load()

    try:
        yield Harness(driver, route, reload, lambda payload, server: run(request_to(SERVERS[server], payload,
                                                                                    udp=False)),
                      lambda: OpenflowDriver(settings, switch), lambda server: run(closing(SERVERS[server])))
    finally:
        driver.close()
        plane.unload()


def p4_harness():
    """The P4Runtime driver on a running simple_switch_grpc: gets sent through its ports, every server's MAC
    forwarded to one port where the test reads where each get went."""
    from dataplanes.driver import ForwardingEntry
    from dataplanes.p4.driver import P4RuntimeDriver
    from dataplanes.p4 import Settings
    from dataplanes.p4.bmv2 import Bmv2Switch
    from dataplanes.p4.pipeline import Pipeline
    from dataplanes.p4.veth_ports import Ports
    from tests.pipeline_fixtures import CONTROLLER, closing, request_to

    ports = Ports(f"p4c{os.getpid() % 10000}", 2)
    bmv2 = Bmv2Switch(f"contract{os.getpid()}", ports.switch_ends)
    by_ip = {s.ip: i for i, s in enumerate(SERVERS)}

    def make() -> P4RuntimeDriver:
        return P4RuntimeDriver(Settings(switches=(bmv2.address,), ports=(1, 2), trusted=(CONTROLLER[1],)),
                               Pipeline())

    def through(packet: bytes) -> bytes:
        ports.drain()
        ports.send(1, packet)
        out = ports.receive(2)
        assert out is not None, "the switch sent nothing on"
        return out

    def route(key: bytes, home: int, request_id: int) -> int:
        packet = request_to(SERVERS[home], b"get " + key + b"\r\n", request_id)
        out = through(packet)
        return UNTOUCHED if out == packet else by_ip[".".join(str(b) for b in out[30:34])]

    bmv2.start()
    driver = make()
    forwarding = [ForwardingEntry(s.mac, "2") for s in SERVERS]
    real_attach = driver.attach

    def attach(*args, **kwargs):
        found = real_attach(*args, **kwargs)
        driver.set_forwarding(forwarding)
        return found

    driver.attach = attach

    def successor() -> P4RuntimeDriver:
        driver.close()  # the controller that stopped: its stream ends, so the next one is primary (first come)
        return make()

    try:
        yield Harness(driver, route, bmv2.restart,
                      lambda payload, server: through(request_to(SERVERS[server], payload, udp=False)), successor,
                      lambda server: through(closing(SERVERS[server])))
    finally:
        driver.close()
        bmv2.stop()
        ports.close()


def agent_harness(tmp_path_factory):
    """The eBPF switch served by a switch agent (`mbalancer switch serve`, a process of its own) and driven
    through it: the agent's driver over gRPC with a token; routes and requests through the real program."""
    from dataplanes.agent import Settings
    from dataplanes.agent.client import AgentDriver
    from tests.pipeline_fixtures import CONTROLLER

    made = ebpf_harness()
    local = next(made)
    local.driver.close()  # the agent drives the switch; the ebpf harness keeps the program and its test runs
    agent = AgentProcess(tmp_path_factory.mktemp("agent"), "ebpf", {"switches": [local.driver.book.pin_dirs[0].name],
                                                                     "trusted": [CONTROLLER[1]]})
    settings = Settings(address=agent.address, token_file=str(agent.token_file), kind="ebpf")
    driver = AgentDriver(settings)
    drivers = [driver]

    def successor() -> Driver:
        drivers[-1].close()  # the controller that stopped: the agent takes the next one with the same election id
        drivers.append(AgentDriver(settings))
        return drivers[-1]

    try:
        yield Harness(driver, local.route, local.reload, local.send, successor, local.close)
    finally:
        for each in drivers:
            each.close()
        agent.stop()
        next(made, None)


HARNESSES = {"none": recording_harness, "ebpf": ebpf_harness, "openflow": openflow_harness, "p4": p4_harness,
             "agent": agent_harness}


def test_every_driver_of_the_registry_is_held_to_the_contract():
    assert set(registry.names("driver")) - {k for k in registry.KINDS if registry.KINDS[k].missing} == \
        set(HARNESSES)


@pytest.fixture(params=sorted(HARNESSES))
def harness(request, tmp_path_factory):
    why_not = registry.get(request.param).available()
    if request.param in ("ebpf", "openflow", "p4", "agent") and os.geteuid() != 0:
        why_not = "needs root (bpf syscall, bpffs; veths)"
    if request.param == "agent":
        why_not = why_not or registry.get("ebpf").available()
    if why_not:
        pytest.skip(f"{request.param}: {why_not}")
    made = HARNESSES[request.param](*[tmp_path_factory] if request.param == "agent" else [])
    harness = next(made)
    reconnected = threading.Event()
    harness.driver.attach(SERVERS, lambda frame: None, reconnected.set)
    harness.driver.renew_lease(3600)
    harness.reconnected = reconnected
    harness.kind = request.param
    yield harness
    next(made, None)


def equal(*servers: int) -> list[ReplicaWeight]:
    return [ReplicaWeight(s, 1 / len(servers)) for s in servers]


def clean(harness: Harness, key: bytes) -> None:
    """What the core does once the copies are current: clear the key to the counts as they are."""
    harness.driver.clear_dirty(key, harness.driver.write_stamp(key))


def spread(harness: Harness, key: bytes, home: int, gets: int = 300) -> dict[int, int]:
    rng, seen = random.Random(3), {}
    for _ in range(gets):
        server = harness.route(key, home, rng.randrange(65536))
        seen[server] = seen.get(server, 0) + 1
    return seen


def test_a_key_is_installed_dirty_and_balanced_once_clean(harness):
    harness.driver.install_hot_key(b"k", 0, equal(0, 1, 2))
    assert spread(harness, b"k", 0, 50) == {UNTOUCHED: 50}  # dirty: every get goes home as it is
    clean(harness, b"k")
    seen = spread(harness, b"k", 0)
    assert set(seen) == {0, 1, 2} and min(seen.values()) > 50, seen


def test_weights_move_gets_and_a_zero_weight_takes_none(harness):
    harness.driver.install_hot_key(b"k", 0, equal(0, 1, 2))
    clean(harness, b"k")
    harness.driver.set_weights(b"k", [ReplicaWeight(0, 0.0), ReplicaWeight(1, 0.0), ReplicaWeight(2, 1.0)])
    assert spread(harness, b"k", 0, 100) == {2: 100}
    harness.driver.set_weights(b"k", [ReplicaWeight(0, 0.0), ReplicaWeight(1, 0.5), ReplicaWeight(2, 0.5)])
    assert set(spread(harness, b"k", 0, 100)) == {1, 2}


def test_the_dirty_bit_sends_gets_home_and_removal_leaves_the_key_cold(harness):
    harness.driver.install_hot_key(b"k", 0, equal(0, 1))
    clean(harness, b"k")
    harness.driver.set_dirty(b"k")
    assert spread(harness, b"k", 0, 50) == {UNTOUCHED: 50}
    clean(harness, b"k")
    harness.driver.remove_hot_key(b"k")
    assert spread(harness, b"k", 0, 50) == {UNTOUCHED: 50}
    for call in (lambda: harness.driver.remove_hot_key(b"k"), lambda: harness.driver.set_dirty(b"k"),
                 lambda: harness.driver.set_weights(b"k", equal(0, 1))):
        with pytest.raises(DriverError):
            call()


def test_a_write_counted_after_the_stamp_keeps_the_key_dirty(harness):
    harness.driver.install_hot_key(b"k", 0, equal(0, 1))
    stamp = harness.driver.write_stamp(b"k")
    harness.send(b"set k 0 0 1\r\nx\r\n", 0)  # a client's write passes the switch while the core syncs
    harness.driver.clear_dirty(b"k", stamp)  # the core clears to what it had read: too old
    assert spread(harness, b"k", 0, 30) == {UNTOUCHED: 30}
    harness.send(b"set k 0 0 1\r\nx\r\n", 1)  # to a replica (the controller's own copy): not counted
    clean(harness, b"k")
    assert set(spread(harness, b"k", 0)) == {0, 1}
    harness.send(b"delete k\r\n", 0)
    assert spread(harness, b"k", 0, 30) == {UNTOUCHED: 30}


def test_a_request_the_data_plane_cannot_read_makes_its_servers_keys_dirty(harness):
    harness.driver.install_hot_key(b"k", 0, equal(0, 1))
    harness.driver.install_hot_key(b"j", 1, equal(0, 1))
    clean(harness, b"k")
    clean(harness, b"j")
    harness.send(b"set cold 0 0 1\r\nx\r\nset k 0 0 1\r\ny\r\n", 0)  # set_many: a cold key first
    assert spread(harness, b"k", 0, 30) == {UNTOUCHED: 30}
    assert set(spread(harness, b"j", 1)) == {0, 1}  # homed elsewhere: still balanced
    clean(harness, b"k")
    assert set(spread(harness, b"k", 0)) == {0, 1}


def test_without_the_lease_every_get_goes_home(harness):
    harness.driver.install_hot_key(b"k", 0, equal(0, 1))
    clean(harness, b"k")
    harness.driver.renew_lease(0)
    assert spread(harness, b"k", 0, 30) == {UNTOUCHED: 30}
    harness.driver.renew_lease(3600)
    assert set(spread(harness, b"k", 0)) == {0, 1}


def test_a_new_driver_reads_back_what_an_earlier_controller_left_and_keeps_it(harness):
    """A controller that takes over (controller/adoption.py): the new driver reads each key back (home, replicas and
    weights, clean or held dirty) and keeps it as it was, no rule rewritten; it stamps, clears and removes it as
    its own. A data plane that cannot read back removes them and says so."""
    harness.driver.install_hot_key(b"k", 0, equal(0, 1, 2))
    clean(harness, b"k")
    harness.driver.install_hot_key(b"d", 1, equal(1, 3))  # held dirty
    before = spread(harness, b"k", 0, 60)
    after = harness.successor()
    found = {f.key: f for f in after.attach(SERVERS, lambda frame: None)}
    try:
        assert set(found) == {b"k", b"d"}
        k, d = found[b"k"], found[b"d"]
        assert (k.home, [r.server for r in k.replicas], d.home, [r.server for r in d.replicas]) == \
            (0, [0, 1, 2], 1, [1, 3])
        if k.distrust in RULES_REMOVED:
            assert spread(harness, b"k", 0, 30) == {UNTOUCHED: 30}  # gets go home: no slot reused unchecked
            return
        assert [round(r.weight, 3) for r in k.replicas] == [0.333] * 3 and k.synced is not None and d.synced is None
        # (expired where the earlier one ended it on its way out; unknown on a P4 program without the lease query)
        assert k.distrust in (None, Distrust.LEASE_EXPIRED, Distrust.LEASE_UNKNOWN)
        after.renew_lease(3600)
        assert spread(harness, b"k", 0, 60) == before  # balanced as it was
        assert spread(harness, b"d", 1, 30) == {UNTOUCHED: 30}  # still dirty
        after.clear_dirty(b"d", after.write_stamp(b"d"))
        assert set(spread(harness, b"d", 1)) == {1, 3} and after.write_stamp(b"k").writes == 0
        after.remove_hot_key(b"k")
        assert spread(harness, b"k", 0, 30) == {UNTOUCHED: 30}
    finally:
        after.close()


def test_a_close_is_pending_until_the_core_handles_it_and_a_driver_attaching_later_leaves_it_so(harness):
    """A server's memcached closing a connection of the controller's (it may have died, or restarted empty): the
    switch balances it no get until the core acknowledges the close (`closes_handled`). A driver that attaches later
    (a controller that took over) writes nothing for it: it reports it pending (`closes_pending`), for the core to
    check the server before it acknowledges (core.start)."""
    harness.driver.install_hot_key(b"k", 0, equal(0, 1))
    clean(harness, b"k")
    assert not any(harness.driver.closes_pending(s) for s in range(len(SERVERS)))
    harness.close(1)
    assert [harness.driver.closes_pending(s) for s in range(3)] == [False, True, False]
    assert 1 not in spread(harness, b"k", 0, 60)
    after = harness.successor()
    after.attach(SERVERS, lambda frame: None)
    try:
        after.renew_lease(3600)
        assert [after.closes_pending(s) for s in range(3)] == [False, True, False]  # not acknowledged at attach
        assert 1 not in spread(harness, b"k", 0, 60)
        after.closes_handled(1, after.server_closes(1))  # what the core does once it has checked the server
        assert not any(after.closes_pending(s) for s in range(len(SERVERS)))
        assert set(spread(harness, b"k", 0)) == {0, 1}
    finally:
        after.close()


def test_a_hot_set_change_goes_in_calls_on_many_keys_and_a_refused_key_holds_back_no_other(harness):
    driver, limit = harness.driver, harness.driver.max_replicas
    old = [b"old:%d" % i for i in range(4)]
    assert driver.install_hot_keys([HotKeyInstall(key, 0, tuple(equal(0, 1))) for key in old]) == {}
    assert driver.clear_dirty_keys(driver.write_stamps(old)) == {}
    too_wide = tuple(equal(*range(limit + 1))) if limit else tuple(equal(0, 1, 99))  # 99: no such server
    new = [HotKeyInstall(b"new:%d" % i, i % 3, tuple(equal(i % 3, 3))) for i in range(4)]
    installs = new[:2] + [HotKeyInstall(b"refused", 0, too_wide), HotKeyInstall(b"x" * 251, 0, tuple(equal(0, 1)))] \
        + new[2:] + [HotKeyInstall(b"new:0", 0, tuple(equal(0, 1)))]  # the last: already installed
    removed = driver.remove_hot_keys(old + [b"never-installed"])
    refused = driver.install_hot_keys(installs)
    assert set(removed) == {b"never-installed"} and set(refused) == {b"refused", b"x" * 251, b"new:0"}
    assert all(isinstance(err, DriverError) and str(err) for err in (*removed.values(), *refused.values()))
    keys = [i.key for i in new]
    for install in new:  # in, dirty: every get goes home
        assert spread(harness, install.key, install.home, 30) == {UNTOUCHED: 30}
    stamps = driver.write_stamps(keys)
    assert set(stamps) == set(keys) and all(stamp.writes == 0 for stamp in stamps.values())
    harness.send(b"set new:1 0 0 1\r\nx\r\n", 1)  # a write counted after the stamps: that key stays dirty
    assert driver.clear_dirty_keys({**stamps, b"refused": stamps[b"new:0"]}).keys() == {b"refused"}
    assert spread(harness, b"new:1", 1, 30) == {UNTOUCHED: 30}
    for install in new[:1] + new[2:]:
        assert set(spread(harness, install.key, install.home)) == {install.home, 3}
    for key in old + [b"refused"]:
        assert spread(harness, key, 0, 30) == {UNTOUCHED: 30}
    with pytest.raises(DriverError):
        driver.write_stamps(keys + [b"refused"])


def test_a_refused_install_changes_nothing(harness):
    limit = harness.driver.max_replicas
    assert limit is not None and limit < len(SERVERS)
    for _ in range(3):
        with pytest.raises(DriverError):
            harness.driver.install_hot_key(b"big", 0, equal(*range(limit + 1)))
    assert spread(harness, b"big", 0, 20) == {UNTOUCHED: 20}
    harness.driver.install_hot_key(b"big", 0, equal(*range(limit)))  # within the limit it goes in
    clean(harness, b"big")
    assert len(spread(harness, b"big", 0)) == limit
    with pytest.raises(DriverError):  # twice: refused, and the entry stays as it was
        harness.driver.install_hot_key(b"big", 0, equal(0, 1))
    assert len(spread(harness, b"big", 0)) == limit


def test_a_switch_that_comes_back_empty_is_reported_and_takes_the_keys_again(harness):
    harness.driver.install_hot_key(b"k", 0, equal(0, 1))
    clean(harness, b"k")
    harness.reload()
    assert harness.reconnected.wait(10), "the driver did not notice its switch came back"
    assert spread(harness, b"k", 0, 20) == {UNTOUCHED: 20}
    harness.driver.install_hot_key(b"k", 0, equal(0, 1))  # what the core's replay does
    clean(harness, b"k")
    assert set(spread(harness, b"k", 0)) == {0, 1}


def test_a_data_plane_reports_what_it_saw_of_each_servers_mac_or_says_it_cannot(harness):
    """controller/mac_check.py compares these with the configured MACs: per server, the MACs its packets came from
    and its balanced gets flooded (nothing yet on a switch just attached); None where the data plane cannot tell."""
    macs = harness.driver.server_macs()
    if harness.kind in ("ebpf", "openflow", "agent"):  # (the agent's box runs the eBPF switch)
        assert macs == [MacSighting()] * len(SERVERS)
    else:
        assert macs is None


def test_counters_count_gets_per_replica(harness):
    harness.driver.install_hot_key(b"k", 0, [ReplicaWeight(0, 0.0), ReplicaWeight(1, 1.0)])
    clean(harness, b"k")
    spread(harness, b"k", 0, 30)
    counters = harness.driver.read_counters()
    assert counters.keys[b"k"].per_replica.get(1) == 30 and counters.keys[b"k"].gets == 30


def test_an_ebpf_install_refused_for_its_replicas_takes_no_slot():
    """The slot leak: a refused install used to keep the slot it had taken (4096 -> 4093 after three)."""
    if os.geteuid() != 0 or registry.get("ebpf").available():
        pytest.skip("needs the eBPF data plane (root)")
    made = ebpf_harness()
    harness = next(made)
    try:
        harness.driver.attach(SERVERS, lambda frame: None)
        free = len(harness.driver.free_slots)
        for _ in range(3):
            with pytest.raises(DriverError):
                harness.driver.install_hot_key(b"big", 0, equal(*range(9)))
        assert len(harness.driver.free_slots) == free
    finally:
        next(made, None)
