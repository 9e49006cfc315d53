/* Parsing: Ethernet / IPv4 / UDP or TCP / memcached UDP frame header / ASCII command and key.
 * Everything is read with bpf_skb_load_bytes, so paged (non-linear) packets parse the same as linear ones. */
#ifndef MB_PARSE_H
#define MB_PARSE_H

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/in.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "structs.h"
#include "maps.h"

#define MB_IP_BALANCED 0x8000  /* IPv4 reserved flag bit: "already balanced by a switch on the path" */
#define MB_FRAME_HEADER 8      /* memcached UDP frame: request id, sequence, datagrams, reserved */

struct mb_packet {
	__u32 ip_off, l4_off, payload_off, payload_len;
	__u32 saddr, daddr;       /* network order */
	__u16 sport, dport;       /* network order */
	__u16 frag_off;           /* network order, as in the header */
	__u16 request_id;         /* UDP: from the memcached frame header, network order */
	__u8 proto;
};

enum mb_command { MB_CMD_OTHER, MB_CMD_GET, MB_CMD_WRITE };

/* Ethernet + IPv4 + UDP/TCP headers; 0 if this is an unfragmented IPv4 UDP or TCP packet. */
static __always_inline int mb_parse_headers(struct __sk_buff *skb, struct ethhdr *eth, struct mb_packet *pkt)
{
	struct iphdr ip;
	if (bpf_skb_load_bytes(skb, 0, eth, sizeof(*eth)) < 0 || eth->h_proto != bpf_htons(ETH_P_IP))
		return -1;
	pkt->ip_off = sizeof(*eth);
	if (bpf_skb_load_bytes(skb, pkt->ip_off, &ip, sizeof(ip)) < 0 || ip.version != 4 || ip.ihl < 5)
		return -1;
	if (ip.frag_off & bpf_htons(0x3fff))  /* a fragment (offset or more-fragments): not ours to read */
		return -1;
	if (ip.protocol != IPPROTO_UDP && ip.protocol != IPPROTO_TCP)
		return -1;
	pkt->proto = ip.protocol;
	pkt->saddr = ip.saddr;
	pkt->daddr = ip.daddr;
	pkt->frag_off = ip.frag_off;
	pkt->l4_off = pkt->ip_off + ip.ihl * 4;
	__u32 ip_end = pkt->ip_off + bpf_ntohs(ip.tot_len);  /* Ethernet may pad short frames */
	if (ip_end > skb->len)
		return -1;
	__u16 ports[2];
	if (bpf_skb_load_bytes(skb, pkt->l4_off, ports, sizeof(ports)) < 0)
		return -1;
	pkt->sport = ports[0];
	pkt->dport = ports[1];
	if (ip.protocol == IPPROTO_UDP) {
		pkt->payload_off = pkt->l4_off + 8;
	} else {
		__u8 data_off;
		if (bpf_skb_load_bytes(skb, pkt->l4_off + 12, &data_off, 1) < 0)
			return -1;
		pkt->payload_off = pkt->l4_off + (data_off >> 4) * 4;
	}
	if (pkt->payload_off > ip_end)
		return -1;
	pkt->payload_len = ip_end - pkt->payload_off;
	return 0;
}

/* The memcached UDP frame header of a single-datagram request; moves payload_off past it. 0 if readable. */
static __always_inline int mb_parse_udp_frame(struct __sk_buff *skb, struct mb_packet *pkt)
{
	__u16 header[4];
	if (pkt->payload_len < MB_FRAME_HEADER || bpf_skb_load_bytes(skb, pkt->payload_off, header, sizeof(header)) < 0)
		return -1;
	pkt->request_id = header[0];
	if (header[1] != 0 || header[2] != bpf_htons(1))  /* sequence 0 of 1 datagram */
		return -1;
	pkt->payload_off += MB_FRAME_HEADER;
	pkt->payload_len -= MB_FRAME_HEADER;
	return 0;
}

static __always_inline int mb_word(const __u8 *w, const char *s, int n)
{
	for (int i = 0; i < n; i++)
		if (w[i] != (__u8)s[i])
			return 0;
	return 1;
}

/* The command at the start of the payload: a get (get/gets) or a write the controller must see; sets *key_off
 * to the byte after "<command> ". */
static __always_inline enum mb_command mb_parse_command(struct __sk_buff *skb, struct mb_packet *pkt, __u32 *key_off)
{
	__u8 w[8] = {};
	/* The shortest command is 6 bytes ("md k\r\n"); a payload that ends the packet may be shorter than the 8 bytes
	 * compared (an unpadded frame), so load only what is there. */
	__u32 n = pkt->payload_len < sizeof(w) ? pkt->payload_len : sizeof(w);
	if (n < 6 || bpf_skb_load_bytes(skb, pkt->payload_off, w, n) < 0)
		return MB_CMD_OTHER;
#define MB_IS(word, kind) if (mb_word(w, word " ", sizeof(word))) { *key_off = pkt->payload_off + sizeof(word); return kind; }
	MB_IS("get", MB_CMD_GET)
	MB_IS("gets", MB_CMD_GET)
	MB_IS("set", MB_CMD_WRITE)
	MB_IS("add", MB_CMD_WRITE)
	MB_IS("cas", MB_CMD_WRITE)
	MB_IS("replace", MB_CMD_WRITE)
	MB_IS("append", MB_CMD_WRITE)
	MB_IS("prepend", MB_CMD_WRITE)
	MB_IS("delete", MB_CMD_WRITE)
	MB_IS("incr", MB_CMD_WRITE)
	MB_IS("decr", MB_CMD_WRITE)
	MB_IS("touch", MB_CMD_WRITE)
	MB_IS("ms", MB_CMD_WRITE)
	MB_IS("md", MB_CMD_WRITE)
	MB_IS("ma", MB_CMD_WRITE)
#undef MB_IS
	return MB_CMD_OTHER;
}

struct mb_scan {
	__u32 avail;  /* bytes loaded into the scratch key */
	__u32 len;    /* where the key ended */
	__u8 stop;    /* the byte that ended it: ' ' or '\r'; 0 if none */
	__u8 bad;     /* a control character: not a key */
};

/* bpf_loop callback: look at byte i of the scratch key. One callback, verified once, instead of a loop the
 * verifier would walk for every possible key length. */
static long mb_scan_byte(__u64 i, void *ctx)
{
	struct mb_scan *scan = ctx;
	__u32 zero = 0;
	struct mb_scratch *scratched = bpf_map_lookup_elem(&scratch, &zero);
	if (!scratched || i >= scan->avail || i >= MB_KEY_BYTES)
		return 1;
	__u8 c = scratched->key.bytes[i];
	if (c == ' ' || c == '\r') {
		scan->stop = c;
		scan->len = i;
		return 1;
	}
	if (c < 0x21 || c == 0x7f) {
		scan->bad = 1;
		return 1;
	}
	return 0;
}

/* Read the key at key_off into the scratch `key` (length set, rest zeroed). Returns the byte that ended it (' ' or
 * '\r'), or 0 if no valid 1..250-byte key ends within reach. For a get, *exact is set when the key is followed by
 * "\r\n" and nothing else: a single-key get the switch may balance. */
static __always_inline __u8 mb_read_key(struct __sk_buff *skb, struct mb_packet *pkt, __u32 key_off,
					struct mb_key *key, int *exact)
{
	__u32 end = pkt->payload_off + pkt->payload_len;
	if (key_off >= end)
		return 0;
	__u32 avail = end - key_off;
	if (avail > MB_KEY_BYTES)
		avail = MB_KEY_BYTES;
	struct mb_scan scan = {.avail = avail};
	/* Sizes are masked to 1..256 for the verifier (the value is unchanged: already 1..252); struct mb_scratch
	 * has room past the key for that. */
	if (bpf_skb_load_bytes(skb, key_off, key->bytes, ((avail - 1) & 0xff) + 1) < 0)
		return 0;
	bpf_loop(MB_KEY_BYTES, mb_scan_byte, &scan, 0);
	if (scan.bad || !scan.stop)
		return 0;
	__builtin_memset(key, 0, sizeof(*key));  /* reload the key alone: map keys compare all 252 bytes */
	__u32 len = scan.len;
	if (len < 1 || len > MB_MAX_KEY)
		return 0;
	if (bpf_skb_load_bytes(skb, key_off, key->bytes, ((len - 1) & 0xff) + 1) < 0)
		return 0;
	key->len = len;
	if (scan.stop == '\r') {
		__u8 lf = 0;
		bpf_skb_load_bytes(skb, key_off + len + 1, &lf, 1);
		*exact = lf == '\n' && key_off + len + 2 == end;
	}
	return scan.stop;
}

#endif
