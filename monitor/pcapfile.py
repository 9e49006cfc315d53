"""Read pcap and pcapng capture files: (timestamp, link type, frame) for every packet.

A file that cannot be read as either format raises PcapError with the reason. A last record cut short (a capture
killed mid-write) ends the reading with `truncated` set, as tcpdump and Wireshark tolerate it.
"""
from __future__ import annotations

import struct
from pathlib import Path
from typing import BinaryIO, Iterator

PCAP_MAGICS = {b"\xa1\xb2\xc3\xd4": (">", 1e-6), b"\xd4\xc3\xb2\xa1": ("<", 1e-6),
               b"\xa1\xb2\x3c\x4d": (">", 1e-9), b"\x4d\x3c\xb2\xa1": ("<", 1e-9)}
PCAPNG_SHB = b"\x0a\x0d\x0d\x0a"
PCAPNG_BYTE_ORDER = 0x1A2B3C4D
PCAPNG_IDB, PCAPNG_SPB, PCAPNG_EPB = 1, 3, 6
MAX_BLOCK = 1 << 26  # 64 MB: a larger length means a corrupt file, not a packet

Packet = tuple[float, int, bytes]


class PcapError(ValueError):
    """The file is missing or is not a readable pcap/pcapng capture."""


class CaptureFile:
    """Iterate over the packets of a pcap or pcapng file."""

    def __init__(self, path: Path | str):
        self.path = Path(path)
        self.truncated = False
        try:
            self._file: BinaryIO = open(self.path, "rb")
        except OSError as err:
            raise PcapError(f"cannot open {self.path}: {err.strerror}") from None
        magic = self._file.read(4)
        if magic in PCAP_MAGICS:
            self._packets = self._pcap(*PCAP_MAGICS[magic])
        elif magic == PCAPNG_SHB:
            self._packets = self._pcapng()
        else:
            self._file.close()
            raise PcapError(f"{self.path} is not a pcap or pcapng file (starts with {magic.hex() or 'nothing'})")

    def __iter__(self) -> Iterator[Packet]:
        try:
            yield from self._packets
        finally:
            self._file.close()

    def _read(self, size: int) -> bytes | None:
        data = self._file.read(size)
        if len(data) == size:
            return data
        self.truncated = bool(data)
        return None

    def _pcap(self, order: str, unit: float) -> Iterator[Packet]:
        header = self._read(20)
        if header is None:
            raise PcapError(f"{self.path}: pcap header cut short")
        linktype = struct.unpack(order + "HHiIII", header)[5] & 0x0FFFFFFF
        record = struct.Struct(order + "IIII")
        while (head := self._read(16)) is not None:
            seconds, fraction, captured, _ = record.unpack(head)
            if captured > MAX_BLOCK:
                raise PcapError(f"{self.path}: corrupt record of {captured} bytes")
            frame = self._read(captured)
            if frame is None:
                self.truncated = True
                return
            yield seconds + fraction * unit, linktype, frame

    def _pcapng(self) -> Iterator[Packet]:
        order, interfaces = self._section_header()
        while (head := self._read(8)) is not None:
            kind, length = struct.unpack(order + "II", head)
            if head[:4] == PCAPNG_SHB:  # a new section may change the byte order
                order, interfaces = self._section_header(after_type=head[4:])
                continue
            if length < 12 or length % 4 or length > MAX_BLOCK:
                raise PcapError(f"{self.path}: corrupt pcapng block of length {length}")
            body = self._read(length - 8)
            if body is None:
                self.truncated = True
                return
            if kind == PCAPNG_IDB:
                interfaces.append(self._interface(order, body))
            elif kind == PCAPNG_EPB:
                interface, high, low, captured = struct.unpack_from(order + "IIII", body)
                if interface >= len(interfaces):
                    raise PcapError(f"{self.path}: packet names interface {interface}, which is not described")
                linktype, unit = interfaces[interface]
                yield ((high << 32) | low) * unit, linktype, body[20:20 + captured]
            elif kind == PCAPNG_SPB and interfaces:
                yield 0.0, interfaces[0][0], body[4:-4]

    def _section_header(self, after_type: bytes = b"") -> tuple[str, list[tuple[int, float]]]:
        """Read the rest of a section header block (its type already read, and `after_type` of what follows)."""
        rest = self._read(8 - len(after_type))
        if rest is None:
            raise PcapError(f"{self.path}: pcapng section header cut short")
        head = after_type + rest  # block length, byte-order magic
        order = "<" if struct.unpack("<I", head[4:8])[0] == PCAPNG_BYTE_ORDER else ">"
        if struct.unpack(order + "I", head[4:8])[0] != PCAPNG_BYTE_ORDER:
            raise PcapError(f"{self.path}: pcapng section header has no byte-order magic")
        length = struct.unpack(order + "I", head[:4])[0]
        if length < 28 or length % 4 or length > MAX_BLOCK or self._read(length - 12) is None:
            raise PcapError(f"{self.path}: corrupt pcapng section header")
        return order, []

    @staticmethod
    def _interface(order: str, body: bytes) -> tuple[int, float]:
        """Link type and timestamp unit (if_tsresol option; microseconds by default)."""
        linktype = struct.unpack_from(order + "H", body)[0]
        unit, position = 1e-6, 8
        while position + 4 <= len(body) - 4:
            code, size = struct.unpack_from(order + "HH", body, position)
            if code == 0:
                break
            if code == 9 and size >= 1:
                resolution = body[position + 4]
                unit = 2.0 ** -(resolution & 0x7F) if resolution & 0x80 else 10.0 ** -resolution
            position += 4 + (size + 3) // 4 * 4
        return linktype, unit
