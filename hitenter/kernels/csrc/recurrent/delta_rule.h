/* One value head's gated delta rule over a span's tokens: the arithmetic delta_rule.c and gated_deltanet.c
   share (delta_rule.c's header comment states the order of operations and why every ISA variant gives the
   same bits). The caller points each input at the head's first token and gives the strides (floats) from one
   token to the next, so the inputs may be packed per head ([T, H, d]) or sit inside wider rows. */
#ifndef HITENTER_DELTA_RULE_H
#define HITENTER_DELTA_RULE_H

#include <math.h>
#include <stdint.h>

typedef float dr_v16 __attribute__((vector_size(64)));
typedef float dr_v16u __attribute__((vector_size(64), aligned(4)));   /* an unaligned load / store */

#define DR_MAXNV 16

typedef struct {
    const float *q, *k, *v, *g, *beta;   /* this head's token 0 */
    float *o;
    int64_t qk_stride, v_stride, gb_stride, o_stride;
} dr_span;

static inline __attribute__((always_inline)) void dr_head_span_vec(float *S, const dr_span *sp, int64_t T,
                                                                    int64_t dk, const int nv, float scale) {
    const int64_t dv = 16 * nv;
    for (int64_t t = 0; t < T; t++) {
        const float *qt = sp->q + t * sp->qk_stride, *kt = sp->k + t * sp->qk_stride;
        const float *vt = sp->v + t * sp->v_stride;
        const float e = expf(sp->g[t * sp->gb_stride]), b = sp->beta[t * sp->gb_stride];
        dr_v16 ak[DR_MAXNV], aq[DR_MAXNV], d[DR_MAXNV];
        for (int u = 0; u < nv; u++) ak[u] = aq[u] = (dr_v16){0};
        float qk = 0.0f;
        for (int64_t i = 0; i < dk; i++) {           /* pass 1, read only: k S and q S */
            const dr_v16u *row = (const dr_v16u *)(S + i * dv);
            const float ki = kt[i], qi = qt[i];
            qk = qk + qi * ki;
            for (int u = 0; u < nv; u++) {
                const dr_v16 r = row[u];
                ak[u] = ak[u] + r * ki;
                aq[u] = aq[u] + r * qi;
            }
        }
        dr_v16u *ot = (dr_v16u *)(sp->o + t * sp->o_stride);
        for (int u = 0; u < nv; u++) {
            d[u] = (((const dr_v16u *)vt)[u] - ak[u] * e) * b;
            ot[u] = (aq[u] * e + d[u] * qk) * scale;
        }
        for (int64_t i = 0; i < dk; i++) {           /* pass 2: S = S e + k d */
            dr_v16u *row = (dr_v16u *)(S + i * dv);
            const float ki = kt[i];
            for (int u = 0; u < nv; u++) row[u] = row[u] * e + d[u] * ki;
        }
    }
}

static void dr_head_span_scalar(float *S, const dr_span *sp, int64_t T, int64_t dk, int64_t dv, float scale,
                                float *ak, float *aq) {
    for (int64_t t = 0; t < T; t++) {
        const float *qt = sp->q + t * sp->qk_stride, *kt = sp->k + t * sp->qk_stride;
        const float *vt = sp->v + t * sp->v_stride;
        const float e = expf(sp->g[t * sp->gb_stride]), b = sp->beta[t * sp->gb_stride];
        for (int64_t j = 0; j < dv; j++) ak[j] = aq[j] = 0.0f;
        float qk = 0.0f;
        for (int64_t i = 0; i < dk; i++) {
            const float *row = S + i * dv;
            qk = qk + qt[i] * kt[i];
            for (int64_t j = 0; j < dv; j++) {
                ak[j] = ak[j] + row[j] * kt[i];
                aq[j] = aq[j] + row[j] * qt[i];
            }
        }
        float *ot = sp->o + t * sp->o_stride;
        for (int64_t j = 0; j < dv; j++) {
            ak[j] = (vt[j] - ak[j] * e) * b;          /* d */
            ot[j] = (aq[j] * e + ak[j] * qk) * scale;
        }
        for (int64_t i = 0; i < dk; i++) {
            float *row = S + i * dv;
            for (int64_t j = 0; j < dv; j++) row[j] = row[j] * e + ak[j] * kt[i];
        }
    }
}

#define DR_CASE(NV) case NV: dr_head_span_vec(S, sp, T, dk, NV, scale); break;

/* The head's state S [dk, dv] (row i: dv contiguous floats, updated in place) through T tokens. */
static void dr_head_span(float *S, const dr_span *sp, int64_t T, int64_t dk, int64_t dv, float scale) {
    if (dv % 16 == 0 && dv / 16 <= DR_MAXNV) {
        switch (dv / 16) {
            DR_CASE(1) DR_CASE(2) DR_CASE(3) DR_CASE(4) DR_CASE(5) DR_CASE(6) DR_CASE(7) DR_CASE(8)
            DR_CASE(9) DR_CASE(10) DR_CASE(11) DR_CASE(12) DR_CASE(13) DR_CASE(14) DR_CASE(15) DR_CASE(16)
        }
        return;
    }
    float ak[dv], aq[dv];
    dr_head_span_scalar(S, sp, T, dk, dv, scale, ak, aq);
}

#endif
