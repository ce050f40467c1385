/* SPDX-License-Identifier: MIT */
/*
 * swml_slot.h - the per-slot step: what one contribution does to one version
 * of one aggregation slot (docs/design.md, "Data plane", 3 and 4). The one copy of
 * the algorithm, compiled by the XDP switch (xdp/swml_switch.c, BPF C through
 * bcc) and by the user-space baseline (switchml_xdp/switch/userspace_dp.c,
 * plain C through gcc), so that the baseline measures what XDP buys and
 * nothing else.
 *
 * The two keep their slots differently (a BPF map value with a lock word; numpy
 * arrays), so the includer says how to reach them before including this file:
 *
 *   SWML_SLOT_T              how a slot is passed (a pointer, a small struct)
 *   SWML_SEEN(s, v)          lvalues of version v of slot s: __u64 rank bitmap,
 *   SWML_SEQ(s, v)             __u32 seq of its current round,
 *   SWML_COUNT(s, v)           __u32 contributions to it,
 *   SWML_TAG(s, v)             __u32 call tag, __u8 op,
 *   SWML_OP(s, v)              (op | fmt << 4: the round's op and payload format)
 *   SWML_EXP(s, v)             __s8 max exponent, __u8 OR of flags,
 *   SWML_FLAGS(s, v)
 *   SWML_VALS(s, v)          pointer to its k __s32 accumulators
 *   SWML_SLOT_LOCK(s)        optional: takes the slot's lock for the step; 0
 *   SWML_SLOT_UNLOCK(s)        when it cannot (the step then returns
 *                              SWML_CNT_BUSY and touches nothing)
 *   SWML_PAIR_ALIGN          optional: the alignment to declare for a u64 of
 *                            two int32 (see swml_pair_t), default 1
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
#define SWML_SLOT_LOCK(s) 1
#define SWML_SLOT_UNLOCK(s)
#endif

/* One contribution, as its header gives it (host order). */
struct swml_contrib {
	__u32 seq;  /* its round */
	__u32 tag;  /* its call tag */
	__u8 op;    /* SWML_OP_*, checked < SWML_OP_NUM by the caller */
	__u8 fmt;   /* SWML_FMT_*, checked by the caller (swml_op_fmt_ok) */
	__u8 flags; /* SWML_FLAG_*: SWML_KEPT_FLAGS are kept */
	__s8 exp;
};

/* A contribution's flags that its round keeps: an input was NaN/Inf; and,
 * from a rack box (a tree of boxes), its own members disagreed. */
#define SWML_KEPT_FLAGS (SWML_FLAG_NONFINITE | SWML_FLAG_DISAGREE)

/* The slot's answer to a contribution, when there is one (*res set). */
struct swml_slot_result {
	__u8 flags; /* version | OR of the round's NONFINITE | DISAGREE */
	__u8 op;    /* the round's op and tag */
	__s8 exp;   /* max exponent of the round */
	__u32 tag;
};

/* The int32 copies move two elements at a time, as one u64 (half the loads,
 * stores and loop steps of 32-bit ones: measured in docs/performance.md).
 * Only copies: adds stay 32-bit (swml_combine).
 * Memory may be less aligned than a u64: the XDP payload sits 2 bytes past a
 * 4-byte boundary (74 bytes of headers), the user-space data plane's arrays
 * are 4-byte aligned. The includer says what alignment to declare:
 * SWML_PAIR_ALIGN. By default 1, so that a C compiler emits loads valid at any
 * address. The XDP switch says 8: BPF loads of any alignment are allowed on
 * the machines XDP runs on (the verifier checks alignment only under strict
 * alignment), and clang's BPF backend would split a load it believes
 * misaligned into eight byte loads. may_alias: the same memory is also read
 * as __s32. */
#ifndef SWML_PAIR_ALIGN
#define SWML_PAIR_ALIGN 1
#endif
typedef __u64 __attribute__((aligned(SWML_PAIR_ALIGN), may_alias)) swml_pair_t;

#ifdef __clang__
#define SWML_UNROLL _Pragma("unroll 8")
#else
#define SWML_UNROLL _Pragma("GCC unroll 8")
#endif

/* dst[0..k) = src[0..k): k int32, a pair at a time. The two may be the same
 * memory (then it is a no-op), not otherwise overlap. */
static __always_inline void swml_copy(__s32 *dst, const __s32 *src, __u32 k)
{
	swml_pair_t *d = (swml_pair_t *)dst;
	const swml_pair_t *s = (const swml_pair_t *)src;

	SWML_UNROLL
	for (__u32 i = 0; i < k / 2; i++)
		d[i] = s[i];
	if (k & 1)
		dst[k - 1] = src[k - 1];
}

/* Combine k contributions into the accumulators: int32 sums wrap, as in two's
 * complement hardware (added as unsigned: in C a signed overflow is
 * undefined); MIN and MAX compare as signed. One loop a case: no branch on the
 * op inside the loop. 32-bit adds: two lanes of a u64 added at once (the
 * carry of the low lane kept out of the high one) cost more instructions a
 * pair than two 32-bit adds, and measured slower (docs/performance.md). */
static __always_inline void swml_combine(__s32 *acc, const __s32 *in, __u32 k, __u8 op)
{
	if (op == SWML_OP_SUM) {
		__u32 *a = (__u32 *)acc;
		const __u32 *b = (const __u32 *)in;

		SWML_UNROLL
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

/* SWML_FMT_OFFSET32 sums: two elements at a time, as one u64 add. The
 * senders' offset (swml_wire.h) keeps every partial sum of an element below
 * 2^32, so the low element never carries into the high one: the u64 add is
 * two exact uint32 adds, with half the loads, adds and stores of
 * swml_combine's SUM (docs/performance.md, "Offset binary"). */
static __always_inline void swml_add_pairs(__s32 *acc, const __s32 *in, __u32 k)
{
	swml_pair_t *a = (swml_pair_t *)acc;
	const swml_pair_t *b = (const swml_pair_t *)in;

	SWML_UNROLL
	for (__u32 i = 0; i < k / 2; i++)
		a[i] += b[i];
	if (k & 1)
		acc[k - 1] = (__s32)((__u32)acc[k - 1] + (__u32)in[k - 1]);
}

/* Which op goes with which payload format: int32 takes every op; the
 * 16-bit and offset formats are quantized sums, SUM only. */
static __always_inline int swml_op_fmt_ok(__u8 op, __u8 fmt)
{
	if (op >= SWML_OP_NUM || fmt >= SWML_FMT_NUM)
		return 0;
	return fmt == SWML_FMT_INT32 || op == SWML_OP_SUM;
}

/* The 16-bit format (SWML_FMT_INT16): int16 contributions sign-extended into
 * the int32 accumulators; the result is the sum scaled back into 16 bits by
 * the job's L = ceil(log2(world)), rounded half up (docs/quantization.md, "The
 * 16-bit format"). Kept apart from the int32 path, which they do not slow. */
static __always_inline __u32 swml_world_bits(__u32 world)
{
	/* ceil(log2(world)) for world <= SWML_MAX_WORLD = 64, without a loop */
	return (world > 1) + (world > 2) + (world > 4) + (world > 8) + (world > 16) + (world > 32);
}

static __always_inline void swml_load16(__s32 *vals, const __s16 *in, __u32 k)
{
	for (__u32 i = 0; i < k; i++)
		vals[i] = in[i];
}

static __always_inline void swml_add16(__s32 *acc, const __s16 *in, __u32 k)
{
	__u32 *a = (__u32 *)acc; /* wraps like the int32 SUM; cannot for world <= 2^16 */

	for (__u32 i = 0; i < k; i++)
		a[i] += (__u32)(__s32)in[i];
}

static __always_inline void swml_store16(__s16 *out, const __s32 *vals, __u32 k, __u32 world)
{
	__u32 shift = swml_world_bits(world);
	__s32 half = shift ? 1 << (shift - 1) : 0;

	for (__u32 i = 0; i < k; i++)
		out[i] = (__s16)((vals[i] + half) >> shift);
}

/* Contribution `c` with payload `in` (k elements) of rank bit `bit` to version
 * `ver` of slot `s` in a job of `world` ranks (docs/design.md, "Data plane", 3 and 4).
 * Returns the counter row of the outcome:
 *   SWML_CNT_AGGREGATED    added, the round is not complete
 *   SWML_CNT_COMPLETED     the last one: the result is in `out`, *res set
 *   SWML_CNT_SHADOW_REPLY  a retransmission to a complete round: likewise
 *   SWML_CNT_DUP_DROPPED   a retransmission to an incomplete round
 *   SWML_CNT_STALE         a round older than the version's current one
 *   SWML_CNT_BUSY          the slot's lock could not be had (nothing done)
 * A contribution whose tag or op differs from its round's first is not
 * combined; it marks the round DISAGREE (*disagreed = 1), which every member
 * sees in the RESULT. A newer round replaces the version whatever its state:
 * an honest rank sends round r + 2 of a slot version only after the result of
 * round r + 1, hence after every rank had the result of round r.
 * `in` and `out` may be the same memory (the packet's payload, in XDP), k
 * elements of c->fmt each (int32, or int16: the answer is in the packet's
 * format; a round of another fmt than the packet's answers DISAGREE). The
 * result is copied under the lock: the read must not tear. */
static __always_inline int swml_slot_step(SWML_SLOT_T s, __u32 ver, __u64 bit, __u32 world,
					  const struct swml_contrib *c, const void *in, void *out,
					  __u32 k, struct swml_slot_result *res, int *disagreed)
{
	int outcome;
	__u8 op_fmt = c->op | (c->fmt << 4);

	if (!SWML_SLOT_LOCK(s))
		return SWML_CNT_BUSY;
	__u64 seen = SWML_SEEN(s, ver);
	__s32 age = (__s32)(c->seq - SWML_SEQ(s, ver));

	if (seen == 0 || age > 0) { /* empty, or a newer round: it starts here */
		if (c->fmt == SWML_FMT_INT16)
			swml_load16(SWML_VALS(s, ver), in, k);
		else
			swml_copy(SWML_VALS(s, ver), in, k);
		SWML_SEEN(s, ver) = bit;
		SWML_SEQ(s, ver) = c->seq;
		SWML_COUNT(s, ver) = 1;
		SWML_TAG(s, ver) = c->tag;
		SWML_OP(s, ver) = op_fmt;
		SWML_EXP(s, ver) = c->exp;
		SWML_FLAGS(s, ver) = c->flags & SWML_KEPT_FLAGS;
		outcome = world <= 1 ? SWML_CNT_COMPLETED : SWML_CNT_AGGREGATED;
	} else if (age < 0) {
		outcome = SWML_CNT_STALE;
	} else if (seen & bit) {
		outcome =
			SWML_COUNT(s, ver) >= world ? SWML_CNT_SHADOW_REPLY : SWML_CNT_DUP_DROPPED;
	} else {
		__u32 n = SWML_COUNT(s, ver) + 1;

		SWML_SEEN(s, ver) = seen | bit;
		SWML_COUNT(s, ver) = n;
		if (c->tag != SWML_TAG(s, ver) || op_fmt != SWML_OP(s, ver)) {
			SWML_FLAGS(s, ver) |= SWML_FLAG_DISAGREE;
			*disagreed = 1;
		} else if (c->fmt == SWML_FMT_INT16) {
			swml_add16(SWML_VALS(s, ver), in, k);
			if (c->exp > SWML_EXP(s, ver))
				SWML_EXP(s, ver) = c->exp;
			SWML_FLAGS(s, ver) |= c->flags & SWML_KEPT_FLAGS;
		} else {
			if (c->fmt == SWML_FMT_OFFSET32)
				swml_add_pairs(SWML_VALS(s, ver), in, k);
			else
				swml_combine(SWML_VALS(s, ver), in, k, c->op);
			if (c->exp > SWML_EXP(s, ver))
				SWML_EXP(s, ver) = c->exp;
			SWML_FLAGS(s, ver) |= c->flags & SWML_KEPT_FLAGS;
		}
		outcome = n >= world ? SWML_CNT_COMPLETED : SWML_CNT_AGGREGATED;
	}
	if (outcome == SWML_CNT_COMPLETED || outcome == SWML_CNT_SHADOW_REPLY) {
		if (c->fmt == SWML_FMT_INT16)
			swml_store16(out, SWML_VALS(s, ver), k, world);
		else
			swml_copy(out, SWML_VALS(s, ver), k);
		res->flags = ver | SWML_FLAGS(s, ver);
		if ((SWML_OP(s, ver) >> 4) != c->fmt) /* a shadow reply in another format */
			res->flags |= SWML_FLAG_DISAGREE;
		res->exp = SWML_EXP(s, ver);
		res->op = SWML_OP(s, ver) & 0x0f;
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
	/* owner stays the DATA's: every contribution to the round carries the
	 * same (its call's shard layout, which the tag covers) */
	h->pace = 0;
	h->key = 0;
}

#endif /* SWML_SLOT_H */
