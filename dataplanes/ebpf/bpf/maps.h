/* Every table of the pipeline, declared once. Names are what dataplanes/ebpf/tables.py opens. */
#ifndef MB_MAPS_H
#define MB_MAPS_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "structs.h"

/* hot_get / set_mirror: hot key -> its slot, home and weighted replicas (written by the controller). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MB_MAX_HOT);
	__type(key, struct mb_key);
	__type(value, struct mb_hot);
} hot_keys SEC(".maps");

/* Dirty bit per slot: set by the pipeline on a mirrored write, cleared by the controller. Kept apart from hot_keys
 * so that rewriting a key's weights can never clear a bit the pipeline has just set. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MB_MAX_HOT);
	__type(key, __u32);
	__type(value, __u32);
} dirty SEC(".maps");

/* Server index -> MAC, IP, port. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MB_MAX_SERVERS);
	__type(key, __u32);
	__type(value, struct mb_server);
} servers SEC(".maps");

/* The ports memcached servers listen on (network order -> 1): a request goes to one of them, a reply comes from
 * one. Each server's own port is written here, so servers on different ports are all served. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MB_MAX_MEMCACHED_PORTS);
	__type(key, __u16);
	__type(value, __u32);
} memcached_ports SEC(".maps");

/* forward: destination MAC (8 bytes, last 2 zero) -> output ifindex. Learned from source MACs, or set. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
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
 * not only the one carrying "VALUE <key>", leaves with the home's source address. LRU: unanswered gets age out. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, MB_MAX_FLOWS);
	__type(key, struct mb_flow);
	__type(value, __u32);
} flows SEC(".maps");

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

/* Scratch space for the key being read (too big for the 512-byte stack next to everything else). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct mb_scratch);
} scratch SEC(".maps");

#endif
