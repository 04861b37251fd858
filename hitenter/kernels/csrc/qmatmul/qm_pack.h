/* Packed GEMM (prefill and batches, M >= PACK_MIN_M32 / PACK_MIN_M256), K types and (pblock32, p_kern32) legacy types: PN weight
 * rows (16 with VNNI, 8 otherwise; qm_pvec.h) are unpacked once per call into an interleaved layout
 * whose PN int32 lanes are PN output columns, so the weight scales, mins and d are plain vectors
 * across lanes and no horizontal sums are needed: per 4 activation bytes one broadcast and one
 * dpbusd for PN outputs (AVX2 without VNNI: qm_pack_avx2.h's microkernels on the same layout).
 * Unpacking is amortized over all M rows.
 *
 * Bits: each (m, n) lane takes exactly the integer sums I and Mn of the row path (Q6_K: I - Mn,
 * the offset entering through each group's starting value; Q4_K/Q5_K: Mn from per-32 activation
 * sums) and the same float steps (k_step in qm_simd.h; s_grp32 for the legacy types), in block
 * order, so the packed and the row path agree bitwise and the result of a row never depends on M
 * (tested). */
#ifndef QM_PACK_H
#define QM_PACK_H

#include <stddef.h>
#include <stdlib.h>
#include "qm_pvec.h"

/* PN (qm_pvec.h): weight rows per packed group, the lanes of one vector */
#define PG (32 / PN)  /* packed groups per pass (32 weight rows share each activation row's trip from L2) */
#define PR 8          /* most activation rows per microkernel call */
/* activation rows per call of the packed GEMM's tiles (-DPT=4 to try; on AVX2, 8 rows are no slower than 4
 * even though 8 rows' accumulators exceed the 16 ymm registers: the int32/fp32 ones spill once per scale group, the int16 ones stay in registers) */
#ifndef PT
#define PT 8
#endif
/* From how many activation rows the packed GEMM beats the row path, by block width (the measured
   crossovers: docs/benchmarks.md; both paths give the same bits, so this is only a speed choice): 32-wide
   types unpack cheaply per row, K types less so. */
#ifndef PACK_MIN_M32
#define PACK_MIN_M32 6
#endif
#ifndef PACK_MIN_M256
#define PACK_MIN_M256 9
#endif
/* AVX2 without VNNI, the K types: the row path up to 16 rows (two balanced runs of its register instances,
   still one pass over the weights), the packed GEMM from 17, where it
   starts to win on weights streamed from DRAM (the measured crossover: docs/benchmarks.md). */
#ifndef PACK_MIN_M256_A2
#define PACK_MIN_M256_A2 17
#endif
/* from how many activation rows the K types (256-element blocks) take the packed GEMM on this ISA */
#define PACK_MIN_K (QM_VNNI ? PACK_MIN_M256 : PACK_MIN_M256_A2)

typedef struct {
    uint8_t q[64][4 * PN];  /* [dword e4 of the block][lane n * 4 + byte]: weights unsigned */
    int32_t sc[16][PN];   /* scale of group g per lane (32-element groups for Q4_K/Q5_K/IQ4_XS, else 16) */
    int32_t mn[8][PN];    /* int16 pairs (m_2i, m_2i+1) of the mins per lane: Q4_K/Q5_K per-32 (i < 4), Q2_K
                           * per-16 (i < 8); the other types have none */
    float d[PN], dmin[PN];
} pblock;

/* r[i] = dword i of the 8 rows r[0..7] (an 8 x 8 dword transpose, 24 one-uop shuffles), stored
 * stride bytes apart: packing 16 rows costs a few hundred shuffles per block instead of 1024 scalar
 * 4-byte copies (packing was a fifth of the time at M = 64) */
QM_INLINE void tr8x8_store(const __m256i r[8], uint8_t *dst, size_t stride) {
    __m256i t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        u[i] = _mm256_unpacklo_epi64(t[i], t[i + 2]);
        u[i + 1] = _mm256_unpackhi_epi64(t[i], t[i + 2]);
        u[i + 2] = _mm256_unpacklo_epi64(t[i + 1], t[i + 3]);
        u[i + 3] = _mm256_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    for (int i = 0; i < 4; i++) {
        _mm256_storeu_si256((__m256i *)(dst + i * stride), _mm256_permute2x128_si256(u[i], u[i + 4], 0x20));
        _mm256_storeu_si256((__m256i *)(dst + (i + 4) * stride), _mm256_permute2x128_si256(u[i], u[i + 4], 0x31));
    }
}

/* rows [0, nrows) of w (nrows <= PN; missing lanes are zero) -> nb packed blocks */
static void pack8(const int qt, const int bb, const uint8_t *w, int64_t ldw, int nrows, int64_t nb, pblock *p) {
    for (int64_t b = 0; b < nb; b++) {
        pblock *pb = p + b;
        __m256i st[PN][8];   /* the rows' unpacked bytes, 32 per vector */
        memset(pb->sc, 0, sizeof(pblock) - offsetof(pblock, sc));
        for (int n = 0; n < PN; n++) {
            if (n >= nrows) {
                for (int j = 0; j < 8; j++) st[n][j] = _mm256_setzero_si256();
                continue;
            }
            const uint8_t *blk = w + n * ldw + b * bb;
            __m256i sc[8], mins;
            float d, dmin;
            int16_t mn16[16];
            unpack256(qt, blk, st[n], sc, &mins, &d, &dmin);
            _mm256_storeu_si256((__m256i *)mn16, mins);
            if (qt == QT_Q6_K) {   /* AVX2: q - 32, signed (qm_pack_avx2.h: |w| . sign(x, w), no offset term) */
                for (int g = 0; g < 16; g++) pb->sc[g][n] = (int8_t)blk[192 + g];
                for (int j = 0; j < 8 && !QM_VNNI; j++) st[n][j] = _mm256_sub_epi8(st[n][j], _mm256_set1_epi8(32));
            } else if (qt == QT_Q2_K) {
                for (int g = 0; g < 16; g++) pb->sc[g][n] = blk[g] & 15;
            } else if (qt == QT_Q3_K) {
                int s16[16];
                qm_q3k_scales(blk + 96, s16);
                for (int g = 0; g < 16; g++) pb->sc[g][n] = s16[g];
            } else if (qt == QT_IQ4_XS) {   /* VNNI: + 128, unsigned for dpbusd, -128 * sum(x) from t's start */
                int s8[8];
                qm_iq4xs_scales(blk, s8);
                for (int g = 0; g < 8; g++) pb->sc[g][n] = s8[g];
                for (int j = 0; j < 8 && QM_VNNI; j++)
                    st[n][j] = _mm256_xor_si256(st[n][j], _mm256_set1_epi8((char)0x80));
            } else {
                uint32_t u[4];
                qm_k4_scales(blk + 4, u);
                for (int g = 0; g < 8; g++) pb->sc[g][n] = ((const uint8_t *)u)[g];
            }
            /* mn16: the 16 per-16 mins, as int16 pairs: Q2_K's, and on AVX2 Q3_K's offset * scale
             * (qm_pack_avx2.h takes their offsets off I this way) */
            if (qt == QT_Q2_K || (!QM_VNNI && qt == QT_Q3_K))
                for (int i = 0; i < 8; i++)
                    pb->mn[i][n] = (int32_t)((uint32_t)(uint16_t)mn16[2 * i]
                                             | ((uint32_t)(uint16_t)mn16[2 * i + 1] << 16));
            for (int i = 0; i < 4 && (qt == QT_Q4_K || qt == QT_Q5_K); i++)   /* mn16: each per-32 min twice */
                pb->mn[i][n] = (int32_t)((uint32_t)(uint16_t)mn16[4 * i] | ((uint32_t)(uint16_t)mn16[4 * i + 2] << 16));
            for (int g = 0; g < 16 && !QM_VNNI; g++)   /* AVX2: each scale in both int16 halves (a madd operand) */
                pb->sc[g][n] = (int32_t)((uint32_t)(uint16_t)(int16_t)pb->sc[g][n] * 0x10001u);
            pb->d[n] = d;
            pb->dmin[n] = dmin;
        }
        for (int j = 0; j < 8; j++)        /* dword i of vector j is dword 8j + i of the block */
            for (int h = 0; h < PN / 8; h++) {
                __m256i r[8];
                for (int i = 0; i < 8; i++) r[i] = st[8 * h + i][j];
                tr8x8_store(r, pb->q[8 * j] + 32 * h, 4 * PN);
            }
    }
}

/* y[r, 0..nvalid) for R activation rows against one packed group */
QM_INLINE void p_kern(const int qt, const pblock *p, int64_t nb, const xq256 *x, int64_t xrow, const int R,
                      float *y, int64_t ldy, int nvalid) {
    const int GS = qt == QT_Q4_K || qt == QT_Q5_K || qt == QT_IQ4_XS ? 8 : 4;    /* dwords per scale group */
    const int sgn = qt == QT_IQ4_XS && !QM_VNNI;   /* signed weights, the sign moved onto x (pv_sign8) */
    pvf acc[PR];
    for (int r = 0; r < R; r++) acc[r] = pf_zero();
    for (int64_t b = 0; b < nb; b++) {
        const pblock *pb = p + b;
        pvi I[PR], Mn[PR];
        for (int r = 0; r < R; r++) I[r] = Mn[r] = pv_zero();
#pragma GCC unroll 2
        for (int g = 0; g < 64 / GS; g++) {
            pvi t[PR];   /* from -offset * sum(x) over the group (Q6_K 32, Q3_K 4, IQ4_XS 128 with VNNI), so
                          * I - Mn comes out of the dots and scales directly */
            for (int r = 0; r < R; r++) {
                const xq256 *xb = x + r * xrow + b;
                t[r] = qt == QT_Q6_K ? pv_set1(xb->off6[g]) : qt == QT_Q3_K ? pv_set1(-4 * xb->bsum[g])
                     : qt == QT_IQ4_XS && !sgn ? pv_set1(-128 * xb->bsum32[g]) : pv_zero();
            }
#pragma GCC unroll 8
            for (int k = 0; k < GS; k++) {
                const int e4 = g * GS + k;
                const pvi wv = pv_load(pb->q[e4]), wa = sgn ? pv_abs8(wv) : wv;
                for (int r = 0; r < R; r++) {
                    int32_t xv;
                    memcpy(&xv, x[r * xrow + b].q + 4 * e4, 4);
                    t[r] = pv_dpbusd(t[r], wa, sgn ? pv_sign8(pv_set1(xv), wv) : pv_set1(xv));
                }
            }
            const pvi s = pv_load(pb->sc[g]);
            for (int r = 0; r < R; r++) I[r] = pv_add(I[r], pv_mullo(t[r], s));
        }
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) {   /* Q4_K/Q5_K: 4 pairs of per-32 sums, Q2_K: 8 of per-16 sums */
            if (!QM_KMIN(qt) || (i >= 4 && qt != QT_Q2_K)) continue;
            const pvi mv = pv_load(pb->mn[i]);
            for (int r = 0; r < R; r++) {
                int32_t bs;
                memcpy(&bs, (qt == QT_Q2_K ? x[r * xrow + b].bsum : x[r * xrow + b].bsum32) + 2 * i, 4);
                Mn[r] = pv_dpwssd(Mn[r], mv, pv_set1(bs));
            }
        }
        const pvf dv = pf_load(pb->d), dmv = pf_load(pb->dmin);
        for (int r = 0; r < R; r++) {   /* k_step, lane-wise */
            const pvf dx = pf_set1(x[r * xrow + b].d);
            if (!QM_KMIN(qt)) {   /* I already holds I - Mn */
                acc[r] = pf_fmadd(pf_cvt(I[r]), pf_mul(dv, dx), acc[r]);
            } else {
                acc[r] = pf_fmadd(pf_cvt(I[r]), pf_mul(dv, dx), acc[r]);
                acc[r] = pf_fnmadd(pf_cvt(Mn[r]), pf_mul(dmv, dx), acc[r]);
            }
        }
    }
    for (int r = 0; r < R; r++) {   /* whole groups stored directly (a memcpy of nvalid floats was a libc call) */
        const pvf v = acc[r];
        if (nvalid == PN) {
            pf_storeu(y + r * ldy, v);
            continue;
        }
        float tmp[PN];
        pf_storeu(tmp, v);
        memcpy(y + r * ldy, tmp, (size_t)nvalid * sizeof(float));
    }
}

/* Legacy types: 8 weight rows per group, per block 32 bytes each (signed Q8_0 / IQ4_NL: + 128 with VNNI,
 * unsigned for dpbusd, the -128 * sum(x) coming back through the activations' c; as stored without VNNI,
 * |w| . sign(x, w)), d and m per lane. */
typedef struct {
    uint8_t q[8][4 * PN];  /* [dword e4 of the block][lane n * 4 + byte] */
    float d[PN], m[PN];
} pblock32;

static void pack8_32(const int qt, const int bb, const uint8_t *w, int64_t ldw, int nrows, int64_t nb, pblock32 *p) {
    for (int64_t b = 0; b < nb; b++) {
        pblock32 *pb = p + b;
        __m256i st[PN];
        for (int n = 0; n < PN; n++) {
            float d = 0.0f, m = 0.0f;
            st[n] = _mm256_setzero_si256();
            if (n < nrows) {
                st[n] = unpack32(qt, w + n * ldw + b * bb, &d, &m);
                if (QM_SIGNED32(qt) && QM_VNNI) st[n] = _mm256_xor_si256(st[n], _mm256_set1_epi8((char)0x80));
            }
            pb->d[n] = d;
            pb->m[n] = m;
        }
        for (int h = 0; h < PN / 8; h++) tr8x8_store(st + 8 * h, pb->q[0] + 32 * h, 4 * PN);
    }
}

/* y[r, 0..nvalid) for R activation rows (legacy layout, row stride xrow bytes) against one packed group:
 * the canonical float steps of s_grp32, lane-wise; partial sum a[ph] takes the blocks b % 4 == ph. */
QM_INLINE void p_kern32(const int qt, const pblock32 *p, int64_t nb, const char *x, int64_t xrow, const int R,
                        float *y, int64_t ldy, int nvalid) {
    const int sgn = QM_SIGNED32(qt) && !QM_VNNI;   /* signed weights, the sign moved onto x (pv_sign8) */
    pvf part[4][PR];
    for (int ph = 0; ph < 4; ph++) {
        pvf acc[PR];
        for (int r = 0; r < R; r++) acc[r] = pf_zero();
        for (int64_t b = ph; b < nb; b += 4) {
            const pblock32 *pb = p + b;
            pvi t[PR];
            for (int r = 0; r < R; r++)
                t[r] = qt == QT_Q4_1 || qt == QT_Q5_1 || sgn ? pv_zero() : pv_set1(XL_C(x + r * xrow, nb)[b]);
#pragma GCC unroll 8
            for (int e4 = 0; e4 < 8; e4++) {
                const pvi wv = pv_load(pb->q[e4]), wa = sgn ? pv_abs8(wv) : wv;
                for (int r = 0; r < R; r++) {
                    int32_t xv;
                    memcpy(&xv, x + r * xrow + 32 * b + 4 * e4, 4);
                    t[r] = pv_dpbusd(t[r], wa, sgn ? pv_sign8(pv_set1(xv), wv) : pv_set1(xv));
                }
            }
            const pvf dv = pf_load(pb->d);
            for (int r = 0; r < R; r++) {
                const char *xr = x + r * xrow;
                acc[r] = pf_fmadd(pf_cvt(t[r]), pf_mul(dv, pf_set1(XL_D(xr, nb)[b])), acc[r]);
                if (qt == QT_Q4_1 || qt == QT_Q5_1)
                    acc[r] = pf_fmadd(pf_load(pb->m), pf_set1(XL_S(xr, nb)[b]), acc[r]);
            }
        }
        for (int r = 0; r < R; r++) part[ph][r] = acc[r];
    }
    for (int r = 0; r < R; r++) {   /* whole groups stored directly (a memcpy of nvalid floats was a libc call) */
        const pvf v = pf_add(pf_add(part[0][r], part[1][r]), pf_add(part[2][r], part[3][r]));
        if (nvalid == PN) {
            pf_storeu(y + r * ldy, v);
            continue;
        }
        float tmp[PN];
        pf_storeu(tmp, v);
        memcpy(y + r * ldy, tmp, (size_t)nvalid * sizeof(float));
    }
}

#if !QM_VNNI
#include "qm_pack_avx2.h"
#define P_KERN p_kern_a2
#define P_KERN32 p_kern32_a2
#else
#define P_KERN p_kern
#define P_KERN32 p_kern32
#endif

typedef void (*pack_fn)(const uint8_t *w, int64_t ldw, int nrows, int64_t nb, void *p);
typedef void (*pkern_fn)(const void *p, int64_t nb, const char *x, int64_t xrow, int R, float *y, int64_t ldy,
                         int nvalid);

/* a packed kernel's locals from its arguments (pv, xc, xrow_bytes): the blocks p, the x rows, their stride */
#define PK_LOCALS                                                                                           \
    const pblock *p = (const pblock *)pv;                                                                 \
    const xq256 *x = (const xq256 *)xc;                                                                   \
    const int64_t xrow = xrow_bytes / (int64_t)sizeof(xq256);

/* KERN(qt, p, nb, x, xrow, R, y, ldy, nvalid) with R a constant: 8, 4, 2 or 1 (PK_R_1248), or every
   R in 1..8 (PK_EVERY_R) */
#define PK_R_1248(KERN, qt)                                                                                \
    if (R == 8) KERN(qt, p, nb, x, xrow, 8, y, ldy, nvalid);                                               \
    else if (R == 4) KERN(qt, p, nb, x, xrow, 4, y, ldy, nvalid);                                          \
    else if (R == 2) KERN(qt, p, nb, x, xrow, 2, y, ldy, nvalid);                                          \
    else KERN(qt, p, nb, x, xrow, 1, y, ldy, nvalid);
#define PK_EVERY_R(KERN, qt)                                                                               \
    switch (R) {                                                                                           \
    case 8: KERN(qt, p, nb, x, xrow, 8, y, ldy, nvalid); break;                                            \
    case 7: KERN(qt, p, nb, x, xrow, 7, y, ldy, nvalid); break;                                            \
    case 6: KERN(qt, p, nb, x, xrow, 6, y, ldy, nvalid); break;                                            \
    case 5: KERN(qt, p, nb, x, xrow, 5, y, ldy, nvalid); break;                                            \
    case 4: KERN(qt, p, nb, x, xrow, 4, y, ldy, nvalid); break;                                            \
    case 3: KERN(qt, p, nb, x, xrow, 3, y, ldy, nvalid); break;                                            \
    case 2: KERN(qt, p, nb, x, xrow, 2, y, ldy, nvalid); break;                                            \
    default: KERN(qt, p, nb, x, xrow, 1, y, ldy, nvalid);                                                  \
    }

/* K types: x rows of nb xq256 (xrow bytes apart); DISPATCH: which R get an instance (PK_R_1248 / PK_EVERY_R) */
#define DEF_PACKED_R(name, qt, bb, DISPATCH)                                                              \
    static void name##_pack(const uint8_t *w, int64_t ldw, int nrows, int64_t nb, void *p) {             \
        pack8(qt, bb, w, ldw, nrows, nb, (pblock *)p);                                                    \
    }                                                                                                      \
    static void name##_kern(const void *pv, int64_t nb, const char *xc, int64_t xrow_bytes, int R,        \
                            float *y, int64_t ldy, int nvalid) {                                          \
        PK_LOCALS                                                                                          \
        DISPATCH(P_KERN, qt)                                                                               \
    }
#define DEF_PACKED(name, qt, bb) DEF_PACKED_R(name, qt, bb, PK_R_1248)
/* every R in 1..8 (the types of row_max_run: run_packed then takes balanced runs) */
#define DEF_PACKED_ANY(name, qt, bb) DEF_PACKED_R(name, qt, bb, PK_EVERY_R)

DEF_PACKED_ANY(pk_q4_k, QT_Q4_K, B_Q4_K)
DEF_PACKED_ANY(pk_q5_k, QT_Q5_K, B_Q5_K)
DEF_PACKED_ANY(pk_q6_k, QT_Q6_K, B_Q6_K)
DEF_PACKED(pk_q2_k, QT_Q2_K, B_Q2_K)
DEF_PACKED(pk_q3_k, QT_Q3_K, B_Q3_K)
DEF_PACKED(pk_iq4_xs, QT_IQ4_XS, B_IQ4_XS)

/* legacy types: x rows in the xl layout (qm_simd.h), xrow bytes apart */
#define DEF_PACKED32(name, qt, bb)                                                                        \
    static void name##_pack(const uint8_t *w, int64_t ldw, int nrows, int64_t nb, void *p) {             \
        pack8_32(qt, bb, w, ldw, nrows, nb, (pblock32 *)p);                                               \
    }                                                                                                      \
    static void name##_kern(const void *pv, int64_t nb, const char *x, int64_t xrow, int R, float *y,     \
                            int64_t ldy, int nvalid) {                                                    \
        const pblock32 *p = (const pblock32 *)pv;                                                         \
        if (R == 8) P_KERN32(qt, p, nb, x, xrow, 8, y, ldy, nvalid);                                      \
        else if (R == 4) P_KERN32(qt, p, nb, x, xrow, 4, y, ldy, nvalid);                                 \
        else if (R == 2) P_KERN32(qt, p, nb, x, xrow, 2, y, ldy, nvalid);                                 \
        else P_KERN32(qt, p, nb, x, xrow, 1, y, ldy, nvalid);                                             \
    }

DEF_PACKED32(pk_q4_0, QT_Q4_0, B_Q4_0)
DEF_PACKED32(pk_q4_1, QT_Q4_1, B_Q4_1)
DEF_PACKED32(pk_q5_0, QT_Q5_0, B_Q5_0)
DEF_PACKED32(pk_q5_1, QT_Q5_1, B_Q5_1)
DEF_PACKED32(pk_q8_0, QT_Q8_0, B_Q8_0)
DEF_PACKED32(pk_iq4_nl, QT_IQ4_NL, B_IQ4_NL)
DEF_PACKED32(pk_mxfp4, QT_MXFP4, B_MXFP4)

/* rows [n0, n1) of y for all M rows through the packed path; buf holds PG * nb packed blocks of pbytes */
static void run_packed(pack_fn pack, pkern_fn kern, int anyr, size_t pbytes, const uint8_t *w, int64_t ldw, int64_t nb,
                       const char *xq, size_t xrow_bytes, int64_t M, int64_t n0, int64_t n1, float *y, int64_t ldy,
                       char *buf) {
    const size_t gbytes = (size_t)nb * pbytes;
    const int64_t tiles = (M + PT - 1) / PT;   /* kernel calls per group (runs of PT / 4 / 2 / 1 rows) */
    /* groups per pass: PG (32 weight rows share each x tile's trip from L2; fewer groups are
       slower for a long K, such as a down projection), one when all M rows are one run (a few rows: each group is
       packed and used while it is in L1). The order of the kernel calls changes no result. */
    const int pg = M <= PT ? 1 : PG;
    for (int64_t s = n0; s < n1; s += pg * PN) {
        int ng = 0, rows[PG];
        for (; ng < pg && s + ng * PN < n1; ng++) {
            rows[ng] = n1 - (s + ng * PN) < PN ? (int)(n1 - (s + ng * PN)) : PN;
            pack(w + (s + ng * PN) * ldw, ldw, rows[ng], nb, buf + ng * gbytes);
        }
        /* the next pass's weight rows (contiguous) are fetched into L2 while this pass computes, a
           slice per kernel call: packing reads 16 rows a block at a time, a pattern the hardware
           prefetcher does not follow, so without this every pass waited on DRAM */
        const int64_t ns = s + pg * PN, ne = ns + pg * PN < n1 ? ns + pg * PN : n1;
        const char *pf = (const char *)(w + ns * ldw), *pfend = ns < ne ? (const char *)(w + ne * ldw) : pf;
        const int64_t per = ((pfend - pf) / 64 + tiles * ng - 1) / (tiles * ng) * 64 + 64;
        for (int64_t m = 0; m < M;) {
            /* runs of PT / 4 / 2 / 1 rows, or (anyr: kern has every R) the fewest of at most PT, balanced */
            int R = M - m >= PT ? PT : M - m >= 4 ? 4 : M - m >= 2 ? 2 : 1;
            if (anyr) {
                const int64_t runs = (M - m + PT - 1) / PT;
                R = (int)((M - m + runs - 1) / runs);
            }
            for (int g = 0; g < ng; g++) {
                for (const char *e = pf + per < pfend ? pf + per : pfend; pf < e; pf += 64) _mm_prefetch(pf, _MM_HINT_T1);
                kern(buf + g * gbytes, nb, xq + m * xrow_bytes, (int64_t)xrow_bytes, R, y + m * ldy + s + g * PN, ldy, rows[g]);
            }
            m += R;
        }
    }
}

#endif
