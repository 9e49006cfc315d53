/* The forwarding benchmark's baseline (experiments/benchmarks/bench_p4_switch.py): bmv2 doing only what
 * mbalancer.p4's `forward` does for a known destination (a table on the destination MAC), so the figure shows what
 * MBalancer's parsing and tables cost on the same switch. Not a data plane of MBalancer. */
#include <core.p4>
#include <v1model.p4>

header ethernet_t {
    bit<48> dst;
    bit<48> src;
    bit<16> ether_type;
}

struct headers_t {
    ethernet_t ethernet;
}

struct metadata_t { }

parser L2Parser(packet_in pkt, out headers_t hdr, inout metadata_t meta, inout standard_metadata_t std) {
    state start {
        pkt.extract(hdr.ethernet);
        transition accept;
    }
}

control L2VerifyChecksum(inout headers_t hdr, inout metadata_t meta) { apply { } }

control L2Ingress(inout headers_t hdr, inout metadata_t meta, inout standard_metadata_t std) {
    action to_port(bit<9> port) { std.egress_spec = port; }
    action flood() { std.mcast_grp = 1; }
    table forward {
        key = { hdr.ethernet.dst: exact; }
        actions = { to_port; flood; }
        const default_action = flood();
        size = 4096;
    }
    apply { forward.apply(); }
}

control L2Egress(inout headers_t hdr, inout metadata_t meta, inout standard_metadata_t std) {
    apply {
        if (std.mcast_grp != 0 && std.egress_port == std.ingress_port) {
            mark_to_drop(std);
        }
    }
}

control L2ComputeChecksum(inout headers_t hdr, inout metadata_t meta) { apply { } }

control L2Deparser(packet_out pkt, in headers_t hdr) { apply { pkt.emit(hdr.ethernet); } }

V1Switch(L2Parser(), L2VerifyChecksum(), L2Ingress(), L2Egress(), L2ComputeChecksum(), L2Deparser()) main;
