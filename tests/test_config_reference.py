"""docs/configuration.md is what the typed settings say (mbalancer/config_reference/), every key has a meaning,
and `mbalancer config check` takes the example config and refuses a bad one in one line."""
from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

from mbalancer.config_reference import DOC, keys_of, render, sections

EXAMPLE = Path(__file__).resolve().parent.parent / "mbalancer" / "mbalancer.example.toml"


def test_the_configuration_reference_is_what_the_code_says():
    assert DOC.read_text() == render(), "docs/configuration.md is stale: python -m mbalancer.config_reference"


def test_every_key_says_what_it_is():
    unexplained = [f"{table} {key.name}" for table, kind in sections() for key in keys_of(kind) if not key.meaning]
    assert unexplained == [], "give these a comment on their line in the dataclass: " + ", ".join(unexplained)


def test_every_key_of_the_example_config_is_in_the_reference():
    documented = {table: {key.name for key in keys_of(kind)} for table, kind in sections()}
    example = tomllib.loads(EXAMPLE.read_text())
    found = [("[[servers]]", name) for entry in example["servers"] for name in entry]
    found += [(f"[{table}]", name) for table in ("balancing", "monitor", "controller") for name in example[table]]
    found += [(f"[dataplane.{kind}]" if isinstance(value, dict) else "[dataplane]", name)
              for kind, value in example["dataplane"].items()
              for name in (value if isinstance(value, dict) else [kind])]
    assert [f"{table} {name}" for table, name in found if name not in documented[table]] == []


def check(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mbalancer.cli", "config", "check", str(path)], capture_output=True,
                          text=True, timeout=60)


def test_config_check_takes_the_example_and_says_what_it_sets():
    done = check(EXAMPLE)
    assert done.returncode == 0 and done.stdout.startswith(f"{EXAMPLE}: ok"), done.stderr
    assert "servers (2, hashed by ketama): s1 10.0.0.1:11211, s2 10.0.0.2:11211" in done.stdout


def test_config_check_refuses_a_bad_file_in_one_line_naming_the_key(tmp_path):
    typo = tmp_path / "typo.toml"
    typo.write_text(EXAMPLE.read_text().replace("[monitor]\ninterval", "[monitor]\nintervall"))
    cases = {typo: "monitor.intervall: unknown setting", tmp_path / "missing.toml": "cannot read",
             tmp_path / "broken.toml": "not valid TOML"}
    (tmp_path / "broken.toml").write_text("[[servers]\n")
    for path, words in cases.items():
        done = check(path)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 1 and len(lines) == 1 and words in lines[0] and str(path) in lines[0], done.stderr
