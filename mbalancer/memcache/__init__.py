"""The memcached protocol, in one place for every part of MBalancer (monitor, controller, client, experiments).

frame.py     the 8-byte UDP frame header, and reassembly of replies that span several datagrams
keys.py      what the text protocol reads as a key (1 to 250 bytes, no space, line end or NUL)
requests.py  parse one ASCII request: get/gets/gat/gats, storage commands with their data, delete, incr/decr,
             touch, meta mg/ms/md/ma/mn; build the requests the client sends
replies.py   parse one reply: VALUE ... END, status words, errors, numbers, meta VA/HD/EN/...
stream.py    parse a TCP byte stream incrementally, across segments
results.py   NotParsed: what every parser returns instead of raising on bytes it cannot read
addresses.py server addresses as users write them (host:port)
hashing.py   key -> server hashes as clients use them: ketama, modulo, skewed (experiments)
pending.py   one outstanding UDP request: matches its reply's datagrams by request id, drops strays
client.py    blocking clients: UdpClient (ours) and tcp_client (pymemcache)
udp.py       UDP sockets with room for a 1 MB reply
server.py    start and stop a local memcached (tests, benchmarks)
"""
from mbalancer.memcache.frame import UDP_HEADER_SIZE, UdpFrame, pack_udp_frame, parse_udp_frame
from mbalancer.memcache.keys import MAX_KEY_LENGTH, key_problem
from mbalancer.memcache.replies import Item, MetaReply, NumberReply, Reply, StatusReply, ValuesReply, parse_reply
from mbalancer.memcache.requests import Request, build_get, build_set, parse_request
from mbalancer.memcache.results import NotParsed, Unreadable
from mbalancer.memcache.stream import StreamParser

__all__ = ["UDP_HEADER_SIZE", "UdpFrame", "pack_udp_frame", "parse_udp_frame", "MAX_KEY_LENGTH", "key_problem",
           "Item", "MetaReply", "NumberReply", "Reply", "StatusReply", "ValuesReply", "parse_reply", "Request",
           "build_get", "build_set", "parse_request", "NotParsed", "StreamParser", "Unreadable"]
