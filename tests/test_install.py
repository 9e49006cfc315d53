"""The install scripts refuse bad input in one line, before touching apt or building anything, and a second run of an
installed toolchain does no work. (The full builds are `make p4` / `make p4c`, far too slow for the suite.)"""
from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
P4_SH = ROOT / "install" / "p4.sh"
SYSTEM_SH = ROOT / "install" / "system.sh"
PYTHON_SH = ROOT / "install" / "python.sh"


def run(script: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(script), *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **env})


def failure_line(done: subprocess.CompletedProcess) -> str:
    lines = done.stderr.strip().splitlines()
    assert done.returncode != 0 and len(lines) == 1, done.stderr
    return lines[0]


def test_p4_sh_names_its_usage():
    assert "usage: install/p4.sh bmv2|p4c (got 'bmv3')" in failure_line(run(P4_SH, "bmv3"))


def test_p4_sh_names_the_missing_source_tree_before_building(tmp_path):
    (tmp_path / "PI").mkdir()
    build = tmp_path / "build"
    done = run(P4_SH, "bmv2", P4_SOURCES=str(tmp_path), P4_BUILD=str(build), P4_PREFIX=str(tmp_path / "prefix"))
    assert f"P4_SOURCES={tmp_path} has no behavioral-model/" in failure_line(done)
    assert not build.exists()  # nothing started


def test_p4_sh_names_the_missing_p4c_dependency(tmp_path):
    for tree in ("p4c", "p4c-deps/protobuf", "p4c-deps/abseil"):
        (tmp_path / tree).mkdir(parents=True)
    done = run(P4_SH, "p4c", P4_SOURCES=str(tmp_path), P4_BUILD=str(tmp_path / "build"))
    assert "has no p4c-deps/p4runtime/" in failure_line(done)


@pytest.mark.skipif(not Path("/usr/local/share/mbalancer-p4/bmv2").exists(), reason="`make p4` has not run here")
def test_p4_sh_a_second_run_only_checks_the_installed_switch():
    done = run(P4_SH, "bmv2")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("install/p4.sh: bmv2 already installed (bmv2 1.15.5 (fast), PI "), done.stdout
    assert "[" not in done.stdout  # no stage ran


def test_system_sh_is_quiet_when_every_package_is_present(tmp_path):
    packages = tmp_path / "packages.txt"
    packages.write_text("# a comment\nbash\n\ncoreutils  # trailing comment\n")
    done = run(SYSTEM_SH, str(packages))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "install/system.sh: all 2 packages of packages.txt present"


UNITS = sorted((ROOT / "install" / "systemd").glob("mbalancer-*.service"))
ENV_FILE = ROOT / "install" / "systemd" / "mbalancer.env"


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze is missing")
@pytest.mark.parametrize("unit", UNITS, ids=lambda u: u.name)
def test_systemd_units_verify_and_are_sandboxed(unit):
    text = unit.read_text()
    assert "EnvironmentFile=/etc/mbalancer/mbalancer.env" in text and "/opt/" not in text and "eth1" not in text
    for setting in ("ProtectSystem=strict", "ProtectHome=", "NoNewPrivileges=yes", "CapabilityBoundingSet=CAP_"):
        assert setting in text, setting
    verified = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert verified.returncode == 0 and verified.stderr == "", verified.stderr
    security = subprocess.run(["systemd-analyze", "security", "--offline=true", str(unit)], capture_output=True,
                              text=True, timeout=60)
    exposure = float(security.stdout.split("Overall exposure level for")[1].split(":")[1].split()[0])
    assert exposure <= 5.0, security.stdout  # 9.6 UNSAFE before the sandboxing


@pytest.mark.parametrize("unit", UNITS, ids=lambda u: u.name)
def test_a_units_command_runs_mbalancer_from_the_environment_file(unit, tmp_path):
    """Each ExecStart, with the environment file's settings (MBALANCER_HOME this checkout, a config that is not
    there), reaches mbalancer, which names the missing config in one line."""
    settings = dict(line.split("=", 1) for line in ENV_FILE.read_text().splitlines()
                    if line and not line.startswith("#"))
    assert set(settings) == {"MBALANCER_HOME", "MBALANCER_CONFIG", "CONTROLLER_OPTIONS", "MONITOR_OPTIONS"}
    command = next(line for line in unit.read_text().splitlines() if line.startswith("ExecStart="))
    shell = command.removeprefix("ExecStart=/bin/sh -c ").strip("'")
    missing = tmp_path / "none.toml"
    done = subprocess.run(["/bin/sh", "-c", shell], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **settings, "MBALANCER_HOME": str(ROOT), "MBALANCER_CONFIG": str(missing)})
    assert done.returncode == 2 and str(missing) in done.stderr and "Traceback" not in done.stderr, done.stderr


def setup_arguments() -> dict[str, ast.expr]:
    """The keyword arguments of setup.py's setup() call, unevaluated."""
    call = next(node for node in ast.walk(ast.parse((ROOT / "setup.py").read_text()))
                if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "setup")
    return {keyword.arg: keyword.value for keyword in call.keywords}


def test_make_install_installs_every_extra_and_a_plain_install_none_of_the_testbeds_libraries():
    arguments = setup_arguments()
    extras = ast.literal_eval(arguments["extras_require"])
    installed = re.search(r'^extras="([^"]*)"$', PYTHON_SH.read_text(), re.MULTILINE).group(1).split(",")
    assert sorted(installed) == sorted(extras)  # install/python.sh names every extra of setup.py
    required = {re.split(r"[=<>!~ ]", spec)[0].lower() for spec in ast.literal_eval(arguments["install_requires"])}
    assert required.isdisjoint({"mininet", "matplotlib", "ryu"}), required  # a switch box's `pip install .`
    assert {"testbed", "plots", "ryu"} <= set(extras)


def test_a_data_plane_built_from_the_bpf_source_names_what_is_missing_to_run_here(tmp_path):
    """The probes every BPF data plane shares (dataplanes/bpf/program.py unavailable): the first tool not installed,
    else the first object not built; the install step that gives it named."""
    from dataplanes.bpf.program import Program, unavailable
    unbuilt = Program(tmp_path / "none.bpf.o", tmp_path / "pins", "ingress")
    assert unavailable(("sh", "mbalancer-no-such-tool"), (unbuilt,)) == \
        "mbalancer-no-such-tool is not installed (install/apt-packages.txt)"
    assert unavailable(("sh",), (unbuilt,)) == f"{unbuilt.object} is not built (make install builds it)"
