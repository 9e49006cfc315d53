"""The pipeline's packet fixtures, as data: every data plane's test runs these same cases (Katran's fixture style).

Each case is the table state (hot keys with their weights and dirty state, the controller's lease), the frames the
pipeline sees first, the frame in, and what must come out: the verdict, the exact frame out (None: the input,
untouched), whether the write was mirrored to the controller, whether the request made its server unsure (it may
hold writes the pipeline cannot read), the key's dirty state after, and the switch counters that moved. A runner loads the state
through its data plane's own control API and compares; tests/test_ebpf_program.py runs them on the eBPF program
in the kernel (BPF_PROG_TEST_RUN). The P4 and OpenFlow data planes are to run the same list.

The network of every case: a client, and three servers (server 2 on another port); every hot key's replicas are
the three servers in order, its home server 0 unless the case says otherwise.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field

from scapy.all import IP, TCP, UDP, Ether, Raw

from mbalancer.settings import Server

CLIENT = ("02:00:00:00:00:aa", "10.0.0.100")
CONTROLLER = ("02:00:00:00:00:fe", "10.0.0.254")  # a trusted source: its copies never make a server unsure
SERVERS = (("02:00:00:00:00:01", "10.0.0.1", 11211), ("02:00:00:00:00:02", "10.0.0.2", 11211),
           ("02:00:00:00:00:03", "10.0.0.3", 11311))
REPLICAS = (0, 1, 2)
IP_BALANCED = 4  # the IPv4 reserved ("evil") flag bit, as scapy numbers the flags: "already balanced"


@dataclass(frozen=True)
class HotKey:
    key: bytes
    weights: tuple[float, ...] = (0.0, 1.0, 0.0)  # over REPLICAS
    dirty: bool = False
    home: int = 0


@dataclass(frozen=True)
class Case:
    name: str
    packet: bytes  # the frame in, at a switch port
    hot: tuple[HotKey, ...] = (HotKey(b"hot"),)  # slot i holds hot[i]
    before: tuple[bytes, ...] = ()  # frames the pipeline sees first (e.g. the get a reply answers)
    verdict: str = "forward"  # forward: sent out of a port; drop
    out: bytes | None = None  # the frame out; None: the input, untouched
    mirrored: bool = False  # a copy went to the controller, and the key's write was counted in its slot
    dirty_after: bool | None = None  # slot 0's key dirty after the frame (None: as it was)
    unsure: int | None = None  # the server whose unsure count the frame raised (None: no server's)
    lease: bool = True  # the controller's lease runs
    counters: dict[str, int] | None = None  # switch counters that moved (None: not checked)
    gets: dict[int, int] = field(default_factory=dict)  # slot 0's get counts after: {replica position: n}
    resume: int | None = None  # CONNECTION_CASES: the controller proves a command starts at this sequence number of the
    # client's connection to server 0 (port 40000) after `before`
    blind: bool = False  # CONNECTION_CASES: after `before`, the controller gives that connection up as unreadable


def request(payload: bytes, to: int = 0, request_id: int = 7, sport: int = 40000, udp: bool = True,
            frame: bool = True, flags: int = 0, frag: int = 0, src: tuple = CLIENT, seq: int = 0,
            tcp_flags: str = "PA") -> bytes:
    """A client's request to server `to`: UDP with the memcached frame header (unless frame=False), or TCP."""
    return request_to(SERVERS[to], payload, request_id, sport, udp, frame, flags, frag, src, seq, tcp_flags)


def request_to(server: tuple, payload: bytes, request_id: int = 7, sport: int = 40000, udp: bool = True,
               frame: bool = True, flags: int = 0, frag: int = 0, src: tuple = CLIENT, seq: int = 0,
               tcp_flags: str = "PA") -> bytes:
    """The same to any server given as (mac, ip, port), or as a config Server."""
    mac, ip, port = (server.mac, server.ip, server.port) if hasattr(server, "mac") else server
    header = struct.pack("!HHHH", request_id, 0, 1, 0) if udp and frame else b""
    l4 = UDP(sport=sport, dport=port) if udp else TCP(sport=sport, dport=port, flags=tcp_flags, seq=seq)
    return bytes(Ether(src=src[0], dst=mac) / IP(src=src[1], dst=ip, flags=flags, frag=frag) / l4
                 / Raw(header + payload))


def reply(payload: bytes, by: int, request_id: int, dport: int = 40000, sequence: int = 0, total: int = 1) -> bytes:
    """Server `by`'s UDP reply to the client."""
    mac, ip, port = SERVERS[by]
    return bytes(Ether(src=mac, dst=CLIENT[0]) / IP(src=ip, dst=CLIENT[1]) / UDP(sport=port, dport=dport)
                 / Raw(struct.pack("!HHHH", request_id, sequence, total, 0) + payload))


def balanced_to(packet: bytes, to: int, home: int = 0) -> bytes:
    """`packet` as hot_get sends it to replica `to`: destination MAC/IP/port rewritten, marked, the home's index as
    IP ID (for the replica's switch, FABRIC_CASES), checksums valid."""
    mac, ip, port = SERVERS[to]
    out = Ether(packet)
    out.dst, out[IP].dst, out[UDP].dport = mac, ip, port
    out[IP].flags = int(out[IP].flags) | IP_BALANCED
    out[IP].id = home
    return _with_checksums(out)


def with_id(packet: bytes, ip_id: int) -> bytes:
    """`packet` with another IP ID (which no UDP checksum covers: a zero one stays zero)."""
    out = Ether(packet)
    out[IP].id = ip_id
    del out[IP].chksum
    return bytes(out)


def from_home(packet: bytes, home: int, mac: bool = True) -> bytes:
    """A reply as reply_source sends it on: source IP/port of the home server, and its MAC (unless the get was
    balanced by another switch: the switches after this one must not learn the home's MAC where it is not)."""
    home_mac, ip, port = SERVERS[home]
    out = Ether(packet)
    out[IP].src, out[UDP].sport = ip, port
    if mac:
        out.src = home_mac
    return _with_checksums(out)


def zero_udp_checksum(frame: bytes) -> bytes:
    """The frame with its UDP checksum 0: "no checksum" in IPv4."""
    at = 14 + 20 + 6
    return frame[:at] + b"\x00\x00" + frame[at + 2:]


def with_options(packet: bytes) -> bytes:
    """`packet` with 4 bytes of options (NOPs) in its IPv4 header, and in its TCP header if it has one."""
    out = Ether(packet)
    out[IP].options = b"\x01" * 4
    del out[IP].ihl, out[IP].len, out[IP].chksum
    if TCP in out:
        out[TCP].options = [("NOP", None)] * 4
        del out[TCP].dataofs, out[TCP].chksum
    else:
        del out[UDP].len, out[UDP].chksum
    return bytes(out)


def _with_checksums(frame) -> bytes:
    del frame[IP].chksum
    del frame[UDP].chksum
    return bytes(frame)


LONGEST = b"k" * 250


def key_of(length: int) -> bytes:
    """A key of `length` bytes, no two 8-byte words alike."""
    return bytes(0x41 + (i * 7 + i // 8) % 58 for i in range(length))
MEMCASLAP_KEY = b"\x10" * 8 + b"joD9mL4Q\t\x7f"  # memcached reads every byte but space and the line end


def closing(by: int | Server, to: tuple = CONTROLLER, flags: str = "FA") -> bytes:
    """Server `by`'s memcached (an index of SERVERS, or a config Server) closing its TCP connection to `to` (FIN, or
    RST)."""
    mac, ip, port = SERVERS[by] if isinstance(by, int) else (by.mac, by.ip, by.port)
    return bytes(Ether(src=mac, dst=to[0]) / IP(src=ip, dst=to[1]) / TCP(sport=port, dport=45000, flags=flags))


GET = request(b"get hot\r\n")
SET_HOT = b"set hot 0 0 1\r\nx\r\n"
CASES = (
    # hot_get
    Case("a hot get is rewritten to the chosen replica and marked", GET, out=balanced_to(GET, 1),
         counters={"packets": 1, "memcached": 1, "balanced": 1}, gets={1: 1}),
    Case("a replica on another port gets its port", request(b"gets hot\r\n"), hot=(HotKey(b"hot", (0, 0, 1)),),
         out=balanced_to(request(b"gets hot\r\n"), 2)),
    Case("a dirty key's get goes home untouched", GET, hot=(HotKey(b"hot", dirty=True),),
         counters={"packets": 1, "memcached": 1}),
    Case("without the controller's lease a hot get goes home untouched", GET, lease=False,
         counters={"packets": 1, "memcached": 1, "lease_expired": 1}),
    Case("after a write the key's gets go home", GET, before=(request(SET_HOT),), dirty_after=True),
    Case("after a request its home's pipeline could not read, the key's gets go home", GET,
         before=(request(b"garbage\r\n", udp=False),), dirty_after=True),
    Case("a request the pipeline cannot read for another server leaves this key clean", GET,
         before=(request(b"garbage\r\n", to=1, udp=False),), out=balanced_to(GET, 1), dirty_after=False),
    Case("a 250-byte key is balanced", request(b"get " + LONGEST + b"\r\n"), hot=(HotKey(LONGEST),),
         out=balanced_to(request(b"get " + LONGEST + b"\r\n"), 1)),
    Case("a 1-byte key at the very end of an unpadded frame is balanced", request(b"get k\r\n"),
         hot=(HotKey(b"k"),), out=balanced_to(request(b"get k\r\n"), 1)),
    Case("a hot key homed on another port is balanced from there", request(b"get hot\r\n", to=2),
         hot=(HotKey(b"hot", (1, 0, 0), home=2),), out=balanced_to(request(b"get hot\r\n", to=2), 0, home=2)),
    Case("a key with control bytes, as memcaslap writes them, is balanced", request(b"get " + MEMCASLAP_KEY + b"\r\n"),
         hot=(HotKey(MEMCASLAP_KEY),), out=balanced_to(request(b"get " + MEMCASLAP_KEY + b"\r\n"), 1)),
    Case("a write to such a hot key is mirrored", request(b"set " + MEMCASLAP_KEY + b" 0 0 1\r\nx\r\n"),
         hot=(HotKey(MEMCASLAP_KEY),), mirrored=True, dirty_after=True),
    Case("a whole write to a cold key with control bytes leaves the hot key clean",
         request(b"set \x10\x10\x10\x10\x10\x10\x10\x10cold\x7f 0 0 1\r\nx\r\n", udp=False), dirty_after=False),
    Case("a zero UDP checksum (none) stays zero", zero_udp_checksum(GET), out=zero_udp_checksum(balanced_to(GET, 1))),
    # keys of every length around the 8-byte steps a parser may take (P4 reads 8 at a time, then bytes)
    *(Case(f"a {n}-byte hot key is balanced", request(b"get " + key_of(n) + b"\r\n"), hot=(HotKey(key_of(n)),),
           out=balanced_to(request(b"get " + key_of(n) + b"\r\n"), 1)) for n in (7, 8, 9, 16, 17, 242, 243, 248, 249)),
    Case("a key differing from the hot key in its last byte is not balanced", request(b"get " + key_of(17)[:-1] +
         b"!\r\n"), hot=(HotKey(key_of(17)),)),
    Case("a key differing from the hot key in its first 8 bytes is not balanced", request(b"get !" + key_of(17)[1:] +
         b"\r\n"), hot=(HotKey(key_of(17)),)),
    # gets that are not hot_get's
    *(Case(f"not balanced: {payload!r}", request(payload)) for payload in (
        b"get cold\r\n", b"get hot other\r\n", b"get hot \r\n")),
    *(Case(f"not balanced, and its server unsure: {payload!r}", request(payload), unsure=0, dirty_after=True)
      for payload in (b"get hot\r\nget hot\r\n", b"get hot", b"gat 0 hot\r\n")),
    Case("a line starting with a space has no command, whatever the one before it", request(b" hot\r\n"),
         before=(request(b"gets hot\r\n"),), unsure=0, dirty_after=True),
    Case("a 251-byte key is left alone and counted unparsed", request(b"get " + b"k" * 251 + b"\r\n"),
         hot=(HotKey(LONGEST),), counters={"packets": 1, "memcached": 1, "unparsed": 1, "unsure": 1}, unsure=0,
         dirty_after=True),
    Case("a get over TCP is not balanced", request(b"get hot\r\n", udp=False)),
    *(Case(f"a whole read changes nothing: {payload!r}", request(payload, udp=False), dirty_after=False)
      for payload in (b"get a b hot\r\n", b"gets hot cold\r\n", b"mg hot v f t c\r\n", b"mn\r\n", b"stats\r\n",
                      b"stats slabs\r\n", b"version\r\n", b"mg hot v k s O" + b"x" * 60 + b" q\r\n")),
    *(Case(f"a meta get that changes the item is not a whole read: {payload[:20]!r}", request(payload, udp=False),
           unsure=0, dirty_after=True)
      for payload in (b"mg hot v O" + b"x" * 40 + b" T30 q\r\n", b"mg hot v O" + b"x" * 40 + b"N30\r\n")),
    Case("a hot get after IPv4 options is balanced", with_options(request(b"get hot\r\n")),
         out=balanced_to(with_options(request(b"get hot\r\n")), 1)),
    Case("a write over TCP after IPv4 and TCP options is mirrored", with_options(request(SET_HOT, udp=False)),
         mirrored=True, dirty_after=True, counters={"packets": 1, "memcached": 1, "mirrored": 1}),
    Case("an already balanced get is not balanced again", request(b"get hot\r\n", flags=IP_BALANCED),
         counters={"packets": 1, "memcached": 1, "already_balanced": 1}),
    # set_mirror
    *(Case(f"a write to a hot key's home is mirrored: {payload[:24]!r} over {'UDP' if udp else 'TCP'}",
           request(payload, udp=udp), mirrored=True, dirty_after=True,
           counters={"packets": 1, "memcached": 1, "mirrored": 1}) for payload, udp in (
        (SET_HOT, True), (b"delete hot\r\n", True), (b"incr hot 1\r\n", False), (b"touch hot 10\r\n", True),
        (b"set hot 0 0 2 noreply\r\nxy\r\n", False), (b"cas hot 0 0 1 99\r\nx\r\n", False),
        (b"ms hot 2 T0 F5\r\nxy\r\n", False), (b"delete hot noreply\r\n", False),
        (b"set hot 0 0 2 " + b"opaque-token-" * 8 + b"\r\nxy\r\n", False), (b"ms hot 2 T0 F5 I O" + b"x" * 60 +
         b" q\r\nxy\r\n", False), (b"set hot 4294967295 2592000 2 noreply\r\nxy\r\n", True))),
    Case("the controller's own write to a hot key's home that is not one whole command is counted and copied, its "
         "server not unsure", request(b"set hot 0 0 5\r\nxy", udp=False, src=CONTROLLER), mirrored=True,
         dirty_after=True, counters={"packets": 1, "memcached": 1, "mirrored": 1}),
    # writes the pipeline cannot read whole: the server is unsure, every hot key homed there dirty
    *(Case(f"unsure: {name}", request(payload, udp=udp), mirrored=mirrored, unsure=0, dirty_after=True)
      for name, payload, udp, mirrored in (
        ("a hot set whose value continues in the next segment", b"set hot 0 0 100000\r\n" + b"x" * 1000, False, True),
        ("the next segment of a value", b"x" * 1000, False, False),
        ("set_many: a cold set, then a hot one", b"set cold 0 0 1\r\nx\r\n" + SET_HOT, False, False),
        ("a hot set, then a cold one", SET_HOT + b"set cold 0 0 1\r\nx\r\n", False, True),
        ("a get and a set pipelined", b"get cold\r\n" + SET_HOT, False, False),
        ("a set whose length does not match its data", b"set hot 0 0 5\r\nx\r\n", False, True),
        ("a set without a length", b"set hot 0 0\r\nx\r\n", False, True),
        ("the binary protocol", b"\x80\x01\x00\x03\x08\x00\x00\x00" + b"\x00" * 16 + b"hot", False, False),
        ("a meta get that sets a TTL", b"mg hot v T30\r\n", False, False),
        ("gat (the key is not first)", b"gat 30 hot\r\n", False, False),
        ("flush_all", b"flush_all\r\n", False, False),
        ("stats, then a set", b"stats\r\n" + SET_HOT, False, False),
        ("pipelined over UDP", b"get cold\r\n" + SET_HOT, True, False),
        ("a request of two datagrams", b"set hot 0 0 1\r\nx\r\n", True, False))
      if name != "a request of two datagrams"),
    Case("unsure: a request of two datagrams", request(SET_HOT, frame=False)[:-len(SET_HOT)]
         + struct.pack("!HHHH", 7, 0, 2, 0) + SET_HOT, unsure=0, dirty_after=True),
    Case("a whole write to a cold key leaves the hot key clean", request(b"set cold 0 0 1\r\nx\r\n", udp=False),
         dirty_after=False),
    Case("the shortest write (6 bytes, unpadded) is mirrored", request(b"md k\r\n", udp=False),
         hot=(HotKey(b"k"),), mirrored=True, dirty_after=True),
    Case("a write to a home on its own port is mirrored", request(b"set hot 0 0 1\r\nx\r\n", to=2),
         hot=(HotKey(b"hot", home=2),), mirrored=True, dirty_after=True),
    Case("a write to a replica (the controller's own copy) is not mirrored",
         request(b"ms hot 1 T0\r\nx\r\n", to=1, udp=False), dirty_after=False),
    Case("a write to a cold key changes nothing", request(b"set cold 0 0 1\r\nx\r\n"), dirty_after=False),
    # reply_source
    *(Case(f"datagram {sequence} of a balanced get's reply leaves from the home",
           reply(b"VALUE hot 0 1\r\nx\r\nEND\r\n", 1, 4242, 40001, sequence, 2),
           before=(request(b"get hot\r\n", request_id=4242, sport=40001),),
           out=from_home(reply(b"VALUE hot 0 1\r\nx\r\nEND\r\n", 1, 4242, 40001, sequence, 2), 0))
      for sequence in (0, 1)),
    Case("a reply from a replica on another port leaves with the home's port",
         reply(b"END\r\n", 2, 4343, 40002), hot=(HotKey(b"hot", (0, 0, 1)),),
         before=(request(b"get hot\r\n", request_id=4343, sport=40002),),
         out=from_home(reply(b"END\r\n", 2, 4343, 40002), 0)),
    Case("a reply to a get that was not balanced is untouched", reply(b"END\r\n", 1, 999, 40001)),
    # unparsed and foreign traffic: forwarded untouched
    *(Case(f"untouched, its server unsure: {name}", packet, unsure=0, dirty_after=True) for name, packet in (
        ("binary protocol", request(b"\x80\x00\x00\x03hot\x00")),
        ("not a command", request(b"garbage\r\n")),
        ("no frame header", request(b"get hot\r\n", frame=False)),
        ("a NUL byte in the key (memcached refuses it)", request(b"get h\x00t\r\n")),
        ("a '\\r' inside the key", request(b"get h\rt\r\n")),
        ("a line ended by '\\n' alone", request(b"get hot\n")),
        ("the first fragment of a large UDP set", request(b"set hot 0 0 9000\r\n" + b"x" * 100, flags=1)))),
    Case("the controller's own copy, larger than a segment, leaves the replica's keys clean",
         request(b"ms hot 9000 T0\r\n" + b"x" * 1000, to=1, udp=False, src=CONTROLLER), dirty_after=False),
    Case("the controller's copies to a key's home would still count (it never sends them)",
         request(SET_HOT, udp=False, src=CONTROLLER), mirrored=True, dirty_after=True),
    *(Case(f"untouched: {name}", packet) for name, packet in (
        ("a later fragment", request(b"get hot\r\n", frag=100)),
        ("empty UDP", request(b"", frame=False)),
        ("cut inside the UDP header", request(b"get hot\r\n")[:40]),
        ("ARP", bytes(Ether(src=CLIENT[0], dst=SERVERS[0][0], type=0x0806) / Raw(b"\x00" * 28))))),
    # a server that closed a connection of the controller's (it may have restarted empty)
    Case("a replica that closed the controller's connection gets no balanced get", GET, before=(closing(1),),
         dirty_after=False),
    Case("... nor after an RST", GET, before=(closing(1, flags="R"),), dirty_after=False),
    Case("a home that closed it has its hot keys dirty", GET, before=(closing(0),), dirty_after=True),
    Case("a server closing a client's connection changes nothing", GET, before=(closing(1, to=CLIENT),),
         out=balanced_to(GET, 1), dirty_after=False),
)


# A fabric that balances at the home's leaf (dataplanes/agent/fabric.py): the replica's reply leaves through the
# replica's switch, which never balanced the get; the IP ID that balanced_to writes tells it the home.
UPSTREAM_GET = balanced_to(request(b"get hot\r\n", request_id=4444, sport=40003), 1)  # as the home's switch sent it
FABRIC_CASES = (
    Case("a reply to a get another switch balanced leaves from the home's IP and port, the replica's MAC",
         reply(b"END\r\n", 1, 4444, 40003), hot=(HotKey(b"other"),), before=(UPSTREAM_GET,),
         out=from_home(reply(b"END\r\n", 1, 4444, 40003), 0, mac=False)),
    Case("a balanced get whose IP ID names no server leaves its reply untouched", reply(b"END\r\n", 1, 4545, 40004),
         hot=(HotKey(b"other"),), before=(with_id(request(b"get hot\r\n", to=1, request_id=4545, sport=40004,
                                                              flags=IP_BALANCED), 999),)),
)


# Every data plane follows TCP connections: a segment that ended, or may have ended, inside a command makes its
# connection's later segments unsure until the controller proves a command boundary.
BINARY_SET = bytes.fromhex("80010003080000000000000c00000000") + bytes(16) + b"hot" + b"x"  # memcached's binary
# protocol: neither the pipeline nor the controller reads it
UNREADABLE = {"packets": 1, "memcached": 1, "unparsed": 1, "unsure": 1}
SPLIT_SET = b"set hot 0 0 15\r\nv=0000000005;"  # 27 bytes: the value's last two bytes and "\r\n" follow
STREAM_CASES = (
    Case("a segment after one that stopped mid-command is unsure, however harmless it looks",
         request(b"mn\r\n", udp=False, seq=len(SPLIT_SET)), before=(request(SPLIT_SET, udp=False),), unsure=0,
         dirty_after=True),
    *(Case(f"... and so is the next: {tail!r}", request(tail, udp=False, seq=len(SPLIT_SET) + 4),
           before=(request(SPLIT_SET, udp=False), request(b"mn\r\n", udp=False, seq=len(SPLIT_SET))), unsure=0,
           dirty_after=True) for tail in (b"version\r\n", b"get cold\r\n", b"set cold 0 0 1\r\nx\r\n")),
    Case("a segment of another connection is read on its own", request(b"mn\r\n", udp=False, sport=40001),
         before=(request(SPLIT_SET, udp=False),), dirty_after=True),
    Case("a segment that starts where the controller proved a command starts is read on its own",
         request(b"mn\r\n", udp=False, seq=len(SPLIT_SET) + 4),
         before=(request(SPLIT_SET, udp=False), request(b"mn\r\n", udp=False, seq=len(SPLIT_SET))),
         resume=len(SPLIT_SET) + 4, dirty_after=True),
    Case("a proof for another point changes nothing", request(b"mn\r\n", udp=False, seq=len(SPLIT_SET) + 4),
         before=(request(SPLIT_SET, udp=False), request(b"mn\r\n", udp=False, seq=len(SPLIT_SET))),
         resume=len(SPLIT_SET), unsure=0, dirty_after=True),
    Case("a connection that ended (FIN) is forgotten", request(b"mn\r\n", udp=False, seq=len(SPLIT_SET)),
         before=(request(SPLIT_SET, udp=False), request(b"", udp=False, seq=len(SPLIT_SET), tcp_flags="FA")),
         dirty_after=True),
    Case("a pipelined segment (set_many) makes the next one unsure",
         request(SET_HOT, udp=False, seq=38), before=(request(b"set cold 0 0 1\r\nx\r\n" + SET_HOT, udp=False),),
         unsure=0, dirty_after=True),
    Case("a whole write does not", request(b"get cold\r\n", udp=False, seq=18),
         before=(request(SET_HOT, udp=False),), dirty_after=True),
    Case("the controller's own connections are never followed",
         request(b"mn\r\n", udp=False, seq=1030, to=1, src=CONTROLLER),
         before=(request(b"ms hot 9000 T0\r\n" + b"x" * 1000, to=1, udp=False, src=CONTROLLER),)),
)

# Every data plane also coalesces what nobody can read: a connection the controller cannot follow, and datagrams the
# pipeline cannot parse, are copied once per check of their server's keys. (A connection given up stays so: last.)
CONNECTION_CASES = (
    Case("a datagram nobody can read is unsure and copied", request(BINARY_SET), unsure=0, dirty_after=True,
         counters=UNREADABLE),
    Case("... but not copied again before the controller's check (its copy started it: the check covers this one)",
         request(BINARY_SET), before=(request(BINARY_SET, request_id=6),), unsure=0, dirty_after=True,
         counters={**UNREADABLE, "coalesced": 1}),
    Case("a connection the controller gave up on stays unsure, its segments copied once per check",
         request(b"mn\r\n", udp=False, seq=len(BINARY_SET)),
         before=(request(BINARY_SET, udp=False), request(BINARY_SET, request_id=6)), blind=True, unsure=0,
         dirty_after=True, counters={"packets": 1, "memcached": 1, "unsure": 1, "coalesced": 1}),
)
