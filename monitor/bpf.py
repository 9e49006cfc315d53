"""The classic BPF program the kernel runs on the capture socket, so Python only sees what it will count.

Keeps IPv4 UDP/TCP packets to the memcached port that were received (not sent) on the interface (or on any of a set
of interfaces, by ifindex, for a socket that listens on all of them), first fragments only; with sample k > 1 it keeps one in k of them at random (the kernel's random number, SKF_AD_RANDOM), so the
monitor's cost falls by k while the counts, scaled by k, stay unbiased. Frames are Ethernet-framed (Ethernet
interfaces, veth, loopback).
"""
from __future__ import annotations

import struct

# instruction classes and modes (linux/filter.h)
LD_H_ABS, LD_B_ABS, LD_W_ABS, LD_H_IND, LDX_B_MSH = 0x28, 0x30, 0x20, 0x48, 0xB1
JEQ_K, JSET_K, ALU_MOD_K, RET_K = 0x15, 0x45, 0x94, 0x06
SKF_AD_OFF = -0x1000
SKF_AD_PKTTYPE, SKF_AD_IFINDEX, SKF_AD_RANDOM = 4, 8, 56
PACKET_OUTGOING = 4
SNAPLEN = 65535
MAX_INTERFACES = 200
INSTRUCTION = struct.Struct("HBBI")


def request_filter(port: int, sample: int = 1, ifindexes: tuple[int, ...] = ()) -> list[tuple[int, int, int, int]]:
    """(code, jump if true, jump if false, k) instructions; jumps are relative to the next instruction.
    ifindexes: keep only packets received on these interfaces (empty: any)."""
    if not 0 < port < 65536 or sample < 1:
        raise ValueError("port must be 1-65535 and sample at least 1")
    if len(ifindexes) > MAX_INTERFACES:
        raise ValueError(f"at most {MAX_INTERFACES} interfaces (a jump spans at most 255 instructions)")
    body = [
        (LD_W_ABS, 0, 0, _ancillary(SKF_AD_PKTTYPE)),  # direction of the packet
        (JEQ_K, "drop", 0, PACKET_OUTGOING),
        *_any_interface_of(ifindexes),
        (LD_H_ABS, 0, 0, 12),             # ethertype
        (JEQ_K, 0, "drop", 0x0800),
        (LD_B_ABS, 0, 0, 23),             # IP protocol
        (JEQ_K, 1, 0, 17),                # UDP
        (JEQ_K, 0, "drop", 6),            # TCP
        (LD_H_ABS, 0, 0, 20),             # flags and fragment offset
        (JSET_K, "drop", 0, 0x1FFF),
        (LDX_B_MSH, 0, 0, 14),            # X = IP header length
        (LD_H_IND, 0, 0, 16),             # destination port
        (JEQ_K, 0, "drop", port),
    ]
    if sample > 1:
        body += [(LD_W_ABS, 0, 0, _ancillary(SKF_AD_RANDOM)),
                 (ALU_MOD_K, 0, 0, sample),
                 (JEQ_K, 0, "drop", 0)]
    body += [(RET_K, 0, 0, SNAPLEN), (RET_K, 0, 0, 0)]
    drop = len(body) - 1
    return [(code, _jump(jt, i, drop), _jump(jf, i, drop), k) for i, (code, jt, jf, k) in enumerate(body)]


def _ancillary(field: int) -> int:
    return (SKF_AD_OFF + field) & 0xFFFFFFFF


def _any_interface_of(ifindexes: tuple[int, ...]) -> list[tuple]:
    """Continue past this block if the packet's ifindex is one of `ifindexes`, else drop."""
    if not ifindexes:
        return []
    block = [(LD_W_ABS, 0, 0, _ancillary(SKF_AD_IFINDEX))]
    for i, ifindex in enumerate(ifindexes):
        last = i == len(ifindexes) - 1
        block.append((JEQ_K, len(ifindexes) - 1 - i, "drop" if last else 0, ifindex))
    return block


def _jump(target, index: int, drop: int) -> int:
    return drop - index - 1 if target == "drop" else target


def assemble(program: list[tuple[int, int, int, int]]) -> bytes:
    return b"".join(INSTRUCTION.pack(*instruction) for instruction in program)
