"""p4runtime-shell against a running MBalancer P4 switch, as a second client that only reads (docs/dataplanes/p4.md).

p4runtime-shell lives in an environment of its own (.venv/p4runtime-shell, made by install/python.sh): its pins of
p4runtime 1.4.1 and protobuf 3.20 clash with the project's. It connects with election id 1, the lowest there is,
so it is a backup next to the controller (whose id is near 2**62) and can read every table and counter by name but
write nothing; its own default, (1, 0) = 2**64, would make it primary and cut the controller off the switch.

    python -m dataplanes.p4.shell [--switch HOST:PORT] [--device-id N]
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

READ_ONLY_ELECTION_ID = "0,1"  # p4runtime-shell's "high,low": 1, below any controller's


def shell_python() -> Path:
    """The interpreter of p4runtime-shell's environment, next to this virtualenv's."""
    return Path(sys.prefix) / "p4runtime-shell" / "bin" / "python"


def shell_command(switch: str, device_id: int) -> list[str]:
    return [str(shell_python()), "-m", "p4runtime_sh", "--grpc-addr", switch, "--device-id", str(device_id),
            "--election-id", READ_ONLY_ELECTION_ID]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dataplanes.p4.shell",
                                     description="p4runtime-shell on a running MBalancer P4 switch, read-only.")
    parser.add_argument("--switch", default="127.0.0.1:9559", help="the switch's P4Runtime address (HOST:PORT)")
    parser.add_argument("--device-id", type=int, default=1, help="its P4Runtime device id")
    args = parser.parse_args(argv)
    if not shell_python().exists():
        print(f"p4runtime-shell is not installed at {shell_python().parent.parent} (`make install` puts it there)",
              file=sys.stderr)
        return 1
    command = shell_command(args.switch, args.device_id)
    os.execv(command[0], command)


if __name__ == "__main__":
    sys.exit(main())
