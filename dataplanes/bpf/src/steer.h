/* The TCP path (dataplanes/ebpf/tcp/, docs/dataplanes/tcp.md): clients' TCP connections to memcached servers are taken
 * by the TCP splitter, a process on the switch's own machine behind one more port of the switch (tcp_path, maps.h).
 * Its sockets are in the switch's network namespace, so the kernel's socket table says which segments are its:
 * - a SYN to a memcached port, while the splitter listens on it, to a server whose gets this switch balances
 *   (tcp_homes: every server on one switch, the servers cabled to it on a fabric's leaf); before the controller
 *   has named them (a switch just loaded or reloaded, for a moment), to any server: a connection that passed then
 *   would stay unbalanced for its whole life, and the splitter learns the home later;
 * - any other segment between a client and a server whose connection the splitter holds, either way: the client's
 *   (the splitter accepted it) or the server's answer to one of the splitter's own connections (made from the
 *   client's address and port).
 * Those go to the splitter's port, destination MAC rewritten to the splitter's, and nothing else is done to them:
 * what the splitter then sends on passes the pipeline as any client's request (counted, copied, balanced). The
 * controller's own connections (trusted_sources, and any made from the switch's own namespace), connections from a
 * server's address (a splitter's to a replica, crossing the replica's leaf in a fabric: server_ips) and connections
 * that began before the splitter pass as before. Several switches in one namespace each know their splitter's
 * sockets by its mark; a splitter in another namespace (a Mininet fabric's box) is looked up there.
 * The splitter's side does no ARP: its frames get their destination's MAC here (a configured server's, or as the
 * clients' SYNs taught it in tcp_neighbors: a client's own, and the MAC the client sent its server's SYN to). */
#ifndef MB_STEER_H
#define MB_STEER_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "structs.h"
#include "maps.h"
#include "parse.h"

#define MB_TCP_SYN 0x02
#define MB_TCP_ACK 0x10
#define MB_TCP_SYN_SENT 2  /* BPF_TCP_SYN_SENT */
#define MB_TCP_LISTEN 10  /* BPF_TCP_LISTEN */

static __always_inline void mb_count_tcp(__u32 which)
{
	__u64 *n = bpf_map_lookup_elem(&tcp_counters, &which);
	if (n)
		*n += 1;  /* per-CPU */
}

static __always_inline struct mb_tcp_path *mb_tcp_path(void)
{
	__u32 zero = 0;
	struct mb_tcp_path *path = bpf_map_lookup_elem(&tcp_path, &zero);
	return path && path->ifindex ? path : 0;
}

/* Whether (ip, port) is a configured server. */
static __always_inline __u32 *mb_server_at(__u32 ip, __u16 port)
{
	struct mb_server_address address = {.ip = ip, .port = port};
	return bpf_map_lookup_elem(&server_index, &address);
}

static __always_inline void mb_learn_neighbor(__u32 ip, const unsigned char *mac_bytes)
{
	__u64 mac = 0;
	__builtin_memcpy(&mac, mac_bytes, ETH_ALEN);
	__u64 *known = bpf_map_lookup_elem(&tcp_neighbors, &ip);
	if (!known || *known != mac)
		bpf_map_update_elem(&tcp_neighbors, &ip, &mac, BPF_ANY);
}

/* Whether a socket of the namespace is this switch's splitter's: its mark (a connection being accepted: its
 * listener's). */
static __always_inline int mb_splitter_socket(struct bpf_sock *sk, const struct mb_tcp_path *path)
{
	struct bpf_sock *full = bpf_sk_fullsock(sk);
	if (full)
		return full->mark == path->mark;
	struct bpf_sock *listener = bpf_get_listener_sock(sk);
	return listener && listener->mark == path->mark;
}

/* 1 if this switch's splitter holds the segment's connection (or, `syn`, listens for it). */
static __always_inline int mb_splitter_holds(struct mb_ctx *skb, const struct mb_packet *pkt, int syn,
					     const struct mb_tcp_path *path)
{
	struct bpf_sock_tuple tuple = {.ipv4 = {.saddr = pkt->saddr, .daddr = pkt->daddr, .sport = pkt->sport,
						.dport = pkt->dport}};
	__u64 netns = path->netns < 0 ? BPF_F_CURRENT_NETNS : (__u64)path->netns;
	struct bpf_sock *sk = bpf_skc_lookup_tcp(skb, &tuple, sizeof(tuple.ipv4), netns, 0);
	if (!sk)
		return 0;
	int ours = mb_splitter_socket(sk, path), listening = sk->state == MB_TCP_LISTEN;
	bpf_sk_release(sk);
	return ours && (!listening || syn);
}

/* 1 if this switch's TCP path takes connections to the server at `server` (None: not a configured one). */
static __always_inline int mb_takes_home(const __u32 *server)
{
	__u32 named_at = MB_TCP_HOMES_NAMED;
	__u32 *named = bpf_map_lookup_elem(&tcp_homes, &named_at);
	if (!named || !*named)
		return 1;  /* none named yet: every connection, its home learned later */
	__u32 *home = server ? bpf_map_lookup_elem(&tcp_homes, server) : 0;
	return home && *home;
}

/* 1 if the SYN is this namespace's own connect (the box itself, the controller on it): its socket is here, waiting
 * for the answer. The splitter, which lives here too, could not connect on from the same address and port. */
static __always_inline int mb_own_connect(struct mb_ctx *skb, const struct mb_packet *pkt)
{
	struct bpf_sock_tuple tuple = {.ipv4 = {.saddr = pkt->daddr, .daddr = pkt->saddr, .sport = pkt->dport,
						.dport = pkt->sport}};
	struct bpf_sock *sk = bpf_skc_lookup_tcp(skb, &tuple, sizeof(tuple.ipv4), BPF_F_CURRENT_NETNS, 0);
	if (!sk)
		return 0;
	int connecting = sk->state == MB_TCP_SYN_SENT;
	bpf_sk_release(sk);
	return connecting;
}

/* The segment is for the splitter: to its port, or -1 if it is not. `to_port`, `from_port`: its destination's
 * and its source's port are memcached ports. */
static __always_inline int mb_steer_tcp(struct mb_ctx *skb, const struct mb_packet *pkt, int to_port,
					int from_port)
{
#ifdef MB_XDP
	return -1;  /* the TCP path is the eBPF switch's, never the classifier's (and XDP may not look up sockets) */
#endif
	struct mb_tcp_path *path = mb_tcp_path();
	if (!path || pkt->proto != IPPROTO_TCP || skb->ingress_ifindex == path->ifindex)
		return -1;
	int request = to_port, reply = !request && from_port;  /* the socket table says whether they are its */
	if ((!request && !reply) ||
	    bpf_map_lookup_elem(&trusted_sources, request ? &pkt->saddr : &pkt->daddr))
		return -1;
	int syn = request && (pkt->tcp_flags & (MB_TCP_SYN | MB_TCP_ACK)) == MB_TCP_SYN;
	if ((syn && (!mb_takes_home(mb_server_at(pkt->daddr, pkt->dport)) ||
		     bpf_map_lookup_elem(&server_ips, &pkt->saddr) || mb_own_connect(skb, pkt))) ||
	    !mb_splitter_holds(skb, pkt, syn, path))
		return -1;
	struct ethhdr *eth = mb_data(skb);
	if ((void *)(eth + 1) > mb_data_end(skb))
		return -1;
	if (request) {  /* the client's MAC, for the splitter's answers */
		mb_learn_neighbor(pkt->saddr, eth->h_source);
		if (syn)  /* and where the client sends its server's segments, for a server not configured (yet) */
			mb_learn_neighbor(pkt->daddr, eth->h_dest);
	}
	__builtin_memcpy(eth->h_dest, path->mac, ETH_ALEN);
	mb_count_tcp(MB_TCP_STEERED);
	if (syn)
		mb_count_tcp(MB_TCP_CONNECTIONS);
	return bpf_redirect(path->ifindex, 0);
}

/* 1 if the frame comes from the splitter; a TCP one gets its destination's MAC (the splitter's side does no ARP):
 * a configured server's, or a client's as its segments taught it. */
static __always_inline int mb_from_splitter(struct mb_ctx *skb, const struct mb_packet *pkt)
{
	struct mb_tcp_path *path = mb_tcp_path();
	if (!path || skb->ingress_ifindex != path->ifindex)
		return 0;
	struct ethhdr *eth = mb_data(skb);
	if (pkt->proto != IPPROTO_TCP || (void *)(eth + 1) > mb_data_end(skb))
		return 1;
	__u32 *server = mb_server_at(pkt->daddr, pkt->dport);
	struct mb_server *to = server ? bpf_map_lookup_elem(&servers, server) : 0;
	__u64 *mac = to ? 0 : bpf_map_lookup_elem(&tcp_neighbors, &pkt->daddr);
	if (to)
		__builtin_memcpy(eth->h_dest, to->mac, ETH_ALEN);
	else if (mac)
		__builtin_memcpy(eth->h_dest, mac, ETH_ALEN);
	return 1;
}

#endif
