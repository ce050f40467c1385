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
 * original is dropped. Frames without the mark are not ours: TC_ACT_OK.
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

static __always_inline void swml_count(u32 reason)
{
	u64 *c = counters.lookup(&reason);
	if (c)
		*c += 1;
}

/* Offsets in the RESULT frame: the switch program wrote it, without IP options. */
#define SWML_IP_CSUM_OFF (SWML_ETH_LEN + __builtin_offsetof(struct iphdr, check))
#define SWML_IP_DADDR_OFF (SWML_ETH_LEN + __builtin_offsetof(struct iphdr, daddr))
#define SWML_UDP_DEST_OFF (SWML_ETH_LEN + SWML_IP_LEN + __builtin_offsetof(struct udphdr, dest))

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

	for (u32 rank = 0; rank < SWML_MAX_WORLD; rank++) {
		if (rank >= world)
			break;
		u32 idx = job_id * SWML_MAX_WORLD + rank;
		struct swml_member *m = members.lookup(&idx);
		if (!m)
			break;
		/* A copy on the stack: the entry may change under us (a MAC learnt). */
		struct swml_member to = *m;
		if (!(*(__u32 *)to.mac | *(__u16 *)(to.mac + 4))) {
			swml_count(SWML_CNT_UNICAST_NO_MAC);
			continue;
		}
		/* The UDP checksum is 0 (none: the switch program wrote the payload),
		 * so only the IP header's is updated. */
		bpf_skb_store_bytes(skb, 0, to.mac, ETH_ALEN, 0);
		bpf_l3_csum_replace(skb, SWML_IP_CSUM_OFF, prev_ip, to.ip, sizeof(to.ip));
		bpf_skb_store_bytes(skb, SWML_IP_DADDR_OFF, &to.ip, sizeof(to.ip), 0);
		bpf_skb_store_bytes(skb, SWML_UDP_DEST_OFF, &to.port, sizeof(to.port), 0);
		prev_ip = to.ip;
		swml_count(bpf_clone_redirect(skb, ifindex, 0) ? SWML_CNT_UNICAST_CLONE_FAILED
							       : SWML_CNT_UNICAST_COPIES);
	}
	return TC_ACT_SHOT; /* the group-addressed original: every member had its copy */
}
