// SPDX-License-Identifier: GPL-2.0
/* MBalancer's data plane as a tc (clsact ingress) program, attached to every port of one switch.
 * It implements the pipeline (docs/architecture.md, "The pipeline") table for table:
 *   hot_get      single-key UDP get/gets of a hot key: dirty (or the controller's lease out) -> home unchanged;
 *                else a replica chosen by weight from a hash of the request id and client, dst MAC/IP/port
 *                rewritten, marked balanced
 *   set_mirror   a write (UDP or TCP) to a hot key's home: forwarded unchanged, counted in its slot (dirty), cloned
 *                to the controller (writes to replicas are the controller's own copies); a request to a server that
 *                is not exactly one command the pipeline reads is counted unsure for that server (all its hot keys
 *                dirty) and cloned too
 *   reply_source UDP replies to balanced gets leave with the home server's source MAC/IP/port
 *   forward      destination MAC -> port (learned from source MACs, or set by the controller); flood otherwise
 *                (a balanced get flooded is counted against its server); a server's TCP source MAC recorded
 *   counters     per hot key and replica, and switch-wide
 *   sketch       every get's key counted (count-min sketch, heavy-key candidates) while a reader asks for it
 * Anything it cannot read is forwarded untouched.
 *
 * Built with -DMB_CLASSIFIER it is the OpenFlow data plane's key classifier instead (dataplanes/openflow/): the same
 * parser, dirty state, lease and counters, on the wire side of each port of an OpenFlow switch (tc egress of the
 * link's far end), where it neither forwards nor rewrites: it marks the packets the switch's rules act on by
 * writing a tag in place of a MAC address (dataplanes/openflow/tags.py has the layout), and passes every packet on.
 * A clean hot get gets GET(slot, entropy) as destination MAC (and the balanced mark, for the replica's switch in a
 * fabric), a packet the controller must see COPY(server), a reply to a get it may have balanced REPLY(home) as
 * source MAC; a reply to a get another switch balanced is rewritten here, as the eBPF switch does, and that get
 * itself gets BALANCED as source MAC, so that the switch does not learn its client behind the wrong port. */
#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "structs.h"
#include "maps.h"
#include "parse.h"
#include "rewrite.h"
#include "sketch.h"
#include "steer.h"

static __always_inline void mb_count(__u32 which)
{
	__u64 *n = bpf_map_lookup_elem(&counters, &which);
	if (n)
		*n += 1;  /* per-CPU: no atomics needed */
}

#ifdef MB_CLASSIFIER
/* The classifier's tags, a locally administered unicast MAC: MB_TAG_FIRST, kind, index (16 bits), entropy (16).
 * A get's entropy has MB_TAG_ENTROPY_BITS: the switch hashes the whole tag to pick a replica and caches one
 * datapath flow per tag value, so more bits would spread the weights more finely at the cost of more cache misses. */
#define MB_TAG_FIRST 0x0e
#define MB_TAG_ENTROPY_BITS 10
enum mb_tag_kind { MB_TAG_GET = 1, MB_TAG_COPY = 2, MB_TAG_REPLY = 3, MB_TAG_BALANCED = 4 };

static __always_inline void mb_tag(struct mb_ctx *skb, int source, __u8 kind, __u16 index, __u16 entropy)
{
	struct ethhdr *eth = mb_data(skb);
	if ((void *)(eth + 1) > mb_data_end(skb))
		return;
	__u8 *mac = source ? eth->h_source : eth->h_dest;
	mac[0] = MB_TAG_FIRST;
	mac[1] = kind;
	mac[2] = index >> 8;
	mac[3] = index & 0xff;
	mac[4] = entropy >> 8;
	mac[5] = entropy & 0xff;
}
#endif

static __always_inline __u64 mb_mac_key(const __u8 *mac)
{
	__u64 key = 0;
	__builtin_memcpy(&key, mac, ETH_ALEN);
	return key;
}

/* forward, learning half: where the packet's source lives. Runs first, before any rewrite: a reply rewritten to
 * carry the home's source MAC must not teach the switch that the home sits behind the replica's port. */
static __always_inline void mb_learn(struct mb_ctx *skb)
{
#ifdef MB_CLASSIFIER
	return;  /* the OpenFlow switch forwards */
#endif
	struct ethhdr *eth = mb_data(skb);
	if ((void *)(eth + 1) > mb_data_end(skb) || (eth->h_source[0] & 1))
		return;
	__u64 src = mb_mac_key(eth->h_source);
	__u32 in = skb->ingress_ifindex;
	__u32 *known = bpf_map_lookup_elem(&forward, &src);
	if (!known || *known != in)
		bpf_map_update_elem(&forward, &src, &in, BPF_ANY);
}

/* server_macs_seen: the source MAC of a TCP segment from a server's address (every health probe of the controller
 * brings some). UDP replies are not used: in a fabric, a reply rewritten upstream carries a replica's MAC with the
 * home's address. Written only when it changes. The classifier notes them too (the OpenFlow switch forwards them
 * untouched); there the gets flooded to a server's MAC are counted by the switch's own rules. */
static __always_inline void mb_note_server_mac(struct mb_ctx *skb, const struct mb_packet *pkt)
{
	struct mb_server_address address = {.ip = pkt->saddr, .port = pkt->sport};
	__u32 *server = bpf_map_lookup_elem(&server_index, &address);
	struct ethhdr *eth = mb_data(skb);
	if (!server || (void *)(eth + 1) > mb_data_end(skb))
		return;
	struct mb_server_seen *seen = bpf_map_lookup_elem(&server_macs_seen, server);
	__u64 mac = mb_mac_key(eth->h_source);
	if (!seen || (seen->seen && mb_mac_key(seen->mac) == mac))
		return;
	__builtin_memcpy(seen->mac, eth->h_source, ETH_ALEN);
	seen->seen = 1;
}

#define MB_NO_SERVER 0xffffffffu  /* mb_send: not a get balanced to a server */

/* forward: out of the port the destination MAC was learned on, or flooded. `hairpin`: the switch rewrote the
 * destination, so the port it came in by is a way out too (a fabric's home leaf sends a balanced get back up to a
 * spine). `server`: the server a balanced get was rewritten to; flooded, it is counted against that server's MAC. */
static __always_inline int mb_send(struct mb_ctx *skb, int hairpin, __u32 server)
{
#ifdef MB_CLASSIFIER
	return MB_PASS;  /* on to the wire: the OpenFlow switch forwards */
#else
	struct ethhdr *eth = mb_data(skb);  /* read in place (after any rewrite: pointers taken anew) */
	if ((void *)(eth + 1) > mb_data_end(skb))
		return MB_DROP;
	__u32 in = hairpin ? 0 : skb->ingress_ifindex;
	__u64 dst = mb_mac_key(eth->h_dest);
	__u32 *out = (eth->h_dest[0] & 1) ? 0 : bpf_map_lookup_elem(&forward, &dst);
	if (out && *out != in)
		return bpf_redirect(*out, 0);
	if (out) {
		mb_count(MB_C_DROPPED);  /* the destination is behind the port it came from */
		return MB_DROP;
	}
	mb_count(MB_C_FLOODED);
	struct mb_server_seen *seen = server == MB_NO_SERVER ? 0 : bpf_map_lookup_elem(&server_macs_seen, &server);
	if (seen)
		__sync_fetch_and_add(&seen->flooded, 1);
#pragma unroll  /* the verifier sees each copy once; a rolled loop around a helper call looks infinite to it */
	for (__u32 i = 0; i < MB_MAX_PORTS; i++) {
		__u32 index = i;
		__u32 *port = bpf_map_lookup_elem(&ports, &index);
		if (!port || !*port)
			break;
		if (*port != in)
			bpf_clone_redirect(skb, *port, 0);
	}
	return MB_DROP;  /* every copy has been sent */
#endif
}

static __always_inline int mb_forward(struct mb_ctx *skb)
{
	return mb_send(skb, 0, MB_NO_SERVER);
}

static __always_inline int mb_is_memcached_port(const struct mb_port_set *memcached, __u16 port_be)
{
	__u16 port = bpf_ntohs(port_be);
	return memcached && (memcached->bits[port >> 6] >> (port & 63)) & 1;
}

/* A get's hash: its low 16 bits pick the replica (the point on the key's weights), the high 16 its flow's bucket. */
static __always_inline __u32 mb_flow_hash(const struct mb_flow *flow)
{
	__u32 h = ((__u32)flow->request_id | ((__u32)flow->client_port << 16)) ^ flow->client_ip;
	h *= 0x9E3779B1u;
	h ^= h >> 15;
	h *= 0x85EBCA77u;
	h ^= h >> 13;
	return h;
}

static __always_inline int mb_same_flow(const struct mb_flow *a, const struct mb_flow *b)
{
	return a->client_ip == b->client_ip && a->client_port == b->client_port && a->request_id == b->request_id;
}

/* Remember where a balanced get's reply must seem to come from (struct mb_flow_bucket). */
static __always_inline void mb_remember_flow(const struct mb_flow *flow, __u32 hash, __u32 home)
{
	__u32 index = hash >> 16;
	struct mb_flow_bucket *bucket = bpf_map_lookup_elem(&flows, &index);
	if (!bucket)
		return;
	__u32 way = bucket->next & 1;
	if (mb_same_flow(&bucket->way[0].flow, flow))
		way = 0;
	else if (mb_same_flow(&bucket->way[1].flow, flow))
		way = 1;
	else
		bucket->next = way ^ 1;
	bucket->way[way].flow = *flow;
	bucket->way[way].home = home;
}

/* The home a reply to `flow` must seem to come from, if its get was balanced. */
static __always_inline __u32 *mb_flow_home(const struct mb_flow *flow)
{
	__u32 index = mb_flow_hash(flow) >> 16;
	struct mb_flow_bucket *bucket = bpf_map_lookup_elem(&flows, &index);
	if (!bucket)
		return 0;
	if (mb_same_flow(&bucket->way[0].flow, flow))
		return &bucket->way[0].home;
	if (mb_same_flow(&bucket->way[1].flow, flow))
		return &bucket->way[1].home;
	return 0;
}

/* Dirty: gets go home. True unless the controller's lease runs and the slot's and home's counts still equal what
 * the controller synced the slot to (struct mb_synced). */
static __always_inline int mb_dirty(const struct mb_hot *hot)
{
	__u32 zero = 0, slot = hot->slot, home = hot->home;
	__u64 *until = bpf_map_lookup_elem(&lease, &zero);
	if (!until || bpf_ktime_get_ns() >= *until) {
		mb_count(MB_C_LEASE_EXPIRED);
		return 1;
	}
	struct mb_synced *synced_to = bpf_map_lookup_elem(&synced, &slot);
	__u64 *written = bpf_map_lookup_elem(&writes, &slot);
	__u64 *unsure_count = bpf_map_lookup_elem(&unsure, &home);
	if (!synced_to || !written || !unsure_count)
		return 1;
	return synced_to->writes != *written || synced_to->unsure != *unsure_count;
}

/* Copy the packet to the controller (a mirrored write, or an unsure request it must check) and send it on to
 * `server`, its destination. */
static __always_inline void mb_clone_to_controller(struct mb_ctx *skb, __u32 server)
{
#ifdef MB_CLASSIFIER
	mb_tag(skb, 0, MB_TAG_COPY, server, 0);  /* the switch restores the server's MAC and copies it up */
	mb_count(MB_C_CLONED);
#else
	__u32 zero = 0;
	struct mb_settings *cfg = bpf_map_lookup_elem(&settings, &zero);
	if (cfg && cfg->controller_ifindex && bpf_clone_redirect(skb, cfg->controller_ifindex, 0) == 0)
		mb_count(MB_C_CLONED);
#endif
}

static __always_inline struct mb_stream_id mb_stream_of(const struct mb_packet *pkt)
{
	struct mb_stream_id id = {.client_ip = pkt->saddr, .server_ip = pkt->daddr, .client_port = pkt->sport,
				  .server_port = pkt->dport};
	return id;
}

/* The request may hold writes the pipeline cannot read: every hot key of its server is dirty from now until the
 * controller has checked them; the controller gets a copy. Requests to no known server are not ours. Over TCP the
 * segment may also end inside a command, which the connection's next segment would finish: from here on the
 * connection is read as a stream, by the controller (struct mb_stream). `coalesce`: the controller could not read
 * the copy either, so one copy per report is enough (unsure_reported, maps.h). */
static __always_inline void mb_unsure_copy(struct mb_ctx *skb, struct mb_packet *pkt, int coalesce)
{
	struct mb_server_address address = {.ip = pkt->daddr, .port = pkt->dport};
	__u32 *server = bpf_map_lookup_elem(&server_index, &address);
	if (!server || bpf_map_lookup_elem(&trusted_sources, &pkt->saddr))
		return;
	__u64 *count = bpf_map_lookup_elem(&unsure, server);
	if (count)
		__sync_fetch_and_add(count, 1);
	mb_count(MB_C_UNSURE);
	if (pkt->proto == IPPROTO_TCP && !pkt->mid_stream) {
		struct mb_stream_id id = mb_stream_of(pkt);
		struct mb_stream stream = {.start = pkt->seq};
		bpf_map_update_elem(&streams, &id, &stream, BPF_ANY);
	}
	__u64 *last = bpf_map_lookup_elem(&unsure_last, server);
	__u32 *reported = bpf_map_lookup_elem(&unsure_reported, server);
	if (coalesce && last && reported) {
		*last = bpf_ktime_get_ns();
		if (*reported) {
			mb_count(MB_C_COALESCED);
			return;  /* the check the copied one started has not rearmed yet: it covers this one */
		}
		*reported = 1;  /* (two CPUs may both copy one: a spare copy, no harm) */
	}
	mb_clone_to_controller(skb, *server);
}

static __always_inline void mb_unsure(struct mb_ctx *skb, struct mb_packet *pkt)
{
	mb_unsure_copy(skb, pkt, 0);
}

#define MB_TCP_FIN 0x01
#define MB_TCP_RST 0x04

/* A request segment of a connection that stopped mid-command (struct mb_stream): unsure, whatever it looks like
 * (`mn\r\n` may be the last bytes of a value), unless it starts where the controller proved a command starts; then
 * it is read on its own again. A connection that ends forgets its entry. 1 if the segment was made unsure. */
static __always_inline int mb_mid_stream(struct mb_ctx *skb, struct mb_packet *pkt)
{
	struct mb_stream_id id = mb_stream_of(pkt);
	struct mb_stream *stream = bpf_map_lookup_elem(&streams, &id);
	if (!stream)
		return 0;
	int resumed = stream->mode == MB_STREAM_RESUMES && stream->resume == pkt->seq;
	if (pkt->payload_len > 0 && !resumed) {
		pkt->mid_stream = 1;
		mb_unsure_copy(skb, pkt, stream->mode == MB_STREAM_BLIND);
	}
	if (resumed || (pkt->tcp_flags & (MB_TCP_FIN | MB_TCP_RST)))
		bpf_map_delete_elem(&streams, &id);
	return pkt->mid_stream;
}

/* True while the server may have lost its copies (struct closes, maps.h): it closed the controller's connection
 * and the controller has not dealt with that yet. */
static __always_inline int mb_server_suspect(__u32 server)
{
	__u64 *closed = bpf_map_lookup_elem(&closes, &server);
	__u64 *handled = bpf_map_lookup_elem(&closes_handled, &server);
	return !closed || !handled || *closed != *handled;
}

/* A server's memcached closed (FIN or RST) a connection of the controller's: it may be dying or restarting, and
 * whatever it held may be gone by its next packet. From now on no get is balanced to it and its hot keys are
 * dirty, until the controller has checked it; the controller gets a copy to learn of it at once (and reads
 * `closes` with every health probe besides). */
static __always_inline void mb_server_closed(struct mb_ctx *skb, struct mb_packet *pkt)
{
	struct mb_server_address address = {.ip = pkt->saddr, .port = pkt->sport};
	__u32 *server = bpf_map_lookup_elem(&server_index, &address);
	if (!server || !bpf_map_lookup_elem(&trusted_sources, &pkt->daddr))
		return;
	struct mb_stream_id id = {.client_ip = pkt->daddr, .server_ip = pkt->saddr, .client_port = pkt->dport,
				  .server_port = pkt->sport};
	if (bpf_map_lookup_elem(&closing, &id)) {  /* the answer to the controller's own close */
		bpf_map_delete_elem(&closing, &id);
		return;
	}
	__u64 *closed = bpf_map_lookup_elem(&closes, server);
	__u64 *count = bpf_map_lookup_elem(&unsure, server);
	if (closed)
		__sync_fetch_and_add(closed, 1);
	if (count)
		__sync_fetch_and_add(count, 1);
#ifndef MB_CLASSIFIER  /* the classifier's copy tag would send it to the server: the controller polls `closes` */
	mb_clone_to_controller(skb, *server);
#endif
}

/* hot_get's first step, for the UDP path and the TCP splitter's questions alike: the get counted for its key; the
 * key's counters, and in `dirty` whether it is dirty (then counted as sent home). */
static __always_inline struct mb_key_counters *mb_count_hot_get(const struct mb_hot *hot, int *dirty)
{
	__u32 slot = hot->slot;
	struct mb_key_counters *kc = bpf_map_lookup_elem(&key_counters, &slot);
	if (kc)
		kc->gets++;
	*dirty = mb_dirty(hot);
	if (*dirty && kc)
		kc->home_while_dirty++;
	return kc;
}

/* hot_get's choice for a clean key: the server at the get's point on the key's weights, counted per replica;
 * MB_NO_SERVER if that is a replica that may have lost its copy (the get goes on untouched, home). */
static __always_inline __u32 mb_choose(const struct mb_hot *hot, struct mb_key_counters *kc, __u32 point)
{
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
	return chosen != hot->home && mb_server_suspect(chosen) ? MB_NO_SERVER : chosen;
}

static __always_inline int mb_hot_get(struct mb_ctx *skb, struct mb_packet *pkt, struct mb_hot *hot)
{
	int dirty;
	struct mb_key_counters *kc = mb_count_hot_get(hot, &dirty);
	if (dirty)
		return mb_forward(skb);  /* clients address the home: unchanged is home */
	struct mb_flow flow = {.client_ip = pkt->saddr, .client_port = pkt->sport, .request_id = pkt->request_id};
	__u32 hash = mb_flow_hash(&flow), point = hash & (MB_WEIGHT_ONE - 1);
#ifdef MB_CLASSIFIER
	/* The switch's select group picks the replica, among all of the key's: if one may have lost its copy, home. */
	for (__u32 i = 0; i < MB_MAX_REPLICAS; i++) {
		if (i >= hot->replicas)
			break;
		if (hot->server[i] != hot->home && mb_server_suspect(hot->server[i]))
			return mb_forward(skb);
	}
	/* The switch's select group picks the replica (hashing the tag, entropy included); its reply may come from
	 * any of them, so the flow is remembered whatever the choice. */
	mb_remember_flow(&flow, hash, hot->home);
	if (mb_mark_balanced(skb, pkt, hot->home) < 0)  /* for a replica behind another switch (a fabric) */
		return MB_DROP;
	mb_tag(skb, 0, MB_TAG_GET, hot->slot, point >> (16 - MB_TAG_ENTROPY_BITS));
	mb_count(MB_C_BALANCED);
	return MB_PASS;
#endif
	__u32 chosen = mb_choose(hot, kc, point);
	if (chosen == MB_NO_SERVER)
		return mb_forward(skb);  /* it may have lost its copy since the controller last looked: home */
	struct mb_server *server = bpf_map_lookup_elem(&servers, &chosen);
	if (!server)
		return mb_forward(skb);
	if (chosen != hot->home)
		mb_remember_flow(&flow, hash, hot->home);
	if (mb_rewrite_destination(skb, pkt, server, hot->home) < 0)
		return MB_DROP;  /* a half-rewritten packet must not leave */
	mb_count(MB_C_BALANCED);
	return mb_send(skb, chosen != hot->home, chosen);
}

/* A write to a hot key: counted in its slot (which makes it dirty) before it leaves for the home, so no get
 * after it can reach a copy the controller has not synced. `whole`: the packet is this one command and nothing
 * else; if not, its server is also unsure. */
static __always_inline int mb_set_mirror(struct mb_ctx *skb, struct mb_packet *pkt, struct mb_hot *hot, int whole)
{
	__u32 slot = hot->slot, home = hot->home;
	struct mb_server *server = bpf_map_lookup_elem(&servers, &home);
	if (!server || server->ip != pkt->daddr || server->port != pkt->dport) {
		if (!whole)  /* only writes to the home count: the controller's own copies to replicas do not */
			mb_unsure(skb, pkt);
		return mb_forward(skb);
	}
	__u64 *written = bpf_map_lookup_elem(&writes, &slot);
	if (written)
		__sync_fetch_and_add(written, 1);
	struct mb_key_counters *kc = bpf_map_lookup_elem(&key_counters, &slot);
	if (kc)
		kc->mirrored++;
	mb_count(MB_C_MIRRORED);
	if (whole || bpf_map_lookup_elem(&trusted_sources, &pkt->saddr))
		mb_clone_to_controller(skb, home);  /* the controller's own never make a server unsure, but are copied */
	else
		mb_unsure(skb, pkt);  /* counts, and clones once */
	return mb_forward(skb);
}

/* A get another switch balanced (its IP ID names the home, mb_rewrite_destination): the reply leaves the replica
 * through this switch first, maybe never through the one that balanced it, so this one remembers the home too. */
static __always_inline void mb_balanced_upstream(struct mb_ctx *skb, struct mb_packet *pkt)
{
	__u16 id;
	if (mb_parse_udp_frame(skb, pkt) < 0 || mb_load(skb, pkt->ip_off + 4, &id, sizeof(id)) < 0)
		return;
	__u32 home = bpf_ntohs(id);
	struct mb_server *server = bpf_map_lookup_elem(&servers, &home);
	if (!server || server->ip == pkt->daddr)
		return;  /* not a server this switch knows, or the get went home after all */
	struct mb_flow flow = {.client_ip = pkt->saddr, .client_port = pkt->sport, .request_id = pkt->request_id};
	mb_remember_flow(&flow, mb_flow_hash(&flow), home | MB_FLOW_UPSTREAM);
}

static __always_inline int mb_reply_source(struct mb_ctx *skb, struct mb_packet *pkt)
{
	__u16 header[1];
	if (pkt->payload_len < MB_FRAME_HEADER || mb_load(skb, pkt->payload_off, header, sizeof(header)) < 0)
		return mb_forward(skb);
	struct mb_flow flow = {.client_ip = pkt->daddr, .client_port = pkt->dport, .request_id = header[0]};
	__u32 *remembered = mb_flow_home(&flow);
	if (!remembered)
		return mb_forward(skb);
	__u32 home = *remembered & ~MB_FLOW_UPSTREAM;
	struct mb_server *server = bpf_map_lookup_elem(&servers, &home);
	if (server && (server->ip != pkt->saddr || server->port != pkt->sport)) {
#ifdef MB_CLASSIFIER
		/* Balanced here: the switch writes the home's MAC, IP and port. Balanced by the home's switch, upstream:
		 * rewritten here, the replica's MAC kept, so that no switch on the way learns the home behind this one. */
		if (*remembered & MB_FLOW_UPSTREAM) {
			if (mb_rewrite_source(skb, pkt, server, 0) < 0)
				return MB_DROP;
		} else {
			mb_tag(skb, 1, MB_TAG_REPLY, home, 0);
		}
		mb_count(MB_C_REPLIES_REWRITTEN);
		return MB_PASS;
#endif
		if (mb_rewrite_source(skb, pkt, server, !(*remembered & MB_FLOW_UPSTREAM)) < 0)
			return MB_DROP;
		mb_count(MB_C_REPLIES_REWRITTEN);
	}
	return mb_forward(skb);
}

#ifdef MB_XDP
SEC("xdp")
#else
SEC("tc")
#endif
int mbalancer(struct mb_ctx *skb)
{
	struct mb_packet pkt = {};
	__u32 zero = 0;
	mb_count(MB_C_PACKETS);
	int parsed = mb_parse_headers(skb, &pkt);  /* first: it may pull the headers into the linear part */
	if (parsed == MB_UNREADABLE)
		return MB_DROP;  /* a write among them could not be counted: dropped, as under any memory shortage */
	if (!(pkt.frag_off & bpf_htons(MB_IP_BALANCED)))
		mb_learn(skb);  /* a balanced get keeps its client's MAC but may come back the way it went: not learned */
#ifdef MB_CLASSIFIER
	else  /* balanced by a switch of another kind, which kept the client's MAC: the OpenFlow switch learns no
	       * tagged source (as it finds from an OpenFlow home leaf, whose group writes the same tag) */
		mb_tag(skb, 1, MB_TAG_BALANCED, 0, 0);
#endif
	struct mb_port_set *memcached = bpf_map_lookup_elem(&memcached_ports, &zero);
	if (parsed == MB_FIRST_FRAGMENT && mb_is_memcached_port(memcached, pkt.dport)) {
		/* A request too big for one frame (a UDP set of a large value): the server applies it once every
		 * fragment is in, after this first one passes, so marking its server unsure now is in time. */
		mb_count(MB_C_MEMCACHED);
		mb_count(MB_C_UNPARSED);
		mb_unsure(skb, &pkt);
		return mb_forward(skb);
	}
	if (parsed < 0)
		return mb_forward(skb);
	int request = mb_is_memcached_port(memcached, pkt.dport);
	int steered = mb_steer_tcp(skb, &pkt, request, mb_is_memcached_port(memcached, pkt.sport));
	if (steered >= 0)
		return steered;  /* the TCP splitter's (steer.h): what it sends on comes back through a port */
	int from_splitter = mb_from_splitter(skb, &pkt);
	if (pkt.proto == IPPROTO_UDP && !request && mb_is_memcached_port(memcached, pkt.sport))
		return mb_reply_source(skb, &pkt);
	if (pkt.proto == IPPROTO_TCP && !request && !from_splitter && mb_is_memcached_port(memcached, pkt.sport)) {
		mb_note_server_mac(skb, &pkt);
		if (pkt.tcp_flags & (MB_TCP_FIN | MB_TCP_RST))
			mb_server_closed(skb, &pkt);
	}
	if (!request)
		return mb_forward(skb);
	mb_count(MB_C_MEMCACHED);
	if (pkt.frag_off & bpf_htons(MB_IP_BALANCED)) {
		mb_count(MB_C_ALREADY_BALANCED);
		if (pkt.proto == IPPROTO_UDP)
			mb_balanced_upstream(skb, &pkt);
		return mb_forward(skb);
	}
	if (pkt.proto == IPPROTO_TCP && (pkt.tcp_flags & (MB_TCP_FIN | MB_TCP_RST)) &&
	    bpf_map_lookup_elem(&trusted_sources, &pkt.saddr)) {
		struct mb_stream_id id = mb_stream_of(&pkt);  /* the controller closes: the server's FIN will answer */
		__u8 mark = 1;
		bpf_map_update_elem(&closing, &id, &mark, BPF_ANY);
	}
	if (pkt.proto == IPPROTO_TCP && mb_mid_stream(skb, &pkt))
		return mb_forward(skb);
	if (pkt.payload_len == 0)
		return mb_forward(skb);  /* a bare TCP ACK: nothing to read, nothing wrong */
	if (pkt.proto == IPPROTO_UDP && mb_parse_udp_frame(skb, &pkt) < 0)
		goto unparsed;
	__u32 key_off = 0;
	__u8 data_field = MB_NO_DATA;
	enum mb_command command = mb_parse_command(skb, &pkt, &key_off, &data_field);
	if (command == MB_CMD_NOOP)
		return mb_forward(skb);
	if (command == MB_CMD_OTHER)
		goto unparsed;
	if (command == MB_CMD_LINE) {
		if (!mb_whole_command(skb, &pkt, key_off, MB_NO_DATA, command))
			mb_unsure(skb, &pkt);
		return mb_forward(skb);
	}
	struct mb_scratch *scratched = bpf_map_lookup_elem(&scratch, &zero);
	if (!scratched)
		goto unparsed;
	struct mb_key *key = &scratched->key;
	int exact = 0, maybe_hot = 0;
	__u64 hash = 0;
	if (!mb_read_key(skb, &pkt, key_off, key, &exact, &maybe_hot, &hash))
		goto unparsed;
	if (command == MB_CMD_GET)  /* UDP or TCP; of a multi-key get, the first key */
		mb_sketch_get(&pkt, key, hash);
	__u32 key_end = key_off + key->len;
	struct mb_hot *hot = maybe_hot ? mb_hot_key(key, hash) : 0;  /* hot_filter: cold keys skip the lookup */
	if (command == MB_CMD_GET && exact) {  /* a single-key get, and nothing else */
		if (hot && pkt.proto == IPPROTO_UDP)
			return mb_hot_get(skb, &pkt, hot);
		return mb_forward(skb);  /* over TCP: to its home, untouched */
	}
	/* From here on the key map lookup is done: the scratch line may reuse the scratch space after the key. */
	int whole = mb_whole_command(skb, &pkt, key_end, data_field, command);
	if (command == MB_CMD_WRITE && hot)
		return mb_set_mirror(skb, &pkt, hot, whole);
	if (!whole)
		mb_unsure(skb, &pkt);
	return mb_forward(skb);  /* a read, or a write to a cold key */
unparsed:
	mb_count(MB_C_UNPARSED);
	mb_unsure_copy(skb, &pkt, pkt.proto == IPPROTO_UDP);  /* a TCP one starts a stream: its copy is needed */
	return mb_forward(skb);
}

#ifndef MB_CLASSIFIER
/* decide: the TCP splitter asks where a get goes (dataplanes/ebpf/tcp/src/decide.c), through BPF_PROG_TEST_RUN: a UDP
 * get of the key from its client to the server the client addressed, marked MB_DECIDE_MARK (a port's packet has an
 * ingress_ifindex, a question none). The answer is hot_get's: cb[1] the server (the addressed one when the key is
 * cold, dirty, its replica suspect, or asked for by the controller), cb[0] MB_DECIDED. Counted as hot_get counts;
 * nothing else is done: no flow remembered, no rewrite, no sketch (the splitter's own get to the chosen server passes
 * a port and is seen there). */
SEC("tc")
int mbalancer_decide(struct mb_ctx *skb)
{
	struct mb_packet pkt = {};
	__u32 zero = 0, key_off = 0;
	__u8 data_field = MB_NO_DATA;
	if (skb->mark != MB_DECIDE_MARK || skb->ingress_ifindex || mb_parse_headers(skb, &pkt) < 0 ||
	    pkt.proto != IPPROTO_UDP || mb_parse_udp_frame(skb, &pkt) < 0 ||
	    mb_parse_command(skb, &pkt, &key_off, &data_field) != MB_CMD_GET)
		return MB_DROP;
	__u32 *addressed = mb_server_at(pkt.daddr, pkt.dport);
	struct mb_scratch *scratched = bpf_map_lookup_elem(&scratch, &zero);
	if (!addressed || !scratched)
		return MB_DROP;
	struct mb_key *key = &scratched->key;
	int exact = 0, maybe_hot = 0, dirty = 1;
	__u64 hash = 0;
	if (!mb_read_key(skb, &pkt, key_off, key, &exact, &maybe_hot, &hash))
		return MB_DROP;
	mb_count_tcp(MB_TCP_GETS);
	/* the controller's own reads go home, even on a connection the splitter took before it was trusted */
	int trusted = bpf_map_lookup_elem(&trusted_sources, &pkt.saddr) != 0;
	struct mb_hot *hot = maybe_hot && exact && !trusted ? mb_hot_key(key, hash) : 0;
	__u32 chosen = MB_NO_SERVER;
	if (hot) {
		struct mb_key_counters *kc = mb_count_hot_get(hot, &dirty);
		struct mb_flow flow = {.client_ip = pkt.saddr, .client_port = pkt.sport, .request_id = pkt.request_id};
		if (!dirty)
			chosen = mb_choose(hot, kc, mb_flow_hash(&flow) & (MB_WEIGHT_ONE - 1));
		if (chosen == MB_NO_SERVER)
			mb_count_tcp(MB_TCP_HOME_WHILE_DIRTY);
	}
	if (chosen == MB_NO_SERVER)
		chosen = *addressed;
	if (chosen != *addressed)
		mb_count_tcp(MB_TCP_BALANCED);
	skb->cb[0] = MB_DECIDED;
	skb->cb[1] = chosen;
	return MB_PASS;
}
#endif

char LICENSE[] SEC("license") = "GPL";
