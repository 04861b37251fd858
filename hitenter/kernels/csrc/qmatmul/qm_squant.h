/* Activation quantization for the SIMD builds (split from qm_simd.h): rows of x to the int8 block
 * layouts the kernels read (xl rows for the legacy types, xq256 for the K types). */
#ifndef QM_SQUANT_H
#define QM_SQUANT_H

#include "qm_simd.h"

/* Activation quantization, the same values as the scalar quant_row* (amax is exact; x * id and the
 * round-to-nearest-even conversion are the same fp32 operations), 32 floats at a time. */
QM_INLINE float s_amax(const float *x, int n) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_setzero_ps();
    for (int i = 0; i < n; i += 8) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + i)));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

/* 32 floats -> 32 int8 at out; returns the sums of the first and second 16 in s16[0..1] */
QM_INLINE void s_quant32(const float *x, float id, int8_t *out, int32_t s16[2]) {
    const __m256 vid = _mm256_set1_ps(id);
    __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x), vid));
    __m256i i1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8), vid));
    __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 16), vid));
    __m256i i3 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 24), vid));
    s16[0] = hsum_i32(_mm256_add_epi32(i0, i1));
    s16[1] = hsum_i32(_mm256_add_epi32(i2, i3));
    const __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
    _mm256_storeu_si256((__m256i *)out, _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
}

static void quant_row32(const float *x, int64_t nb, char *o, int off) {
    float *od = (float *)(o + nb * 32), *os = od + xl_nbp(nb);
    int32_t *oc = (int32_t *)(os + xl_nbp(nb));
    for (int64_t b = 0; b < nb; b++, x += 32) {
        const float amax = s_amax(x, 32);
        const float d = amax / 127.0f, id = amax > 0.0f ? 127.0f / amax : 0.0f;
        int32_t s16[2];
        s_quant32(x, id, (int8_t *)o + 32 * b, s16);
        od[b] = d;
        os[b] = d * (float)(s16[0] + s16[1]);
        oc[b] = -off * (s16[0] + s16[1]);
    }
    for (int64_t b = nb; b < xl_nbp(nb); b++) od[b] = os[b] = 0.0f, oc[b] = 0;
}

static void quant_row256(const float *x, int64_t nb, xq256 *o) {
    for (int64_t b = 0; b < nb; b++, x += 256) {
        const float amax = s_amax(x, 256);
        const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
        for (int j = 0; j < 8; j++) {
            int32_t s16[2];
            s_quant32(x + 32 * j, id, o[b].q + 32 * j, s16);
            o[b].bsum[2 * j] = (int16_t)s16[0];
            o[b].bsum[2 * j + 1] = (int16_t)s16[1];
            o[b].bsum32[j] = (int16_t)(s16[0] + s16[1]);
            o[b].off6[2 * j] = -32 * s16[0];
            o[b].off6[2 * j + 1] = -32 * s16[1];
        }
        o[b].d = amax / 127.0f;
        o[b].pad = 0.0f;
    }
}

#endif
