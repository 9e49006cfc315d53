/* Parsing: Ethernet / IPv4 / UDP or TCP / memcached UDP frame header / ASCII command and key.
 * Headers and short fields are read in place (direct packet access) where they are in the packet's linear part,
 * else with bpf_skb_load_bytes, so paged (non-linear) packets parse the same as linear ones; the key and the rest
 * of a command line are copied with bpf_skb_load_bytes (one call for up to 256 bytes). Built with -DMB_XDP (the key
 * classifier for a port Open vSwitch's userspace datapath reads) the context is an XDP frame, read with
 * bpf_xdp_load_bytes: mb_ctx below. */
#ifndef MB_PARSE_H
#define MB_PARSE_H

#include <stddef.h>
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/in.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include <linux/pkt_cls.h>
#include "structs.h"
#include "maps.h"

/* The program's context: a tc program's socket buffer; built with -DMB_XDP (the key classifier only), an XDP
 * program's frame, for a port whose reader sees frames before tc ingress (a NIC of Open vSwitch's userspace
 * datapath). Everything below reads and writes the packet through these. */
#ifdef MB_XDP
#define mb_ctx xdp_md
#define MB_PASS XDP_PASS
#define MB_DROP XDP_DROP
#define mb_load_bytes bpf_xdp_load_bytes
#else
#define mb_ctx __sk_buff
#define MB_PASS TC_ACT_OK
#define MB_DROP TC_ACT_SHOT
#define mb_load_bytes bpf_skb_load_bytes
#endif

#define MB_IP_BALANCED 0x8000  /* IPv4 reserved flag bit: "already balanced by a switch on the path" */
#define MB_FRAME_HEADER 8      /* memcached UDP frame: request id, sequence, datagrams, reserved */
#define MB_FIRST_FRAGMENT 1    /* mb_parse_headers: the first fragment of a fragmented packet (ports read) */

struct mb_packet {
	__u32 ip_off, l4_off, payload_off, payload_len;
	__u32 saddr, daddr;       /* network order */
	__u16 sport, dport;       /* network order */
	__u16 frag_off;           /* network order, as in the header */
	__u16 request_id;         /* UDP: from the memcached frame header, network order */
	__u8 proto;
	__u8 tcp_flags;           /* TCP: the flags byte (FIN 0x01, RST 0x04) */
	__u8 mid_stream;          /* TCP: the segment may continue a command of an earlier one (struct mb_stream) */
	__u32 seq;                /* TCP: the sequence number, host order */
};

enum mb_command {
	MB_CMD_OTHER,  /* not a command the pipeline reads: unsure */
	MB_CMD_GET,    /* get, gets */
	MB_CMD_WRITE,  /* a write the controller must see */
	MB_CMD_READ,   /* mg: reads, unless its flags ask for a change (T, N, I) */
	MB_CMD_NOOP,   /* mn: nothing */
	MB_CMD_LINE,   /* stats, version: a line without a key that changes no item */
};
#define MB_NO_DATA 0xff  /* the command has no data block */

/* skb->data and skb->data_end, loaded from the context at each use: left to itself the compiler may keep the
 * field's address (context + offset) in a register and load through it later, which the verifier refuses. */
static __always_inline void *mb_data(struct mb_ctx *skb)
{
	__u64 data;
	asm volatile("%0 = *(u32 *)(%1 + %2)" : "=r"(data) : "r"(skb), "i"(offsetof(struct mb_ctx, data)));
	return (void *)(long)data;
}

static __always_inline void *mb_data_end(struct mb_ctx *skb)
{
	__u64 end;
	asm volatile("%0 = *(u32 *)(%1 + %2)" : "=r"(end) : "r"(skb), "i"(offsetof(struct mb_ctx, data_end)));
	return (void *)(long)end;
}

#define MB_HEADERS_MAX (14 + 60 + 20)  /* Ethernet, IPv4 with every option, TCP up to its data offset and more */
#define MB_UNREADABLE -2             /* mb_parse_headers: the headers could not be made linear (no memory) */

/* Ethernet + IPv4 + UDP/TCP headers, read in place (direct packet access: no helper call per field). 0 if this is
 * an unfragmented IPv4 UDP or TCP packet, MB_FIRST_FRAGMENT if it is the first fragment of one (addresses and
 * ports read, nothing after them), -1 otherwise. Headers in paged data (rare on tc ingress) are pulled into the
 * linear part first; if that fails, MB_UNREADABLE: the caller must not forward what it could not check. */
static __always_inline int mb_parse_headers(struct mb_ctx *skb, struct mb_packet *pkt)
{
	void *data = mb_data(skb), *end = mb_data_end(skb);
#ifndef MB_XDP
	if (data + MB_HEADERS_MAX > end && data + skb->len > end) {
		if (bpf_skb_pull_data(skb, skb->len < MB_HEADERS_MAX ? skb->len : MB_HEADERS_MAX) < 0)
			return MB_UNREADABLE;
		data = mb_data(skb);
		end = mb_data_end(skb);
	}
#endif
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > end || eth->h_proto != bpf_htons(ETH_P_IP))
		return -1;
	struct iphdr *ip = (void *)(eth + 1);
	if ((void *)(ip + 1) > end || ip->version != 4 || ip->ihl < 5)
		return -1;
	if (ip->frag_off & bpf_htons(0x1fff))  /* a later fragment: no transport header */
		return -1;
	if (ip->protocol != IPPROTO_UDP && ip->protocol != IPPROTO_TCP)
		return -1;
	pkt->ip_off = sizeof(*eth);
	pkt->proto = ip->protocol;
	pkt->saddr = ip->saddr;
	pkt->daddr = ip->daddr;
	pkt->frag_off = ip->frag_off;
	pkt->l4_off = pkt->ip_off + ip->ihl * 4;
	__u32 ip_end = pkt->ip_off + bpf_ntohs(ip->tot_len);  /* Ethernet may pad short frames */
#ifdef MB_XDP
	if (data + (ip_end & 0xffff) > end)  /* the verifier keeps a pointer's range; a difference it would not */
#else
	if (ip_end > skb->len)
#endif
		return -1;
	__u16 *ports = data + (pkt->l4_off & 0x7f);  /* at most 14 + 60: the mask tells the verifier so */
	if ((void *)(ports + 2) > end)
		return -1;
	pkt->sport = ports[0];
	pkt->dport = ports[1];
	if (ip->frag_off & bpf_htons(0x2000))  /* more fragments follow: the payload is not all here */
		return MB_FIRST_FRAGMENT;
	if (ip->protocol == IPPROTO_UDP) {
		pkt->payload_off = pkt->l4_off + 8;
	} else {
		__u8 *tcp = (void *)ports;
		if ((void *)(tcp + 14) > end)
			return -1;
		pkt->payload_off = pkt->l4_off + (tcp[12] >> 4) * 4;
		pkt->tcp_flags = tcp[13];
		pkt->seq = ((__u32)tcp[4] << 24) | ((__u32)tcp[5] << 16) | ((__u32)tcp[6] << 8) | tcp[7];
	}
	if (pkt->payload_off > ip_end)
		return -1;
	pkt->payload_len = ip_end - pkt->payload_off;
	return 0;
}

#define MB_DIRECT_MAX 0x3fff  /* offsets read in place: below this (a bound the verifier needs); beyond, a helper */

/* Copy `len` (a constant) bytes at `off` into `to`: in place if they are in the linear part, else with the
 * helper. 0 on success. */
static __always_inline int mb_load(struct mb_ctx *skb, __u32 off, void *to, const __u32 len)
{
	void *data = mb_data(skb), *end = mb_data_end(skb);
	if (off <= MB_DIRECT_MAX && data + off + len <= end) {
		__builtin_memcpy(to, data + off, len);
		return 0;
	}
	return mb_load_bytes(skb, off, to, len);
}

/* The memcached UDP frame header of a single-datagram request; moves payload_off past it. 0 if readable. */
static __always_inline int mb_parse_udp_frame(struct mb_ctx *skb, struct mb_packet *pkt)
{
	__u16 header[4];
	if (pkt->payload_len < MB_FRAME_HEADER || mb_load(skb, pkt->payload_off, header, sizeof(header)) < 0)
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

/* The command at the start of the payload; sets *key_off to the byte after "<command> ", and *data_field to which
 * field after the key gives the length of its data block (MB_NO_DATA: a one-line command). */
static __always_inline enum mb_command mb_parse_command(struct mb_ctx *skb, struct mb_packet *pkt, __u32 *key_off,
							__u8 *data_field)
{
	__u8 w[8] = {};
	/* The shortest command with a key is 6 bytes ("md k\r\n"); a payload that ends the packet may be shorter than
	 * the 8 bytes compared (an unpadded frame), so load only what is there. */
	__u32 n = pkt->payload_len < sizeof(w) ? pkt->payload_len : sizeof(w);
	*data_field = MB_NO_DATA;
	if (n == 4 && mb_load(skb, pkt->payload_off, w, 4) == 0 && mb_word(w, "mn\r\n", 4))
		return MB_CMD_NOOP;
	if (n < 6)
		return MB_CMD_OTHER;
	/* 8 bytes where there are (the common case, read in place); else the size masked to 1..8 for the verifier
	 * (unchanged: already 6..7) */
	if (n == 8 ? mb_load(skb, pkt->payload_off, w, 8) < 0
		   : mb_load_bytes(skb, pkt->payload_off, w, ((n - 1) & 7) + 1) < 0)
		return MB_CMD_OTHER;
#define MB_IS(word, kind, field) \
	if (mb_word(w, word " ", sizeof(word))) { *key_off = pkt->payload_off + sizeof(word); *data_field = field; \
		return kind; }
	MB_IS("get", MB_CMD_GET, MB_NO_DATA)
	MB_IS("gets", MB_CMD_GET, MB_NO_DATA)
	MB_IS("set", MB_CMD_WRITE, 2)      /* set <key> <flags> <exptime> <bytes> [noreply] */
	MB_IS("add", MB_CMD_WRITE, 2)
	MB_IS("cas", MB_CMD_WRITE, 2)
	MB_IS("replace", MB_CMD_WRITE, 2)
	MB_IS("append", MB_CMD_WRITE, 2)
	MB_IS("prepend", MB_CMD_WRITE, 2)
	MB_IS("delete", MB_CMD_WRITE, MB_NO_DATA)
	MB_IS("incr", MB_CMD_WRITE, MB_NO_DATA)
	MB_IS("decr", MB_CMD_WRITE, MB_NO_DATA)
	MB_IS("touch", MB_CMD_WRITE, MB_NO_DATA)
	MB_IS("ms", MB_CMD_WRITE, 0)       /* ms <key> <datalen> <flags>* */
	MB_IS("md", MB_CMD_WRITE, MB_NO_DATA)
	MB_IS("ma", MB_CMD_WRITE, MB_NO_DATA)
	MB_IS("mg", MB_CMD_READ, MB_NO_DATA)
#undef MB_IS
	/* keyless lines: *key_off is where the line goes on (at its '\r' or its arguments) */
#define MB_IS_LINE(word) \
	if (mb_word(w, word, sizeof(word) - 1) && (w[sizeof(word) - 1] == ' ' || w[sizeof(word) - 1] == '\r')) { \
		*key_off = pkt->payload_off + sizeof(word) - 1; return MB_CMD_LINE; }
	MB_IS_LINE("stats")
	MB_IS_LINE("version")
#undef MB_IS_LINE
	return MB_CMD_OTHER;
}

#define MB_ONES  0x0101010101010101ULL
#define MB_HIGHS 0x8080808080808080ULL
#define MB_WORDS MB_KEY_WORDS  /* 8-byte words that cover a key buffer (the last reads into `tail`) */

/* A mask with the high bit of every byte of x equal to b. Only the lowest flagged byte is exact (a borrow may flag
 * bytes above it). */
static __always_inline __u64 mb_bytes_equal(__u64 x, __u8 b)
{
	__u64 v = x ^ (b * MB_ONES);
	return (v - MB_ONES) & ~v & MB_HIGHS;
}

/* The bytes that end a key as memcached's text protocol reads it: space, '\r', '\n' (memcached tokenizes a line on
 * spaces alone, so any other byte, control characters included, is part of the key) and NUL (memcached answers
 * ERROR to a key with one). Only the lowest flagged byte is exact, and only the lowest is used. */
static __always_inline __u64 mb_special_bytes(__u64 x)
{
	return mb_bytes_equal(x, ' ') | mb_bytes_equal(x, '\r') | mb_bytes_equal(x, '\n') | mb_bytes_equal(x, 0);
}

/* Index (0..7) of the lowest byte flagged in a non-zero mask from mb_special_bytes: a binary search, since the
 * BPF instruction set has no count-trailing-zeros. */
static __always_inline __u32 mb_lowest_byte(__u64 mask)
{
	__u64 low = mask & (~mask + 1);
	__u32 index = 0;
	if (low >= 1ULL << 32) { index += 4; low >>= 32; }
	if (low >= 1ULL << 16) { index += 2; low >>= 16; }
	if (low >= 1ULL << 8) index += 1;
	return index;
}

struct mb_scan {
	struct mb_key *key;  /* the scratch key the bytes were loaded into */
	__u64 hash;   /* of the key's bytes so far, a word at a time (tables.py key_bucket: the same) */
	__u32 avail;  /* bytes loaded into the scratch key */
	__u32 len;    /* where the key ended */
	__u8 stop;    /* the byte that ended it: ' ' or '\r'; 0 if none (a control character came first, or no end) */
};

/* Look at 8-byte word i of the scratch key; 1 when the scan is over (the key's end found, or no end). */
static __always_inline long mb_scan_word(struct mb_scan *scan, __u64 i)
{
	struct mb_key *key = scan->key;  /* a pointer in the context: no map lookup per word */
	__u32 at = i * 8;
	if (i >= MB_WORDS || at >= scan->avail)
		return 1;
	__u64 word;
	__builtin_memcpy(&word, key->bytes + (at & 0xff), 8);
	__u64 special = mb_special_bytes(word);
	if (!special) {
		scan->hash = (scan->hash ^ word) * MB_HASH_MUL;
		return 0;
	}
	__u32 end = at + mb_lowest_byte(special);
	if (end >= scan->avail)
		return 1;  /* past the bytes loaded: what is there is left over from another packet */
	if (end > at)  /* the key's last bytes, the rest of the word masked off */
		scan->hash = (scan->hash ^ (word & ((1ULL << ((end - at) * 8)) - 1))) * MB_HASH_MUL;
	__u8 c = key->bytes[end & 0xff];
	if (c == ' ' || c == '\r') {
		scan->stop = c;
		scan->len = end;
	}
	return 1;
}

#define MB_WORDS_PER_CALL 4

/* bpf_loop callback: words 4i .. 4i + 3. One callback, verified once (a loop inlined into the program multiplies
 * the verifier's states past its limit), called once per 32 bytes instead of per byte (each call costs more than
 * the work of a word); the key's pointer comes in the context (the verifier keeps its type there). */
static long mb_scan_words(__u64 i, void *ctx)
{
	struct mb_scan *scan = ctx;
	__u64 first = i * MB_WORDS_PER_CALL;
	return mb_scan_word(scan, first) || mb_scan_word(scan, first + 1) || mb_scan_word(scan, first + 2) ||
	       mb_scan_word(scan, first + 3);
}

/* Read the key at key_off into the scratch `key`. Returns the byte that ended it (' ' or '\r'), or 0 if no valid
 * 1..250-byte key ends within reach. For a get, *exact is set when the key is followed by "\r\n" and nothing
 * else: a single-key get the switch may balance. *hash is the key's hash (tables.py key_hash): hot_keys is keyed
 * by it, its top bits are the key's hot_filter bucket. *maybe_hot is set when hot_filter counts a hot key in that
 * bucket. The bytes past the key's length are whatever the packet held there. */
static __always_inline __u8 mb_read_key(struct mb_ctx *skb, struct mb_packet *pkt, __u32 key_off,
					struct mb_key *key, int *exact, int *maybe_hot, __u64 *hash)
{
	__u32 end = pkt->payload_off + pkt->payload_len;
	if (key_off >= end)
		return 0;
	__u32 avail = end - key_off;
	if (avail > MB_KEY_BYTES)
		avail = MB_KEY_BYTES;
	/* Sizes are masked to 1..256 for the verifier (the value is unchanged: already 1..252); struct mb_scratch
	 * has room past the key for that. */
	if (mb_load_bytes(skb, key_off, key->bytes, ((avail - 1) & 0xff) + 1) < 0)
		return 0;
	struct mb_scan scan = {.key = key, .avail = avail};
	bpf_loop((MB_WORDS + MB_WORDS_PER_CALL - 1) / MB_WORDS_PER_CALL, mb_scan_words, &scan, 0);
	__u8 stop = scan.stop;
	__u32 len = scan.len;
	if (!stop || len < 1 || len > MB_MAX_KEY)
		return 0;
	if (stop == '\r')  /* exact: "\r\n" ends the key and the packet; the bytes after the key were loaded with it */
		*exact = key_off + len + 2 == end && key->bytes[(len + 1) & 0xff] == '\n';
	*hash = (scan.hash ^ len) * MB_HASH_MUL;
	__u32 bucket = *hash >> (64 - MB_FILTER_BITS);
	__u32 *counted = bpf_map_lookup_elem(&hot_filter, &bucket);
	*maybe_hot = counted && *counted;
	key->len = len;
	return stop;
}

/* A key read into scratch against the hot key its hash found: the bytes are compared a word at a time, the
 * length's last word masked (past it the scratch key holds whatever the packet had there). */
struct mb_compare {
	const struct mb_key *key;
	const struct mb_hot *hot;
	__u8 differs;
};

static __always_inline long mb_compare_word(struct mb_compare *cmp, __u64 i)
{
	__u32 at = i * 8, len = cmp->key->len;
	if (i >= MB_KEY_WORDS || at >= len)
		return 1;
	__u64 mine, its;
	__builtin_memcpy(&mine, cmp->key->bytes + (at & 0xf8), 8);
	__builtin_memcpy(&its, cmp->hot->key + (at & 0xf8), 8);
	__u64 mask = len - at >= 8 ? ~0ULL : (1ULL << ((len - at) * 8)) - 1;
	if ((mine ^ its) & mask) {
		cmp->differs = 1;
		return 1;
	}
	return 0;
}

#define MB_COMPARES_PER_CALL 2

/* bpf_loop callback, as mb_scan_words: words 2i and 2i + 1. The verifier walks the callback once per state of its
 * caller: 2 words per call cost 706k of its 1M instructions, 4 words 732k, 8 words 777k, at the same speed. */
static long mb_compare_words(__u64 i, void *ctx)
{
	struct mb_compare *cmp = ctx;
	__u64 first = i * MB_COMPARES_PER_CALL;
	return mb_compare_word(cmp, first) || mb_compare_word(cmp, first + 1);
}

/* The hot key the packet's key is, or 0: one lookup of its 8-byte hash (the map hashes 8 bytes, not the 256 of a
 * whole key), then its bytes compared (two hot keys never share a hash: the controller refuses the second). */
static __always_inline struct mb_hot *mb_hot_key(const struct mb_key *key, __u64 hash)
{
	struct mb_hot *hot = bpf_map_lookup_elem(&hot_keys, &hash);
	if (!hot || hot->key_len != key->len)
		return 0;
	struct mb_compare cmp = {.key = key, .hot = hot};
	bpf_loop((MB_KEY_WORDS + MB_COMPARES_PER_CALL - 1) / MB_COMPARES_PER_CALL, mb_compare_words, &cmp, 0);
	return cmp.differs ? 0 : hot;
}

/* The rest of a command line after its key, as mb_scan_line reads it. */
struct mb_line {
	__u32 avail;     /* bytes loaded into the scratch line */
	__u32 cr;        /* where '\r' is */
	__u32 fields;    /* fields (space-separated) started so far */
	__u32 number;    /* the data length, from field data_field */
	__u8 data_field; /* MB_NO_DATA, or which field gives the data length */
	__u8 found;      /* '\r' found */
	__u8 bad;        /* the data length is not a number, or too big */
	__u8 in_field;
	__u8 changes;    /* a flag that makes a meta command change the item (T, N, I) */
};

static long mb_scan_line(__u64 i, void *ctx)
{
	struct mb_line *line = ctx;
	__u32 zero = 0;
	struct mb_scratch *scratched = bpf_map_lookup_elem(&scratch, &zero);
	if (!scratched || i >= line->avail || i >= MB_LINE_BYTES)
		return 1;
	__u8 c = scratched->line[i];
	if (c == '\r') {
		line->found = 1;
		line->cr = i;
		return 1;
	}
	if (c == ' ') {
		line->in_field = 0;
		return 0;
	}
	if (!line->in_field) {
		line->in_field = 1;
		line->fields++;
	}
	if (c == 'T' || c == 'N' || c == 'I')
		line->changes = 1;
	if (line->fields == (__u32)line->data_field + 1) {
		if (c < '0' || c > '9' || line->number > 100000000) {
			line->bad = 1;
			return 1;
		}
		line->number = line->number * 10 + (c - '0');
	}
	return 0;
}

/* True if the payload is exactly one command whose key ends at key_end: its line ends with "\r\n", then its data
 * block and "\r\n" if it has one, then nothing. Only then can the pipeline be sure the packet holds no other
 * write (pipelined commands, the rest of an earlier command's data). For mg, also that it changes nothing. */
static __always_inline int mb_whole_command(struct mb_ctx *skb, struct mb_packet *pkt, __u32 key_end,
					    __u8 data_field, enum mb_command command)
{
	__u32 end = pkt->payload_off + pkt->payload_len;
	__u32 zero = 0;
	if (key_end >= end)
		return 0;
	__u32 avail = end - key_end;
	if (avail > MB_LINE_BYTES)
		avail = MB_LINE_BYTES;
	struct mb_scratch *scratched = bpf_map_lookup_elem(&scratch, &zero);
	if (!scratched || mb_load_bytes(skb, key_end, scratched->line, ((avail - 1) & 0xff) + 1) < 0)
		return 0;
	struct mb_line line = {.avail = avail, .data_field = data_field};
	bpf_loop(MB_LINE_BYTES, mb_scan_line, &line, 0);
	if (!line.found || line.bad || (command == MB_CMD_READ && line.changes))
		return 0;
	__u32 line_end = key_end + line.cr + 2;  /* past "\r\n" */
	__u8 lf = 0;
	if (mb_load_bytes(skb, line_end - 1, &lf, 1) < 0 || lf != '\n')
		return 0;
	if (data_field == MB_NO_DATA)
		return line_end == end;
	if (line.fields <= data_field)
		return 0;
	return (__u64)line_end + line.number + 2 == end;
}

#endif
