/* Structs shared by the BPF program and its control library (dataplanes/bpf/tables.py declares the same layouts;
 * tests/test_ebpf_program.py checks the sizes against the loaded maps and the counter names against the enum). */
#ifndef MB_STRUCTS_H
#define MB_STRUCTS_H

#include <linux/types.h>

#define MB_MAX_KEY 250      /* memcached's key limit */
#define MB_KEY_BYTES 252    /* key buffer: 250 bytes, zero padded to a multiple of 4 */
#define MB_KEY_WORDS 32     /* 8-byte words that cover a key buffer (a hot key's copy has all 256 bytes) */
#define MB_MAX_REPLICAS 8   /* servers one hot key can be spread over */
#define MB_MAX_HOT 16384    /* hot keys (slots): map sizes only (p4src/headers.p4 has its own) */
#define MB_MAX_SERVERS 256
#define MB_MAX_PORTS 32     /* switch ports (flooding walks them) */
#define MB_FLOW_BUCKETS 65536  /* balanced gets waiting for their reply: buckets of two */
#define MB_MAX_STREAMS 65536  /* TCP connections to a server stopped mid-command at once */
#define MB_MAX_CLOSING 4096  /* the controller's connections closing at once */
#define MB_WEIGHT_ONE 65536 /* weights are cumulative fractions of this */
#define MB_LINE_BYTES 256   /* the rest of a command line after the key that is read to prove it whole */
#define MB_HELD (~0ULL)     /* mb_synced.writes while the controller holds a key dirty: no count reaches it */
#define MB_FILTER_BITS 16   /* hot_filter has 2^16 buckets: a cold key skips the hot_keys lookup unless it shares one */
#define MB_HASH_MUL 0x9E3779B97F4A7C15ULL  /* the key hash's multiplier (tables.py key_hash computes the same) */
#define MB_SKETCH_ROWS 4    /* count-min sketch of get keys: rows (a count is overstated with probability e^-4) */
#define MB_SKETCH_BITS 14   /* ... 2^14 counters per row: overstated by at most e * gets / 2^14 */
#define MB_HEAVY_BITS 10    /* heavy-key candidates: 2^10 entries, each key may sit in one of two */

/* A memcached key as a map key: the length, then the bytes, zero padded. */
struct mb_key {
	__u32 len;
	__u8 bytes[MB_KEY_BYTES];
};

/* Where the key is read: the key, then room so that a load masked to at most 256 bytes stays in bounds; then the
 * rest of the command line. */
struct mb_scratch {
	struct mb_key key;
	__u8 tail[8];
	__u8 line[MB_LINE_BYTES];
};

/* Dirty state, race-free: the data plane only ever adds to its counts (writes per slot, unsure per server), the
 * controller only ever writes what it synced a slot to. A hot key is clean while both counts still equal what the
 * controller synced: a write after the sync changes a count, so no clear can hide it (no read-modify-write). */
struct mb_synced {
	__u64 writes;   /* the slot's write count the copies include; MB_HELD: dirty until the controller says */
	__u64 unsure;   /* the home's unsure count the controller had checked the key against */
};

/* A server as a request addresses it: finds the server index of a request's destination. */
struct mb_server_address {
	__u32 ip;     /* network order */
	__u16 port;   /* network order */
	__u16 pad;
};

/* hot_get / set_mirror: one hot key. `cumulative[i]` is the running sum of the weights of replicas 0..i
 * (out of MB_WEIGHT_ONE); a replica with weight 0 repeats its predecessor's sum and is never chosen. */
struct mb_hot {
	__u32 slot;                            /* index into writes, synced and key_counters */
	__u32 home;                            /* server index */
	__u32 replicas;                        /* how many of the arrays below are used */
	__u32 server[MB_MAX_REPLICAS];
	__u32 cumulative[MB_MAX_REPLICAS];
	__u32 key_len;                         /* the key itself: hot_keys is keyed by its hash, a get compares */
	__u8 key[MB_KEY_WORDS * 8];            /* ... the bytes (zero padded to whole words) */
};

/* A memcached server as the data plane rewrites to it. */
struct mb_server {
	__u8 mac[6];
	__u16 port;   /* network order */
	__u32 ip;     /* network order */
};

/* server_macs_seen: what the switch saw of one server's MAC, for the controller to compare with the configured one
 * (the destination MAC a balanced get is rewritten to). */
struct mb_server_seen {
	__u8 mac[6];     /* source MAC of the server's latest TCP segment (never rewritten by any switch) */
	__u16 seen;      /* 1 once `mac` holds one */
	__u64 flooded;   /* gets balanced to the server and flooded: its configured MAC was not in `forward` */
};

/* Per hot key (per CPU): what the pipeline did with its packets. */
struct mb_key_counters {
	__u64 gets;              /* single-key gets matched by hot_get */
	__u64 home_while_dirty;  /* ... sent home because the key was dirty or the lease out */
	__u64 mirrored;          /* writes copied to the controller */
	__u64 per_replica[MB_MAX_REPLICAS];
};

/* reply_source: a balanced get waiting for its reply, by the client's address and the request id. */
struct mb_flow {
	__u32 client_ip;
	__u16 client_port;
	__u16 request_id;
};

struct mb_flow_way {
	struct mb_flow flow;
	__u32 home;  /* the server its reply must seem to come from, | MB_FLOW_UPSTREAM */
};

/* The get was balanced by a switch before this one: its reply gets the home's IP and port here but keeps the
 * replica's MAC, so the switches after this one learn no MAC at a port it is not behind. */
#define MB_FLOW_UPSTREAM 0x80000000u

/* Two balanced gets whose flows hash to the bucket; a third replaces the older (`next`). */
struct mb_flow_bucket {
	struct mb_flow_way way[2];
	__u32 next;
	__u32 pad;
};

/* A TCP connection from a client to a server, addresses and ports in network order. */
struct mb_stream_id {
	__u32 client_ip, server_ip;
	__u16 client_port, server_port;
};

/* A connection whose last segment ended, or may have ended, inside a command: its next bytes may continue that
 * command, so no segment of it is read on its own until the controller, which reads the connection's copies as a
 * stream, proves where a command starts (`resume`). */
struct mb_stream {
	__u32 start;   /* sequence number where the unread stretch began (a command started there) */
	__u32 resume;  /* with MB_STREAM_RESUMES: the sequence number of a command boundary, proven by the controller */
	__u32 mode;    /* MB_STREAM_* (written by the controller) */
};

#define MB_STREAM_UNREAD 0   /* every segment unsure and copied: the controller follows the bytes */
#define MB_STREAM_RESUMES 1  /* as UNREAD, until the segment that starts at `resume`: read on its own again */
#define MB_STREAM_BLIND 2    /* the controller cannot follow it (not the text protocol, or a copy was lost): every
			      * segment unsure, copies coalesced per server (unsure_reported, maps.h) */

/* Hot-key detection in the data plane (the count-min sketch and the heavy-key candidates, maps.h): one copy per
 * epoch. The program counts into `epoch` until `until_ns` (a reader renews it, as the controller its lease), so the
 * sketch costs nothing while nobody reads it; the reader flips `epoch`, reads the other copy, then zeroes it. */
struct mb_sketch_control {
	__u64 until_ns;  /* bpf_ktime_get_ns() until which gets are counted; 0: off */
	__u32 epoch;     /* 0 or 1: the copy being counted into */
	__u32 pad;
};

struct mb_sketch {
	__u32 count[MB_SKETCH_ROWS][1 << MB_SKETCH_BITS];
};

/* A key whose estimated count was among the largest where it hashes: the estimate, the key, and where its gets
 * were sent (the destination before any rewrite: the key's home as the clients hash it). */
struct mb_heavy {
	__u64 hash;       /* the key's full hash (mb_read_key): a reader checks it against the key, so a torn entry
			   * (two CPUs writing it at once) is dropped, not reported */
	__u32 count;      /* the sketch's estimate when the key was last counted */
	__u32 dest_ip;    /* network order */
	__u16 dest_port;  /* network order */
	__u16 pad[3];
	struct mb_key key;  /* bytes past key.len are whatever the packet held there */
};

struct mb_heavy_table {
	struct mb_heavy entry[1 << MB_HEAVY_BITS];
};

/* Gets per destination (per CPU): the load as the clients spread it, and the sketch's total. Slots of a small
 * direct-mapped table per epoch (MB_DESTINATION_SLOTS, and an overflow slot for gets to a destination that finds
 * both of its slots taken): an array lookup per get, where a hash map cost about 40 ns more. */
#define MB_DESTINATION_SLOTS 256
struct mb_destination_count {
	__u32 ip;    /* network order */
	__u16 port;  /* network order */
	__u16 pad;
	__u64 gets;
};

/* The ports memcached servers listen on: one bit per port (host order), so the test per packet is an array load, not
 * a hash lookup. */
struct mb_port_set {
	__u64 bits[65536 / 64];
};

/* Switch-wide settings (array map, index 0). */
struct mb_settings {
	__u32 controller_ifindex;  /* where mirrored writes are cloned to; 0: none */
};

/* Switch-wide counters (per CPU), index by enum mb_counter. */
enum mb_counter {
	MB_C_PACKETS,
	MB_C_MEMCACHED,       /* to or from the memcached port */
	MB_C_UNPARSED,        /* memcached-port packets forwarded untouched: not a request the pipeline reads */
	MB_C_BALANCED,        /* gets rewritten to a replica */
	MB_C_ALREADY_BALANCED,/* marked by an earlier switch: left alone */
	MB_C_MIRRORED,
	MB_C_REPLIES_REWRITTEN,
	MB_C_FLOODED,
	MB_C_DROPPED,         /* nowhere to send (no port) */
	MB_C_UNSURE,          /* requests to a server that may hold writes the pipeline cannot read: its keys dirty */
	MB_C_CLONED,          /* packets copied to the controller (mirrored writes and unsure requests) */
	MB_C_LEASE_EXPIRED,   /* hot gets sent home because the controller's lease ran out */
	MB_C_COALESCED,       /* unsure requests not copied: a copy of an earlier one started the check covering them */
	MB_C_COUNT,
};

/* The TCP path (steer.h): the switch's port the TCP splitter is behind, and the MAC of the splitter's side of it
 * (a steered segment's new destination). ifindex 0: no splitter. */
struct mb_tcp_path {
	__u32 ifindex;       /* the switch's side of the splitter's link: its port */
	__u8 mac[6];         /* the splitter's side's MAC */
	__u16 pad;
	__u32 mark;          /* the splitter's sockets' mark (SO_MARK): several switches in one namespace each find
			      * their own splitter's sockets by it */
	__s32 netns;         /* where the splitter's sockets are, as a network namespace id seen from the switch's
			      * (its side of the link moved there: a Mininet fabric's box); -1: the switch's own */
};

/* The TCP path's counters (per CPU), index by enum mb_tcp_counter (dataplanes/bpf/tables.py TCP_COUNTERS names
 * them). */
enum mb_tcp_counter {
	MB_TCP_CONNECTIONS,   /* SYNs of clients' connections steered to the splitter */
	MB_TCP_STEERED,       /* segments steered to the splitter, either way */
	MB_TCP_GETS,          /* gets the splitter asked about (decide) */
	MB_TCP_BALANCED,      /* of them, sent to another server than the one the client addressed */
	MB_TCP_HOME_WHILE_DIRTY,  /* of them, of a hot key held dirty (or the lease out, or a replica suspect): home */
	MB_TCP_COUNT,
};

/* decide (mbalancer.bpf.c): the splitter's question is marked so (skb->mark, in BPF_PROG_TEST_RUN's context), the
 * answer is cb[0] = MB_DECIDED and cb[1] = the server. */
#define MB_DECIDE_MARK 0x6d624463u
#define MB_DECIDED 0x6d62u

#endif
