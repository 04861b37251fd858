/* SIMD unpacking of the low-bit K types (Q2_K, Q3_K), the codebook types (IQ4_NL, IQ4_XS) and MXFP4 into the
 * forms the shared kernels of qm_simd.h / qm_pack.h take (split from qm_simd.h, which includes it first):
 *
 * - IQ4_NL, MXFP4 (32 elements): 32 weight bytes per block like the legacy types. IQ4_NL gives its signed
 *   codebook values (handled like Q8_0's stored bytes, QM_SIGNED32); MXFP4 its doubled e2m1 codes + 12,
 *   unsigned 0..24 (the 12 comes back through the activations' c = -12 * sum(q_x), like Q4_0's 8).
 * - Q2_K, Q3_K, IQ4_XS (256 elements): unpack256's outputs, 8 x 32 weight bytes, per-16 scales as int16
 *   lanes, per-16 min multipliers, d and dmin. Q2_K: q in 0..3 with its 4-bit scales and mins (the Q4_K
 *   float steps); Q3_K: q + 4 in 0..7 with signed scales, mins = 4 * scale (the Q6_K steps on I - Mn);
 *   IQ4_XS: signed codebook values (the caller moves the sign onto x), signed per-32 scales, no mins.
 * Element orders follow ggml's dequantize_row_* (ggml-quants.c). */
#ifndef QM_SUNPACK_H
#define QM_SUNPACK_H

#include <immintrin.h>
#include "qm_common.h"

#ifndef QM_INLINE
#define QM_INLINE static inline __attribute__((always_inline))
#endif

/* 16 bytes at p -> 32 bytes: the low nibbles (elements 0..15), then the high nibbles (16..31) */
QM_INLINE __m256i s_nibbles32(const uint8_t *p) {
    const __m256i q = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)p));
    return _mm256_and_si256(_mm256_srlv_epi64(q, _mm256_setr_epi64x(0, 0, 4, 4)), _mm256_set1_epi8(15));
}

/* the 16-entry codebook of qt in both 128-bit halves (MXFP4: + QM_MXFP4_OFF) */
QM_INLINE __m256i s_codebook(const int qt) {
    if (qt == QT_MXFP4)
        return _mm256_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0,
                                12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0);
    return _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qm_kv_iq4nl));
}

/* IQ4_NL / MXFP4 block -> its 32 weight bytes (see above) */
QM_INLINE __m256i s_unpack32_cb(const int qt, const uint8_t *b) {
    return _mm256_shuffle_epi8(s_codebook(qt), s_nibbles32(b + (qt == QT_MXFP4 ? 1 : 2)));
}

/* qm_e8m0_half of the low byte of each int32 lane */
QM_INLINE __m128 s_e8m0_half4(__m128i u) {
    const __m128i e = _mm_and_si128(u, _mm_set1_epi32(0xff));
    const __m128i normal = _mm_slli_epi32(_mm_sub_epi32(e, _mm_set1_epi32(1)), 23);
    const __m128i tiny = _mm_sllv_epi32(_mm_set1_epi32(0x00200000), e);
    return _mm_castsi128_ps(_mm_blendv_epi8(normal, tiny, _mm_cmplt_epi32(e, _mm_set1_epi32(2))));
}

/* Q3_K's 16 scales minus 32 as int8 (qm_q3k_scales), from p = the scales - 2 (16 bytes read inside the block) */
QM_INLINE __m128i s_q3k_scales(const uint8_t *p) {
    const __m128i v = _mm_loadu_si128((const __m128i *)p);
    const __m128i a = _mm_shuffle_epi8(v, _mm_setr_epi8(2, 3, 4, 5, 6, 7, 8, 9, 2, 3, 4, 5, 6, 7, 8, 9));
    const __m128i m4 = _mm_set1_epi8(15);
    const __m128i lo = _mm_blend_epi16(_mm_and_si128(a, m4), _mm_and_si128(_mm_srli_epi16(a, 4), m4), 0xf0);
    const __m128i h = _mm_shuffle_epi8(v, _mm_setr_epi8(10, 11, 12, 13, 10, 11, 12, 13, 10, 11, 12, 13, 10, 11, 12, 13));
    const __m128i hi = _mm_and_si128(_mm_srlv_epi32(h, _mm_setr_epi32(0, 2, 4, 6)), _mm_set1_epi8(3));
    return _mm_sub_epi8(_mm_or_si128(lo, _mm_slli_epi16(hi, 4)), _mm_set1_epi8(32));
}

/* 16 int8 scales -> sc[k]: scale 2k in the int16 lanes 0..7, 2k + 1 in 8..15 (maddubs pairs of vector k) */
QM_INLINE void s_scales16(__m128i s8, __m256i sc[8]) {
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++) {
        const __m128i shuf = _mm_set_epi64x(0x0101010101010101LL * (2 * k + 1), 0x0101010101010101LL * (2 * k));
        sc[k] = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(s8, shuf));
    }
}

/* Q2_K / Q3_K / IQ4_XS block -> unpack256's outputs (see above) */
QM_INLINE void s_unpack256_low(const int qt, const uint8_t *b, __m256i wq[8], __m256i sc[8], __m256i *mins, float *d,
                               float *dmin) {
    uint16_t h;
    if (qt == QT_IQ4_XS) {
        memcpy(&h, b, 2);
        *d = *dmin = _cvtsh_ss(h);
        int s8[8];
        qm_iq4xs_scales(b, s8);
        const __m256i cb = s_codebook(qt);
#pragma GCC unroll 8
        for (int ib = 0; ib < 8; ib++) {
            wq[ib] = _mm256_shuffle_epi8(cb, s_nibbles32(b + 8 + 16 * ib));
            sc[ib] = _mm256_set1_epi16((short)s8[ib]);
        }
        *mins = _mm256_setzero_si256();
        return;
    }
    const int three = qt == QT_Q3_K;
    __m128i s8;
    __m256i hb = _mm256_setzero_si256();
    if (three) {
        memcpy(&h, b + 108, 2);
        *d = *dmin = _cvtsh_ss(h);
        s8 = s_q3k_scales(b + 94);
        *mins = _mm256_slli_epi16(_mm256_cvtepi8_epi16(s8), 2);
        hb = _mm256_loadu_si256((const __m256i *)b);
    } else {
        uint32_t dd;
        memcpy(&dd, b + 80, 4);
        const __m128 df = _mm_cvtph_ps(_mm_cvtsi32_si128((int)dd));
        *d = _mm_cvtss_f32(df);
        *dmin = _mm_cvtss_f32(_mm_movehdup_ps(df));
        const __m128i s = _mm_loadu_si128((const __m128i *)b);
        s8 = _mm_and_si128(s, _mm_set1_epi8(15));
        *mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(s, 4), _mm_set1_epi8(15)));
    }
    s_scales16(s8, sc);
    /* vector 4 h + j: bits 2j of qs[32 h + l]; Q3_K: + 4 where bit 4 h + j of hmask[l] is set */
#pragma GCC unroll 2
    for (int hh = 0; hh < 2; hh++) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)(b + (three ? 32 : 16) + 32 * hh));
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            __m256i w = _mm256_and_si256(_mm256_srli_epi16(q, 2 * j), _mm256_set1_epi8(3));
            if (three)
                w = _mm256_or_si256(w, _mm256_and_si256(_mm256_slli_epi16(_mm256_srli_epi16(hb, 4 * hh + j), 2),
                                                        _mm256_set1_epi8(4)));
            wq[4 * hh + j] = w;
        }
    }
}

#endif
