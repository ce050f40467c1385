/* SPDX-License-Identifier: MIT */
/*
 * swml_parse.h - the Ethernet | IPv4 | UDP prologue that every XDP program of
 * the product starts with (the switch, the worker's redirect program, the
 * reflector), and the lab's queue steering (tc) too.
 *
 * BPF C only (bcc): include after the uapi headers for ethhdr, iphdr, udphdr.
 */
#ifndef SWML_PARSE_H
#define SWML_PARSE_H

#define SWML_IP_FRAGMENT 0x3fff /* frag_off bits of a fragment: MF or an offset */

/* What swml_parse_udp found. */
#define SWML_PARSE_OURS 0       /* IPv4 without options, UDP to the port */
#define SWML_PARSE_NOT_OURS 1   /* anything else: not IPv4/UDP, or another port */
#define SWML_PARSE_IP_OPTIONS 2 /* IPv4 with options, UDP to the port behind them */

/* Is this frame IPv4 / UDP? SWML_PARSE_OURS: without IP options, *ipp and
 * *udpp pointing at the headers (at constant offsets); SWML_PARSE_IP_OPTIONS:
 * with options, *udpp at the UDP header behind them. Whatever the port. */
static __always_inline int swml_parse_udp_any(void *data, void *data_end, struct iphdr **ipp,
					      struct udphdr **udpp)
{
	struct ethhdr *eth = data;
	struct iphdr *ip;
	struct udphdr *udp;

	if ((void *)(eth + 1) > data_end || eth->h_proto != bpf_htons(ETH_P_IP))
		return SWML_PARSE_NOT_OURS;
	ip = (void *)(eth + 1);
	if ((void *)(ip + 1) > data_end || ip->version != 4 || ip->protocol != IPPROTO_UDP ||
	    ip->ihl < 5)
		return SWML_PARSE_NOT_OURS;
	if (ip->ihl != 5) {
		udp = (void *)ip + (ip->ihl & 0xf) * 4;
		if ((void *)(udp + 1) > data_end)
			return SWML_PARSE_NOT_OURS;
		*udpp = udp;
		return SWML_PARSE_IP_OPTIONS;
	}
	udp = (void *)(ip + 1);
	if ((void *)(udp + 1) > data_end)
		return SWML_PARSE_NOT_OURS;
	*ipp = ip;
	*udpp = udp;
	return SWML_PARSE_OURS;
}

/* Is this frame UDP to `port` (network order)? On SWML_PARSE_OURS, *ipp and
 * *udpp point at the headers, at constant offsets (no IP options: a frame
 * with options is reported apart, so the fast path never has a variable one). */
static __always_inline int swml_parse_udp(void *data, void *data_end, __be16 port,
					  struct iphdr **ipp, struct udphdr **udpp)
{
	struct iphdr *ip = 0;
	struct udphdr *udp = 0;
	int found = swml_parse_udp_any(data, data_end, &ip, &udp);

	if (found == SWML_PARSE_NOT_OURS || udp->dest != port)
		return SWML_PARSE_NOT_OURS;
	if (found == SWML_PARSE_OURS) {
		*ipp = ip;
		*udpp = udp;
	}
	return found;
}

#endif /* SWML_PARSE_H */
