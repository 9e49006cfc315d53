"""The eBPF data plane on packet fixtures, run in the kernel with BPF_PROG_TEST_RUN (Katran's way): each case is a
packet in, the verdict and the packet out, with the maps filled through the real control library."""
from __future__ import annotations

import os
import random
import struct

import pytest

from topologies.ebpf.bpf_syscall import obj_get, prog_test_run
from topologies.ebpf.program import DataPlane, available
from topologies.ebpf.tables import STRUCT_SIZES, HotEntry, Tables, cumulative_weights

scapy = pytest.importorskip("scapy.all")
from scapy.all import IP, TCP, UDP, Ether, Raw  # noqa: E402

why_not = available() if os.geteuid() == 0 else "needs root (bpf syscall, bpffs)"
pytestmark = pytest.mark.skipif(why_not is not None, reason=f"eBPF data plane cannot run here: {why_not}")

TC_ACT_SHOT, TC_ACT_REDIRECT = 2, 7
CLIENT = ("02:00:00:00:00:aa", "10.0.0.100")
SERVERS = [("02:00:00:00:00:01", "10.0.0.1", 11211), ("02:00:00:00:00:02", "10.0.0.2", 11211),
           ("02:00:00:00:00:03", "10.0.0.3", 11311)]
HOME = 0


@pytest.fixture(scope="module")
def plane():
    data_plane = DataPlane(f"fixture{os.getpid()}").load()
    tables = Tables(data_plane.pin_dir)
    tables.set_settings(controller_ifindex=0)
    for index, (mac, ip, port) in enumerate(SERVERS):
        tables.set_server(index, mac, ip, port)
        tables.set_forward(mac, 1)
    tables.set_forward(CLIENT[0], 1)
    prog = obj_get(str(data_plane.program_pin))
    yield tables, prog
    os.close(prog)
    tables.close()
    data_plane.unload()


@pytest.fixture
def hot(plane):
    """Make keys hot for one test: hot(key, weights, slot) with weights over servers 0, 1, 2."""
    tables, _ = plane
    made = []

    def make(key: bytes, weights=(0.0, 1.0, 0.0), slot: int = 0, dirty: bool = False) -> None:
        tables.set_hot(key, HotEntry(slot, HOME, (0, 1, 2), tuple(cumulative_weights(weights))))
        tables.set_dirty(slot, dirty)
        tables.reset_key_counts(slot)
        made.append(key)

    yield make
    for key in made:
        tables.delete_hot(key)


def request(payload: bytes, request_id: int = 7, sport: int = 40000, udp: bool = True, frame: bool = True,
            flags: int = 0, frag: int = 0) -> bytes:
    mac, ip, port = SERVERS[HOME]
    header = struct.pack("!HHHH", request_id, 0, 1, 0) if udp and frame else b""
    l4 = UDP(sport=sport, dport=port) if udp else TCP(sport=sport, dport=port, flags="PA")
    return bytes(Ether(src=CLIENT[0], dst=mac) / IP(src=CLIENT[1], dst=ip, flags=flags, frag=frag) / l4
                 / Raw(header + payload))


def run(plane, packet: bytes):
    _, prog = plane
    return prog_test_run(prog, packet)


def checksums_valid(packet: bytes) -> bool:
    parsed = Ether(packet)
    rebuilt = parsed.copy()
    del rebuilt[IP].chksum
    layer = UDP if UDP in rebuilt else TCP
    del rebuilt[layer].chksum
    rebuilt = Ether(bytes(rebuilt))
    return rebuilt[IP].chksum == parsed[IP].chksum and rebuilt[layer].chksum == parsed[layer].chksum


def counters_delta(plane, before: dict) -> dict:
    after = plane[0].counters()
    return {k: after[k] - before[k] for k in after if after[k] != before[k]}


def test_struct_sizes_match_the_loaded_maps(plane):
    tables, _ = plane
    for name, (key_size, value_size) in STRUCT_SIZES.items():
        info = tables.maps[name].info
        assert (info.key_size, info.value_size) == (key_size, value_size), name


def test_a_hot_get_goes_to_the_chosen_replica_rewritten_and_marked(plane, hot):
    hot(b"hot")
    before = plane[0].counters()
    out = run(plane, request(b"get hot\r\n"))
    assert out.verdict == TC_ACT_REDIRECT
    packet = Ether(out.packet)
    assert (packet.dst, packet[IP].dst, packet[UDP].dport) == SERVERS[1]
    assert packet[IP].flags.evil  # the reserved bit: "already balanced"
    assert checksums_valid(out.packet)
    assert bytes(packet[UDP].payload)[8:] == b"get hot\r\n"
    assert counters_delta(plane, before) == {"packets": 1, "memcached": 1, "balanced": 1}
    counts = plane[0].key_counts(0)
    assert (counts.gets, counts.per_replica[:3]) == (1, [0, 1, 0])


def test_a_replica_on_another_port_gets_its_port(plane, hot):
    hot(b"hot", weights=(0.0, 0.0, 1.0))
    packet = Ether(run(plane, request(b"gets hot\r\n")).packet)
    assert (packet.dst, packet[IP].dst, packet[UDP].dport) == SERVERS[2]
    assert checksums_valid(bytes(packet))


def test_a_dirty_key_is_sent_home_unchanged(plane, hot):
    hot(b"hot", dirty=True)
    packet = request(b"get hot\r\n")
    out = run(plane, packet)
    assert out.verdict == TC_ACT_REDIRECT and out.packet == packet
    counts = plane[0].key_counts(0)
    assert counts.gets == counts.home_while_dirty == 1


@pytest.mark.parametrize("payload", [b"get cold\r\n", b"get hot other\r\n", b"get hot\r\nget hot\r\n",
                                     b"get hot", b"get hot \r\n", b"gat 0 hot\r\n"])
def test_other_gets_reach_their_home_untouched(plane, hot, payload):
    hot(b"hot")
    packet = request(payload)
    out = run(plane, packet)
    assert out.verdict == TC_ACT_REDIRECT and out.packet == packet


def test_a_250_byte_key_is_balanced_and_a_251_byte_key_left_alone(plane, hot):
    longest = b"k" * 250
    hot(longest)
    out = run(plane, request(b"get " + longest + b"\r\n"))
    assert Ether(out.packet)[IP].dst == SERVERS[1][1] and checksums_valid(out.packet)
    before = plane[0].counters()
    packet = request(b"get " + b"k" * 251 + b"\r\n")
    out = run(plane, packet)
    assert out.packet == packet
    assert counters_delta(plane, before) == {"packets": 1, "memcached": 1, "unparsed": 1}


def test_a_get_over_tcp_is_not_balanced(plane, hot):
    hot(b"hot")
    packet = request(b"get hot\r\n", udp=False)
    assert run(plane, packet).packet == packet


@pytest.mark.parametrize("payload, udp", [(b"set hot 0 0 1\r\nx\r\n", True), (b"delete hot\r\n", True),
                                          (b"set hot 0 0 100000\r\n" + b"x" * 1000, False),
                                          (b"incr hot 1\r\n", False), (b"touch hot 10\r\n", True)])
def test_a_write_to_a_hot_key_is_forwarded_unchanged_and_sets_the_dirty_bit(plane, hot, payload, udp):
    hot(b"hot")
    before = plane[0].counters()
    packet = request(payload, udp=udp)
    out = run(plane, packet)
    assert out.verdict == TC_ACT_REDIRECT and out.packet == packet
    assert plane[0].dirty(0)
    assert plane[0].key_counts(0).mirrored == 1
    assert counters_delta(plane, before)["mirrored"] == 1


def test_a_write_to_a_cold_key_changes_nothing(plane, hot):
    hot(b"hot")
    run(plane, request(b"set cold 0 0 1\r\nx\r\n"))
    assert not plane[0].dirty(0)


@pytest.mark.parametrize("packet", [
    request(b"\x80\x00\x00\x03hot\x00"),                      # binary protocol
    request(b"garbage\r\n"),                                  # not a command
    request(b"get hot\r\n", frame=False),                     # no frame header
    request(b"get h\x01t\r\n"),                               # control character in the key
    request(b"get hot\r\n", flags=1),                         # more fragments
    request(b"", frame=False),                                # empty UDP
    request(b"get hot\r\n")[:40],                             # cut inside the UDP header
    bytes(Ether(src=CLIENT[0], dst=SERVERS[0][0], type=0x0806) / Raw(b"\x00" * 28)),  # ARP
])
def test_malformed_or_foreign_packets_are_forwarded_untouched(plane, hot, packet):
    hot(b"hot")
    out = run(plane, packet)
    assert out.verdict == TC_ACT_REDIRECT and out.packet == packet


def test_an_already_balanced_get_is_not_balanced_again(plane, hot):
    hot(b"hot")
    before = plane[0].counters()
    packet = request(b"get hot\r\n", flags=4)  # the reserved bit
    assert run(plane, packet).packet == packet
    assert counters_delta(plane, before)["already_balanced"] == 1


def test_replies_to_balanced_gets_carry_the_home_address(plane, hot):
    hot(b"hot")
    run(plane, request(b"get hot\r\n", request_id=4242, sport=40001))
    mac, ip, port = SERVERS[1]
    for sequence in (0, 1):  # every datagram of a two-datagram reply
        reply = bytes(Ether(src=mac, dst=CLIENT[0]) / IP(src=ip, dst=CLIENT[1]) / UDP(sport=port, dport=40001)
                      / Raw(struct.pack("!HHHH", 4242, sequence, 2, 0) + b"VALUE hot 0 1\r\nx\r\nEND\r\n"))
        out = Ether(run(plane, reply).packet)
        assert (out.src, out[IP].src, out[UDP].sport) == SERVERS[HOME]
        assert checksums_valid(bytes(out))
    other = bytes(Ether(src=mac, dst=CLIENT[0]) / IP(src=ip, dst=CLIENT[1]) / UDP(sport=port, dport=40001)
                  / Raw(struct.pack("!HHHH", 999, 0, 1, 0) + b"END\r\n"))
    assert run(plane, other).packet == other


def test_a_zero_udp_checksum_stays_zero(plane, hot):
    hot(b"hot")
    packet = bytearray(request(b"get hot\r\n"))
    packet[14 + 20 + 6:14 + 20 + 8] = b"\x00\x00"
    out = run(plane, bytes(packet))
    assert out.packet[14 + 20 + 6:14 + 20 + 8] == b"\x00\x00"


def test_gets_are_spread_in_proportion_to_the_weights(plane, hot):
    weights = (0.2, 0.3, 0.5)
    hot(b"hot", weights=weights)
    rng = random.Random(5)
    seen = {ip: 0 for _, ip, _ in SERVERS}
    gets = 3000
    for _ in range(gets):
        out = run(plane, request(b"get hot\r\n", request_id=rng.randrange(65536), sport=rng.randrange(1024, 65535)))
        seen[Ether(out.packet)[IP].dst] += 1
    expected = [w * gets for w in weights]
    chi2 = sum((seen[ip] - e) ** 2 / e for (_, ip, _), e in zip(SERVERS, expected))
    assert chi2 < 13.8, (seen, chi2)  # chi-square, 2 degrees of freedom, p = 0.001


def test_cumulative_weights_end_at_one_and_skip_zero_weights():
    assert cumulative_weights([0.5, 0.5]) == [32768, 65536]
    assert cumulative_weights([0.3, 0.7, 0.0]) == [19661, 65536, 65536]
    assert cumulative_weights([0.0, 1.0]) == [0, 65536]


def test_a_write_to_a_replica_is_not_mirrored(plane, hot):
    """The controller's own copies go to the replicas: they must not set the bit or come back as mirrors."""
    hot(b"hot")
    mac, ip, port = SERVERS[1]
    packet = bytes(Ether(src=CLIENT[0], dst=mac) / IP(src=CLIENT[1], dst=ip) / TCP(sport=40000, dport=port)
                   / Raw(b"ms hot 1 T0\r\nx\r\n"))
    assert run(plane, packet).packet == packet
    assert not plane[0].dirty(0) and plane[0].key_counts(0).mirrored == 0
