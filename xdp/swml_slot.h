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
 *   SWML_COUNT(s, v)           __u32 contributions so far (modulo world),
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

/* The slot's answer to a contribution, when there is one (*res_* set). */
struct swml_slot_result {
	__u8 flags; /* version | OR of the round's NONFINITE */
	__s8 exp;   /* max exponent of the round */
};

/* Contribution `in` (k elements) of rank bit `bit`, with the header's `exp`
 * and `flags`, to version `ver` of slot `s` in a job of `world` ranks.
 * Returns the counter row of the outcome:
 *   SWML_CNT_AGGREGATED    added, the round is not complete
 *   SWML_CNT_COMPLETED     the last one: the result is in `out`, *res set
 *   SWML_CNT_SHADOW_REPLY  a retransmission to a complete round: likewise
 *   SWML_CNT_DUP_DROPPED   a retransmission to an incomplete round
 * `in` and `out` may be the same memory (the packet's payload, in XDP). The
 * result is copied under the lock: the read must not tear. */
static __always_inline int swml_slot_step(SWML_SLOT_T s, __u32 ver, __u64 bit, __u32 world,
					  __s8 exp, __u8 flags, const __s32 *in, __s32 *out,
					  __u32 k, struct swml_slot_result *res)
{
	/* int32 sums wrap, as in two's complement hardware: add as unsigned (in
	 * C a signed overflow is undefined). */
	__u32 *vals = (__u32 *)SWML_VALS(s, ver);
	const __u32 *add = (const __u32 *)in;
	int outcome;

	SWML_SLOT_LOCK(s);
	if (!(SWML_SEEN(s, ver) & bit)) {
		__u32 c = SWML_COUNT(s, ver);

		SWML_SEEN(s, ver) |= bit;
		SWML_SEEN(s, ver ^ 1) &= ~bit;
		if (c == 0) { /* first contribution of the round overwrites */
			for (__u32 i = 0; i < k; i++)
				vals[i] = add[i];
			SWML_EXP(s, ver) = exp;
			SWML_FLAGS(s, ver) = flags & SWML_FLAG_NONFINITE;
		} else {
			for (__u32 i = 0; i < k; i++)
				vals[i] += add[i];
			if (exp > SWML_EXP(s, ver))
				SWML_EXP(s, ver) = exp;
			SWML_FLAGS(s, ver) |= flags & SWML_FLAG_NONFINITE;
		}
		c += 1;
		if (c >= world)
			c = 0;
		SWML_COUNT(s, ver) = c;
		outcome = c == 0 ? SWML_CNT_COMPLETED : SWML_CNT_AGGREGATED;
	} else {
		outcome = SWML_COUNT(s, ver) == 0 ? SWML_CNT_SHADOW_REPLY : SWML_CNT_DUP_DROPPED;
	}
	if (outcome == SWML_CNT_COMPLETED || outcome == SWML_CNT_SHADOW_REPLY) {
		for (__u32 i = 0; i < k; i++)
			out[i] = (__s32)vals[i];
		res->flags = ver | SWML_FLAGS(s, ver);
		res->exp = SWML_EXP(s, ver);
	}
	SWML_SLOT_UNLOCK(s);
	return outcome;
}

/* Turn the swml header of an answered DATA packet into its RESULT. */
static __always_inline void swml_result_hdr(struct swml_hdr *h, const struct swml_slot_result *res,
					    int shadow)
{
	h->ver_type = (SWML_VERSION << 4) | SWML_TYPE_RESULT;
	h->flags = res->flags | (shadow ? SWML_FLAG_SHADOW : 0);
	h->exp = res->exp;
	h->reserved = 0;
}

#endif /* SWML_SLOT_H */
