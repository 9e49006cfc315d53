"""Memcached server addresses as users write them: `host:port`, the port defaulting to memcached's 11211."""
from __future__ import annotations

import ipaddress
from typing import NamedTuple

DEFAULT_PORT = 11211


class ServerAddress(NamedTuple):
    host: str
    port: int = DEFAULT_PORT

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def parse_server(text: str) -> ServerAddress:
    """`10.0.0.1:11211` or `10.0.0.1` -> ServerAddress; ValueError saying what is wrong.

    Hosts are IPv4 literals: the switch rewrites addresses, so names would only hide which address is meant.
    """
    host, sep, port_text = text.strip().partition(":")
    try:
        ipaddress.IPv4Address(host)
    except ValueError:
        raise ValueError(f"{text!r}: host must be an IPv4 address such as 10.0.0.1") from None
    if not sep:
        return ServerAddress(host)
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"{text!r}: port must be a number from 1 to 65535")
    return ServerAddress(host, int(port_text))


def parse_servers(text: str) -> list[ServerAddress]:
    """A comma-separated list, in order (the order is part of the key -> server hash); no duplicates."""
    servers = [parse_server(part) for part in text.split(",") if part.strip()]
    if not servers:
        raise ValueError("no server given")
    if len(set(servers)) != len(servers):
        raise ValueError("a server is listed twice")
    return servers
