/* SPDX-License-Identifier: MIT */
/*
 * quant.h - float32 <-> int32 (and int16) block quantization of the worker engine.
 *
 * Bit-identical to the numpy reference switchml_xdp/quant.py (the executable
 * definition; docs/quantization.md explains it):
 *   L = ceil(log2(world)); E_local = floor(log2(max |x| over finite x)) clamped
 *   to [-128, 127], -128 for a block with no nonzero finite element; E = max of
 *   E_local over workers (the switch); F = 29 - L - E;
 *   q = rint((double)x * 2^F) (round half to even), non-finite and padding -> 0;
 *   y = (float)((double)S * 2^-F); a block with a non-finite input -> all NaN.
 * Every scaling is by an exact power of two in double, so the only roundings
 * are rint's and the final cast, as in the reference.
 */
#ifndef SWML_QUANT_H
#define SWML_QUANT_H

#include <stddef.h>
#include <stdint.h>

/* The header's signed 8-bit exponent: local exponents are clamped to it;
 * -128 also marks "nothing to scale" (an all-zero or all-non-finite block).
 * switchml_xdp/quant.py and quant16.py read these through layout_gen.py. */
#define SWML_EXP_MIN (-128)
#define SWML_EXP_MAX 127
/* Headroom: |q| <= 2^(30-L), so a sum of world <= 2^L values is <= 2^30:
 * F = SWML_TOP_BIT - L - E. */
#define SWML_TOP_BIT 29
/* The 16-bit format: |q| <= 2^14, one bit below int16's range. */
#define SWML_TOP_BIT16 13

/* L = ceil(log2(world)), 0 for world 1. */
int swml_exponent_bits(uint32_t world);

/* Local exponent of the n (<= k) elements at x; *nonfinite set to 1 if one of
 * them is NaN or +-Inf, else 0. */
int8_t swml_block_exponent(const float *x, size_t n, int *nonfinite);

/* Quantize n elements of x into k int32 at out (zero padded from n to k) with
 * the block's global exponent. Precondition: exp_global >= the block's local
 * exponent (always true in a job: the switch returns the max over workers),
 * so every |q| <= 2^(30-L). Vectorized (quant_simd.h where the CPU allows). */
void swml_quantize_block(const float *x, size_t n, size_t k, int8_t exp_global, int L,
			 int32_t *out);

/* swml_quantize_block, then `offset` added to each of the k elements as
 * swml_offset_block does, in one pass (SWML_FMT_OFFSET32). */
void swml_quantize_block_offset(const float *x, size_t n, size_t k, int8_t exp_global, int L,
				uint32_t offset, int32_t *out);

/* The same for any exp_global (scalar): values beyond int32 saturate, and the
 * largest |q| is returned so that callers can check the 2^(30-L) headroom, as
 * quant.quantize() does. Identical output where the precondition holds. */
uint32_t swml_quantize_block_checked(const float *x, size_t n, size_t k, int8_t exp_global, int L,
				     int32_t *out);

/* SWML_FMT_OFFSET32 (swml_wire.h): add `offset` to each of the k elements at
 * x as uint32 (wrapping): 2^(30-L) before sending, 0 - world * 2^(30-L) on a
 * RESULT's sums; quant.to_offset() and quant.from_offset(). */
void swml_offset_block(int32_t *x, size_t k, uint32_t offset);

/* Dequantize the first n sums of a block into out; all NaN when nonfinite. */
void swml_dequantize_block(const int32_t *sums, size_t n, int8_t exp_global, int L, int nonfinite,
			   float *out);

/* The same from a RESULT's payload where it lies in the frame (any
 * alignment), `sub` taken off each sum first (uint32, wrapping: the world's
 * offsets under SWML_FMT_OFFSET32, else 0): no copy to an aligned buffer. */
void swml_dequantize_payload(const void *payload, size_t n, uint32_t sub, int8_t exp_global, int L,
			     int nonfinite, float *out);

/* The 16-bit block format, bit-identical to switchml_xdp/quant16.py (the
 * definition; docs/quantization.md, "The 16-bit format"): F16 = 13 - E,
 * q = rint((double)x * 2^F16) as int16 (|q| <= 2^14 whatever the world: the
 * switch keeps the headroom, returning R = (S + 2^(L-1)) >> L), non-finite and
 * padding -> 0; y = (float)((double)R * 2^(L - F16)). Same precondition and
 * vectorization as swml_quantize_block. */
void swml_quantize16_block(const float *x, size_t n, size_t k, int8_t exp_global, int16_t *out);

/* The same for any exp_global (scalar): values beyond int16 saturate, and the
 * largest |q| is returned so that callers can check the 2^14 limit, as
 * quant16.quantize16() does. */
uint32_t swml_quantize16_block_checked(const float *x, size_t n, size_t k, int8_t exp_global,
				       int16_t *out);

/* The first n elements of a block of the switch's int16 RESULT into out; all
 * NaN when nonfinite. */
void swml_dequantize16_block(const int16_t *results, size_t n, int8_t exp_global, int L,
			     int nonfinite, float *out);

/* The same from a RESULT's int16 payload where it lies in the frame (any alignment). */
void swml_dequantize16_payload(const void *payload, size_t n, int8_t exp_global, int L,
			       int nonfinite, float *out);

/* Which vector kernels quantize and dequantize run (quant_simd.h: 0 none,
 * the float64 loops; 1 AVX2): the best the CPU has by default;
 * level >= 0 picks that one or the best below it. Returns the level in use.
 * Every level gives the same bits; tests and the bench compare them. */
int swml_quant_simd(int level);

/* float32 MIN/MAX through the switch's int32 compare, bit-identical to
 * switchml_xdp/ordered.py: each float's bits as an int32, the 31 low bits
 * flipped where the sign is set, so that signed int32 order is float order;
 * every NaN first becomes the NaN that wins `op` (SWML_OP_MIN: -qNaN 0xffc00000,
 * SWML_OP_MAX: +qNaN 0x7fc00000). n elements of x into out, zero padded to k. */
void swml_ordered_block(const float *x, size_t n, size_t k, uint8_t op, int32_t *out);

/* Its inverse: n int32 at q (any alignment) back to float32 at out. */
void swml_unordered_block(const void *q, size_t n, float *out);

#endif /* SWML_QUANT_H */
