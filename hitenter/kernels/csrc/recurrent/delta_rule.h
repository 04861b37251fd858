/* One value head's gated delta rule over a span's tokens: the arithmetic delta_rule.c and gated_deltanet.c
   share (delta_rule.c's header comment states the order of operations and why every ISA variant gives the
   same bits). The caller points each input at the head's first token and gives the strides (floats) from one
   token to the next, so the inputs may be packed per head ([T, H, d]) or sit inside wider rows. */
#ifndef HITENTER_DELTA_RULE_H
#define HITENTER_DELTA_RULE_H

#include <math.h>
#include <stdint.h>

#define DR_MAXNV 16

typedef struct {
    const float *q, *k, *v, *g, *beta;   /* this head's token 0 */
    float *o;
    int64_t qk_stride, v_stride, gb_stride, o_stride;
} dr_span;

/* Column groups: each value column j of S evolves on its own (k S, q S, d and the update all act lane-wise on
   column j; only e, beta and q . k are shared by the columns), so the vector code walks the head's columns in
   groups of DR_GW vectors of the build's own width (dr_vn: 16 lanes with AVX-512, 8 with AVX2, 4 otherwise; a
   16-lane vector emulated on AVX2 has GCC rebuild each broadcast scalar through the stack, a store-forwarding
   stall per use), each group through a block of up to DR_TB tokens before the next group: the group's slice of
   S ([dk, DR_GW DR_L] floats: 16 KB for dk 128 on AVX2, 32 KB on AVX-512) stays in L1 across the block's tokens
   and its accumulators in registers. Each lane still does the same operations in the same order as one column
   of the scalar loop: the same bits, whatever the ISA or the grouping. */
#if defined(__AVX512F__)
#define DR_L 16
#elif defined(__AVX__)
#define DR_L 8
#else
#define DR_L 4
#endif
typedef float dr_vn __attribute__((vector_size(4 * DR_L)));
typedef float dr_vnu __attribute__((vector_size(4 * DR_L), aligned(4)));   /* an unaligned load / store */
#ifndef DR_GW
#define DR_GW 4   /* vectors a group: 64 columns with AVX-512, 32 with AVX2 */
#endif
#define DR_TB 64

typedef struct {   /* a token block's per-token scalars: e^g, beta, q . k (in the scalar loop's order) */
    float e[DR_TB], b[DR_TB], qk[DR_TB];
} dr_block;

/* columns [DR_L c0, DR_L (c0 + W)) of S through tokens [t0, t0 + tb) */
static inline __attribute__((always_inline)) void dr_cols(float *S, const dr_span *sp, const dr_block *bk,
                                                           int64_t t0, int64_t tb, int64_t dk, int64_t dv, int64_t c0,
                                                           const int W, float scale) {
    for (int64_t tt = 0; tt < tb; tt++) {
        const int64_t t = t0 + tt;
        const float *qt = sp->q + t * sp->qk_stride, *kt = sp->k + t * sp->qk_stride;
        const float *vt = sp->v + t * sp->v_stride + DR_L * c0;
        const float e = bk->e[tt], b = bk->b[tt], qk = bk->qk[tt];
        dr_vn ak[DR_GW], aq[DR_GW], d[DR_GW];   /* W <= DR_GW */
        for (int u = 0; u < W; u++) ak[u] = aq[u] = (dr_vn){0};
        for (int64_t i = 0; i < dk; i++) {           /* pass 1, read only: k S and q S */
            const dr_vnu *row = (const dr_vnu *)(S + i * dv) + c0;
            const float ki = kt[i], qi = qt[i];
            for (int u = 0; u < W; u++) {
                const dr_vn r = row[u];
                ak[u] = ak[u] + r * ki;
                aq[u] = aq[u] + r * qi;
            }
        }
        dr_vnu *ot = (dr_vnu *)(sp->o + t * sp->o_stride) + c0;
        for (int u = 0; u < W; u++) {
            d[u] = (((const dr_vnu *)vt)[u] - ak[u] * e) * b;
            ot[u] = (aq[u] * e + d[u] * qk) * scale;
        }
        for (int64_t i = 0; i < dk; i++) {           /* pass 2: S = S e + k d */
            dr_vnu *row = (dr_vnu *)(S + i * dv) + c0;
            const float ki = kt[i];
            for (int u = 0; u < W; u++) row[u] = row[u] * e + d[u] * ki;
        }
    }
}

/* dv a multiple of DR_L */
static void dr_head_span_vec(float *S, const dr_span *sp, int64_t T, int64_t dk, int64_t dv, float scale) {
    const int64_t nv = dv / DR_L;
    dr_block bk;
    for (int64_t t0 = 0; t0 < T; t0 += DR_TB) {
        const int64_t tb = T - t0 < DR_TB ? T - t0 : DR_TB;
        for (int64_t tt = 0; tt < tb; tt++) {
            const int64_t t = t0 + tt;
            const float *qt = sp->q + t * sp->qk_stride, *kt = sp->k + t * sp->qk_stride;
            float qk = 0.0f;
            for (int64_t i = 0; i < dk; i++) qk = qk + qt[i] * kt[i];
            bk.e[tt] = expf(sp->g[t * sp->gb_stride]), bk.b[tt] = sp->beta[t * sp->gb_stride], bk.qk[tt] = qk;
        }
        int64_t c0 = 0;
        for (; c0 + DR_GW <= nv; c0 += DR_GW) dr_cols(S, sp, &bk, t0, tb, dk, dv, c0, DR_GW, scale);
        for (; c0 < nv; c0++) dr_cols(S, sp, &bk, t0, tb, dk, dv, c0, 1, scale);   /* the rest, one vector each */
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

/* The head's state S [dk, dv] (row i: dv contiguous floats, updated in place) through T tokens. */
static void dr_head_span(float *S, const dr_span *sp, int64_t T, int64_t dk, int64_t dv, float scale) {
    if (dv % 16 == 0 && dv / 16 <= DR_MAXNV) {
        dr_head_span_vec(S, sp, T, dk, dv, scale);
        return;
    }
    float ak[dv], aq[dv];
    dr_head_span_scalar(S, sp, T, dk, dv, scale, ak, aq);
}

#endif
