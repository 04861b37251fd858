/* AVX2 / AVX512-VNNI kernels on 256-bit vectors (Zen 4 splits 512-bit ops in two anyway, and
 * AVX512VL gives the 256-bit VNNI forms plus 32 registers).
 *
 * Integer part: weights unpacked to unsigned bytes (Q8_0: |w| with the sign moved onto x), dotted
 * with the int8 activations by dpbusd (VNNI) or maddubs+madd (AVX2); both give the same exact int32
 * lanes. Float part: a fixed per-block scalar sequence on each block's exact integer dot (k_step for
 * the K types, s_grp32 for the legacy ones), which the packed GEMM (qm_pack.h) repeats lane-wise. Nothing depends on R (rows done together) or on which
 * thread runs the row, so every output is batch invariant; built with -ffp-contract=off so the
 * compiler cannot fuse differently in different inlined copies. */
#ifndef QM_SIMD_H
#define QM_SIMD_H

#include <immintrin.h>
#include <math.h>
#include "qm_common.h"

#define QM_INLINE static inline __attribute__((always_inline))
#include "qm_sunpack.h"

#if defined(__AVX512VNNI__) && defined(__AVX512VL__) && defined(__AVX512BW__)
#define QM_VNNI 1
#else
#define QM_VNNI 0
#endif

#define MR 8    /* most activation rows per weight-row pass */

QM_INLINE float s_h2f(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

QM_INLINE __m256i dot_u8s8(__m256i w, __m256i x) {   /* 8 x int32: sums of 4 byte products */
#if QM_VNNI
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), w, x);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1));
#endif
}

QM_INLINE __m256i dot_scaled(__m256i acc, __m256i w, __m256i x, __m256i sc16) {  /* acc += pairs * sc */
#if QM_VNNI
    return _mm256_dpwssd_epi32(acc, _mm256_maddubs_epi16(w, x), sc16);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), sc16));
#endif
}

QM_INLINE __m256i bits_to_0x10(uint32_t qh) {   /* byte j = 0x10 where bit j of qh is set */
#if QM_VNNI
    return _mm256_maskz_set1_epi8((__mmask32)qh, 0x10);
#else
    const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), shuf);
    v = _mm256_or_si256(v, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
    return _mm256_and_si256(_mm256_cmpeq_epi8(v, _mm256_set1_epi64x(-1)), _mm256_set1_epi8(0x10));
#endif
}

QM_INLINE float hsum8(__m256 v) {   /* fixed order: (lo + hi), then pairs, then the last two */
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Legacy activations (SIMD builds), one row of nb blocks laid out as arrays so 4 blocks' scales load
 * as one vector: q[nb][32] int8, then d[nbp], s[nbp] (fp32: d_x and d_x * sum(q)), c[nbp] (int32:
 * -off * sum(q), off = 8 / 16 / 128 / 128 / 12 for Q4_0 / Q5_0 / Q8_0 / IQ4_NL / MXFP4, the weight offset
 * applied exactly in integers), nbp = nb rounded up to 4, padded with zeros. */
static inline int64_t xl_nbp(int64_t nb) { return (nb + 3) & ~(int64_t)3; }
static inline size_t xl_row_bytes(int64_t nb) { return ((size_t)nb * 32 + 12 * (size_t)xl_nbp(nb) + 63) / 64 * 64; }
#define XL_D(x, nb) ((const float *)((const char *)(x) + (nb) * 32))
#define XL_S(x, nb) (XL_D(x, nb) + xl_nbp(nb))
#define XL_C(x, nb) ((const int32_t *)(XL_D(x, nb) + 2 * xl_nbp(nb)))

static inline int qm_off32(int qt) {
    if (qt == QT_Q8_0 || qt == QT_IQ4_NL) return 128;
    return qt == QT_Q4_0 ? 8 : qt == QT_Q5_0 ? 16 : qt == QT_MXFP4 ? QM_MXFP4_OFF : 0;
}

/* legacy block -> 32 weight bytes (unsigned, offset not applied; Q8_0 signed as stored; IQ4_NL / MXFP4:
 * qm_sunpack.h), its scale d and min m (0 for the *_0 types) */
QM_INLINE __m256i unpack32q(const int qt, const uint8_t *b) {
    if (qt == QT_Q8_0) return _mm256_loadu_si256((const __m256i *)(b + 2));
    if (qt == QT_IQ4_NL || qt == QT_MXFP4) return s_unpack32_cb(qt, b);
    const int off = qt == QT_Q4_0 ? 2 : qt == QT_Q4_1 ? 4 : qt == QT_Q5_0 ? 6 : 8;
    /* the 16 bytes in both halves, the high half shifted by 4: low nibbles are elements 0..15 */
    const __m256i q = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(b + off)));
    __m256i v = _mm256_and_si256(_mm256_srlv_epi64(q, _mm256_setr_epi64x(0, 0, 4, 4)), _mm256_set1_epi8(15));
    if (qt == QT_Q5_0 || qt == QT_Q5_1) {
        uint32_t qh;
        memcpy(&qh, b + off - 4, 4);
        v = _mm256_or_si256(v, bits_to_0x10(qh));
    }
    return v;
}

QM_INLINE __m256i unpack32(const int qt, const uint8_t *b, float *d, float *m) {
    *d = qt == QT_MXFP4 ? qm_e8m0_half(b[0]) : s_h2f(b);
    *m = qt == QT_Q4_1 || qt == QT_Q5_1 ? s_h2f(b + 2) : 0.0f;
    return unpack32q(qt, b);
}

/* Legacy types, canonical float part (shared with the packed GEMM, qm_pack.h): block b goes to
 * partial sum a[b % 4], in block order,
 *   a = fma(float(I), d * dx, a)            then, Q4_1/Q5_1 only:   a = fma(m, s_x, a)
 * with I = sum((q_w - off) * q_x) the block's exact integer dot; y = (a0 + a1) + (a2 + a3).
 * Here the 4 partial sums are the lanes of one vector, each group of 4 blocks one vector step. */
QM_INLINE void s_grp32(const int qt, const int bb, const uint8_t *w, int64_t nb, int64_t b0, const int nv,
                       const char *x, int64_t xrow, const int R, __m128 acc[]) {
    /* the 4 blocks' (d, m) fp16 pairs (m: garbage, unused, for the *_0 types) by one conversion */
    __m256i wq[4];
    uint32_t u[4] = {0, 0, 0, 0};
    for (int j = 0; j < 4; j++)
        if (nv == 4 || j < nv) memcpy(u + j, w + (b0 + j) * bb, 4);   /* never past the row */
    __m128i dm;
    if (nv == 4) {
        dm = _mm_setr_epi32((int)u[0], (int)u[1], (int)u[2], (int)u[3]);
        for (int j = 0; j < 4; j++) wq[j] = unpack32q(qt, w + (b0 + j) * bb);
    } else {   /* the last group: missing blocks are zero, lanes inserted in registers (the scalar
                * path's arrays, re-read as vectors, stalled store forwarding: 1/4 of a 576-wide row) */
        dm = _mm_cvtsi32_si128((int)u[0]);
        wq[0] = unpack32q(qt, w + b0 * bb);
        wq[1] = wq[2] = wq[3] = _mm256_setzero_si256();
        if (nv > 1) dm = _mm_insert_epi32(dm, (int)u[1], 1), wq[1] = unpack32q(qt, w + (b0 + 1) * bb);
        if (nv > 2) dm = _mm_insert_epi32(dm, (int)u[2], 2), wq[2] = unpack32q(qt, w + (b0 + 2) * bb);
    }
    const __m256 f = _mm256_cvtph_ps(dm);
    const __m128 lo = _mm256_castps256_ps128(f), hi = _mm256_extractf128_ps(f, 1);
    const __m128 d4 = qt == QT_MXFP4 ? s_e8m0_half4(dm) : _mm_shuffle_ps(lo, hi, _MM_SHUFFLE(2, 0, 2, 0));
    const __m128 m4 = _mm_shuffle_ps(lo, hi, _MM_SHUFFLE(3, 1, 3, 1));
    /* Q8_0: with VNNI (exact u8 x s8 sums) the stored bytes + 128, the offset back through c as for the
     * 4/5-bit types; AVX2's maddubs would saturate there, so |w| with the sign moved onto x instead */
    const int q8sign = QM_SIGNED32(qt) && !QM_VNNI;
    __m256i wabs[4];
    if (q8sign)
        for (int j = 0; j < 4; j++) wabs[j] = _mm256_sign_epi8(wq[j], wq[j]);
    else if (QM_SIGNED32(qt))
        for (int j = 0; j < 4; j++) wq[j] = _mm256_xor_si256(wq[j], _mm256_set1_epi8((char)0x80));
    for (int r = 0; r < R; r++) {
        const char *xr = x + r * xrow;
        __m256i v[4];
        for (int j = 0; j < 4; j++) {
            __m256i xv = j < nv ? _mm256_loadu_si256((const __m256i *)(xr + 32 * (b0 + j))) : _mm256_setzero_si256();
            if (q8sign) v[j] = dot_u8s8(wabs[j], _mm256_sign_epi8(xv, wq[j]));   /* exact w . x, no offset */
            else v[j] = dot_u8s8(wq[j], xv);
        }
        /* the 4 blocks' lane sums (a transpose by unpacks: single-uop ops) */
        const __m256i a = _mm256_add_epi32(_mm256_unpacklo_epi32(v[0], v[1]), _mm256_unpackhi_epi32(v[0], v[1]));
        const __m256i c = _mm256_add_epi32(_mm256_unpacklo_epi32(v[2], v[3]), _mm256_unpackhi_epi32(v[2], v[3]));
        const __m256i h = _mm256_add_epi32(_mm256_unpacklo_epi64(a, c), _mm256_unpackhi_epi64(a, c));
        __m128i I = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
        if (!q8sign) I = _mm_add_epi32(I, _mm_loadu_si128((const __m128i *)(XL_C(xr, nb) + b0)));
        acc[r] = _mm_fmadd_ps(_mm_cvtepi32_ps(I), _mm_mul_ps(d4, _mm_loadu_ps(XL_D(xr, nb) + b0)), acc[r]);
        if (qt == QT_Q4_1 || qt == QT_Q5_1) acc[r] = _mm_fmadd_ps(m4, _mm_loadu_ps(XL_S(xr, nb) + b0), acc[r]);
    }
}

QM_INLINE void s_row32(const int qt, const int bb, const uint8_t *w, int64_t nb, const char *x, int64_t xrow,
                       const int R, float *y, int64_t ldy) {
    __m128 acc[MR];
    for (int r = 0; r < R; r++) acc[r] = _mm_setzero_ps();
    int64_t b = 0;
    for (; b + 4 <= nb; b += 4) s_grp32(qt, bb, w, nb, b, 4, x, xrow, R, acc);
    if (b < nb) s_grp32(qt, bb, w, nb, b, (int)(nb - b), x, xrow, R, acc);
    for (int r = 0; r < R; r++) {
        const __m128 t = _mm_add_ps(acc[r], _mm_movehdup_ps(acc[r]));      /* a0 + a1, a2 + a3 */
        y[r * ldy] = _mm_cvtss_f32(_mm_add_ss(t, _mm_movehl_ps(t, t)));
    }
}

/* Q4_K/Q5_K 6-bit scales and mins (the 12 bytes at s12; 16 are read) -> bytes sc0..sc7, m0..m7:
 *   j < 4:  sc_j = s[j] & 63,                          m_j = s[j + 4] & 63
 *   j >= 4: sc_j = (s[j + 4] & 15) | (s[j - 4] >> 6) << 4,  m_j = (s[j + 4] >> 4) | (s[j] >> 6) << 4 */
QM_INLINE __m128i k4_scales_vec(const uint8_t *s12) {
    const __m128i v = _mm_loadu_si128((const __m128i *)s12);
    const __m128i a = _mm_shuffle_epi8(v, _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11));
    const __m128i h = _mm_shuffle_epi8(v, _mm_setr_epi8(-1, -1, -1, -1, 0, 1, 2, 3, -1, -1, -1, -1, 4, 5, 6, 7));
    const __m128i lo = _mm_and_si128(_mm_blend_epi32(a, _mm_srli_epi16(a, 4), 8),   /* m4..m7: high nibbles */
                                     _mm_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f));
    return _mm_or_si128(lo, _mm_and_si128(_mm_srli_epi16(h, 2), _mm_set1_epi8(0x30)));
}

/* K block -> 8 x 32 weight bytes, the per-16 scale of each (int16 lanes matching maddubs pairs),
 * the per-16 min multipliers (Q6_K: 32 * scale, the offset), d and dmin */
QM_INLINE void unpack256(const int qt, const uint8_t *b, __m256i wq[8], __m256i sc[8], __m256i *mins, float *d,
                         float *dmin) {
    if (qt == QT_Q2_K || qt == QT_Q3_K || qt == QT_IQ4_XS) {
        s_unpack256_low(qt, b, wq, sc, mins, d, dmin);
        return;
    }
    const __m256i m4 = _mm256_set1_epi8(15);
    if (qt == QT_Q6_K) {
        *d = *dmin = s_h2f(b + 208);
        const __m128i s8 = _mm_loadu_si128((const __m128i *)(b + 192));
        *mins = _mm256_slli_epi16(_mm256_cvtepi8_epi16(s8), 5);
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            const __m256i q0 = _mm256_loadu_si256((const __m256i *)(b + 64 * h));
            const __m256i q1 = _mm256_loadu_si256((const __m256i *)(b + 64 * h + 32));
            const __m256i hh = _mm256_loadu_si256((const __m256i *)(b + 128 + 32 * h));
            wq[4 * h + 0] = _mm256_or_si256(_mm256_and_si256(q0, m4), _mm256_slli_epi16(_mm256_and_si256(hh, _mm256_set1_epi8(3)), 4));
            wq[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(q1, m4), _mm256_slli_epi16(_mm256_and_si256(hh, _mm256_set1_epi8(12)), 2));
            wq[4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q0, 4), m4), _mm256_and_si256(hh, _mm256_set1_epi8(48)));
            wq[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q1, 4), m4),
                                            _mm256_and_si256(_mm256_srli_epi16(hh, 2), _mm256_set1_epi8(48)));
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) {
                const long long g = 8 * h + 2 * k;
                const __m128i shuf = _mm_set_epi64x(0x0101010101010101LL * (g + 1), 0x0101010101010101LL * g);
                sc[4 * h + k] = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(s8, shuf));
            }
        }
        return;
    }
    uint32_t dd;
    memcpy(&dd, b, 4);
    const __m128 df = _mm_cvtph_ps(_mm_cvtsi32_si128((int)dd));   /* d, dmin by one conversion */
    *d = _mm_cvtss_f32(df);
    *dmin = _mm_cvtss_f32(_mm_movehdup_ps(df));
    /* the 8 scales and 8 mins as bytes of one vector, decoded in vector registers: the scalar
     * decode (qm_k4_scales) and its trips between register files took a third of a decode GEMV */
    const __m256i sm = _mm256_broadcastsi128_si256(k4_scales_vec(b + 4));
    *mins = _mm256_shuffle_epi8(sm, _mm256_setr_epi8(8, -1, 8, -1, 9, -1, 9, -1, 10, -1, 10, -1, 11, -1, 11, -1, 12, -1,
                                                     12, -1, 13, -1, 13, -1, 14, -1, 14, -1, 15, -1, 15, -1));
    const int five = qt == QT_Q5_K;
    __m256i hh = five ? _mm256_loadu_si256((const __m256i *)(b + 16)) : _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)(b + (five ? 48 : 16) + 32 * c));
        wq[2 * c] = _mm256_and_si256(q, m4);
        wq[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
        if (five) {   /* bit 2c of qh[l] is bit 4 of element l of sub-block 2c, bit 2c+1 of 2c+1 */
            const __m256i x10 = _mm256_set1_epi8(0x10);
            wq[2 * c] = _mm256_or_si256(wq[2 * c], _mm256_and_si256(_mm256_slli_epi16(hh, 4), x10));
            wq[2 * c + 1] = _mm256_or_si256(wq[2 * c + 1], _mm256_and_si256(_mm256_slli_epi16(hh, 3), x10));
            hh = _mm256_srli_epi16(hh, 2);
        }
        /* scale j zero-extended to every word by one byte shuffle */
        sc[2 * c] = _mm256_shuffle_epi8(sm, _mm256_set1_epi16((short)(0x8000 | (2 * c))));
        sc[2 * c + 1] = _mm256_shuffle_epi8(sm, _mm256_set1_epi16((short)(0x8000 | (2 * c + 1))));
    }
}

QM_INLINE int32_t hsum_i32(__m256i v) {   /* exact: integer adds */
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 1));
    return _mm_cvtsi128_si32(s);
}

/* K types, canonical float part (shared with the packed GEMM, qm_pack.h): per block, in block order,
 *   acc = fma(float(I), d * dx, acc); acc = fma(-float(Mn), dmin * dx, acc)       (QM_KMIN: Q2_K, Q4_K, Q5_K)
 *   acc = fma(float(I - Mn), d * dx, acc)                                         (Q3_K, Q6_K, IQ4_XS)
 * with I = sum_g sc_g (q . x)_g and Mn = sum_g mn_g bsum_g the block's exact integer sums. */
QM_INLINE float k_step(const int qt, float acc, int32_t I, int32_t Mn, float d, float dmin, float dx) {
    if (!QM_KMIN(qt)) return fmaf((float)(I - Mn), d * dx, acc);
    acc = fmaf((float)I, d * dx, acc);
    return fmaf(-(float)Mn, dmin * dx, acc);
}

/* k_step on lane 0 of vectors, the sums already converted (t: I - Mn in lane 0 for !QM_KMIN; I in lane 0
 * and Mn in lane 2 otherwise): the same fp32 operations without moving the integer sums through
 * general registers and back (vmovd + cvtsi2ss sat on the critical path of every block) */
QM_INLINE __m128 k_step_v(const int qt, __m128 acc, __m128 t, float d, float dmin, float dx) {
    const __m128 dxv = _mm_set_ss(dx);
    acc = _mm_fmadd_ss(t, _mm_mul_ss(_mm_set_ss(d), dxv), acc);
    if (QM_KMIN(qt)) acc = _mm_fnmadd_ss(_mm_movehl_ps(t, t), _mm_mul_ss(_mm_set_ss(dmin), dxv), acc);
    return acc;
}

/* Integer part: sub-block j goes to chain j % NC of its row (NC chains per row keep the multipliers
 * busy when R is small; integer sums are exact, so NC changes no bits). Sub-blocks outer, rows inner:
 * the R rows are independent instruction streams. */
/* an empty asm that says it rewrites v: the add chain into v stays a chain in one register (GCC otherwise
 * reassociates the integer sums into a tree over all 8 products of each row, with every product spilled to the
 * stack and reloaded) */
#define QM_KEEP(v) __asm__("" : "+x"(v))

/* lane r (r < R): the sum of v[r]'s 8 int32 lanes, lanes from R on 0 (integer adds: exact) */
QM_INLINE __m256i hsum_rows8(const __m256i *v, const int R) {
    __m256i u[8];
    for (int r = 0; r < 8; r++) u[r] = r < R ? v[r] : _mm256_setzero_si256();
    const __m256i h01 = _mm256_hadd_epi32(u[0], u[1]), h23 = _mm256_hadd_epi32(u[2], u[3]);
    const __m256i h45 = _mm256_hadd_epi32(u[4], u[5]), h67 = _mm256_hadd_epi32(u[6], u[7]);
    /* a: rows 0-3's sums of lanes 0-3 | of lanes 4-7; b: rows 4-7's */
    const __m256i a = _mm256_hadd_epi32(h01, h23), b = _mm256_hadd_epi32(h45, h67);
    return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31));
}

/* Q4_K / Q5_K / Q6_K rows: each block unpacked a part at a time (Q4_K/Q5_K: one 32-byte chunk of qs, two
 * sub-blocks; Q6_K: half a block, four), each part dotted with all R rows before the next is unpacked, so
 * the weights and scales in flight are a few registers beside the R accumulators (QM_KEEP). From 3 rows the
 * block's R integer sums are reduced together (hsum_rows8) and the float steps run in lane r of one vector
 * (one reduction per block instead of one per row, one accumulator register instead of R). Same integer sums
 * (exact, any order) and the same float operations per row (k_step_v's, lane-wise): the same bits. */
/* One row's block sums for k_step_v: I - Mn in lane 0 (exact in integers), or lanes [I I Mn Mn] where
 * the type keeps the mins' sum apart (QM_KMIN). */
QM_INLINE __m128i k_block_sums(const int qt, const __m256i is, const __m256i ms) {
    __m128i t;
    if (!QM_KMIN(qt)) {
        const __m256i v = _mm256_sub_epi32(is, ms);
        t = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
        t = _mm_add_epi32(t, _mm_unpackhi_epi64(t, t));
        return _mm_add_epi32(t, _mm_shuffle_epi32(t, 1));
    }
    const __m256i h = _mm256_hadd_epi32(is, ms);
    t = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
    return _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xb1));
}

QM_INLINE void s_row256_k(const int qt, const uint8_t *w, int64_t bb, int64_t nb, const xq256 *x, int64_t xrow,
                          const int R, float *y, int64_t ldy) {
    enum { NCMAX = 4 };
    const int NC = R >= 4 ? 1 : R >= 2 ? 2 : 4;
    const __m256i m4 = _mm256_set1_epi8(15);
    __m128 acc[MR];   /* R <= 2: row r's sum in lane 0 of acc[r]; R >= 3: in lane r of accv */
    __m256 accv = _mm256_setzero_ps();
    for (int r = 0; r < R; r++) acc[r] = _mm_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = w + b * bb;
        __m256i is[MR][NCMAX], mins;
        float d, dmin;
        for (int r = 0; r < R; r++)
            for (int c = 0; c < NC; c++) is[r][c] = _mm256_setzero_si256();
        if (qt == QT_Q6_K) {
            d = dmin = s_h2f(blk + 208);
            const __m128i s8 = _mm_loadu_si128((const __m128i *)(blk + 192));
            mins = _mm256_slli_epi16(_mm256_cvtepi8_epi16(s8), 5);
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                const __m256i q0 = _mm256_loadu_si256((const __m256i *)(blk + 64 * h));
                const __m256i q1 = _mm256_loadu_si256((const __m256i *)(blk + 64 * h + 32));
                const __m256i hh = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * h));
#pragma GCC unroll 4
                for (int k = 0; k < 4; k++) {   /* unpack256's wq[4h + k] */
                    const __m256i lo = _mm256_and_si256(k & 2 ? _mm256_srli_epi16(k & 1 ? q1 : q0, 4) : (k & 1 ? q1 : q0), m4);
                    const __m256i hb = k == 0 ? _mm256_slli_epi16(_mm256_and_si256(hh, _mm256_set1_epi8(3)), 4)
                                     : k == 1 ? _mm256_slli_epi16(_mm256_and_si256(hh, _mm256_set1_epi8(12)), 2)
                                     : k == 2 ? _mm256_and_si256(hh, _mm256_set1_epi8(48))
                                              : _mm256_and_si256(_mm256_srli_epi16(hh, 2), _mm256_set1_epi8(48));
                    const __m256i wq = _mm256_or_si256(lo, hb);
                    const int j = 4 * h + k;
                    const long long g = 8 * h + 2 * k;
                    const __m128i shuf = _mm_set_epi64x(0x0101010101010101LL * (g + 1), 0x0101010101010101LL * g);
                    const __m256i sc = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(s8, shuf));
                    for (int r = 0; r < R; r++) {
                        const __m256i xv = _mm256_loadu_si256((const __m256i *)(x[r * xrow + b].q + 32 * j));
                        is[r][j % NC] = dot_scaled(is[r][j % NC], wq, xv, sc);
                        QM_KEEP(is[r][j % NC]);
                    }
                }
            }
        } else {
            uint32_t dd;
            memcpy(&dd, blk, 4);
            const __m128 df = _mm_cvtph_ps(_mm_cvtsi32_si128((int)dd));
            d = _mm_cvtss_f32(df);
            dmin = _mm_cvtss_f32(_mm_movehdup_ps(df));
            const __m256i sm = _mm256_broadcastsi128_si256(k4_scales_vec(blk + 4));
            mins = _mm256_shuffle_epi8(sm, _mm256_setr_epi8(8, -1, 8, -1, 9, -1, 9, -1, 10, -1, 10, -1, 11, -1, 11, -1, 12,
                                                            -1, 12, -1, 13, -1, 13, -1, 14, -1, 14, -1, 15, -1, 15, -1));
            const int five = qt == QT_Q5_K;
            __m256i hh = five ? _mm256_loadu_si256((const __m256i *)(blk + 16)) : _mm256_setzero_si256();
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++) {   /* unpack256's wq[2c], wq[2c + 1], sc[2c], sc[2c + 1] */
                const __m256i q = _mm256_loadu_si256((const __m256i *)(blk + (five ? 48 : 16) + 32 * c));
                __m256i w0 = _mm256_and_si256(q, m4), w1 = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
                if (five) {
                    const __m256i x10 = _mm256_set1_epi8(0x10);
                    w0 = _mm256_or_si256(w0, _mm256_and_si256(_mm256_slli_epi16(hh, 4), x10));
                    w1 = _mm256_or_si256(w1, _mm256_and_si256(_mm256_slli_epi16(hh, 3), x10));
                    hh = _mm256_srli_epi16(hh, 2);
                }
                const __m256i s0 = _mm256_shuffle_epi8(sm, _mm256_set1_epi16((short)(0x8000 | (2 * c))));
                const __m256i s1 = _mm256_shuffle_epi8(sm, _mm256_set1_epi16((short)(0x8000 | (2 * c + 1))));
                for (int r = 0; r < R; r++) {
                    const int8_t *xq = x[r * xrow + b].q + 64 * c;
                    is[r][(2 * c) % NC] = dot_scaled(is[r][(2 * c) % NC], w0, _mm256_loadu_si256((const __m256i *)xq), s0);
                    QM_KEEP(is[r][(2 * c) % NC]);
                    is[r][(2 * c + 1) % NC] = dot_scaled(is[r][(2 * c + 1) % NC], w1,
                                                         _mm256_loadu_si256((const __m256i *)(xq + 32)), s1);
                    QM_KEEP(is[r][(2 * c + 1) % NC]);
                }
            }
        }
        if (R >= 3) {   /* the R rows' sums reduced together, their float steps in the lanes of one vector */
            __m256i iv[MR], mv[MR];
            for (int r = 0; r < R; r++) {
                for (int c = 1; c < NC; c++) is[r][0] = _mm256_add_epi32(is[r][0], is[r][c]);
                mv[r] = _mm256_madd_epi16(mins, _mm256_loadu_si256((const __m256i *)x[r * xrow + b].bsum));
                iv[r] = QM_KMIN(qt) ? is[r][0] : _mm256_sub_epi32(is[r][0], mv[r]);
            }
#define QM_DX(r) ((r) < R ? x[(r) * xrow + b].d : 0.0f)
            const __m256 dxv = _mm256_setr_ps(QM_DX(0), QM_DX(1), QM_DX(2), QM_DX(3), QM_DX(4), QM_DX(5), QM_DX(6), QM_DX(7));
#undef QM_DX
            /* k_step_v lane-wise: fma(I, d * dx, acc), then fnma(Mn, dmin * dx, acc) (I - Mn for Q6_K) */
            accv = _mm256_fmadd_ps(_mm256_cvtepi32_ps(hsum_rows8(iv, R)), _mm256_mul_ps(_mm256_set1_ps(d), dxv), accv);
            if (QM_KMIN(qt))
                accv = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(hsum_rows8(mv, R)), _mm256_mul_ps(_mm256_set1_ps(dmin), dxv), accv);
            continue;
        }
        for (int r = 0; r < R; r++) {
            const xq256 *xb = x + r * xrow + b;
            for (int c = 1; c < NC; c++) is[r][0] = _mm256_add_epi32(is[r][0], is[r][c]);
            const __m256i ms = _mm256_madd_epi16(mins, _mm256_loadu_si256((const __m256i *)xb->bsum));
            acc[r] = k_step_v(qt, acc[r], _mm_cvtepi32_ps(k_block_sums(qt, is[r][0], ms)), d, dmin, xb->d);
        }
    }
    if (R >= 3) {
        float out[8];
        _mm256_storeu_ps(out, accv);
        for (int r = 0; r < R; r++) y[r * ldy] = out[r];
        return;
    }
    for (int r = 0; r < R; r++) y[r * ldy] = _mm_cvtss_f32(acc[r]);
}

#ifndef QM_ROW_K_PARTS
#define QM_ROW_K_PARTS 1   /* 0: Q4_K/Q5_K/Q6_K rows through unpack256 (the other K types' path; to compare) */
#endif

QM_INLINE void s_row256(const int qt, const int bb, const uint8_t *w, int64_t nb, const xq256 *x, int64_t xrow,
                        const int R, float *y, int64_t ldy) {
    if (QM_ROW_K_PARTS && (qt == QT_Q4_K || qt == QT_Q5_K || qt == QT_Q6_K)) {
        s_row256_k(qt, w, bb, nb, x, xrow, R, y, ldy);
        return;
    }
    enum { NCMAX = 4 };
    const int NC = R >= 4 ? 1 : R >= 2 ? 2 : 4;
    __m128 acc[MR];
    for (int r = 0; r < R; r++) acc[r] = _mm_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        __m256i wq[8], sc[8], mins, is[MR][NCMAX], ws[8];
        float d, dmin;
        unpack256(qt, w + b * bb, wq, sc, &mins, &d, &dmin);
        if (qt == QT_IQ4_XS)   /* signed weights: |w| . sign(x, w), as the legacy Q8_0 without VNNI */
            for (int j = 0; j < 8; j++) ws[j] = wq[j], wq[j] = _mm256_abs_epi8(wq[j]);
        for (int r = 0; r < R; r++)
            for (int c = 0; c < NC; c++) is[r][c] = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++)
            for (int r = 0; r < R; r++) {
                __m256i xv = _mm256_loadu_si256((const __m256i *)(x[r * xrow + b].q + 32 * j));
                if (qt == QT_IQ4_XS) xv = _mm256_sign_epi8(xv, ws[j]);
                is[r][j % NC] = dot_scaled(is[r][j % NC], wq[j], xv, sc[j]);
            }
        for (int r = 0; r < R; r++) {
            const xq256 *xb = x + r * xrow + b;
            for (int c = 1; c < NC; c++) is[r][0] = _mm256_add_epi32(is[r][0], is[r][c]);
            const __m256i ms = qt == QT_IQ4_XS ? _mm256_setzero_si256()
                                               : _mm256_madd_epi16(mins, _mm256_loadu_si256((const __m256i *)xb->bsum));
            acc[r] = k_step_v(qt, acc[r], _mm_cvtepi32_ps(k_block_sums(qt, is[r][0], ms)), d, dmin, xb->d);
        }
    }
    for (int r = 0; r < R; r++) y[r * ldy] = _mm_cvtss_f32(acc[r]);
}

#endif
