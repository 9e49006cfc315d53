"""The eBPF driver: the controller core's requests as writes to the maps of one or more eBPF switches.

The hot-key bookkeeping over the switches' maps (the slot book, dataplanes/bpf/key_tables.py) and the driver calls it
answers (dataplanes/bpf/maps_driver.py) are shared with the OpenFlow data plane's key classifier. This driver adds what
is the eBPF switch's own: mirrored writes arrive as clones on the switch's controller port, and a thread reads them
from the controller's end of that link with an AF_PACKET socket. The same thread notices a switch that was reloaded
(its pins lead to new maps): the maps are reopened, the slots forgotten, and the core asked to install everything
again.
"""
from __future__ import annotations

import logging
import select
import socket
import time
from pathlib import Path
from typing import Sequence

from dataplanes.bpf.key_tables import KeyTables, resolve_trusted
from dataplanes.bpf.maps_driver import BpfMapsDriver
from dataplanes.slot_book_driver import WATCH_EVERY
from dataplanes.bpf.program import PIN_ROOT, bpffs_problem, loaded_switches, mirror_link_of
from dataplanes.driver import DriverError, MacSighting
from dataplanes.ebpf import Settings
from mbalancer.interfaces import interface_exists
from mbalancer.packets import interface_socket

log = logging.getLogger(__name__)
PACKET_OUTGOING = 4


def driver_from_settings(settings: Settings) -> "EbpfDriver":
    """The registry's factory: the named switches (every loaded one if none is named), each with its mirror link
    where it has one."""
    if problem := bpffs_problem():
        raise DriverError(problem)
    names = list(settings.switches) or loaded_switches()
    if not names:
        raise DriverError(f"no eBPF switch is loaded (nothing under {PIN_ROOT}): start a topology, or load the "
                          f"data plane on your switch's ports first")
    trusted = resolve_trusted(settings.trusted, "dataplane.ebpf.trusted")
    missing = [n for n in names if not (PIN_ROOT / n / "prog").exists()]
    if missing:
        raise DriverError(f"no eBPF switch named {', '.join(missing)} is loaded (loaded: "
                          f"{', '.join(loaded_switches()) or 'none'})")
    mirrors = [mirror_link_of(n)[1] for n in names if interface_exists(mirror_link_of(n)[1])]
    return EbpfDriver([PIN_ROOT / n for n in names], mirrors, trusted)


def owned_name(switch: str) -> str:
    """The name a controller owns an eBPF switch by (mbalancer/ownership.py), for `switch detach` too."""
    return f"ebpf:{switch}"


class EbpfDriver(BpfMapsDriver):
    name = "ebpf"
    thread_name = "mbalancer-ebpf"

    def __init__(self, pin_dirs: Sequence[Path | str], mirror_ifaces: Sequence[str] = (), trusted: Sequence[str] = ()):
        """pin_dirs: one per switch; mirror_ifaces: the controller's ends of the switches' mirror links (none: no
        mirrored writes are read, e.g. in packet-fixture tests)."""
        super().__init__(KeyTables(pin_dirs, "eBPF data plane", trusted))
        self.mirror_ifaces = list(mirror_ifaces)

    def owned_switches(self) -> list[str]:
        return [owned_name(p.name) for p in self.book.pin_dirs]

    def server_macs(self) -> list[MacSighting]:
        return self.book.server_macs()

    # --- the driver's thread: mirrored writes in, reloads noticed -------------------------------------------
    def _watch(self) -> None:
        sockets = self._mirror_sockets()
        checked = time.monotonic()
        try:
            while not self._stop.is_set():
                if sockets:
                    for sock in select.select(sockets, [], [], 0.2)[0]:
                        self._read_mirror(sock, sockets)
                else:
                    self._stop.wait(0.2)
                if time.monotonic() - checked >= WATCH_EVERY:
                    checked = time.monotonic()
                    if self._reloaded():
                        for sock in sockets:
                            sock.close()
                        sockets = self._mirror_sockets()
        finally:
            for sock in sockets:
                sock.close()

    def _mirror_sockets(self) -> list[socket.socket]:
        sockets = []
        for iface in self.mirror_ifaces:
            try:
                sockets.append(interface_socket(iface))
            except OSError as err:  # the switch is being reloaded: its link comes back with it
                log.warning("mirror link %s not there (%s): mirrored writes from it are not read", iface, err)
        return sockets

    def _read_mirror(self, sock: socket.socket, sockets: list[socket.socket]) -> None:
        try:
            frame, address = sock.recvfrom(65535)
        except OSError as err:  # the link went away (the topology is being torn down, or the switch reloaded)
            log.info("mirror capture on %s ended: %s", address_of(sock), err)
            sockets.remove(sock)
            sock.close()
            return
        if address[2] == PACKET_OUTGOING or frame[12:14] != b"\x08\x00":
            return  # mirrors are IPv4; the link's own IPv6 chatter is not
        self._deliver(frame)


def address_of(sock: socket.socket) -> str:
    try:
        return sock.getsockname()[0]
    except OSError:
        return "?"
