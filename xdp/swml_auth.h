/* SPDX-License-Identifier: MIT */
/*
 * swml_auth.h - the RESULT authenticator (swml_wire.h, "RESULT
 * authenticator"): SipHash, keyed by the job's result key, over a RESULT's
 * header bytes before `key` and, with SWML_AUTH_FULL, its payload.
 *
 * The one copy of the algorithm, compiled by the XDP switch (BPF C through
 * bcc), the user-space data plane and the worker engine (plain C through
 * gcc): the switch writes the tag, the workers check it. SipHash (Aumasson
 * and Bernstein, 2012) is a keyed function made for short inputs: a few
 * 64-bit adds, xors and rotations a word, which the BPF JIT runs as they are.
 *
 * Messages are read as little-endian 64-bit words (SipHash's definition);
 * every machine this runs on is little-endian, so a word is one plain load.
 * Types are the kernel's __u8..__u64 (linux/types.h in user space).
 */
#ifndef SWML_AUTH_H
#define SWML_AUTH_H

#include "swml_wire.h"

#ifndef __always_inline
#define __always_inline inline __attribute__((always_inline))
#endif

/* Message words may sit at any address (a RESULT's header is 2 bytes past a
 * 4-byte boundary in its frame). A plain C compiler is told so (alignment 1,
 * which x86 loads as one word anyway); the XDP switch says 8, as for
 * swml_slot.h's SWML_PAIR_ALIGN, or clang's BPF backend would load each word
 * a byte at a time. */
#ifndef SWML_AUTH_ALIGN
#define SWML_AUTH_ALIGN 1
#endif
typedef __u64 __attribute__((aligned(SWML_AUTH_ALIGN), may_alias)) swml_sip_word_t;

/* The short fixed loops (rounds, header words, tail bytes) unrolled, by
 * either compiler. */
#ifdef __clang__
#define SWML_SIP_UNROLL _Pragma("unroll")
#else
#define SWML_SIP_UNROLL _Pragma("GCC unroll 8")
#endif
/* The payload's words: whole in BPF (len a constant there), as the compiler
 * likes elsewhere. */
#ifdef __bpf__
#define SWML_SIP_UNROLL_WORDS _Pragma("unroll")
#else
#define SWML_SIP_UNROLL_WORDS
#endif

struct swml_sip {
	__u64 v0, v1, v2, v3;
};

#define SWML_ROTL64(x, b) (((x) << (b)) | ((x) >> (64 - (b))))

static __always_inline void swml_sip_round(struct swml_sip *s)
{
	s->v0 += s->v1;
	s->v1 = SWML_ROTL64(s->v1, 13);
	s->v1 ^= s->v0;
	s->v0 = SWML_ROTL64(s->v0, 32);
	s->v2 += s->v3;
	s->v3 = SWML_ROTL64(s->v3, 16);
	s->v3 ^= s->v2;
	s->v0 += s->v3;
	s->v3 = SWML_ROTL64(s->v3, 21);
	s->v3 ^= s->v0;
	s->v2 += s->v1;
	s->v1 = SWML_ROTL64(s->v1, 17);
	s->v1 ^= s->v2;
	s->v2 = SWML_ROTL64(s->v2, 32);
}

static __always_inline void swml_sip_init(struct swml_sip *s, __u64 k0, __u64 k1)
{
	s->v0 = k0 ^ 0x736f6d6570736575ULL;
	s->v1 = k1 ^ 0x646f72616e646f6dULL;
	s->v2 = k0 ^ 0x6c7967656e657261ULL;
	s->v3 = k1 ^ 0x7465646279746573ULL;
}

/* One 8-byte word of the message. */
static __always_inline void swml_sip_word(struct swml_sip *s, __u64 m)
{
	s->v3 ^= m;
	SWML_SIP_UNROLL
	for (int i = 0; i < SWML_SIP_C_ROUNDS; i++)
		swml_sip_round(s);
	s->v0 ^= m;
}

/* The last block: the message's length (mod 256) in the top byte, its last
 * len % 8 bytes (`tail`, little-endian) below; then the finalisation. */
static __always_inline __u64 swml_sip_final(struct swml_sip *s, __u32 len, __u64 tail)
{
	swml_sip_word(s, ((__u64)len << 56) | tail);
	s->v2 ^= 0xff;
	SWML_SIP_UNROLL
	for (int i = 0; i < SWML_SIP_D_ROUNDS; i++)
		swml_sip_round(s);
	return s->v0 ^ s->v1 ^ s->v2 ^ s->v3;
}

/* The header's part: its first SWML_AUTH_HDR_LEN bytes, three words. */
static __always_inline void swml_sip_header(struct swml_sip *s, const void *h)
{
	const swml_sip_word_t *w = h;

	SWML_SIP_UNROLL
	for (int i = 0; i < SWML_AUTH_HDR_LEN / 8; i++)
		swml_sip_word(s, w[i]);
}

/* `len` bytes from p, all but the last len % 8: their word-aligned part.
 * Returns those last bytes as the tail word swml_sip_final takes. In BPF,
 * len is a constant and p + len is known to be inside the packet; the loop is
 * unrolled whole there, so that every load is at a constant offset from p,
 * which any kernel's verifier checks against that one bound (6.1's does not
 * follow a pointer a loop advances). */
static __always_inline __u64 swml_sip_bytes(struct swml_sip *s, const __u8 *p, __u32 len)
{
	__u64 tail = 0;
	__u32 whole = len & ~7U;

	SWML_SIP_UNROLL_WORDS
	for (__u32 i = 0; i < whole; i += 8)
		swml_sip_word(s, *(const swml_sip_word_t *)(p + i));
	SWML_SIP_UNROLL
	for (int i = 0; i < 7; i++)
		if ((__u32)i < (len & 7))
			tail |= (__u64)p[whole + i] << (8 * i);
	return tail;
}

/* The authenticator of the RESULT whose swml header is at h (swml_wire.h):
 * over its header and, with auth SWML_AUTH_FULL, the payload_len bytes after
 * it, keyed by the job's result key as k0, k1. In BPF the caller has checked
 * that the payload is inside the packet, and payload_len is a constant. */
static __always_inline __u64 swml_result_auth(const __u64 key[2], __u32 auth, const void *h,
					      __u32 payload_len)
{
	struct swml_sip sip;
	__u32 covered = SWML_AUTH_HDR_LEN;
	__u64 tail = 0;

	swml_sip_init(&sip, key[0], key[1]);
	swml_sip_header(&sip, h);
	if (auth == SWML_AUTH_FULL) {
		tail = swml_sip_bytes(&sip, (const __u8 *)h + SWML_HDR_LEN, payload_len);
		covered += payload_len;
	}
	return swml_sip_final(&sip, covered, tail);
}

#endif /* SWML_AUTH_H */
