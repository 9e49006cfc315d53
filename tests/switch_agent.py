"""A switch agent for tests: `mbalancer switch serve` in a process of its own, on a free port of 127.0.0.1, with a
config and a token of its own."""
from __future__ import annotations

import os
import secrets
import select
import signal
import subprocess
import time
from pathlib import Path

from mbalancer.memcache.server import free_port
from tests.conftest import MBALANCER

START_TIMEOUT = 30.0  # seconds the agent may take to import, make its driver and listen

CONFIG = """[[servers]]
name = "s1"
ip = "10.0.0.1"
mac = "02:00:00:00:00:01"

[dataplane]
kind = "{kind}"
{kind_section}
[dataplane.agent]
listen = "{listen}"
token_file = "{token_file}"
{extra}"""


def agent_config(folder: Path, kind: str, kind_settings: dict, listen: str, extra: str = "") -> Path:
    """A config serving `kind` on `listen` with a fresh token in folder/token; its path."""
    token_file = folder / "token"
    if not token_file.exists():
        token_file.write_text(secrets.token_hex(16) + "\n")
    section = "".join(f"{k} = {_toml(v)}\n" for k, v in kind_settings.items())
    path = folder / "agent.toml"
    path.write_text(CONFIG.format(kind=kind, kind_section=f"[dataplane.{kind}]\n{section}" if section else "",
                                  listen=listen, token_file=token_file, extra=extra))
    return path


def _toml(value) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(f'"{v}"' for v in value) + "]"
    return f'"{value}"' if isinstance(value, str) else str(value)


class AgentProcess:
    """`mbalancer switch serve` running `kind`; address, token_file, log (its stderr so far), stop()."""

    def __init__(self, folder: Path, kind: str, kind_settings: dict, extra: str = "", address: str = ""):
        self.address = address or f"127.0.0.1:{free_port()}"
        self.config = agent_config(folder, kind, kind_settings, self.address, extra)
        self.token_file = folder / "token"
        self.process = subprocess.Popen([str(MBALANCER), "switch", "serve", "--config", str(self.config)],
                                        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.log = ""
        self._wait_for("Ctrl-C stops")

    def _wait_for(self, text: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while text not in self.log:
            if time.monotonic() > deadline or self.process.poll() is not None:
                self.stop()
                raise RuntimeError(f"the switch agent did not start: {self.log.strip()[-800:]}")
            if select.select([self.process.stderr], [], [], 0.2)[0]:  # unbuffered: select sees all there is
                self.log += os.read(self.process.stderr.fileno(), 65536).decode(errors="replace")

    def stop(self) -> str:
        """SIGTERM, then its whole log (again if stopped already)."""
        if self.process.stderr.closed:
            return self.log
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log += self.process.stderr.read().decode(errors="replace")
        self.process.stderr.close()
        return self.log
