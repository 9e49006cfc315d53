"""`python -m dataplanes build`: build every data plane that has a build step (make install runs it)."""
from __future__ import annotations

import sys

from dataplanes.registry import KINDS, load


def main(argv: list[str]) -> int:
    if argv != ["build"]:
        print("usage: python -m dataplanes build", file=sys.stderr)
        return 2
    for kind in KINDS.values():
        if kind.build is None or kind.missing:
            continue
        try:
            built = load(kind.build)(force=True)
        except RuntimeError as err:  # each build step raises its own RuntimeError subclass with the tool's words
            print(f"data plane {kind.name}: {err}", file=sys.stderr)
            return 1
        print(f"data plane {kind.name}: built {built}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
