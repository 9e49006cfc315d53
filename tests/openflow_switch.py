"""A recorded OpenFlow switch for tests that need no switch (faucet's FakeOFTable way): it applies the OpenFlow
driver's messages to a flow and group table, answers flow and group stats, and picks a get's bucket the way Open
vSwitch's hash selection does (the highest hash(bucket, tag) x weight; a hash of our own, so the same shares, not
OVS's exact choices)."""
from __future__ import annotations

import hashlib

from dataplanes.driver import DriverError
from dataplanes.openflow import messages, tags

from ryu.ofproto import ofproto_v1_5 as ofp
from ryu.ofproto import ofproto_v1_5_parser as parser


class Datapath:
    """Enough of a Ryu datapath for the parser to build and serialize messages."""
    ofproto, ofproto_parser, id = ofp, parser, 0x4d42

    def set_xid(self, msg) -> None:
        msg.set_xid(1)


class RecordedSwitch:
    """A flow and group table that applies what the driver sends, in order (the Channel of the driver)."""

    def __init__(self):
        self.dp = Datapath()
        self.flows: dict[tuple, list] = {}  # (table, priority, match) -> instructions
        self.groups: dict[int, list] = {}  # group id -> buckets
        self.flow_mods: dict[tuple, parser.OFPFlowMod] = {}  # what flow and group desc answer
        self.group_mods: dict[int, parser.OFPGroupMod] = {}
        self.sent: list = []
        self.refuse_groups = False
        self.bucket_packets: dict[int, list[int]] = {}  # what group stats answer
        self.flow_packets: dict[tuple, int] = {}  # (table, priority, match) -> what flow desc answers as its count
        self.bundle: list | None = None  # the messages of the open bundle, applied together at its commit

    def switches(self) -> list:
        return [self.dp]

    def send(self, dp, batch) -> None:
        if self.refuse_groups and any(isinstance(m, parser.OFPGroupMod) and m.command == ofp.OFPGC_ADD for m in batch):
            raise DriverError("switch 0000000000004d42 refused a message: type 6 code 0")
        for message in batch:
            self.sent.append(message)
            self.apply(message)

    def close(self) -> None:
        """Nothing held."""

    def ask(self, dp, request) -> list:
        if isinstance(request, parser.OFPFlowDescStatsRequest):
            return [parser.OFPFlowDescStatsReply(dp, body=[parser.OFPFlowDesc(
                m.table_id, m.priority, m.idle_timeout, m.hard_timeout, m.flags, m.importance, m.cookie, m.match,
                parser.OFPStats(packet_count=self.flow_packets.get(key, 0)), m.instructions)
                for key, m in self.flow_mods.items() if request.table_id in (ofp.OFPTT_ALL, m.table_id)])]
        if isinstance(request, parser.OFPGroupDescStatsRequest):
            return [parser.OFPGroupDescStatsReply(dp, body=[parser.OFPGroupDescStats(
                m.type, m.group_id, m.buckets, m.properties) for m in self.group_mods.values()])]
        body = [parser.OFPGroupStats(group_id=g, bucket_stats=[parser.OFPBucketCounter(n, 0) for n in counts])
                for g, counts in self.bucket_packets.items()]
        return [parser.OFPGroupStatsReply(dp, body=body)]

    def apply(self, m) -> None:
        if isinstance(m, parser.OFPBundleCtrlMsg):  # as OVS does: nothing of a bundle shows before its commit
            if m.type == ofp.OFPBCT_OPEN_REQUEST:
                self.bundle = []
            elif m.type == ofp.OFPBCT_COMMIT_REQUEST:
                held, self.bundle = self.bundle or [], None
                for message in held:
                    self.apply(message)
        elif isinstance(m, parser.OFPBundleAddMsg):
            self.bundle.append(m.message)
        elif isinstance(m, parser.OFPFlowMod):
            key = (m.table_id, m.priority, str(m.match.to_jsondict()))
            if m.command == ofp.OFPFC_ADD:
                self.flows[key], self.flow_mods[key] = m.instructions, m
                self.flow_packets.pop(key, None)  # a flow added counts afresh
            elif m.command == ofp.OFPFC_DELETE and m.table_id == ofp.OFPTT_ALL:
                self.flows.clear()
                self.flow_mods.clear()
            elif m.command == ofp.OFPFC_DELETE_STRICT:
                self.flows.pop(key, None)
                self.flow_mods.pop(key, None)
        elif isinstance(m, parser.OFPGroupMod):
            if m.command in (ofp.OFPGC_ADD, ofp.OFPGC_MODIFY):
                self.groups[m.group_id], self.group_mods[m.group_id] = m.buckets, m
                self.bucket_packets.pop(m.group_id, None)  # new buckets count afresh
            elif m.group_id == ofp.OFPG_ALL:
                self.groups.clear()
                self.group_mods.clear()
            else:
                self.groups.pop(m.group_id, None)
                self.group_mods.pop(m.group_id, None)

    def restart(self) -> None:
        """Empty, as a restarted switch is."""
        for table in (self.flows, self.groups, self.flow_mods, self.group_mods, self.flow_packets):
            table.clear()

    def group_of_get(self, slot: int) -> int | None:
        """The group a get tagged GET(slot) is sent to, by the recorded flows."""
        match = parser.OFPMatch(eth_dst=tags.tag_match(tags.GET, slot))
        instructions = self.flows.get((messages.TAGS, 200, str(match.to_jsondict())))
        actions = instructions[0].actions if instructions else []
        return next((a.group_id for a in actions if isinstance(a, parser.OFPActionGroup)), None)

    def weights(self, group_id: int) -> dict[str, int]:
        """Destination IP -> OVS weight, per bucket of the group."""
        out = {}
        for bucket in self.groups[group_id]:
            ip = next(a.value for a in bucket.actions if getattr(a, "key", None) == "ipv4_dst")
            out[ip] = bucket.properties[0].weight
        return out

    def pick(self, tag_mac: str) -> str | None:
        """Where a get tagged `tag_mac` goes: the destination IP of the bucket its group picks (None: no rule), and
        the bucket's packet count goes up, as the switch's would."""
        kind, slot, _ = tags.parse_tag(tag_mac)
        group = self.group_of_get(slot) if kind == tags.GET else None
        if group is None or group not in self.groups:
            return None
        buckets = self.groups[group]
        scores = [int.from_bytes(hashlib.sha1(f"{b.bucket_id}/{tag_mac}".encode()).digest()[:2], "big")
                  * b.properties[0].weight for b in buckets]
        chosen = scores.index(max(scores))
        counts = self.bucket_packets.setdefault(group, [0] * len(buckets))
        counts[chosen] += 1
        return next(a.value for a in buckets[chosen].actions if getattr(a, "key", None) == "ipv4_dst")

    def flood(self, server, gets: int) -> None:
        """`gets` balanced to `server` flooded: its flood rule counts them, as the switch's would."""
        match = messages.flooded_match(server)
        key = (messages.L2, messages.FLOODED_PRIORITY, str(match.to_jsondict()))
        assert key in self.flow_mods, "no flood rule for that server"
        self.flow_packets[key] = self.flow_packets.get(key, 0) + gets
