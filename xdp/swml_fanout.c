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
 * goes whole to its owner only; the others get its header alone, flagged
 * SWML_FLAG_HEADER_ONLY and signed again. Frames without the mark are not
 * ours: TC_ACT_OK.
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

/* Re-address the frame to `rank` of the job (its learnt MAC, its IP and
 * port: where its shadow replies go) and send a clone out of `ifindex`.
 * *prev_ip is what the IP checksum covers now. */
static __always_inline void swml_copy_to(struct __sk_buff *skb, u32 job_id, u32 rank,
					 __be32 *prev_ip, u32 ifindex, u32 counted_as)
{
	u32 idx = job_id * SWML_MAX_WORLD + rank;
	struct swml_member *m = members.lookup(&idx);
	if (!m)
		return;
	/* A copy on the stack: the entry may change under us (a MAC learnt). */
	struct swml_member to = *m;
	if (!(*(__u32 *)to.mac | *(__u16 *)(to.mac + 4))) {
		swml_count(SWML_CNT_UNICAST_NO_MAC);
		return;
	}
	/* The UDP checksum is 0 (none: the switch program wrote the payload),
	 * so only the IP header's is updated. */
	bpf_skb_store_bytes(skb, 0, to.mac, ETH_ALEN, 0);
	bpf_l3_csum_replace(skb, SWML_IP_CSUM_OFF, *prev_ip, to.ip, sizeof(to.ip));
	bpf_skb_store_bytes(skb, SWML_IP_DADDR_OFF, &to.ip, sizeof(to.ip), 0);
	bpf_skb_store_bytes(skb, SWML_UDP_DEST_OFF, &to.port, sizeof(to.port), 0);
	*prev_ip = to.ip;
	if (bpf_clone_redirect(skb, ifindex, 0)) {
		swml_count(SWML_CNT_UNICAST_CLONE_FAILED);
		return;
	}
	swml_count(SWML_CNT_UNICAST_COPIES);
	if (counted_as != SWML_CNT_UNICAST_COPIES)
		swml_count(counted_as);
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

int swml_fanout(struct __sk_buff *skb)
{
	struct swml_fanout_meta *meta = (void *)(long)skb->data_meta;

	if ((void *)(meta + 1) > (void *)(long)skb->data || meta->magic != SWML_FANOUT_META_MAGIC)
		return TC_ACT_OK;
	u32 job_id = meta->job;
	struct swml_job *job = jobs.lookup(&job_id);
	if (!job || !job->active)
		return TC_ACT_SHOT; /* the job ended since the switch program saw it */
	u32 world = job->world;
	__be32 prev_ip = job->group_ip; /* what the IP checksum covers now */
	u32 ifindex = skb->ifindex;
	/* A round with an owner (a reduce_scatter's shard, swml_wire.h): the sum
	 * to the owner, the header alone to the others. */
	__u8 owner = 0;
	bpf_skb_load_bytes(skb, SWML_SWML_OFF + __builtin_offsetof(struct swml_hdr, owner), &owner,
			   sizeof(owner));
	u32 owner_rank = owner && owner <= world ? owner - 1 : SWML_MAX_WORLD;

	u32 counted_as = SWML_CNT_UNICAST_COPIES;
	if (owner_rank != SWML_MAX_WORLD) {
		swml_copy_to(skb, job_id, owner_rank, &prev_ip, ifindex, SWML_CNT_UNICAST_COPIES);
		if (swml_header_only(skb, job)) {
			swml_count(SWML_CNT_UNICAST_CLONE_FAILED);
			return TC_ACT_SHOT; /* the others recover by retransmission (shadow replies) */
		}
		counted_as = SWML_CNT_UNICAST_HEADER_ONLY;
	}
	for (u32 rank = 0; rank < SWML_MAX_WORLD; rank++) {
		if (rank >= world)
			break;
		if (rank != owner_rank)
			swml_copy_to(skb, job_id, rank, &prev_ip, ifindex, counted_as);
	}
	return TC_ACT_SHOT; /* the group-addressed original: every member had its copy */
}
