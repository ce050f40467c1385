/* SPDX-License-Identifier: MIT */
/*
 * swml_tree.h - a rack box's part in a tree of boxes (docs/scale-out.md, "A
 * tree of boxes"): the frame rewrites and the slot step that do not touch a
 * map (bcc rewrites map calls only in the main source: those stay in
 * swml_switch.c).
 *
 * A rack box's job with a parent (struct swml_uplink) completes a round
 * among its own members, then:
 *   - the completing DATA becomes the box's contribution to the parent's
 *     job (swml_up_data) and leaves by the uplink; the round's slot keeps
 *     the partial sum, so that a member's retransmission sends it up again;
 *   - the parent's RESULT comes in on the uplink, is written into the slot
 *     (swml_take_from_parent: the round is final from then on, its shadow
 *     the whole job's result) and goes on to the members, signed with the
 *     local job's result key.
 *
 * BPF C through bcc; include after swml_slot.h (struct swml_slot_result)
 * and the switch's SWML_SLOT_* accessors.
 */
#ifndef SWML_TREE_H
#define SWML_TREE_H

/* How long after the round's partial went up a member's retransmission does
 * not send it up again. The members of a round time out together: when one
 * member's DATA was lost, all of them resend, and those that come after the
 * late one completed the round would each send the partial up again, copies
 * on the uplink that the parent answers with as many shadow replies
 * (measured: a tenth more traffic on the uplink at 1% loss on the workers'
 * links, docs/scale-out.md). A quarter of the workers' shortest timeout
 * (SWML_RTO_MIN_US, worker/engine_policy.h): most of a wave of resends falls
 * inside it, and a partial or a RESULT really lost still goes up at the
 * wave's first resend (measured, 2 racks of 4 at 100 Mbit/s, 1% loss on
 * every link: no hold 1.26x the loss-free time, 0.25 ms 1.30x, 0.5 ms
 * 1.10-1.16x, 1 ms 1.15-1.22x, 4 ms 2.0x). */
#ifndef SWML_UP_HOLD_NS
#define SWML_UP_HOLD_NS 500000ULL
#endif

/* Whether a round's partial goes up now (noting when, if so): at its
 * completion always, for a retransmission only past the hold. The slot's
 * time is read and written outside its lock: two CPUs racing send it up
 * twice, as without the hold. */
static __always_inline int swml_up_now(SWML_SLOT_T s, __u32 ver, int again, __u32 rank)
{
	__u64 now = bpf_ktime_get_ns();

	if (again && now - s->up_ns[ver & 1] < SWML_UP_HOLD_NS)
		return 0;
	s->up_ns[ver & 1] = now;
	if (!again)
		s->up_rank[ver & 1] = rank;
	return 1;
}

/* Rewrite a DATA packet whose round is complete at this box (its payload is
 * already the round's partial sum, res its header) into the box's DATA to
 * the parent: from the uplink's addresses to the parent's, as the parent
 * job's member `up->rank`, with its key. `again`: a member's retransmission
 * brought it, so the parent may have had it (SWML_FLAG_RETRANS: a shadow
 * reply if its round is complete there). The round keeps its seq, slot,
 * version, op, tag, exponent and format (the block exponents already use the
 * whole job's world, so the parent adds the partials exactly as it would
 * add the members' packets); its owner is cleared, so that a parent fanning
 * out unicast sends the whole sum down (the owner is a rank behind this
 * box). */
static __always_inline void swml_up_data(struct ethhdr *eth, struct iphdr *ip, struct udphdr *udp,
					 struct swml_hdr *h, const struct swml_uplink *up,
					 const struct swml_slot_result *res, int again)
{
	__builtin_memcpy(eth->h_dest, up->parent_mac, ETH_ALEN);
	__builtin_memcpy(eth->h_source, up->src_mac, ETH_ALEN);
	ip->saddr = up->src_ip;
	ip->daddr = up->parent_ip;
	ip->ttl = 64;
	ip->check = swml_ipv4_csum(ip);
	udp->source = up->src_port;
	udp->dest = up->parent_port;
	udp->check = 0;
	h->ver_type = (SWML_VERSION << 4) | SWML_TYPE_DATA;
	h->flags = (res->flags & (SWML_FLAG_SLOT_VER | SWML_KEPT_FLAGS)) |
		   (again ? SWML_FLAG_RETRANS : 0);
	h->op = res->op;
	h->job = up->job;
	h->rank = up->rank;
	h->tag = bpf_htonl(res->tag);
	h->exp = res->exp;
	h->owner = 0;
	h->pace = 0;
	h->key = up->key;
}

/* The parent's RESULT of round `seq` into version `ver` of slot `s`, a round
 * complete among this box's `world` members. Returns:
 *   SWML_CNT_FROM_PARENT  taken: the slot holds the job's result, final
 *   SWML_CNT_PARENT_COPY  the round was final already, or is an older one
 *                         (a copy: a shadow reply crossing the multicast)
 *   SWML_CNT_BAD_PARENT   a round this box has not completed (the parent
 *                         cannot have answered it: not the parent's)
 *   SWML_CNT_BUSY         the slot's lock could not be had
 * Taken, *completer is the member whose DATA completed the round here. */
static __always_inline int swml_take_from_parent(SWML_SLOT_T s, __u32 ver, __u32 seq, __u32 world,
						 const __s32 *in, __s8 exp, __u8 flags,
						 __u32 *completer)
{
	int outcome;

	if (!SWML_SLOT_LOCK(s))
		return SWML_CNT_BUSY;
	__s32 age = (__s32)(seq - SWML_SEQ(s, ver));
	if (age < 0 || (age == 0 && (SWML_FLAGS(s, ver) & SWML_SLOT_FINAL))) {
		outcome = SWML_CNT_PARENT_COPY;
	} else if (age > 0 || SWML_SEEN(s, ver) == 0 || SWML_COUNT(s, ver) < world) {
		outcome = SWML_CNT_BAD_PARENT;
	} else {
		swml_copy(SWML_VALS(s, ver), in, SWML_K);
		SWML_EXP(s, ver) = exp;
		SWML_FLAGS(s, ver) = (flags & SWML_KEPT_FLAGS) | SWML_SLOT_FINAL;
		*completer = s->up_rank[ver & 1];
		outcome = SWML_CNT_FROM_PARENT;
	}
	SWML_SLOT_UNLOCK(s);
	return outcome;
}

/* Rewrite the parent's RESULT, its payload final, into the local job's: from
 * this box's rack address to the job's group, its job id this box's. Its
 * flags stay the round's version, kept flags and SHADOW (the parent answered
 * a resend: the round's RESULT was lost on its way to this box, a loss for
 * every member). Its rank names the member that completed the round, as a
 * one-box RESULT does (a worker's probe, client/retransmit.py, reads it):
 * where this box's partial completed the parent's round, the member that
 * completed it here (`completer`); else another rack's, which no member
 * here has. To the port of the slot's lane (swml_maps.h, lane_mask): the
 * parent's slot is this job's, so its lane is the members' too. Signed by
 * the caller. */
static __always_inline void swml_down_result(struct ethhdr *eth, struct iphdr *ip,
					     struct udphdr *udp, struct swml_hdr *h,
					     const struct swml_job *job, __u32 job_id,
					     __u32 completer, __u16 lane)
{
	__builtin_memcpy(eth->h_dest, job->group_mac, ETH_ALEN);
	*(__u32 *)eth->h_source = (__u32)SWML_SWITCH_MAC_HI;
	*(__u16 *)(eth->h_source + 4) = (__u16)SWML_SWITCH_MAC_LO;
	ip->saddr = (__be32)SWML_SWITCH_IP;
	ip->daddr = job->group_ip;
	ip->ttl = 64;
	ip->check = swml_ipv4_csum(ip);
	udp->source = bpf_htons(SWML_PORT);
	udp->dest = bpf_htons(bpf_ntohs(job->result_port) + lane);
	udp->check = 0;
	h->flags &= SWML_FLAG_SLOT_VER | SWML_KEPT_FLAGS | SWML_FLAG_SHADOW;
	h->job = bpf_htons(job_id);
	if (h->rank == job->up.rank)
		h->rank = bpf_htons(completer);
	h->pace = 0;
}

#endif /* SWML_TREE_H */
