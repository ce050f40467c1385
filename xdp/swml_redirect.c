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
 *   ver_type RESULT, arrived on lane q's rx queue      -> XSKMAP[that queue]
 *   the same on another rx queue                      -> XDP_PASS, counted
 *   anything else                                     -> XDP_PASS
 *
 * What is passed goes to the kernel stack, where the backend's socket that
 * holds the port (switchml_xdp/client/port.py) takes it; the engine reads
 * that socket too, and takes only RESULTs from the switch's address and
 * port with a valid authenticator from it, as from its AF_XDP socket.
 *
 * Lane q's engine binds rx queue q at first, and an AF_XDP socket takes
 * frames from its own queue alone: the NIC should steer port + q to queue q
 * (an ntuple rule; the lab's bridge does it, xdp/lab/swml_steer.c). A RESULT
 * that arrives on another queue can reach no socket: it is passed, counted
 * as misqueued, and the queue it came in on is kept in misqueued_on; the
 * engine reads it from the port's socket (worker/port.h), and between calls
 * the backend moves the lane's socket to that queue where no other lane's
 * socket is, saying so in lane_queue (afxdp_backend.py, follow_results):
 * RSS puts a flow on one queue, so with no rule at all a lane's RESULTs
 * come to its socket from its second call on. The redirect falls back to
 * XDP_PASS when no socket sits at the queue, so a frame is never lost to a
 * missing socket. The engine checks source, job id, length, seq, tag and op
 * itself.
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
#define SWML_RX_MISQUEUED 2  /* a lane's RESULT on another rx queue than its socket's: passed */
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
/* A lane's socket's queue + 1 where the backend moved it (0: queue q, lane q's own). */
BPF_ARRAY(lane_queue, u32, SWML_LANES);
/* The queue + 1 a lane's last misqueued RESULT came in on (0: none since the backend looked). */
BPF_ARRAY(misqueued_on, u32, SWML_LANES);

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
	u32 zero = 0, lane, queue, *moved, *on;
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
	moved = lane_queue.lookup(&lane);
	queue = moved && *moved ? *moved - 1 : lane;
	if (queue != ctx->rx_queue_index) {
		on = misqueued_on.lookup(&lane);
		if (on)
			*on = ctx->rx_queue_index + 1;
		swml_rx_count(SWML_RX_MISQUEUED);
		goto pass;
	}
	swml_rx_count(SWML_RX_REDIRECTED);
	return xsks.redirect_map(queue, XDP_PASS);

pass:
	swml_rx_count(SWML_RX_PASSED);
	return XDP_PASS;
}
