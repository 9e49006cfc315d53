/* Hot-key detection in the data plane (NetCache's idea): every get's key counted in a count-min sketch, and the
 * keys with the largest estimates kept as candidates, so a reader (`mbalancer monitor --source dataplane`) finds
 * the hot keys without a packet copied to user space. Counted only while a reader renews sketch_control. */
#ifndef MB_SKETCH_H
#define MB_SKETCH_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "structs.h"
#include "maps.h"
#include "parse.h"

#define MB_MIX_MUL 0xC2B2AE3D27D4EB4FULL

/* One multiplier per sketch row: multiply-shift hashing of the key's hash (its top bits: a product's low bits
 * depend only on the factors' low bits), a different counter in each row. */
static const __u64 mb_row_mul[MB_SKETCH_ROWS] = {
	0xD6E8FEB86659FD93ULL, 0xA0761D6478BD642FULL, 0xE7037ED1A0B428DBULL, 0x8EBC6AF09C88C6E3ULL,
};

/* Count the get in slot `index` of sketch_destinations if it is the destination's or free (or `any`); 1 if done. */
static __always_inline int mb_destination_slot(struct mb_packet *pkt, __u32 index, int any)
{
	struct mb_destination_count *slot = bpf_map_lookup_elem(&sketch_destinations, &index);
	if (!slot)
		return 1;
	if (slot->gets && (slot->ip != pkt->daddr || slot->port != pkt->dport) && !any)
		return 0;  /* another destination's */
	if (!slot->gets) {
		slot->ip = pkt->daddr;
		slot->port = pkt->dport;
	}
	slot->gets++;  /* per CPU: no atomics */
	return 1;
}

/* One more get to the packet's destination: in one of its two slots of the epoch, else in the overflow slot. */
static __always_inline void mb_count_destination(struct mb_packet *pkt, __u32 epoch)
{
	__u32 spot = (pkt->daddr ^ ((__u32)pkt->dport << 16)) * 0x9E3779B1U;
	__u32 base = epoch * (MB_DESTINATION_SLOTS + 1);
	if (!mb_destination_slot(pkt, base + (spot >> 24), 0) && !mb_destination_slot(pkt, base + ((spot >> 16) & 0xff), 0))
		mb_destination_slot(pkt, base + MB_DESTINATION_SLOTS, 1);
}

/* Count one get of `key` (hashed to `hash`) sent to the packet's destination. */
static __always_inline void mb_sketch_get(struct mb_packet *pkt, const struct mb_key *key, __u64 hash)
{
	__u32 zero = 0;
	struct mb_sketch_control *control = bpf_map_lookup_elem(&sketch_control, &zero);
	if (!control || !control->until_ns || bpf_ktime_get_ns() >= control->until_ns)
		return;  /* 0: off (no clock read for it) */
	__u32 epoch = control->epoch & 1;
	struct mb_sketch *counts = bpf_map_lookup_elem(&sketch, &epoch);
	struct mb_heavy_table *heavy_table = bpf_map_lookup_elem(&heavy, &epoch);
	if (!counts || !heavy_table)
		return;
	/* The key hash spreads a difference only upward (keys that differ in a word's last byte differ only in its
	 * top 8 bits): fold the top half down before the multiply-shift hashes below, which take a product's top bits. */
	__u64 mixed = (hash ^ (hash >> 32)) * MB_MIX_MUL;
	mixed ^= mixed >> 29;
	__u32 estimate = ~0U;
#pragma unroll
	for (int row = 0; row < MB_SKETCH_ROWS; row++) {
		__u32 column = (mixed * mb_row_mul[row]) >> (64 - MB_SKETCH_BITS);
		__u32 *count = &counts->count[row][column];
		__sync_fetch_and_add(count, 1);
		if (*count < estimate)
			estimate = *count;  /* read back: another CPU's add in between only raises it */
	}
	mb_count_destination(pkt, epoch);
	/* Two places a key may sit (from the mixed hash's top bits): its own entry is
	 * updated; else it replaces the lesser of the two if its estimate is larger. */
	struct mb_heavy *first = &heavy_table->entry[mixed >> (64 - MB_HEAVY_BITS)];
	struct mb_heavy *second = &heavy_table->entry[(mixed >> (64 - 2 * MB_HEAVY_BITS)) & ((1 << MB_HEAVY_BITS) - 1)];
	if (first->hash == hash) {
		first->count = estimate;
		return;
	}
	if (second->hash == hash) {
		second->count = estimate;
		return;
	}
	struct mb_heavy *victim = first->count <= second->count ? first : second;
	if (victim->count >= estimate)
		return;
	victim->hash = hash;
	victim->count = estimate;
	victim->dest_ip = pkt->daddr;
	victim->dest_port = pkt->dport;
	__builtin_memcpy(&victim->key, key, sizeof(*key));
}

#endif
