// An etcd member cut off from its peers, its clients still answered (topologies/etcd.py, EtcdCluster.cut_peers):
// attached to the member's cgroup for ingress and egress, this drops every TCP segment to or from a peer port of the
// cluster (PEERS, given at compile time), so its raft traffic is lost both ways (as in a partition: nothing is
// refused, segments vanish) while its client port is left alone.
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

static const __u16 peers[] = {PEERS};

static __always_inline int is_peer(__u16 port) {
#pragma unroll
    for (unsigned i = 0; i < sizeof(peers) / sizeof(peers[0]); i++)
        if (peers[i] == port)
            return 1;
    return 0;
}

SEC("cgroup/skb")
int cut_peers(struct __sk_buff *skb) {
    struct iphdr ip;
    __be16 ports[2];

    if (skb->protocol != bpf_htons(ETH_P_IP) || bpf_skb_load_bytes(skb, 0, &ip, sizeof(ip)) ||
        ip.protocol != IPPROTO_TCP || bpf_skb_load_bytes(skb, ip.ihl * 4, ports, sizeof(ports)))
        return 1;
    return !(is_peer(bpf_ntohs(ports[0])) || is_peer(bpf_ntohs(ports[1])));  // 0: dropped
}

char LICENSE[] SEC("license") = "GPL";
