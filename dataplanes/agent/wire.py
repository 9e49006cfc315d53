"""What the agent and its controller agree on: the service, the protocol version, the metadata every request
carries, the message-size bound and the credentials, read from the config's [dataplane.agent] files."""
from __future__ import annotations

import ipaddress
from pathlib import Path

from dataplanes.agent import Settings
from mbalancer.settings import ConfigError

PROTOCOL = 1  # raised on any change an older peer would misread; a mismatch is refused, naming both
SERVICE = "mbalancer.agent.v1.SwitchAgent"
HELLO, CALL, STREAM = (f"/{SERVICE}/{m}" for m in ("Hello", "Call", "Stream"))
# metadata keys (gRPC wants them lower case)
PROTOCOL_KEY, ELECTION_KEY, SESSION_KEY, TOKEN_KEY = ("mbalancer-protocol", "mbalancer-election-id",
                                                      "mbalancer-session", "authorization")


def options(settings: Settings) -> list[tuple[str, int]]:
    """Both ends refuse a message over the bound (RESOURCE_EXHAUSTED) before reading it, and ping each other every
    second, so a peer that vanished without closing (killed with its machine, cut off) is noticed in about 3 s."""
    return [("grpc.max_receive_message_length", settings.max_message),
            ("grpc.max_send_message_length", settings.max_message),
            ("grpc.keepalive_time_ms", 1000), ("grpc.keepalive_timeout_ms", 2000),
            ("grpc.keepalive_permit_without_calls", 1), ("grpc.http2.max_pings_without_data", 0),
            ("grpc.http2.min_ping_interval_without_data_ms", 500)]


def read_token(settings: Settings, where: str = "dataplane.agent") -> str | None:
    """The shared secret of token_file (its first line), None without one; ConfigError naming the field (`where`
    is the section: the controller's HTTP API reads [controller]'s the same way)."""
    if not settings.token_file:
        return None
    try:
        token = Path(settings.token_file).read_text().strip().splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"{where}.token_file: {err}") from None
    if not token or len(token[0]) < 16:
        raise ConfigError(f"{where}.token_file: {settings.token_file} must hold a secret of 16 characters "
                          f"or more on its first line")
    return token[0]


def read_pem(settings: Settings, field: str, where: str = "dataplane.agent") -> bytes | None:
    path = getattr(settings, field)
    if not path:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as err:
        raise ConfigError(f"{where}.{field}: {err}") from None


def tls_files(settings: Settings, where: str = "dataplane.agent") -> tuple[bytes | None, bytes | None, bytes | None]:
    """(certificate, key, CA); a certificate without its key (or the reverse) is a ConfigError."""
    cert, key, ca = (read_pem(settings, f, where) for f in ("tls_cert", "tls_key", "tls_ca"))
    if (cert is None) != (key is None):
        raise ConfigError(f"{where}: tls_cert and tls_key go together")
    return cert, key, ca


def is_loopback(address: str) -> bool:
    """Whether host:port names this machine's loopback only (where no other machine reaches the agent)."""
    host = address.rpartition(":")[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
