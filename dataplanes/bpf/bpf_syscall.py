"""The bpf(2) system call from Python, for the few commands the control library needs.

Why the raw syscall (through ctypes) and not bpftool or a libbpf binding: a hot-key change writes a handful of map
entries and must take microseconds, not a bpftool process each (milliseconds); Debian ships no Python binding of
libbpf, and the maps are pinned by bpftool at load time, so opening them by path is all that is needed. Loading
the program stays with bpftool (once per switch), which already knows ELF, BTF and relocations.
"""
from __future__ import annotations

import ctypes
import os
import platform
import struct
from dataclasses import dataclass

SYS_BPF = {"x86_64": 321, "aarch64": 280}.get(platform.machine(), 321)
BPF_MAP_LOOKUP_ELEM, BPF_MAP_UPDATE_ELEM, BPF_MAP_DELETE_ELEM, BPF_MAP_GET_NEXT_KEY = 1, 2, 3, 4
BPF_OBJ_GET, BPF_PROG_TEST_RUN, BPF_OBJ_GET_INFO_BY_FD = 7, 10, 15
BPF_ANY, BPF_EXIST = 0, 2  # update flags: any, only over an existing entry
PERCPU_TYPES = {5, 6, 10}  # PERCPU_HASH, PERCPU_ARRAY, LRU_PERCPU_HASH

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class BpfError(OSError):
    """A bpf() call failed; errno and the operation are in the message."""


def _bpf(command: int, attr: ctypes.Array, what: str) -> int:
    result = _libc.syscall(SYS_BPF, command, ctypes.byref(attr), ctypes.sizeof(attr))
    if result < 0:
        errno = ctypes.get_errno()
        raise BpfError(errno, f"bpf {what}: {os.strerror(errno)}")
    return result


def _attr(size: int = 128) -> ctypes.Array:
    return ctypes.create_string_buffer(size)


def _address(buffer: ctypes.Array | None) -> int:
    return ctypes.addressof(buffer) if buffer is not None else 0


def obj_get(path: str) -> int:
    """A file descriptor for a pinned map or program."""
    name = ctypes.create_string_buffer(os.fsencode(path))
    attr = _attr()
    struct.pack_into("=QII", attr, 0, _address(name), 0, 0)
    return _bpf(BPF_OBJ_GET, attr, f"open {path}")


@dataclass(frozen=True)
class MapInfo:
    type: int
    id: int  # the kernel's id of the map: a reloaded switch has new maps behind the same pins
    key_size: int
    value_size: int
    max_entries: int
    name: str


def map_info(fd: int) -> MapInfo:
    info = _attr(96)
    attr = _attr()
    struct.pack_into("=IIQ", attr, 0, fd, len(info), _address(info))
    _bpf(BPF_OBJ_GET_INFO_BY_FD, attr, "map info")
    kind, map_id, key_size, value_size, max_entries, _ = struct.unpack_from("=6I", info, 0)
    name = bytes(info[24:40]).split(b"\0")[0].decode()
    return MapInfo(kind, map_id, key_size, value_size, max_entries, name)


VERIFIED_INSNS_AT = 216  # offset of verified_insns in struct bpf_prog_info (linux/bpf.h, kernel 5.16+)
VERIFIER_LIMIT = 1_000_000  # BPF_COMPLEXITY_LIMIT_INSNS: instructions the verifier walks before it gives up


def prog_verified_insns(fd: int) -> int:
    """Instructions the verifier walked to accept the program (0 on a kernel older than 5.16)."""
    info = _attr(VERIFIED_INSNS_AT + 8)
    attr = _attr()
    struct.pack_into("=IIQ", attr, 0, fd, len(info), _address(info))
    _bpf(BPF_OBJ_GET_INFO_BY_FD, attr, "program info")
    return struct.unpack_from("=I", info, VERIFIED_INSNS_AT)[0]


def pinned_map_id(path: str) -> int | None:
    """The id of the map pinned at `path`, or None when nothing is pinned there (the switch is gone)."""
    try:
        fd = obj_get(path)
    except BpfError:
        return None
    try:
        return map_info(fd).id
    finally:
        os.close(fd)


def possible_cpus() -> int:
    """Per-CPU maps hold one value per possible CPU (not online CPU)."""
    text = open("/sys/devices/system/cpu/possible").read().strip()
    return sum(int(b) - int(a) + 1 if "-" in part else 1
               for part in text.split(",") for a, _, b in [part.partition("-")] for b in [b or a])


class BpfMap:
    """One pinned map: lookup/update/delete by bytes; per-CPU maps read as a list of per-CPU values."""

    def __init__(self, path: str):
        self.path = path
        self.fd = obj_get(path)
        self.info = map_info(self.fd)
        self.percpu = self.info.type in PERCPU_TYPES
        self.cpus = possible_cpus() if self.percpu else 1
        self._slot = (self.info.value_size + 7) // 8 * 8 if self.percpu else self.info.value_size

    def lookup(self, key: bytes) -> bytes | list[bytes] | None:
        key_buffer, value = self._key(key), _attr(self._slot * self.cpus)
        attr = _attr()
        struct.pack_into("=IIQQQ", attr, 0, self.fd, 0, _address(key_buffer), _address(value), 0)
        try:
            _bpf(BPF_MAP_LOOKUP_ELEM, attr, f"lookup in {self.info.name}")
        except BpfError as err:
            if err.errno == 2:  # ENOENT
                return None
            raise
        raw = bytes(value)
        if self.percpu:
            return [raw[i * self._slot:i * self._slot + self.info.value_size] for i in range(self.cpus)]
        return raw[:self.info.value_size]

    def update(self, key: bytes, value: bytes, flags: int = BPF_ANY) -> None:
        if len(value) != self.info.value_size:
            raise ValueError(f"{self.info.name}: value of {len(value)} bytes, map holds {self.info.value_size}")
        if self.percpu:
            value = b"".join(value.ljust(self._slot, b"\0") for _ in range(self.cpus))
        key_buffer, value_buffer = self._key(key), ctypes.create_string_buffer(value, len(value))
        attr = _attr()
        struct.pack_into("=IIQQQ", attr, 0, self.fd, 0, _address(key_buffer), _address(value_buffer), flags)
        _bpf(BPF_MAP_UPDATE_ELEM, attr, f"update {self.info.name}")

    def delete(self, key: bytes) -> bool:
        """False if the key was not there."""
        key_buffer = self._key(key)
        attr = _attr()
        struct.pack_into("=IIQ", attr, 0, self.fd, 0, _address(key_buffer))
        try:
            _bpf(BPF_MAP_DELETE_ELEM, attr, f"delete from {self.info.name}")
            return True
        except BpfError as err:
            if err.errno == 2:
                return False
            raise

    def keys(self) -> list[bytes]:
        found, key = [], None
        while True:
            current, following = (self._key(key) if key is not None else None), _attr(self.info.key_size)
            attr = _attr()
            struct.pack_into("=IIQQ", attr, 0, self.fd, 0, _address(current), _address(following))
            try:
                _bpf(BPF_MAP_GET_NEXT_KEY, attr, f"walk {self.info.name}")
            except BpfError as err:
                if err.errno == 2:
                    return found
                raise
            key = bytes(following)
            found.append(key)

    def close(self) -> None:
        os.close(self.fd)

    def _key(self, key: bytes) -> ctypes.Array:
        if len(key) != self.info.key_size:
            raise ValueError(f"{self.info.name}: key of {len(key)} bytes, map wants {self.info.key_size}")
        return ctypes.create_string_buffer(key, len(key))


@dataclass(frozen=True)
class TestRun:
    verdict: int  # the program's return value (TC_ACT_*)
    packet: bytes  # the packet as the program left it
    duration_ns: int = 0  # the kernel's own timing of the run (ktime around the program, no syscall)


def prog_test_run(prog_fd: int, packet: bytes, out_size: int = 4096, repeat: int = 1) -> TestRun:
    """Run a loaded program on `packet` in the kernel (BPF_PROG_TEST_RUN); maps are the real ones. With repeat > 1
    the kernel runs it that many times, each run on the packet as the one before left it; duration_ns is then the
    mean per run."""
    data_in = ctypes.create_string_buffer(packet, len(packet))
    data_out = _attr(out_size)
    attr = _attr()
    struct.pack_into("=IIIIQQII", attr, 0, prog_fd, 0, len(packet), out_size, _address(data_in),
                     _address(data_out), repeat, 0)
    _bpf(BPF_PROG_TEST_RUN, attr, "test run")
    verdict, _, size_out = struct.unpack_from("=III", attr, 4)
    duration = struct.unpack_from("=I", attr, 36)[0]  # after prog_fd, retval, sizes, data_in/out, repeat
    return TestRun(verdict, bytes(data_out[:size_out]), duration)
