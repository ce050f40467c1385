/* SPDX-License-Identifier: MIT */
/*
 * swml_slot.h - the per-slot step: what one contribution does to one version
 * of one aggregation slot (DESIGN.md "Data plane", 3 and 4). The one copy of
 * the algorithm, compiled by the XDP switch (xdp/swml_switch.c, BPF C through
 * bcc) and by the user-space baseline (switchml_xdp/switch/userspace_dp.c,
 * plain C through gcc), so that the baseline measures what XDP buys and
 * nothing else.
 *
 * The two keep their slots differently (a BPF map value with a spin lock; numpy
 * arrays), so the includer says how to reach them before including this file:
 *
 *   SWML_SLOT_T              how a slot is passed (a pointer, a small struct)
 *   SWML_SEEN(s, v)          lvalues of version v of slot s: __u64 rank bitmap,
 *   SWML_SEQ(s, v)             __u32 seq of its current round,
 *   SWML_COUNT(s, v)           __u32 contributions to it,
 *   SWML_TAG(s, v)             __u32 call tag, __u8 op,
 *   SWML_OP(s, v)
 *   SWML_EXP(s, v)             __s8 max exponent, __u8 OR of flags,
 *   SWML_FLAGS(s, v)
 *   SWML_VALS(s, v)          pointer to its k __s32 accumulators
 *   SWML_SLOT_LOCK(s)        optional: taken around the step (bpf_spin_lock)
 *   SWML_SLOT_UNLOCK(s)
 *
 * Types are the kernel's __u8..__u64 (linux/types.h in user space).
 */
#ifndef SWML_SLOT_H
#define SWML_SLOT_H

#include "swml_wire.h"

#ifndef __always_inline
#define __always_inline inline __attribute__((always_inline))
#endif
#ifndef SWML_SLOT_LOCK
#define SWML_SLOT_LOCK(s)
#define SWML_SLOT_UNLOCK(s)
#endif

/* One contribution, as its header gives it (host order). */
struct swml_contrib {
	__u32 seq;  /* its round */
	__u32 tag;  /* its call tag */
	__u8 op;    /* SWML_OP_*, checked < SWML_OP_NUM by the caller */
	__u8 flags; /* SWML_FLAG_*: NONFINITE is kept */
	__s8 exp;
};

/* The slot's answer to a contribution, when there is one (*res set). */
struct swml_slot_result {
	__u8 flags; /* version | OR of the round's NONFINITE | DISAGREE */
	__u8 op;    /* the round's op and tag */
	__s8 exp;   /* max exponent of the round */
	__u32 tag;
};

/* Combine k contributions into the accumulators: int32 sums wrap, as in two's
 * complement hardware (added as unsigned: in C a signed overflow is
 * undefined); MIN and MAX compare as signed. One loop a case: no branch on the
 * op inside the loop. */
static __always_inline void swml_combine(__s32 *acc, const __s32 *in, __u32 k, __u8 op)
{
	if (op == SWML_OP_SUM) {
		__u32 *a = (__u32 *)acc;
		const __u32 *b = (const __u32 *)in;

		for (__u32 i = 0; i < k; i++)
			a[i] += b[i];
	} else if (op == SWML_OP_MIN) {
		for (__u32 i = 0; i < k; i++)
			if (in[i] < acc[i])
				acc[i] = in[i];
	} else {
		for (__u32 i = 0; i < k; i++)
			if (in[i] > acc[i])
				acc[i] = in[i];
	}
}

/* Contribution `c` with payload `in` (k elements) of rank bit `bit` to version
 * `ver` of slot `s` in a job of `world` ranks (DESIGN.md "Data plane", 3, 4).
 * Returns the counter row of the outcome:
 *   SWML_CNT_AGGREGATED    added, the round is not complete
 *   SWML_CNT_COMPLETED     the last one: the result is in `out`, *res set
 *   SWML_CNT_SHADOW_REPLY  a retransmission to a complete round: likewise
 *   SWML_CNT_DUP_DROPPED   a retransmission to an incomplete round
 *   SWML_CNT_STALE         a round older than the version's current one
 * A contribution whose tag or op differs from its round's first is not
 * combined; it marks the round DISAGREE (*disagreed = 1), which every member
 * sees in the RESULT. A newer round replaces the version whatever its state:
 * an honest rank sends round r + 2 of a slot version only after the result of
 * round r + 1, hence after every rank had the result of round r.
 * `in` and `out` may be the same memory (the packet's payload, in XDP). The
 * result is copied under the lock: the read must not tear. */
static __always_inline int swml_slot_step(SWML_SLOT_T s, __u32 ver, __u64 bit, __u32 world,
					  const struct swml_contrib *c, const __s32 *in,
					  __s32 *out, __u32 k, struct swml_slot_result *res,
					  int *disagreed)
{
	int outcome;

	SWML_SLOT_LOCK(s);
	__u64 seen = SWML_SEEN(s, ver);
	__s32 age = (__s32)(c->seq - SWML_SEQ(s, ver));

	if (seen == 0 || age > 0) { /* empty, or a newer round: it starts here */
		__u32 *vals = (__u32 *)SWML_VALS(s, ver);
		const __u32 *src = (const __u32 *)in;

		for (__u32 i = 0; i < k; i++)
			vals[i] = src[i];
		SWML_SEEN(s, ver) = bit;
		SWML_SEQ(s, ver) = c->seq;
		SWML_COUNT(s, ver) = 1;
		SWML_TAG(s, ver) = c->tag;
		SWML_OP(s, ver) = c->op;
		SWML_EXP(s, ver) = c->exp;
		SWML_FLAGS(s, ver) = c->flags & SWML_FLAG_NONFINITE;
		outcome = world <= 1 ? SWML_CNT_COMPLETED : SWML_CNT_AGGREGATED;
	} else if (age < 0) {
		outcome = SWML_CNT_STALE;
	} else if (seen & bit) {
		outcome = SWML_COUNT(s, ver) >= world ? SWML_CNT_SHADOW_REPLY : SWML_CNT_DUP_DROPPED;
	} else {
		__u32 n = SWML_COUNT(s, ver) + 1;

		SWML_SEEN(s, ver) = seen | bit;
		SWML_COUNT(s, ver) = n;
		if (c->tag != SWML_TAG(s, ver) || c->op != SWML_OP(s, ver)) {
			SWML_FLAGS(s, ver) |= SWML_FLAG_DISAGREE;
			*disagreed = 1;
		} else {
			swml_combine(SWML_VALS(s, ver), in, k, c->op);
			if (c->exp > SWML_EXP(s, ver))
				SWML_EXP(s, ver) = c->exp;
			SWML_FLAGS(s, ver) |= c->flags & SWML_FLAG_NONFINITE;
		}
		outcome = n >= world ? SWML_CNT_COMPLETED : SWML_CNT_AGGREGATED;
	}
	if (outcome == SWML_CNT_COMPLETED || outcome == SWML_CNT_SHADOW_REPLY) {
		const __s32 *vals = SWML_VALS(s, ver);

		for (__u32 i = 0; i < k; i++)
			out[i] = vals[i];
		res->flags = ver | SWML_FLAGS(s, ver);
		res->exp = SWML_EXP(s, ver);
		res->op = SWML_OP(s, ver);
		res->tag = SWML_TAG(s, ver);
	}
	SWML_SLOT_UNLOCK(s);
	return outcome;
}

/* Turn the swml header of an answered DATA packet into its RESULT: the round's
 * op, tag and exponent; seq, slot, job and count stay; the key is not sent. */
static __always_inline void swml_result_hdr(struct swml_hdr *h, const struct swml_slot_result *res,
					    int shadow)
{
	h->ver_type = (SWML_VERSION << 4) | SWML_TYPE_RESULT;
	h->flags = res->flags | (shadow ? SWML_FLAG_SHADOW : 0);
	h->op = res->op;
	h->tag = bpf_htonl(res->tag);
	h->exp = res->exp;
	h->reserved0 = 0;
	h->reserved1 = 0;
	h->key = 0;
}

#endif /* SWML_SLOT_H */
