"""The P4 data plane: p4src/mbalancer.p4 on bmv2's simple_switch_grpc, driven over P4Runtime.

pipeline.py  the compiled program (committed: p4src/compiled/, P4Info and bmv2 JSON), its names and ids, p4c
client.py    one P4Runtime connection: arbitration, pipeline push, writes, reads, PacketIn/PacketOut
bmv2.py      run simple_switch_grpc on a set of interfaces (topologies and tests)
entries.py   table entries and counters by name
driver.py    the controller's driver over P4Runtime
sketch.py    the switch's hot-key sketch (digests of heavy keys), as monitor/dataplane.py's SketchReader reads it
netns_switch.py, mininet_switch.py  the switch of the namespace and Mininet topologies

bmv2 and p4c come from p4lang (packages or your own build), not
from this repository: `simple_switch_grpc` and `p4c` on PATH (`make p4` and `make p4c` build them).
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Settings:
    """The config's [dataplane.p4] section."""
    # P4Runtime servers, "HOST:PORT" each (simple_switch_grpc --grpc-server-addr); every hot key is written to all
    switches: tuple[str, ...] = ("127.0.0.1:9559",)
    device_id: int = 1  # the P4Runtime device id of every switch (simple_switch_grpc --device-id)
    cpu_port: int = 255  # simple_switch_grpc --cpu-port: where PacketIn/PacketOut go (the program's MB_CPU_PORT)
    # the switch's data ports, for flooding; empty: the flood group the switch already has (a switch node's start
    # writes one, in a fabric a flood tree), else 1..16
    ports: tuple[int, ...] = ()
    timeout: float = 5.0  # seconds a P4Runtime call may take before the driver gives up on it
    parallel: int = 16  # switches written at once, one request in flight each (1: one after the other)
    trusted: tuple[str, ...] = field(default=())  # extra controller addresses whose copies never make a server unsure
    # P4Runtime arbitration: 0, the first controller to come stays primary; an etcd election sets its own (above)
    election_id: int = 0
