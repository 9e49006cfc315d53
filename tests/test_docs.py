"""The docs and the comments that point elsewhere say what the code does: the files they name exist, the retry
kinds docs/architecture.md lists are the code's, and the P4 build time is given once."""
from __future__ import annotations

import re
from pathlib import Path

from controller.retries import RetryKind

ROOT = Path(__file__).resolve().parent.parent
# A path into the repository, as comments and docs write one: a top-level folder, then a file with an extension.
PATH = re.compile(r"\b(?:controller|dataplanes|docs|experiments|install|mbalancer|monitor|p4src|tests|topologies)"
                  r"/[\w./-]*\w\.\w+")
POINTING = [*sorted((ROOT / "p4src").glob("*.p4")), *sorted((ROOT / "dataplanes" / "bpf" / "src").iterdir())]


def test_the_data_plane_sources_name_files_that_exist():
    named = {f"{source.relative_to(ROOT)}: {path}" for source in POINTING
             for path in PATH.findall(source.read_text()) if not (ROOT / path).exists()}
    assert named == set()


def test_the_architecture_lists_every_retry_kind():
    text = " ".join((ROOT / "docs" / "architecture.md").read_text().split())
    listed = re.search(r"`RetryKind` each \(([^)]*)\)", text).group(1)
    kinds = {item.split(":")[0].split()[-1] for item in listed.split(",")}  # "..., and home-check: what it is"
    assert kinds == {kind.value for kind in RetryKind}


def test_the_p4_build_time_is_the_same_wherever_it_is_given():
    said = {path: re.findall(r"about (\d+) minutes on 2 cores", (ROOT / path).read_text())
            for path in ("README.md", "docs/install.md")}
    assert len({figure for figures in said.values() for figure in figures}) == 1, said
    makefile = re.search(r"^# The P4 toolchain.*$", (ROOT / "Makefile").read_text(), re.M).group(0)
    assert not re.search(r"\d+ minutes", makefile), makefile  # it points at docs/install.md
