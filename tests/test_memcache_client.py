"""The blocking clients against a real memcached: UDP (ours) and TCP (pymemcache)."""
from __future__ import annotations

import socket

import pytest

from mbalancer.memcache.addresses import ServerAddress, parse_server, parse_servers
from mbalancer.memcache.client import MAX_UDP_REQUEST, UdpClient, tcp_client
from mbalancer.memcache.frame import pack_udp_frame
from mbalancer.memcache.hashing import KetamaHash
from mbalancer.memcache.pending import STRAY, PendingReply
from tests.udp_relay import UdpRelay


@pytest.fixture
def server(memcached) -> ServerAddress:
    return ServerAddress(*memcached.address)


def test_udp_get_hit_records_who_answered(server):
    assert tcp_client(server).set(b"c:hit", b"hello", flags=7)  # True: stored, and pymemcache waited for it
    with UdpClient() as client:
        result = client.get(b"c:hit", server)
    assert result.outcome == "hit" and result.value == b"hello"
    assert result.reply.items[0].flags == 7
    assert result.asked == result.answered == server
    assert 0 < result.latency < 1


def test_udp_miss_and_set_then_get(server):
    with UdpClient() as client:
        assert client.get(b"c:absent", server).outcome == "miss"
        assert client.set(b"c:udpset", b"v" * 1000, server=server).outcome == "stored"
        assert client.get(b"c:udpset", server).value == b"v" * 1000


def test_udp_get_of_a_megabyte_value(server):
    value = bytes(range(256)) * 4096
    assert tcp_client(server).set(b"c:big", value)
    with UdpClient() as client:
        result = client.get(b"c:big", server)
    assert result.outcome == "hit" and result.value == value


def test_servers_chosen_by_the_hash(server):
    other = ServerAddress("127.0.0.1", 9)  # discard port: never answers
    servers = [server, other]
    ketama = KetamaHash(servers)
    mine = next(k for k in (b"c:h%d" % i for i in range(100)) if ketama.server_of(k) == 0)
    with UdpClient(servers, ketama, timeout=0.2) as client:
        assert client.get(mine).asked == server
    with pytest.raises(ValueError, match="no server given"):
        UdpClient().get(b"k")


def test_reply_from_another_address_is_accepted_and_recorded(server):
    with UdpRelay(server, answer_from_other_port=True) as replica, UdpClient() as client:
        tcp_client(server).set(b"c:steer", b"x")
        result = client.get(b"c:steer", ServerAddress(*replica.address))
    assert result.outcome == "hit"
    assert result.asked == ServerAddress(*replica.address)
    assert result.answered == ServerAddress(*replica.answer_address) != result.asked


def test_timeout_then_the_late_reply_is_not_taken_for_the_next_answer(server):
    tcp_client(server).set(b"c:late", b"first")
    tcp_client(server).set(b"c:next", b"second")
    with UdpRelay(server, delays=(0.3,)) as slow, UdpClient(timeout=0.25) as client:
        relay = ServerAddress(*slow.address)
        first = client.get(b"c:late", relay)
        assert first.outcome == "timeout" and first.answered is None and first.latency >= 0.25
        # The relay sends the late reply to c:late while the client waits for c:next.
        second = client.get(b"c:next", relay)
    assert second.outcome == "hit" and second.value == b"second"
    assert client.strays == 1


def test_timeout_when_nobody_answers():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as silent:
        silent.bind(("127.0.0.1", 0))
        with UdpClient(timeout=0.1) as client:
            result = client.get(b"k", ServerAddress(*silent.getsockname()))
    assert result.outcome == "timeout" and result.reply is None


def test_request_too_big_for_one_datagram_is_refused(server):
    with UdpClient() as client, pytest.raises(ValueError, match="TCP only"):
        client.set(b"k", b"x" * MAX_UDP_REQUEST, server=server)


def test_invalid_key_is_refused_before_sending(server):
    with UdpClient() as client, pytest.raises(ValueError, match="over 250"):
        client.get(b"k" * 251, server)


def test_pending_reply_assembles_out_of_order_and_rejects_strays():
    pending = PendingReply(0x1_0005)  # ids are 16-bit
    assert pending.request_id == 5
    assert pending.accept(pack_udp_frame(6, b"x")) is STRAY
    assert pending.accept(b"\x00\x05") is STRAY
    assert pending.accept(pack_udp_frame(5, b"cd", sequence=1, total=2)) is None
    assert pending.accept(pack_udp_frame(5, b"zz", sequence=1, total=3)) is STRAY  # another count: not ours
    assert pending.accept(pack_udp_frame(5, b"ab", sequence=0, total=2)) == b"abcd"


@pytest.mark.parametrize("text, expected", [("10.0.0.1:11211", ("10.0.0.1", 11211)), ("10.0.0.2", ("10.0.0.2", 11211)),
                                            (" 10.0.0.3:5 ", ("10.0.0.3", 5)),
                                            ("localhost:11311", ("127.0.0.1", 11311))])  # a name: its IPv4 address
def test_parse_server(text, expected):
    assert parse_server(text) == expected


@pytest.mark.parametrize("text, message", [("no-such-host.invalid:1", "does not resolve"),
                                           (":11211", "give a host"), ("a..b", "IPv4"), ("10.0.0.1:0", "port"),
                                           ("10.0.0.1:x", "port"),
                                           ("10.0.0.1:70000", "port"), ("", "no server"),
                                           ("10.0.0.1,10.0.0.1:11211", "twice")])
def test_parse_servers_errors(text, message):
    with pytest.raises(ValueError, match=message):
        parse_servers(text)
