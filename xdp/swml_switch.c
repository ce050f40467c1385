/* SPDX-License-Identifier: MIT */
/*
 * swml_switch.c - the aggregation switch's data plane (XDP, loaded with bcc).
 *
 * Specialised at load time by compiler defines (switchml_xdp/switch/xdp_dataplane.py):
 *   SWML_K        int32 elements a packet (fixed per switch)
 *   SWML_SLOTS    aggregation slots shared by all jobs
 *   SWML_PORT     UDP port the switch listens on
 *   SWML_PIN_DIR  bpffs directory the maps are pinned in (a string literal)
 *   SWML_SWITCH_IP      the switch's IPv4 address, as the __be32 reads on this host
 *   SWML_SWITCH_MAC_HI  its MAC: bytes 0-3 as a __u32 reads them on this host,
 *   SWML_SWITCH_MAC_LO  bytes 4-5 as a __u16 reads them
 *   SWML_FANOUT_UNICAST defined: --fanout unicast (see below)
 *   SWML_PORTS    the box's ports (one unless more)
 *   SWML_UPLINK   defined: a rack box with an uplink to a parent box (swml_tree.h)
 *
 * Per packet of (job, rank, slot, ver, round), after docs/design.md, "Data plane":
 *   not IPv4/UDP to our port          -> XDP_PASS (the box stays reachable)
 *   to our port, not our MAC and IP   -> XDP_PASS (flooded or forwarded: not for us)
 *   malformed / foreign / stale       -> XDP_DROP, counted by reason, no slot touched
 *   newer round, or rank new to it    -> aggregate; the last one is rewritten into a
 *                                        multicast RESULT and sent with XDP_TX;
 *                                        with SWML_FANOUT_UNICAST, marked in its
 *                                        metadata and passed (XDP_PASS) to the tc
 *                                        program xdp/swml_fanout.c, which sends a
 *                                        unicast copy to each member: XDP cannot
 *                                        clone a frame
 *   rank already in the round         -> shadow reply if complete, else drop
 * A rack box's job with a parent (SWML_UPLINK, swml_tree.h) sends a round
 * complete among its members up to the parent instead (and again for a
 * member's retransmission until the parent's RESULT came down); the parent's
 * RESULT, coming in on the uplink, goes on to the members.
 * The parse prologue is swml_parse.h (shared with the redirect program); the
 * step on the slot is swml_slot.h (shared with the user-space baseline,
 * switchml_xdp/switch/userspace_dp.c).
 */
#include <uapi/linux/bpf.h>
#include <uapi/linux/if_ether.h>
#include <uapi/linux/ip.h>
#include <uapi/linux/in.h>
#include <uapi/linux/udp.h>

#include "swml_wire.h"
#include "swml_maps.h"
#include "swml_parse.h"

/* The slot's lock: its `busy` word, taken with a compare-and-swap and given
 * back with an exchange (BPF atomics, both full barriers), rather than
 * bpf_spin_lock, whose two helper calls (each saving and restoring the
 * interrupt flag) cost 55-100 ns a packet here, a third of the program at
 * k=256 (docs/performance.md). XDP runs in softirq: a holder is not
 * interleaved with another packet on its own CPU, and it holds the word for
 * one step (well under a microsecond). A packet on another CPU retries;
 * the verifier needs a bound, so after SWML_LOCK_TRIES it gives up: the
 * packet is dropped as `busy` (its worker sends it again). Only a stalled
 * holder gets there: a preempted test run, PREEMPT_RT. The 64-bit word:
 * bcc's BPF target has no 32-bit atomics. */
#define SWML_LOCK_TRIES 1024

static __always_inline int swml_slot_trylock(struct swml_slot *s)
{
#pragma nounroll
	for (int i = 0; i < SWML_LOCK_TRIES; i++)
		if (__sync_val_compare_and_swap(&s->busy, 0, 1) == 0)
			return 1;
	return 0;
}

/* The per-slot step (swml_slot.h) on a map value, under its lock. */
#define SWML_SLOT_T struct swml_slot *
#define SWML_SEEN(s, v) ((s)->seen[v])
#define SWML_SEQ(s, v) ((s)->seq[v])
#define SWML_COUNT(s, v) ((s)->count[v])
#define SWML_TAG(s, v) ((s)->tag[v])
#define SWML_OP(s, v) ((s)->op[v])
#define SWML_EXP(s, v) ((s)->exp[v])
#define SWML_FLAGS(s, v) ((s)->flags[v])
#define SWML_VALS(s, v) ((s)->vals[v])
#define SWML_SLOT_LOCK(s) swml_slot_trylock(s)
#define SWML_SLOT_UNLOCK(s) __sync_lock_test_and_set(&(s)->busy, 0)
#define SWML_PAIR_ALIGN 8 /* u64 loads at any address: see swml_slot.h */
#include "swml_slot.h"
#define SWML_AUTH_ALIGN 8 /* as SWML_PAIR_ALIGN */
#include "swml_auth.h"

#ifndef SWML_PORT
#define SWML_PORT SWML_DEFAULT_PORT
#endif
#if !defined(SWML_SWITCH_IP) || !defined(SWML_SWITCH_MAC_HI) || !defined(SWML_SWITCH_MAC_LO)
#error "SWML_SWITCH_IP, SWML_SWITCH_MAC_HI and SWML_SWITCH_MAC_LO must be defined"
#endif

#define SWML_PAYLOAD_LEN (SWML_K * 4)
#define SWML_PAYLOAD_LEN16 (SWML_K * 2) /* SWML_FMT_INT16 */

#include "swml_tables.h"

static __always_inline void swml_count(u32 reason)
{
	u64 *c = counters.lookup(&reason);
	if (c)
		*c += 1;
}

static __always_inline int swml_drop(u32 reason)
{
	swml_count(reason);
	return XDP_DROP;
}

/* Full IPv4 header checksum (20 bytes, no options). Not named csum_*: those
 * names belong to the kernel headers bcc includes. */
static __always_inline __u16 swml_ipv4_csum(struct iphdr *ip)
{
	__u16 *w = (__u16 *)ip;
	__u32 sum = 0;

	ip->check = 0;
#pragma unroll
	for (int i = 0; i < SWML_IP_LEN / 2; i++)
		sum += w[i];
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return ~sum;
}

/* Turn the packet in place into a RESULT: addresses swapped for a unicast shadow
 * reply, or aimed at the job's multicast group, at the port of the slot's
 * lane (swml_maps.h, lane_mask); the job's pace and mark (its job_pace row,
 * where there is one) stamped. The payload is already written. */
static __always_inline void swml_make_result(struct ethhdr *eth, struct iphdr *ip,
					     struct udphdr *udp, struct swml_hdr *h,
					     const struct swml_job *job,
					     const struct swml_job_pace *pace, int unicast,
					     const struct swml_slot_result *res, __u16 lane)
{

	__u8 mac[ETH_ALEN];
	__be32 switch_ip = ip->daddr;

	__builtin_memcpy(mac, eth->h_dest, ETH_ALEN); /* the switch's MAC */
	if (unicast) {
		__builtin_memcpy(eth->h_dest, eth->h_source, ETH_ALEN);
		ip->daddr = ip->saddr;
		udp->dest = udp->source;
	} else {
		__builtin_memcpy(eth->h_dest, job->group_mac, ETH_ALEN);
		ip->daddr = job->group_ip;
		udp->dest = bpf_htons(bpf_ntohs(job->result_port) + lane);
	}
	__builtin_memcpy(eth->h_source, mac, ETH_ALEN);
	ip->saddr = switch_ip;
	ip->ttl = 64;
	if (pace && pace->mark)
		ip->tos = pace->tos;
	ip->check = swml_ipv4_csum(ip);
	udp->source = bpf_htons(SWML_PORT);
	udp->check = 0; /* optional for UDP over IPv4; the payload was rewritten */

	swml_result_hdr(h, res, unicast);
	if (pace)
		h->pace = pace->rate;
}

#include "swml_tree.h"

/* Sign a RESULT (its header and payload final) with the job's result key:
 * the authenticator goes in its `key` field (swml_wire.h). Under
 * SWML_AUTH_FULL the payload too, `len` bytes, a constant at each call site
 * so that the verifier sees every load inside the checked packet. */
static __always_inline void swml_sign(struct swml_hdr *h, const struct swml_job *job,
				      const void *data_end, const __u32 len)
{
	if ((const void *)(h + 1) + len > data_end)
		return; /* cannot happen: swml_length_ok checked the payload */
	*(__u64 *)((void *)h + __builtin_offsetof(struct swml_hdr, key)) =
		swml_result_auth(job->result_key, job->auth, h, len);
}

/* The datagram's lengths for a payload of `len` bytes: SWML_CNT_RX when they
 * are right, else the counter row to drop it under. */
static __always_inline int swml_length_ok(const struct iphdr *ip, const struct udphdr *udp,
					  const void *payload, const void *data_end, __u32 len)
{
	if (payload + len > data_end)
		return SWML_CNT_TRUNCATED;
	if (ip->tot_len != bpf_htons(SWML_IP_LEN + SWML_UDP_LEN + SWML_HDR_LEN + len) ||
	    udp->len != bpf_htons(SWML_UDP_LEN + SWML_HDR_LEN + len))
		return SWML_CNT_BAD_IP;
	return SWML_CNT_RX;
}

/* The slot step of an SWML_FMT_INT16 packet, rewritten in place (the RESULT
 * is as long as the DATA). Its own call site, with the fmt a constant and the
 * payload bounds checked again here, so that the verifier sees k int16
 * accesses within what it knows of the packet. */
static __always_inline int swml_step16(struct swml_slot *s, struct swml_hdr *h, void *data_end,
				       __u32 world, __u32 rank, struct swml_contrib *c,
				       struct swml_slot_result *res, int *disagreed)
{
	__s16 *payload = (void *)(h + 1);

	if ((void *)payload + SWML_PAYLOAD_LEN16 > data_end)
		return SWML_CNT_STALE; /* cannot happen: checked by swml_length_ok */
	c->fmt = SWML_FMT_INT16;
	return swml_slot_step(s, h->flags & SWML_FLAG_SLOT_VER, 1ULL << rank, world, c, payload,
			      payload, SWML_K, res, disagreed);
}

/* A multi-byte field of the swml header in one load. The header is a packed
 * struct, so clang's BPF backend reads its fields a byte at a time and
 * shifts them together (8 loads and 14 ALU steps for the key); XDP's packet
 * loads may be unaligned (swml_slot.h, SWML_PAIR_ALIGN): this reads the field
 * at its offset as its plain type. */
#define SWML_HDR(h, f)                                                        \
	(*(const __typeof__(((struct swml_hdr *)0)->f) *)((const void *)(h) + \
							  __builtin_offsetof(struct swml_hdr, f)))

/* Is the frame addressed to this box (its MAC and IP), not flooded or routed
 * past it? */
static __always_inline int swml_to_us(const struct ethhdr *eth, const struct iphdr *ip)
{
	return ip->daddr == (__be32)SWML_SWITCH_IP &&
	       *(const __u32 *)eth->h_dest == (__u32)SWML_SWITCH_MAC_HI &&
	       *(const __u16 *)(eth->h_dest + 4) == (__u16)SWML_SWITCH_MAC_LO;
}

/* One frame of `len` bytes in (tx 0) or out (tx 1) of the box's port
 * `index` (struct swml_port_stats). */
static __always_inline void swml_port_count(u32 index, u64 len, int tx)
{
	u32 zero = 0;
	struct swml_port_stats *ps = port_stats.lookup(&zero);
	if (!ps)
		return;
	if (tx) {
		ps->tx_packets[index & (SWML_MAX_PORTS - 1)] += 1;
		ps->tx_bytes[index & (SWML_MAX_PORTS - 1)] += len;
	} else {
		ps->rx_packets[index & (SWML_MAX_PORTS - 1)] += 1;
		ps->rx_bytes[index & (SWML_MAX_PORTS - 1)] += len;
	}
}

/* A RESULT may leave by another port than its DATA came in on: a box of
 * several ports, or a rack box, whose parent's RESULTs come in on its uplink. */
#if SWML_PORTS > 1 || defined(SWML_UPLINK)
#define SWML_REDIRECTS 1
#endif

#ifdef SWML_REDIRECTS
/* ifindex -> its place in the box's port list, filled by the control plane.
 * A lookup, not a chain of compares compiled in: the verifier then knows a
 * place as one number below SWML_MAX_PORTS, not as a state per port carried
 * through the slot step (Debian 12's verifier, 6.1, ran out of its budget
 * so: tests/vm). */
BPF_HASH(port_places, u32, u32, SWML_MAX_PORTS);
#endif

#if defined(SWML_REDIRECTS) && !defined(SWML_FANOUT_UNICAST)
/* The box's ports, filled by the control plane, each with swml_port_filter
 * as its egress program: where a multicast RESULT goes on a box with several
 * ports. Not pinned: the program holds it, and a daemon that adopts the
 * data plane loads a program with its own. */
BPF_XDP_REDIRECT_MAP("devmap", struct bpf_devmap_val, result_ports, SWML_MAX_PORTS);

/* A completed RESULT (addressed to the job's group) out of every port of the
 * box that has a member of the job (BPF_F_BROADCAST, then swml_port_filter
 * on each copy): each port's segment carries the group to its own. */
static __always_inline int swml_to_every_port(void)
{
	return result_ports.redirect_map(0, BPF_F_BROADCAST);
}

/* A RESULT's copy on its way out of one port (a devmap egress program): sent
 * where a member of its job came in, else dropped. The frame is the switch
 * program's RESULT, its headers checked there; checked again for the
 * verifier. */
int swml_port_filter(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct swml_hdr *h = data + SWML_ETH_LEN + SWML_IP_LEN + SWML_UDP_LEN;

	if ((void *)(h + 1) > data_end)
		return XDP_DROP;
	u32 job_id = bpf_ntohs(SWML_HDR(h, job));
	struct swml_job *job = jobs.lookup(&job_id);
	u32 ifindex = ctx->egress_ifindex;
	u32 *place = port_places.lookup(&ifindex);
	if (!job || !place)
		return XDP_DROP;
	u32 port_index = *place & (SWML_MAX_PORTS - 1);
	if (!((job->port_mask >> port_index) & 1))
		return XDP_DROP;
	swml_port_count(port_index, data_end - data, 1);
	return XDP_PASS;
}
#endif

#ifdef SWML_FANOUT_UNICAST
/* Hand a completed RESULT (already rewritten, to the job's group) to the tc
 * fan-out: the mark goes in front of the frame, as XDP metadata, which the
 * stack keeps with the frame up to tc ingress. A driver without room for
 * metadata cannot take part: the RESULT is dropped and counted, and the
 * members get it as shadow replies to their retransmissions. */
static __always_inline int swml_to_fanout(struct xdp_md *ctx, u32 job_id)
{
	if (bpf_xdp_adjust_meta(ctx, -(int)sizeof(struct swml_fanout_meta)))
		return swml_drop(SWML_CNT_UNICAST_NO_META);
	struct swml_fanout_meta *meta = (void *)(long)ctx->data_meta;
	if ((void *)(meta + 1) > (void *)(long)ctx->data)
		return swml_drop(SWML_CNT_UNICAST_NO_META); /* for the verifier */
	meta->magic = SWML_FANOUT_META_MAGIC;
	meta->job = job_id;
	return XDP_PASS;
}
#endif

#ifdef SWML_UPLINK
/* A RESULT on its way down the tree (swml_tree.h): if it is the parent's
 * for one of our jobs (parent_routes: its source address and job id), its
 * XDP action; else -1, and the caller goes on as with any frame. Checked as
 * a member checks a RESULT (the uplink, the ports, the length, the parent
 * job's authenticator), then taken into the round's slot and sent on to
 * the members as the local job's RESULT, signed with the local result key:
 * multicast out of every port with a member, or through the unicast
 * fan-out. */
static __always_inline int swml_from_parent(struct xdp_md *ctx, struct ethhdr *eth,
					    struct iphdr *ip, struct udphdr *udp,
					    struct swml_hdr *h, void *data_end)
{
	struct swml_parent_route route = {.parent_ip = ip->saddr,
					  .parent_job = bpf_ntohs(SWML_HDR(h, job))};
	u32 *local = parent_routes.lookup(&route);
	if (!local)
		return -1;
	u32 job_id = *local;
	struct swml_job *job = jobs.lookup(&job_id);
	__s32 *payload = (void *)(h + 1);
	if (!job || !job->active || !job->up.ifindex || ctx->ingress_ifindex != job->up.ifindex ||
	    udp->source != job->up.parent_port || udp->dest != job->up.src_port ||
	    (ip->frag_off & bpf_htons(SWML_IP_FRAGMENT)) ||
	    SWML_HDR(h, count) != bpf_htons(SWML_K) || h->fmt == SWML_FMT_INT16 ||
	    (h->flags & SWML_FLAG_HEADER_ONLY) ||
	    swml_length_ok(ip, udp, payload, data_end, SWML_PAYLOAD_LEN) != SWML_CNT_RX)
		return swml_drop(SWML_CNT_BAD_PARENT);
	if ((void *)payload + SWML_PAYLOAD_LEN > data_end)
		return swml_drop(SWML_CNT_BAD_PARENT); /* for the verifier: checked above */
	if (SWML_HDR(h, key) !=
	    swml_result_auth(job->up.result_key, job->up.auth, h, SWML_PAYLOAD_LEN))
		return swml_drop(SWML_CNT_BAD_PARENT);
	u32 rel_slot = bpf_ntohs(SWML_HDR(h, slot));
	if (rel_slot >= job->slot_count)
		return swml_drop(SWML_CNT_BAD_PARENT);
	u32 slot_idx = job->slot_base + rel_slot;
	struct swml_slot *s = slots.lookup(&slot_idx);
	if (!s)
		return swml_drop(SWML_CNT_BAD_PARENT);
	u32 completer = 0;
	int outcome =
		swml_take_from_parent(s, h->flags & SWML_FLAG_SLOT_VER, bpf_ntohl(SWML_HDR(h, seq)),
				      job->world, payload, h->exp, h->flags, &completer);
	swml_count(outcome);
	if (outcome != SWML_CNT_FROM_PARENT)
		return XDP_DROP;
	swml_down_result(eth, ip, udp, h, job, job_id, completer, rel_slot & job->lane_mask);
	swml_sign(h, job, data_end, SWML_PAYLOAD_LEN);
#ifdef SWML_FANOUT_UNICAST
	return swml_to_fanout(ctx, job_id);
#else
	return swml_to_every_port();
#endif
}
#endif

int swml_switch(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = 0;
	struct udphdr *udp = 0;
	struct swml_hdr *h;
	__s32 *payload;

	/* 1. Is it ours? Anything we cannot attribute to our port goes to the
	 * stack, and so does what is not addressed to us (a bridge floods unknown
	 * unicast; the stack drops it as another host's). */
	switch (swml_parse_udp(data, data_end, bpf_htons(SWML_PORT), &ip, &udp)) {
	case SWML_PARSE_NOT_OURS:
		goto pass;
	case SWML_PARSE_IP_OPTIONS:
		swml_count(SWML_CNT_RX);
		return swml_drop(SWML_CNT_BAD_IP);
	}
#ifdef SWML_UPLINK
	h = (void *)(udp + 1);
	if ((void *)(h + 1) <= data_end &&
	    h->ver_type == ((SWML_VERSION << 4) | SWML_TYPE_RESULT)) {
		int action = swml_from_parent(ctx, eth, ip, udp, h, data_end);
		if (action >= 0)
			return action;
	}
#endif
	if (!swml_to_us(eth, ip)) {
		swml_count(SWML_CNT_OTHER_HOST);
		return XDP_PASS;
	}

	/* The port it came in on: its place in the box's port list. */
#if SWML_PORTS > 1
	u32 ifindex = ctx->ingress_ifindex;
	u32 *place = port_places.lookup(&ifindex);
	if (!place)
		goto pass; /* cannot happen: the program runs on the box's ports only */
	u32 port_index = *place & (SWML_MAX_PORTS - 1);
#else
	u32 port_index = 0;
#endif

	/* 2. Ours from here on: every outcome below is counted. */
	swml_count(SWML_CNT_RX);
	swml_port_count(port_index, data_end - data, 0);
	if (ip->frag_off & bpf_htons(SWML_IP_FRAGMENT))
		return swml_drop(SWML_CNT_BAD_IP);
	h = (void *)(udp + 1);
	if ((void *)(h + 1) > data_end)
		return swml_drop(SWML_CNT_TRUNCATED);
	if ((h->ver_type >> 4) != SWML_VERSION)
		return swml_drop(SWML_CNT_BAD_VERSION);
	if ((h->ver_type & 0x0f) != SWML_TYPE_DATA)
		return swml_drop(SWML_CNT_BAD_TYPE);
	if (SWML_HDR(h, count) != bpf_htons(SWML_K))
		return swml_drop(SWML_CNT_BAD_COUNT);
	payload = (void *)(h + 1);
	int fmt16 = h->fmt == SWML_FMT_INT16;
	int length_ok = fmt16 ? swml_length_ok(ip, udp, payload, data_end, SWML_PAYLOAD_LEN16)
			      : swml_length_ok(ip, udp, payload, data_end, SWML_PAYLOAD_LEN);
	if (length_ok != SWML_CNT_RX)
		return swml_drop(length_ok);

	u32 job_id = bpf_ntohs(SWML_HDR(h, job));
	struct swml_job *job = jobs.lookup(&job_id);
	if (!job || !job->active)
		return swml_drop(SWML_CNT_UNKNOWN_JOB);
	if (SWML_HDR(h, key) != job->key)
		return swml_drop(SWML_CNT_BAD_KEY);
	u32 rank = bpf_ntohs(SWML_HDR(h, rank));
	if (rank >= SWML_MAX_WORLD || !((job->rank_mask >> rank) & 1))
		return swml_drop(SWML_CNT_BAD_RANK);
	u32 member_idx = job_id * SWML_MAX_WORLD + rank;
	struct swml_member *m = members.lookup(&member_idx);
	u32 rel_slot = bpf_ntohs(SWML_HDR(h, slot));
	/* From the rank's address, and the port of the slot's lane (swml_maps.h):
	 * its port itself where the job has one lane. */
	__u16 lane = rel_slot & job->lane_mask;
	if (!m || m->ip != ip->saddr || udp->source != bpf_htons(bpf_ntohs(m->port) + lane))
		return swml_drop(SWML_CNT_BAD_SOURCE);
#ifdef SWML_REDIRECTS
	/* From the rank's own address: a member sits behind this port. Set
	 * before the packet reaches its slot, so that the round it completes
	 * (on whichever CPU) finds every member's port set; only when new (a
	 * store a packet would bounce the entry between CPUs); atomically, as
	 * another CPU may set another port's bit. */
	if (!((job->port_mask >> port_index) & 1))
		__sync_fetch_and_or(&job->port_mask, 1ULL << port_index);
#endif
	if (rel_slot >= job->slot_count)
		return swml_drop(SWML_CNT_BAD_SLOT);
	if (!swml_op_fmt_ok(h->op, h->fmt))
		return swml_drop(SWML_CNT_BAD_OP);
#ifdef SWML_UPLINK
	/* A 16-bit round's result is scaled at the box that completes it: a
	 * rack box cannot send its partial up so (docs/scale-out.md). */
	if (h->fmt == SWML_FMT_INT16 && job->up.ifindex)
		return swml_drop(SWML_CNT_BAD_OP);
#endif
	u32 slot_idx = job->slot_base + rel_slot;
	struct swml_slot *s = slots.lookup(&slot_idx);
	if (!s)
		return swml_drop(SWML_CNT_BAD_SLOT);

	/* 3./4. The slot, under its lock. */
	struct swml_contrib c = {
		.seq = bpf_ntohl(SWML_HDR(h, seq)),
		.tag = bpf_ntohl(SWML_HDR(h, tag)),
		.op = h->op,
		.flags = h->flags,
		.exp = h->exp,
	};
	struct swml_slot_result res = {};
	int disagreed = 0;
	int outcome;
	/* One call site a format, each with its fmt a constant: the compiler
	 * then keeps only that format's loops in it. */
	if (fmt16) {
		outcome = swml_step16(s, h, data_end, job->world, rank, &c, &res, &disagreed);
	} else if ((void *)payload + SWML_PAYLOAD_LEN > data_end) {
		/* Cannot happen (swml_length_ok checked it): the 32-bit steps' own
		 * bound, which Debian 12's verifier (6.1) needs to see on their
		 * path, not the int16 one's merged into it (tests/vm). */
		return swml_drop(SWML_CNT_TRUNCATED);
	} else if (h->fmt == SWML_FMT_OFFSET32) {
		c.fmt = SWML_FMT_OFFSET32;
		outcome = swml_slot_step(s, h->flags & SWML_FLAG_SLOT_VER, 1ULL << rank, job->world,
					 &c, payload, payload, SWML_K, &res, &disagreed);
	} else {
		outcome = swml_slot_step(s, h->flags & SWML_FLAG_SLOT_VER, 1ULL << rank, job->world,
					 &c, payload, payload, SWML_K, &res, &disagreed);
	}

	swml_count(outcome);
	if (disagreed)
		swml_count(SWML_CNT_DISAGREED);
	if (outcome == SWML_CNT_STALE || outcome == SWML_CNT_BUSY)
		return XDP_DROP;
	struct swml_job_stats *js = job_stats.lookup(&job_id);
	if (js) {
		js->packets += 1;
		js->bytes += data_end - data;
		js->results += outcome == SWML_CNT_COMPLETED;
		js->shadow_replies += outcome == SWML_CNT_SHADOW_REPLY;
	}
	/* What the rank has left of its call (swml_wire.h, "pace"), for the
	 * share loop: only on a box that shares (the control plane has set the
	 * job's rate), and only when said and changed: a store every packet
	 * would bounce the entry between CPUs for nobody. */
	const struct swml_job_pace *pace = job_pace.lookup(&job_id);
	u32 said = bpf_ntohs(SWML_HDR(h, pace));
	u32 *left = job_left.lookup(&job_id);
	if (pace && pace->rate && left && said && *left != said)
		*left = said;
#ifdef SWML_FANOUT_UNICAST
	/* The packet passed every check: its source MAC and the port it came in
	 * on are where the rank's unicast RESULTs go. Every rank of a round has
	 * sent one before the round completes, so the fan-out finds all of them
	 * learnt. Written only when they changed: a store a packet would bounce
	 * the entry between CPUs. */
	if (*(const __u32 *)m->mac != *(const __u32 *)eth->h_source ||
	    *(const __u16 *)(m->mac + 4) != *(const __u16 *)(eth->h_source + 4) ||
	    m->ifindex != ctx->ingress_ifindex) {
		m->ifindex = ctx->ingress_ifindex;
		m->port_index = port_index;
		__builtin_memcpy(m->mac, eth->h_source, ETH_ALEN);
	}
#endif
	if (outcome == SWML_CNT_AGGREGATED || outcome == SWML_CNT_DUP_DROPPED)
		return XDP_DROP;
#ifdef SWML_UPLINK
	if (job->up.ifindex && !(res.flags & SWML_SLOT_FINAL)) {
		/* Complete here, not yet answered from above: up to the parent. */
		int again = outcome == SWML_CNT_SHADOW_REPLY;
		if (!swml_up_now(s, res.flags, again, rank)) {
			swml_count(SWML_CNT_UP_HELD);
			return XDP_DROP;
		}
		swml_count(again ? SWML_CNT_RESENT_UP : SWML_CNT_SENT_UP);
		swml_up_data(eth, ip, udp, h, &job->up, &res, again);
		return bpf_redirect(job->up.ifindex, 0);
	}
	res.flags &= ~SWML_SLOT_FINAL;
#endif
	swml_make_result(eth, ip, udp, h, job, pace, outcome == SWML_CNT_SHADOW_REPLY, &res, lane);
	/* The format read again from the packet, not fmt16: with fmt16 kept
	 * live to here, Debian 12's kernel (6.1) refused the program, its
	 * verifier walking the int32 step's copy with an int16 frame's bound
	 * (tests/vm). Each sign call checks its own bound. */
	if (h->fmt == SWML_FMT_INT16)
		swml_sign(h, job, data_end, SWML_PAYLOAD_LEN16);
	else
		swml_sign(h, job, data_end, SWML_PAYLOAD_LEN);
#ifdef SWML_FANOUT_UNICAST
	if (outcome == SWML_CNT_COMPLETED)
		return swml_to_fanout(ctx, job_id);
#elif defined(SWML_REDIRECTS)
	if (outcome == SWML_CNT_COMPLETED)
		return swml_to_every_port();
#endif
	/* A shadow reply goes back the way its DATA came, and so does a
	 * one-port box's RESULT. */
	swml_port_count(port_index, data_end - data, 1);
	return XDP_TX;

pass:
	swml_count(SWML_CNT_PASSED);
	return XDP_PASS;
}
