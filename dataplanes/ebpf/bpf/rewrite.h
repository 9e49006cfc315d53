/* Rewrites with checksum fixes: destination or source MAC/IP/port, and the "already balanced" mark. */
#ifndef MB_REWRITE_H
#define MB_REWRITE_H

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/udp.h>
#include <linux/pkt_cls.h>
#include <stddef.h>
#include <bpf/bpf_helpers.h>
#include "parse.h"

#define MB_IP_CSUM(pkt) ((pkt)->ip_off + offsetof(struct iphdr, check))
#define MB_UDP_CSUM(pkt) ((pkt)->l4_off + offsetof(struct udphdr, check))
/* UDP checksum 0 means "none": leave it so (BPF_F_MARK_MANGLED_0); the IP addresses are in its pseudo header. */
#define MB_L4_FLAGS (BPF_F_PSEUDO_HDR | BPF_F_MARK_MANGLED_0)

static __always_inline int mb_set_ip(struct __sk_buff *skb, struct mb_packet *pkt, __u32 field, __u32 old, __u32 new)
{
	if (old == new)
		return 0;
	if (bpf_l4_csum_replace(skb, MB_UDP_CSUM(pkt), old, new, MB_L4_FLAGS | sizeof(new)) < 0 ||
	    bpf_l3_csum_replace(skb, MB_IP_CSUM(pkt), old, new, sizeof(new)) < 0)
		return -1;
	return bpf_skb_store_bytes(skb, pkt->ip_off + field, &new, sizeof(new), 0);
}

static __always_inline int mb_set_port(struct __sk_buff *skb, struct mb_packet *pkt, __u32 field, __u16 old, __u16 new)
{
	if (old == new)
		return 0;
	if (bpf_l4_csum_replace(skb, MB_UDP_CSUM(pkt), old, new, BPF_F_MARK_MANGLED_0 | sizeof(new)) < 0)
		return -1;
	return bpf_skb_store_bytes(skb, pkt->l4_off + field, &new, sizeof(new), 0);
}

/* hot_get's rewrite: to `server`, marked as balanced. */
static __always_inline int mb_rewrite_destination(struct __sk_buff *skb, struct mb_packet *pkt,
						  const struct mb_server *server)
{
	__u16 marked = pkt->frag_off | bpf_htons(MB_IP_BALANCED);
	if (bpf_skb_store_bytes(skb, offsetof(struct ethhdr, h_dest), server->mac, ETH_ALEN, 0) < 0 ||
	    mb_set_ip(skb, pkt, offsetof(struct iphdr, daddr), pkt->daddr, server->ip) < 0 ||
	    mb_set_port(skb, pkt, offsetof(struct udphdr, dest), pkt->dport, server->port) < 0 ||
	    bpf_l3_csum_replace(skb, MB_IP_CSUM(pkt), pkt->frag_off, marked, sizeof(marked)) < 0 ||
	    bpf_skb_store_bytes(skb, pkt->ip_off + offsetof(struct iphdr, frag_off), &marked, sizeof(marked), 0) < 0)
		return -1;
	return 0;
}

/* reply_source's rewrite: the reply leaves as if from `home`. */
static __always_inline int mb_rewrite_source(struct __sk_buff *skb, struct mb_packet *pkt, const struct mb_server *home)
{
	if (bpf_skb_store_bytes(skb, offsetof(struct ethhdr, h_source), home->mac, ETH_ALEN, 0) < 0 ||
	    mb_set_ip(skb, pkt, offsetof(struct iphdr, saddr), pkt->saddr, home->ip) < 0 ||
	    mb_set_port(skb, pkt, offsetof(struct udphdr, source), pkt->sport, home->port) < 0)
		return -1;
	return 0;
}

#endif
