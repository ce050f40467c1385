/* SPDX-License-Identifier: MIT */
/*
 * packet.h - the frames the worker engine sends and receives (wire format v1,
 * xdp/swml_wire.h): Ethernet | IPv4 (no options) | UDP | swml_hdr | k x int32.
 *
 * Everything in front of the swml header is the same for every DATA packet of
 * a job (addresses, ports, lengths; IP id 0 with DF, so the IPv4 checksum is a
 * constant too; UDP checksum 0), so it is built once as a template.
 */
#ifndef SWML_PACKET_H
#define SWML_PACKET_H

#include <linux/types.h>
#include <stdint.h>

#include "swml_wire.h"

#define SWML_L2L4_LEN (SWML_ETH_LEN + SWML_IP_LEN + SWML_UDP_LEN) /* 42 */

struct swml_addrs {
	uint8_t src_mac[6], dst_mac[6];
	uint8_t src_ip[4], dst_ip[4];   /* network order */
	uint16_t src_port, dst_port;    /* host order */
};

/* The 42-byte Ethernet/IPv4/UDP prefix of every DATA packet with k elements. */
void swml_build_template(uint8_t tmpl[SWML_L2L4_LEN], const struct swml_addrs *a, uint32_t k);

/* Write the swml header at h (any alignment). */
void swml_write_hdr(uint8_t *h, uint8_t type, uint8_t flags, uint16_t job, uint16_t rank,
		    uint16_t slot, uint32_t seq, int8_t exp, uint16_t count);

/* A RESULT as the engine sees it; payload points into the frame (unaligned). */
struct swml_result {
	uint8_t flags;
	int8_t exp;
	uint16_t job, slot, count;
	uint32_t seq;
	const uint8_t *payload;
};

/* Parse a received frame: 0 and *r filled if it is a v1 RESULT of `job` with
 * count k and room for k elements; -1 otherwise. */
int swml_parse_result(const uint8_t *frame, uint32_t len, uint16_t job, uint32_t k,
		      struct swml_result *r);

#endif /* SWML_PACKET_H */
