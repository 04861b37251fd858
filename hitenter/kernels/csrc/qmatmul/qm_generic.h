/* Plain-C kernels (any CPU; also the HITENTER_QMATMUL_ISA=generic variant). Each output (m, n) is a
 * fixed sequential fp32 sum over the blocks of the row, whatever R is: batch invariant. */
#ifndef QM_GENERIC_H
#define QM_GENERIC_H

#include <math.h>
#include "qm_common.h"

/* legacy block -> signed ints e[32] (offset applied), its scale d and min m (0 for *_0 types) */
static inline void g_decode32(int qt, const uint8_t *b, int e[32], float *d, float *m) {
    if (qt == QT_IQ4_NL || qt == QT_MXFP4) {   /* 16 bytes of two 4-bit codebook indices */
        const int8_t *kv = qt == QT_IQ4_NL ? qm_kv_iq4nl : qm_kv_mxfp4;
        const uint8_t *qs = b + (qt == QT_IQ4_NL ? 2 : 1);
        *d = qt == QT_IQ4_NL ? qm_h2f(b) : qm_e8m0_half(b[0]);
        *m = 0.0f;
        for (int j = 0; j < 16; j++) e[j] = kv[qs[j] & 15], e[j + 16] = kv[qs[j] >> 4];
        return;
    }
    *d = qm_h2f(b);
    *m = (qt == QT_Q4_1 || qt == QT_Q5_1) ? qm_h2f(b + 2) : 0.0f;
    if (qt == QT_Q8_0) {
        for (int j = 0; j < 32; j++) e[j] = (int8_t)b[2 + j];
        return;
    }
    const int five = (qt == QT_Q5_0 || qt == QT_Q5_1);
    const uint8_t *qs = b + (qt == QT_Q4_0 ? 2 : qt == QT_Q4_1 ? 4 : qt == QT_Q5_0 ? 6 : 8);
    uint32_t qh = 0;
    if (five) memcpy(&qh, qs - 4, 4);
    const int off = (qt == QT_Q4_0) ? 8 : (qt == QT_Q5_0) ? 16 : 0;
    for (int j = 0; j < 16; j++) {
        e[j] = (qs[j] & 15) + (five ? (int)((qh >> j) & 1) << 4 : 0) - off;
        e[j + 16] = (qs[j] >> 4) + (five ? (int)((qh >> (j + 16)) & 1) << 4 : 0) - off;
    }
}

static void g_row32(int qt, int bbytes, const uint8_t *w, int64_t nb, const xq32 *x, int64_t xrow, int R,
                    float *y, int64_t ldy) {
    for (int r = 0; r < R; r++) {
        const xq32 *xr = x + r * xrow;
        float acc = 0.0f;
        for (int64_t b = 0; b < nb; b++) {
            int e[32];
            float d, m;
            g_decode32(qt, w + b * bbytes, e, &d, &m);
            int32_t s = 0;
            for (int j = 0; j < 32; j++) s += e[j] * xr[b].q[j];
            acc += (float)s * (d * xr[b].d);
            acc += m * xr[b].s;
        }
        y[r * ldy] = acc;
    }
}

/* Q2_K / Q3_K / IQ4_XS block -> as g_decode256 (Q3_K's offset 4 applied, IQ4_XS's codebook values) */
static inline void g_decode256_low(int qt, const uint8_t *b, int e[256], int sc[16], int mn[16], float *d,
                                   float *dmin) {
    if (qt == QT_IQ4_XS) {
        int s8[8];
        qm_iq4xs_scales(b, s8);
        *d = qm_h2f(b);
        *dmin = 0.0f;
        for (int g = 0; g < 16; g++) sc[g] = s8[g / 2], mn[g] = 0;
        for (int ib = 0; ib < 8; ib++)
            for (int j = 0; j < 16; j++) {
                e[32 * ib + j] = qm_kv_iq4nl[b[8 + 16 * ib + j] & 15];
                e[32 * ib + 16 + j] = qm_kv_iq4nl[b[8 + 16 * ib + j] >> 4];
            }
        return;
    }
    /* element 128 h + 32 j + l: bits 2j of qs[32 h + l] (Q3_K: bit 4h + j of hmask[l] set means no -4) */
    const int three = qt == QT_Q3_K;
    const uint8_t *qs = b + (three ? 32 : 16);
    if (three) {
        qm_q3k_scales(b + 96, sc);
        *d = qm_h2f(b + 108);
        *dmin = 0.0f;
        for (int g = 0; g < 16; g++) mn[g] = 0;
    } else {
        *d = qm_h2f(b + 80);
        *dmin = qm_h2f(b + 82);
        for (int g = 0; g < 16; g++) sc[g] = b[g] & 15, mn[g] = b[g] >> 4;
    }
    for (int h = 0; h < 2; h++)
        for (int j = 0; j < 4; j++)
            for (int l = 0; l < 32; l++) {
                int q = (qs[32 * h + l] >> (2 * j)) & 3;
                if (three) q -= (b[l] >> (4 * h + j)) & 1 ? 0 : 4;
                e[128 * h + 32 * j + l] = q;
            }
}

/* K block -> ints e[256] (Q6_K offset applied), per-16 scales sc, per-16 mins mn, d and dmin */
static inline void g_decode256(int qt, const uint8_t *b, int e[256], int sc[16], int mn[16], float *d,
                               float *dmin) {
    if (qt == QT_Q2_K || qt == QT_Q3_K || qt == QT_IQ4_XS) {
        g_decode256_low(qt, b, e, sc, mn, d, dmin);
        return;
    }
    if (qt == QT_Q6_K) {
        *d = qm_h2f(b + 208);
        *dmin = 0.0f;
        for (int g = 0; g < 16; g++) { sc[g] = (int8_t)b[192 + g]; mn[g] = 0; }
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = b + 64 * h, *qh = b + 128 + 32 * h;
            int *o = e + 128 * h;
            for (int l = 0; l < 32; l++) {
                o[l] = ((ql[l] & 15) | ((qh[l] & 3) << 4)) - 32;
                o[l + 32] = ((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) - 32;
                o[l + 64] = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                o[l + 96] = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            }
        }
        return;
    }
    *d = qm_h2f(b);
    *dmin = qm_h2f(b + 2);
    uint32_t u[4];
    qm_k4_scales(b + 4, u);
    const uint8_t *s8 = (const uint8_t *)u;
    for (int g = 0; g < 16; g++) { sc[g] = s8[g / 2]; mn[g] = s8[8 + g / 2]; }
    const int five = (qt == QT_Q5_K);
    const uint8_t *qh = b + 16, *qs = b + (five ? 48 : 16);
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            e[64 * c + l] = (qs[32 * c + l] & 15) + (five ? ((qh[l] >> (2 * c)) & 1) << 4 : 0);
            e[64 * c + 32 + l] = (qs[32 * c + l] >> 4) + (five ? ((qh[l] >> (2 * c + 1)) & 1) << 4 : 0);
        }
}

static void g_row256(int qt, int bbytes, const uint8_t *w, int64_t nb, const xq256 *x, int64_t xrow, int R,
                     float *y, int64_t ldy) {
    for (int r = 0; r < R; r++) {
        const xq256 *xr = x + r * xrow;
        float acc = 0.0f;
        for (int64_t b = 0; b < nb; b++) {
            int e[256], sc[16], mn[16];
            float d, dmin;
            g_decode256(qt, w + b * bbytes, e, sc, mn, &d, &dmin);
            int32_t is = 0, ms = 0;
            for (int g = 0; g < 16; g++) {
                int32_t s = 0;
                for (int j = 0; j < 16; j++) s += e[16 * g + j] * xr[b].q[16 * g + j];
                is += sc[g] * s;
                ms += mn[g] * xr[b].bsum[g];
            }
            if (!QM_KMIN(qt)) {   /* the same float steps as the SIMD kernels (k_step) */
                acc = fmaf((float)(is - ms), d * xr[b].d, acc);
            } else {
                acc = fmaf((float)is, d * xr[b].d, acc);
                acc = fmaf(-(float)ms, dmin * xr[b].d, acc);
            }
        }
        y[r * ldy] = acc;
    }
}

/* activation quantization: round to nearest (even) of x / (amax / 127) */
static void quant_row32(const float *x, int64_t nb, xq32 *o) {
    for (int64_t b = 0; b < nb; b++, x += 32) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
        const float d = amax / 127.0f, id = amax > 0.0f ? 127.0f / amax : 0.0f;
        int s = 0;
        for (int j = 0; j < 32; j++) { o[b].q[j] = (int8_t)lrintf(x[j] * id); s += o[b].q[j]; }
        o[b].d = d;
        o[b].s = d * (float)s;
    }
}

static void quant_row256(const float *x, int64_t nb, xq256 *o) {
    for (int64_t b = 0; b < nb; b++, x += 256) {
        float amax = 0.0f;
        for (int j = 0; j < 256; j++) amax = fmaxf(amax, fabsf(x[j]));
        const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
        for (int j = 0; j < 256; j++) o[b].q[j] = (int8_t)lrintf(x[j] * id);
        for (int g = 0; g < 16; g++) {
            int s = 0;
            for (int j = 0; j < 16; j++) s += o[b].q[16 * g + j];
            o[b].bsum[g] = (int16_t)s;
            o[b].off6[g] = -32 * s;
        }
        for (int g = 0; g < 8; g++) o[b].bsum32[g] = (int16_t)(o[b].bsum[2 * g] + o[b].bsum[2 * g + 1]);
        o[b].d = amax / 127.0f;
        o[b].pad = 0.0f;
    }
}

#endif
