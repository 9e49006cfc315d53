"""The eBPF data plane on the shared packet fixtures (tests/pipeline_fixtures.py), run in the kernel with
BPF_PROG_TEST_RUN (Katran's way), with the maps filled through the real control library; plus what only this
program has: its struct layouts and counter names against the C sources, and the spread of weights."""
from __future__ import annotations

import os
import random
import time
import re

import pytest

from dataplanes.bpf.bpf_syscall import VERIFIER_LIMIT, obj_get, prog_test_run, prog_verified_insns
from dataplanes.bpf import program
from dataplanes.bpf.program import SOURCE, DataPlane, available
from dataplanes.bpf.tables import (HASH_MUL, STRUCT_SIZES, TCP_COUNTERS, U64_MASK, HotEntry, Tables, key_bucket,
                                   key_hash)
from dataplanes.pipeline import COUNTERS, cumulative_weights
from dataplanes.driver import StreamId
from mbalancer.macs import mac_bytes

pytest.importorskip("scapy.all")
from scapy.all import IP, Ether  # noqa: E402

from tests.pipeline_fixtures import (CASES, CLIENT, CONNECTION_CASES, CONTROLLER, FABRIC_CASES,  # noqa: E402
                                     GET, REPLICAS, SERVERS, STREAM_CASES, Case, closing, reply, request)

why_not = available() if os.geteuid() == 0 else "needs root (bpf syscall, bpffs)"
pytestmark = pytest.mark.skipif(why_not is not None, reason=f"eBPF data plane cannot run here: {why_not}")

VERDICTS = {2: "drop", 7: "forward"}  # TC_ACT_SHOT; TC_ACT_REDIRECT (to the destination's port)
# Each host behind its own switch port. A test run's packets arrive on ifindex 0, and the program learns where
# each source is from that; the runner puts the hosts back on their ports before the packet under test.
HOST_PORTS = {CLIENT[0]: 1, CONTROLLER[0]: 9, **{mac: 2 + i for i, (mac, _, _) in enumerate(SERVERS)}}


def place_hosts(tables: Tables) -> None:
    for mac, ifindex in HOST_PORTS.items():
        tables.set_forward(mac, ifindex)


@pytest.fixture(scope="module")
def plane():
    data_plane = DataPlane(f"fixture{os.getpid()}").load()
    tables = Tables(data_plane.pin_dir)
    tables.set_settings(controller_ifindex=0)
    tables.set_lease(time.monotonic_ns() + 3600 * 10**9)  # a controller that vouches for the copies
    tables.add_memcached_ports(sorted({port for _, _, port in SERVERS}))
    tables.trust(CONTROLLER[1])
    for index, (mac, ip, port) in enumerate(SERVERS):
        tables.set_server(index, mac, ip, port)
    prog = obj_get(str(data_plane.program_pin))
    yield tables, prog
    os.close(prog)
    tables.close()
    data_plane.unload()


def load_state(tables: Tables, case: Case) -> None:
    for stream in list(tables.maps["streams"].keys()):  # connections followed in an earlier case
        tables.maps["streams"].delete(stream)
    for server in range(len(SERVERS)):  # closes seen in an earlier case: handled; unsure requests: checked
        tables.set_closes_handled(server, tables.closes(server))
        tables.rearm_unsure_report(server)
    for slot, hot in enumerate(case.hot):
        tables.set_hot(hot.key, HotEntry(slot, hot.home, REPLICAS, tuple(cumulative_weights(hot.weights))))
        make_clean(tables, slot, hot.home)
        if hot.dirty:
            tables.hold(slot)
        tables.reset_key_counts(slot)
    tables.set_lease(time.monotonic_ns() + (3600 * 10**9 if case.lease else -1))


def make_clean(tables: Tables, slot: int, home: int) -> None:
    """The controller's clear: synced to the counts as they are."""
    tables.set_synced(slot, tables.writes(slot), tables.unsure(home))


@pytest.mark.parametrize("case", CASES + STREAM_CASES + CONNECTION_CASES + FABRIC_CASES, ids=lambda c: c.name)
def test_pipeline_fixture(plane, case):
    tables, prog = plane
    load_state(tables, case)
    try:
        for frame in case.before:
            prog_test_run(prog, frame)
        connection = StreamId(CLIENT[1], 40000, SERVERS[0][1], SERVERS[0][2])
        if case.resume is not None:
            tables.resume_stream(connection, case.resume)
        if case.blind:
            tables.blind_stream(connection)
        place_hosts(tables)
        before, unsure_before = tables.counters(), [tables.unsure(i) for i in range(len(SERVERS))]
        mirrored_before = tables.key_counts(0).mirrored
        out = prog_test_run(prog, case.packet)
        after, unsure_after = tables.counters(), [tables.unsure(i) for i in range(len(SERVERS))]
        assert VERDICTS.get(out.verdict) == case.verdict
        assert out.packet == (case.out or case.packet), Ether(out.packet).show(dump=True)
        if case.counters is not None:
            assert {k: after[k] - before[k] for k in after if after[k] != before[k]} == case.counters
        counts = tables.key_counts(0)
        assert (after["mirrored"] - before["mirrored"], counts.mirrored - mirrored_before) == (
            (1, 1) if case.mirrored else (0, 0))
        assert tables.dirty(0, case.hot[0].home) == (case.hot[0].dirty if case.dirty_after is None
                                                     else case.dirty_after)
        assert [a - b for a, b in zip(unsure_after, unsure_before)] == [
            int(i == case.unsure) for i in range(len(SERVERS))]
        for position, n in case.gets.items():
            assert counts.per_replica[position] == n
    finally:
        for hot in case.hot:
            tables.delete_hot(hot.key)


def test_a_load_interrupted_midway_leaves_no_pins(monkeypatch):
    """Ctrl-C or SIGTERM (an experiment's KeyboardInterrupt) between bpftool's load and its pins: nothing is left
    for the next switch of that name to trip on (an interrupted demo left sw1's pins so)."""
    loading = program.run_tool

    def interrupted_at_the_pins(args: list[str], what: str) -> str:
        if args[:3] == ["bpftool", "prog", "pin"]:
            raise KeyboardInterrupt
        return loading(args, what)

    monkeypatch.setattr(program, "run_tool", interrupted_at_the_pins)
    plane = DataPlane(f"interrupted{os.getpid()}")
    with pytest.raises(KeyboardInterrupt):
        plane.load()
    assert not plane.pin_dir.exists()


def test_struct_sizes_match_the_loaded_maps(plane):
    tables, _ = plane
    for name, (key_size, value_size) in STRUCT_SIZES.items():
        info = tables.maps[name].info
        assert (info.key_size, info.value_size) == (key_size, value_size), name


def test_the_verifier_accepts_the_program_well_under_its_limit(plane):
    """Every branch added to the program multiplies what the verifier walks (706k of its 1M instructions after the
    hot key's byte compare came in): past 85% the next feature would not load on some kernel."""
    _, prog = plane
    walked = prog_verified_insns(prog)
    if walked == 0:
        pytest.skip("this kernel does not report the verifier's count (before 5.16)")
    assert walked <= 0.85 * VERIFIER_LIMIT, f"the verifier walked {walked:,} instructions"


def test_counter_names_follow_the_c_enum():
    source = (SOURCE.parent / "structs.h").read_text()
    enum = source[source.index("enum mb_counter {"):].split("}")[0]
    names = [name.lower() for name in re.findall(r"MB_C_(\w+)", enum) if name != "COUNT"]
    assert tuple(names) == COUNTERS
    enum = source[source.index("enum mb_tcp_counter {"):].split("}")[0]
    assert tuple(f"tcp_{n.lower()}" for n in re.findall(r"MB_TCP_(\w+)", enum) if n != "COUNT") == TCP_COUNTERS


def test_every_server_port_is_a_memcached_port(plane):
    assert plane[0].memcached_ports() == {11211, 11311}


def test_gets_are_spread_in_proportion_to_the_weights(plane):
    tables, prog = plane
    weights = (0.2, 0.3, 0.5)
    tables.set_hot(b"hot", HotEntry(0, 0, REPLICAS, tuple(cumulative_weights(weights))))
    make_clean(tables, 0, 0)
    tables.set_lease(time.monotonic_ns() + 3600 * 10**9)
    rng = random.Random(5)
    seen = {ip: 0 for _, ip, _ in SERVERS}
    gets = 3000
    try:
        for _ in range(gets):
            out = prog_test_run(prog, request(b"get hot\r\n", request_id=rng.randrange(65536),
                                              sport=rng.randrange(1024, 65535)))
            seen[Ether(out.packet)[IP].dst] += 1
    finally:
        tables.delete_hot(b"hot")
    expected = [w * gets for w in weights]
    chi2 = sum((seen[ip] - e) ** 2 / e for (_, ip, _), e in zip(SERVERS, expected))
    assert chi2 < 13.8, (seen, chi2)  # chi-square, 2 degrees of freedom, p = 0.001


def test_cumulative_weights_end_at_one_and_skip_zero_weights():
    assert cumulative_weights([0.5, 0.5]) == [32768, 65536]
    assert cumulative_weights([0.3, 0.7, 0.0]) == [19661, 65536, 65536]
    assert cumulative_weights([0.0, 1.0]) == [0, 65536]


def test_a_flood_of_spoofed_source_macs_does_not_keep_a_new_host_out(plane):
    """The forwarding table is an LRU: 5,000 spoofed source MACs (more than its 4,096 entries) evict old entries;
    a host that appears after them is still learned, and its traffic is not flooded."""
    tables, prog = plane
    for i in range(5000):
        spoofed = f"02:66:{i >> 16 & 0xff:02x}:{i >> 8 & 0xff:02x}:{i & 0xff:02x}:01"
        prog_test_run(prog, bytes(Ether(src=spoofed, dst="ff:ff:ff:ff:ff:ff", type=0x0806) / (b"\x00" * 28)))
    newcomer = "02:00:00:00:00:77"
    prog_test_run(prog, bytes(Ether(src=newcomer, dst="ff:ff:ff:ff:ff:ff", type=0x0806) / (b"\x00" * 28)))
    assert newcomer in tables.forward()
    assert len(tables.forward()) <= 4096


def balanced_destination(tables: Tables, prog: int, key: bytes) -> str:
    """Where the program sends a get for `key` (from the client to server 0)."""
    place_hosts(tables)
    return Ether(prog_test_run(prog, request(b"get " + key + b"\r\n")).packet)[IP].dst


def install_clean(tables: Tables, key: bytes, slot: int) -> None:
    tables.set_hot(key, HotEntry(slot, 0, REPLICAS, tuple(cumulative_weights((0.0, 1.0, 0.0)))))
    make_clean(tables, slot, 0)


@pytest.mark.parametrize("length", [1, 7, 8, 9, 15, 16, 17, 64, 100, 249, 250])
def test_the_filter_finds_hot_keys_of_every_length(plane, length):
    """The program's key hash (over 8-byte words while it scans) is the control library's key_bucket: a hot key of
    any length is found; once removed, its bucket counts nothing and its gets go home."""
    tables, prog = plane
    key = (b"k%d-" % length + bytes(range(0x41, 0x5b)) * 10)[:length]
    tables.set_lease(time.monotonic_ns() + 3600 * 10**9)
    install_clean(tables, key, 0)
    try:
        assert tables.filter_count(key) == 1
        assert balanced_destination(tables, prog, key) == SERVERS[1][1]
    finally:
        tables.delete_hot(key)
    assert tables.filter_count(key) == 0 and balanced_destination(tables, prog, key) == SERVERS[0][1]


def hash_twin(key: bytes) -> bytes:
    """Another key of the same length and the same 64-bit hash: the hash is not keyed, so a client can make one.
    Its first two words change so that the second xor the first times the multiplier stays the same."""
    first, second = (int.from_bytes(key[at:at + 8], "little") for at in (0, 8))
    mixed = (first * HASH_MUL ^ second) & U64_MASK
    rng = random.Random(len(key))
    for _ in range(1_000_000):  # ~3,000 tries expected: every byte of the new second word must be a key byte
        other = int.from_bytes(bytes(rng.randrange(0x21, 0x7f) for _ in range(8)), "little")
        partner = (mixed ^ (other * HASH_MUL)) & U64_MASK
        if other != first and all(0x21 <= b < 0x7f for b in partner.to_bytes(8, "little")):
            return other.to_bytes(8, "little") + partner.to_bytes(8, "little") + key[16:]
    raise AssertionError(f"no twin found for a {len(key)}-byte key")


@pytest.mark.parametrize("length", [16, 20, 250])
def test_a_key_with_a_hot_keys_hash_is_told_apart_by_its_bytes(plane, length):
    """hot_keys is keyed by the key's hash: a get whose key has a hot key's hash but other bytes goes home (the
    program compares the bytes, the last word masked), and the control library refuses it as a second hot key."""
    tables, prog = plane
    hot = (b"hot-" + bytes(range(0x41, 0x5b)) * 10)[:length]
    twin = hash_twin(hot)
    assert twin != hot and len(twin) == len(hot) and key_hash(twin) == key_hash(hot)
    tables.set_lease(time.monotonic_ns() + 3600 * 10**9)
    install_clean(tables, hot, 0)
    try:
        assert balanced_destination(tables, prog, hot) == SERVERS[1][1]
        assert balanced_destination(tables, prog, twin) == SERVERS[0][1]  # not the hot key: home, untouched
        with pytest.raises(ValueError, match="has the hash of hot key"):
            install_clean(tables, twin, 1)
        assert tables.hot(twin) is None and not tables.delete_hot(twin)
        assert tables.hot(hot) is not None and tables.filter_count(hot) == 1
    finally:
        tables.delete_hot(hot)


def test_a_cold_key_in_a_hot_keys_bucket_still_goes_home(plane):
    """Buckets are shared (2^16 of them): the filter only lets a key skip the exact lookup, never decides it."""
    tables, prog = plane
    seen: dict[int, bytes] = {}
    for number in range(100_000):  # a collision among ~300 keys is likely; among 100,000 certain
        key = b"c%d" % number
        if (bucket := key_bucket(key)) in seen:
            hot, cold = seen[bucket], key
            break
        seen[bucket] = key
    tables.set_lease(time.monotonic_ns() + 3600 * 10**9)
    install_clean(tables, hot, 0)
    try:
        assert tables.filter_count(cold) == 1
        assert balanced_destination(tables, prog, cold) == SERVERS[0][1]  # cold: home, untouched
        install_clean(tables, cold, 1)
        assert tables.filter_count(hot) == 2
        tables.set_hot(cold, HotEntry(1, 0, REPLICAS, tuple(cumulative_weights((0.0, 1.0, 0.0)))))  # a reweigh
        assert tables.filter_count(hot) == 2  # counted once per key, not per write
        tables.delete_hot(cold)
        assert tables.filter_count(hot) == 1 and balanced_destination(tables, prog, hot) == SERVERS[1][1]
    finally:
        tables.delete_hot(hot)
        tables.delete_hot(cold)


def with_source_mac(frame: bytes, mac: str) -> bytes:
    out = Ether(frame)
    out.src = mac
    return bytes(out)


def test_a_servers_mac_is_recorded_from_its_tcp_segments_and_its_flooded_gets_counted(plane):
    """What the controller compares with each configured server MAC (controller/mac_check.py): the source MAC of the
    server's TCP segments (a UDP reply's is not taken: in a fabric one may carry another server's MAC), and the
    gets balanced to the server that the switch flooded because it did not know where its configured MAC is."""
    tables, prog = plane
    for index, (mac, ip, port) in enumerate(SERVERS):  # a controller's attach: what was seen is forgotten
        tables.set_server(index, mac, ip, port)
    assert [tables.server_seen(i) for i in range(len(SERVERS))] == [(None, 0)] * len(SERVERS)
    real = "02:00:00:00:00:b2"  # server 1's NIC, where the config says 02:00:00:00:00:02
    prog_test_run(prog, with_source_mac(reply(b"END\r\n", 1, request_id=9), "02:00:00:00:00:c2"))
    assert tables.server_seen(1) == (None, 0)
    prog_test_run(prog, with_source_mac(closing(1, flags="A"), real))  # a segment of a controller's connection
    assert tables.server_seen(1) == (real, 0)
    tables.set_hot(b"hot", HotEntry(0, 0, REPLICAS, tuple(cumulative_weights((0.0, 1.0, 0.0)))))
    make_clean(tables, 0, 0)
    tables.set_lease(time.monotonic_ns() + 3600 * 10**9)
    try:
        place_hosts(tables)  # every configured MAC at its port: the get is sent there
        assert VERDICTS[prog_test_run(prog, GET).verdict] == "forward"
        tables.maps["forward"].delete(mac_bytes(SERVERS[1][0]).ljust(8, b"\0"))  # nobody has the configured MAC
        prog_test_run(prog, GET)
    finally:
        tables.delete_hot(b"hot")
    assert [tables.server_seen(i) for i in range(len(SERVERS))] == [(None, 0), (real, 1), (None, 0)]
    tables.set_server(1, *SERVERS[1])
    assert tables.server_seen(1) == (None, 0)
