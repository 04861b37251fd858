/* The lane vector of the packed GEMM (qm_pack.h): PN int32/fp32 lanes, one per weight row.
 * With AVX512-VNNI PN = 16 (zmm): on Zen 4 a 512-bit dpbusd is one macro-op doing the work of two
 * 256-bit ones, and each broadcast activation dword then feeds 16 weight rows instead of 8. AVX2: PN = 8
 * (ymm, dpbusd emulated by maddubs + madd).
 * Every lane does the same scalar fp32 operations in either width, so the bits do not depend on PN. */
#ifndef QM_PVEC_H
#define QM_PVEC_H

#include <immintrin.h>
#include "qm_simd.h"

#if QM_VNNI
#define PN 16
typedef __m512i pvi;
typedef __m512 pvf;
#define pv_load(p) _mm512_load_si512((const void *)(p))
#define pv_set1(v) _mm512_set1_epi32(v)
#define pv_zero() _mm512_setzero_si512()
#define pv_add(a, b) _mm512_add_epi32(a, b)
#define pv_sub(a, b) _mm512_sub_epi32(a, b)
#define pv_mullo(a, b) _mm512_mullo_epi32(a, b)
#define pv_dpbusd(acc, w, x) _mm512_dpbusd_epi32(acc, w, x)
#define pv_dpwssd(acc, a, b) _mm512_dpwssd_epi32(acc, a, b)
/* |w| and x with w's sign (the AVX2 form of signed weights; VNNI builds take them + 128 instead) */
#define pv_abs8(w) _mm512_abs_epi8(w)
#define pv_sign8(x, w) _mm512_mask_sub_epi8(x, _mm512_movepi8_mask(w), _mm512_setzero_si512(), x)
#define pf_zero() _mm512_setzero_ps()
#define pf_load(p) _mm512_load_ps(p)
#define pf_set1(v) _mm512_set1_ps(v)
#define pf_add(a, b) _mm512_add_ps(a, b)
#define pf_mul(a, b) _mm512_mul_ps(a, b)
#define pf_fmadd(a, b, c) _mm512_fmadd_ps(a, b, c)
#define pf_fnmadd(a, b, c) _mm512_fnmadd_ps(a, b, c)
#define pf_cvt(a) _mm512_cvtepi32_ps(a)
#define pf_storeu(p, a) _mm512_storeu_ps(p, a)
#else
#define PN 8
typedef __m256i pvi;
typedef __m256 pvf;
#define pv_load(p) _mm256_load_si256((const __m256i *)(p))
#define pv_set1(v) _mm256_set1_epi32(v)
#define pv_zero() _mm256_setzero_si256()
#define pv_add(a, b) _mm256_add_epi32(a, b)
#define pv_sub(a, b) _mm256_sub_epi32(a, b)
#define pv_mullo(a, b) _mm256_mullo_epi32(a, b)
/* maddubs saturates only beyond 2 * 255 * 127 > 32767: fine for weights < 128 (all but Q8_0 + 128,
 * which takes the row path without VNNI) */
#define pv_dpbusd(acc, w, x) _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1)))
#define pv_dpwssd(acc, a, b) _mm256_add_epi32(acc, _mm256_madd_epi16(a, b))
/* signed weights (Q8_0, IQ4_NL, IQ4_XS): |w| . sign(x, w), whose byte pairs stay below 2 * 127 * 127 */
#define pv_abs8(w) _mm256_abs_epi8(w)
#define pv_sign8(x, w) _mm256_sign_epi8(x, w)
#define pf_zero() _mm256_setzero_ps()
#define pf_load(p) _mm256_load_ps(p)
#define pf_set1(v) _mm256_set1_ps(v)
#define pf_add(a, b) _mm256_add_ps(a, b)
#define pf_mul(a, b) _mm256_mul_ps(a, b)
#define pf_fmadd(a, b, c) _mm256_fmadd_ps(a, b, c)
#define pf_fnmadd(a, b, c) _mm256_fnmadd_ps(a, b, c)
#define pf_cvt(a) _mm256_cvtepi32_ps(a)
#define pf_storeu(p, a) _mm256_storeu_ps(p, a)
#endif

#endif
