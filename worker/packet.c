/* SPDX-License-Identifier: MIT */
#include "packet.h"
#include "swml_auth.h"

#include <arpa/inet.h>
#include <endian.h>
#include <stddef.h>
#include <string.h>

static uint16_t ipv4_checksum(const uint8_t *ip)
{
	uint32_t sum = 0;

	for (int i = 0; i < SWML_IP_LEN; i += 2)
		sum += (uint32_t)ip[i] << 8 | ip[i + 1];
	while (sum >> 16)
		sum = (sum & 0xffff) + (sum >> 16);
	return (uint16_t)~sum; /* host order value of the big-endian field */
}

static void put16(uint8_t *p, uint16_t v)
{
	p[0] = v >> 8;
	p[1] = v & 0xff;
}

static void put32(uint8_t *p, uint32_t v)
{
	put16(p, v >> 16);
	put16(p + 2, v & 0xffff);
}

void swml_build_template(uint8_t t[SWML_L2L4_LEN], const struct swml_addrs *a, uint32_t k,
			 uint8_t fmt)
{
	uint8_t *eth = t, *ip = t + SWML_ETH_LEN, *udp = ip + SWML_IP_LEN;
	uint32_t udp_len = SWML_UDP_LEN + SWML_HDR_LEN + swml_fmt_size(fmt) * k;

	memset(t, 0, SWML_L2L4_LEN);
	memcpy(eth, a->dst_mac, 6);
	memcpy(eth + 6, a->src_mac, 6);
	put16(eth + 12, 0x0800); /* ETH_P_IP */
	ip[0] = 0x45;            /* v4, ihl 5 */
	ip[1] = 0;               /* tos */
	put16(ip + 2, SWML_IP_LEN + udp_len);
	put16(ip + 4, 0);      /* id: DF set, never fragmented */
	put16(ip + 6, 0x4000); /* DF */
	ip[8] = 64;            /* ttl */
	ip[9] = 17;            /* IPPROTO_UDP */
	memcpy(ip + 12, a->src_ip, 4);
	memcpy(ip + 16, a->dst_ip, 4);
	put16(ip + 10, ipv4_checksum(ip));
	put16(udp, a->src_port);
	put16(udp + 2, a->dst_port);
	put16(udp + 4, udp_len);
	put16(udp + 6, 0); /* no UDP checksum (allowed over IPv4) */
}

void swml_template_set_tos(uint8_t t[SWML_L2L4_LEN], uint8_t tos)
{
	uint8_t *ip = t + SWML_ETH_LEN;

	ip[1] = tos;
	put16(ip + 10, 0);
	put16(ip + 10, ipv4_checksum(ip));
}

uint16_t swml_pace_encode(uint64_t v)
{
	const int bits = v ? 64 - __builtin_clzll(v) : 0;
	const int e = bits > SWML_PACE_MANT_BITS ? bits - SWML_PACE_MANT_BITS : 0;

	if (e > SWML_PACE_EXP_MAX)
		return 0xffff;
	return (uint16_t)((unsigned int)e << SWML_PACE_MANT_BITS | (v >> e));
}

uint64_t swml_pace_decode(uint16_t code)
{
	return (uint64_t)(code & SWML_PACE_MANT_MASK) << (code >> SWML_PACE_MANT_BITS);
}

/* Field by field, through struct swml_hdr's offsets (swml_wire.h is the one
 * layout): the header may sit at any alignment in the frame. */
#define HDR_AT(h, field) ((h) + offsetof(struct swml_hdr, field))

void swml_write_data_hdr(uint8_t *h, const struct swml_data_id *id, uint8_t flags, uint16_t slot,
			 uint32_t seq, int8_t exp, uint8_t owner, uint16_t pace)
{
	uint64_t key_be = htobe64(id->key);

	*HDR_AT(h, ver_type) = (SWML_VERSION << 4) | SWML_TYPE_DATA;
	*HDR_AT(h, flags) = flags;
	*HDR_AT(h, op) = id->op;
	*HDR_AT(h, fmt) = id->fmt;
	put16(HDR_AT(h, job), id->job);
	put16(HDR_AT(h, rank), id->rank);
	put16(HDR_AT(h, slot), slot);
	put16(HDR_AT(h, count), id->count);
	put32(HDR_AT(h, seq), seq);
	put32(HDR_AT(h, tag), id->tag);
	*HDR_AT(h, exp) = (uint8_t)exp;
	*HDR_AT(h, owner) = owner;
	put16(HDR_AT(h, pace), pace);
	memcpy(HDR_AT(h, key), &key_be, sizeof key_be);
}

static uint16_t get16(const uint8_t *p)
{
	return (uint16_t)(p[0] << 8 | p[1]);
}

static uint32_t get32(const uint8_t *p)
{
	return (uint32_t)get16(p) << 16 | get16(p + 2);
}

int swml_parse_result(const uint8_t *f, uint32_t len, const struct swml_addrs *a, uint16_t job,
		      uint32_t k, uint8_t fmt, struct swml_result *r)
{
	const uint8_t *ip = f + SWML_ETH_LEN, *udp = ip + SWML_IP_LEN, *h = f + SWML_L2L4_LEN;
	uint8_t got;

	if (len < SWML_HEADERS_LEN)
		return -1;
	/* The redirect program checked IPv4 without options, UDP, our port and
	 * address, the switch as the source and the RESULT type; a second look
	 * costs nothing here. */
	if (get16(f + 12) != 0x0800 || ip[0] != 0x45 || ip[9] != 17)
		return -1;
	if (memcmp(ip + 12, a->dst_ip, 4) || get16(udp) != a->dst_port)
		return -1;
	if (*HDR_AT(h, ver_type) != ((SWML_VERSION << 4) | SWML_TYPE_RESULT) ||
	    get16(HDR_AT(h, job)) != job || get16(HDR_AT(h, count)) != k)
		return -1;
	got = *HDR_AT(h, fmt);
	r->flags = *HDR_AT(h, flags);
	if (got != fmt && !(r->flags & SWML_FLAG_DISAGREE))
		return -1;
	if (got == fmt && !(r->flags & SWML_FLAG_HEADER_ONLY)) {
		if (len < SWML_HEADERS_LEN + swml_fmt_size(fmt) * k)
			return -1;
		r->payload = h + SWML_HDR_LEN;
	} else {
		r->payload = NULL;
	}
	r->fmt = got;
	r->tos = ip[1];
	r->pace = get16(HDR_AT(h, pace));
	r->op = *HDR_AT(h, op);
	r->job = job;
	r->rank = get16(HDR_AT(h, rank));
	r->slot = get16(HDR_AT(h, slot));
	r->seq = get32(HDR_AT(h, seq));
	r->tag = get32(HDR_AT(h, tag));
	r->exp = (int8_t)*HDR_AT(h, exp);
	r->count = (uint16_t)k;
	return 0;
}

uint64_t swml_result_tag(const uint8_t *h, const uint64_t key[2], uint32_t auth,
			 uint32_t payload_len)
{
	/* the same 64-bit words: uint64_t is unsigned long here, __u64 unsigned long long */
	return swml_result_auth((const __u64 *)key, auth, h, payload_len);
}

int swml_result_authentic(const uint8_t *frame, uint32_t len, const struct swml_result *r,
			  uint32_t k, const uint64_t key[2], uint32_t auth)
{
	const uint8_t *h = frame + SWML_L2L4_LEN;
	const int header_only = r->flags & SWML_FLAG_HEADER_ONLY;
	uint32_t payload_len =
		auth == SWML_AUTH_FULL && !header_only ? swml_fmt_size(r->fmt) * k : 0;
	uint64_t want;
	uint8_t diff = 0;

	if (len < SWML_HEADERS_LEN + payload_len)
		return 0; /* a DISAGREE result cut short: its payload cannot be checked */
	want = swml_result_tag(h, key, header_only ? SWML_AUTH_HEADER : auth, payload_len);
	for (int i = 0; i < 8; i++) /* the tag's bytes, little-endian (swml_wire.h) */
		diff |= h[offsetof(struct swml_hdr, key) + i] ^ (uint8_t)(want >> (8 * i));
	return diff == 0;
}
