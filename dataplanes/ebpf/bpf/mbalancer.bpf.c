// SPDX-License-Identifier: GPL-2.0
/* MBalancer's data plane as a tc (clsact ingress) program, attached to every port of one switch.
 * It implements the pipeline (README.md, "The pipeline") table for table:
 *   hot_get      single-key UDP get/gets of a hot key: dirty -> home unchanged; else a replica chosen by weight from
 *                a hash of the request id and client, dst MAC/IP/port rewritten, marked balanced
 *   set_mirror   a write (UDP or TCP) to a hot key's home: forwarded unchanged, dirty bit set, cloned to the
 *                controller (writes to replicas are the controller's own copies)
 *   reply_source UDP replies to balanced gets leave with the home server's source MAC/IP/port
 *   forward      destination MAC -> port (learned from source MACs, or set by the controller); flood otherwise
 *   counters     per hot key and replica, and switch-wide
 * Anything it cannot read is forwarded untouched. */
#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "structs.h"
#include "maps.h"
#include "parse.h"
#include "rewrite.h"

static __always_inline void mb_count(__u32 which)
{
	__u64 *n = bpf_map_lookup_elem(&counters, &which);
	if (n)
		*n += 1;  /* per-CPU: no atomics needed */
}

static __always_inline __u64 mb_mac_key(const __u8 *mac)
{
	__u64 key = 0;
	__builtin_memcpy(&key, mac, ETH_ALEN);
	return key;
}

/* forward, learning half: where the packet's source lives. Runs first, before any rewrite: a reply rewritten to
 * carry the home's source MAC must not teach the switch that the home sits behind the replica's port. */
static __always_inline void mb_learn(struct __sk_buff *skb)
{
	struct ethhdr eth;
	if (bpf_skb_load_bytes(skb, 0, &eth, sizeof(eth)) < 0 || (eth.h_source[0] & 1))
		return;
	__u64 src = mb_mac_key(eth.h_source);
	__u32 in = skb->ingress_ifindex;
	__u32 *known = bpf_map_lookup_elem(&forward, &src);
	if (!known || *known != in)
		bpf_map_update_elem(&forward, &src, &in, BPF_ANY);
}

/* forward: send to the destination's port, or flood. */
static __always_inline int mb_forward(struct __sk_buff *skb)
{
	struct ethhdr eth;
	if (bpf_skb_load_bytes(skb, 0, &eth, sizeof(eth)) < 0)
		return TC_ACT_SHOT;
	__u32 in = skb->ingress_ifindex;
	__u64 dst = mb_mac_key(eth.h_dest);
	__u32 *out = (eth.h_dest[0] & 1) ? 0 : bpf_map_lookup_elem(&forward, &dst);
	if (out && *out != in)
		return bpf_redirect(*out, 0);
	if (out) {
		mb_count(MB_C_DROPPED);  /* the destination is behind the port it came from */
		return TC_ACT_SHOT;
	}
	mb_count(MB_C_FLOODED);
#pragma unroll  /* the verifier sees each copy once; a rolled loop around a helper call looks infinite to it */
	for (__u32 i = 0; i < MB_MAX_PORTS; i++) {
		__u32 index = i;
		__u32 *port = bpf_map_lookup_elem(&ports, &index);
		if (!port || !*port)
			break;
		if (*port != in)
			bpf_clone_redirect(skb, *port, 0);
	}
	return TC_ACT_SHOT;  /* every copy has been sent */
}

static __always_inline int mb_is_memcached_port(__u16 port)
{
	return bpf_map_lookup_elem(&memcached_ports, &port) != 0;
}

static __always_inline __u32 mb_pick(__u16 request_id, __u32 client_ip, __u16 client_port)
{
	__u32 h = ((__u32)request_id | ((__u32)client_port << 16)) ^ client_ip;
	h *= 0x9E3779B1u;
	h ^= h >> 15;
	h *= 0x85EBCA77u;
	h ^= h >> 13;
	return h & (MB_WEIGHT_ONE - 1);
}

static __always_inline int mb_hot_get(struct __sk_buff *skb, struct mb_packet *pkt, struct mb_hot *hot)
{
	__u32 slot = hot->slot;
	struct mb_key_counters *kc = bpf_map_lookup_elem(&key_counters, &slot);
	__u32 *is_dirty = bpf_map_lookup_elem(&dirty, &slot);
	if (kc)
		kc->gets++;
	if (is_dirty && *is_dirty) {
		if (kc)
			kc->home_while_dirty++;
		return mb_forward(skb);  /* clients address the home: unchanged is home */
	}
	__u32 point = mb_pick(pkt->request_id, pkt->saddr, pkt->sport);
	__u32 chosen = hot->home;
	for (__u32 i = 0; i < MB_MAX_REPLICAS; i++) {
		if (i >= hot->replicas)
			break;
		if (point < hot->cumulative[i]) {
			chosen = hot->server[i];
			if (kc)
				kc->per_replica[i]++;
			break;
		}
	}
	struct mb_server *server = bpf_map_lookup_elem(&servers, &chosen);
	if (!server)
		return mb_forward(skb);
	if (chosen != hot->home) {
		struct mb_flow flow = {.client_ip = pkt->saddr, .client_port = pkt->sport, .request_id = pkt->request_id};
		__u32 home = hot->home;
		bpf_map_update_elem(&flows, &flow, &home, BPF_ANY);
	}
	if (mb_rewrite_destination(skb, pkt, server) < 0)
		return TC_ACT_SHOT;  /* a half-rewritten packet must not leave */
	mb_count(MB_C_BALANCED);
	return mb_forward(skb);
}

static __always_inline int mb_set_mirror(struct __sk_buff *skb, struct mb_packet *pkt, struct mb_hot *hot)
{
	__u32 slot = hot->slot, zero = 0, one = 1, home = hot->home;
	struct mb_server *server = bpf_map_lookup_elem(&servers, &home);
	if (!server || server->ip != pkt->daddr || server->port != pkt->dport)
		return mb_forward(skb);  /* only writes to the home count: the controller's own copies to replicas do not */
	bpf_map_update_elem(&dirty, &slot, &one, BPF_ANY);
	struct mb_key_counters *kc = bpf_map_lookup_elem(&key_counters, &slot);
	if (kc)
		kc->mirrored++;
	struct mb_settings *cfg = bpf_map_lookup_elem(&settings, &zero);
	if (cfg && cfg->controller_ifindex)
		bpf_clone_redirect(skb, cfg->controller_ifindex, 0);
	mb_count(MB_C_MIRRORED);
	return mb_forward(skb);
}

static __always_inline int mb_reply_source(struct __sk_buff *skb, struct mb_packet *pkt)
{
	__u16 header[1];
	if (pkt->payload_len < MB_FRAME_HEADER || bpf_skb_load_bytes(skb, pkt->payload_off, header, sizeof(header)) < 0)
		return mb_forward(skb);
	struct mb_flow flow = {.client_ip = pkt->daddr, .client_port = pkt->dport, .request_id = header[0]};
	__u32 *home = bpf_map_lookup_elem(&flows, &flow);
	if (!home)
		return mb_forward(skb);
	struct mb_server *server = bpf_map_lookup_elem(&servers, home);
	if (server && (server->ip != pkt->saddr || server->port != pkt->sport)) {
		if (mb_rewrite_source(skb, pkt, server) < 0)
			return TC_ACT_SHOT;
		mb_count(MB_C_REPLIES_REWRITTEN);
	}
	return mb_forward(skb);
}

SEC("tc")
int mbalancer(struct __sk_buff *skb)
{
	struct ethhdr eth;
	struct mb_packet pkt = {};
	__u32 zero = 0;
	mb_count(MB_C_PACKETS);
	mb_learn(skb);
	if (mb_parse_headers(skb, &eth, &pkt) < 0)
		return mb_forward(skb);
	int request = mb_is_memcached_port(pkt.dport);
	if (pkt.proto == IPPROTO_UDP && !request && mb_is_memcached_port(pkt.sport))
		return mb_reply_source(skb, &pkt);
	if (!request)
		return mb_forward(skb);
	mb_count(MB_C_MEMCACHED);
	if (pkt.frag_off & bpf_htons(MB_IP_BALANCED)) {
		mb_count(MB_C_ALREADY_BALANCED);
		return mb_forward(skb);
	}
	if (pkt.payload_len == 0)
		return mb_forward(skb);  /* a bare TCP ACK: nothing to read, nothing wrong */
	if (pkt.proto == IPPROTO_UDP && mb_parse_udp_frame(skb, &pkt) < 0)
		goto unparsed;
	__u32 key_off = 0;
	enum mb_command command = mb_parse_command(skb, &pkt, &key_off);
	if (command == MB_CMD_OTHER)
		goto unparsed;
	struct mb_scratch *scratched = bpf_map_lookup_elem(&scratch, &zero);
	if (!scratched)
		return mb_forward(skb);
	struct mb_key *key = &scratched->key;
	int exact = 0;
	if (!mb_read_key(skb, &pkt, key_off, key, &exact))
		goto unparsed;
	struct mb_hot *hot = bpf_map_lookup_elem(&hot_keys, key);
	if (!hot)
		return mb_forward(skb);
	if (command == MB_CMD_WRITE)
		return mb_set_mirror(skb, &pkt, hot);
	if (pkt.proto == IPPROTO_UDP && exact)
		return mb_hot_get(skb, &pkt, hot);
	return mb_forward(skb);  /* a get over TCP, or with more keys: to its home, untouched */
unparsed:
	mb_count(MB_C_UNPARSED);
	return mb_forward(skb);
}

char LICENSE[] SEC("license") = "GPL";
