"""Paths by which a replica could serve what its home no longer holds, each driven through the real eBPF switch with
real memcached and the controller as its own process (the fault runner's rig), and probed by a client sending gets
of the key through the switch (experiments/faults/probe.py). Asserted: what the gets returned after the home's
change, never how fast."""
from __future__ import annotations

import json
import os

import pytest

from dataplanes.bpf.program import available

why_not = available() if os.geteuid() == 0 else "needs root (namespaces, bpf, tc)"
pytestmark = pytest.mark.skipif(why_not is not None, reason=f"eBPF data plane cannot run here: {why_not}")

from experiments.faults.rig import Rig  # noqa: E402
from experiments.faults.scenarios import FAULTED  # noqa: E402
from mbalancer.memcache.addresses import ServerAddress  # noqa: E402
from mbalancer.memcache.meta import NO_EXPIRY, MetaClient, StoredItem  # noqa: E402

HOT = 2
EXPIRED_BY = 2.2  # s after a TTL of 1 s is set: memcached has expired the item by then (it counts whole seconds)


def balanced_rig(tmp_path) -> Rig:
    """The rig with its hot keys stored at their homes and balanced."""
    rig = Rig(tmp_path, HOT, FAULTED, tag="mbp").start()
    try:
        for key, (ip, port) in rig.keys.items():
            client = MetaClient(ServerAddress(ip, port))
            client.set(key.encode(), StoredItem(b"v1", 0, NO_EXPIRY, 0))
            client.close()
        rig.wait_balanced()
    except BaseException:
        rig.close()
        raise
    return rig


def probe_all(rig: Rig, key: str, jobs: list[dict], tmp_path) -> list[dict]:
    """Several probes of `key` in one client process (experiments/faults/probe.py --jobs), in turn."""
    ip, port = rig.keys[key]
    jobs_file = tmp_path / "jobs.json"
    jobs_file.write_text(json.dumps(jobs))
    run = rig.net.run(rig.net.client_hosts[0], [rig.python, "-m", "experiments.faults.probe", "--key", key, "--home",
                                                f"{ip}:{port}", "--jobs", str(jobs_file)], timeout=300)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.strip().splitlines()[-1])


def probe(rig: Rig, key: str, send: bytes, then: bytes | None = None, after: float = 0.1,
          seconds: float = 3.0) -> dict:
    """experiments/faults/probe.py from the client's namespace: `send` (and `then`) to the key's home over TCP, then
    gets through the switch for `seconds`."""
    ip, port = rig.keys[key]
    command = [rig.python, "-m", "experiments.faults.probe", "--key", key, "--home", f"{ip}:{port}",
               "--send", send.hex(), "--seconds", str(seconds)]
    if then is not None:
        command += ["--then", then.hex(), "--after", str(after)]
    run = rig.net.run(rig.net.client_hosts[0], command, timeout=seconds + after + 30)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("request_line", ["gat 1 {key}", "gats 1 {key}", "mg {key} v T1", "mg {key} T1"])
def test_a_ttl_shortened_at_the_home_expires_every_copy_with_it(tmp_path, request_line):
    rig = balanced_rig(tmp_path)
    try:
        key = next(iter(rig.keys))
        result = probe(rig, key, request_line.format(key=key).encode() + b"\r\n", seconds=EXPIRED_BY + 1.5)
        decisions = [d for d in rig.state()["decisions"] if d["key"] == key]
    finally:
        rig.close()
    assert result["reply"].startswith(("VALUE", "VA", "HD")), result["reply"]
    gone = first_miss_at_home(result)
    assert gone is not None and gone < EXPIRED_BY, result["home"]  # the home expired it
    late = [(t, value) for t, value in result["gets"] if t > gone]
    assert late and all(value is None for _, value in late), late  # gone from the home: gone everywhere
    assert any(d["action"] == "expire" for d in decisions), decisions


def first_miss_at_home(result: dict) -> float | None:
    """When the probe first found the key missing at its home."""
    return next((t for t, value in result["home"] if value is None), None)


def test_a_touch_to_a_long_ttl_keeps_the_key_balanced(tmp_path):
    """The control: a TTL made longer is copied, and the key is balanced again (not held at home)."""
    rig = balanced_rig(tmp_path)
    try:
        key = next(iter(rig.keys))
        result = probe(rig, key, f"touch {key} 3600\r\n".encode(), seconds=2.0)
        state = rig.state()
    finally:
        rig.close()
    assert result["reply"] == "TOUCHED\r\n"
    assert all(value == "v1" for _, value in result["gets"])
    hot = {k["key"]: k for k in state["hot_keys"]}[key]
    assert not hot["dirty"], hot


def first_at_home(result: dict, value: str) -> float | None:
    """When the probe first found `value` at the key's home."""
    return next((t for t, held in result["home"] if held == value), None)


@pytest.mark.parametrize("tail", [b"mn", b"zz"])
def test_a_write_split_across_segments_is_never_served_stale(tmp_path, tail):
    """`set k 0 0 15\\r\\nv=0000000005;` and, 100 ms later on the same connection, the value's last two bytes: a tail
    that reads as a whole harmless command by itself (`mn`) is no different from one that does not (`zz`)."""
    rig = balanced_rig(tmp_path)
    try:
        key = next(iter(rig.keys))
        result = probe(rig, key, f"set {key} 0 0 15\r\nv=0000000005;".encode(), then=tail + b"\r\n", after=0.1,
                       seconds=2.0)
    finally:
        rig.close()
    value = "v=0000000005;" + tail.decode()
    assert result["reply"] == "STORED\r\n", result["reply"]
    changed = first_at_home(result, value)
    assert changed is not None, result["home"]
    stale = [(t, held) for t, held in result["gets"] if t > changed and held != value]
    assert not stale, stale


def split_jobs(key: str) -> list[tuple[str, dict]]:
    """Writes of the key cut in two at every point (set) or every third (append, ms), the second part sent at once
    or 150 ms later on the same connection (after the controller's wait for a write to show at its home); values
    whose tails read as whole harmless commands (`version`, a get)."""
    jobs = []
    for n, (command, step, delays) in enumerate((("set {key} 0 0 {size}\r\n{value}\r\n", 1, (0.0, 0.15)),
                                                 ("append {key} 0 0 {size}\r\n{value}\r\n", 3, (0.15,)),
                                                 ("ms {key} {size} T0\r\n{value}\r\n", 3, (0.15,)))):
        for delay in delays:
            for cut in range(1, 60, step):
                value = f"{n}{cut:02d}{delay:.2f};version" if cut % 2 else f"{n}{cut:02d}{delay:.2f}\r\nget cold:0"
                whole = command.format(key=key, size=len(value), value=value).encode()
                if cut >= len(whole):
                    break
                jobs.append((f"{whole[:cut]!r} | {whole[cut:]!r} after {delay} s",
                             {"send": whole[:cut].hex(), "then": whole[cut:].hex(), "after": delay, "seconds": 0.2}))
    return jobs


def test_writes_split_at_every_point_are_never_served_stale(tmp_path):
    """The TCP stream view is right by construction: no tail, however harmless it looks, is read on its own."""
    rig = balanced_rig(tmp_path)
    try:
        key = next(iter(rig.keys))
        jobs = split_jobs(key)
        results = probe_all(rig, key, [job for _, job in jobs], tmp_path)
        state = rig.state()
    finally:
        rig.close()
    held = "v1"
    for (name, _), result in zip(jobs, results):
        assert result["reply"].startswith(("STORED", "HD")), (name, result["reply"])
        changed = next((t for t, value in result["home"] if value != held), None)
        assert changed is not None, (name, result["home"])
        stale = [(t, value) for t, value in result["gets"] if t > changed and value == held]
        assert not stale, (name, stale)
        held = result["home"][-1][1]
    assert state["counters"]["stream_boundaries_proven"] > 0  # connections were followed (one that closed before
    # the controller read its copies is forgotten by the data plane at its FIN, and its copies are read one by one)
