"""What a packet the data plane copied to the controller says, read without touching any state: which configured
server it was for, the key the data plane counted it for, and the writes it carries (or why it cannot be read).
The core turns a batch of these into syncs (controller/core.py)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from controller.streams import TcpStreams
from mbalancer.memcache.segment_keys import first_written_key, written_keys
from mbalancer.packets import LINKTYPE_ETHERNET, closing_source, destination, memcached_segment


@dataclass(frozen=True)
class Mirror:
    server: int | None  # the configured server the packet was for (None: none of them)
    counted_key: bytes | None = None  # the key the data plane counted the packet for (its first write)
    writes: tuple[tuple[bytes, bytes | None], ...] = ()  # (key, new value or None) of each write it carries
    whole: bool = False  # every byte read as whole requests; if not, it may hold writes nobody can name
    unreadable: str | None = None  # why it could not be read (its server's hot keys must be checked)
    closed: bool = False  # the server closed one of the controller's connections (it may have restarted)


def read_mirror(frame: bytes, server_of_address: Mapping[tuple[str, int], int], ports: Sequence[int],
                streams: TcpStreams | None = None) -> Mirror:
    """A copied Ethernet frame as a Mirror; `ports[server]` is each server's memcached port. A TCP segment of a
    connection the data plane reads as a stream is read as part of it (`streams`): the writes it completes."""
    server = server_of_address.get(destination(frame, LINKTYPE_ETHERNET) or ("", 0))
    if server is None:
        closer = server_of_address.get(closing_source(frame, LINKTYPE_ETHERNET) or ("", 0))
        if closer is not None:
            return Mirror(closer, closed=True)
        return Mirror(None, unreadable="not for a configured server")
    segment = memcached_segment(frame, LINKTYPE_ETHERNET, ports[server])
    if isinstance(segment, str):
        return Mirror(server, unreadable=segment)
    counted = first_written_key(segment)
    found = streams.read(segment) if streams is not None else None
    if found is None:
        found = written_keys(segment)
    if isinstance(found, str):
        return Mirror(server, counted, unreadable=found)
    return Mirror(server, counted, tuple(found[0]), found[1])
