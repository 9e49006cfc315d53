// SPDX-License-Identifier: GPL-2.0
/* The forwarding benchmark's far end: every frame that reaches a server's interface is counted there (the veth's
 * rx_packets) and dropped at once by this tc ingress program, so the servers' own IP stack (a UDP port nobody
 * listens on, ICMP errors) does not share the CPUs with the switch being measured. */
#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>

SEC("tc")
int sink(struct __sk_buff *skb)
{
	return TC_ACT_SHOT;
}

char LICENSE[] SEC("license") = "GPL";
