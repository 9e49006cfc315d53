"""The P4 switch's hot-key sketch, as monitor/dataplane.py's SketchReader reads a data plane's sketch (the methods
the eBPF Tables offers it): p4src/mbalancer.p4 counts every get's key in a count-min sketch while `sketch_control`
says so, and a get whose estimate reaches the threshold sends a digest (key, estimate, destination).

What the switch cannot do, this side does. The switch keeps no candidates (PI cannot read registers): the digests
are its candidates, and the largest estimate of each key in an epoch is its count. To keep digests few, an estimate
of 2^b or more is reported only at multiples of 2^(b-8) (the count is then within 1/256 of the estimate), and the
threshold rises during an epoch to the RANK-th largest estimate reported so far: estimates only grow, so a key that
ends among the RANK largest is reported at its end whatever the threshold was on its way (each epoch starts again at
REPORT_FROM_LEAST). The sketch's cells cannot be zeroed either: each holds the epoch it counts for, so the reader's
two alternating epochs (0 and 1) become a running 16-bit epoch number here, a new one at every flip. Gets per
destination are P4Runtime counters, one set per epoch parity, zeroed as they are read. Digests go only to the
P4Runtime primary: this connection must be it.
"""
from __future__ import annotations

import heapq
import logging
import socket
import threading
import time
from typing import Sequence

from dataplanes.p4 import entries as e
from dataplanes.p4.client import P4RuntimeClient
from dataplanes.p4.pipeline import P4Error, Pipeline
from dataplanes.p4.tables import P4Tables
from dataplanes.pipeline import MAX_KEY, HeavyKey

log = logging.getLogger(__name__)

DIGEST = "sketch_report_t"
REPORT_FROM_LEAST = 2  # estimates below this send no digest (a key got once in an interval is never its hottest)
RANK = 64  # the threshold follows the RANK-th largest estimate (a reader asking for more raises it: its limit)
RAISE_EVERY = 2048  # digest samples between two looks at the threshold
STEP_BITS = 8  # an estimate of 2^b is reported at multiples of 2^(b - STEP_BITS) (p4src's sketch_report_step)
KEYS_KEPT = 1 << 16  # candidates kept per epoch: a key first seen once this many are kept is dropped (counted)
LIST_SIZE, LIST_TIMEOUT_NS = 128, 100_000_000  # digest lists: up to 128 samples, none held over 100 ms
SETTLE_MAX = 5.0  # s a finished epoch's digests may take to come (PI holds a list up to 100 ms: its shortest)


class P4Sketch:
    """One switch's sketch over a primary P4Runtime connection; `servers` are the switch's server indexes' ip:port
    (the order of its `server_index` entries)."""

    def __init__(self, client: P4RuntimeClient, pipeline: Pipeline, servers: Sequence[str]):
        self.client, self.pipeline, self.servers = client, pipeline, list(servers)
        self.tables = P4Tables(client, pipeline)  # counters, read as the driver reads them
        # sketch_destinations: per epoch parity, a cell per server (MB_MAX_SERVERS), then one for anywhere else
        self.per_parity = pipeline.counter_size("sketch_destinations") // 2
        self.digest_id = pipeline.digest(DIGEST)
        # the running epoch number the switch tags cells with: from the clock, so that a later reader does not
        # take up an earlier one's numbers (whose cells still hold its counts) unless 2^16 flips have passed
        self.epoch = int(time.time() * 10) & 0xFFFF
        self.report_from = REPORT_FROM_LEAST
        self.rank = RANK
        self.on = False
        self.until_ns = 0
        self._deadline: threading.Timer | None = None
        self._unchecked = 0  # samples since the threshold was last looked at
        self._control = threading.Lock()  # one sketch_control write at a time (the reader's, the raiser's)
        self.candidates: dict[int, dict[bytes, HeavyKey]] = {}  # running epoch -> key -> its largest estimate
        self.received: dict[int, int] = {}  # running epoch -> its digest samples received
        self.dropped = 0
        self.samples = 0  # digest samples received, all epochs
        self._lock = threading.Lock()
        client.on_digest = self._on_digest
        try:
            client.write([e.update(e.INSERT, e.digest_entry(pipeline, DIGEST, LIST_TIMEOUT_NS, LIST_SIZE))],
                         "turning the sketch's digest on")
        except P4Error as err:
            if "ALREADY_EXISTS" not in str(err):
                raise
            client.write([e.update(e.MODIFY, e.digest_entry(pipeline, DIGEST, LIST_TIMEOUT_NS, LIST_SIZE))],
                         "turning the sketch's digest on")

    # --- what SketchReader calls ------------------------------------------------------------------------------
    def set_sketch_control(self, until_ns: int, parity: int) -> None:
        """Count in the epoch of this parity (a new running epoch, from REPORT_FROM_LEAST, when the parity changed)
        until `until_ns` (time.monotonic_ns here), or stop (0). The switch has no clock of ours: this side turns it
        off at the deadline unless a reader renews it, so a reader that dies stops the cost (as on eBPF)."""
        with self._control:
            self.on, self.until_ns = bool(until_ns), until_ns
            if self.on and parity & 1 != self.epoch & 1:
                self.epoch = (self.epoch + 1) & 0xFFFF
                self.report_from = REPORT_FROM_LEAST
            self._write_control()
            if self._deadline is not None:
                self._deadline.cancel()
            if self.on:
                self._deadline = threading.Timer(max(until_ns - time.monotonic_ns(), 0) / 1e9, self._expire)
                self._deadline.daemon = True
                self._deadline.start()

    def _expire(self) -> None:
        """The deadline passed and no reader renewed it: the switch stops counting."""
        with self._control:
            if not self.on or time.monotonic_ns() < self.until_ns:
                return
            self.on = False
            try:
                self._write_control()
                log.info("%s: the sketch is off: no reader renewed it", self.client.address)
            except P4Error as err:
                log.warning("%s: the sketch's deadline passed, but it could not be turned off: %s",
                            self.client.address, err)

    def _write_control(self) -> None:
        """Under _control: the switch's sketch_control as this side has it."""
        if not self.on:
            entity = e.default_action(self.pipeline, "sketch_control", "NoAction")
        else:
            entity = e.default_action(self.pipeline, "sketch_control", "sketch_on",
                                      {"epoch": self.epoch, "report_from": self.report_from})
        self.client.write([e.update(e.MODIFY, entity)], "the sketch's control")

    def clear_sketch(self, parity: int) -> None:
        """Forget the candidates of the epochs of this parity and zero its digest count. The cells need no zeroing: a
        new epoch starts them again, so clearing the parity being counted moves it to a new epoch (the next
        set_sketch_control's)."""
        if parity & 1 == self.epoch & 1:
            with self._control:
                self.epoch = (self.epoch + 2) & 0xFFFF
                self.report_from = REPORT_FROM_LEAST
        self.client.write([e.update(e.MODIFY, e.counter_write(self.pipeline, "sketch_digests", parity & 1))],
                          "zeroing the sketch's digest count")
        with self._lock:
            for epoch in [n for n in self.candidates if n & 1 == parity & 1]:
                del self.candidates[epoch]
            for epoch in [n for n in self.received if n & 1 == parity & 1]:
                del self.received[epoch]

    def heavy_keys(self, parity: int, limit: int) -> list[HeavyKey]:
        """The candidates of the latest epoch of this parity, largest estimate first, once every digest the switch
        counted for it has come (sketch_digests)."""
        self.rank = max(RANK, limit)
        epoch = self._latest(parity)
        sent = self.tables.count("sketch_digests", parity & 1)
        deadline = time.monotonic() + SETTLE_MAX
        while self.received.get(epoch, 0) < sent and time.monotonic() < deadline:
            time.sleep(0.005)
        if self.received.get(epoch, 0) < sent:
            log.warning("%s: %d of the sketch's %d digests of epoch %d did not come within %g s: read without them",
                        self.client.address, sent - self.received.get(epoch, 0), sent, epoch, SETTLE_MAX)
        with self._lock:
            return sorted(self.candidates.get(epoch, {}).values(), key=lambda h: h.count, reverse=True)[:limit]

    def take_sketch_destinations(self, parity: int) -> tuple[dict[str, int], int]:
        """The epoch's gets per server ip:port, and those to any other destination; zeroed as they are read."""
        base = (parity & 1) * self.per_parity
        read = self.client.read([e.counter_read(self.pipeline, "sketch_destinations")], "the sketch's destinations")
        counts = {r.counter_entry.index.index - base: r.counter_entry.data.packet_count for r in read
                  if base <= r.counter_entry.index.index < base + self.per_parity and r.counter_entry.data.packet_count}
        if counts:
            self.client.write([e.update(e.MODIFY, e.counter_write(self.pipeline, "sketch_destinations", base + i))
                               for i in counts], "zeroing the sketch's destinations")
        elsewhere = counts.pop(self.per_parity - 1, 0)
        per_server: dict[str, int] = {}
        for index, gets in counts.items():
            where = self.servers[index] if index < len(self.servers) else f"server {index}"
            per_server[where] = per_server.get(where, 0) + gets
        return per_server, elsewhere

    def counters(self) -> dict[str, int]:
        return self.tables.counters()

    def close(self) -> None:
        self.client.on_digest = None
        if self._deadline is not None:
            self._deadline.cancel()

    # --- digests ----------------------------------------------------------------------------------------------
    def _latest(self, parity: int) -> int:
        """The running epoch of this parity that was counted last (the current one, or the one before it)."""
        return self.epoch if self.epoch & 1 == parity & 1 else (self.epoch - 1) & 0xFFFF

    def _on_digest(self, digest_id: int, samples: list[tuple[int, ...]]) -> None:
        if digest_id != self.digest_id:
            return
        with self._lock:
            self.samples += len(samples)
            for epoch, estimate, ip, port, key_len, key in samples:
                self.received[epoch] = self.received.get(epoch, 0) + 1
                kept = self.candidates.setdefault(epoch, {})
                name = key.to_bytes(key_len, "big") if 0 < key_len <= MAX_KEY else None
                if name is None:
                    continue
                known = kept.get(name)
                if known is None and len(kept) >= KEYS_KEPT:
                    self.dropped += 1
                elif known is None or estimate > known.count:
                    kept[name] = HeavyKey(name, estimate, f"{socket.inet_ntoa(ip.to_bytes(4, 'big'))}:{port}")
            self._unchecked += len(samples)
            raise_to = self._raise_to() if self._unchecked >= RAISE_EVERY else None
        if raise_to is not None:
            with self._control:
                if self.on and raise_to[0] == self.epoch and raise_to[1] > self.report_from:
                    lower, self.report_from = self.report_from, raise_to[1]
                    try:
                        self._write_control()
                    except P4Error as err:  # a lower threshold only costs digests
                        self.report_from = lower
                        log.info("the sketch's threshold stays at %d: %s", lower, err)

    def _raise_to(self) -> tuple[int, int] | None:
        """Under _lock: (epoch, the RANK-th largest estimate reported in the current epoch), if it has that many."""
        self._unchecked = 0
        kept = self.candidates.get(self.epoch, {})
        if len(kept) < self.rank:
            return None
        return self.epoch, heapq.nlargest(self.rank, (h.count for h in kept.values()))[-1]
