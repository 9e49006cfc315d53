/* Where a get goes, as the eBPF switch's own pipeline decides it: the splitter hands the pinned program a get of
 * the key to its home, as a UDP frame, through BPF_PROG_TEST_RUN with MB_DECIDE_MARK (dataplanes/bpf/src/structs.h),
 * and the program answers with the server it would balance it to. The hot-key table, the dirty state, the lease,
 * the weights and the per-key counters are the pipeline's: nothing is decided twice. */
#ifndef MB_DECIDE_USER_H
#define MB_DECIDE_USER_H

#include <stddef.h>
#include <stdint.h>

struct mb_server_addr {
	uint32_t ip;     /* network order */
	uint16_t port;   /* network order */
};

struct mb_decider {
	int program;       /* the pinned program */
	int servers;       /* the servers map: index -> MAC, IP, port */
	int server_index;  /* (IP, port) -> index */
};

/* Open the pins in `pins` (the switch's pin directory); -1 and errno if one is missing. */
int mb_decider_open(struct mb_decider *decider, const char *pins);

/* The server index of (ip, port), or -1 if it is not a configured server. */
int mb_server_of(struct mb_decider *decider, struct mb_server_addr address);

/* The address of server `index`; -1 if there is none. */
int mb_server_address(struct mb_decider *decider, uint32_t index, struct mb_server_addr *address);

/* The server a get of `key` from the client to `home` goes to (a server index), or -1 if the program could not be
 * asked (the get goes home). `entropy` varies from get to get (the pipeline hashes it to pick a replica). */
int mb_decide(struct mb_decider *decider, uint32_t home, struct mb_server_addr home_address,
	      struct mb_server_addr client, uint16_t entropy, const char *key, size_t key_length);

#endif
