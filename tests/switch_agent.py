"""A switch agent for tests (dataplanes/agent/process.py) on a free port of 127.0.0.1, with a config and a token of
its own; requests to it as any program may send them."""
from __future__ import annotations

import secrets
from pathlib import Path

from dataplanes.agent.process import AgentProcess as Process
from mbalancer.memcache.server import free_port

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


class AgentProcess(Process):
    """`mbalancer switch serve` running `kind` on a free port of 127.0.0.1 (or `address`), with a config and a token
    of its own in `folder`: address, token_file, config, log, stop()."""

    def __init__(self, folder: Path, kind: str, kind_settings: dict, extra: str = "", address: str = ""):
        self.address = address or f"127.0.0.1:{free_port()}"
        self.token_file = folder / "token"
        super().__init__(agent_config(folder, kind, kind_settings, self.address, extra))


def request(address: str, token_file: Path, path: str, body: bytes, **metadata: str) -> bytes:
    """One request as any program may send it (election id 1, its own session, the token): the answer's bytes, or
    grpc.RpcError when the agent refuses it. `metadata` overrides or adds keys."""
    import grpc
    from dataplanes.agent.wire import ELECTION_KEY, PROTOCOL, PROTOCOL_KEY, SESSION_KEY, TOKEN_KEY
    sent = {PROTOCOL_KEY: str(PROTOCOL), ELECTION_KEY: "1", SESSION_KEY: "raw",
            TOKEN_KEY: f"Bearer {token_file.read_text().strip()}", **metadata}
    with grpc.insecure_channel(address) as channel:
        return channel.unary_unary(path)(body, metadata=tuple(sent.items()), timeout=5)


def hello(address: str, token_file: Path) -> dict:
    """What the agent says of itself: its kind, the highest election id it has seen, its primary."""
    from dataplanes.agent.codec import loads
    from dataplanes.agent.wire import HELLO
    return loads(request(address, token_file, HELLO, b"{}"))
