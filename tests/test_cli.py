"""The top-level command loads a part only when its command runs (mbalancer/cli.py): every command's --help still
works from its own process, and `mbalancer switch status` on a switch box imports none of the testbed's, the plots'
or the P4 driver's libraries."""
from __future__ import annotations

import argparse
import subprocess
import sys

from mbalancer.cli import COMMANDS, build_parser
from tests.conftest import MBALANCER

# What a switch box need not load: Mininet and Ryu (the testbed, the OpenFlow app), matplotlib (plots), gRPC (P4Runtime,
# the switch agent's client).
HEAVY = ("mininet", "matplotlib", "ryu", "grpc")


def command_paths(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command and subcommand of `parser`, as the words that name it."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += [(*path, name), *command_paths(sub, (*path, name))]
    return found


def test_every_command_and_subcommand_answers_help_from_its_own_process():
    paths = command_paths(build_parser())
    assert {path[0] for path in paths} == set(COMMANDS)  # the table names every command, and only those
    # Side by side: each start pays for its own imports, which is what is checked.
    started = {path: subprocess.Popen([str(MBALANCER), *path, "--help"], stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True) for path in paths}
    for path, process in started.items():
        out, err = process.communicate(timeout=120)
        assert process.returncode == 0 and out.startswith(f"usage: mbalancer {' '.join(path)}"), (path, err)


def test_switch_status_imports_no_testbed_plots_or_grpc():
    script = ("import sys\nfrom mbalancer.cli import main\ntry:\n    main(['switch', 'status', '--help'])\n"
              "except SystemExit as done:\n    assert done.code == 0, done.code\n"
              f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "", f"imported: {done.stdout.splitlines()[-1]}"


def test_an_unknown_command_lists_every_command():
    done = subprocess.run([str(MBALANCER), "swtich", "status"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "invalid choice: 'swtich'" in done.stderr
    assert all(name in done.stderr for name in COMMANDS), done.stderr


def test_version_without_a_command():
    done = subprocess.run([str(MBALANCER), "-v", "--version"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.startswith("mbalancer 0."), done.stderr


def without(module: str, *argv: str) -> subprocess.CompletedProcess:
    """`mbalancer ARGV` in a process where `module` cannot be imported, as after `pip install .` without its extra."""
    script = (f"import sys\nsys.modules[{module!r}] = None\nfrom mbalancer.cli import main\n"
              f"sys.exit(main({list(argv)!r}))\n")
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)


def test_a_command_whose_extra_is_missing_names_the_extra_and_the_others_work():
    done = without("mininet", "experiment", "demo", "--out", "nowhere")
    assert done.returncode == 1 and "pip install 'mbalancer[testbed]'" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    listed = without("matplotlib", "--help")
    assert listed.returncode == 0 and "(not installed: pip install 'mbalancer[plots]')" in listed.stdout, listed.stderr
    assert "switch" in listed.stdout and without("mininet", "switch", "status", "--help").returncode == 0
