"""One P4Runtime connection to one switch (p4runtime-shell's client, cut to what the driver needs): the stream with
its arbitration (this controller primary), pipeline push, batched writes, reads, PacketIn to a callback and
PacketOut. Plain threads and blocking calls (the core's rule: no asyncio loop).

A broken stream (the switch stopped or restarted) marks the client `down`; the driver's thread reconnects.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Callable, Iterable, Iterator

import grpc
from google.protobuf.message import DecodeError
from google.rpc import status_pb2
from p4.v1 import p4runtime_pb2, p4runtime_pb2_grpc

from dataplanes.p4.pipeline import P4Error, Pipeline
from dataplanes.reach import count_answering

log = logging.getLogger(__name__)

PacketHandler = Callable[[bytes, dict[int, bytes]], None]  # payload, metadata by id
DigestHandler = Callable[[int, list[tuple[int, ...]]], None]  # digest id, its samples (struct members as numbers)


class P4RuntimeError(P4Error):
    """The switch refused a request, or could not be reached; the message says which and why. A refused batch says,
    where the switch told, each refused update (by its index in the batch): its canonical code and reason; the
    updates not named were applied (bmv2 goes on past a refused one)."""

    def __init__(self, message: str, refused: dict[int, tuple[int, str]] | None = None):
        super().__init__(message)
        self.refused = refused or {}


CODE_NAMES = {code.value[0]: code.name for code in grpc.StatusCode}  # canonical code -> its name
NOT_FOUND = grpc.StatusCode.NOT_FOUND.value[0]


ELECTION_BASE = 1 << 62  # election ids count down from here in µs: the earlier a controller started, the higher


def first_come_election_id() -> int:
    """An election id that makes the controller that started first the primary: a second one, here or on another
    machine, is refused by the switch itself while the first holds its stream (a dead one's stream ends with it)."""
    return ELECTION_BASE - time.time_ns() // 1000


def elected_election_id(revision: int) -> int:
    """The election id of a controller elected through etcd at `revision` (controller/election.py): above every
    first-come id, so a leader deposes a controller that ran no election, and a later leader an earlier one."""
    return ELECTION_BASE + revision


def election_text(election_id: int) -> str:
    """Who holds an election id, for an error: when that controller started, if the id is one of ours."""
    if election_id > ELECTION_BASE:
        return f"election id {election_id}, a controller elected through etcd (revision {election_id - ELECTION_BASE})"
    started_us = ELECTION_BASE - election_id
    if not 0 < started_us <= time.time_ns() // 1000:
        return f"election id {election_id}"
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started_us / 1e6))
    return f"election id {election_id}, a controller started {started}"


def switches_reached(settings, timeout: float) -> tuple[int, int]:
    """The registry's reach probe for `kind = "p4"`: (P4Runtime servers of settings.switches that accept a connection
    within `timeout`, servers); a fresh channel each, so a healed network is seen at once."""
    def answers(address: str) -> bool:
        channel = grpc.insecure_channel(address)
        try:
            grpc.channel_ready_future(channel).result(timeout=timeout)
            return True
        except grpc.FutureTimeoutError:
            return False
        finally:
            channel.close()
    return count_answering(settings.switches, answers)


def encode(value: int, bitwidth: int) -> bytes:
    """P4Runtime's canonical bytes for an unsigned value: big-endian, no leading zero bytes (at least one byte)."""
    if not 0 <= value < 1 << bitwidth:
        raise P4RuntimeError(f"{value} does not fit in {bitwidth} bits")
    return value.to_bytes(max(1, (value.bit_length() + 7) // 8), "big")


class P4RuntimeClient:
    def __init__(self, address: str, device_id: int, timeout: float = 5.0,
                 on_packet: PacketHandler | None = None, election_id: int | None = None,
                 on_digest: DigestHandler | None = None):
        self.address, self.device_id, self.timeout = address, device_id, timeout
        self.on_packet, self.on_digest = on_packet, on_digest
        # The controller that came first stays primary (first_come_election_id); it keeps its id when it reconnects.
        self.election_id = election_id or first_come_election_id()
        self._channel: grpc.Channel | None = None
        self._stub: p4runtime_pb2_grpc.P4RuntimeStub | None = None
        self._requests: queue.Queue = queue.Queue()
        self._arbitrated = threading.Event()
        self._arbitration_error = ""
        self._closed = False
        self.down = False  # the stream broke (the switch stopped or restarted): a new client is needed
        self.writes = self.updates = 0  # Write requests sent, and their updates (what a reconnect cost: tests count)
        self._reader: threading.Thread | None = None

    # --- the stream -----------------------------------------------------------------------------------------
    def connect(self) -> None:
        """Open the channel and the stream and become primary; P4RuntimeError if the switch is not there or another
        controller is primary."""
        self._channel = grpc.insecure_channel(self.address)
        try:
            grpc.channel_ready_future(self._channel).result(timeout=self.timeout)
        except grpc.FutureTimeoutError:
            self._channel.close()
            raise P4RuntimeError(f"no P4Runtime server at {self.address} (within {self.timeout:g} s)") from None
        self._stub = p4runtime_pb2_grpc.P4RuntimeStub(self._channel)
        self._requests = queue.Queue()
        self._arbitrated.clear()
        request = p4runtime_pb2.StreamMessageRequest()
        request.arbitration.device_id = self.device_id
        request.arbitration.election_id.high = 0
        request.arbitration.election_id.low = self.election_id
        self._requests.put(request)
        stream = self._stub.StreamChannel(self._outgoing())
        self._reader = threading.Thread(target=self._read, args=(stream,), name=f"p4rt-{self.address}", daemon=True)
        self._reader.start()
        if not self._arbitrated.wait(self.timeout) or self._arbitration_error:
            self.close()
            raise P4RuntimeError(f"{self.address}: not primary for device {self.device_id}"
                                 f"{': ' + self._arbitration_error if self._arbitration_error else ''}")

    def _outgoing(self) -> Iterator[p4runtime_pb2.StreamMessageRequest]:
        while True:
            request = self._requests.get()
            if request is None:
                return
            yield request

    def _read(self, stream) -> None:
        try:
            for response in stream:
                kind = response.WhichOneof("update")
                if kind == "arbitration":
                    if response.arbitration.status.code != 0:  # OK: primary; anything else: a backup
                        holder = election_text(response.arbitration.election_id.low)
                        self._arbitration_error = f"another controller is primary ({holder})"
                    self._arbitrated.set()
                elif kind == "packet" and self.on_packet is not None:
                    metadata = {m.metadata_id: m.value for m in response.packet.metadata}
                    try:
                        self.on_packet(response.packet.payload, metadata)
                    except Exception:  # the handler's failure must not end the stream
                        log.exception("PacketIn handler failed")
                elif kind == "digest" and self.on_digest is not None:
                    samples = [tuple(int.from_bytes(m.bitstring, "big") for m in data.struct.members)
                               for data in response.digest.data]
                    try:
                        self.on_digest(response.digest.digest_id, samples)
                    except Exception:
                        log.exception("digest handler failed")
                elif kind == "error":
                    log.warning("%s: stream error %s", self.address, response.error.canonical_code)
        except grpc.RpcError as err:
            if not self._closed:
                log.warning("%s: P4Runtime stream ended: %s", self.address, err.code().name)
        if not self._closed:
            self.down = True

    def close(self) -> None:
        self._closed = True
        self._requests.put(None)
        if self._channel is not None:
            self._channel.close()
        if self._reader is not None and self._reader is not threading.current_thread():
            self._reader.join(timeout=2)

    # --- requests -------------------------------------------------------------------------------------------
    def pipeline_cookie(self) -> int | None:
        """The cookie of the pipeline the switch runs, None if it runs none."""
        request = p4runtime_pb2.GetForwardingPipelineConfigRequest(
            device_id=self.device_id, response_type=p4runtime_pb2.GetForwardingPipelineConfigRequest.COOKIE_ONLY)
        try:
            reply = self._stub.GetForwardingPipelineConfig(request, timeout=self.timeout)
        except grpc.RpcError as err:
            if err.code() == grpc.StatusCode.FAILED_PRECONDITION:  # no pipeline yet
                return None
            raise self._error("reading the pipeline", err) from None
        return reply.config.cookie.cookie if reply.config.HasField("cookie") else None

    def set_pipeline(self, pipeline: Pipeline) -> None:
        """Push the program (VERIFY_AND_COMMIT: the switch starts empty)."""
        request = p4runtime_pb2.SetForwardingPipelineConfigRequest(
            device_id=self.device_id, action=p4runtime_pb2.SetForwardingPipelineConfigRequest.VERIFY_AND_COMMIT)
        request.election_id.low = self.election_id
        request.config.p4info.CopyFrom(pipeline.p4info)
        request.config.p4_device_config = pipeline.device_config
        request.config.cookie.cookie = pipeline.cookie
        try:
            self._stub.SetForwardingPipelineConfig(request, timeout=max(self.timeout, 30))
        except grpc.RpcError as err:
            raise self._error("pushing the pipeline", err) from None

    def write(self, updates: Iterable[p4runtime_pb2.Update], what: str, missing_ok: bool = False) -> None:
        """One batch (one WriteRequest); P4RuntimeError naming `what`, the refused updates and why. missing_ok: a
        delete of an entry that is not there is no error (the rest of the batch was applied)."""
        request = p4runtime_pb2.WriteRequest(device_id=self.device_id, updates=list(updates))
        if not request.updates:
            return
        request.election_id.low = self.election_id
        self.writes, self.updates = self.writes + 1, self.updates + len(request.updates)
        try:
            self._stub.Write(request, timeout=self.timeout)
        except grpc.RpcError as err:
            refused = refused_updates(err)
            deletes = {i for i, u in enumerate(request.updates) if u.type == p4runtime_pb2.Update.DELETE}
            if missing_ok and refused and all(code == NOT_FOUND and i in deletes for i, (code, _) in refused.items()):
                return
            raise self._error(what, err, refused, len(request.updates)) from None

    def read(self, entities: Iterable[p4runtime_pb2.Entity], what: str) -> list[p4runtime_pb2.Entity]:
        request = p4runtime_pb2.ReadRequest(device_id=self.device_id, entities=list(entities))
        try:
            return [e for reply in self._stub.Read(request, timeout=self.timeout) for e in reply.entities]
        except grpc.RpcError as err:
            raise self._error(what, err) from None

    def packet_out(self, payload: bytes, metadata: dict[int, bytes]) -> None:
        request = p4runtime_pb2.StreamMessageRequest()
        request.packet.payload = payload
        for metadata_id, value in metadata.items():
            request.packet.metadata.add(metadata_id=metadata_id, value=value)
        self._requests.put(request)

    def _error(self, what: str, err: grpc.RpcError, refused: dict[int, tuple[int, str]] | None = None,
               batch: int = 0) -> P4RuntimeError:
        if refused:  # the first refused update says why; how many were refused, of how many
            index, (code, message) = min(refused.items())
            return P4RuntimeError(f"{self.address}: {what}: update {index + 1} of {batch}: "
                                  f"{CODE_NAMES.get(code, code)}"
                                  f"{': ' + message if message else ''}"
                                  + (f" ({len(refused)} refused)" if len(refused) > 1 else ""), refused)
        detail = (err.details() or "").strip().splitlines()
        return P4RuntimeError(f"{self.address}: {what}: {err.code().name}{': ' + detail[0] if detail else ''}")


def refused_updates(err: grpc.RpcError) -> dict[int, tuple[int, str]]:
    """The updates of a batch the switch refused, by index: (canonical code, message), from the status details
    P4Runtime puts in the trailers (one p4.v1.Error per update, OK for those applied); {} if it sent none."""
    trailers = err.trailing_metadata() if hasattr(err, "trailing_metadata") else None
    raw = next((v for k, v in trailers or () if k == "grpc-status-details-bin"), None)
    if raw is None:
        return {}
    try:
        status = status_pb2.Status.FromString(raw)
    except DecodeError:
        return {}
    refused = {}
    for index, detail in enumerate(status.details):
        error = p4runtime_pb2.Error()
        if detail.Unpack(error) and error.canonical_code != 0:
            refused[index] = (error.canonical_code, error.message.strip().splitlines()[0] if error.message else "")
    return refused
