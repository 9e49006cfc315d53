"""The protocol module against a real memcached: what it sends parses, what it answers parses."""
import socket

import pytest

from mbalancer.memcache import StreamParser, build_get, build_set, pack_udp_frame, parse_reply, parse_udp_frame
from mbalancer.memcache.frame import reassemble
from mbalancer.memcache.server import MemcachedError, MemcachedServer
from mbalancer.memcache.udp import udp_socket


def _tcp_exchange(server, wire: bytes, replies: int) -> list:
    parser, out = StreamParser(parse_reply, max_value=2 * 1024 * 1024), []
    with socket.create_connection(server.address, timeout=2) as conn:
        conn.sendall(wire)
        while len(out) < replies:
            chunk = conn.recv(65536)
            assert chunk, "server closed the connection"
            out += parser.feed(chunk)
    return out


def test_storage_retrieval_and_errors_over_tcp(memcached):
    wire = (build_set(b"k1", b"hello", flags=7) + build_get(b"k1", b"missing", command="gets")
            + b"add k1 0 0 1\r\nx\r\n" + b"incr k1 1\r\n" + b"delete k1\r\n" + b"delete k1\r\n" + b"bogus\r\n"
            + b"set n 0 0 1\r\n5\r\nincr n 10\r\n")
    out = _tcp_exchange(memcached, wire, replies=9)
    stored, values, not_stored, incr_error, deleted, not_found, error, stored2, number = out
    assert stored.status == "STORED"
    assert [(i.key, i.flags, i.value) for i in values.items] == [(b"k1", 7, b"hello")] and values.items[0].cas
    assert not_stored.status == "NOT_STORED"
    assert incr_error.is_error  # incr on a non-number
    assert (deleted.status, not_found.status) == ("DELETED", "NOT_FOUND")
    assert error.status == "ERROR"
    assert number.value == 15


def test_meta_commands_keep_ttl_visible(memcached):
    out = _tcp_exchange(memcached, b"ms mk 3 T300 F9\r\nabc\r\nmg mk v t f c\r\nmg nope v\r\nmd mk\r\nmn\r\n", 5)
    assert out[0].code == "HD"
    va = out[1]
    assert va.code == "VA" and va.value == b"abc" and b"f9" in va.flags
    ttl = int(next(f for f in va.flags if f.startswith(b"t"))[1:])
    assert 295 <= ttl <= 300
    assert [r.code for r in out[2:]] == ["EN", "HD", "MN"]


def _udp_get(server, key: bytes, request_id: int):
    with udp_socket() as udp:
        udp.settimeout(2)
        udp.sendto(pack_udp_frame(request_id, build_get(key)), server.address)
        parts, total = {}, None
        while total is None or len(parts) < total:
            frame, payload = parse_udp_frame(udp.recv(65536))
            assert frame.request_id == request_id
            parts[frame.sequence], total = payload, frame.total
        return total, parse_reply(reassemble(parts, total), max_value=2 << 20)


def test_udp_get_single_datagram(memcached):
    _tcp_exchange(memcached, build_set(b"small", b"v" * 100), 1)
    total, reply = _udp_get(memcached, b"small", 0xBEEF)
    assert total == 1 and reply.items[0].value == b"v" * 100


def test_udp_reply_of_a_megabyte_value_reassembles(memcached):
    value = bytes(range(256)) * 4096  # 1 MiB
    assert _tcp_exchange(memcached, build_set(b"huge", value), 1)[0].status == "STORED"
    total, reply = _udp_get(memcached, b"huge", 4242)
    assert total > 700  # about 1400 bytes a datagram
    assert reply.items[0].value == value


def test_250_byte_key_round_trip_and_251_refused(memcached):
    key = b"k" * 250
    out = _tcp_exchange(memcached, build_set(key, b"x") + build_get(key), 2)
    assert out[0].status == "STORED" and out[1].items[0].key == key
    # Sent on its own: memcached 1.6 drops the replies still queued in a batch when a key is over 250 bytes.
    assert _tcp_exchange(memcached, b"get " + b"k" * 251 + b"\r\n", 1)[0].status == "CLIENT_ERROR"


def test_server_launcher_reports_a_bad_start():
    with pytest.raises(MemcachedError, match="exited"):
        MemcachedServer(extra_args=["--no-such-option"]).start()
