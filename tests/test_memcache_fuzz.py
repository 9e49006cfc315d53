"""Garbage never raises: 10^5 random and mutated packets through every parser, the stream parser included."""
import random

from mbalancer.memcache import NotParsed, StreamParser, parse_reply, parse_request, parse_udp_frame
from mbalancer.memcache.replies import MetaReply, NumberReply, StatusReply, ValuesReply
from mbalancer.memcache.requests import Request

SEEDS = [b"get k\r\n", b"gets a b c\r\n", b"gat 10 k\r\n", b"set k 1 2 3\r\nabc\r\n", b"cas k 0 0 1 9\r\nx\r\n",
         b"delete k noreply\r\n", b"incr k 7\r\n", b"touch k 5\r\n", b"mg k v t\r\n", b"ms k 2 T5\r\nhi\r\n",
         b"md k q\r\n", b"mn\r\n", b"VALUE k 0 3\r\nabc\r\nEND\r\n", b"VALUE a 1 1 5\r\nx\r\nEND\r\n", b"END\r\n",
         b"STORED\r\n", b"SERVER_ERROR oops\r\n", b"VA 2 f1\r\nhi\r\n", b"EN\r\n", b"42\r\n",
         b"\x80\x00\x00\x05\x00\x00\x00\x00"]
TOKENS = [b"get", b"set", b"VALUE", b"END", b"\r\n", b" ", b"\r", b"\n", b"-1", b"99999999999999999999999",
          b"noreply", b"\x00", b"\xff", b"k" * 251, b"0"]


def _mutate(rng: random.Random, data: bytes) -> bytes:
    data = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(5)
        pos = rng.randint(0, len(data))
        if op == 0 and data:
            data[min(pos, len(data) - 1)] = rng.randrange(256)
        elif op == 1:
            data[pos:pos] = rng.choice(TOKENS)
        elif op == 2:
            del data[pos:pos + rng.randint(1, 8)]
        elif op == 3:
            data = data[:pos]
        else:
            data[pos:pos] = rng.randbytes(rng.randint(1, 16))
    return bytes(data)


def test_fuzz_every_parser_with_100k_packets():
    rng = random.Random(2016)
    parsed = {"request": 0, "reply": 0}
    request_stream, reply_stream = StreamParser(parse_request), StreamParser(parse_reply)
    for i in range(100_000):
        if i % 4 == 0:
            packet = rng.randbytes(rng.randint(0, 64))
        else:
            packet = _mutate(rng, rng.choice(SEEDS))
        req = parse_request(packet)
        assert isinstance(req, (Request, NotParsed))
        parsed["request"] += isinstance(req, Request)
        rep = parse_reply(packet)
        assert isinstance(rep, (ValuesReply, StatusReply, NumberReply, MetaReply, NotParsed))
        parsed["reply"] += not isinstance(rep, NotParsed)
        assert isinstance(parse_udp_frame(packet), (tuple, NotParsed))
        for item in request_stream.feed(packet) + reply_stream.feed(packet):
            assert isinstance(item, (Request, ValuesReply, StatusReply, NumberReply, MetaReply, NotParsed))
        if isinstance(req, Request):  # whatever parses must be self-consistent
            assert 0 < req.size <= len(packet) and all(0 < len(k) <= 250 for k in req.keys)
    # The mutations keep many packets legal, so both the accept and the refuse paths were exercised.
    assert parsed["request"] > 1_000 and parsed["reply"] > 1_000
