"""The compiled P4 program and its names.

p4src/compiled/ holds p4c's outputs for p4src/mbalancer.p4 (the bmv2 JSON and the P4Info), committed so that the
controller runs, and CI checks its P4Runtime messages, where p4c is not installed; tests/test_p4_program.py
recompiles and compares wherever p4c is. `Pipeline` turns the P4Info's names into the ids P4Runtime messages carry,
and refuses a name the program does not have (a typo fails at once, not as an empty table).
"""
from __future__ import annotations

import hashlib
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from google.protobuf import text_format
from p4.config.v1 import p4info_pb2

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "p4src" / "mbalancer.p4"
BASELINE = ROOT / "p4src" / "l2_forward.p4"  # the forwarding benchmark's baseline: L2 only
BUILD = ROOT / "p4src" / "compiled"  # committed: the controller and CI need no p4c
JSON = BUILD / "mbalancer.json"
P4INFO = BUILD / "mbalancer.p4info.txtpb"
PROGRAMS = (SOURCE, BASELINE)  # what `make install` compiles where p4c is, and what p4src/compiled holds
COMPILER = "p4c-bm2-ss"  # p4c's bmv2 back end (the `p4c` driver runs it too)
SWITCH = "simple_switch_grpc"

# Numbers the program defines that the controller must agree with (p4src/headers.p4)
MAX_HOT = 4096  # hot-key slots, p4src/headers.p4's MB_MAX_HOT (bmv2's replicas table holds MAX_REPLICAS per key)
MIRROR_SESSION = 100
FLOOD_GROUP = 1
STREAM_RESUMES = 1 << 14  # MB_STREAM_BITS: the `stream_resumes` table's size
# switch_counters' indexes are the eBPF program's counters, in its order (dataplanes/pipeline.py COUNTERS);
# "cloned" is counted in egress instead, where the copy to the controller exists


class P4Error(RuntimeError):
    """The P4 program could not be built, or does not have what was asked for."""


@dataclass(frozen=True)
class Table:
    id: int
    fields: dict[str, tuple[int, int]]  # match field as the program names it (meta.slot) -> (id, bitwidth)
    actions: dict[str, int]


@dataclass(frozen=True)
class Action:
    id: int
    params: dict[str, tuple[int, int]]  # name -> (id, bitwidth)


class Pipeline:
    """The P4Info of the compiled program, by name (short names: `hot_keys`, `hot`, `key_gets`)."""

    def __init__(self, p4info_path: Path = P4INFO, json_path: Path = JSON):
        self.p4info = p4info_pb2.P4Info()
        try:
            text_format.Parse(p4info_path.read_text(), self.p4info)
            self.device_config = json_path.read_bytes()
        except (OSError, text_format.ParseError) as err:
            raise P4Error(f"the compiled program cannot be read: {err}") from None
        # the cookie names this build: a switch already running it keeps its tables when the controller attaches
        self.cookie = int.from_bytes(hashlib.sha256(self.device_config).digest()[:8], "big")
        self.actions = {a.preamble.name.split(".")[-1]: Action(
            a.preamble.id, {p.name: (p.id, p.bitwidth) for p in a.params}) for a in self.p4info.actions}
        by_id = {a.id: name for name, a in self.actions.items()}
        self.tables = {t.preamble.name.split(".")[-1]: Table(
            t.preamble.id, {f.name: (f.id, f.bitwidth) for f in t.match_fields},
            {by_id[r.id]: r.id for r in t.action_refs}) for t in self.p4info.tables}
        self.counters = {c.preamble.name.split(".")[-1]: c.preamble.id for c in self.p4info.counters}
        self.counter_sizes = {c.preamble.name.split(".")[-1]: c.size for c in self.p4info.counters}
        self.digests = {d.preamble.name: d.preamble.id for d in self.p4info.digests}  # named by their struct
        self.packet_metadata = {m.preamble.name: {f.name: (f.id, f.bitwidth) for f in m.metadata}
                                for m in self.p4info.controller_packet_metadata}  # packet_in, packet_out

    def table(self, name: str) -> Table:
        return self._named(self.tables, name, "table")

    def action(self, name: str) -> Action:
        return self._named(self.actions, name, "action")

    def counter(self, name: str) -> int:
        return self._named(self.counters, name, "counter")

    def counter_size(self, name: str) -> int:
        """How many cells the counter array has."""
        return self._named(self.counter_sizes, name, "counter")

    def digest(self, name: str) -> int:
        return self._named(self.digests, name, "digest")

    @staticmethod
    def _named(found: dict, name: str, what: str):
        if name not in found:
            raise P4Error(f"the P4 program has no {what} {name!r} (it has {', '.join(sorted(found))})")
        return found[name]


def outputs(source: Path, out: Path = BUILD) -> tuple[Path, Path]:
    """Where the compiled `source` is: (bmv2 JSON, P4Info)."""
    return out / f"{source.stem}.json", out / f"{source.stem}.p4info.txtpb"


def compile_program(source: Path = SOURCE, out: Path = BUILD) -> tuple[Path, Path]:
    """Compile a program of p4src/ with p4c's bmv2 back end into `out`: (bmv2 JSON, P4Info)."""
    if shutil.which(COMPILER) is None:
        raise P4Error(f"{COMPILER} is not on PATH (`make p4c` builds it)")
    out.mkdir(parents=True, exist_ok=True)
    json_path, p4info_path = outputs(source, out)
    done = subprocess.run([COMPILER, "--arch", "v1model", "--std", "p4-16", "-o", str(json_path),
                           "--p4runtime-files", str(p4info_path), str(source.relative_to(ROOT))],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)  # relative: the JSON names it
    if done.returncode != 0:
        raise P4Error(f"{COMPILER} failed: {(done.stderr or done.stdout).strip()}")
    return json_path, p4info_path


def build(force: bool = False) -> Path:
    """`make install`'s step: recompile where p4c is (the outputs are committed: elsewhere they are used as they
    are); the bmv2 JSON's path."""
    sources = list(SOURCE.parent.glob("*.p4"))
    if shutil.which(COMPILER) is None:
        if not (JSON.exists() and P4INFO.exists()):
            raise P4Error(f"{BUILD} has no compiled program and {COMPILER} is not on PATH")
        return JSON
    if not force and JSON.exists() and all(s.stat().st_mtime <= JSON.stat().st_mtime for s in sources):
        return JSON
    for program in PROGRAMS:
        compile_program(program)
    return JSON


def available() -> str | None:
    """None if bmv2 switches can run here (simple_switch_grpc on PATH), else why not."""
    if shutil.which(SWITCH) is None:
        return f"{SWITCH} is not on PATH (`make p4` builds bmv2 with its P4Runtime server)"
    if not (JSON.exists() and P4INFO.exists()):
        return f"the compiled program is missing from {BUILD}"
    return None

