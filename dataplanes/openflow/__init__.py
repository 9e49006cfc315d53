"""The OpenFlow data plane: Open vSwitch (userspace datapath) driven by the Ryu app or directly, plus a key classifier.

A plain OpenFlow switch cannot read a memcached key, so the key match is its own, swappable step: the classifier
(the eBPF program built with -DMB_CLASSIFIER: the same parser, dirty state, lease and counters) runs at tc egress
on the wire side of every switch port and writes a tag into a MAC address; the switch's OpenFlow rules act on the
tags (replica choice by a select group, rewrites, copies to the controller, reply sources, L2). A switch that can
match the payload (the thesis's experimenter match) would replace the classifier and match the key itself.

tags.py      the tag layout, shared with the C program
ovs.py       a private Open vSwitch (its own ovsdb-server and ovs-vswitchd, netdev datapath) and its bridges
messages.py  every OpenFlow message the driver sends (Ryu's OpenFlow 1.5 parser), faucet's valve_of.py way
weights.py   bucket weights that make OVS's hash selection give the core's shares
classifier.py load the classifier (dataplanes/bpf/, shared with the eBPF switch) on the wire side of a switch's ports
box.py, standalone.py  the classifier on a bridge of this box's own Open vSwitch: `mbalancer switch attach --dataplane
             openflow` (where on each port it must run, kernel or userspace datapath; the record detach undoes)
driver.py    the controller's driver, run inside ryu-manager by controller/ryu_app.py, or on the switch's box
bridge_connection.py  the driver's direct OpenFlow connection to a bridge on its box (no ryu-manager between)
port_flags.py  port flags (no-flood) set again on every connection to a bridge, over OpenFlow 1.0
wire.py      reading OpenFlow off a socket (both connections above)
netns_switch.py, mininet_switch.py  the switch of the namespace and Mininet topologies
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

SELECTIONS = ("hash", "dp_hash", "default")


@dataclass(frozen=True)
class Settings:
    """The config's [dataplane.openflow] section."""
    classifier: str = "of0"  # the key classifier's name: its maps under /sys/fs/bpf/mbalancer-classifier/<name>/
    # How a hot key's select group picks a bucket (OpenFlow 1.5, OVS's selection methods): hash = a hash of the
    # classifier's tag, which carries a hash of request id and client (per request, weighted); dp_hash = the
    # datapath's 5-tuple hash (per client socket); default = OVS's own (IP addresses: per client host).
    selection: str = "hash"
    listen: str = "127.0.0.1:6653"  # where ryu-manager takes switch connections (its --ofp-listen-host/port)
    # The bridge driven directly, without ryu-manager (the switch agent, or `mbalancer controller` on the switch's
    # box): "unix:<OVS rundir>/<bridge>.mgmt" (the bridge's management socket) or "tcp:HOST:PORT" (a ptcp: target).
    connect: str = ""
    # the controller's addresses whose copies never make a server unsure, beside this machine's own (a controller on
    # another box, reaching the switch through its agent: its address towards the servers)
    trusted: tuple[str, ...] = ()
    # `mbalancer switch attach --dataplane openflow`: the bridge whose ports get the key classifier; empty: the one
    # `connect` names (unix:<rundir>/<bridge>.mgmt)
    bridge: str = ""
    # Open vSwitch's run directory (db.sock, ovs-vswitchd.pid); empty: connect's directory, else /var/run/openvswitch
    ovs_rundir: str = ""
    # the datapath the bridge must run for attach: "system" (the kernel's), "netdev" (userspace); empty: either
    datapath: str = ""
    # port flags a direct connection (the switch agent) sets on the bridge's ports and sets again each time
    # ovs-vswitchd comes back (which forgets them): "PORT FLAG ...", flags of OpenFlow 1.0's port config (no-flood,
    # no-receive, no-forward, no-packet-in, down), e.g. "leaf1-eth3 no-flood" on a fabric's second uplink
    port_flags: tuple[str, ...] = ()

    def box(self) -> tuple[str, str]:
        """(bridge, Open vSwitch run directory) for `switch attach`: as given, else as `connect` names them."""
        path = self.connect.removeprefix("unix:") if self.connect.startswith("unix:") else ""
        named = Path(path).name.removesuffix(".mgmt") if path.endswith(".mgmt") else ""
        return self.bridge or named, self.ovs_rundir or (str(Path(path).parent) if named else "/var/run/openvswitch")
