"""The switch agent: a box's data plane driven from another box.

The eBPF switch keeps its tables in pinned BPF maps, reached only on the box itself; the agent (`mbalancer switch
serve`) runs on that box, owns its data plane's driver (any with a driver outside ryu-manager: not OpenFlow yet), and
serves the driver interface (dataplanes/driver.py) over gRPC, so a controller elsewhere drives it as `[dataplane]
kind = "agent"`. Why the driver interface and not P4Runtime with MBalancer's P4Info (what Stratum does): the eBPF
maps and OpenFlow's groups are not P4 tables (whole keys in one hash map, per-CPU counters, the sketch in maps a
reader polls, flows and groups per key), so a P4Runtime agent would translate every P4 entity into another
pipeline's layout and back; the driver interface is already the one boundary all three data planes implement, and
what travels is what the core asks. bmv2 is reached through P4Runtime as before (it is remote already).

codec.py   the driver interface's values as JSON, only the types it names (no pickle from the network)
server.py  the agent: authenticates, arbitrates between controllers by election id, runs the local driver
client.py  the controller's driver for an agent (`kind = "agent"`), reconnecting when the agent comes back
fabric.py  a fabric of boxes (`boxes`), one agent each, driven as one data plane: each key at its home's leaf

Wire: service mbalancer.agent.v1.SwitchAgent, methods Hello (what the agent runs), Call (one driver call) and Stream
(the primary controller's events: mirrored writes, reconnects). Every request carries the protocol version, the
shared token (or a TLS client certificate does) and the caller's election id in its metadata.
"""
from __future__ import annotations

from dataclasses import dataclass

DEFAULT_PORT = 9600


@dataclass(frozen=True)
class Settings:
    """The config's [dataplane.agent] section: the controller's side (address, kind, election_id) and the agent's
    (listen); the token and TLS files on both."""
    address: str = f"127.0.0.1:{DEFAULT_PORT}"  # controller: the agent to drive, host:port
    # controller, a fabric instead (dataplanes/agent/fabric.py): one agent per box, "host:port srv1 srv2", the
    # servers cabled to that box named (none: a spine)
    boxes: tuple[str, ...] = ()
    kind: str = ""  # controller: the data plane the agent must run (e.g. "ebpf"); empty: whichever it runs
    election_id: int = 1  # controller: the highest an agent has seen drives it; a lower one is refused
    listen: str = f"127.0.0.1:{DEFAULT_PORT}"  # agent: where it serves; off loopback only with a token or TLS
    token_file: str = ""  # both: a file holding the shared secret (one line); empty: no token
    tls_cert: str = ""  # agent: its certificate (PEM); controller: its client certificate
    tls_key: str = ""  # the private key of tls_cert
    tls_ca: str = ""  # the CA that signed the other side's certificate; the agent then requires client certificates
    max_message: int = 4 << 20  # bytes one request or answer may take (a counters read of 4096 keys: ~1 MB)
    timeout: float = 10.0  # controller: seconds a call may take
    parallel: int = 16  # controller, a fabric: boxes written at once, one call in flight each (1: one after another)
