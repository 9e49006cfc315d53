"""Port flags a direct connection puts on its bridge's ports ([dataplane.openflow] port_flags), e.g. `no-flood` on a
fabric leaf's second uplink, without which floods would circle leaf-spine-leaf-spine.

Open vSwitch keeps port flags in ovs-vswitchd's memory, not in its database: a restarted ovs-vswitchd has forgotten
them. So they are set on every connection to the bridge, before the driver's rules go back (the rules flood; the
flags must be there first), and again when a port named here is added (a PortStatus). Why a connection, not an
ovsdb monitor: the flags live and die with the ovs-vswitchd process, and a connection to its management socket (or
its ptcp: target) ends exactly when that process does; the database, another process, says nothing about a restart
that changed no row. The connection that comes back is the one that must restore the flags and the rules alike.

`no-flood` exists in OpenFlow 1.0 only (1.1 dropped it; Open vSwitch still honours it), so the flags go over a short
OpenFlow 1.0 connection of their own (hence OpenFlow10 among the bridge's protocols): features (each port's number
and MAC, which a port mod must repeat), one port mod per port, a barrier.
"""
from __future__ import annotations

import socket
import struct
from typing import Any, Mapping, Sequence

from ryu.ofproto import ofproto_parser as any_version
from ryu.ofproto import ofproto_v1_0 as ofp10
from ryu.ofproto import ofproto_v1_0_parser as parser10

from dataplanes.driver import DriverError
from dataplanes.openflow.wire import read_exactly

# OpenFlow 1.0 port config bits by the names ovs-ofctl mod-port gives them
FLAGS = {"down": ofp10.OFPPC_PORT_DOWN, "no-receive": ofp10.OFPPC_NO_RECV, "no-flood": ofp10.OFPPC_NO_FLOOD,
         "no-forward": ofp10.OFPPC_NO_FWD, "no-packet-in": ofp10.OFPPC_NO_PACKET_IN}
TIMEOUT = 5.0


class _Datapath:
    ofproto, ofproto_parser, id = ofp10, parser10, 0


def parse(entries: Sequence[str]) -> dict[str, int]:
    """"PORT FLAG ..." entries -> {port: config bits}; DriverError naming the entry for a bad one."""
    flags: dict[str, int] = {}
    for entry in entries:
        port, *names = entry.split()
        unknown = [n for n in names if n not in FLAGS]
        if not names or unknown or port in flags:
            raise DriverError(f"dataplane.openflow.port_flags: {entry!r}: \"PORT FLAG ...\", each port once, flags "
                              f"among {', '.join(FLAGS)}" + (f" (not {', '.join(unknown)})" if unknown else ""))
        flags[port] = sum(FLAGS[n] for n in set(names))
    return flags


def describe(flags: Mapping[str, int]) -> str:
    return ", ".join(f"{port} {' '.join(n for n, bit in FLAGS.items() if bits & bit)}" for port, bits in flags.items())


def apply(family: int, target: Any, address: str, flags: Mapping[str, int]) -> tuple[list[str], list[str]]:
    """Set `flags` on the bridge at `address` (the other flags of each port as they are); (ports set, ports the
    bridge does not have). DriverError (one line) if the bridge refuses or does not answer."""
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.settimeout(TIMEOUT)
    try:
        sock.connect(target)
        _send(sock, parser10.OFPHello(_Datapath()), 1)
        if _read(sock)[0] != ofp10.OFPT_HELLO:
            raise DriverError(f"the bridge at {address} did not say hello")
        _send(sock, parser10.OFPFeaturesRequest(_Datapath()), 2)
        ports = {p.name.decode(errors="replace") if isinstance(p.name, bytes) else p.name: p
                 for p in _until(sock, ofp10.OFPT_FEATURES_REPLY, address).ports.values()}
        done = [name for name in flags if name in ports]
        for xid, name in enumerate(done, 3):
            port = ports[name]
            # mask = the bits named: the port's other flags stay as they are
            _send(sock, parser10.OFPPortMod(_Datapath(), port.port_no, port.hw_addr, flags[name], flags[name], 0), xid)
        _send(sock, parser10.OFPBarrierRequest(_Datapath()), 1000)
        _until(sock, ofp10.OFPT_BARRIER_REPLY, address)
    except OSError as err:
        raise DriverError(f"setting port flags on the bridge at {address}: {err.strerror or err}") from None
    finally:
        sock.close()
    return done, [name for name in flags if name not in ports]


def _send(sock: socket.socket, message: Any, xid: int) -> None:
    message.set_xid(xid)
    message.serialize()
    sock.sendall(bytes(message.buf))


def _read(sock: socket.socket) -> tuple[int, bytes]:
    """(type, whole message) of the next message, any version."""
    header = read_exactly(sock, 8)
    _, msg_type, length, _ = struct.unpack("!BBHI", header)
    return msg_type, header + read_exactly(sock, max(length, 8) - 8)


def _until(sock: socket.socket, msg_type: int, address: str) -> Any:
    for _ in range(64):  # echoes may come first
        kind, raw = _read(sock)
        if kind == ofp10.OFPT_ERROR:
            error = any_version.msg(_Datapath(), ofp10.OFP_VERSION, kind, len(raw), 0, raw)
            raise DriverError(f"the bridge at {address} refused a port flag: type {error.type} code {error.code}" +
                              (" (OpenFlow 1.0, which port flags need, is not among its protocols: give it "
                               "protocols=OpenFlow10,OpenFlow13,OpenFlow15)" if error.type == 0 else ""))
        if kind == ofp10.OFPT_ECHO_REQUEST:
            _send(sock, parser10.OFPEchoReply(_Datapath(), data=raw[8:]), struct.unpack("!I", raw[4:8])[0])
        elif kind == msg_type:
            return any_version.msg(_Datapath(), ofp10.OFP_VERSION, kind, len(raw), struct.unpack("!I", raw[4:8])[0],
                                   raw)
    raise DriverError(f"the bridge at {address} did not answer a port flag request")
