"""Network interfaces of the network namespace this process is in, asked of the kernel (ioctl), never of sysfs.

/sys/class/net shows the interfaces of the namespace /sys was mounted in: under `nsenter --net=/run/netns/BOX` that is
still the host's, so a tool that looked there would not find the box's own ports (or would find the host's).
"""
from __future__ import annotations

import fcntl
import os
import socket
import struct
from pathlib import Path

SIOCGIFHWADDR = 0x8927  # the interface's hardware address; its sa_family is the link type (ARPHRD_*)
NETNS_NAMES = Path("/run/netns")  # where `ip netns add` names namespaces
IFNAMSIZ = 15  # characters in a Linux interface name (the kernel's buffer holds a NUL more)


def interface_index(name: str) -> int | None:
    """The interface's index in this namespace, None if it has none by that name."""
    try:
        return socket.if_nametoindex(name)
    except OSError:  # no such interface, or a name no interface can have
        return None


def interface_exists(name: str) -> bool:
    return interface_index(name) is not None


def link_type(name: str) -> int:
    """The interface's link type (ARPHRD_ETHER 1, ARPHRD_LOOPBACK 772, ...); OSError if there is no such interface."""
    request = struct.pack("16s16x", name.encode()[:IFNAMSIZ])
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        reply = fcntl.ioctl(sock, SIOCGIFHWADDR, request)
    return struct.unpack_from("H", reply, 16)[0]


def network_namespace() -> tuple[int, str]:
    """This process's network namespace: its inode, and its name under /run/netns ("" if it has none, as the
    machine's own usually has not)."""
    inode = os.stat("/proc/self/ns/net").st_ino
    return inode, namespace_name(inode)


def namespace_name(inode: int) -> str:
    """The name under /run/netns of the network namespace with this inode, "" if none has it (or it is gone)."""
    try:
        entries = sorted(NETNS_NAMES.iterdir())
    except OSError:
        return ""
    for entry in entries:
        try:
            if entry.stat().st_ino == inode:
                return entry.name
        except OSError:
            continue
    return ""
