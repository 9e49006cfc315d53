"""Coherence paths: changes at a hot key's home that a replica must not outlive, each probed through the switch
(experiments/faults/probe.py: the change over TCP, then gets through the switch while the home is read directly).
A get that returns the value the home held before the change, once the home shows the change, is stale.
    ttl_gat        gat 1 <key>: the TTL shortened to 1 s (the home expires it)
    ttl_mg         mg <key> v T1: the same with the meta protocol
    split_write    set <key> 0 0 15, the value cut 2 bytes before its end, the tail (`mn`) 100 ms later
    split_sweep    a set, an append and an ms cut at every point (every third for the latter two), the second part
                   at once or 150 ms later; values whose tails read as whole commands (`version`, a get)
    home_restart   the key's home killed and started again at once (empty) while the gets run
Used by `mbalancer faults` (its second table) and tests/test_coherence_paths.py.
"""
from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from mbalancer.memcache.addresses import ServerAddress
from mbalancer.memcache.meta import NO_EXPIRY, MetaClient, StoredItem

if TYPE_CHECKING:
    from experiments.faults.rig import Rig

INITIAL = "v1"  # every hot key's value when a scenario starts
PROBE_TIMEOUT = 300.0


@dataclass(frozen=True)
class Probe:
    name: str
    send: bytes
    then: bytes | None = None
    after: float = 0.0  # seconds between send and then
    seconds: float = 1.0  # of gets after the change


@dataclass(frozen=True)
class Outcome:
    scenario: str
    probes: int
    changed: int  # probes in which the home was seen to change
    gets_after_change: int
    stale: int  # gets that returned the home's earlier value after the home changed
    first_stale: str  # the probe of the first stale get ("" if none)


def store_initial(rig: "Rig") -> None:
    """Every hot key at its home with the value INITIAL and no expiry."""
    for key, (ip, port) in rig.keys.items():
        client = MetaClient(ServerAddress(ip, port))
        try:
            client.set(key.encode(), StoredItem(INITIAL.encode(), 0, NO_EXPIRY, 0))
        finally:
            client.close()


def run_probes(rig: "Rig", key: str, probes: list[Probe], out: Path) -> list[dict]:
    """The probes in turn, from the client's namespace (one process); the probe script's result for each."""
    ip, port = rig.keys[key]
    jobs = out / "probes.json"
    jobs.write_text(json.dumps([{"send": p.send.hex(), "then": p.then.hex() if p.then else None, "after": p.after,
                                 "seconds": p.seconds} for p in probes]))
    run = rig.net.run(rig.net.client_hosts[0], [rig.python, "-m", "experiments.faults.probe", "--key", key,
                                                "--home", f"{ip}:{port}", "--jobs", str(jobs),
                                                "--gets", rig.protocol], timeout=PROBE_TIMEOUT)
    if run.returncode != 0:
        raise RuntimeError(f"the probe failed: {run.stderr.strip()[-400:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def judge(scenario: str, probes: list[Probe], results: list[dict]) -> Outcome:
    """Stale gets: after the home first shows a change, any get returning the value it held before."""
    held, changed, after, stale, first = INITIAL, 0, 0, 0, ""
    for probe, result in zip(probes, results):
        when = next((t for t, value in result["home"] if value != held), None)
        if when is not None:
            changed += 1
            late = [value for t, value in result["gets"] if t > when]
            after += len(late)
            wrong = sum(value == held for value in late)
            stale += wrong
            first = first or (probe.name if wrong else "")
            held = result["home"][-1][1]
    return Outcome(scenario, len(probes), changed, after, stale, first)


def ttl_probes(key: str, meta: bool) -> list[Probe]:
    line = f"mg {key} v T1" if meta else f"gat 1 {key}"
    return [Probe(line, f"{line}\r\n".encode(), seconds=3.0)]


def split_write_probes(key: str) -> list[Probe]:
    head = f"set {key} 0 0 15\r\nv=0000000005;".encode()
    return [Probe("set, the value's last 2 bytes (mn) 100 ms later", head, b"mn\r\n", 0.1, 2.0)]


SPLIT_COMMANDS = (  # (command, every how many bytes it is cut, delays before its second segment)
    ("set {key} 0 0 {size}\r\n{value}\r\n", 1, (0.0, 0.15)),
    ("set {key} 0 0 {size}\r\n{value}\r\n", 5, (0.5,)),
    ("append {key} 0 0 {size}\r\n{value}\r\n", 3, (0.15,)),
    ("ms {key} {size} T0\r\n{value}\r\n", 3, (0.15,)),
    ("cas {key} 0 0 {size} <cas>\r\n{value}\r\n", 3, (0.0, 0.15)),  # probe.py puts the home's CAS in
)


def split_sweep_probes(key: str) -> list[Probe]:
    """Each command cut at every `step`th byte (never inside the <cas> mark); its value's tail reads as `version` or
    as a get of a cold key."""
    probes = []
    for n, (command, step, delays) in enumerate(SPLIT_COMMANDS):
        for delay in delays:
            for cut in range(1, 60, step):
                value = f"{n}{cut:02d}{delay:.2f};version" if cut % 2 else f"{n}{cut:02d}{delay:.2f}\r\nget cold:0"
                whole = command.format(key=key, size=len(value), value=value).encode()
                if cut >= len(whole):
                    break
                if whole.find(b"<cas>") < cut < whole.find(b"<cas>") + len(b"<cas>"):
                    continue
                probes.append(Probe(f"{whole[:cut]!r} | {whole[cut:]!r} after {delay} s", whole[:cut], whole[cut:],
                                    delay, 0.2))
    return probes


def home_restart_probes(key: str) -> list[Probe]:
    return [Probe("the home restarted (empty) 0.5 s into the gets", b"mn\r\n", seconds=HOME_RESTART_AT + 2.0)]


def restart_home(rig: "Rig", key: str) -> None:
    """Kill the key's home and start it again at once: it comes back empty."""
    ip, _ = rig.keys[key]
    server = next(i for i, host in enumerate(rig.net.server_hosts) if host.ip == ip)
    rig.memcached[server].kill()
    rig.memcached[server].wait()
    rig.start_memcached(server)


@dataclass(frozen=True)
class Scenario:
    probes: Callable[[str], list[Probe]]  # of the key
    during: Callable[["Rig", str], None] | None = None  # done HOME_RESTART_AT s after the probes start


HOME_RESTART_AT = 0.5
SCENARIOS: dict[str, Scenario] = {
    "ttl_gat": Scenario(lambda key: ttl_probes(key, meta=False)),
    "ttl_mg": Scenario(lambda key: ttl_probes(key, meta=True)),
    "split_write": Scenario(split_write_probes),
    "split_sweep": Scenario(split_sweep_probes),
    "home_restart": Scenario(home_restart_probes, restart_home),
}


def run_scenario(rig: "Rig", name: str, out: Path) -> Outcome:
    """One scenario on a balanced rig whose keys hold INITIAL. A scenario that does something to one key's home
    probes the rig's first hot key; one that only writes deals its probes out over every hot key, whose probe
    processes run side by side (each key's writes and gets are its own, so none sees another's)."""
    scenario = SCENARIOS[name]
    if scenario.during is not None:
        return _run_with_fault(rig, name, scenario, out)
    keys = list(rig.keys)
    dealt = [(key, scenario.probes(key)[n::len(keys)]) for n, key in enumerate(keys)]
    results: dict[str, list[dict]] = {}
    failures: list[Exception] = []

    def probe_one(n: int, key: str, probes: list[Probe]) -> None:
        try:
            folder = out / f"key{n}"
            folder.mkdir(parents=True, exist_ok=True)
            results[key] = run_probes(rig, key, probes, folder)
        except Exception as err:  # re-raised below, in the caller's thread
            failures.append(err)

    threads = [threading.Thread(target=probe_one, args=(n, key, probes)) for n, (key, probes) in enumerate(dealt)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise failures[0]
    return merge_outcomes(name, [judge(name, probes, results[key]) for key, probes in dealt])


def _run_with_fault(rig: "Rig", name: str, scenario: Scenario, out: Path) -> Outcome:
    key = next(iter(rig.keys))
    probes = scenario.probes(key)
    timer = threading.Timer(HOME_RESTART_AT, scenario.during, (rig, key))
    timer.start()
    try:
        results = run_probes(rig, key, probes, out)
    finally:
        timer.join()
    return judge(name, probes, results)


def merge_outcomes(scenario: str, outcomes: list[Outcome]) -> Outcome:
    """The outcomes of one scenario's probes on several keys, as one."""
    return Outcome(scenario, sum(o.probes for o in outcomes), sum(o.changed for o in outcomes),
                   sum(o.gets_after_change for o in outcomes), sum(o.stale for o in outcomes),
                   next((o.first_stale for o in outcomes if o.first_stale), ""))


def format_outcomes(outcomes: list[Outcome]) -> str:
    lines = [f"{'coherence path':16}{'probes':>8}{'home changed':>14}{'gets after':>12}{'stale':>7}"]
    for o in outcomes:
        lines.append(f"{o.scenario:16}{o.probes:>8}{o.changed:>14}{o.gets_after_change:>12}{o.stale:>7}"
                     + (f"  first: {o.first_stale}" if o.first_stale else ""))
    return "\n".join(lines)
