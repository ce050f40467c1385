/* SPDX-License-Identifier: MIT */
#include "packet.h"

#include <arpa/inet.h>
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

void swml_build_template(uint8_t t[SWML_L2L4_LEN], const struct swml_addrs *a, uint32_t k)
{
	uint8_t *eth = t, *ip = t + SWML_ETH_LEN, *udp = ip + SWML_IP_LEN;
	uint32_t udp_len = SWML_UDP_LEN + SWML_HDR_LEN + 4 * k;

	memset(t, 0, SWML_L2L4_LEN);
	memcpy(eth, a->dst_mac, 6);
	memcpy(eth + 6, a->src_mac, 6);
	put16(eth + 12, 0x0800);           /* ETH_P_IP */
	ip[0] = 0x45;                      /* v4, ihl 5 */
	ip[1] = 0;                         /* tos */
	put16(ip + 2, SWML_IP_LEN + udp_len);
	put16(ip + 4, 0);                  /* id: DF set, never fragmented */
	put16(ip + 6, 0x4000);             /* DF */
	ip[8] = 64;                        /* ttl */
	ip[9] = 17;                        /* IPPROTO_UDP */
	memcpy(ip + 12, a->src_ip, 4);
	memcpy(ip + 16, a->dst_ip, 4);
	put16(ip + 10, ipv4_checksum(ip));
	put16(udp, a->src_port);
	put16(udp + 2, a->dst_port);
	put16(udp + 4, udp_len);
	put16(udp + 6, 0);                 /* no UDP checksum (allowed over IPv4) */
}

void swml_write_hdr(uint8_t *h, uint8_t type, uint8_t flags, uint16_t job, uint16_t rank,
		    uint16_t slot, uint32_t seq, int8_t exp, uint16_t count)
{
	h[0] = (SWML_VERSION << 4) | type;
	h[1] = flags;
	put16(h + 2, job);
	put16(h + 4, rank);
	put16(h + 6, slot);
	put32(h + 8, seq);
	h[12] = (uint8_t)exp;
	h[13] = 0;
	put16(h + 14, count);
}

static uint16_t get16(const uint8_t *p)
{
	return (uint16_t)(p[0] << 8 | p[1]);
}

int swml_parse_result(const uint8_t *f, uint32_t len, uint16_t job, uint32_t k,
		      struct swml_result *r)
{
	const uint8_t *ip = f + SWML_ETH_LEN, *h = f + SWML_L2L4_LEN;

	if (len < SWML_HEADERS_LEN + 4 * k)
		return -1;
	/* The redirect program checked IPv4 without options, UDP, our port and
	 * address and the RESULT type; a second look costs nothing here. */
	if (get16(f + 12) != 0x0800 || ip[0] != 0x45 || ip[9] != 17)
		return -1;
	if (h[0] != ((SWML_VERSION << 4) | SWML_TYPE_RESULT) || get16(h + 2) != job ||
	    get16(h + 14) != k)
		return -1;
	r->flags = h[1];
	r->job = job;
	r->slot = get16(h + 6);
	r->seq = (uint32_t)get16(h + 8) << 16 | get16(h + 10);
	r->exp = (int8_t)h[12];
	r->count = (uint16_t)k;
	r->payload = h + SWML_HDR_LEN;
	return 0;
}
