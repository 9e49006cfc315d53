"""Memcached server addresses as users write them: `host:port`, the port defaulting to memcached's 11211."""
from __future__ import annotations

import ipaddress
import socket
from typing import NamedTuple

DEFAULT_PORT = 11211


class ServerAddress(NamedTuple):
    host: str
    port: int = DEFAULT_PORT

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def parse_server(text: str) -> ServerAddress:
    """`10.0.0.1:11211`, `10.0.0.1` or `cache1:11211` -> ServerAddress; ValueError saying what is wrong.

    A host name is resolved once, here, to its first IPv4 address: the switch matches and rewrites addresses, so
    everything downstream (logs, the data plane, /state) names the address that is meant.
    """
    host, sep, port_text = text.strip().partition(":")
    address = ServerAddress(resolve_ipv4(host, text))
    if not sep:
        return address
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"{text!r}: port must be a number from 1 to 65535")
    return address._replace(port=int(port_text))


def resolve_ipv4(host: str, text: str) -> str:
    """An IPv4 literal as it is, a name as its first IPv4 address; ValueError quoting `text` otherwise."""
    try:
        return str(ipaddress.IPv4Address(host))
    except ValueError:
        pass
    if not host:
        raise ValueError(f"{text!r}: give a host, an IPv4 address such as 10.0.0.1 or a name")
    if all(part.isdigit() for part in host.split(".")):  # the resolver would take 10.77.0 as 10.77.0.0
        raise ValueError(f"{text!r}: {host} is not an IPv4 address (four numbers 0-255, e.g. 10.0.0.1)")
    try:
        return socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_DGRAM)[0][4][0]
    except (OSError, UnicodeError) as err:
        why = getattr(err, "strerror", None) or str(err)
        raise ValueError(f"{text!r}: {host!r} is not an IPv4 address and does not resolve to one ({why})") from None


def parse_servers(text: str) -> list[ServerAddress]:
    """A comma-separated list, in order (the order is part of the key -> server hash); no duplicates."""
    servers = [parse_server(part) for part in text.split(",") if part.strip()]
    if not servers:
        raise ValueError("no server given")
    if len(set(servers)) != len(servers):
        raise ValueError("a server is listed twice")
    return servers
