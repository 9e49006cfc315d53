/* Where a get goes, asked of the switch's own program (decide.h). */
#include "decide.h"

#include <arpa/inet.h>
#include <bpf/bpf.h>
#include <errno.h>
#include <linux/bpf.h>
#include <linux/types.h>
#include <stdio.h>
#include <string.h>

#include "../../../bpf/src/structs.h"

#define MB_FRAME_MAX (14 + 20 + 8 + 8 + 4 + 250 + 2)

static int mb_open_pin(const char *pins, const char *name)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/%s", pins, name);
	return bpf_obj_get(path);
}

int mb_decider_open(struct mb_decider *decider, const char *pins)
{
	decider->program = mb_open_pin(pins, "decide");
	decider->servers = mb_open_pin(pins, "servers");
	decider->server_index = mb_open_pin(pins, "server_index");
	return decider->program < 0 || decider->servers < 0 || decider->server_index < 0 ? -1 : 0;
}

int mb_server_of(struct mb_decider *decider, struct mb_server_addr address)
{
	struct mb_server_address key = {.ip = address.ip, .port = address.port};
	__u32 index;
	return bpf_map_lookup_elem(decider->server_index, &key, &index) == 0 ? (int)index : -1;
}

int mb_server_address(struct mb_decider *decider, uint32_t index, struct mb_server_addr *address)
{
	struct mb_server server;
	if (bpf_map_lookup_elem(decider->servers, &index, &server) != 0 || server.ip == 0)
		return -1;
	address->ip = server.ip;
	address->port = server.port;
	return 0;
}

static uint16_t mb_ip_checksum(const uint8_t *header)
{
	uint32_t sum = 0;
	for (int i = 0; i < 20; i += 2)
		sum += (uint32_t)header[i] << 8 | header[i + 1];
	while (sum >> 16)
		sum = (sum & 0xffff) + (sum >> 16);
	return htons((uint16_t)~sum);
}

/* A UDP get of the key from the client to the home, as a memcached client would send it. */
static size_t mb_get_frame(uint8_t *frame, struct mb_server_addr home, struct mb_server_addr client,
			   uint16_t entropy, const char *key, size_t key_length)
{
	size_t payload = 8 + 4 + key_length + 2, udp = 8 + payload, ip = 20 + udp;
	memset(frame, 0, 14 + 20 + 8 + 8);
	frame[0] = 0x02;  /* locally administered unicast: never a real MAC of the switch's ports */
	frame[6] = 0x02;
	frame[12] = 0x08;  /* IPv4 */
	uint8_t *iph = frame + 14;
	iph[0] = 0x45;
	iph[2] = (uint8_t)(ip >> 8);
	iph[3] = (uint8_t)ip;
	iph[8] = 64;
	iph[9] = 17;  /* UDP */
	memcpy(iph + 12, &client.ip, 4);
	memcpy(iph + 16, &home.ip, 4);
	uint16_t checksum = mb_ip_checksum(iph);
	memcpy(iph + 10, &checksum, 2);
	uint8_t *udph = iph + 20;
	memcpy(udph, &client.port, 2);
	memcpy(udph + 2, &home.port, 2);
	udph[4] = (uint8_t)(udp >> 8);
	udph[5] = (uint8_t)udp;
	uint8_t *memcached = udph + 8;
	memcached[0] = (uint8_t)(entropy >> 8);  /* request id */
	memcached[1] = (uint8_t)entropy;
	memcached[5] = 1;  /* one datagram */
	memcpy(memcached + 8, "get ", 4);
	memcpy(memcached + 12, key, key_length);
	memcpy(memcached + 12 + key_length, "\r\n", 2);
	return 14 + ip;
}

int mb_decide(struct mb_decider *decider, uint32_t home, struct mb_server_addr home_address,
	      struct mb_server_addr client, uint16_t entropy, const char *key, size_t key_length)
{
	uint8_t frame[MB_FRAME_MAX], out[MB_FRAME_MAX];
	if (key_length == 0 || key_length > 250)
		return (int)home;
	size_t length = mb_get_frame(frame, home_address, client, entropy, key, key_length);
	struct __sk_buff context = {.mark = MB_DECIDE_MARK}, answer = {0};
	LIBBPF_OPTS(bpf_test_run_opts, run, .data_in = frame, .data_size_in = (__u32)length, .data_out = out,
		    .data_size_out = sizeof(out), .ctx_in = &context, .ctx_size_in = sizeof(context),
		    .ctx_out = &answer, .ctx_size_out = sizeof(answer), .repeat = 1);
	if (bpf_prog_test_run_opts(decider->program, &run) != 0 || answer.cb[0] != MB_DECIDED)
		return -1;
	return (int)answer.cb[1];
}
