"""`mbalancer` command: one entry point, each part of the system registers its own subcommands.

Library code raises typed errors; only this layer prints and picks exit codes (2 for bad arguments, as argparse).
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
from importlib import metadata

from controller import cli as controller_cli
from dataplanes import cli as switch_cli
from experiments.endtoend import cli as experiment_cli
from experiments.faults import cli as faults_cli
from experiments.simulation import cli as simulation_cli
from experiments.workload import cli as workload_cli
from monitor import cli as monitor_cli


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mbalancer", description="In-network load balancing of memcached hot keys.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log what the system decides and why")
    parser.add_argument("--version", action="version", version=f"mbalancer {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    simulation_cli.register(commands)
    workload_cli.register(commands)
    monitor_cli.register(commands)
    controller_cli.register(commands)
    switch_cli.register(commands)
    experiment_cli.register(commands)
    faults_cli.register(commands)
    return parser


def _version() -> str:
    try:
        return metadata.version("mbalancer")
    except metadata.PackageNotFoundError:
        return "(not installed: run `pip install -e .`)"


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
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
