"""The network tiers as two runs side by side (`make test`: tests/run_tiers.sh), each in namespaces of its own
(tests/isolated.sh), so one MBalancer network at a time holds per run, not per machine. The split is by module and
about even in time (CI's durations): the Mininet testbed's modules with the benchmarks, the deployment, libmemcached's
tools and the Ryu failover in one, the other namespace networks', the programs' and the drivers' in the other.

Usage: python -m tests.network_streams testbed|namespaces   (prints the stream's module paths)"""
from __future__ import annotations

import sys

from tests.conftest import TIERS

NETWORK_TIERS = ("root", "bmv2", "mininet")  # run_tiers.sh's `network` expression
# root modules that even the two runs out (CI with two CPU hogs: 15.4 min the testbed's alone, 20.9 the others')
WITH_THE_TESTBED = ("test_benchmarks", "test_deployment", "test_libmemcached_tools", "test_ryu_failover")


def streams() -> dict[str, list[str]]:
    """Stream name -> its modules, every network module in exactly one."""
    network = sorted(module for module, tier in TIERS.items() if tier in NETWORK_TIERS)
    testbed = [m for m in network if TIERS[m] == "mininet" or m in WITH_THE_TESTBED]
    return {"testbed": testbed, "namespaces": [m for m in network if m not in testbed]}


def main(argv: list[str]) -> int:
    split = streams()
    if len(argv) != 1 or argv[0] not in split:
        print(f"usage: python -m tests.network_streams {'|'.join(split)}", file=sys.stderr)
        return 2
    print(" ".join(f"tests/{module}.py" for module in split[argv[0]]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
