/* SPDX-License-Identifier: MIT */
/*
 * swml_fanout.c - --fanout unicast: a tc (clsact ingress) program beside the
 * switch's XDP program, for networks that carry no multicast (cloud VPCs).
 *
 * XDP cannot clone a frame, so the switch program (swml_switch.c, built with
 * SWML_FANOUT_UNICAST) hands a completed RESULT, addressed to the job's group,
 * up to the stack with XDP_PASS and a mark in its metadata (struct
 * swml_fanout_meta). Here, for each member of the job, the frame is
 * re-addressed to that member (its learnt MAC, its IP and port: where its
 * shadow replies go) and a clone is sent out of the same interface
 * (bpf_clone_redirect to egress, through the normal transmit path); then the
 * original is dropped. A round with an `owner` (a reduce_scatter's shard)
 * goes whole to its owner only; then every member gets its header alone,
 * flagged SWML_FLAG_HEADER_ONLY and signed again. Frames without the mark are not
 * ours: TC_ACT_OK.
 *
 * Members go SWML_FANOUT_CHUNK at a time: the entry program copies to the
 * first chunk, then swml_fanout_more copies to the next and tail-calls
 * itself (through fanout_next, which the control plane fills) until every
 * member has its copy. One unrolled loop over 64 members forked more states
 * than Debian 12's verifier (6.1) explores ("the sequence of 8193 jumps is
 * too complex"; tests/vm), and bcc cannot build a bpf_loop callback.
 *
 * Compiled with the switch program's defines, so that it opens the same
 * pinned maps (swml_tables.h).
 */
#include <uapi/linux/bpf.h>
#include <uapi/linux/if_ether.h>
#include <uapi/linux/ip.h>
#include <uapi/linux/udp.h>
#include <uapi/linux/pkt_cls.h>

#include "swml_wire.h"
#include "swml_maps.h"
#include "swml_tables.h"
#include "swml_auth.h"

#ifndef SWML_FANOUT_CHUNK
#define SWML_FANOUT_CHUNK 16 /* members one program copies to (tests set fewer) */
#endif
#define SWML_FANOUT_NEXT_AT 0 /* skb->cb[] words: the next chunk's first rank, */
#define SWML_FANOUT_JOB_AT 1  /* and its job (the frame's metadata may not last) */

/* [0]: swml_fanout_more, which goes on with the next chunk of members. */
BPF_PROG_ARRAY(fanout_next, 1);

static __always_inline void swml_count(u32 reason)
{
	u64 *c = counters.lookup(&reason);
	if (c)
		*c += 1;
}

/* Offsets in the RESULT frame: the switch program wrote it, without IP options. */
#define SWML_IP_OFF SWML_ETH_LEN
#define SWML_IP_CSUM_OFF (SWML_IP_OFF + __builtin_offsetof(struct iphdr, check))
#define SWML_IP_TOT_LEN_OFF (SWML_IP_OFF + __builtin_offsetof(struct iphdr, tot_len))
#define SWML_IP_DADDR_OFF (SWML_IP_OFF + __builtin_offsetof(struct iphdr, daddr))
#define SWML_UDP_OFF (SWML_IP_OFF + SWML_IP_LEN)
#define SWML_UDP_DEST_OFF (SWML_UDP_OFF + __builtin_offsetof(struct udphdr, dest))
#define SWML_UDP_LEN_OFF (SWML_UDP_OFF + __builtin_offsetof(struct udphdr, len))
#define SWML_SWML_OFF (SWML_UDP_OFF + SWML_UDP_LEN)

/* This CPU's per-port counters (swml_maps.h); NULL if the map has no row. */
static __always_inline struct swml_port_stats *swml_port_stats(void)
{
	u32 zero = 0;
	return port_stats.lookup(&zero);
}

/* What swml_copy_to did: counted once a RESULT, after its loop (a counter
 * update each copy would add branches that a 64-rank loop multiplies past
 * what Debian 12's verifier (6.1) explores: tests/vm). */
struct swml_copies {
	u32 sent, no_mac, failed;
};

/* Re-address the frame to `rank` of the job (its learnt MAC, its IP and
 * port: where its shadow replies go) and send a clone out of the box's port
 * its DATA comes in on (learnt with the MAC), counted in `ps`.
 * *prev_ip is what the IP checksum covers now. */
static __always_inline void swml_copy_to(struct __sk_buff *skb, u32 job_id, u32 rank, __u16 lane,
					 __be32 *prev_ip, struct swml_port_stats *ps,
					 struct swml_copies *n)
{
	u32 idx = job_id * SWML_MAX_WORLD + rank;
	struct swml_member *m = members.lookup(&idx);
	if (!m)
		return;
	/* A copy on the stack: the entry may change under us (a MAC learnt). */
	struct swml_member to = *m;
	if (!(*(__u32 *)to.mac | *(__u16 *)(to.mac + 4))) {
		n->no_mac++;
		return;
	}
	/* The UDP checksum is 0 (none: the switch program wrote the payload),
	 * so only the IP header's is updated. */
	bpf_skb_store_bytes(skb, 0, to.mac, ETH_ALEN, 0);
	bpf_l3_csum_replace(skb, SWML_IP_CSUM_OFF, *prev_ip, to.ip, sizeof(to.ip));
	bpf_skb_store_bytes(skb, SWML_IP_DADDR_OFF, &to.ip, sizeof(to.ip), 0);
	/* the port of the round's lane (swml_maps.h, lane_mask) */
	to.port = bpf_htons(bpf_ntohs(to.port) + lane);
	bpf_skb_store_bytes(skb, SWML_UDP_DEST_OFF, &to.port, sizeof(to.port), 0);
	*prev_ip = to.ip;
	/* 0 or a negative errno: its sign bit, shifted down, is the failure
	 * (no branch: see struct swml_copies) */
	u32 failed = (u64)bpf_clone_redirect(skb, to.ifindex, 0) >> 63;
	n->failed += failed;
	n->sent += 1 - failed;
	/* out of the port the rank's DATA comes in on */
	ps->tx_packets[to.port_index & (SWML_MAX_PORTS - 1)] += 1 - failed;
	ps->tx_bytes[to.port_index & (SWML_MAX_PORTS - 1)] += (1 - failed) * skb->len;
}

/* Add n (no branch on it: the verifier would then tell apart every count a
 * loop can reach, and the states would not prune). */
static __always_inline void swml_count_n(u32 reason, u32 n)
{
	u64 *c = counters.lookup(&reason);
	if (c)
		*c += n;
}

/* Cut the RESULT down to its headers, flagged SWML_FLAG_HEADER_ONLY and
 * signed again over the header alone (swml_wire.h): what the members that do
 * not keep the round's sum get. 0, or -1 if the kernel refused. */
static __always_inline int swml_header_only(struct __sk_buff *skb, const struct swml_job *job)
{
	struct swml_hdr h;
	__be16 old_len, new_ip_len = bpf_htons(SWML_HEADERS_LEN - SWML_ETH_LEN),
			new_udp_len = bpf_htons(SWML_UDP_LEN + SWML_HDR_LEN);

	if (bpf_skb_load_bytes(skb, SWML_IP_TOT_LEN_OFF, &old_len, sizeof(old_len)) ||
	    bpf_skb_load_bytes(skb, SWML_SWML_OFF, &h, sizeof(h)) ||
	    bpf_skb_change_tail(skb, SWML_HEADERS_LEN, 0))
		return -1;
	bpf_l3_csum_replace(skb, SWML_IP_CSUM_OFF, old_len, new_ip_len, sizeof(old_len));
	bpf_skb_store_bytes(skb, SWML_IP_TOT_LEN_OFF, &new_ip_len, sizeof(new_ip_len), 0);
	bpf_skb_store_bytes(skb, SWML_UDP_LEN_OFF, &new_udp_len, sizeof(new_udp_len), 0);
	h.flags |= SWML_FLAG_HEADER_ONLY;
	h.key = swml_result_auth(job->result_key, SWML_AUTH_HEADER, &h, 0);
	return bpf_skb_store_bytes(skb, SWML_SWML_OFF, &h, sizeof(h), 0) ? -1 : 0;
}

/* The lane of the RESULT's slot (swml_maps.h, lane_mask): its copies go to
 * each member's port + lane. 0 if the header cannot be read. */
static __always_inline __u16 swml_result_lane(struct __sk_buff *skb, const struct swml_job *job)
{
	__be16 slot = 0;

	bpf_skb_load_bytes(skb, SWML_SWML_OFF + __builtin_offsetof(struct swml_hdr, slot), &slot,
			   sizeof(slot));
	return bpf_ntohs(slot) & job->lane_mask;
}

/* Copy the frame as it is to members first .. first + SWML_FANOUT_CHUNK - 1
 * of the job, then hand the rest to swml_fanout_more. The copies count as
 * header-only ones when the frame is (swml_header_only). */
static __always_inline int swml_fanout_chunk(struct __sk_buff *skb, const struct swml_job *job,
					     u32 job_id, u32 first)
{
	struct swml_copies n = {};
	struct swml_port_stats *ps = swml_port_stats();
	__be32 prev_ip = 0; /* what the IP checksum covers now: the frame's destination */
	__u8 flags = 0;
	/* The job's ranks at this box are rank_mask's bits below rank_end: all
	 * of 0..world-1 on a box of its own, spread over 0..63 in a tree (a
	 * rack box's members keep their ranks in the whole job; a parent's
	 * children are ranked by their lowest). */
	u32 world = job->rank_end;
	__u64 ranks = job->rank_mask;
	__u16 lane = swml_result_lane(skb, job);

	if (!ps || first >= world || first >= SWML_MAX_WORLD ||
	    bpf_skb_load_bytes(skb, SWML_IP_DADDR_OFF, &prev_ip, sizeof(prev_ip)) ||
	    bpf_skb_load_bytes(skb, SWML_SWML_OFF + __builtin_offsetof(struct swml_hdr, flags),
			       &flags, sizeof(flags)))
		return TC_ACT_SHOT;
#pragma unroll
	for (u32 i = 0; i < SWML_FANOUT_CHUNK; i++) {
		if (first + i >= world)
			break;
		if ((ranks >> ((first + i) & (SWML_MAX_WORLD - 1))) & 1)
			swml_copy_to(skb, job_id, first + i, lane, &prev_ip, ps, &n);
	}
	swml_count_n(SWML_CNT_UNICAST_COPIES, n.sent);
	swml_count_n(SWML_CNT_UNICAST_HEADER_ONLY, flags & SWML_FLAG_HEADER_ONLY ? n.sent : 0);
	swml_count_n(SWML_CNT_UNICAST_NO_MAC, n.no_mac);
	swml_count_n(SWML_CNT_UNICAST_CLONE_FAILED, n.failed);
	if (first + SWML_FANOUT_CHUNK < world) {
		skb->cb[SWML_FANOUT_NEXT_AT] = first + SWML_FANOUT_CHUNK;
		skb->cb[SWML_FANOUT_JOB_AT] = job_id;
		fanout_next.call(skb, 0);
		/* Only if the tail call failed: the rest get no copy (they recover
		 * by retransmission); counted as a refused copy. */
		swml_count(SWML_CNT_UNICAST_CLONE_FAILED);
	}
	return TC_ACT_SHOT; /* the group-addressed original: every member had its copy */
}

int swml_fanout(struct __sk_buff *skb)
{
	struct swml_fanout_meta *meta = (void *)(long)skb->data_meta;

	if ((void *)(meta + 1) > (void *)(long)skb->data || meta->magic != SWML_FANOUT_META_MAGIC)
		return TC_ACT_OK;
	u32 job_id = meta->job;
	struct swml_job *job = jobs.lookup(&job_id);
	if (!job || !job->active)
		return TC_ACT_SHOT; /* the job ended since the switch program saw it */
	/* A round with an owner (a reduce_scatter's shard, swml_wire.h): the sum
	 * to the owner, then the header alone to every member (the owner too: it
	 * drops it as a duplicate; skipping it would add to each turn a compare
	 * with a rank read from the packet, which the verifier cannot prune). */
	__u8 owner = 0;
	bpf_skb_load_bytes(skb, SWML_SWML_OFF + __builtin_offsetof(struct swml_hdr, owner), &owner,
			   sizeof(owner));
	if (owner && owner <= job->rank_end) {
		struct swml_copies whole = {};
		struct swml_port_stats *ps = swml_port_stats();
		__be32 prev_ip = job->group_ip;

		if (!ps)
			return TC_ACT_SHOT; /* cannot happen: an array's row 0 */
		swml_copy_to(skb, job_id, owner - 1, swml_result_lane(skb, job), &prev_ip, ps,
			     &whole);
		swml_count_n(SWML_CNT_UNICAST_COPIES, whole.sent);
		swml_count_n(SWML_CNT_UNICAST_NO_MAC, whole.no_mac);
		swml_count_n(SWML_CNT_UNICAST_CLONE_FAILED, whole.failed);
		if (swml_header_only(skb, job)) {
			swml_count(SWML_CNT_UNICAST_CLONE_FAILED);
			return TC_ACT_SHOT; /* the others recover by retransmission (shadow replies) */
		}
	}
	return swml_fanout_chunk(skb, job, job_id, 0);
}

/* The next chunk of members: skb->cb[] says which, of which job. Reached
 * only by swml_fanout_chunk's tail call, never from the network. */
int swml_fanout_more(struct __sk_buff *skb)
{
	u32 job_id = skb->cb[SWML_FANOUT_JOB_AT];
	struct swml_job *job = jobs.lookup(&job_id);
	if (!job || !job->active)
		return TC_ACT_SHOT;
	return swml_fanout_chunk(skb, job, job_id, skb->cb[SWML_FANOUT_NEXT_AT]);
}
