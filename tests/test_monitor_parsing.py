"""The monitor's frame decoding and key extraction, on crafted and hostile packets."""
from __future__ import annotations

import random
import struct

import pytest

from mbalancer.memcache.frame import pack_udp_frame
from mbalancer.packets import (LINKTYPE_ETHERNET, LINKTYPE_LINUX_SLL, LINKTYPE_LINUX_SLL2, LINKTYPE_NULL, LINKTYPE_RAW,
                            TCP, UDP, Segment, memcached_segment)
from mbalancer.memcache.segment_keys import get_keys
from monitor.monitor import Monitor
from experiments.workload.trace import ethernet, ipv4, tcp_frame, udp_frame


def test_udp_and_tcp_requests_to_the_port():
    assert memcached_segment(udp_frame(b"get a\r\n"), LINKTYPE_ETHERNET, 11211) == Segment(
        UDP, pack_udp_frame(1, b"get a\r\n"), "10.0.0.2:11211")
    assert memcached_segment(tcp_frame(b"get a\r\n", dst="10.0.0.7"), LINKTYPE_ETHERNET, 11211) == Segment(
        TCP, b"get a\r\n", "10.0.0.7:11211", "10.0.0.1:40000", 1)  # the destination: the server the client chose;
    # a TCP segment also says where it came from and its sequence number (the controller follows connections)


def test_other_link_types_and_vlan():
    ip_packet = ipv4(17, struct.pack("!HHHH", 1, 11211, 16, 0) + pack_udp_frame(1, b"get k\r\n"))
    vlan = ethernet(b"\x00\x05\x08\x00" + ip_packet, ethertype=0x8100)
    sll = struct.pack("!HHH8sH", 0, 1, 6, b"", 0x0800) + ip_packet
    sll2 = struct.pack("!HHIHBB8s", 0x0800, 0, 1, 1, 0, 6, b"") + ip_packet
    null = struct.pack("<I", 2) + ip_packet
    for frame, linktype in ((vlan, LINKTYPE_ETHERNET), (ip_packet, LINKTYPE_RAW), (sll, LINKTYPE_LINUX_SLL),
                            (sll2, LINKTYPE_LINUX_SLL2), (null, LINKTYPE_NULL)):
        segment = memcached_segment(frame, linktype, 11211)
        assert isinstance(segment, Segment) and get_keys(segment) == [b"k"], linktype


@pytest.mark.parametrize("frame, reason", [
    (udp_frame(b"get a\r\n", dport=80), "other port"),
    (ethernet(b"\x60" + b"\x00" * 39, ethertype=0x86DD), "not IPv4"),
    (ethernet(ipv4(1, b"\x08\x00" * 4)), "not UDP or TCP"),
    (ethernet(ipv4(17, b"\x00" * 20, flags_fragment=0x0010)), "IPv4 fragment"),
    (udp_frame(b"get a\r\n")[:30], "truncated IPv4"),
    (udp_frame(b"get a\r\n")[:38], "truncated UDP"),
    (tcp_frame(b"")[:40], "truncated TCP"),
])
def test_frames_that_are_not_requests(frame, reason):
    assert memcached_segment(frame, LINKTYPE_ETHERNET, 11211) == reason


def test_ethernet_padding_is_not_payload():
    padded = udp_frame(b"get k\r\n") + b"\x00" * 10
    assert get_keys(memcached_segment(padded, LINKTYPE_ETHERNET, 11211)) == [b"k"]


@pytest.mark.parametrize("payload, keys", [
    (b"get k1\r\n", [b"k1"]),
    (b"get k1 k2 k3\r\n", [b"k1", b"k2", b"k3"]),
    (b"gets k1\r\n", [b"k1"]),
    (b"gat 10 k1 k2\r\n", [b"k1", b"k2"]),
    (b"mg k1 v t\r\n", [b"k1"]),
    (b"set k1 0 0 1\r\nx\r\n", []),
    (b"k" * 250, "truncated request"),
])
def test_keys_of_udp_requests(payload, keys):
    assert get_keys(Segment(UDP, pack_udp_frame(7, payload))) == keys


def test_several_requests_in_one_tcp_segment_and_a_partial_tail():
    segment = Segment(TCP, b"get a\r\nset b 0 0 1\r\nx\r\nget c d\r\nget e")
    assert get_keys(segment) == [b"a", b"c", b"d"]


@pytest.mark.parametrize("segment, reason", [
    (Segment(UDP, b"\x00\x01"), "bad UDP frame"),
    (Segment(UDP, pack_udp_frame(1, b"get a\r\n", sequence=0, total=2)), "multi-datagram request"),
    (Segment(UDP, pack_udp_frame(1, b"\x80\x00\x00\x05" + b"\x00" * 20)), "binary protocol"),
    (Segment(TCP, b"\x81" + b"\x00" * 23), "binary protocol"),
    (Segment(UDP, pack_udp_frame(1, b"get " + b"k" * 251 + b"\r\n")), "invalid key"),
    (Segment(TCP, b"GET / HTTP/1.1\r\n\r\n"), "not memcached"),
    (Segment(TCP, b"get a\x00b\r\n"), "invalid key"),
    (Segment(TCP, b"get a\rb\r\n"), "invalid key"),
    (Segment(TCP, b"get\r\n"), "invalid key"),  # none where one is needed
    (Segment(TCP, b"delete k 5\r\n"), "not memcached"),  # malformed: its words name a key, it is not about one
    (Segment(UDP, pack_udp_frame(1, b"set k 0 0\r\n")), "not memcached"),
])
def test_unreadable_requests_say_why(segment, reason):
    assert get_keys(segment) == reason


def test_250_byte_key_is_counted():
    assert get_keys(Segment(UDP, pack_udp_frame(1, b"get " + b"k" * 250 + b"\r\n"))) == [b"k" * 250]


def test_keys_with_control_bytes_are_read_as_memcached_reads_them():
    memcaslap_key = b"\x10" * 8 + b"joD9mL4Q"  # libmemcached's memcaslap writes keys like this
    assert get_keys(Segment(UDP, pack_udp_frame(1, b"get " + memcaslap_key + b"\r\n"))) == [memcaslap_key]
    assert get_keys(Segment(TCP, b"get a\tb \x7f\r\n")) == [b"a\tb", b"\x7f"]


def test_random_and_mutated_packets_never_crash_and_are_counted():
    rng = random.Random(5)
    good = [udp_frame(b"get key:%d\r\n" % i) for i in range(20)] + [tcp_frame(b"get a b\r\n")]
    reports = []
    monitor = Monitor(reports.append, interval=1.0)
    frames = 0
    for i in range(20_000):
        if i % 3 == 0:
            frame = bytes(rng.getrandbits(8) for _ in range(rng.randrange(0, 120)))
        else:
            frame = bytearray(rng.choice(good))
            for _ in range(rng.randrange(1, 4)):
                frame[rng.randrange(len(frame))] = rng.getrandbits(8)
            frame = bytes(frame[:rng.randrange(len(frame) + 1)]) if i % 7 == 0 else bytes(frame)
        monitor.frame(i * 1e-4, LINKTYPE_ETHERNET, frame)
        frames += 1
    monitor.finish()
    totals = monitor.totals
    assert totals["packets"] == frames
    assert totals["skipped"] > 0 and totals["ignored"] > 0 and totals["gets"] > 0


def test_reports_say_where_the_clients_sent_each_key_and_how_many_gets_each_server_got():
    reports = []
    monitor = Monitor(reports.append, interval=1.0, top=2)
    frames = ([udp_frame(b"get hot\r\n", dst="10.0.0.3")] * 30 + [udp_frame(b"get warm\r\n", dst="10.0.0.1")] * 10
              + [tcp_frame(b"get c1 c2\r\n", dst="10.0.0.1")] * 5)  # a multi-key get counts each key
    for i, frame in enumerate(frames):
        monitor.frame(i * 0.01, LINKTYPE_ETHERNET, frame)
    monitor.finish(1.0)
    report = reports[0]
    assert report["servers"] == {"10.0.0.1:11211": 20.0, "10.0.0.3:11211": 30.0}
    assert [(t["key"], t["server"]) for t in report["top"]] == [("hot", "10.0.0.3:11211"), ("warm", "10.0.0.1:11211")]
