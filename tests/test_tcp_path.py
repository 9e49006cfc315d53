"""The eBPF switch's TCP path end to end (dataplanes/ebpf/tcp/): real memcached servers (TCP only, as memcached
ships), real TCP clients in network namespaces (pymemcache, and raw sockets that pipeline), the TCP splitter behind
the switch, the controller core with the eBPF driver. Which server answered is read from each memcached's own
counters; what a client got is compared byte for byte with what its server says when asked directly."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace

import pytest

from controller.core import ControllerCore
from dataplanes.bpf.program import available
from dataplanes.bpf.tables import Tables
from dataplanes.ebpf.tcp.path import TcpPath
from mbalancer.memcache.addresses import ServerAddress
from mbalancer.memcache.client import tcp_client
from mbalancer.memcache.hashing import make_hash
from tests.conftest import eventually, memcached_answers
from tests.test_ebpf_network import chi_square, config_of, make_hot, stop_and_empty
from topologies.netns import NamespaceNetwork

why_not = available() if os.geteuid() == 0 else "needs root (namespaces, bpf)"
pytestmark = pytest.mark.skipif(why_not is not None, reason=f"eBPF data plane cannot run here: {why_not}")

TCP_CONNECTIONS, TCP_GETS, TCP_BALANCED = 0, 2, 3  # enum mb_tcp_counter

# Runs in the client's namespace: pymemcache's gets of one key, on one connection; prints the values seen.
GETS = r"""
import json, sys
from pymemcache.client.base import Client
host, key, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
client = Client((host, 11211), connect_timeout=2, timeout=2)
values = {}
for _ in range(count):
    value = client.get(key)
    values[repr(value)] = values.get(repr(value), 0) + 1
print(json.dumps(values))
"""

# Runs in the client's namespace: a pymemcache connection made at once (its first request sent); once told on stdin,
# its gets of one key, as GETS prints them.
GETS_LATER = r"""
import json, sys
from pymemcache.client.base import Client
host, key, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
client = Client((host, 11211), connect_timeout=2, timeout=2)
client.version()
print("connected", flush=True)
sys.stdin.readline()
values = {}
for _ in range(count):
    value = client.get(key)
    values[repr(value)] = values.get(repr(value), 0) + 1
print(json.dumps(values), flush=True)
"""

# Runs in the client's namespace: one connection, the given bytes sent in one write, every byte read back until the
# server has been quiet for `quiet` seconds (or it closed); prints them in hex.
RAW = r"""
import socket, sys, time
host, payload, quiet = sys.argv[1], bytes.fromhex(sys.argv[2]), float(sys.argv[3])
sock = socket.create_connection((host, 11211), timeout=5)
sock.sendall(payload)
sock.settimeout(quiet)
got = b""
deadline = time.monotonic() + 20
while time.monotonic() < deadline:
    try:
        data = sock.recv(65536)
    except socket.timeout:
        break
    if not data:
        break
    got += data
print(got.hex())
"""

# Runs in the client's namespace: writes through one connection, each followed by a get on another; prints how many
# gets did not return the value just written.
WRITE_THEN_READ = r"""
import sys
from pymemcache.client.base import Client
host, key, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
writer = Client((host, 11211), timeout=2)
reader = Client((host, 11211), timeout=2)
stale = 0
for i in range(count):
    value = b"w%d" % i
    assert writer.set(key, value, noreply=False)
    if reader.get(key) != value:
        stale += 1
print(stale)
"""


MEMCACHED = ["memcached", "-p", "11211", "-u", "root", "-t", "1"]  # TCP only, as memcached ships


def start_memcached(net: NamespaceNetwork, host) -> subprocess.Popen:
    server = net.popen(host, MEMCACHED + ["-l", host.ip])
    assert eventually(lambda: memcached_answers(host.ip), timeout=10), f"memcached on {host.name} did not start"
    return server


@pytest.fixture(scope="module")
def network():
    with NamespaceNetwork(servers=3, clients=1, tag=f"mbt{os.getpid() % 1000}", tcp_ports=(11211,)) as net:
        net.memcached = {host.name: start_memcached(net, host) for host in net.server_hosts}
        yield net


@pytest.fixture
def core(network):
    core = ControllerCore(config_of(network), network.driver(), probe_health=False).start()
    yield core
    stop_and_empty(network, core)


def gets_served(net: NamespaceNetwork) -> list[int]:
    """Each server's gets so far (its own count, over every connection)."""
    return [int(tcp_client(ServerAddress(h.ip)).stats()[b"cmd_get"]) for h in net.server_hosts]


def tcp_counter(net: NamespaceNetwork, which: int) -> int:
    tables = Tables(net.switch.plane.pin_dir)
    try:
        return tables.tcp_counter(which)
    finally:
        tables.close()


def in_client(net: NamespaceNetwork, script: str, *args: str) -> str:
    result = net.run(net.client_hosts[0], [sys.executable, "-c", script, *args])
    assert result.returncode == 0, result.stderr
    return result.stdout


def raw_through(net: NamespaceNetwork, host_ip: str, payload: bytes) -> bytes:
    """What a client gets for `payload`, sent in one write through the switch."""
    return bytes.fromhex(in_client(net, RAW, host_ip, payload.hex(), "1.0").strip())


def direct(host_ip: str, payload: bytes, quiet: float = 0.5) -> bytes:
    """What the server itself answers, asked from the root namespace (the controller's address: never steered)."""
    result = subprocess.run([sys.executable, "-c", RAW, host_ip, payload.hex(), str(quiet)], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return bytes.fromhex(result.stdout.strip())


def test_tcp_gets_of_a_hot_key_are_spread_over_its_replicas_and_cold_ones_go_home(network, core):
    home = make_hot(core, b"tcp:hot", b"v" * 1000)
    before, asked = gets_served(network), tcp_counter(network, TCP_GETS)
    values = json.loads(in_client(network, GETS, network.server_hosts[home].ip, "tcp:hot", "900"))
    spread = [a - b for a, b in zip(gets_served(network), before)]
    assert values == {repr(b"v" * 1000): 900}
    assert chi_square(spread, [1 / 3] * 3) < 27.6, spread  # p = 1e-6 for an even spread
    assert tcp_counter(network, TCP_GETS) - asked == 900
    counted = core.driver.read_counters().keys[b"tcp:hot"]
    assert counted.gets == 900 and sum(counted.per_replica.values()) == 900
    cold_home = core.key_hash.server_of(b"tcp:cold")
    tcp_client(ServerAddress(network.server_hosts[cold_home].ip)).set(b"tcp:cold", b"c")
    before = gets_served(network)
    assert json.loads(in_client(network, GETS, network.server_hosts[cold_home].ip, "tcp:cold", "100")) == \
        {repr(b"c"): 100}
    spread = [a - b for a, b in zip(gets_served(network), before)]
    assert spread == [100 if i == cold_home else 0 for i in range(3)], spread


def test_pipelined_requests_of_every_kind_are_answered_in_order_as_the_home_answers_them(network, core):
    home = make_hot(core, b"tcp:p", b"hot value")
    ip = network.server_hosts[home].ip
    tcp_client(ServerAddress(ip)).set(b"tcp:c", b"cold value")
    pipeline = (b"get tcp:p\r\nget tcp:c\r\nmg tcp:p v f\r\nset tcp:w 0 0 5\r\nwrite\r\nget tcp:p tcp:c\r\n"
                b"mg tcp:p v\r\nversion\r\nget tcp:p\r\nmn\r\nget tcp:missing\r\nmg tcp:p s v\r\nget tcp:p\r\n") * 20
    balanced = tcp_counter(network, TCP_BALANCED)
    through = raw_through(network, ip, pipeline)
    assert tcp_counter(network, TCP_BALANCED) > balanced, "no get of the hot key was balanced"
    assert through == direct(ip, pipeline)


@pytest.mark.parametrize("payload", [
    b"\x80\x0b\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00",  # binary
    b"get " + b"k" * 251 + b"\r\nget tcp:p\r\n",  # a key over 250 bytes, then a get
    b"get tcp:p\r\nstats settings\r\nget tcp:p\r\n",  # a reply the splitter does not frame
    b"set tcp:q 0 0 1 noreply\r\nx\r\nget tcp:q\r\n",  # no reply to wait for
    b"get tcp:p\r\n" + b"x" * 3000 + b"\r\nget tcp:p\r\n",  # a line over 2 KB
    b"garbage\r\nget tcp:p\r\n",
], ids=["binary", "long-key", "stats", "noreply", "long-line", "garbage"])
def test_what_the_splitter_cannot_frame_reaches_the_home_untouched(network, core, payload):
    home = make_hot(core, b"tcp:p", b"hot value")
    ip = network.server_hosts[home].ip
    through = raw_through(network, ip, payload)
    answer = direct(ip, payload, 1.0)
    if b"stats" in payload:  # counts move between the two asks: the shape must match
        assert through.split(b"STAT ")[0] == answer.split(b"STAT ")[0] and through.endswith(b"VALUE tcp:p 0 9\r\n"
                                                                                             b"hot value\r\nEND\r\n")
    else:
        assert through == answer


def test_no_get_after_an_acknowledged_write_is_answered_stale(network, core):
    home = make_hot(core, b"tcp:w", b"w")
    stale = int(in_client(network, WRITE_THEN_READ, network.server_hosts[home].ip, "tcp:w", "200"))
    assert stale == 0
    assert eventually(lambda: [k["state"] for k in core.state()["hot_keys"]] == ["clean"], 10)
    for host in network.server_hosts:  # every copy caught up
        assert tcp_client(ServerAddress(host.ip)).get(b"tcp:w") == b"w199"


# Runs in the client's namespace: a request sent in part and never finished, a connection that asks for 20 MB of
# replies and reads none, then 2,000 connections opened and dropped, then pymemcache's gets; prints how many of those
# were answered with the value, and keeps the first two connections open until told to stop (stdin closes).
HOSTILE = r"""
import socket, sys
from pymemcache.client.base import Client
host, key, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
half = socket.create_connection((host, 11211), timeout=5)
half.sendall(b"get " + key.encode())
greedy = socket.create_connection((host, 11211), timeout=5)
greedy.setblocking(False)
request, sent = b"get tcp:big\r\n" * 2000, 0
for _ in range(100000):
    try:
        sent += greedy.send(request[sent:])
    except BlockingIOError:
        break
    if sent == len(request):
        break
for _ in range(2000):
    socket.create_connection((host, 11211), timeout=5).close()
client = Client((host, 11211), connect_timeout=2, timeout=5)
print(sum(client.get(key) == b"hot value" for _ in range(count)), flush=True)
sys.stdin.read()
"""


def splitter_fds(net: NamespaceNetwork) -> int:
    return len(os.listdir(f"/proc/{net.switch.tcp_path.process.pid}/fd"))


def test_a_half_sent_request_a_client_that_never_reads_and_dropped_connections_hold_up_no_one(network, core):
    home = make_hot(core, b"tcp:h", b"hot value")
    ip = network.server_hosts[home].ip
    tcp_client(ServerAddress(ip)).set(b"tcp:big", b"b" * 10_000)
    idle = splitter_fds(network)
    hostile = network.popen(network.client_hosts[0], [sys.executable, "-c", HOSTILE, ip, "tcp:h", "200"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert hostile.stdout.readline().strip() == "200"
        assert network.switch.tcp_path.process.poll() is None
    finally:
        hostile.stdin.close()
        hostile.wait(timeout=30)
    assert eventually(lambda: splitter_fds(network) <= idle, 15), (splitter_fds(network), idle)


# Runs in the client's namespace: pymemcache's gets, each with a 2 s timeout; prints the values seen and the errors.
GETS_THROUGH_FAULTS = r"""
import json, sys
from pymemcache.client.base import Client
host, key, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
client = Client((host, 11211), connect_timeout=2, timeout=2)
seen = {}
for i in range(count):
    try:
        value = repr(client.get(key))
    except Exception as err:
        value = type(err).__name__
        client.close()
    seen[value] = seen.get(value, 0) + 1
    if i == count // 3:
        print("started", flush=True)  # (the gets go on while the replica is killed and started again)
print(json.dumps(seen), flush=True)
"""


def test_a_replica_that_dies_with_gets_in_flight_costs_no_wrong_value_and_no_hung_connection(network):
    config = replace(config_of(network), controller=replace(config_of(network).controller, health_udp=False))
    core = ControllerCore(config, network.driver()).start()  # probes on (over TCP): a restart is noticed
    try:
        home = make_hot(core, b"tcp:r", b"hot value")
        ip = network.server_hosts[home].ip
        replica = network.server_hosts[(home + 1) % 3]
        client = network.popen(network.client_hosts[0], [sys.executable, "-c", GETS_THROUGH_FAULTS, ip, "tcp:r",
                                                         "3000"], stdout=subprocess.PIPE, text=True)
        assert client.stdout.readline().strip() == "started"
        network.memcached[replica.name].kill()
        network.memcached[replica.name].wait()
        network.memcached[replica.name] = start_memcached(network, replica)  # back, empty
        seen = json.loads(client.stdout.readline())
        client.wait(timeout=30)
        assert set(seen) <= {repr(b"hot value"), "MemcacheUnexpectedCloseError", "TimeoutError", "timeout"}, seen
        assert seen[repr(b"hot value")] >= 2990, seen
    finally:
        stop_and_empty(network, core)


# For the scripts below: a get's whole reply, read from a connection.
GET_REPLY = r"""
def get_reply(sock, key):
    sock.sendall(b"get " + key + b"\r\n")
    got = b""
    while not got.endswith(b"END\r\n"):
        data = sock.recv(65536)
        if not data:
            break
        got += data
    return got
"""

# Runs in the client's namespace: each payload on a connection of its own, its reply read until quiet; then a get
# on a fresh connection, whose answer it prints.
FUZZ = GET_REPLY + r"""
import random, socket, sys
host, seed, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(seed)
pieces = [b"get tcp:f\r\n", b"get tcp:f tcp:g\r\n", b"gets tcp:f\r\n", b"mg tcp:f v\r\n", b"mg tcp:f q v\r\n",
          b"set tcp:g 0 0 3\r\nabc\r\n", b"set tcp:g 0 0 9\r\nabc", b"delete tcp:g\r\n", b"incr tcp:n 1\r\n",
          b"mn\r\n", b"version\r\n", b"stats\r\n", b"\r\n", b"\n", b"get \r\n", b"get " + b"k" * 300 + b"\r\n",
          b"\x80\x00\x00\x05", b"\x00\xff\x13", b"VALUE x 0 1\r\n", b"END\r\n", b"ms tcp:g 2\r\nhi\r\n", b"quit\r\n"]
for _ in range(count):
    payload = b"".join(rng.choice(pieces) for _ in range(rng.randrange(1, 12)))
    if rng.random() < 0.3:
        payload = bytes(b ^ rng.randrange(256) if rng.random() < 0.05 else b for b in payload)
    sock = socket.create_connection((host, 11211), timeout=2)
    sock.sendall(payload)
    if rng.random() < 0.5:
        sock.shutdown(socket.SHUT_WR)
    sock.settimeout(0.05)
    try:
        while sock.recv(65536):
            pass
    except OSError:
        pass
    sock.close()
sock = socket.create_connection((host, 11211), timeout=5)
print(get_reply(sock, b"tcp:f").hex())
"""


def test_random_requests_never_stop_the_splitter_nor_change_what_a_clean_client_gets(network, core):
    home = make_hot(core, b"tcp:f", b"fuzzed")
    out = in_client(network, FUZZ, network.server_hosts[home].ip, "7", "300")
    assert bytes.fromhex(out.strip()) == b"VALUE tcp:f 0 6\r\nfuzzed\r\nEND\r\n"
    assert network.switch.tcp_path.process.poll() is None


def test_a_multi_key_get_is_split_by_server_and_joined_in_the_clients_order(network, core):
    """Two hot keys with homes of their own, cold keys, a missing key and a key asked twice, in one get: split into a
    get per server the pipeline picks, answered as the server the client addressed answers it (every server holds
    a copy of each hot key: three servers, one group)."""
    keys = [b"tcp:m1", b"tcp:m2"]
    for key in keys:
        tcp_client(ServerAddress(network.server_hosts[core.key_hash.server_of(key)].ip)).set(key, key + b" value")
    core.submit_report({"time": time.time(), "interval": 1.0, "rate": 1000.0,
                        "top": [{"key": k.decode(), "rate": 400.0} for k in keys]})
    assert eventually(lambda: sorted(k["state"] for k in core.state()["hot_keys"]) == ["clean", "clean"], 15)
    ip = network.server_hosts[0].ip
    tcp_client(ServerAddress(ip)).set(b"tcp:c1", b"cold one")
    tcp_client(ServerAddress(ip)).set(b"tcp:c2", b"cold two")
    line = b"get tcp:c1 tcp:m1 tcp:nothing tcp:m2 tcp:c2 tcp:m1 tcp:m2\r\n"
    balanced = tcp_counter(network, TCP_BALANCED)
    through = raw_through(network, ip, line * 30 + b"get tcp:m1 tcp:m2\r\n" * 30)
    assert through == direct(ip, line * 30 + b"get tcp:m1 tcp:m2\r\n" * 30)
    assert tcp_counter(network, TCP_BALANCED) - balanced > 30, "the keys were never split"


# Runs in the client's namespace: gets on connections from one fixed local port, each reset by the client before
# the next is opened (as a client that reuses its ports soon does, without TIME_WAIT of its own); prints the answers.
SAME_PORT = GET_REPLY + r"""
import socket, struct, sys
host, key, rounds = sys.argv[1], sys.argv[2].encode(), int(sys.argv[3])
answers = []
for _ in range(rounds):
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("0.0.0.0", 61999))  # above the ephemeral ports: no earlier test's connection holds it
    sock.settimeout(5)
    sock.connect((host, 11211))
    answers.append(get_reply(sock, key).hex())
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # reset: no TIME_WAIT here
    sock.close()
print("|".join(answers))
"""


def test_a_client_that_reconnects_from_the_same_port_at_once_is_served_each_time(network, core):
    """The splitter's own connections to servers are made from the client's address and port: closed the usual way
    they would wait a minute in TIME_WAIT, and the client's next connection from that port could not be made."""
    home = make_hot(core, b"tcp:port", b"again")
    answers = in_client(network, SAME_PORT, network.server_hosts[home].ip, "tcp:port", "5").strip().split("|")
    assert [bytes.fromhex(a) for a in answers] == [b"VALUE tcp:port 0 5\r\nagain\r\nEND\r\n"] * 5


def test_what_a_killed_run_left_of_the_tcp_path_is_removed_by_the_leftovers_hook():
    """A run killed with its TCP path up leaves the link and two policy rules; the registry's leftovers hook for the
    switch's name removes them (the claim calls it for a killed run's switches)."""
    from dataplanes import registry
    from dataplanes.bpf.program import DataPlane
    name = f"tl{os.getpid() % 100000}"
    plane = DataPlane(name).load()
    try:
        path = TcpPath(plane, [11311]).start()  # (one path per namespace listens on a port: the module's has 11211)
        path.process.kill()  # the run is killed: nothing is undone
        path.process.wait()
        assert subprocess.run(["ip", "rule", "show", "iif", f"{name}-ts"], capture_output=True, text=True).stdout
    finally:
        removed = registry.remove_left_over(name)  # also what a failure above left: no tl* pins for later tests
    assert any("TCP path's routes" in what for what in removed) and any("TCP path's link" in what for what in removed)
    assert not os.path.exists(f"/sys/class/net/{name}-t") and not os.path.exists(f"/sys/fs/bpf/mbalancer/{name}")
    assert subprocess.run(["ip", "rule", "show", "iif", f"{name}-ts"], capture_output=True, text=True).stdout == ""
    assert f"{path.table + 1}" not in subprocess.run(["ip", "rule", "show"], capture_output=True, text=True).stdout


def test_a_connection_made_before_the_controller_named_the_servers_is_balanced_once_it_has(network):
    """A switch just loaded (or reloaded) knows no server until the controller names them: the splitter takes the
    connections made meanwhile all the same, sends them home, and balances their gets once their home is named."""
    network.switch.reload()  # a fresh program, and its TCP path again: no server named
    config = config_of(network)
    key = b"tcp:early"
    home = make_hash(config.balancing.hash, [s.address for s in config.servers]).server_of(key)
    client = network.popen(network.client_hosts[0], [sys.executable, "-c", GETS_LATER, network.server_hosts[home].ip,
                                                     key.decode(), "600"],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert client.stdout.readline().strip() == "connected"
        assert tcp_counter(network, TCP_CONNECTIONS) == 1  # taken, though no server was named
        core = ControllerCore(config, network.driver(), probe_health=False).start()
        try:
            assert make_hot(core, key, b"early") == home
            before = gets_served(network)
            client.stdin.write("go\n")
            client.stdin.flush()
            values = json.loads(client.stdout.readline())
            spread = [a - b for a, b in zip(gets_served(network), before)]
        finally:
            stop_and_empty(network, core)
    finally:
        client.wait(timeout=30)
    assert values == {repr(b"early"): 600}
    assert chi_square(spread, [1 / 3] * 3) < 27.6, spread  # the same connection, balanced now


def listens(pid: int) -> bool:
    listeners = subprocess.run(["ss", "-Hltnp", "sport", "=", ":11211"], capture_output=True, text=True).stdout
    return f"pid={pid}," in listeners


def test_a_splitter_killed_outright_is_started_again_and_balances_again(network, core):
    """SIGKILL to the splitter (a crash): its supervisor starts it again; the next client connection is balanced."""
    home = make_hot(core, b"tcp:crash", b"crash")
    path = network.switch.tcp_path
    first = path.working_pid()
    assert first is not None and listens(first)
    os.kill(first, signal.SIGKILL)
    assert eventually(lambda: (child := path.working_pid()) not in (None, first) and listens(child), 10)
    before = gets_served(network)
    values = json.loads(in_client(network, GETS, network.server_hosts[home].ip, "tcp:crash", "600"))
    spread = [a - b for a, b in zip(gets_served(network), before)]
    assert values == {repr(b"crash"): 600}
    assert chi_square(spread, [1 / 3] * 3) < 27.6, spread
    assert network.switch.tcp_path.process.poll() is None
