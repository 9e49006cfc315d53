"""The in-memory memcached (mbalancer/memcache/memory.py) held to the real one: every case runs unchanged against a
real memcached on loopback and against the in-memory server, through the client the controller uses (MetaClient)
or raw requests, so the fake the executor's tests run on cannot drift from memcached's semantics (CAS, conditional
stores and deletes, flags, TTLs, pipelined reads, size limits, errors)."""
from __future__ import annotations

import itertools
import re
from typing import Callable

import pytest

from mbalancer.memcache.addresses import ServerAddress
from mbalancer.memcache.memory import MemoryNetwork
from mbalancer.memcache.meta import NO_EXPIRY, Connection, ItemVersion, MetaClient, MetaError, StoredItem, tcp_connect
from mbalancer.memcache.server import MemcachedServer

_keys = itertools.count()


@pytest.fixture(scope="module")
def real():
    with MemcachedServer(max_item="1m") as server:  # memcached's default item size limit, as the fake's
        yield ServerAddress(*server.address)


@pytest.fixture(params=["memcached", "memory"])
def server(request, real) -> tuple[ServerAddress, Callable]:
    """(address, connect) of a real memcached or of an in-memory one."""
    if request.param == "memcached":
        return real, tcp_connect
    network = MemoryNetwork()
    address = ServerAddress("10.9.9.9", 11211)  # never dialled: only the in-memory network knows it
    network.start(address)
    return address, network.connect


def client(server) -> MetaClient:
    address, connect = server
    return MetaClient(address, timeout=1.0, connect=connect)


def versions(c: MetaClient, keys: list[bytes]) -> list:
    """Each key's CAS and TTL as the replicator reads them (send_many "version"), pipelined."""
    return c.receive_many(c.send_many("version", keys))


def key() -> bytes:
    """A key no other case (nor an earlier run against the same server) used."""
    return b"contract:%d" % next(_keys)


def raw(server, request: bytes, until: bytes = b"\r\n") -> bytes:
    """What the server answers to `request`, sent as it is, up to `until` (by default its first line), each CAS it
    gives written c#: two servers' CAS differ."""
    address, connect = server
    conn: Connection = connect(address, 1.0)
    try:
        conn.sendall(request)
        reply = b""
        while not reply.endswith(until):
            reply += conn.recv(4096)
        return re.sub(rb"\bc\d+", b"c#", reply if until != b"\r\n" else reply.split(b"\r\n")[0])
    finally:
        conn.close()


def test_a_missing_key_misses_everywhere(server):
    c, k = client(server), key()
    assert c.get(k) is None and versions(c, [k]) == [None] and c.delete(k) is False


def test_a_store_keeps_value_flags_and_ttl_and_every_store_gets_a_new_cas(server):
    c, k = client(server), key()
    value = bytes(range(256)) * 400 + b"\r\nEND\r\n"  # every byte, and what looks like the end of a reply
    first = c.set(k, StoredItem(value, 0xFFFFFFFF, NO_EXPIRY, 0))
    item = c.get(k)
    assert (item.value, item.flags, item.ttl, item.cas) == (value, 0xFFFFFFFF, NO_EXPIRY, first)
    second = c.set(k, StoredItem(b"v2", 7, 100, 0))
    assert second != first and c.get(k).cas == second
    (found,) = versions(c, [k])
    assert found.cas == second and 99 <= found.ttl <= 100  # whole seconds, counting down


def test_a_store_conditional_on_a_cas_takes_only_that_item(server):
    c, k = client(server), key()
    cas = c.set(k, StoredItem(b"v1", 0, NO_EXPIRY, 0))
    newer = c.set(k, StoredItem(b"v2", 0, NO_EXPIRY, 0), if_cas=cas)
    with pytest.raises(MetaError, match="not the one expected"):  # EX: another item now
        c.set(k, StoredItem(b"v3", 0, NO_EXPIRY, 0), if_cas=cas)
    assert c.get(k).value == b"v2" and c.get(k).cas == newer
    with pytest.raises(MetaError, match="not the one expected"):  # NF: no item at all
        c.set(key(), StoredItem(b"v", 0, NO_EXPIRY, 0), if_cas=newer)


def test_a_delete_conditional_on_a_cas_takes_only_that_item(server):
    c, k = client(server), key()
    cas = c.set(k, StoredItem(b"v1", 0, NO_EXPIRY, 0))
    with pytest.raises(MetaError, match="EX"):
        c.delete(k, if_cas=cas + 1000)
    assert c.get(k).value == b"v1"
    assert c.delete(k, if_cas=cas) is True and c.get(k) is None
    assert c.delete(k, if_cas=cas) is False  # gone: a miss, not an error


def test_pipelined_versions_answer_in_order(server):
    c, present, absent, other = client(server), key(), key(), key()
    first = c.set(present, StoredItem(b"a", 0, NO_EXPIRY, 0))
    second = c.set(other, StoredItem(b"b", 0, 50, 0))
    found = versions(c, [present, absent, other])
    assert found[0] == ItemVersion(first, NO_EXPIRY) and found[1] is None
    assert found[2].cas == second and 49 <= found[2].ttl <= 50


def test_an_item_over_the_size_limit_is_refused_and_the_client_goes_on(server):
    c, k = client(server), key()
    with pytest.raises(MetaError, match="SERVER_ERROR object too large for cache"):
        c.set(k, StoredItem(bytes(2 << 20), 0, NO_EXPIRY, 0))
    assert c.get(k) is None
    c.ping()


def test_an_item_stored_already_expired_misses(server):
    k = key()
    assert raw(server, b"ms %s 1 T-1\r\nx\r\n" % k) == b"HD"
    assert client(server).get(k) is None


def test_stats_say_who_the_server_is_and_count_its_gets(server):
    c = client(server)
    before = c.stats()
    assert {"pid", "uptime", "time", "cmd_get"} <= set(before)
    c.get(key())
    versions(c, [key(), key()])
    assert int(c.stats()["cmd_get"]) - int(before["cmd_get"]) == 3


@pytest.mark.parametrize("request_, reply", [(b"bogus k\r\n", b"ERROR"),
                                             (b"ms k\r\n", b"CLIENT_ERROR bad command line format"),
                                             (b"mn\r\n", b"MN")])
def test_what_it_cannot_read_gets_the_same_error(server, request_, reply):
    assert raw(server, request_) == reply


def test_an_address_where_no_server_listens_refuses_the_connection():
    network = MemoryNetwork()
    c = MetaClient(ServerAddress("10.9.9.9", 11211), connect=network.connect)
    with pytest.raises(MetaError, match="Connection refused"):
        c.ping()
    server = network.start(ServerAddress("10.9.9.9", 11211))
    c.ping()
    network.stop(ServerAddress("10.9.9.9", 11211))
    assert not server.up
    with pytest.raises(MetaError, match="reset"):  # the open connection goes with its server
        c.ping()


def test_return_flags_come_back_in_the_order_asked_with_the_opaque_token_and_the_key(server):
    k = key()
    assert raw(server, b"ms %s 2 c O123 k F5\r\nab\r\n" % k) == b"HD c# O123 k" + k
    assert raw(server, b"mg %s s v f O9 k t\r\n" % k, until=b"ab\r\n") == b"VA 2 s2 f5 O9 k%s t-1\r\nab\r\n" % k
    assert raw(server, b"md %s O7\r\n" % k) == b"HD O7"


def test_quiet_mode_leaves_out_only_the_answers_nobody_waits_for(server):
    """q: a get's miss, a store or a delete done say nothing; a refused store, or a delete of nothing, says so; mn
    ends the pipeline."""
    k, missing = key(), key()
    pipeline = (b"ms %s 1 q\r\nx\r\nmg %s v q\r\nmg %s v q\r\nms %s 1 q C999999\r\ny\r\nmd %s q\r\nmd %s q\r\nmn\r\n"
                % (k, missing, k, k, missing, k))
    assert raw(server, pipeline, until=b"MN\r\n") == b"VA 1\r\nx\r\nEX\r\nNF\r\nMN\r\n"
    assert client(server).get(k) is None


def test_a_flag_the_in_memory_server_does_not_do_is_refused_aloud():
    network = MemoryNetwork()
    address = ServerAddress("10.9.9.9", 11211)
    network.start(address)
    assert raw((address, network.connect), b"mg k v T30\r\n") == \
        b"CLIENT_ERROR the in-memory memcached does not do flag T"
