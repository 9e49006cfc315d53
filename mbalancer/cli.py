"""`mbalancer` command: one entry point, each part of the system registers its own subcommands.

Library code raises typed errors; only this layer prints and picks exit codes (2 for bad arguments, as argparse).

The parts are named by "module:function" strings (as dataplanes/registry.py names its parts) and imported only when
their command runs: `mbalancer switch status` on a switch box loads the switch's code, not Mininet, matplotlib or
gRPC, and so starts in a tenth of the time. Help for the whole command and an unknown command load every part.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys

from dataplanes.registry import load

# Each top-level command and the function that adds it (and its siblings from the same module) to the parser, in the
# order `mbalancer --help` lists them.
COMMANDS: dict[str, str] = {
    "simulate": "experiments.simulation.cli:register",
    "demo": "experiments.simulation.cli:register",
    "load": "experiments.workload.cli:register",
    "monitor": "monitor.cli:register",
    "controller": "controller.cli:register",
    "switch": "dataplanes.cli:register",
    "experiment": "experiments.endtoend.cli:register",
    "faults": "experiments.faults.cli:register",
    "config": "mbalancer.config_reference.cli:register",
}

# The libraries setup.py keeps in extras (a switch box installs none of them), by top-level module: a command that
# needs a missing one says which extra installs it, instead of a traceback.
EXTRAS = {"mininet": "testbed", "matplotlib": "plots", "ryu": "ryu"}


class _Version(argparse.Action):
    """--version, reading the installed version only when asked (importlib.metadata costs ~20 ms at every start)."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kwargs) -> None:
        super().__init__(option_strings, dest, nargs=0, help="show the installed version and exit", **kwargs)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        print(f"mbalancer {_version()}")  # to stdout, as argparse's own version action
        parser.exit()


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser with `command`'s part registered, or every part's (None, or a name no part has: argparse then
    lists the choices)."""
    parser = argparse.ArgumentParser(prog="mbalancer", description="In-network load balancing of memcached hot keys.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log what the system decides and why")
    parser.add_argument("--version", action=_Version)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    wanted = [COMMANDS[command]] if command in COMMANDS else COMMANDS.values()
    for register in dict.fromkeys(wanted):  # one module may register several commands: call it once
        try:
            load(register)(commands)
        except ModuleNotFoundError as err:
            if command in COMMANDS or (extra := missing_extra(err)) is None:
                raise  # the command asked for cannot load: main() names the extra
            for name in (name for name, path in COMMANDS.items() if path == register):  # listed, with what it needs
                commands.add_parser(name, help=f"(not installed: pip install 'mbalancer[{extra}]')")
    return parser


def missing_extra(err: ModuleNotFoundError) -> str | None:
    """The extra of setup.py that installs the module `err` did not find, if it is one of theirs."""
    return EXTRAS.get((err.name or "").partition(".")[0])


def command_of(argv: list[str]) -> str | None:
    """The command named in `argv`: its first word that is not an option (the top-level options take no value)."""
    return next((arg for arg in argv if not arg.startswith("-")), None)


def _version() -> str:
    from importlib import metadata
    try:
        return metadata.version("mbalancer")
    except metadata.PackageNotFoundError:
        return "(not installed: run `pip install -e .`)"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = command_of(argv)
    try:
        return _run(build_parser(command).parse_args(argv))
    except ModuleNotFoundError as err:
        if (extra := missing_extra(err)) is None:
            raise
        print(f"mbalancer {command}: needs {err.name}, which this installation lacks: pip install "
              f"'mbalancer[{extra}]' (make install installs every extra)", file=sys.stderr)
        return 1


def _run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        return args.run(args, args.fail)
    except KeyboardInterrupt:  # commands that keep partial results catch it themselves and say where
        print(f"\nmbalancer {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`mbalancer ... | head -1`): nothing more to say, as cat does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit's flush cannot fail again
        return 141


if __name__ == "__main__":
    sys.exit(main())
