/* SPDX-License-Identifier: MIT */
/*
 * packet.h - the frames the worker engine sends and receives (wire format v2,
 * xdp/swml_wire.h): Ethernet | IPv4 (no options) | UDP | swml_hdr | k x int32
 * (SWML_FMT_INT32) or k x int16 (SWML_FMT_INT16).
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
	uint8_t src_ip[4], dst_ip[4]; /* network order */
	uint16_t src_port, dst_port;  /* host order */
};

/* Bytes per payload element of format fmt (SWML_FMT_*). */
static inline uint32_t swml_fmt_size(uint8_t fmt)
{
	return fmt == SWML_FMT_INT16 ? 2 : 4;
}

/* The 42-byte Ethernet/IPv4/UDP prefix of every DATA packet with k elements
 * of format fmt. */
void swml_build_template(uint8_t tmpl[SWML_L2L4_LEN], const struct swml_addrs *a, uint32_t k,
			 uint8_t fmt);

/* What every DATA packet of one call has in its swml header. */
struct swml_data_id {
	uint16_t job, rank, count;
	uint8_t op, fmt;
	uint32_t tag;
	uint64_t key;
};

/* Set the IPv4 TOS of a template built above (its checksum follows). */
void swml_template_set_tos(uint8_t tmpl[SWML_L2L4_LEN], uint8_t tos);

/* A value as a 16-bit pace code, and back (swml_wire.h, SWML_PACE_*; the
 * same arithmetic as switchml_xdp/wire.py's pace_encode and pace_decode). */
uint16_t swml_pace_encode(uint64_t v);
uint64_t swml_pace_decode(uint16_t code);

/* Write the swml header of a DATA packet at h (any alignment); owner: 0, or
 * 1 + the rank that keeps this packet's elements (stream.h, shards); pace:
 * the pace code of the call's payload bytes left (docs/transport.md). */
void swml_write_data_hdr(uint8_t *h, const struct swml_data_id *id, uint8_t flags, uint16_t slot,
			 uint32_t seq, int8_t exp, uint8_t owner, uint16_t pace);

/* A RESULT as the engine sees it; payload points into the frame (unaligned),
 * NULL for a DISAGREE result in another format than the call's and for a
 * header-only one (SWML_FLAG_HEADER_ONLY). */
struct swml_result {
	uint8_t flags, op, fmt;
	uint8_t tos;   /* the IPv4 TOS: the job's DSCP mark in its high six bits */
	uint16_t pace; /* the rank's rate to the box, a pace code (0: no limit) */
	int8_t exp;
	uint16_t job, rank, slot, count; /* rank: whose packet completed the round */
	uint32_t seq, tag;
	const uint8_t *payload;
};

/* Parse a received frame: 0 and *r filled if it is a v2 RESULT of `job` with
 * count k, from the switch (IPv4 source a->dst_ip, UDP source port
 * a->dst_port: where DATA goes), in the call's format fmt with room for k
 * elements of it (none if flagged HEADER_ONLY: the frame ends after the swml
 * header), or flagged DISAGREE in any format (a round whose ranks disagree
 * answers in one rank's format, maybe not ours; nothing in it is read); -1
 * otherwise. The caller checks seq, tag and op against the call. */
int swml_parse_result(const uint8_t *frame, uint32_t len, const struct swml_addrs *a, uint16_t job,
		      uint32_t k, uint8_t fmt, struct swml_result *r);

/* The authenticator a RESULT with swml header h must carry (xdp/swml_auth.h),
 * keyed by the job's result key (SipHash's k0, k1), over the header and, with
 * auth SWML_AUTH_FULL, the payload_len bytes after it. */
uint64_t swml_result_tag(const uint8_t *h, const uint64_t key[2], uint32_t auth,
			 uint32_t payload_len);

/* Whether the RESULT frame (len bytes, parsed into r) carries the right
 * authenticator: its payload, as long as k elements of its own format, is
 * covered under SWML_AUTH_FULL; a header-only RESULT's covers the header
 * alone, whatever auth. Compared in constant time. */
int swml_result_authentic(const uint8_t *frame, uint32_t len, const struct swml_result *r,
			  uint32_t k, const uint64_t key[2], uint32_t auth);

#endif /* SWML_PACKET_H */
