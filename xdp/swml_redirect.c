/* SPDX-License-Identifier: MIT */
/*
 * swml_redirect.c - the worker side's XDP program (loaded with bcc by
 * switchml_xdp/client/afxdp_backend.py, one per worker interface).
 *
 * It hands this worker's swml RESULTs to the AF_XDP socket of the worker's C
 * engine (worker/) and everything else to the kernel stack, so that ARP, ping
 * and the control protocol's TCP connection keep working:
 *
 *   IPv4 (no options, not a fragment) / UDP to SWML_PORT, IP destination the
 *   worker's own address (a unicast shadow reply) or the job's multicast group,
 *   IP source the switch's address and UDP source port the switch's,
 *   swml header present with ver_type RESULT         -> XSKMAP[rx queue]
 *   anything else                                     -> XDP_PASS
 *
 * What is passed goes to the kernel stack, where the backend's socket that
 * holds the port (switchml_xdp/client/port.py) takes it and nobody reads it: a
 * forged RESULT never reaches the engine.
 *
 * The redirect falls back to XDP_PASS when no socket sits at the frame's rx
 * queue (the engine binds queue 0 only), so a frame is never lost to a missing
 * socket. The engine checks source, job id, length, seq, tag and op itself.
 *
 * Specialised at load time by compiler defines:
 *   SWML_PORT       the job's UDP port (where RESULTs arrive), host order
 *   SWML_LOCAL_IP   the worker's IPv4 address, as the __be32 reads on this host
 *   SWML_GROUP_IP   the job's multicast group, likewise
 *   SWML_SWITCH_IP  the switch's IPv4 address, likewise
 *   SWML_SWITCH_PORT the switch's UDP port, host order
 *   SWML_XSKS       XSKMAP size (rx queues that may carry a socket)
 */
#include <uapi/linux/bpf.h>
#include <uapi/linux/if_ether.h>
#include <uapi/linux/ip.h>
#include <uapi/linux/in.h>
#include <uapi/linux/udp.h>

#include "swml_wire.h"
#include "swml_parse.h"

#ifndef SWML_PORT
#error "SWML_PORT must be defined"
#endif
#ifndef SWML_LOCAL_IP
#error "SWML_LOCAL_IP must be defined"
#endif
#ifndef SWML_GROUP_IP
#error "SWML_GROUP_IP must be defined"
#endif
#if !defined(SWML_SWITCH_IP) || !defined(SWML_SWITCH_PORT)
#error "SWML_SWITCH_IP and SWML_SWITCH_PORT must be defined"
#endif
#ifndef SWML_XSKS
#define SWML_XSKS 64
#endif

/* Rows of rx_counters. */
#define SWML_RX_REDIRECTED 0 /* handed to XSKMAP (the socket may still drop it) */
#define SWML_RX_PASSED 1     /* everything else */
#define SWML_RX_NUM 2

BPF_XSKMAP(xsks, SWML_XSKS);
BPF_PERCPU_ARRAY(rx_counters, u64, SWML_RX_NUM);

static __always_inline void swml_rx_count(u32 row)
{
	u64 *c = rx_counters.lookup(&row);
	if (c)
		*c += 1;
}

int swml_redirect(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct iphdr *ip = 0;
	struct udphdr *udp = 0;
	struct swml_hdr *h;

	if (swml_parse_udp(data, data_end, bpf_htons(SWML_PORT), &ip, &udp) != SWML_PARSE_OURS ||
	    (ip->frag_off & bpf_htons(SWML_IP_FRAGMENT)))
		goto pass;
	if (ip->daddr != (__be32)SWML_LOCAL_IP && ip->daddr != (__be32)SWML_GROUP_IP)
		goto pass;
	if (ip->saddr != (__be32)SWML_SWITCH_IP || udp->source != bpf_htons(SWML_SWITCH_PORT))
		goto pass;
	h = (void *)(udp + 1);
	if ((void *)(h + 1) > data_end || h->ver_type != ((SWML_VERSION << 4) | SWML_TYPE_RESULT))
		goto pass;
	swml_rx_count(SWML_RX_REDIRECTED);
	return xsks.redirect_map(ctx->rx_queue_index, XDP_PASS);

pass:
	swml_rx_count(SWML_RX_PASSED);
	return XDP_PASS;
}
