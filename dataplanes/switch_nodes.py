"""What every data plane's switch nodes share (one floor below them): running a setup command with an error that
names it, and finding the far end of a Mininet link."""
from __future__ import annotations

import shlex
import subprocess


class SwitchNodeError(RuntimeError):
    """A switch node could not be set up; the message names the command and its error."""


def sh(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run a setup command (ip, sysctl, ...); SwitchNodeError with its stderr if it fails and `check`."""
    result = subprocess.run(args, capture_output=True, text=True)
    if check and result.returncode:
        raise SwitchNodeError(f"{' '.join(map(shlex.quote, args))}: {result.stderr.strip()}")
    return result


def peer_intf(intf):
    """The interface at the other end of a Mininet interface's link."""
    link = intf.link
    return link.intf2 if link.intf1 is intf else link.intf1
