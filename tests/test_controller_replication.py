"""Replication and coherence against real memcached servers, with the recording driver as the data plane.

The recording driver keeps the tables a switch would; subclasses look at the servers at the moment the core calls
them, to check the orderings the core promises (copies before rules, rules before deletes)."""
from __future__ import annotations

import subprocess
import threading
import time

import pytest

from controller.core import ControllerCore
from dataplanes.recording.driver import RecordingDriver
from dataplanes.pipeline import WEIGHT_ONE
from controller.health import RESTARTED, HealthTracker, ProbeFailure, Prober
from experiments.workload.trace import tcp_frame, udp_frame
from mbalancer.config import parse_config
from mbalancer.memcache.addresses import ServerAddress
from mbalancer.memcache.client import tcp_client
from mbalancer.memcache.meta import MetaClient, StoredItem
from mbalancer.memcache.requests import build_set
from mbalancer.memcache.server import MemcachedServer, free_port
from tests.conftest import eventually

SERVERS = 3


@pytest.fixture(scope="module")
def servers():
    started = [MemcachedServer(max_item="2m").start() for _ in range(SERVERS)]
    yield started
    for server in started:
        server.stop()


@pytest.fixture(autouse=True)
def empty_servers(servers):
    for server in servers:
        tcp_client(ServerAddress(*server.address)).flush_all()


def config_for(ports: list[int], **balancing):
    return parse_config({
        "servers": [{"name": f"s{i}", "ip": "127.0.0.1", "mac": f"02:00:00:00:00:{i + 1:02x}", "port": p}
                    for i, p in enumerate(ports)],
        "balancing": {"hot": 2, "hysteresis": 1, "mode": "equal", **balancing},  # shares checked exactly
        "controller": {"health_interval": 0.1, "health_failures": 2}})


def make_core(ports, driver=None, probe_health=False, **balancing) -> tuple[ControllerCore, RecordingDriver]:
    driver = driver or RecordingDriver()
    core = ControllerCore(config_for(ports, **balancing), driver, probe_health=probe_health).start()
    return core, driver


@pytest.fixture
def core(servers):
    core, driver = make_core([s.port for s in servers])
    yield core
    core.stop()


def meta(core: ControllerCore, server: int) -> MetaClient:
    return MetaClient(core.config.servers[server].address)


def store(core, key: bytes, value: bytes, flags: int = 0, ttl: int = -1) -> int:
    """Put the key on its home server (as a client would); returns the home's index."""
    home = core.key_hash.server_of(key)
    meta(core, home).set(key, StoredItem(value, flags, ttl, 0))
    return home


def held(core, key: bytes) -> list[bytes | None]:
    """The value each server holds for the key."""
    items = [meta(core, s).get(key) for s in range(len(core.config.servers))]
    return [i.value if i else None for i in items]


def hot_report(*keys: bytes, rate: float = 1000.0) -> dict:
    return {"time": time.time(), "interval": 1.0, "rate": rate * (len(keys) + 1),
            "top": [{"key": k.decode(), "rate": rate - i} for i, k in enumerate(keys)]}


def warm(core, *keys: bytes) -> None:
    core.submit_report(hot_report(*keys))
    assert core.wait_idle()


def mirror_set(core, key: bytes, value: bytes, apply: bool = True) -> None:
    """A client's set to the home (over UDP, as the data plane would see it) and its mirror to the controller."""
    payload = build_set(key, value)
    if apply:
        meta(core, core.key_hash.server_of(key)).set(key, StoredItem(value, 0, -1, 0))
    core.driver.mirror(udp_frame(payload, **at_home(core, key)), key)


def at_home(core, key: bytes) -> dict:
    """Where a client's request for `key` goes: its home's address, as udp_frame/tcp_frame take it."""
    server = core.config.servers[core.key_hash.server_of(key)]
    return {"dst": server.ip, "dport": server.port}


# --- warm and cool ------------------------------------------------------------------------------------------
class CheckingDriver(RecordingDriver):
    """Looks at the servers when the core installs or removes a key."""

    def __init__(self):
        super().__init__()
        self.at_install: dict[bytes, list] = {}
        self.at_remove: dict[bytes, list] = {}
        self.core: ControllerCore | None = None

    def install_hot_keys(self, installs):
        for install in installs:
            self.at_install[install.key] = [(r.weight, held(self.core, install.key)[r.server])
                                            for r in install.replicas]
        return super().install_hot_keys(installs)

    def remove_hot_keys(self, keys):
        for key in keys:
            self.at_remove[key] = held(self.core, key)
        return super().remove_hot_keys(keys)


@pytest.fixture
def checked(servers):
    driver = CheckingDriver()
    core, _ = make_core([s.port for s in servers], driver)
    driver.core = core
    yield core, driver
    core.stop()


def test_warm_copies_value_flags_and_ttl_before_the_rules_and_ends_clean(checked):
    core, driver = checked
    value = bytes(range(256)) * 400  # 100 KB, every byte value
    home = store(core, b"hot:1", value, flags=77, ttl=300)
    warm(core, b"hot:1")
    # At install time every replica with weight already held the value.
    assert all(v == value for w, v in driver.at_install[b"hot:1"] if w > 0)
    entry = driver.table[b"hot:1"]
    assert entry.home == home and not driver.dirty(b"hot:1")
    assert [r.weight for r in entry.replicas] == pytest.approx([1 / 3] * 3, abs=1 / WEIGHT_ONE)  # as the switch has it
    for server in range(SERVERS):
        item = meta(core, server).get(b"hot:1")
        assert item.value == value and item.flags == 77 and 295 <= item.ttl <= 300
    decision = core.state()["decisions"][-1]
    assert decision["action"] == "warm" and "copied from" in decision["reason"]


def test_an_item_without_expiry_is_copied_without_expiry(core):
    store(core, b"forever", b"v", ttl=-1)
    warm(core, b"forever")
    assert {meta(core, s).get(b"forever").ttl for s in range(SERVERS)} == {-1}


def test_cool_down_removes_the_rules_before_deleting_the_copies(checked):
    core, driver = checked
    home = store(core, b"hot:2", b"v2")
    warm(core, b"hot:2")
    warm(core, b"other")  # hot:2 leaves the top (other is not stored: it is skipped)
    assert driver.at_remove[b"hot:2"] == [b"v2"] * SERVERS  # copies still there when the rules went
    assert b"hot:2" not in driver.table
    assert eventually(lambda: held(core, b"hot:2") == [b"v2" if s == home else None for s in range(SERVERS)])
    assert core.state()["decisions"][-2]["action"] == "cool"


def test_a_key_missing_on_its_home_is_not_installed(core):
    warm(core, b"never-set")
    assert b"never-set" not in core.driver.table
    last = core.state()["decisions"][-1]
    assert last["action"] == "skip" and "nothing to copy" in last["reason"]


def test_a_refused_install_leaves_no_copies_behind(core):
    home = store(core, b"hot:3", b"v3")
    core.driver.refuse("install_hot_key")
    warm(core, b"hot:3")
    assert b"hot:3" not in core.driver.table and not core.executor.hot
    assert held(core, b"hot:3") == [b"v3" if s == home else None for s in range(SERVERS)]
    assert "driver refused" in core.state()["decisions"][-1]["reason"]


def test_an_unreachable_replica_gets_no_weight_until_it_is_refilled(servers):
    port = free_port()
    ports = [servers[0].port, servers[1].port, port]
    core, driver = make_core(ports, hot=1)
    try:
        key = next(k for k in (b"k%d" % i for i in range(100)) if core.key_hash.server_of(k) != 2)
        store(core, key, b"value")
        warm(core, key)
        weights = {r.server: r.weight for r in driver.table[key].replicas}
        assert weights[2] == 0 and sum(weights.values()) == pytest.approx(1)
        assert not driver.dirty(key)
        assert any(r["action"] == "refill" and r["server"] == 2 for r in core.state()["retries"])
        with MemcachedServer(port=port):
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and not {r.server: r.weight for r in
                                                       driver.table[key].replicas}[2] > 0:
                time.sleep(0.05)
            weight = {r.server: r.weight for r in driver.table[key].replicas}[2]
            assert weight == pytest.approx(1 / 3, abs=1 / WEIGHT_ONE)  # as the switch holds it
            assert meta(core, 2).get(key).value == b"value"
    finally:
        core.stop()


# --- coherence ----------------------------------------------------------------------------------------------
def test_a_mirrored_set_reaches_every_replica_then_clears_the_dirty_bit(core):
    store(core, b"hot:4", b"old")
    warm(core, b"hot:4")
    started = time.monotonic()
    mirror_set(core, b"hot:4", b"new")
    assert core.driver.dirty(b"hot:4")  # set by the data plane on the mirror
    assert core.wait_idle()
    elapsed = time.monotonic() - started
    assert held(core, b"hot:4") == [b"new"] * SERVERS
    assert not core.driver.dirty(b"hot:4")
    hot = core.state()["hot_keys"][0]
    assert hot["syncs"] == 1 and hot["last_sync_ms"] < 1000 * elapsed + 1
    assert core.state()["counters"]["sync_ms"]["count"] == 1


def test_a_mirror_that_arrives_before_the_home_applies_the_write(core):
    home = store(core, b"hot:5", b"old")
    warm(core, b"hot:5")
    mirror_set(core, b"hot:5", b"new", apply=False)
    time.sleep(0.01)  # the core is waiting for the home's CAS to change
    meta(core, home).set(b"hot:5", StoredItem(b"new", 0, -1, 0))
    assert core.wait_idle()
    assert held(core, b"hot:5") == [b"new"] * SERVERS
    assert not core.driver.dirty(b"hot:5")


def test_a_write_that_never_lands_still_ends_clean(core):
    store(core, b"hot:6", b"old")
    warm(core, b"hot:6")
    core.driver.mirror(udp_frame(b"add hot:6 0 0 3\r\nnew\r\n", **at_home(core, b"hot:6")), b"hot:6")
    assert core.wait_idle()
    # dirty while it may still land (tests/test_executor.py shows when, on a fake clock), then settled
    assert eventually(lambda: not core.driver.dirty(b"hot:6"))
    assert held(core, b"hot:6") == [b"old"] * SERVERS


def test_a_mirrored_delete_deletes_the_copies(core):
    home = store(core, b"hot:7", b"old")
    warm(core, b"hot:7")
    meta(core, home).delete(b"hot:7")
    core.driver.mirror(tcp_frame(b"delete hot:7\r\n", **at_home(core, b"hot:7")), b"hot:7")
    assert core.wait_idle()
    assert held(core, b"hot:7") == [None] * SERVERS and not core.driver.dirty(b"hot:7")


def test_a_large_set_cut_across_tcp_segments_is_still_synced(core):
    home = store(core, b"hot:8", b"old")
    warm(core, b"hot:8")
    value = b"x" * 200_000
    meta(core, home).set(b"hot:8", StoredItem(value, 0, -1, 0))
    first_segment = build_set(b"hot:8", value)[:1400]
    core.driver.mirror(tcp_frame(first_segment, **at_home(core, b"hot:8")), b"hot:8")
    assert core.wait_idle()
    assert held(core, b"hot:8") == [value] * SERVERS


class WritingDriver(RecordingDriver):
    """Makes a client write land at the worst moment: during install, or while the dirty bit is cleared."""

    def __init__(self, when: str):
        super().__init__()
        self.when, self.core, self.done = when, None, False

    def _write(self, key):
        if not self.done:
            self.done = True
            home = self.core.key_hash.server_of(key)
            meta(self.core, home).set(key, StoredItem(b"racing", 0, -1, 0))

    def install_hot_keys(self, installs):
        refused = super().install_hot_keys(installs)
        if self.when == "install":
            self._write(installs[0].key)
        return refused

    def clear_dirty_keys(self, stamps):
        refused = super().clear_dirty_keys(stamps)
        if self.when == "clear":
            self._write(next(iter(stamps)))
        return refused


@pytest.mark.parametrize("when", ["install", "clear"])
def test_a_write_racing_the_core_never_leaves_stale_replicas_in_use(servers, when):
    driver = WritingDriver(when)
    core, _ = make_core([s.port for s in servers], driver)
    driver.core = core
    try:
        store(core, b"hot:9", b"old")
        warm(core, b"hot:9")
        assert driver.done
        assert held(core, b"hot:9") == [b"racing"] * SERVERS
        assert not driver.dirty(b"hot:9")
        if when == "clear":  # held dirty again the moment the core saw the home change
            assert [c.method for c in driver.calls if c.method in ("set_dirty", "clear_dirty")] == [
                "clear_dirty", "set_dirty", "clear_dirty"]
    finally:
        core.stop()


@pytest.mark.parametrize("frame", [b"", b"\x00" * 10, udp_frame(b"\x80\x01binary"), udp_frame(b"garbage\r\n"),
                                   udp_frame(b"set k 0 0 99999999999999999999\r\n"), tcp_frame(b"x" * 300)])
def test_unreadable_mirrors_are_counted_and_ignored(core, frame):
    core.submit_mirror(frame)
    assert core.wait_idle()
    counters = core.state()["counters"]
    assert counters["mirrors"] == counters["mirrors_unreadable"] == 1
    assert counters.get("internal_errors", 0) == 0


def test_a_mirror_for_a_key_that_is_not_hot_is_ignored(core):
    mirror_set(core, b"cold", b"v")
    assert core.wait_idle()
    assert held(core, b"cold").count(b"v") == 1


# --- health -------------------------------------------------------------------------------------------------
def test_a_dead_replica_loses_its_weight_and_is_refilled_when_it_returns():
    servers = [MemcachedServer().start() for _ in range(SERVERS)]
    core, driver = make_core([s.port for s in servers], probe_health=True, hot=1)
    try:
        key = next(k for k in (b"h%d" % i for i in range(100)) if core.key_hash.server_of(k) != 2)
        store(core, key, b"value")
        warm(core, key)
        port = servers[2].port
        servers[2].stop()
        assert eventually(lambda: {r.server: r.weight for r in driver.table[key].replicas}[2] == 0)
        assert not core.state()["servers"][2]["up"]
        servers[2] = MemcachedServer(port=port).start()  # back, empty
        assert eventually(lambda: {r.server: r.weight for r in driver.table[key].replicas}[2] > 0)
        assert meta(core, 2).get(key).value == b"value"
        actions = [d["action"] for d in core.state()["decisions"]]
        assert actions.index("server-down") < actions.index("server-up") < actions.index("refill")
    finally:
        core.stop()
        for server in servers:
            server.stop()


def test_state_is_readable_while_the_core_works(core):
    store(core, b"hot:10", b"v" * 100_000)
    stop = threading.Event()
    errors = []

    def read_state():
        while not stop.is_set():
            try:
                core.state()
            except Exception as err:  # noqa: BLE001 - the test reports any
                errors.append(err)

    reader = threading.Thread(target=read_state)
    reader.start()
    for _ in range(20):
        warm(core, b"hot:10")
        warm(core, b"x")
    stop.set()
    reader.join()
    assert not errors


# --- driver failures: gets stay safe, the core retries ------------------------------------------------------
def two_hot_keys(core) -> list[bytes]:
    """Two keys homed away from server 2, warmed on all three servers."""
    keys = [k for k in (b"f%d" % i for i in range(200)) if core.key_hash.server_of(k) != 2][:2]
    for key in keys:
        store(core, key, b"v")
    warm(core, *keys)
    assert all(key in core.driver.table and not core.driver.dirty(key) for key in keys)
    return keys


def take_down(core, server: int) -> None:
    """What a prober does when a server keeps failing its probes: the worker handles it, as in production."""
    hold, start = core.config.controller.health_hold, time.monotonic()
    changes = [core.health.record(server, ProbeFailure("no answer (test)"), start + i * hold)
               for i in range(core.config.controller.health_failures + 1)]
    assert "down" in changes
    core.submit_health(server, "down", "no answer (test)")
    assert core.wait_idle()
    assert not core.state()["servers"][server]["up"]


def weight_of(driver, key: bytes, server: int) -> float:
    return {r.server: r.weight for r in driver.table[key].replicas}[server]


def test_a_key_whose_weights_and_dirty_bit_are_refused_does_not_stop_a_server_going_down(core):
    first, second = two_hot_keys(core)
    core.driver.refuse("set_weights", first, times=100)
    core.driver.refuse("set_dirty", first, times=100)
    take_down(core, 2)
    assert weight_of(core.driver, second, 2) == 0  # the later key is not left on the dead server
    assert first not in core.driver.table  # the refused one: its rules removed, so its gets go home untouched
    assert not core.executor.hot[first].installed
    assert any(r["action"] == "install" and r["key"] == first.decode() for r in core.state()["retries"])


def test_refused_weights_keep_the_key_dirty_and_are_retried_until_written(core):
    key, _ = two_hot_keys(core)
    core.driver.refuse("set_weights", key, times=2)
    take_down(core, 2)
    assert core.driver.dirty(key) and weight_of(core.driver, key, 2) > 0  # safe: gets go home meanwhile
    assert eventually(lambda: weight_of(core.driver, key, 2) == 0 and not core.driver.dirty(key), timeout=5)
    assert [c.args[0][2].weight for c in core.driver.calls_of("set_weights") if c.key == key][-1] == 0


def test_a_dirty_bit_that_cannot_be_cleared_stays_set_and_is_cleared_later(core):
    store(core, b"hot:11", b"v")
    core.driver.refuse("clear_dirty", b"hot:11", times=1)
    warm(core, b"hot:11")
    assert core.driver.dirty(b"hot:11")  # the clear was refused: gets go home
    assert eventually(lambda: not core.driver.dirty(b"hot:11"), timeout=5)


def test_an_install_the_driver_refuses_is_not_copied_again_before_its_back_off(core):
    store(core, b"hot:12", b"v")
    core.driver.refuse("install_hot_key", b"hot:12", times=100)
    warm(core, b"hot:12")
    copies = core.replicator.copies
    warm(core, b"hot:12")
    assert core.replicator.copies == copies  # no copy to waste while backing off
    assert "next try in" in core.state()["decisions"][-1]["reason"]


def test_a_switch_that_comes_back_empty_gets_every_hot_key_again(core):
    keys = two_hot_keys(core)
    weights = {k: core.driver.table[k].replicas for k in keys}
    core.driver.reconnect()
    assert core.wait_idle()
    assert {k: core.driver.table[k].replicas for k in keys} == weights
    assert not any(core.driver.dirty(k) for k in keys)
    assert core.state()["counters"]["reconnects"] == 1


def test_a_fabric_balances_each_key_at_its_homes_box_and_a_box_back_empty_gets_its_keys_again(servers):
    """The core over a fabric (dataplanes/agent/fabric.py) of four boxes, recording drivers in place of their
    agents: each server's box holds the rules of the keys homed on that server and no other's, the spine none; a
    box that comes back empty gets its keys installed again, and the boxes that kept theirs are not touched (only the
    box that came back is concerned: controller/adoption.py came_back)."""
    from dataplanes.agent import Settings
    from dataplanes.agent.fabric import FabricDriver
    boxes = [RecordingDriver() for _ in range(4)]
    made = iter(boxes)
    fabric = FabricDriver(Settings(boxes=("10.0.1.2:9600 s0", "10.0.1.6:9600 s1", "10.0.1.10:9600 s2",
                                          "10.0.1.14:9600")), connect=lambda settings: next(made))
    core, _ = make_core([s.port for s in servers], driver=fabric, hot=3)
    try:
        keys = {home: next(k for k in (b"fab%d" % i for i in range(300)) if core.key_hash.server_of(k) == home)
                for home in range(SERVERS)}
        for key in keys.values():
            store(core, key, b"v")
        warm(core, *keys.values())
        assert [set(box.table) for box in boxes] == [{keys[0]}, {keys[1]}, {keys[2]}, set()]
        assert all(box.lease_until > 0 for box in boxes)  # the spine's lease too: it forwards, and is asked
        assert all(not boxes[home].dirty(key) for home, key in keys.items())
        weights = {home: boxes[home].table[key].replicas for home, key in keys.items()}
        boxes[1].reconnect()
        assert core.wait_idle() and eventually(lambda: all(
            key in boxes[home].table and not boxes[home].dirty(key) for home, key in keys.items()), timeout=5)
        assert {home: boxes[home].table[key].replicas for home, key in keys.items()} == weights
        assert [len(box.calls_of("install_hot_key")) for box in boxes] == [1, 2, 1, 0]
        assert [len(box.calls_of("set_dirty")) for box in boxes[::2]] == [0, 0]  # the kept keys left as they were
        counted = fabric.read_counters()
        assert set(counted.keys) == set(keys.values()) and counted.unsure == 0  # no get or write passed yet
        assert all(c.gets == c.mirrored == 0 for c in counted.keys.values())
        boxes[2].unsure(2, b"x")
        assert fabric.read_counters().unsure == 1
    finally:
        core.stop()


@pytest.mark.parametrize("boxes, servers_named, message", [
    (("10.0.1.2 s0",), ("s0",), "is not \"host:port"),
    (("10.0.1.2:9600 s0", "10.0.1.6:9600 s0"), ("s0",), "s0 cabled to more than one box"),
    (("10.0.1.2:9600 s0",), ("s0", "s1"), "s1 cabled to no box"),
    (("10.0.1.2:9600 s0 s9",), ("s0",), "names s9, not a server of the config"),
])
def test_a_fabric_that_cannot_be_refuses_in_one_line(boxes, servers_named, message):
    from dataplanes.agent import Settings
    from dataplanes.agent.fabric import FabricDriver
    from dataplanes.driver import DriverError
    from mbalancer.settings import ConfigError, Server
    with pytest.raises((ConfigError, DriverError), match=message) as raised:
        fabric = FabricDriver(Settings(boxes=boxes), connect=lambda settings: RecordingDriver())
        fabric.attach([Server(n, "127.0.0.1", "02:00:00:00:00:01", 11211) for n in servers_named], lambda f: None)
    assert "\n" not in str(raised.value)


def test_a_fabric_runs_only_data_planes_that_name_the_home_downstream():
    from dataplanes.agent import Settings
    from dataplanes.agent.fabric import FabricDriver
    from dataplanes.driver import DriverError, ForwardingEntry
    box = RecordingDriver()
    box.kind = "bridge"  # what an agent would say in its hello, were the benchmarks' plain bridge served by one
    with pytest.raises(DriverError, match="the bridge data plane cannot do yet"):
        FabricDriver(Settings(boxes=("10.0.1.2:9600 s0",)), connect=lambda settings: box)
    with pytest.raises(DriverError, match="learn where each MAC is"):
        FabricDriver(Settings(boxes=("10.0.1.2:9600 s0",)), connect=lambda s: RecordingDriver()).set_forwarding(
            [ForwardingEntry("02:00:00:00:00:01", "eth0")])


class SlowCountersDriver(RecordingDriver):
    """read_counters takes as long as a slow switch's round trip."""

    def __init__(self):
        super().__init__()
        self.reading, self.release = threading.Event(), threading.Event()

    def read_counters(self):
        self.reading.set()
        self.release.wait(10)
        return super().read_counters()


def test_reading_counters_never_holds_up_the_core(servers):
    driver = SlowCountersDriver()
    core, _ = make_core([s.port for s in servers], driver)
    try:
        reader = threading.Thread(target=core.state)
        reader.start()
        assert driver.reading.wait(5)
        store(core, b"hot:13", b"v")
        warm(core, b"hot:13")  # handled while a state() call waits for the counters
        assert b"hot:13" in driver.table
        driver.release.set()
        reader.join(5)
    finally:
        driver.release.set()
        core.stop()


# --- coherence under races, lost copies, unreadable requests, bursts, restarts ------------------------------------
def test_a_key_is_not_cleared_while_a_copy_of_its_write_is_on_its_way(core):
    home = store(core, b"hot:20", b"v1")
    warm(core, b"hot:20")
    core.driver.count_write(b"hot:20")  # the data plane counted a write and copied it: still in flight
    meta(core, home).set(b"hot:20", StoredItem(b"v2", 0, -1, 0))  # the home applied it
    core.driver.unsure(home, tcp_frame(b"stats\r\n", **at_home(core, b"hot:20")))  # something makes the core look
    assert core.wait_idle()
    assert core.driver.dirty(b"hot:20")  # not cleared: the write's copy has not been handled
    core.driver.on_mirror(udp_frame(build_set(b"hot:20", b"v2"), **at_home(core, b"hot:20")))  # it arrives
    assert eventually(lambda: not core.driver.dirty(b"hot:20"))
    assert held(core, b"hot:20") == [b"v2"] * SERVERS


def test_a_copy_that_never_arrives_makes_the_core_check_every_key_at_its_home(core):
    home = store(core, b"hot:21", b"v1")
    warm(core, b"hot:21")
    core.driver.count_write(b"hot:21")  # counted and copied by the data plane, lost on the way
    meta(core, home).set(b"hot:21", StoredItem(b"v2", 0, -1, 0))
    core.driver.unsure(home, tcp_frame(b"stats\r\n", **at_home(core, b"hot:21")))
    assert eventually(lambda: not core.driver.dirty(b"hot:21"))
    assert held(core, b"hot:21") == [b"v2"] * SERVERS
    assert core.state()["counters"]["mirrors_lost"] == 1


@pytest.mark.parametrize("request_bytes", [b"\x80\x01\x00\x06\x08\x00\x00\x00" + b"\x00" * 16, b"x" * 500],
                         ids=["binary protocol", "middle of a value"])
def test_a_write_nobody_can_read_is_found_at_the_home_and_synced(core, request_bytes):
    home = store(core, b"hot:22", b"v1")
    warm(core, b"hot:22")
    meta(core, home).set(b"hot:22", StoredItem(b"v2", 0, -1, 0))  # what the unreadable request did
    core.driver.unsure(home, tcp_frame(request_bytes, **at_home(core, b"hot:22")))
    assert core.driver.dirty(b"hot:22")  # at once, in the data plane
    assert eventually(lambda: not core.driver.dirty(b"hot:22"))
    assert held(core, b"hot:22") == [b"v2"] * SERVERS


def test_pipelined_writes_are_all_synced(core):
    keys = [k for k in (b"p%d" % i for i in range(100)) if core.key_hash.server_of(k) == 0][:2]
    for key in keys:
        store(core, key, b"old")
    warm(core, *keys)
    segment = b"set cold 0 0 1\r\nx\r\n" + b"".join(build_set(k, b"new") for k in keys)  # set_many, cold first
    for key in keys:
        meta(core, 0).set(key, StoredItem(b"new", 0, -1, 0))
    core.driver.unsure(0, tcp_frame(segment, **at_home(core, keys[0])))
    assert eventually(lambda: not any(core.driver.dirty(k) for k in keys))
    assert all(held(core, k) == [b"new"] * SERVERS for k in keys)


class GatedDriver(RecordingDriver):
    """Holds the core's worker in its first read of write stamps until the test opens the gate."""

    def __init__(self):
        super().__init__()
        self.gate, self.waiting = threading.Event(), threading.Event()

    def write_stamps(self, keys):
        if not self.gate.is_set():
            self.waiting.set()
            self.gate.wait(10)
        return super().write_stamps(keys)


def test_a_burst_of_writes_to_one_key_is_synced_once(servers):
    driver = GatedDriver()
    core, _ = make_core([s.port for s in servers], driver)
    try:
        driver.gate.set()
        home = store(core, b"hot:23", b"v0")
        warm(core, b"hot:23")
        driver.gate.clear()
        mirror_set(core, b"hot:23", b"v1")
        assert driver.waiting.wait(10)  # the worker is inside the first sync
        for version in range(2, 1001):
            mirror_set(core, b"hot:23", b"v%d" % version)
        copies = core.replicator.copies
        driver.gate.set()
        assert core.wait_idle()
        assert held(core, b"hot:23") == [b"v1000"] * SERVERS and not driver.dirty(b"hot:23")
        assert core.replicator.copies - copies <= 2 * (SERVERS - 1)  # 999 queued writes: one sync (and a recheck)
        assert meta(core, home).get(b"hot:23").value == b"v1000"
    finally:
        core.stop()


def test_a_key_left_by_an_earlier_controller_is_adopted_and_its_stale_copies_made_again(servers):
    """Its lease ran out (this driver's is 0 before the core renews it): the key is held dirty, its home's item (none
    here) pushed to its replicas, then cleared; it stays hot until the plan cools it (tests/test_adoption.py has the
    rest)."""
    driver = RecordingDriver()
    driver.leftover(b"old:1", 0, (0, 1, 2))
    for server in (1, 2):
        MetaClient(ServerAddress("127.0.0.1", servers[server].port)).set(b"old:1", StoredItem(b"stale", 0, -1, 0))
    core, _ = make_core([s.port for s in servers], driver)
    try:
        assert held(core, b"old:1") == [None] * SERVERS
        assert [(d["action"], d.get("why")) for d in core.state()["decisions"]] == [("adopt", "lease-expired")]
        assert not driver.dirty(b"old:1")
    finally:
        core.stop()


def test_the_lease_is_renewed_while_the_core_runs_and_ends_with_it(servers):
    core, driver = make_core([s.port for s in servers])
    assert driver.lease_until / 1e9 > time.monotonic() + 0.5 * core.config.controller.lease  # (ns, monotonic)
    renewed = driver.lease_until
    assert eventually(lambda: driver.lease_until > renewed)
    core.stop()
    assert driver.lease_until == 0


# --- health -----------------------------------------------------------------------------------------------------
NO_ANSWER = ProbeFailure("no answer")  # over TCP


def test_a_server_is_down_only_after_failing_for_the_hold_time():
    tracker = HealthTracker(1, failures=2, hold=0.25)
    assert [tracker.record(0, NO_ANSWER, t) for t in (0.0, 0.1, 0.2)] == [None, None, None]  # 0.2 s: a transient
    assert tracker.unavailable(0) is not None  # ... during which no copy waits on it
    assert [tracker.record(0, None, t) for t in (0.3, 0.4)] == [None, None] and tracker.unavailable(0) is None
    assert [tracker.record(0, NO_ANSWER, t) for t in (1.0, 1.1, 1.2, 1.3)] == [None, None, None, "down"]
    assert [tracker.record(0, None, t) for t in (1.4, 1.5)] == [None, None]  # one good moment is not recovery
    assert tracker.record(0, NO_ANSWER, 1.6) is None
    assert [tracker.record(0, None, t) for t in (1.7, 1.8, 1.9, 2.0)] == [None, None, None, "up"]


def test_a_server_that_answers_now_and_then_is_still_down():
    tracker = HealthTracker(1, failures=2, hold=0.25)
    udp = ProbeFailure("UDP request unanswered", tcp=False)
    results = [udp, udp, None, udp, udp]  # a half-wedged UDP listener
    assert [tracker.record(0, r, i / 10) for i, r in enumerate(results)] == [None, None, None, "down", None]


def test_a_lost_udp_probe_does_not_stop_copies_and_reads_over_tcp():
    """A UDP request or answer lost on a saturated link fails a probe, which counts towards down as any failure;
    but TCP answered, so copies to the server and reads of its values (over TCP) go on. They were refused after one
    such probe: a busy home's hot keys stayed dirty, their gets sent home, in the OpenFlow demo under load."""
    tracker = HealthTracker(1, failures=2, hold=0.25)
    udp = ProbeFailure("UDP request 4 of 16 unanswered", tcp=False)
    assert tracker.record(0, udp, 0.0) is None and tracker.unavailable(0) is None
    assert tracker.record(0, NO_ANSWER, 0.1) is None and "failed its last 1 health probes" in tracker.unavailable(0)
    assert tracker.record(0, udp, 0.2) is None and tracker.unavailable(0) is None
    assert tracker.record(0, udp, 0.3) == "down" and "is down" in tracker.unavailable(0)  # 4 failures over 0.3 s


def test_a_probe_waits_for_a_queue_that_grew_from_its_latest_answer_on():
    """A server idle so far (answers in 1 ms) whose link fills as the load starts: one answer 0.2 s late sets the
    next wait to 4 x 0.2 s, where the running estimate alone (0.06 s) left 0.25 s, and its queue took it down."""
    prober = Prober(ServerAddress("127.0.0.1", 1), 0.25, udp=False)
    try:
        for _ in range(20):
            prober._answered(0.001)
        assert prober.timeout == pytest.approx(0.25)
        prober._answered(0.2)
        assert prober.timeout == pytest.approx(0.8)
        prober._answered(0.5)
        assert prober.timeout == pytest.approx(1.0)  # MAX_TIMEOUT: a hung server is still out within seconds
        for _ in range(20):
            prober._answered(0.001)
        assert prober.timeout == pytest.approx(0.25)  # the queue drained
    finally:
        prober.close()


def test_the_probe_finds_a_server_that_answers_tcp_but_not_udp():
    port = free_port()
    tcp_only = subprocess.Popen(["memcached", "-l", "127.0.0.1", "-p", str(port), "-U", "0", "-u", "root"])
    try:
        address = ServerAddress("127.0.0.1", port)
        tcp, both = Prober(address, 0.2, udp=False), Prober(address, 0.2)
        assert eventually(lambda: tcp.check() is None)
        error = both.check()
        assert error is not None and not error.tcp and "UDP" in error.why
        tcp.close()
        both.close()
    finally:
        tcp_only.kill()
        tcp_only.wait()


@pytest.mark.parametrize("held, fails", [({}, False), ({3: 0.3}, False), ({3: 0.3, 9: 1.3}, True)])
def test_one_udp_request_a_probe_has_no_answer_to_is_sent_again_and_a_second_fails_it(held, fails):
    """A datagram now and then lost (or held up) on a saturated link is no fault; a reader that swallows more is.
    `held`: the relay's requests (counted from 1, a request sent again counts) whose answer it holds for so many
    seconds, past the probe's timeout (0.2 s, then 1 s once a late answer came in 0.3 s); it answers in order."""
    from tests.udp_relay import UdpRelay
    with MemcachedServer() as server:
        delays = tuple(held.get(n, 0.0) for n in range(1, 20))
        with UdpRelay(tuple(server.address), delays=delays) as relay:
            prober = Prober(ServerAddress(*server.address), 0.2)
            prober.address = ServerAddress(*relay.address)  # UDP through the relay (TCP was dialled already)
            try:
                error = prober.check()
                assert (error is not None) == fails, error
                assert error is None or (not error.tcp and "2 of " in error.why), error
            finally:
                prober.close()


def test_health_probes_leave_no_trace_in_the_servers_statistics():
    """An operator's hit and miss rates stay the clients': the probes get, set and miss nothing, over TCP or UDP."""
    with MemcachedServer() as server:
        address = ServerAddress(*server.address)
        prober = Prober(address, 0.2)
        counted = ("cmd_get", "cmd_set", "get_hits", "get_misses", "cmd_touch", "delete_misses", "curr_items")
        before = MetaClient(address).stats()
        try:
            assert [prober.check() for _ in range(20)] == [None] * 20
        finally:
            prober.close()
        after = MetaClient(address).stats()
        assert {k: after[k] for k in counted} == {k: before[k] for k in counted}


def test_the_probe_finds_a_server_that_was_flushed_or_restarted():
    with MemcachedServer() as server:
        prober = Prober(ServerAddress(*server.address), 0.2)
        try:
            assert prober.check() is None and prober.check() is None
            tcp_client(ServerAddress(*server.address)).flush_all()
            assert prober.check() == RESTARTED and prober.check() is None
            server.stop()
            server.start()  # same port, a new process
            results = [prober.check() for _ in range(3)]  # the old connection's end, then the new process
            assert RESTARTED in results and results[-1] is None
        finally:
            prober.close()


def test_gets_flooded_to_a_replica_the_switch_never_saw_take_it_out_for_good(core):
    """The switch went on flooding gets balanced to replica 2 from one check to the next and never saw a packet
    from its configured MAC: the same alarm as a MAC seen wrong (controller/mac_check.py). It gets weight 0 in every
    replica set, one line says why, and it stays out when its health says "up" (only a restart with its entry fixed
    brings it back)."""
    from dataplanes.driver import MacSighting
    driver = core.driver
    key = next(k for k in (b"f%d" % i for i in range(100)) if core.key_hash.server_of(k) != 2)
    store(core, key, b"value")
    warm(core, key)
    assert {r.server: r.weight for r in driver.table[key].replicas}[2] > 0
    seen = [MacSighting((s.mac,)) for s in core.config.servers[:2]]
    driver.macs = seen + [MacSighting(flooded=1)]
    core._check_macs()  # what the counters thread does every second
    assert core.wait_idle()
    assert {r.server: r.weight for r in driver.table[key].replicas}[2] > 0  # a switch still learning floods a few
    driver.macs = seen + [MacSighting(flooded=3)]
    core._check_macs()
    assert core.wait_idle()
    assert {r.server: r.weight for r in driver.table[key].replicas}[2] == 0
    line = next(d["reason"] for d in core.decisions_made() if d["action"] == "server-mac")
    assert line.startswith("server 2 (s2): configured mac 02:00:00:00:00:03, seen none: 3 gets balanced"), line
    core.submit_health(2, "up", None)
    warm(core, key)  # a report: the plan leaves it out too
    assert {r.server: r.weight for r in driver.table[key].replicas}[2] == 0
    assert [s["mac_check"]["status"] for s in core.state()["servers"]] == ["ok", "ok", "flooded"]
