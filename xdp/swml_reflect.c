/* SPDX-License-Identifier: MIT */
/*
 * swml_reflect.c - the path's ceiling: a trivial reflector for the box's port
 * (loaded with bcc by switchml_xdp/bench/reflector.py, in place of the switch;
 * docs/performance.md, "The path's ceiling").
 *
 *   IPv4 (no options) / UDP to SWML_REFLECT_PORT, IP destination the box's
 *   own address                 -> addresses swapped (Ethernet, IPv4, UDP
 *                                  ports), XDP_TX: the same bytes, the same
 *                                  length, back to where they came from
 *   anything else               -> XDP_PASS
 *
 * What xdpsock's l2fwd does to a frame, on the port where the switch runs:
 * a worker's raw ping-pong (worker/raw_path.c) through it measures what
 * AF_XDP on these links, at swml's frame size and batches, can do at all.
 * Swapping two addresses leaves the IPv4 and UDP checksums as they were
 * (one's-complement sums do not depend on the order of their words).
 *
 * Specialised at load time by compiler defines:
 *   SWML_REFLECT_PORT  the UDP port it answers, host order
 *   SWML_REFLECT_IP    the box's IPv4 address, as the __be32 reads on this host
 */
#include <uapi/linux/bpf.h>
#include <uapi/linux/if_ether.h>
#include <uapi/linux/ip.h>
#include <uapi/linux/in.h>
#include <uapi/linux/udp.h>

#include "swml_parse.h"

#if !defined(SWML_REFLECT_PORT) || !defined(SWML_REFLECT_IP)
#error "SWML_REFLECT_PORT and SWML_REFLECT_IP must be defined"
#endif

/* Rows of reflect_counters. */
#define SWML_REFLECTED 0 /* sent back with XDP_TX */
#define SWML_REFLECT_PASSED 1
#define SWML_REFLECT_NUM 2

BPF_PERCPU_ARRAY(reflect_counters, u64, SWML_REFLECT_NUM);

static __always_inline int swml_reflect_count(u32 row, int action)
{
	u64 *c = reflect_counters.lookup(&row);
	if (c)
		*c += 1;
	return action;
}

int swml_reflect(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = 0;
	struct udphdr *udp = 0;
	unsigned char mac[ETH_ALEN];
	__be32 addr;
	__be16 port;

	if (swml_parse_udp(data, data_end, bpf_htons(SWML_REFLECT_PORT), &ip, &udp) !=
		    SWML_PARSE_OURS ||
	    ip->daddr != (__be32)SWML_REFLECT_IP)
		return swml_reflect_count(SWML_REFLECT_PASSED, XDP_PASS);
	__builtin_memcpy(mac, eth->h_dest, ETH_ALEN);
	__builtin_memcpy(eth->h_dest, eth->h_source, ETH_ALEN);
	__builtin_memcpy(eth->h_source, mac, ETH_ALEN);
	addr = ip->daddr;
	ip->daddr = ip->saddr;
	ip->saddr = addr;
	port = udp->dest;
	udp->dest = udp->source;
	udp->source = port;
	return swml_reflect_count(SWML_REFLECTED, XDP_TX);
}
