/* SPDX-License-Identifier: MIT */
/*
 * swml_redirect.c - the worker side's XDP program (loaded with bcc by
 * switchml_xdp/client/afxdp_backend.py, one per worker interface).
 *
 * It hands this worker's swml RESULTs to the AF_XDP socket of the worker's C
 * engine (worker/) and everything else to the kernel stack, so that ARP, ping
 * and the control protocol's TCP connection keep working:
 *
 *   IPv4 (no options, not a fragment) / UDP to a lane's port (SWML_PORT + q,
 *   q < SWML_LANES), IP destination the worker's own address (a unicast
 *   shadow reply) or the job's multicast group, IP source the switch's
 *   address and UDP source port the switch's, swml header present with
 *   ver_type RESULT, arrived on rx queue q            -> XSKMAP[q]
 *   the same on another rx queue                      -> XDP_PASS, counted
 *   anything else                                     -> XDP_PASS
 *
 * What is passed goes to the kernel stack, where the backend's socket that
 * holds the port (switchml_xdp/client/port.py) takes it and nobody reads it: a
 * forged RESULT never reaches the engine.
 *
 * Lane q's engine binds rx queue q, and an AF_XDP socket takes frames from
 * its own queue alone: the NIC must steer port + q to queue q (an ntuple
 * rule; the lab's bridge does it, xdp/lab/swml_steer.c). A RESULT that
 * arrives on another queue can reach no socket: it is passed and counted as
 * misqueued, and a call that stalls on it says so (afxdp_backend.py). The
 * redirect falls back to XDP_PASS when no socket sits at the queue, so a
 * frame is never lost to a missing socket. The engine checks source, job id,
 * length, seq, tag and op itself.
 *
 * Specialised at load time by compiler defines, what a worker knows before
 * it joins its job:
 *   SWML_PORT       the job's UDP port (where lane 0's RESULTs arrive), host order
 *   SWML_LANES      the job's lanes (1 if not defined): ports SWML_PORT + q
 *   SWML_LOCAL_IP   the worker's IPv4 address, as the __be32 reads on this host
 *   SWML_XSKS       XSKMAP size (rx queues that may carry a socket)
 * and by the one row of the `peer` map, what the join's reply says (the
 * switch's data address and port, the job's multicast group). The worker
 * compiles before it joins and writes the row after, so that every rank's
 * datapath is up within milliseconds of the join's barrier: a compile there
 * (a second or more) made the job's first call a late rank's. Until the row
 * is written nothing matches and everything is passed.
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
#ifndef SWML_LANES
#define SWML_LANES 1
#endif
#ifndef SWML_XSKS
#define SWML_XSKS 64
#endif

/* Rows of rx_counters. */
#define SWML_RX_REDIRECTED 0 /* handed to XSKMAP (the socket may still drop it) */
#define SWML_RX_PASSED 1     /* everything else, the misqueued too */
#define SWML_RX_MISQUEUED 2  /* a lane's RESULT on another lane's rx queue: passed */
#define SWML_RX_NUM 3

/* Where this worker's RESULTs come from: written once, after the join. */
struct swml_redirect_peer {
	__be32 switch_ip;   /* the switch's data address; 0: not joined yet */
	__be32 group_ip;    /* the job's multicast group */
	__be16 switch_port; /* the switch's data port */
	__u16 pad;
};

BPF_XSKMAP(xsks, SWML_XSKS);
BPF_ARRAY(peer, struct swml_redirect_peer, 1);
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
	u32 zero = 0, lane;
	struct swml_redirect_peer *from = peer.lookup(&zero);

	if (!from || !from->switch_ip)
		goto pass;
	if (swml_parse_udp_any(data, data_end, &ip, &udp) != SWML_PARSE_OURS ||
	    (ip->frag_off & bpf_htons(SWML_IP_FRAGMENT)))
		goto pass;
	lane = (u16)(bpf_ntohs(udp->dest) - SWML_PORT);
	if (lane >= SWML_LANES)
		goto pass;
	if (ip->daddr != (__be32)SWML_LOCAL_IP && ip->daddr != from->group_ip)
		goto pass;
	if (ip->saddr != from->switch_ip || udp->source != from->switch_port)
		goto pass;
	h = (void *)(udp + 1);
	if ((void *)(h + 1) > data_end || h->ver_type != ((SWML_VERSION << 4) | SWML_TYPE_RESULT))
		goto pass;
	if (lane != ctx->rx_queue_index) {
		swml_rx_count(SWML_RX_MISQUEUED);
		goto pass;
	}
	swml_rx_count(SWML_RX_REDIRECTED);
	return xsks.redirect_map(lane, XDP_PASS);

pass:
	swml_rx_count(SWML_RX_PASSED);
	return XDP_PASS;
}
