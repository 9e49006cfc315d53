/* Every table of the pipeline, declared once. Names are what dataplanes/bpf/tables.py opens. */
#ifndef MB_MAPS_H
#define MB_MAPS_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "structs.h"

/* hot_get / set_mirror: hot key, by its 64-bit hash (tables.py key_hash) -> its slot, home, weighted replicas and
 * the key's bytes, which a get compares (written by the controller). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MB_MAX_HOT);
	__type(key, __u64);
	__type(value, struct mb_hot);
} hot_keys SEC(".maps");

/* hot_filter: per bucket of the key hash (mb_scan_word), how many hot keys hash there (written by the controller,
 * before a key enters hot_keys and after it leaves). A key whose bucket counts 0 is cold without the hot_keys
 * lookup and compare. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1 << MB_FILTER_BITS);
	__type(key, __u32);
	__type(value, __u32);
} hot_filter SEC(".maps");

/* Dirty state (struct mb_synced says how). writes: per slot, writes the pipeline mirrored (atomic adds). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MB_MAX_HOT);
	__type(key, __u32);
	__type(value, __u64);
} writes SEC(".maps");

/* unsure: per server, requests that may hold writes the pipeline cannot read (pipelined commands, a command
 * split over segments, the binary protocol, ...): every hot key homed there is dirty until the controller checks. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MB_MAX_SERVERS);
	__type(key, __u32);
	__type(value, __u64);
} unsure SEC(".maps");

/* Unsure requests the controller cannot read anyway (a blind connection, a datagram the pipeline could not parse)
 * are copied once per report: the others are covered by the check that report starts, which rearms it first (cost
 * per home and check, not per packet). unsure_last: per server, bpf_ktime_get_ns of its latest unsure request
 * (written by the program only); unsure_reported: 1 once one was copied since the controller's last rearm (which
 * writes 0). Two maps, so that a rearm never writes back a last_ns the program has moved on from. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MB_MAX_SERVERS);
	__type(key, __u32);
	__type(value, __u64);
} unsure_last SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MB_MAX_SERVERS);
	__type(key, __u32);
	__type(value, __u32);
} unsure_reported SEC(".maps");

/* closes: per server, the times its memcached closed (FIN or RST) one of the controller's connections, as when it
 * dies or restarts; closes_handled: per server, how many of those the controller has dealt with (written by it
 * alone). While they differ the server may have lost its copies: no get is balanced to it, and (counted unsure
 * too) every hot key homed there is dirty. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MB_MAX_SERVERS);
	__type(key, __u32);
	__type(value, __u64);
} closes SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MB_MAX_SERVERS);
	__type(key, __u32);
	__type(value, __u64);
} closes_handled SEC(".maps");

/* The controller's connections it closed itself (its FIN or RST seen first): the server's FIN that answers it is no
 * sign of a restart. LRU: an entry the answer never came for ages out. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, MB_MAX_CLOSING);
	__type(key, struct mb_stream_id);
	__type(value, __u8);
} closing SEC(".maps");

/* synced: per slot, written by the controller only. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MB_MAX_HOT);
	__type(key, __u32);
	__type(value, struct mb_synced);
} synced SEC(".maps");

/* The controller's lease: bpf_ktime_get_ns() until which it vouches for the copies (it renews it while it runs).
 * After it, or while it is 0 (no controller yet), every hot key acts dirty: gets go home. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} lease SEC(".maps");

/* Server index -> MAC, IP, port. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MB_MAX_SERVERS);
	__type(key, __u32);
	__type(value, struct mb_server);
} servers SEC(".maps");

/* Server address -> index: which server a request is for (unsure counts are kept per server). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MB_MAX_SERVERS);
	__type(key, struct mb_server_address);
	__type(value, __u32);
} server_index SEC(".maps");

/* Server index -> the MAC its TCP segments came from, and its balanced gets flooded (struct mb_server_seen). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MB_MAX_SERVERS);
	__type(key, __u32);
	__type(value, struct mb_server_seen);
} server_macs_seen SEC(".maps");

/* The controller's own addresses (IPv4, network order -> 1): its copies to replicas and its reads never change a
 * key at its home, so its requests never make a server unsure (a copy larger than a segment would otherwise make
 * every hot key homed on the replica dirty, for nothing). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16);
	__type(key, __u32);
	__type(value, __u32);
} trusted_sources SEC(".maps");

/* The ports memcached servers listen on (struct mb_port_set): a request goes to one of them, a reply comes from
 * one. Each server's own port is set here, so servers on different ports are all served. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct mb_port_set);
} memcached_ports SEC(".maps");

/* forward: destination MAC (8 bytes, last 2 zero) -> output ifindex. Learned from source MACs, or set. LRU: a
 * flood of spoofed source MACs evicts old entries instead of filling the table, so a new host is still learned. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, __u64);
	__type(value, __u32);
} forward SEC(".maps");

/* The switch's ports (ifindexes, 0 = unused), for flooding broadcast and unknown destinations. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MB_MAX_PORTS);
	__type(key, __u32);
	__type(value, __u32);
} ports SEC(".maps");

/* reply_source: balanced gets by (client, request id) -> home server index, so every datagram of the reply,
 * not only the one carrying "VALUE <key>", leaves with the home's source address. A bucket per hash of the flow,
 * two flows each, the older replaced: a plain store where an LRU hash map's update took 100-170 ns of a hot get
 * (measured, bench_ebpf_program.py). A get's reply keeps its rewrite unless two later balanced gets land in its
 * bucket first: with F gets in flight, about (F / 65536)^2 / 2 of replies (1e-6 at F = 100). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MB_FLOW_BUCKETS);
	__type(key, __u32);
	__type(value, struct mb_flow_bucket);
} flows SEC(".maps");

/* set_mirror, stream half: TCP connections stopped mid-command (struct mb_stream). LRU: an entry goes when its
 * connection ends (FIN or RST); past MB_MAX_STREAMS such connections at once the oldest is forgotten. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, MB_MAX_STREAMS);
	__type(key, struct mb_stream_id);
	__type(value, struct mb_stream);
} streams SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, MB_MAX_HOT);
	__type(key, __u32);
	__type(value, struct mb_key_counters);
} key_counters SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, MB_C_COUNT);
	__type(key, __u32);
	__type(value, __u64);
} counters SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct mb_settings);
} settings SEC(".maps");

/* Hot-key detection (structs.h, struct mb_sketch_control): the control, then per epoch the count-min sketch of
 * get keys, the heavy-key candidates and the gets per destination. Arrays of one large value per epoch: a reader
 * reads or zeroes an epoch in one system call. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct mb_sketch_control);
} sketch_control SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, struct mb_sketch);
} sketch SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, struct mb_heavy_table);
} heavy SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2 * (MB_DESTINATION_SLOTS + 1));  /* per epoch: the slots, then the overflow slot */
	__type(key, __u32);
	__type(value, struct mb_destination_count);
} sketch_destinations SEC(".maps");

/* Scratch space for the key being read (too big for the 512-byte stack next to everything else). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct mb_scratch);
} scratch SEC(".maps");

/* The servers whose clients' connections this switch's TCP path takes (steer.h), by index: 1 for each, and at
 * MB_TCP_HOMES_NAMED 1 once the controller has named them. None named (a switch just loaded): every connection. On
 * one switch every server; in a fabric the servers cabled to this leaf, where their hot keys are balanced. */
#define MB_TCP_HOMES_NAMED MB_MAX_SERVERS
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MB_MAX_SERVERS + 1);
	__type(key, __u32);
	__type(value, __u32);
} tcp_homes SEC(".maps");

/* The configured servers' addresses (ip -> 1): a connection from one is a splitter's to a replica (or a server's
 * own), never taken by a TCP path (steer.h): in a fabric it crosses the replica's leaf, which must pass it on. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MB_MAX_SERVERS);
	__type(key, __u32);
	__type(value, __u32);
} server_ips SEC(".maps");

/* The TCP path (steer.h): one entry, written where the splitter is started (dataplanes/ebpf/tcp/path.py). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct mb_tcp_path);
} tcp_path SEC(".maps");

/* The TCP path's neighbours: a client's IPv4 address -> its MAC (8 bytes, last 2 zero), learned from the client's
 * segments steered to the splitter, whose side does no ARP. LRU: a client gone long ages out. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, __u32);
	__type(value, __u64);
} tcp_neighbors SEC(".maps");

/* The TCP path's counters (enum mb_tcp_counter). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, MB_TCP_COUNT);
	__type(key, __u32);
	__type(value, __u64);
} tcp_counters SEC(".maps");

#endif
