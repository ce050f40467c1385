/* SPDX-License-Identifier: MIT */
/* quant.c - see quant.h.
 *
 * The element loops are written so that gcc vectorizes them at -O3 without
 * -ffast-math (which would break the exactness): non-finite elements are
 * masked out with integer bit operations instead of branches, the exponent is
 * an integer max over the magnitudes' bit patterns, and rint() is the
 * magic-number rounding below. target_clones adds an AVX2 version picked at
 * load time where the CPU has it; both give the same bits. Where the CPU has
 * AVX2, quantize and dequantize run quant_simd.c's float32 kernels instead, for the exponents where quant_simd.h shows them exact. */
#include "quant.h"
#include "quant_simd.h"

#include <math.h>
#include <string.h>

#include <linux/types.h>
#include "swml_wire.h"

#define F32_ABS_MASK 0x7fffffffu
#define F32_MIN_NORMAL_BITS 0x00800000u
#define F32_INF_BITS 0x7f800000u /* |x| bits at or above: Inf or NaN */
/* |x| bits + 2^23 has bit 31 set iff x is Inf or NaN (exponent field all ones). */
#define F32_NONFINITE_CARRY 0x00800000u
/* (v + 1.5*2^52) - 1.5*2^52 rounds v to an integer, half to even, in the
 * default rounding mode, for |v| < 2^51: the same result as rint(v). */
#define ROUND_MAGIC 6755399441055744.0

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define SWML_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define SWML_CLONES
#endif

/* The vector kernels in use, the best this CPU has unless swml_quant_simd()
 * said less. */
static enum swml_simd simd;

__attribute__((constructor)) static void pick_simd(void)
{
	simd = swml_simd_supported();
}

int swml_quant_simd(int level)
{
	const enum swml_simd best = swml_simd_supported();

	if (level >= 0)
		simd = (enum swml_simd)level < best ? (enum swml_simd)level : best;
	return (int)simd;
}

/* 2^e exactly, e in [-1022, 1023]; and as a float, e in [-126, 127]: the
 * exponent field alone, no libm call. */
static inline double pow2(int e)
{
	const uint64_t bits = (uint64_t)(e + 1023) << 52;
	double d;

	memcpy(&d, &bits, sizeof d);
	return d;
}

static inline float pow2f(int e)
{
	const uint32_t bits = (uint32_t)(e + 127) << 23;
	float f;

	memcpy(&f, &bits, sizeof f);
	return f;
}

/* quant_simd.h's float32 scaling by 2^F, F in [-126, 254], as two normal
 * factors: 2^min(F, 127) and what is left. */
static inline float first_factor(int F)
{
	return pow2f(F > 127 ? 127 : F);
}

static inline float second_factor(int F)
{
	return pow2f(F > 127 ? F - 127 : 0);
}

int swml_exponent_bits(uint32_t world)
{
	int L = 0;

	while (world > 1 && (1u << L) < world)
		L++;
	return L;
}

/* The largest |x| of the n elements at x, as bits: an Inf or NaN among them
 * makes it at least F32_INF_BITS. Two operations an element. */
SWML_CLONES
static uint32_t abs_peak(const float *x, size_t n)
{
	uint32_t peak = 0;

	for (size_t i = 0; i < n; i++) {
		uint32_t u;

		memcpy(&u, x + i, sizeof u);
		u &= F32_ABS_MASK;
		peak = u > peak ? u : peak; /* non-negative floats order as their bits */
	}
	return peak;
}

/* The largest finite |x|, as bits, for a block that has an Inf or NaN. */
SWML_CLONES
static uint32_t finite_peak(const float *x, size_t n)
{
	uint32_t peak = 0;

	for (size_t i = 0; i < n; i++) {
		uint32_t u, a, t;

		memcpy(&u, x + i, sizeof u);
		a = u & F32_ABS_MASK;
		t = a + F32_NONFINITE_CARRY;
		a &= (t >> 31) - 1u; /* 0 for Inf/NaN */
		peak = a > peak ? a : peak;
	}
	return peak;
}

int8_t swml_block_exponent(const float *x, size_t n, int *nonfinite)
{
	uint32_t peak = abs_peak(x, n);
	int e;

	*nonfinite = peak >= F32_INF_BITS;
	if (*nonfinite) /* rare: a second pass that leaves them out */
		peak = finite_peak(x, n);
	if (peak == 0)
		return SWML_EXP_MIN;
	if (peak >= F32_MIN_NORMAL_BITS)
		e = (int)(peak >> 23) - 127; /* 1.m * 2^(eb - 127) */
	else
		e = (31 - __builtin_clz(peak)) - 149; /* denormal: m * 2^-149 */
	if (e < SWML_EXP_MIN)
		e = SWML_EXP_MIN;
	if (e > SWML_EXP_MAX)
		e = SWML_EXP_MAX;
	return (int8_t)e;
}

static inline int shift_of(int8_t exp_global, int L)
{
	return (SWML_TOP_BIT - L) - exp_global; /* F, in [-114, 157] */
}

/* rint((double)x * scale) with Inf/NaN as +0.0, branch-free for the vectorized
 * loops: exact scaling (a power of two, no over/underflow for any shift here),
 * the magic-number rounding. */
static inline double quantized(const float *xp, double scale)
{
	uint32_t u, t;
	float xf;
	double v;

	memcpy(&u, xp, sizeof u);
	t = (u & F32_ABS_MASK) + F32_NONFINITE_CARRY;
	u &= (t >> 31) - 1u; /* Inf/NaN -> +0.0 */
	memcpy(&xf, &u, sizeof xf);
	v = (double)xf * scale;
	return (v + ROUND_MAGIC) - ROUND_MAGIC;
}

/* The scalar, checked quantizer of both formats (any exponent, so any
 * magnitude): libm's rint, values saturated to int32 (wide) or int16, zero
 * padding from n to k; returns the largest |value| before saturation. */
/* float32(ints[i] * scale) for n int32 (wide) or int16 at payload, as they
 * sit in a frame (any alignment), sub taken off each int32 first (uint32,
 * wrapping); all NaN for a non-finite block: the last step of both formats.
 * `wide` is a constant at each call, so each inlined copy keeps one
 * vectorized loop. */
static inline void payload_back(const void *payload, int wide, size_t n, uint32_t sub, double scale,
				int nonfinite, float *restrict out)
{
	const uint8_t *p = payload;

	if (nonfinite) {
		for (size_t i = 0; i < n; i++)
			out[i] = NAN;
	} else if (wide) {
		for (size_t i = 0; i < n; i++) {
			uint32_t u;

			memcpy(&u, p + 4 * i, sizeof u);
			out[i] = (float)((double)(int32_t)(u - sub) * scale);
		}
	} else {
		for (size_t i = 0; i < n; i++) {
			int16_t v;

			memcpy(&v, p + 2 * i, sizeof v);
			out[i] = (float)((double)v * scale);
		}
	}
}

static uint32_t quantize_checked(const float *x, size_t n, size_t k, double scale, int wide,
				 void *out)
{
	const double hi = wide ? 2147483647.0 : 32767.0, lo = -hi - 1.0;
	double peak = 0.0;

	for (size_t i = 0; i < k; i++) {
		double v = i < n && isfinite(x[i]) ? rint((double)x[i] * scale) : 0.0;

		peak = fabs(v) > peak ? fabs(v) : peak;
		v = v > hi ? hi : v < lo ? lo : v;
		if (wide)
			((int32_t *)out)[i] = (int32_t)v;
		else
			((int16_t *)out)[i] = (int16_t)v;
	}
	return peak >= 4294967295.0 ? UINT32_MAX : (uint32_t)peak;
}

SWML_CLONES
static void quantize_offset_f64(const float *x, size_t n, size_t k, double scale, uint32_t offset,
				int32_t *restrict out)
{
	for (size_t i = 0; i < n; i++) /* |q| <= 2^(30-L) by the precondition */
		out[i] = (int32_t)((uint32_t)(int32_t)quantized(x + i, scale) + offset);
	for (size_t i = n; i < k; i++)
		out[i] = (int32_t)offset;
}

void swml_quantize_block_offset(const float *x, size_t n, size_t k, int8_t exp_global, int L,
				uint32_t offset, int32_t *out)
{
	const int F = shift_of(exp_global, L);

	if (simd)
		swml_simd_quantize32(simd, x, n, k, first_factor(F), second_factor(F), offset, out);
	else
		quantize_offset_f64(x, n, k, pow2(F), offset, out);
}

void swml_quantize_block(const float *x, size_t n, size_t k, int8_t exp_global, int L, int32_t *out)
{
	swml_quantize_block_offset(x, n, k, exp_global, L, 0, out);
}

uint32_t swml_quantize_block_checked(const float *x, size_t n, size_t k, int8_t exp_global, int L,
				     int32_t *out)
{
	return quantize_checked(x, n, k, pow2(shift_of(exp_global, L)), 1, out);
}

SWML_CLONES
void swml_offset_block(int32_t *x, size_t k, uint32_t offset)
{
	uint32_t *u = (uint32_t *)x; /* unsigned: the wrap is defined */

	for (size_t i = 0; i < k; i++)
		u[i] += offset;
}

SWML_CLONES
void swml_dequantize_block(const int32_t *sums, size_t n, int8_t exp_global, int L, int nonfinite,
			   float *restrict out)
{
	const int F = shift_of(exp_global, L);

	if (simd && !nonfinite && F <= 126) /* 2^-F >= 2^-126: every nonzero y normal */
		swml_simd_dequantize32(simd, sums, n, 0, pow2f(-F), out);
	else
		payload_back(sums, 1, n, 0, pow2(-F), nonfinite, out);
}

SWML_CLONES
void swml_dequantize_payload(const void *payload, size_t n, uint32_t sub, int8_t exp_global, int L,
			     int nonfinite, float *out)
{
	const int F = shift_of(exp_global, L);

	if (simd && !nonfinite && F <= 126)
		swml_simd_dequantize32(simd, payload, n, sub, pow2f(-F), out);
	else
		payload_back(payload, 1, n, sub, pow2(-F), nonfinite, out);
}

static inline int shift16_of(int8_t exp_global)
{
	return SWML_TOP_BIT16 - exp_global; /* F16, in [-114, 141] */
}

SWML_CLONES
static void quantize16_f64(const float *x, size_t n, size_t k, double scale, int16_t *restrict out)
{
	for (size_t i = 0; i < n; i++) /* |q| <= 2^14 by the precondition */
		out[i] = (int16_t)(int32_t)quantized(x + i, scale);
	for (size_t i = n; i < k; i++)
		out[i] = 0;
}

void swml_quantize16_block(const float *x, size_t n, size_t k, int8_t exp_global, int16_t *out)
{
	const int F = shift16_of(exp_global);

	if (simd)
		swml_simd_quantize16(simd, x, n, k, first_factor(F), second_factor(F), out);
	else
		quantize16_f64(x, n, k, pow2(F), out);
}

uint32_t swml_quantize16_block_checked(const float *x, size_t n, size_t k, int8_t exp_global,
				       int16_t *out)
{
	return quantize_checked(x, n, k, pow2(shift16_of(exp_global)), 0, out);
}

SWML_CLONES
void swml_dequantize16_payload(const void *payload, size_t n, int8_t exp_global, int L,
			       int nonfinite, float *out)
{
	/* 2^(L - F16) lies in [2^-141, 2^(L+114)]: exact in double; a float
	 * factor where every nonzero y is normal */
	const int G = L - shift16_of(exp_global);

	if (simd && !nonfinite && G >= -126 && G <= 127)
		swml_simd_dequantize16(simd, payload, n, pow2f(G), out);
	else
		payload_back(payload, 0, n, 0, pow2(G), nonfinite, out);
}

void swml_dequantize16_block(const int16_t *results, size_t n, int8_t exp_global, int L,
			     int nonfinite, float *out)
{
	swml_dequantize16_payload(results, n, exp_global, L, nonfinite, out);
}

#define F32_LOW31 0x7fffffffu
#define F32_NAN_MAX 0x7fc00000u /* +qNaN: above +inf */
#define F32_NAN_MIN 0xffc00000u /* -qNaN: below -inf once mapped */

/* The map is an involution on the bits: flip the 31 low bits iff the sign is set. */
static inline uint32_t ordered_bits(uint32_t u)
{
	return u ^ ((uint32_t)((int32_t)u >> 31) & F32_LOW31);
}

SWML_CLONES
void swml_ordered_block(const float *x, size_t n, size_t k, uint8_t op, int32_t *restrict out)
{
	const uint32_t nan = op == SWML_OP_MIN ? F32_NAN_MIN : F32_NAN_MAX;

	for (size_t i = 0; i < n; i++) {
		uint32_t u;

		memcpy(&u, x + i, sizeof u);
		if ((u & F32_ABS_MASK) > 0x7f800000u) /* NaN, any sign and payload */
			u = nan;
		u = ordered_bits(u);
		memcpy(out + i, &u, sizeof u);
	}
	for (size_t i = n; i < k; i++)
		out[i] = 0;
}

void swml_unordered_block(const void *q, size_t n, float *out)
{
	const uint8_t *p = q;

	for (size_t i = 0; i < n; i++) {
		uint32_t u;

		memcpy(&u, p + 4 * i, sizeof u);
		u = ordered_bits(u);
		memcpy(out + i, &u, sizeof u);
	}
}
