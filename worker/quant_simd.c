/* SPDX-License-Identifier: MIT */
/* quant_simd.c - see quant_simd.h. The kernels are AVX2's: AVX-512 ran no
 * faster on the machine measured (docs/performance.md, "Where the engine's
 * cycles go"), and more CPUs have AVX2. The scalar steps (the loops' last
 * elements, and every element where no set is compiled in) round the same
 * way: nearbyintf and the int-to-float conversion round half to even in the
 * default mode, as the vector conversions do. */
#include "quant_simd.h"

#include <math.h>
#include <string.h>

#define F32_ABS_MASK 0x7fffffffu
#define F32_FINITE_MAX 0x7f7fffffu /* |x| bits above this: Inf or NaN */

/* mask(x) * s1 * s2 rounded to an integer: Inf/NaN as +0. */
static inline int32_t scalar_q(const float *xp, float s1, float s2)
{
	uint32_t u;
	float v;

	memcpy(&u, xp, sizeof u);
	if ((u & F32_ABS_MASK) > F32_FINITE_MAX)
		u = 0;
	memcpy(&v, &u, sizeof v);
	return (int32_t)nearbyintf(v * s1 * s2);
}

static inline float scalar_y32(const uint8_t *p, uint32_t sub, float scale)
{
	uint32_t u;

	memcpy(&u, p, sizeof u);
	return (float)(int32_t)(u - sub) * scale;
}

static inline float scalar_y16(const uint8_t *p, float scale)
{
	int16_t v;

	memcpy(&v, p, sizeof v);
	return (float)v * scale;
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#define AVX2 __attribute__((target("avx2")))

enum swml_simd swml_simd_supported(void)
{
	__builtin_cpu_init();
	if (__builtin_cpu_supports("avx2"))
		return SWML_SIMD_AVX2;
	return SWML_SIMD_NONE;
}

/* 8 elements: mask(x) * s1 * s2, rounded to int32. */
AVX2 static inline __m256i q8(const float *x, __m256 s1, __m256 s2)
{
	const __m256i u = _mm256_loadu_si256((const __m256i *)x);
	const __m256i a = _mm256_and_si256(u, _mm256_set1_epi32((int)F32_ABS_MASK));
	const __m256i bad = _mm256_cmpgt_epi32(a, _mm256_set1_epi32((int)F32_FINITE_MAX));
	const __m256 v = _mm256_castsi256_ps(_mm256_andnot_si256(bad, u));

	return _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_mul_ps(v, s1), s2));
}

AVX2 static void quantize32_avx2(const float *x, size_t n, size_t k, float s1, float s2,
				 uint32_t offset, int32_t *out)
{
	const __m256 v1 = _mm256_set1_ps(s1), v2 = _mm256_set1_ps(s2);
	const __m256i off = _mm256_set1_epi32((int)offset);
	size_t i = 0;

	for (; i + 8 <= n; i += 8)
		_mm256_storeu_si256((__m256i *)(out + i), _mm256_add_epi32(q8(x + i, v1, v2), off));
	for (; i < n; i++)
		out[i] = (int32_t)((uint32_t)scalar_q(x + i, s1, s2) + offset);
	for (; i < k; i++)
		out[i] = (int32_t)offset;
}

AVX2 static void quantize16_avx2(const float *x, size_t n, size_t k, float s1, float s2,
				 int16_t *out)
{
	const __m256 v1 = _mm256_set1_ps(s1), v2 = _mm256_set1_ps(s2);
	size_t i = 0;

	for (; i + 16 <= n; i += 16) {
		/* |q| <= 2^14: the saturating pack keeps every value */
		__m256i q = _mm256_packs_epi32(q8(x + i, v1, v2), q8(x + i + 8, v1, v2));

		q = _mm256_permute4x64_epi64(q, _MM_SHUFFLE(3, 1, 2, 0));
		_mm256_storeu_si256((__m256i *)(out + i), q);
	}
	for (; i < n; i++)
		out[i] = (int16_t)scalar_q(x + i, s1, s2);
	for (; i < k; i++)
		out[i] = 0;
}

AVX2 static void dequantize32_avx2(const uint8_t *p, size_t n, uint32_t sub, float scale,
				   float *out)
{
	const __m256 s = _mm256_set1_ps(scale);
	const __m256i d = _mm256_set1_epi32((int)sub);
	size_t i = 0;

	for (; i + 8 <= n; i += 8) {
		__m256i u = _mm256_loadu_si256((const __m256i *)(p + 4 * i));

		u = _mm256_sub_epi32(u, d);
		_mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_cvtepi32_ps(u), s));
	}
	for (; i < n; i++)
		out[i] = scalar_y32(p + 4 * i, sub, scale);
}

AVX2 static void dequantize16_avx2(const uint8_t *p, size_t n, float scale, float *out)
{
	const __m256 s = _mm256_set1_ps(scale);
	size_t i = 0;

	for (; i + 8 <= n; i += 8) {
		__m256i v = _mm256_cvtepi16_epi32(_mm_loadu_si128((const __m128i *)(p + 2 * i)));

		_mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_cvtepi32_ps(v), s));
	}
	for (; i < n; i++)
		out[i] = scalar_y16(p + 2 * i, scale);
}

#define PICK(level, name, ...)                    \
	do {                                      \
		if ((level) == SWML_SIMD_AVX2) {  \
			name##_avx2(__VA_ARGS__); \
			return;                   \
		}                                 \
	} while (0)
#else
enum swml_simd swml_simd_supported(void)
{
	return SWML_SIMD_NONE;
}

#define PICK(level, name, ...) ((void)(level))
#endif

/* With no vector set, the same arithmetic one element at a time (quant.c
 * runs its float64 loops instead; this keeps every level's bits right). */

void swml_simd_quantize32(enum swml_simd level, const float *x, size_t n, size_t k, float s1,
			  float s2, uint32_t offset, int32_t *out)
{
	PICK(level, quantize32, x, n, k, s1, s2, offset, out);
	for (size_t i = 0; i < k; i++)
		out[i] = (int32_t)((i < n ? (uint32_t)scalar_q(x + i, s1, s2) : 0u) + offset);
}

void swml_simd_quantize16(enum swml_simd level, const float *x, size_t n, size_t k, float s1,
			  float s2, int16_t *out)
{
	PICK(level, quantize16, x, n, k, s1, s2, out);
	for (size_t i = 0; i < k; i++)
		out[i] = i < n ? (int16_t)scalar_q(x + i, s1, s2) : 0;
}

void swml_simd_dequantize32(enum swml_simd level, const void *payload, size_t n, uint32_t sub,
			    float scale, float *out)
{
	PICK(level, dequantize32, payload, n, sub, scale, out);
	for (size_t i = 0; i < n; i++)
		out[i] = scalar_y32((const uint8_t *)payload + 4 * i, sub, scale);
}

void swml_simd_dequantize16(enum swml_simd level, const void *payload, size_t n, float scale,
			    float *out)
{
	PICK(level, dequantize16, payload, n, scale, out);
	for (size_t i = 0; i < n; i++)
		out[i] = scalar_y16((const uint8_t *)payload + 2 * i, scale);
}
