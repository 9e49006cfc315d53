"""Shared test helpers: run the installed `mbalancer` command as a user would; each test module's tier."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

MBALANCER = Path(sys.executable).parent / "mbalancer"

# --- tiers: what each test module needs (docs/testing.md) ------------------------------------------------------------
# One explicit table, not a guess from names: a module's tier is the most a test of it needs (a module with pure tests
# and Mininet tests is mininet), and a module missing here fails tests/test_tiers.py. The markers are registered in
# setup.cfg; `make test-unit` runs `pytest -m unit`, `make test` every tier.
TIER_NAMES = ("unit", "slow", "root", "etcd", "bmv2", "mininet")
TIERS: dict[str, str] = {
    # unit: no root, nothing but what `make install` installs (memcached on loopback), the whole tier in a minute
    "test_cli": "unit", "test_config": "unit", "test_driver_calls": "unit", "test_config_reference": "unit",
    "test_controller_decisions": "unit", "test_core_defects": "unit",
    "test_docs": "unit", "test_driver_process": "unit", "test_executor": "unit", "test_hot_key_states": "unit",
    "test_install": "unit", "test_adoption": "unit",
    "test_key_hashes": "unit", "test_layout": "unit", "test_mac_check": "unit", "test_measured_balance": "unit",
    "test_memcache_client": "unit", "test_memcache_fuzz": "unit", "test_memcache_memory": "unit",
    "test_memcache_protocol": "unit",
    "test_memcache_real_server": "unit", "test_monitor_follow": "unit", "test_monitor_hot_keys": "unit",
    "test_monitor_parsing": "unit", "test_notebooks": "unit", "test_openflow_box": "unit", "test_ownership": "unit",
    "test_scale_writes": "unit", "test_ryu_failover_logic": "unit", "test_simulation_cli": "unit",
    "test_simulation_model": "unit", "test_tiers": "unit", "test_water_filling": "unit",
    # slow: no root either, but 10-30 s a module (load runs, servers killed and restarted, ryu-manager, agents, HTTP
    # servers' timeouts): together they would take the unit tier past its minute
    "test_controller_access": "slow", "test_controller_http": "slow", "test_controller_replication": "slow",
    "test_p4runtime_driver": "slow", "test_switch_agent": "slow", "test_workload": "slow",
    # root: network namespaces, tc, eBPF, Open vSwitch, tcpdump
    "test_benchmarks": "root", "test_claim": "root", "test_coherence_paths": "root", "test_dataplane_sketch": "root",
    "test_deployment": "root", "test_driver_contract": "root", "test_ebpf_network": "root",
    "test_ebpf_program": "root", "test_faults": "root", "test_libmemcached_tools": "root",
    "test_measured_balance_network": "root", "test_monitor_capture": "root", "test_monitor_follows_switch": "root",
    "test_openflow_attach": "root", "test_openflow_driver": "root", "test_openflow_network": "root",
    "test_slot_book_refusals": "root", "test_ryu_failover": "root", "test_tcp_path": "root",
    # etcd: Debian's etcd-server, started by the test
    "test_election": "etcd", "test_election_quorum": "etcd",
    # bmv2: simple_switch_grpc (`make p4`), root
    "test_p4_adoption": "bmv2", "test_p4_network": "bmv2", "test_p4_program": "bmv2", "test_p4_sketch": "bmv2",
    # mininet: the Mininet testbed, root (test_fabric_failover needs etcd too)
    "test_experiments_endtoend": "mininet", "test_fabric_failover": "mininet", "test_failover_adoption": "mininet",
    "test_mininet_switch": "mininet", "test_mixed_fabric": "mininet", "test_openflow_fabric_restart": "mininet",
}


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        tier = TIERS.get(item.path.stem)
        if tier is not None:
            item.add_marker(tier)


def pytest_configure(config: pytest.Config) -> None:
    # Not root: the controllers the tests start keep their switches' owner files (mbalancer/ownership.py) in a folder
    # of this run's, since /run/mbalancer/ is root's.
    if os.geteuid() != 0 and "MBALANCER_OWNERS_DIR" not in os.environ:
        os.environ["MBALANCER_OWNERS_DIR"] = tempfile.mkdtemp(prefix="mbalancer-owners-")
        config.add_cleanup(lambda: shutil.rmtree(os.environ.pop("MBALANCER_OWNERS_DIR"), ignore_errors=True))


@pytest.fixture
def run_cli():
    """Run `mbalancer ARGS...`; returns the CompletedProcess (text mode, output captured)."""
    def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        assert MBALANCER.exists(), f"console script missing at {MBALANCER}: is the package installed (pip install -e .)?"
        return subprocess.run([str(MBALANCER), *args], capture_output=True, text=True, timeout=timeout)
    return run


@pytest.fixture(scope="module")
def memcached():
    """A real memcached on a free loopback port, TCP and UDP, stopped by PID after the module's tests."""
    from mbalancer.memcache.server import MemcachedServer
    with MemcachedServer(max_item="2m") as server:
        yield server


@pytest.fixture(scope="module")
def memcached_pair():
    """Two real memcached servers on free loopback ports (home and replica), stopped by PID after the module."""
    from mbalancer.memcache.server import MemcachedServer
    with MemcachedServer() as first, MemcachedServer() as second:
        yield [first, second]


def eventually(check, timeout: float = 10.0, every: float = 0.02) -> bool:
    """Poll `check()` until it is true or `timeout` seconds pass; returns its last answer."""
    import time
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(every)
    return bool(check())


def memcached_answers(ip: str, port: int = 11211) -> bool:
    """True if a memcached answers at ip:port (for waiting until one has started)."""
    from mbalancer.memcache.addresses import ServerAddress
    from mbalancer.memcache.meta import answers
    return answers(ServerAddress(ip, port))


def store_closed(address, key: bytes, value: bytes = b"v", timeout: float = 10.0) -> None:
    """Set `key` at a server from this host over a connection closed both ways before this returns: the server's
    FIN has come back through every switch. A switch attached between the two FINs takes the server's for a close
    of its own (the server may have restarted): it copies it to the controller and holds the server's keys dirty."""
    import socket
    with socket.create_connection(tuple(address), timeout=timeout) as sock:
        sock.sendall(b"set %s 0 0 %d\r\n%s\r\n" % (key, len(value), value))
        reply = b""
        while not reply.endswith(b"\r\n") and len(reply) < 64:
            reply += sock.recv(64) or b"\r\n"
        assert reply == b"STORED\r\n", (address, reply)
        sock.shutdown(socket.SHUT_WR)
        for _ in range(16):  # bounded: the server answers our FIN with its own (b""); recv times out otherwise
            if not sock.recv(64):
                break


def wait_for_line(process, text: str, timeout: float = 30.0) -> str:
    """Read the process's stderr (a text pipe) until a line contains `text`; returns what was read. Fails the test
    if the process exits or the time runs out first (start-up time depends on the machine: wait, never guess)."""
    import select
    import time
    deadline, seen = time.monotonic() + timeout, []
    while (left := deadline - time.monotonic()) > 0:
        if select.select([process.stderr], [], [], left)[0]:
            line = process.stderr.readline()
            if not line:
                break
            seen.append(line)
            if text in line:
                return "".join(seen)
    pytest.fail(f"no {text!r} from the process within {timeout:g} s; it said: {''.join(seen)[-2000:]!r}")


def why_no_mininet() -> str | None:
    """None if Mininet with the eBPF switch can run here, else why not (for skipif)."""
    import shutil

    from dataplanes.bpf.program import available
    if os.geteuid() != 0:
        return "needs root"
    return available() or (None if shutil.which("mnexec") else "mnexec missing (apt package mininet)")


def run_program(pin: Path, frame: bytes) -> bytes:
    """The frame as a pinned BPF program leaves it (BPF_PROG_TEST_RUN)."""
    from dataplanes.bpf.bpf_syscall import obj_get, prog_test_run
    prog = obj_get(str(pin))
    try:
        return prog_test_run(prog, frame).packet
    finally:
        os.close(prog)


def process_running(pid: int) -> bool:
    """Whether process `pid` runs: not gone, and not a zombie waiting to be reaped (init reaps it: gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
