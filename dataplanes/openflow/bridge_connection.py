"""A direct OpenFlow connection to one Open vSwitch bridge: the OpenFlow driver's Channel when no ryu-manager
stands between the driver and its switch (the switch agent on the switch's box, or `mbalancer controller` there).

Open vSwitch listens on each bridge's management socket (<rundir>/<bridge>.mgmt, the way in of ovs-ofctl) and on
any `ptcp:` controller target. A connection there is a service connection: OVS sends it no asynchronous message
unless it sets a miss_send_len, which this one does at once, so the copies the driver's rules send up (PacketIn:
mirrored writes, unsure requests) reach it. Ryu's OpenFlow 1.5 parser builds and reads every message, as under
ryu-manager; plain threads carry them (no eventlet here).

The connection is kept: when the bridge goes away (ovs-vswitchd restarted, the bridge re-made) it is dialled again
every RETRY seconds until it answers, its port flags are set again (dataplanes/openflow/port_flags.py: ovs-vswitchd
keeps them in memory only), and then the driver's on_connect puts its whole rule set back, as it does for a switch
that reconnects to ryu-manager. A connection whose flags cannot all be set is not handed on: no rule that floods
goes in before the flags that keep the floods loop-free.
"""
from __future__ import annotations

import logging
import socket
import struct
import threading
import time
from typing import Any, Callable, Sequence

from ryu.ofproto import ofproto_parser as any_version
from ryu.ofproto import ofproto_v1_5 as ofp
from ryu.ofproto import ofproto_v1_5_parser as parser

from dataplanes.driver import DriverError
from dataplanes.openflow import port_flags
from dataplanes.openflow.messages import refusals
from dataplanes.openflow.wire import read_exactly

log = logging.getLogger(__name__)
REPLY_TIMEOUT = 5.0  # seconds the bridge may take to answer a barrier or a stats request (as under ryu-manager)
RETRY = 0.5  # seconds between dials of a bridge that went away
MAX_MESSAGE = 0xffff  # an OpenFlow message's length field is 16 bits
NO_BUFFER_ALL_BYTES = 0xffff  # miss_send_len: whole frames, never buffered in the switch


class Datapath:
    """What Ryu's parser needs of a switch to build and read its messages."""
    ofproto, ofproto_parser = ofp, parser

    def __init__(self, dpid: int):
        self.id = dpid


def parse_address(address: str) -> tuple[int, Any]:
    """"unix:PATH" or "tcp:HOST:PORT" -> (socket family, address); DriverError (one line) for anything else."""
    kind, _, rest = address.partition(":")
    if kind == "unix" and rest:
        return socket.AF_UNIX, rest
    host, _, port = rest.rpartition(":")
    if kind == "tcp" and host and port.isdigit():
        return socket.AF_INET, (host, int(port))
    raise DriverError(f"dataplane.openflow.connect: {address!r} is not \"unix:PATH\" (a bridge's management "
                      f"socket) or \"tcp:HOST:PORT\" (a ptcp: target of the bridge)")


class BridgeConnection:
    """The Channel (dataplanes/openflow/driver.py) to the one bridge at `address`."""

    def __init__(self, address: str, flags: dict[str, int] | None = None):
        """flags: port name -> OpenFlow 1.0 config bits set on every connection (port_flags.parse)."""
        self.address = address
        self.family, self.target = parse_address(address)
        self.flags = dict(flags or {})
        self.on_connect: Callable[[Any], None] = lambda dp: None
        self.on_packet_in: Callable[[bytes], None] = lambda frame: None
        self.dp: Datapath | None = None
        self._sock: socket.socket | None = None
        self._send_lock = threading.Lock()  # whole messages on the wire
        self._request_lock = threading.Lock()  # one request (batch + barrier, or stats) waited for at a time
        self._answers = threading.Condition()
        self._replies: dict[int, list] = {}  # xid -> messages the bridge answered it with
        self._xid = 0
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None

    # --- life cycle ---------------------------------------------------------------------------------------------
    def start(self, on_connect: Callable[[Any], None], on_packet_in: Callable[[bytes], None]) -> None:
        """Connect (DriverError, one line, if the bridge does not answer), then keep the connection."""
        self.on_connect, self.on_packet_in = on_connect, on_packet_in
        self._connect()
        self._thread = threading.Thread(target=self._keep, name="mbalancer-openflow", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._closed.set()
        self._drop()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=REPLY_TIMEOUT)

    # --- the Channel --------------------------------------------------------------------------------------------
    def switches(self) -> list[Any]:
        return [self.dp] if self.dp is not None else []

    def send(self, dp: Any, batch: Sequence[Any]) -> None:
        with self._request_lock:
            xids = [self._put(message) for message in batch]
            self._wait(self._put(parser.OFPBarrierRequest(dp)), "message")
            refused = [m for xid in xids for m in self._take(xid)]
            if refused:
                raise DriverError(f"switch {dp.id:016x} refused a message: {refusals(refused)}")

    def ask(self, dp: Any, request: Any) -> list[Any]:
        with self._request_lock:
            replies = self._wait(self._put(request), "stats request")
            errors = [m for m in replies if isinstance(m, parser.OFPErrorMsg)]
            if errors:
                raise DriverError(f"switch {dp.id:016x} refused a stats request: {refusals(errors[:1])}")
            return replies

    # --- inside -------------------------------------------------------------------------------------------------
    def _connect(self) -> None:
        """Dial, say hello, learn the datapath id, ask for whole PacketIns; DriverError if any step fails."""
        sock = socket.socket(self.family, socket.SOCK_STREAM)
        sock.settimeout(REPLY_TIMEOUT)
        try:
            try:
                sock.connect(self.target)
                self._sock = sock
                self._write(sock, parser.OFPHello(Datapath(0)), 1)
                hello = self._read_one(sock)
                if hello.version != ofp.OFP_VERSION or hello.msg_type != ofp.OFPT_HELLO:
                    raise DriverError(f"the bridge at {self.address} does not speak OpenFlow 1.5 (give it "
                                      f"protocols=OpenFlow15)")
                self._write(sock, parser.OFPFeaturesRequest(Datapath(0)), 2)
                features = self._read_until(sock, ofp.OFPT_FEATURES_REPLY)
                dp = Datapath(features.datapath_id)
                self._write(sock, parser.OFPSetConfig(dp, 0, NO_BUFFER_ALL_BYTES), 3)
            except OSError as err:
                raise DriverError(f"no Open vSwitch bridge answers at {self.address}: {err.strerror or err}") \
                    from None
            self._set_flags(self.flags)
        except DriverError:
            sock.close()
            self._sock = None
            raise
        sock.settimeout(None)
        self.dp = dp
        log.info("connected to the bridge at %s (datapath %016x)", self.address, dp.id)

    def _set_flags(self, flags: dict[str, int]) -> None:
        if not flags:
            return
        done, missing = port_flags.apply(self.family, self.target, self.address, flags)
        if done:
            log.info("port flags set on the bridge at %s: %s", self.address,
                     port_flags.describe({p: flags[p] for p in done}))
        if missing:  # nothing floods to a port that is not there; set when it comes (a PortStatus)
            log.warning("the bridge at %s has no port %s yet: its flags are set when it is added", self.address,
                        ", ".join(missing))

    def _keep(self) -> None:
        """Read until the connection ends; then dial again until the bridge answers (or the connection is closed)
        and hand it to on_connect, on a thread of its own: its barriers are answered through this one."""
        while not self._closed.is_set():
            self._read_all()
            self._drop()
            if self._closed.is_set():
                return
            log.warning("the bridge at %s went away: dialling it again every %.1f s", self.address, RETRY)
            while not self._closed.wait(RETRY):
                try:
                    self._connect()
                except DriverError:
                    continue
                threading.Thread(target=self._connected, args=(self.dp,), name="mbalancer-openflow-connect",
                                 daemon=True).start()
                break

    def _port_added(self, name: str) -> None:
        try:
            self._set_flags({name: self.flags[name]})
        except DriverError as err:  # the connection is dropped: the next one sets every flag before any rule
            log.warning("%s; dialling the bridge again", err)
            _shut(self._sock)  # the reader sees the end, drops the connection and dials again

    def _connected(self, dp: Datapath) -> None:
        try:
            self.on_connect(dp)
        except Exception:  # the driver logs what it could not install; the connection stays
            log.exception("installing the rules on %016x failed", dp.id)

    def _read_all(self) -> None:
        sock = self._sock
        while sock is not None and not self._closed.is_set():
            try:
                message = self._read_one(sock)
            except (OSError, DriverError):
                return
            self._dispatch(sock, message)

    def _dispatch(self, sock: socket.socket, message: Any) -> None:
        if message.msg_type == ofp.OFPT_ECHO_REQUEST:
            try:
                self._write(sock, parser.OFPEchoReply(self.dp, data=message.data), message.xid)
            except OSError:
                pass  # the reader sees the end next
        elif message.msg_type == ofp.OFPT_PACKET_IN:
            self.on_packet_in(bytes(message.data))
        elif message.msg_type == ofp.OFPT_PORT_STATUS and message.reason == ofp.OFPPR_ADD \
                and message.desc.name in self.flags:
            threading.Thread(target=self._port_added, args=(message.desc.name,), name="mbalancer-port-flags",
                             daemon=True).start()
        elif message.msg_type in (ofp.OFPT_ERROR, ofp.OFPT_BARRIER_REPLY, ofp.OFPT_MULTIPART_REPLY):
            with self._answers:
                self._replies.setdefault(message.xid, []).append(message)
                self._answers.notify_all()

    def _put(self, message: Any) -> int:
        sock = self._sock
        if sock is None or self.dp is None:
            raise DriverError(f"the bridge at {self.address} is not connected")
        with self._answers:
            self._xid = self._xid % 0xfffffff0 + 16  # past the handshake's
            xid = self._xid
            self._replies[xid] = []
        try:
            self._write(sock, message, xid)
        except OSError as err:
            raise DriverError(f"the bridge at {self.address} went away: {err.strerror or err}") from None
        return xid

    def _write(self, sock: socket.socket, message: Any, xid: int) -> None:
        """One whole message on the wire (the reader answers echoes while requests are sent)."""
        message.set_xid(xid)
        message.serialize()
        if len(message.buf) > MAX_MESSAGE:
            raise DriverError(f"an OpenFlow message of {len(message.buf)} bytes does not fit in one")
        with self._send_lock:
            sock.sendall(bytes(message.buf))

    def _wait(self, xid: int, what: str) -> list:
        """The bridge's answers to request `xid`: up to a barrier reply, or the last part of a multipart reply."""
        deadline = time.monotonic() + REPLY_TIMEOUT
        with self._answers:
            while not _complete(self._replies.get(xid, [])):
                left = deadline - time.monotonic()
                if self._sock is None:
                    raise DriverError(f"the bridge at {self.address} went away before answering a {what}")
                if left <= 0:
                    raise DriverError(f"switch {self.dp.id:016x} did not answer a {what} within "
                                      f"{REPLY_TIMEOUT:.0f} s")
                self._answers.wait(left)
            return self._replies.pop(xid)

    def _take(self, xid: int) -> list:
        with self._answers:
            return self._replies.pop(xid, [])

    def _drop(self) -> None:
        sock, self._sock, self.dp = self._sock, None, None
        if sock is not None:
            _shut(sock)
            sock.close()
        with self._answers:
            self._replies.clear()
            self._answers.notify_all()

    def _read_one(self, sock: socket.socket) -> Any:
        header = read_exactly(sock, 8)
        version, msg_type, length, xid = struct.unpack("!BBHI", header)
        if length < 8:
            raise DriverError(f"the bridge at {self.address} sent a message of length {length}")
        body = read_exactly(sock, length - 8)
        if version != ofp.OFP_VERSION:  # the hello before negotiation; nothing else comes in another version
            return _Header(version, msg_type, xid)
        return any_version.msg(self.dp or Datapath(0), version, msg_type, length, xid, header + body)

    def _read_until(self, sock: socket.socket, msg_type: int) -> Any:
        for _ in range(16):  # an echo or two may come first
            message = self._read_one(sock)
            if message.msg_type == msg_type:
                return message
            if message.msg_type == ofp.OFPT_ERROR:
                raise DriverError(f"the bridge at {self.address} refused the handshake: {refusals([message])}")
        raise DriverError(f"the bridge at {self.address} did not answer the handshake")


def _shut(sock: socket.socket | None) -> None:
    """Both ways of the connection shut (a reader blocked on it wakes), whatever state it is in (None: none)."""
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


class _Header:
    def __init__(self, version: int, msg_type: int, xid: int):
        self.version, self.msg_type, self.xid = version, msg_type, xid


def _complete(replies: list) -> bool:
    if any(m.msg_type == ofp.OFPT_BARRIER_REPLY for m in replies):
        return True
    last = replies[-1] if replies else None
    return last is not None and (last.msg_type == ofp.OFPT_ERROR or (
        last.msg_type == ofp.OFPT_MULTIPART_REPLY and not last.flags & ofp.OFPMPF_REPLY_MORE))
