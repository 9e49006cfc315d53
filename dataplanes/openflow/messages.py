"""Every OpenFlow message the OpenFlow driver sends, built with Ryu's OpenFlow 1.5 parser (faucet's valve_of.py
way: one module, small functions returning messages; the driver decides, the Ryu app sends).

The pipeline, three tables:
  LEARN (0)  source MAC -> in_port learned into L2 (OVS's learn action), unless the source is a tag
  TAGS  (1)  the classifier's tags (dataplanes/openflow/tags.py): GET(slot) -> the slot's select group (a GET of a
             slot with no rule -> its home's MAC back, on to L2);
             COPY(server) -> server's MAC back, a copy to the controller (PacketIn), on to L2;
             REPLY(home) -> home's MAC, IP and UDP port as the source, on to L2; anything else -> L2
  L2    (2)  destination MAC -> port (learned); unknown -> flood (a balanced get to a server's configured MAC: flooded
             by that server's own rule, whose packet count says how many were lost to a wrong MAC)
A hot key's group has one bucket per replica with a positive weight (bucket id = the replica's position, so
bucket counters map back), each rewriting destination MAC, IP and UDP port (and the source MAC to the BALANCED
tag, the in_port to none: a fabric's home leaf may send the get back the way it came) and resubmitting to L2.
"""
from __future__ import annotations

import itertools
import json
import struct
from dataclasses import dataclass
from typing import Any, Sequence

from ryu.ofproto import ofproto_v1_5 as ofp
from ryu.ofproto import ofproto_v1_5_parser as parser

from dataplanes.openflow import tags
from mbalancer.settings import Server

LEARN, TAGS, L2 = 0, 1, 2
COOKIE = 0x4d42  # "MB": every flow this driver installs
L2_IDLE = 300  # seconds a learned MAC stays without traffic
LEARNED_PRIORITY = 10  # the L2 flows the learn action makes
FLOODED_PRIORITY = 5  # per server: its balanced gets flooded (below the learned flows: only where its MAC is unknown)
NTR_VENDOR_ID = 0x0000154d  # OVS's group selection-method property (an experimenter property of OF1.5 groups)
NTR_SELECTION_METHOD = 1
BALANCED_SOURCE = tags.tag(tags.BALANCED, 0)  # a balanced get's source MAC: learned by no switch on its way
# A balanced get's in_port set to none (OVS's NXM in_port, 16 bits: OVS refuses 0 in the OXM one) in its group: OpenFlow
# drops output to the ingress port, by which a fabric's home leaf may send a get from a spine up to the replica's leaf.
NO_INGRESS = parser.OFPActionSetField(in_port_nxm=0)
ANY_GET = (tags.tag(tags.GET, 0), "ff:ff:00:00:00:00")  # (value, mask): a GET tag of any slot
ETH_DST_ALL_BITS = bytes.fromhex("80000606") + b"\xff" * 6  # OXM ETH_DST (class 0x8000, field 3, 6 bytes): all bits
ATOMIC = ofp.OFPBF_ATOMIC | ofp.OFPBF_ORDERED
_bundle_ids = itertools.count(1)  # a bundle's id is the connection's; a new one each time never meets a stale one


def flow(dp, table: int, priority: int, match, instructions: list, command: int = ofp.OFPFC_ADD, **kw):
    return parser.OFPFlowMod(dp, cookie=COOKIE, table_id=table, command=command, priority=priority, match=match,
                             instructions=instructions, **kw)


def apply(*actions) -> list:
    return [parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS, list(actions))]


def goto(table: int) -> parser.OFPInstructionGotoTable:
    return parser.OFPInstructionGotoTable(table)


def set_field(**field) -> parser.OFPActionSetField:
    return parser.OFPActionSetField(**field)


def base_pipeline(dp) -> list:
    """Every table emptied, then the rules that do not depend on servers or hot keys."""
    learn = parser.NXActionLearn(
        table_id=L2, priority=LEARNED_PRIORITY, idle_timeout=L2_IDLE, cookie=COOKIE,
        specs=[parser.NXFlowSpecMatch(src=("eth_src_nxm", 0), dst=("eth_dst_nxm", 0), n_bits=48),
               parser.NXFlowSpecOutput(src=("in_port_nxm", 0), dst="", n_bits=16)])
    return [
        parser.OFPFlowMod(dp, table_id=ofp.OFPTT_ALL, command=ofp.OFPFC_DELETE, out_port=ofp.OFPP_ANY,
                          out_group=ofp.OFPG_ANY),
        parser.OFPGroupMod(dp, ofp.OFPGC_DELETE, ofp.OFPGT_SELECT, ofp.OFPG_ALL),
        flow(dp, LEARN, 10, parser.OFPMatch(eth_src=tags.ANY_TAG), [goto(TAGS)]),
        flow(dp, LEARN, 0, parser.OFPMatch(), apply(learn) + [goto(TAGS)]),
        flow(dp, TAGS, 0, parser.OFPMatch(), [goto(L2)]),
        flow(dp, L2, 0, parser.OFPMatch(), apply(parser.OFPActionOutput(ofp.OFPP_FLOOD))),
    ]


def server_rules(dp, servers: Sequence[Server]) -> list:
    """Per server: its copies (COPY tag), its replies' source (REPLY tag), and the gets tagged for a slot that has no
    rule here (a datapath cache older than the slot's flow, e.g. one of a previous controller's) sent to it as their
    home: its MAC back, as for any get the switch does not balance, where they would be flooded with the tag as
    their destination and lost."""
    rules = []
    for index, server in enumerate(servers):
        rules.append(flow(dp, TAGS, 50, parser.OFPMatch(eth_dst=ANY_GET, eth_type=0x0800, ipv4_dst=server.ip),
                          apply(set_field(eth_dst=server.mac)) + [goto(L2)]))
        rules.append(flow(dp, TAGS, 100, parser.OFPMatch(eth_dst=tags.tag(tags.COPY, index)), apply(
            set_field(eth_dst=server.mac),
            parser.OFPActionOutput(ofp.OFPP_CONTROLLER, ofp.OFPCML_NO_BUFFER)) + [goto(L2)]))
        rules.append(flow(dp, TAGS, 100, parser.OFPMatch(eth_src=tags.tag(tags.REPLY, index), eth_type=0x0800,
                                                         ip_proto=17), apply(
            set_field(eth_src=server.mac), set_field(ipv4_src=server.ip), set_field(udp_src=server.port))
            + [goto(L2)]))
        rules.append(flow(dp, L2, FLOODED_PRIORITY, flooded_match(server),
                          apply(parser.OFPActionOutput(ofp.OFPP_FLOOD))))
    return rules


def flooded_match(server: Server):
    """A get balanced to `server` (the group wrote the BALANCED source, the server's MAC, address and port) that L2
    knows no port for: flooded as any unknown destination, but counted against the server (controller/mac_check.py:
    a configured MAC no host has loses every get balanced to it)."""
    return parser.OFPMatch(eth_dst=server.mac, eth_src=BALANCED_SOURCE, eth_type=0x0800, ipv4_dst=server.ip,
                           ip_proto=17, udp_dst=server.port)


def flooded_stats(dp) -> parser.OFPFlowDescStatsRequest:
    """The L2 flows that match on the BALANCED source, with their counts: the per-server flood rules, not the
    learned MACs, which may be thousands (flow desc: Open vSwitch answers no OpenFlow 1.5 flow stats request)."""
    return parser.OFPFlowDescStatsRequest(dp, 0, L2, ofp.OFPP_ANY, ofp.OFPG_ANY, COOKIE, 0xffffffffffffffff,
                                          parser.OFPMatch(eth_src=BALANCED_SOURCE))


def flooded_counts(replies: Sequence, servers: Sequence[Server]) -> list[int]:
    """Per server (in `servers`' order), the packets its flood rule counted, from flooded_stats' replies."""
    index = {(s.ip, s.port): i for i, s in enumerate(servers)}
    counts = [0] * len(servers)
    for reply in replies:
        for held in reply.body:
            if held.priority != FLOODED_PRIORITY:
                continue
            server = index.get((held.match.get("ipv4_dst"), held.match.get("udp_dst")))
            if server is not None and held.stats is not None:
                counts[server] += held.stats.get("packet_count", 0)
    return counts


def group_id(slot: int) -> int:
    return slot + 1


def hot_group(dp, slot: int, buckets: Sequence[tuple[int, Server, int]], selection: str, add: bool) -> list:
    """The slot's select group: buckets of (position among the key's replicas, server, OVS weight)."""
    built = [parser.OFPBucket(bucket_id=position, properties=[
                                  parser.OFPGroupBucketPropWeight(type_=ofp.OFPGBPT_WEIGHT, weight=weight)],
                              actions=[set_field(eth_dst=server.mac), set_field(ipv4_dst=server.ip),
                                       set_field(udp_dst=server.port), set_field(eth_src=BALANCED_SOURCE),
                                       NO_INGRESS, parser.NXActionResubmitTable(table_id=L2)])
             for position, server, weight in buckets]
    command = ofp.OFPGC_ADD if add else ofp.OFPGC_MODIFY
    return [parser.OFPGroupMod(dp, command, ofp.OFPGT_SELECT, group_id(slot), buckets=built,
                               properties=selection_method(selection))]


def selection_method(selection: str) -> list:
    """OVS's selection-method property: hash over the destination MAC (the classifier's tag, whose entropy is a
    hash of the request id and client), dp_hash, or none (OVS's default)."""
    if selection == "default":
        return []
    return [SelectionMethod(selection, ETH_DST_ALL_BITS if selection == "hash" else b"")]


class SelectionMethod:
    """OVS's group selection-method property (NTR experimenter; Ryu has no class for it, and its generic one only
    carries whole 4-byte words, so it cannot read the one OVS sends back either): type, length without padding,
    vendor, type, 4 pad, name (16), parameter (8), then the hashed fields as OXM entries whose value is the mask of
    bits hashed, padded to 8 bytes. Registered below as Ryu's parser of every experimenter group property: another
    experimenter's reads back as its raw bytes (name None)."""

    def __init__(self, name: str | None, fields: bytes = b"", raw: bytes = b""):
        self.name, self.fields, self.raw = name, fields, raw

    def serialize(self) -> bytearray:
        length = 40 + len(self.fields)
        body = struct.pack("!HHII4x16sQ", ofp.OFPGPT_EXPERIMENTER, length, NTR_VENDOR_ID, NTR_SELECTION_METHOD,
                           self.name.encode(), 0) + self.fields
        return bytearray(body + bytes(-length % 8))

    @classmethod
    def parser(cls, buf) -> "SelectionMethod":
        _, length = struct.unpack_from("!HH", buf, 0)
        if length >= 40:
            vendor, kind, name = struct.unpack_from("!II4x16s", buf, 4)
            if (vendor, kind) == (NTR_VENDOR_ID, NTR_SELECTION_METHOD):
                return cls(name.rstrip(b"\0").decode(errors="replace"), bytes(buf[40:length]))
        return cls(None, raw=bytes(buf[:length]))

    def __eq__(self, other) -> bool:
        return isinstance(other, SelectionMethod) and (self.name, self.fields, self.raw) == \
            (other.name, other.fields, other.raw)

    def __repr__(self) -> str:
        return f"selection_method={self.name}" if self.name is not None else f"experimenter({self.raw.hex()})"


parser.OFPGroupProp.register_type(ofp.OFPGPT_EXPERIMENTER)(SelectionMethod)


def _alone(ryu_parser):
    """Ryu's parsers of a bucket and of a group desc read their properties on past their own end (into the next
    bucket or group, where a length of 0 made them loop for ever): each is given its own bytes alone (its length is
    its first 16 bits)."""
    def parse(buf, offset: int):
        (length,) = struct.unpack_from("!H", buf, offset)
        return ryu_parser(buf[offset:offset + length], 0)
    return staticmethod(parse)


parser.OFPBucket.parser = _alone(parser.OFPBucket.parser)
parser.OFPGroupDescStats.parser = _alone(parser.OFPGroupDescStats.parser)


def hot_flow(dp, slot: int) -> list:
    """Gets tagged GET(slot) -> the slot's group."""
    return [flow(dp, TAGS, 200, parser.OFPMatch(eth_dst=tags.tag_match(tags.GET, slot)),
                 apply(parser.OFPActionGroup(group_id(slot))))]


def remove_hot(dp, slot: int) -> list:
    return [flow(dp, TAGS, 200, parser.OFPMatch(eth_dst=tags.tag_match(tags.GET, slot)), [],
                 command=ofp.OFPFC_DELETE_STRICT, out_port=ofp.OFPP_ANY, out_group=ofp.OFPG_ANY),
            delete_group(dp, group_id(slot))]


def atomic(dp, batch: Sequence) -> list:
    """`batch` as one OpenFlow bundle (OF1.4+; Open vSwitch takes flow and group mods in one since 2.6): the switch
    applies it all at the commit, in order, and a packet meets the tables as they were before or after, never half
    way. Without it, a batch that empties the tables and fills them again (a switch that connects, a new master at a
    takeover) lets the packets looked up in between find no rule: dropped (Open vSwitch's drop_action_of_pipeline)."""
    bundle = next(_bundle_ids) & 0xffffffff
    return [parser.OFPBundleCtrlMsg(dp, bundle, ofp.OFPBCT_OPEN_REQUEST, ATOMIC, []),
            *(parser.OFPBundleAddMsg(dp, bundle, ATOMIC, message, []) for message in batch),
            parser.OFPBundleCtrlMsg(dp, bundle, ofp.OFPBCT_COMMIT_REQUEST, ATOMIC, [])]


def refusals(errors: Sequence) -> str:
    """The switch's error messages, as the driver's one-line refusals quote them: "type 2 code 3, ..."."""
    return ", ".join(f"type {m.type} code {m.code}" for m in errors)


def role_request(dp, role: int, generation_id: int) -> parser.OFPRoleRequest:
    """Ask for a controller role (ofp.OFPCR_ROLE_*): MASTER and SLAVE carry the generation id, which the switch
    refuses (OFPRRFC_STALE) when below the highest it has seen; NOCHANGE asks which role and generation id hold now."""
    return parser.OFPRoleRequest(dp, role, ofp.OFPCID_UNDEFINED, generation_id)


def barrier(dp) -> parser.OFPBarrierRequest:
    return parser.OFPBarrierRequest(dp)


def group_stats(dp) -> parser.OFPGroupStatsRequest:
    return parser.OFPGroupStatsRequest(dp, 0, ofp.OFPG_ALL)


# --- reading back what a switch holds (a driver that takes over: dataplanes/openflow/driver.py) -----------------------
# Each flow and group, read back or about to be sent, in one comparable form: what OVS returns for a message it took
# is the same JSON as the message's own parts (Ryu's to_jsondict), but for a group's bucket properties (Ryu misreads
# all but the first: the weight) and the learned L2 flows, which no message of ours makes.

def group_descs(dp) -> parser.OFPGroupDescStatsRequest:
    return parser.OFPGroupDescStatsRequest(dp, 0, ofp.OFPG_ALL)


def flow_descs(dp) -> parser.OFPFlowDescStatsRequest:
    return parser.OFPFlowDescStatsRequest(dp, 0, ofp.OFPTT_ALL, ofp.OFPP_ANY, ofp.OFPG_ANY)


FlowKey = tuple  # (table, priority, match as JSON): what OpenFlow tells one flow from another by


@dataclass(frozen=True)
class Flow:
    key: FlowKey
    match: Any  # the OFPMatch, to delete it by
    does: str  # its cookie and instructions, as JSON


@dataclass(frozen=True)
class Bucket:
    position: int  # the bucket id: the replica's position among the key's replicas
    weight: int
    actions: str  # as JSON


@dataclass(frozen=True)
class Group:
    group_id: int
    kind: int  # OFPGT_*
    properties: tuple  # the selection method
    buckets: tuple[Bucket, ...]

    def same(self, other: "Group", weight_slack: int) -> bool:
        """The same group, each bucket's weight within `weight_slack` (weights solved again from shares a table
        holds rounded may differ from the ones first sent by a unit or two)."""
        return (self.kind, self.properties, [(b.position, b.actions) for b in self.buckets]) == \
            (other.kind, other.properties, [(b.position, b.actions) for b in other.buckets]) and \
            all(abs(a.weight - b.weight) <= weight_slack for a, b in zip(self.buckets, other.buckets))


def flow_of(message) -> Flow:
    """A flow mod we send, or a flow desc a switch answered with."""
    match = message.match
    return Flow((message.table_id, message.priority, _match_json(match)), match,
                f"{message.cookie:#x} {_json(list(message.instructions))}")


def group_of(message) -> Group:
    """A group mod we send, or a group desc a switch answered with."""
    return Group(message.group_id, message.type, tuple(message.properties),
                 tuple(Bucket(b.bucket_id, _weight(b), _json(list(b.actions))) for b in message.buckets))


def held_flows(replies: Sequence) -> dict[FlowKey, Flow]:
    """The flows of flow desc replies, but L2's learned ones (the learn action's, not ours to compare)."""
    flows = (flow_of(f) for reply in replies for f in reply.body)
    return {f.key: f for f in flows if f.key[:2] != (L2, LEARNED_PRIORITY)}


def held_groups(replies: Sequence) -> dict[int, Group]:
    return {g.group_id: group_of(g) for reply in replies for g in reply.body}


def delete_flow(dp, held: Flow) -> parser.OFPFlowMod:
    table, priority, _ = held.key
    return parser.OFPFlowMod(dp, table_id=table, command=ofp.OFPFC_DELETE_STRICT, priority=priority,
                             match=held.match, out_port=ofp.OFPP_ANY, out_group=ofp.OFPG_ANY)


def delete_group(dp, number: int) -> parser.OFPGroupMod:
    return parser.OFPGroupMod(dp, ofp.OFPGC_DELETE, ofp.OFPGT_SELECT, number)


def _weight(bucket) -> int:
    return next((p.weight for p in bucket.properties if isinstance(p, parser.OFPGroupBucketPropWeight)), 0)


def _json(value) -> str:
    """Ryu's JSON of a message part, without the lengths serializing fills in (a message not sent yet has none)."""
    parts = value if isinstance(value, list) else [value]
    return json.dumps([_no_lengths(p.to_jsondict()) for p in parts], sort_keys=True, default=str)


def _match_json(match) -> str:
    """A match's fields in one order whatever order they came in: Ryu sorts a match it builds by OXM field number,
    Open vSwitch answers in its own order (the source MAC before the destination)."""
    fields = match.to_jsondict()["OFPMatch"]["oxm_fields"]
    return json.dumps(sorted((_no_lengths(f) for f in fields), key=lambda f: f["OXMTlv"]["field"]), sort_keys=True,
                      default=str)


def _no_lengths(value):
    if isinstance(value, dict):
        return {k: _no_lengths(v) for k, v in value.items() if k not in ("len", "length")}
    if isinstance(value, list):
        return [_no_lengths(v) for v in value]
    return value
