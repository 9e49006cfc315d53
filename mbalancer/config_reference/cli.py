"""`mbalancer config check FILE`: is the config file one every part takes, and what does it set (as faucet's config
checker does for its own). Every key and its default: docs/configuration.md (mbalancer/config_reference.py)."""
from __future__ import annotations

import argparse
import sys

from mbalancer.config import Config, load_config
from mbalancer.settings import ConfigError


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("config", help="check a config file",
                                 description="The config file (TOML) every part reads: docs/configuration.md.")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    check = actions.add_parser("check", help="check FILE as the switch, controller and monitor read it; exit 1 if "
                                             "they would refuse it, naming the key")
    check.add_argument("file", metavar="FILE", help="the config file (TOML)")
    check.set_defaults(run=_check, fail=check.error)


def _check(args: argparse.Namespace, fail) -> int:
    try:
        config = load_config(args.file)
    except ConfigError as err:  # (a file that cannot be read or parsed is named in the error already)
        where = "" if str(err).startswith(args.file) else f"{args.file}: "
        print(f"mbalancer config check: {where}{err}", file=sys.stderr)
        return 1
    print(f"{args.file}: ok\n{summary(config)}")
    return 0


def summary(config: Config) -> str:
    """What the file sets that matters most, in a few lines."""
    balancing, controller = config.balancing, config.controller
    hot = f"H = {balancing.hot}" if balancing.hot is not None else f"H as needed for imbalance {balancing.target}"
    servers = ", ".join(f"{s.name} {s.ip}:{s.port}" for s in config.servers)
    return "\n".join([
        f"  servers ({len(config.servers)}, hashed by {balancing.hash}): {servers}",
        f"  balancing: {hot}, {balancing.mode} replicas, {balancing.groups} group(s), hysteresis {balancing.hysteresis}",
        f"  controller: HTTP on {controller.listen}, lease {controller.lease:g} s, "
        f"etcd {', '.join(controller.etcd) or 'none (this controller drives alone)'}",
        f"  data plane: {config.dataplane.kind}"])
