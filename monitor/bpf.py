"""The classic BPF program the kernel runs on the capture socket, so Python only sees what it will count.

Keeps IPv4 UDP/TCP packets to the memcached port that were received (not sent) on the interface, first fragments
only; with sample k > 1 it keeps one in k of them at random (the kernel's random number, SKF_AD_RANDOM), so the
monitor's cost falls by k while the counts, scaled by k, stay unbiased. Frames are Ethernet-framed (Ethernet
interfaces, veth, loopback).
"""
from __future__ import annotations

import struct

# instruction classes and modes (linux/filter.h)
LD_H_ABS, LD_B_ABS, LD_W_ABS, LD_H_IND, LDX_B_MSH = 0x28, 0x30, 0x20, 0x48, 0xB1
JEQ_K, JSET_K, ALU_MOD_K, RET_K = 0x15, 0x45, 0x94, 0x06
SKF_AD_OFF = -0x1000
SKF_AD_PKTTYPE, SKF_AD_RANDOM = 4, 56
PACKET_OUTGOING = 4
SNAPLEN = 65535
INSTRUCTION = struct.Struct("HBBI")


def request_filter(port: int, sample: int = 1) -> list[tuple[int, int, int, int]]:
    """(code, jump if true, jump if false, k) instructions; jumps are relative to the next instruction."""
    if not 0 < port < 65536 or sample < 1:
        raise ValueError("port must be 1-65535 and sample at least 1")
    ancillary = (SKF_AD_OFF + SKF_AD_PKTTYPE) & 0xFFFFFFFF
    body = [
        (LD_W_ABS, 0, 0, ancillary),      # direction of the packet
        (JEQ_K, "drop", 0, PACKET_OUTGOING),
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
        body += [(LD_W_ABS, 0, 0, (SKF_AD_OFF + SKF_AD_RANDOM) & 0xFFFFFFFF),
                 (ALU_MOD_K, 0, 0, sample),
                 (JEQ_K, 0, "drop", 0)]
    body += [(RET_K, 0, 0, SNAPLEN), (RET_K, 0, 0, 0)]
    drop = len(body) - 1
    return [(code, _jump(jt, i, drop), _jump(jf, i, drop), k) for i, (code, jt, jf, k) in enumerate(body)]


def _jump(target, index: int, drop: int) -> int:
    return drop - index - 1 if target == "drop" else target


def assemble(program: list[tuple[int, int, int, int]]) -> bytes:
    return b"".join(INSTRUCTION.pack(*instruction) for instruction in program)
