"""The shared memcached protocol module: requests, replies, UDP frames, keys, TCP streams."""
import pytest

from mbalancer.memcache import (NotParsed, StreamParser, Unreadable, build_get, build_set, pack_udp_frame,
                                parse_reply, parse_request, parse_udp_frame)
from mbalancer.memcache.frame import reassemble
from mbalancer.memcache.keys import key_problem


# --- requests ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("raw,command,keys", [
    (b"get foo\r\n", "get", (b"foo",)),
    (b"gets foo\r\n", "gets", (b"foo",)),
    (b"get a b c\r\n", "get", (b"a", b"b", b"c")),
    (b"get  spaced   out\r\n", "get", (b"spaced", b"out")),
    (b"gat 30 a b\r\n", "gat", (b"a", b"b")),
    (b"gats -1 a\r\n", "gats", (b"a",)),
    (b"delete k\r\n", "delete", (b"k",)),
    (b"delete k 0 noreply\r\n", "delete", (b"k",)),
    (b"incr k 5\r\n", "incr", (b"k",)),
    (b"decr k 18446744073709551615 noreply\r\n", "decr", (b"k",)),
    (b"touch k 100\r\n", "touch", (b"k",)),
    (b"mg k v f t\r\n", "mg", (b"k",)),
    (b"md k q\r\n", "md", (b"k",)),
    (b"ma k MI D5\r\n", "ma", (b"k",)),
    (b"mn\r\n", "mn", ()),
    (b"version\r\n", "version", ()),
])
def test_requests_without_data(raw, command, keys):
    req = parse_request(raw)
    assert req and req.command == command and req.keys == keys and req.size == len(raw)


def test_request_properties_the_switch_cares_about():
    assert parse_request(b"get k\r\n").is_single_key_get
    assert not parse_request(b"get a b\r\n").is_single_key_get
    assert parse_request(b"get a b\r\n").is_get
    assert parse_request(b"mg k v\r\n").is_get and not parse_request(b"mg k v\r\n").is_single_key_get
    for raw in (b"set k 0 0 1\r\nx\r\n", b"delete k\r\n", b"incr k 1\r\n", b"touch k 1\r\n", b"md k\r\n",
                b"ms k 1\r\nx\r\n", b"cas k 0 0 1 5\r\nx\r\n", b"append k 0 0 1\r\nx\r\n"):
        assert parse_request(raw).is_write, raw
    assert not parse_request(b"get k\r\n").is_write


@pytest.mark.parametrize("command", ["set", "add", "replace", "append", "prepend"])
def test_storage_commands_carry_their_data(command):
    raw = f"{command} key 42 3600 5 noreply\r\nhe\r\no\r\n".encode()
    req = parse_request(raw + b"get next\r\n")
    assert (req.command, req.key, req.flags, req.exptime, req.data, req.noreply) == (command, b"key", 42, 3600,
                                                                                     b"he\r\no", True)
    assert req.size == len(raw)


def test_cas_and_meta_set():
    req = parse_request(b"cas k 1 0 2 77\r\nab\r\n")
    assert (req.cas, req.data, req.noreply) == (77, b"ab", False)
    req = parse_request(b"ms k 2 T60 F3 q\r\nab\r\n")
    assert (req.data, req.meta_flags, req.noreply) == (b"ab", (b"T60", b"F3", b"q"), True)
    assert req.is_write


@pytest.mark.parametrize("raw,reason", [
    (b"\x80\x00\x00\x03", "binary"), (b"\x81\x00", "binary"),
    (b"bogus k\r\n", "unknown command"), (b"GET k\r\n", "unknown command"),
    (b"get\r\n", "without a key"), (b"\r\n", "empty"), (b"\xff\xfe k\r\n", "ASCII"),
    (b"set k 0 0 abc\r\nabc\r\n", "malformed number"), (b"set k 0 0\r\n", "takes"),
    (b"set k 0 0 3\r\nabcd\r\n", "does not end"), (b"set k -1 0 1\r\nx\r\n", "malformed number"),
    (b"set k 4294967296 0 1\r\nx\r\n", "malformed number"), (b"cas k 0 0 1\r\nx\r\n", "takes"),
    (b"incr k -1\r\n", "malformed number"), (b"incr k\r\n", "takes"), (b"touch k x\r\n", "malformed"),
    (b"delete k 5\r\n", "delete takes"), (b"gat x k\r\n", "expiry"), (b"ms k\r\n", "datalen"),
    (b"mg k !\r\n", "malformed flag"), (b"get k\x00ey\r\n", "NUL byte"), (b"set k 0 0 2000000\r\n", "limit"),
])
def test_bad_requests_say_why(raw, reason):
    result = parse_request(raw)
    assert isinstance(result, NotParsed) and not result
    assert reason in result.reason


@pytest.mark.parametrize("raw, kind", [
    (b"\x80\x00\x00\x03", Unreadable.BINARY), (b"bogus k\r\n", Unreadable.UNKNOWN_COMMAND),
    (b"\xff\xfe k\r\n", Unreadable.UNKNOWN_COMMAND), (b"get\r\n", Unreadable.INVALID_KEY),
    (b"get k\x00ey\r\n", Unreadable.INVALID_KEY), (b"get " + b"k" * 251 + b"\r\n", Unreadable.INVALID_KEY),
    (b"set k 0 0\r\n", Unreadable.MALFORMED), (b"delete k 5\r\n", Unreadable.MALFORMED),
    (b"gat x k\r\n", Unreadable.MALFORMED), (b"ms k\r\n", Unreadable.MALFORMED),
    (b"set k 0 0 2000000\r\n", Unreadable.MALFORMED), (b"set k 0 0 5\r\nab", Unreadable.TRUNCATED),
])
def test_what_a_parser_cannot_read_is_typed_not_read_from_its_words(raw, kind):
    """Logic and counters read the kind; the words (which may name a key without being about one) are for people."""
    assert parse_request(raw).kind is kind


def test_truncated_requests_are_incomplete_not_wrong():
    for raw in (b"get fo", b"set k 0 0 5\r\nab", b"", b"set k 0 0 5\r\nabcde"):
        result = parse_request(raw)
        assert isinstance(result, NotParsed) and result.incomplete, raw


def test_over_long_lines_are_refused():
    assert "no end of line" in parse_request(b"get " + b"k" * 70_000).reason
    assert not parse_request(b"get " + b"k" * 70_000).incomplete


# --- keys -------------------------------------------------------------------------------------------------------
def test_key_limits_250_bytes_no_space_no_line_end():
    assert key_problem(b"k" * 250) is None
    assert "over 250" in key_problem(b"k" * 251)
    assert key_problem(b"") == "empty key"
    for bad in (b"a b", b"a\x00b", b"a\nb", b"a\rb"):
        assert "a space, a line end or a NUL byte" in key_problem(bad)
    for good in ("ключ".encode(), b"a\tb", b"a\x7fb", b"\x10" * 8 + b"joD9mL4Q", bytes(range(1, 10))):
        assert key_problem(good) is None  # memcached splits a line on spaces alone: control bytes are key bytes


def test_250_byte_key_parses_and_251_does_not():
    assert parse_request(b"get " + b"k" * 250 + b"\r\n").key == b"k" * 250
    assert "over 250" in parse_request(b"get " + b"k" * 251 + b"\r\n").reason
    assert "over 250" in parse_request(b"get ok " + b"k" * 251 + b"\r\n").reason


def test_builders_refuse_bad_keys_and_round_trip():
    assert parse_request(build_get(b"a", b"b")).keys == (b"a", b"b")
    req = parse_request(build_set(b"k", b"v\r\nv", flags=3, exptime=9))
    assert (req.key, req.data, req.flags, req.exptime) == (b"k", b"v\r\nv", 3, 9)
    for bad in ((b"a b",), (b"k" * 251,), ()):
        with pytest.raises(ValueError):
            build_get(*bad)


# --- replies ----------------------------------------------------------------------------------------------------
def test_values_reply_with_cas_and_a_miss():
    reply = parse_reply(b"VALUE a 1 2 9\r\nxy\r\nVALUE b 0 0\r\n\r\nEND\r\n")
    assert reply.hit and [(i.key, i.flags, i.value, i.cas) for i in reply.items] == [(b"a", 1, b"xy", 9),
                                                                                      (b"b", 0, b"", None)]
    miss = parse_reply(b"END\r\n")
    assert not miss.hit and miss.size == 5


@pytest.mark.parametrize("raw,status", [(b"STORED\r\n", "STORED"), (b"NOT_STORED\r\n", "NOT_STORED"),
                                        (b"EXISTS\r\n", "EXISTS"), (b"NOT_FOUND\r\n", "NOT_FOUND"),
                                        (b"DELETED\r\n", "DELETED"), (b"TOUCHED\r\n", "TOUCHED"),
                                        (b"ERROR\r\n", "ERROR"), (b"VERSION 1.6.18\r\n", "VERSION")])
def test_status_replies(raw, status):
    reply = parse_reply(raw)
    assert reply.status == status and reply.size == len(raw)


def test_error_replies_keep_their_message():
    reply = parse_reply(b"SERVER_ERROR object too large for cache\r\n")
    assert reply.is_error and reply.message == "object too large for cache"
    assert parse_reply(b"CLIENT_ERROR bad command line format\r\n").is_error


def test_numbers_and_meta_replies():
    assert parse_reply(b"18446744073709551615\r\n").value == 2 ** 64 - 1
    va = parse_reply(b"VA 2 t55 f1 c9\r\nhi\r\n")
    assert (va.code, va.value, va.flags) == ("VA", b"hi", (b"t55", b"f1", b"c9"))
    for code in ("HD", "EN", "NF", "NS", "EX", "MN"):
        assert parse_reply(f"{code}\r\n".encode()).code == code


@pytest.mark.parametrize("raw", [b"VALUE a 1\r\nx\r\nEND\r\n", b"VALUE a x 1\r\nx\r\nEND\r\n", b"HELLO\r\n",
                                 b"VALUE a 0 1\r\nxy\r\nEND\r\n", b"VALUE a 0 1\r\nx\r\nSTORED\r\n", b"VA x\r\n",
                                 b"\x81\x00\x00\x00"])
def test_bad_replies_are_not_parsed(raw):
    assert isinstance(parse_reply(raw), NotParsed)


def test_truncated_value_reply_is_incomplete():
    assert parse_reply(b"VALUE a 0 10\r\nabc").incomplete
    assert parse_reply(b"VALUE a 0 1\r\nx\r\n").incomplete  # END still to come


# --- UDP frames -------------------------------------------------------------------------------------------------
def test_udp_frame_round_trip():
    frame, payload = parse_udp_frame(pack_udp_frame(0x1234, b"get k\r\n", sequence=2, total=3))
    assert (frame.request_id, frame.sequence, frame.total, frame.reserved) == (0x1234, 2, 3, 0)
    assert payload == b"get k\r\n"


@pytest.mark.parametrize("raw", [b"", b"\x00\x01\x00", b"\x00\x01\x00\x00\x00\x00\x00\x00",
                                 b"\x00\x01\x00\x05\x00\x02\x00\x00"])
def test_bad_udp_frames(raw):
    assert isinstance(parse_udp_frame(raw), NotParsed)


def test_reassembly_waits_for_every_datagram():
    assert reassemble({0: b"ab", 2: b"ef"}, 3) is None
    assert reassemble({2: b"ef", 0: b"ab", 1: b"cd"}, 3) == b"abcdef"


# --- TCP streams ------------------------------------------------------------------------------------------------
def test_stream_byte_by_byte_gives_the_same_requests():
    wire = (build_get(b"a") + build_set(b"k", b"x" * 100) + b"delete k noreply\r\n" + b"get a b\r\n"
            + b"ms m 3 T1\r\nabc\r\n")
    whole = StreamParser(parse_request).feed(wire)
    parser, pieces = StreamParser(parse_request), []
    for i in range(len(wire)):
        pieces += parser.feed(wire[i:i + 1])
    assert pieces == whole and [r.command for r in whole] == ["get", "set", "delete", "get", "ms"]
    assert parser.pending == 0


def test_stream_skips_garbage_and_keeps_going():
    parser = StreamParser(parse_request)
    out = parser.feed(b"get a\r\nthis is junk\r\n\x80binary\r\nget b\r\n")
    assert [type(r).__name__ for r in out] == ["Request", "NotParsed", "NotParsed", "Request"]
    assert out[-1].key == b"b"


def test_stream_buffer_is_bounded():
    parser = StreamParser(parse_request, max_value=1000)
    out = parser.feed(b"set k 0 0 999\r\n" + b"x" * 500)
    assert out == [] and parser.pending > 0  # waiting for the rest of a legal value
    out = parser.feed(b"y" * 200_000)  # no line end anywhere: dropped, not hoarded
    assert out and isinstance(out[0], NotParsed) and parser.pending == 0


def test_reply_stream():
    parser = StreamParser(parse_reply)
    wire = b"VALUE a 0 3\r\nabc\r\nEND\r\nSTORED\r\nEN\r\n"
    out = parser.feed(wire[:10]) + parser.feed(wire[10:])
    assert [type(r).__name__ for r in out] == ["ValuesReply", "StatusReply", "MetaReply"]


def test_a_lone_noreply_is_the_key_not_the_option():
    # memcached 1.6 answers `delete noreply` with DELETED: the token is the key, and a reply comes.
    req = parse_request(b"delete noreply\r\n")
    assert req.key == b"noreply" and not req.noreply
    assert parse_request(b"delete k 0 noreply\r\n").noreply
