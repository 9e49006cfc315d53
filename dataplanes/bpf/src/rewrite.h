/* Rewrites with checksum fixes: destination or source MAC/IP/port, and the "already balanced" mark. In place: the
 * headers are in the packet's linear part once mb_parse_headers has run. */
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

/* A ones' complement checksum after 16-bit words of what it covers changed (RFC 1624: HC' = ~(~HC + ~m + m')). */
static __always_inline __u16 mb_csum_update(__u16 check, const __u16 *old, const __u16 *new, const int words)
{
	__u32 sum = (__u16)~check;
#pragma unroll
	for (int i = 0; i < words; i++)
		sum += (__u16)~old[i] + new[i];
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return ~sum;
}

/* The Ethernet, IPv4 and UDP headers in place; 0 if they are not all in the linear part (mb_parse_headers made
 * sure they are, so only a broken packet fails here). */
static __always_inline int mb_headers(struct mb_ctx *skb, struct mb_packet *pkt, struct ethhdr **eth,
				      struct iphdr **ip, struct udphdr **udp)
{
	void *data = mb_data(skb), *end = mb_data_end(skb);
	*eth = data;
	*ip = data + sizeof(**eth);
	*udp = data + (pkt->l4_off & 0x7f);  /* at most 14 + 60: the mask tells the verifier so */
	return (void *)(*ip + 1) <= end && (void *)(*udp + 1) <= end;
}

/* The UDP checksum after an address of its pseudo header (old_ip -> new_ip, as two words) and one of its ports
 * changed. 0 stays 0 (the sender sent none); a computed 0 is sent as all ones. */
static __always_inline void mb_udp_check_update(struct udphdr *udp, const __u16 *old_ip, const __u16 *new_ip,
						__u16 old_port, __u16 new_port)
{
	if (!udp->check)
		return;
	__u16 old_words[3] = {old_ip[0], old_ip[1], old_port};
	__u16 new_words[3] = {new_ip[0], new_ip[1], new_port};
	__u16 check = mb_csum_update(udp->check, old_words, new_words, 3);
	udp->check = check ? check : 0xffff;
}

/* hot_get's rewrite: to `server`, marked as balanced, the home's index in the IP ID (a get is one unfragmented
 * datagram, whose ID nothing reads), so that a switch further on, the replica's, can make the reply seem to come from
 * the home when the reply does not pass this one (a fabric that balances at the home's leaf). Written in place (one
 * pass fixes both checksums, where the helpers took nine calls). */
static __always_inline int mb_rewrite_destination(struct mb_ctx *skb, struct mb_packet *pkt,
						  const struct mb_server *server, __u32 home)
{
	struct ethhdr *eth;
	struct iphdr *ip;
	struct udphdr *udp;
	if (!mb_headers(skb, pkt, &eth, &ip, &udp))
		return -1;
	__u16 marked = pkt->frag_off | bpf_htons(MB_IP_BALANCED), home_id = bpf_htons((__u16)home);
	__u16 old_ip[4] = {(__u16)ip->daddr, (__u16)(ip->daddr >> 16), ip->frag_off, ip->id};
	__u16 new_ip[4] = {(__u16)server->ip, (__u16)(server->ip >> 16), marked, home_id};
	ip->check = mb_csum_update(ip->check, old_ip, new_ip, 4);
	mb_udp_check_update(udp, old_ip, new_ip, udp->dest, server->port);
	ip->daddr = server->ip;
	ip->frag_off = marked;
	ip->id = home_id;
	udp->dest = server->port;
	__builtin_memcpy(eth->h_dest, server->mac, ETH_ALEN);
	return 0;
}

/* The key classifier's half of that rewrite: marked as balanced, the home's index in the IP ID, the destination
 * left for the OpenFlow switch to choose (its select group may pick any replica, the home included). */
static __always_inline int mb_mark_balanced(struct mb_ctx *skb, struct mb_packet *pkt, __u32 home)
{
	struct ethhdr *eth;
	struct iphdr *ip;
	struct udphdr *udp;
	if (!mb_headers(skb, pkt, &eth, &ip, &udp))
		return -1;
	__u16 marked = pkt->frag_off | bpf_htons(MB_IP_BALANCED), home_id = bpf_htons((__u16)home);
	__u16 old_ip[2] = {ip->frag_off, ip->id};
	__u16 new_ip[2] = {marked, home_id};
	ip->check = mb_csum_update(ip->check, old_ip, new_ip, 2);
	ip->frag_off = marked;
	ip->id = home_id;
	return 0;
}

/* reply_source's rewrite: the reply leaves as if from `home` (in place, as above); its MAC too if `mac`. */
static __always_inline int mb_rewrite_source(struct mb_ctx *skb, struct mb_packet *pkt, const struct mb_server *home,
					     int mac)
{
	struct ethhdr *eth;
	struct iphdr *ip;
	struct udphdr *udp;
	if (!mb_headers(skb, pkt, &eth, &ip, &udp))
		return -1;
	__u16 old_ip[2] = {(__u16)ip->saddr, (__u16)(ip->saddr >> 16)};
	__u16 new_ip[2] = {(__u16)home->ip, (__u16)(home->ip >> 16)};
	ip->check = mb_csum_update(ip->check, old_ip, new_ip, 2);
	mb_udp_check_update(udp, old_ip, new_ip, udp->source, home->port);
	ip->saddr = home->ip;
	udp->source = home->port;
	if (mac)
		__builtin_memcpy(eth->h_source, home->mac, ETH_ALEN);
	return 0;
}

#endif
