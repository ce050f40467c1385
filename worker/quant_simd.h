/* SPDX-License-Identifier: MIT */
/*
 * quant_simd.h - the element loops of quant.c in float32 vector instructions
 * (AVX2), picked at run time; quant.c keeps the portable loops and
 * says when these may run.
 *
 * Why float32 gives the same bits as quant.py's float64 arithmetic
 * (docs/quantization.md):
 *  - quantize: x * 2^F in float32 is exact wherever the product is normal (a
 *    power of two only moves the exponent), and where it is subnormal it is
 *    below 2^-126, so that it and the exact product both round to 0. The
 *    float32 2^F must be normal: F <= 127 in one factor, a second factor
 *    (exact: scaling up) for F in [128, 157]. The conversion rounds half to
 *    even (the default MXCSR mode, which rint() and the magic number assume
 *    too) and |q| <= 2^30 fits int32.
 *  - dequantize: (float)S then * 2^G rounds S's significand once, at the same
 *    bit as the float64 product's cast would, wherever every nonzero result
 *    is normal: |S| >= 1 and G >= -126 (and G <= 127 for the factor). Outside
 *    that, quant.c runs its float64 loop. Overflow gives +-Inf both ways.
 */
#ifndef SWML_QUANT_SIMD_H
#define SWML_QUANT_SIMD_H

#include <stddef.h>
#include <stdint.h>

/* The instruction sets, in order: each level has the ones below it. */
enum swml_simd { SWML_SIMD_NONE, SWML_SIMD_AVX2 };

/* The best level this CPU runs (SWML_SIMD_NONE off x86-64 or with another compiler). */
enum swml_simd swml_simd_supported(void);

/* q = rint(mask(x) * s1 * s2) + offset (uint32, wrapping) for n elements;
 * offset for the padding from n to k. s1, s2: powers of two, normal floats. */
void swml_simd_quantize32(enum swml_simd level, const float *x, size_t n, size_t k, float s1,
			  float s2, uint32_t offset, int32_t *out);

/* q = rint(mask(x) * s1 * s2) as int16 (truncated from int32) for n
 * elements; 0 for the padding. */
void swml_simd_quantize16(enum swml_simd level, const float *x, size_t n, size_t k, float s1,
			  float s2, int16_t *out);

/* y = (float)(int32)(payload[i] - sub) * scale for n little-endian int32 at
 * payload (any alignment). */
void swml_simd_dequantize32(enum swml_simd level, const void *payload, size_t n, uint32_t sub,
			    float scale, float *out);

/* y = (float)payload[i] * scale for n little-endian int16 at payload (any alignment). */
void swml_simd_dequantize16(enum swml_simd level, const void *payload, size_t n, float scale,
			    float *out);

#endif /* SWML_QUANT_SIMD_H */
