"""Where `mbalancer switch attach --dataplane openflow` puts the key classifier on each kind of port, the settings that
name the bridge, the agent's port flags, and the record of what attach made (read back as the eBPF switch's is), as
plain logic (the userspace datapath on real ports:
tests/test_openflow_attach.py; the flags restored after a restart: tests/test_openflow_fabric_restart.py)."""
from __future__ import annotations

import pytest

from dataplanes.driver import DriverError
from dataplanes.openflow import Settings, port_flags
from dataplanes.bpf import records
from dataplanes.openflow import standalone
from dataplanes.openflow.box import BoxError, Hook, hook_of


def port(name: str, kind: str = "", ofport=1, error=None) -> dict:
    return {"name": name, "type": kind, "ofport": ofport, "error": error}


def test_on_the_kernel_datapath_the_classifier_runs_at_tc_ingress_of_each_port():
    """The kernel datapath's rx handler runs after tc ingress: the port itself, whatever it is (NIC or veth)."""
    assert hook_of("br0", "system", port("eth1")) == Hook("eth1", "ingress")
    assert hook_of("br0", "system", port("eth2", "system")) == Hook("eth2", "ingress")


def test_on_the_userspace_datapath_it_runs_at_xdp_of_each_port():
    """The userspace datapath reads a port through AF_PACKET, which sees a frame before tc ingress, after XDP."""
    assert hook_of("br0", "netdev", port("eth1")) == Hook("eth1", "xdp")
    assert hook_of("br0", "netdev", port("eth1")).describe() == "XDP of eth1"


@pytest.mark.parametrize("datapath", ["system", "netdev"])
def test_an_internal_port_gets_it_at_tc_egress_on_either_datapath(datapath):
    """What this box's own stack sends into the switch leaves through the internal port's transmit path."""
    assert hook_of("br0", datapath, port("br0", "internal")) == Hook("br0", "egress")
    assert hook_of("br0", "netdev", port("tap7", "tap")).direction == "egress"


@pytest.mark.parametrize("kind", ["dpdk", "dpdkvhostuserclient", "afxdp", "vxlan", "geneve", "patch"])
def test_ports_that_no_kernel_hook_sees_first_are_refused_in_one_line(kind):
    with pytest.raises(BoxError, match=f"port p1 of bridge br0 is of type {kind}: .* no key classifier can run"):
        hook_of("br0", "netdev", port("p1", kind))


@pytest.mark.parametrize("gone", [port("eth9", ofport=-1, error="could not open network device eth9 (No such device)"),
                                  port("eth9", ofport=None)])
def test_a_port_whose_interface_is_gone_is_refused(gone):
    with pytest.raises(BoxError, match="port eth9 of bridge br0 is gone .*ovs-vsctl del-port br0 eth9"):
        hook_of("br0", "system", gone)


def test_the_bridge_and_run_directory_come_from_connect_unless_given():
    assert Settings(connect="unix:/var/run/openvswitch/br0.mgmt").box() == ("br0", "/var/run/openvswitch")
    assert Settings(connect="unix:/run/x/leaf1-of.mgmt", bridge="other").box() == ("other", "/run/x")
    assert Settings(connect="tcp:127.0.0.1:6634").box() == ("", "/var/run/openvswitch")
    assert Settings(bridge="br1", ovs_rundir="/srv/ovs").box() == ("br1", "/srv/ovs")


def test_port_flags_are_read_as_openflow_1_0_config_bits():
    flags = port_flags.parse(["leaf1-eth3 no-flood", "leaf1-eth4 no-flood no-packet-in"])
    assert flags == {"leaf1-eth3": 1 << 4, "leaf1-eth4": (1 << 4) | (1 << 6)}
    assert port_flags.describe(flags) == "leaf1-eth3 no-flood, leaf1-eth4 no-flood no-packet-in"


@pytest.mark.parametrize("entries, words", [
    (["eth3"], "'eth3'"), (["eth3 no-flod"], "(not no-flod)"), (["eth3 no-flood", "eth3 down"], "each port once")])
def test_bad_port_flags_are_one_line_naming_the_entry(entries, words):
    with pytest.raises(DriverError, match="dataplane.openflow.port_flags: ") as raised:
        port_flags.parse(entries)
    assert words in str(raised.value) and "\n" not in str(raised.value)


def test_port_flags_need_a_direct_connection():
    from dataplanes.openflow.driver import OpenflowDriver
    with pytest.raises(DriverError, match="port_flags: set by a direct connection"):
        OpenflowDriver(Settings(port_flags=("eth3 no-flood",)), channel=None)


def test_attachs_record_is_read_back_as_written_and_a_broken_one_as_none(tmp_path, monkeypatch):
    """A record detach cannot read is none (records.read_record): detach then removes what the pins say, nothing
    else, and never fails on the file."""
    monkeypatch.setattr(records, "RECORDS", tmp_path)
    monkeypatch.setattr(standalone, "RECORDS", tmp_path)
    written = standalone.ClassifierRecord("c1", "br0", "netdev", "/run/ovs", (11211,), (Hook("p1", "xdp"),),
                                          ("p1",), 1.5)
    written.write()
    assert standalone.ClassifierRecord.read("c1") == written and standalone.ClassifierRecord.read("c2") is None
    path = standalone.record_path("c1")
    text = path.read_text()
    for broken in (text[:len(text) // 2], text.replace('"bridge"', '"bridges"'),
                   text.replace('[{"port": "p1", "direction": "xdp"}]', '["p1"]'), "[]"):
        assert broken != text
        path.write_text(broken)
        assert standalone.ClassifierRecord.read("c1") is None, broken
