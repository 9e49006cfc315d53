"""The P4 data plane (p4src/mbalancer.p4) on the shared packet fixtures (tests/pipeline_fixtures.py), on a running
simple_switch_grpc: frames in and out of its ports (veths), the tables filled through the real P4Runtime driver,
mirrored writes as real PacketIns. Plus the committed compiler outputs against a fresh compile wherever p4c is.

These need bmv2 (simple_switch_grpc) and p4c on PATH and root; elsewhere they skip saying so. The driver's
P4Runtime messages are checked against the committed P4Info without a switch in tests/test_p4runtime_driver.py.
"""
from __future__ import annotations

import json
import os
import queue
import shutil
import subprocess
import time
from pathlib import Path

import pytest

pytest.importorskip("scapy.all")
from scapy.all import Ether  # noqa: E402

from dataplanes.driver import DriverError, ForwardingEntry, ReplicaWeight, StreamId  # noqa: E402
from dataplanes.p4.driver import P4RuntimeDriver  # noqa: E402
from dataplanes.p4 import Settings  # noqa: E402
from dataplanes.p4.bmv2 import Bmv2Switch  # noqa: E402
from dataplanes.p4.tables import OP_LEASE_QUERY  # noqa: E402
from dataplanes.p4.pipeline import COMPILER, PROGRAMS, Pipeline, available, compile_program, outputs  # noqa: E402
from mbalancer.config import Server  # noqa: E402
from dataplanes.p4.veth_ports import WAIT, Ports  # noqa: E402
from tests.pipeline_fixtures import (CASES, CLIENT, CONNECTION_CASES, CONTROLLER, FABRIC_CASES, REPLICAS,  # noqa: E402
                                     SERVERS, STREAM_CASES, Case, HotKey, balanced_to, key_of, request)

why_not = available() if os.geteuid() == 0 else "needs root (veths, bmv2 on them)"
on_bmv2 = pytest.mark.skipif(why_not is not None, reason=f"P4 data plane cannot run here: {why_not}")

TAG = f"p4f{os.getpid() % 10000}"
# bmv2 port of each host (the eBPF fixture runner's HOST_PORTS, as bmv2 port numbers)
HOST_PORTS = {CLIENT[0]: 1, SERVERS[0][0]: 2, SERVERS[1][0]: 3, SERVERS[2][0]: 4, CONTROLLER[0]: 5}


@pytest.mark.skipif(shutil.which(COMPILER) is None, reason=f"{COMPILER} (p4c) is not on PATH")
@pytest.mark.parametrize("source", PROGRAMS, ids=lambda p: p.name)
def test_the_committed_compiler_outputs_are_those_of_the_source(tmp_path, source):
    for fresh, committed in zip(compile_program(source, tmp_path), outputs(source)):
        assert fresh.read_text() == committed.read_text(), f"{committed} is stale: run `python -m dataplanes build`"


class Mirrors:
    def __init__(self):
        self.frames: list[bytes] = []

    def __call__(self, frame: bytes) -> None:
        self.frames.append(frame)

    def settle(self, driver: P4RuntimeDriver) -> None:
        """Until every copy the switch counts as cloned has arrived as a PacketIn (bounded)."""
        deadline = time.monotonic() + WAIT
        while driver.switch_counters()[0]["cloned"] > len(self.frames) and time.monotonic() < deadline:
            time.sleep(0.01)


@pytest.fixture(scope="module")
def switch():
    ports = Ports(TAG, len(HOST_PORTS))
    bmv2 = Bmv2Switch(TAG, ports.switch_ends)
    driver = None
    try:
        bmv2.start()
        driver = P4RuntimeDriver(Settings(switches=(bmv2.address,), ports=tuple(range(1, len(HOST_PORTS) + 1)),
                                          trusted=(CONTROLLER[1],)), Pipeline())
        mirrors = Mirrors()
        servers = [Server(f"s{i}", ip, mac, port) for i, (mac, ip, port) in enumerate(SERVERS)]
        driver.attach(servers, mirrors)
        driver.set_forwarding([ForwardingEntry(mac, str(port)) for mac, port in HOST_PORTS.items()])
        driver.renew_lease(3600)
        yield driver, ports, mirrors
    finally:
        if driver is not None:
            driver.close()
        bmv2.stop()
        ports.close()


def wait_for_packets(driver: P4RuntimeDriver, count: int) -> None:
    """Until the switch's ingress has counted `count` packets (bounded)."""
    deadline = time.monotonic() + WAIT
    while driver.switch_counters()[0]["packets"] < count and time.monotonic() < deadline:
        time.sleep(0.01)
    assert driver.switch_counters()[0]["packets"] >= count, "the switch did not take the frame"


def load_state(driver: P4RuntimeDriver, ports: Ports, case: Case) -> None:
    for server in range(len(SERVERS)):  # closes seen in an earlier case: handled; unsure requests: checked
        driver.closes_handled(server, driver.server_closes(server))
        driver.rearm_unsure(server)
    # the client's connections an earlier case read as streams end (registers cannot be written over P4Runtime)
    packets = driver.switch_counters()[0]["packets"]
    for server in range(len(SERVERS)):
        ports.send(HOST_PORTS[CLIENT[0]], request(b"", to=server, udp=False, tcp_flags="FA"))
    wait_for_packets(driver, packets + len(SERVERS))
    for hot in case.hot:
        driver.install_hot_key(hot.key, hot.home, [ReplicaWeight(s, w) for s, w in zip(REPLICAS, hot.weights)])
        if not hot.dirty:
            driver.clear_dirty(hot.key, driver.write_stamp(hot.key))
    driver.renew_lease(3600 if case.lease else 0)


def unsure_counts(driver: P4RuntimeDriver) -> list[int]:
    tables = driver.book.switches[0]
    return [tables.unsure(i) for i in range(len(SERVERS))]


# Where P4 reads less than eBPF: the line after a key is read a byte at a time only up to the data length's end, at
# most MB_LINE_HEAD (48) bytes (header instances cost bmv2 per packet); a longer head is not proved whole (eBPF reads
# 256 bytes that way). The write still counts; its server is unsure too, so the controller checks it.
P4_ONLY_CASES = (
    Case("P4: a write whose data length ends past 48 bytes of its line is mirrored and its server unsure",
         request(b"set hot" + b" " * 50 + b"0 0 2\r\nxy\r\n", udp=False), mirrored=True, unsure=0, dirty_after=True),
)

# The parser's 32-byte stretches (the key's first 224 bytes, the line after the data length): windows looked at one
# more each step and taken in one extract where the stretch ends. A key or line ending in each window, at its edges,
# after "get "/"set " and after another command word; mg's T, N or I in each window.
STRETCH_KEYS = (31, 32, 33, 40, 63, 64, 65, 96, 100, 128, 160, 192, 200, 218, 219, 224, 225, 232, 241)
P4_STRETCH_CASES = (
    *(Case(f"P4 stretch: a {n}-byte hot key is balanced", request(b"get " + key_of(n) + b"\r\n"),
           hot=(HotKey(key_of(n)),), out=balanced_to(request(b"get " + key_of(n) + b"\r\n"), 1))
      for n in STRETCH_KEYS),
    *(Case(f"P4 stretch: a {n}-byte key differing from the hot key in byte {n - 33} is not balanced",
           request(b"get " + key_of(n)[:n - 33] + b"!" + key_of(n)[n - 32:] + b"\r\n"), hot=(HotKey(key_of(n)),))
      for n in (33, 100, 224, 241)),
    *(Case(f"P4 stretch: a write to a {n}-byte hot key is mirrored: {command}", request(payload, udp=udp),
           hot=(HotKey(key_of(n)),), mirrored=True, dirty_after=True,
           counters={"packets": 1, "memcached": 1, "mirrored": 1})
      for n in (32, 33, 64, 100, 224, 225, 241)
      for command, payload, udp in (("set", b"set " + key_of(n) + b" 0 0 1\r\nx\r\n", True),
                                    ("delete", b"delete " + key_of(n) + b"\r\n", False))),
    *(Case(f"P4 stretch: a whole meta get with a {n}-byte opaque token changes nothing", request(
        b"mg hot v k s O" + b"x" * n + b" q\r\n", udp=False), dirty_after=False)
      for n in (17, 18, 20, 40, 50, 90, 120, 150, 180, 200, 215)),
    *(Case(f"P4 stretch: a whole set with a {n}-byte token after its data length is mirrored", request(
        b"set hot 0 0 2 " + b"t" * n + b"\r\nxy\r\n", udp=False), mirrored=True, dirty_after=True,
        counters={"packets": 1, "memcached": 1, "mirrored": 1})
      for n in (30, 31, 32, 33, 64, 100, 160, 200, 230)),
    *(Case(f"P4 stretch: a meta get with {flag!r} after a {n}-byte token is not a whole read", request(
        b"mg hot v O" + b"x" * n + b" " + flag + b"30 q\r\n", udp=False), unsure=0, dirty_after=True)
      for n in (25, 60, 90, 130, 170, 200) for flag in (b"T", b"N")),
)


@on_bmv2
@pytest.mark.parametrize("case", CASES + STREAM_CASES + P4_ONLY_CASES + P4_STRETCH_CASES + FABRIC_CASES +
                         CONNECTION_CASES,
                         ids=lambda c: c.name)  # (blind: last)
def test_pipeline_fixture(switch, case):
    driver, ports, mirrors = switch
    load_state(driver, ports, case)
    key = case.hot[0].key
    try:
        in_port = HOST_PORTS[Ether(case.packet).src] if Ether(case.packet).src in HOST_PORTS else 1
        packets = driver.switch_counters()[0]["packets"]
        for frame in case.before:
            ports.send(HOST_PORTS[Ether(frame).src], frame)
        wait_for_packets(driver, packets + len(case.before))
        time.sleep(0.05)
        mirrors.settle(driver)
        connection = StreamId(CLIENT[1], 40000, SERVERS[0][1], SERVERS[0][2])
        if case.resume is not None:
            driver.resume_stream(connection, case.resume)
        if case.blind:
            driver.blind_stream(connection)
        ports.drain(quiet=0.2)  # a late frame of the case's earlier ones is not its answer
        before, unsure_before = driver.switch_counters()[0], unsure_counts(driver)
        mirrored_before = driver.read_counters().keys[key].mirrored
        copies_before = len(mirrors.frames)
        ports.send(in_port, case.packet)
        expected = case.out or case.packet
        out_port = HOST_PORTS[Ether(expected).dst]
        got = ports.receive(out_port)
        assert got == expected, Ether(got).show(dump=True) if got else "nothing came out"
        trusted = Ether(case.packet).src == CONTROLLER[0]
        coalesced = (case.counters or {}).get("coalesced", 0) > 0  # covered by an earlier copy's check
        sent_to_controller = (case.mirrored or (case.unsure is not None and not trusted)) and not coalesced
        if sent_to_controller:
            deadline = time.monotonic() + WAIT
            while len(mirrors.frames) == copies_before and time.monotonic() < deadline:
                time.sleep(0.01)
        after, unsure_after = driver.switch_counters()[0], unsure_counts(driver)
        copied = after["cloned"] - before["cloned"]
        if case.counters is not None:  # "cloned" apart: the eBPF runner has no controller port to clone to
            moved = {k: after[k] - before[k] for k in after if after[k] != before[k] and k != "cloned"}
            assert moved == case.counters
        assert (after["mirrored"] - before["mirrored"],
                driver.read_counters().keys[key].mirrored - mirrored_before) == ((1, 1) if case.mirrored else (0, 0))
        copies = mirrors.frames[copies_before:]
        assert (copied, len(copies)) == ((1, 1) if sent_to_controller else (0, 0))
        if copies:
            assert copies[0] == case.packet
        assert driver.dirty(key) == (case.hot[0].dirty if case.dirty_after is None else case.dirty_after)
        assert [a - b for a, b in zip(unsure_after, unsure_before)] == [
            int(i == case.unsure) for i in range(len(SERVERS))]
        counts = driver.read_counters().keys[key]
        for position, n in case.gets.items():
            assert counts.per_replica.get(REPLICAS[position], 0) == n
    finally:
        driver.renew_lease(3600)
        for hot in case.hot:
            driver.remove_hot_key(hot.key)


def lease_left_us(driver: P4RuntimeDriver) -> int:
    """Asks the switch how long the lease has left (a PacketOut, op 3) and returns its answer: the PacketIn with
    report 2, caught beside the driver's own handler."""
    tables = driver.book.switches[0]
    fields = driver.pipeline.packet_metadata["packet_in"]
    answers: queue.Queue[int] = queue.Queue()
    handler = tables.client.on_packet

    def catch(payload: bytes, metadata: dict[int, bytes]) -> None:
        if int.from_bytes(metadata.get(fields["report"][0], b""), "big") == 2:
            answers.put(int.from_bytes(metadata[fields["quiet_us"][0]], "big"))
        handler(payload, metadata)

    tables.client.on_packet = catch
    try:
        tables._packet_out(OP_LEASE_QUERY)
        return answers.get(timeout=WAIT)
    finally:
        tables.client.on_packet = handler


@on_bmv2
def test_a_lease_query_is_answered_with_the_microseconds_the_lease_has_left(switch):
    driver, _, _ = switch
    try:
        driver.renew_lease(5)
        left = lease_left_us(driver)
        assert 0 < left <= 5_000_000
        driver.renew_lease(0)  # ended: nothing left
        assert lease_left_us(driver) == 0
    finally:
        driver.renew_lease(3600)


@on_bmv2
def test_the_switch_runs_with_jemallocs_malloc_where_it_is_installed():
    """bmv2 mallocs per field it writes: a switch is started with jemalloc preloaded (`make install` installs it)."""
    from dataplanes.p4.bmv2 import preloaded_malloc
    assert preloaded_malloc() == "libjemalloc.so.2"
    bmv2 = Bmv2Switch(f"{TAG}m", []).start()
    try:
        assert "/libjemalloc.so.2" in Path(f"/proc/{bmv2.process.pid}/maps").read_text()
    finally:
        bmv2.stop()


@on_bmv2
def test_a_switch_a_killed_run_left_is_stopped_by_the_next_claim():
    from topologies.claim import Made
    left = Bmv2Switch(f"{TAG}k", []).start()
    process, left.process = left.process, None  # as if the run that started it was killed: nobody will stop it
    try:
        assert Made(switches=[f"{TAG}k"]).remove() == [f"bmv2 {TAG}k"]
        process.wait(timeout=10)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert Made(switches=[f"{TAG}k"]).remove() == []


@on_bmv2
def test_a_second_controller_is_refused_by_the_switch_while_the_first_drives_it(switch):
    """P4Runtime arbitration, first come: the controller that started first keeps the switch; a later one (on this
    machine or another: bmv2 decides, not a local lock) is refused, told when the primary started."""
    driver, _, _ = switch
    second = P4RuntimeDriver(Settings(switches=(driver.settings.switches[0],), ports=(1,)), Pipeline())
    with pytest.raises(DriverError, match=r"another controller is primary \(election id \d+, a controller started 20"):
        second.attach([Server(f"s{i}", ip, mac, port) for i, (mac, ip, port) in enumerate(SERVERS)], lambda f: None)
    second.close()
    driver.renew_lease(3600)  # the first is still primary: its writes are taken


# Run in p4runtime-shell's own environment: every hot-key entry and the switch's counters, read by name, as JSON.
SHELL_READ = """
import json, sys
import p4runtime_sh.shell as sh
sh.setup(device_id=1, grpc_addr=sys.argv[1], election_id=(0, 1), verbose=False)
hot = []
for entry in sh.TableEntry("MbIngress.hot_keys").read():
    match = entry.match
    hot.append({"key_len": int.from_bytes(match["meta.key_len"].exact.value, "big"),
                "key": match["meta.key"].exact.value.hex(), "action": entry.action.action_name,
                "params": {name: int.from_bytes(entry.action[name].value, "big") for name in ("slot", "home")}})
counters = {e.index: e.packet_count for e in sh.CounterEntry("MbIngress.switch_counters").read()}
sh.teardown()
print(json.dumps({"hot": hot, "counters": counters}))
"""


@on_bmv2
def test_p4runtime_shell_reads_the_hot_keys_by_name_as_the_controller_wrote_them(switch):
    """p4runtime-shell (its own environment) as a second client beside the controller: it reads, writes nothing,
    and the controller stays primary."""
    from dataplanes.p4.shell import shell_python
    driver, _, _ = switch
    if not shell_python().exists():
        pytest.skip(f"p4runtime-shell is not installed at {shell_python()} (install/python.sh puts it there)")
    keys = {b"shell:first": 0, b"shell:second-key": 2}
    for key, home in keys.items():
        driver.install_hot_key(key, home, [ReplicaWeight(home, 0.5), ReplicaWeight(1, 0.5)])
    try:
        done = subprocess.run([str(shell_python()), "-c", SHELL_READ, driver.settings.switches[0]],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert "You are not the primary client" in done.stdout  # a backup: read access only
        read = json.loads(done.stdout.strip().splitlines()[-1])
        hot = {bytes.fromhex(h["key"]).rjust(h["key_len"], b"\0")[-h["key_len"]:]: h for h in read["hot"]}
        assert set(hot) == set(keys)
        for key, home in keys.items():
            assert hot[key]["action"] == "MbIngress.hot"
            assert hot[key]["params"] == {"slot": driver.book.slot_of(key), "home": home}
        assert len(read["counters"]) == 13
        driver.renew_lease(3600)  # still the primary: its writes are taken
    finally:
        for key in keys:
            driver.remove_hot_key(key)
