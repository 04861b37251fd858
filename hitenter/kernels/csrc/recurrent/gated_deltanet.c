/* A Gated DeltaNet layer's recurrent part, from its projections to the input of ssm_out, for the spans of a
   step's sequences in one call (hitenter/kernels/gated_deltanet.py; the layer:
   hitenter/models/recurrent/gated_deltanet.py, whose torch path is the reference). For each token of a span,
   in order, with x | z = the in_proj row (C + Hv dv wide) and b | a = the ba_proj row (2 Hv):

       c      = silu(sum_j u[t + j] w[:, j])     u = [conv tail ; x rows], taps in order (K of them)
       q, k   = l2(c_q), l2(c_k) per key head;  v = c_v
       beta   = sigmoid(b);  g = softplus(a + dt_bias) * A
       o      = the delta rule (delta_rule.h) of value head h with key head kh(h) and scale
       y      = rms(o_h) * norm_w * silu(z_h) per value head

   l2(u) = u / sqrt(sum u^2 / n + eps / n) / sqrt(n) (llama.cpp's rms form); rms(u) = u / sqrt(sum u^2 / n +
   eps); silu(x) = x / (1 + e^-x) with e^x on 16 lanes (v_exp: a polynomial, within 2 ulp); sigmoid(x) = 1 /
   (1 + e^-x) and softplus(x) = x above 20, else log1p(e^x), on libm's expf / log1pf.

   Bits: every value is computed by the same operations in the same order whatever the span, the batch or
   the thread count (the conv products rounded then added in tap order; sums of squares in 16 lanes over the
   row, then the lanes added in a fixed order, then the tail in order; -ffp-contract=off; v_exp of only
   + - * and bit operations; libm for the gates), and the AVX-512 / AVX2 / portable builds do the same
   operations, so a row's bits depend only on its sequence's tokens. A one-token span and a generation row
   batched with others take the same code.

   Layouts (float32): xz rows xz_stride apart, ba rows ba_stride apart, y [rows, Hv dv]; conv states
   [slots, K - 1, C] and ssm states [slots, Hv, dk, dv], contiguous, updated in place; span i covers rows
   row0[i] .. row0[i] + len[i] - 1 and owns slot[i] (slots distinct within a call). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "delta_rule.h"
#include "vec_math.h"

typedef struct {
    int64_t hk, dk, hv, dv, K, grouped;   /* grouped: value head h reads key head h / (hv / hk), else h % hk */
    float eps, scale;
    const float *conv_wt, *dt_bias, *a, *norm_w;   /* [K, C] (the taps transposed), [hv], [hv], [dv] */
} gdn_params;

static void l2_rows(float *x, int64_t heads, int64_t n, float eps) {
    const float inv_n = 1.0f / (float)n, eps_n = eps / (float)n, root = 1.0f / sqrtf((float)n);
    for (int64_t h = 0; h < heads; h++) {
        float *r = x + h * n;
        const float f = 1.0f / sqrtf(vm_sum_squares(r, n) * inv_n + eps_n);
        for (int64_t i = 0; i < n; i++) r[i] = (r[i] * f) * root;
    }
}

static float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/* One row: conv + silu into c [C], q and k normed in place, the gates into gb [2 Hv] (g | beta). */
static void row_inputs(const gdn_params *p, const float *const *u_rows, const float *ba, float *c, float *gb) {
    const int64_t kd = p->hk * p->dk, C = 2 * kd + p->hv * p->dv;
    vm_conv_silu(u_rows, p->K, p->conv_wt, NULL, c, C);
    l2_rows(c, 2 * p->hk, p->dk, p->eps);
    for (int64_t h = 0; h < p->hv; h++) {
        gb[h] = softplus(ba[p->hv + h] + p->dt_bias[h]) * p->a[h];
        gb[p->hv + h] = 1.0f / (1.0f + expf(-ba[h]));
    }
}

/* One row's output in place: y_h = rms(o_h) * norm_w * silu(z_h). */
static void row_output(const gdn_params *p, float *y, const float *z) {
    const float inv_n = 1.0f / (float)p->dv;
    const int64_t nv = p->dv / 16;
    for (int64_t h = 0; h < p->hv; h++) {
        float *o = y + h * p->dv;
        const float *zh = z + h * p->dv;
        const float f = 1.0f / sqrtf(vm_sum_squares(o, p->dv) * inv_n + p->eps);
        for (int64_t i = 0; i < nv; i++) {
            vm_v16u *ov = (vm_v16u *)o + i;
            *ov = ((*ov * f) * ((const vm_v16u *)p->norm_w)[i]) * v_silu(((const vm_v16u *)zh)[i]);
        }
        for (int64_t i = 16 * nv; i < p->dv; i++) o[i] = ((o[i] * f) * p->norm_w[i]) * silu(zh[i]);
    }
}

/* Threads only for work worth waking them for (state elements passed over): as delta_rule.c. */
#define PAR_MIN_ELEMS (1 << 21)

int gdn_spans(const int64_t *dims, const float *fparams, const float *conv_wt, const float *dt_bias, const float *a,
              const float *norm_w, float *conv_states, float *ssm_states, const int64_t *row0, const int64_t *len,
              const int64_t *slot, int64_t n, const float *xz, int64_t xz_stride, const float *ba, int64_t ba_stride,
              float *y, int nthreads) {
    const gdn_params p = {dims[0], dims[1], dims[2], dims[3], dims[4], dims[5], fparams[0], fparams[1],
                          conv_wt, dt_bias, a, norm_w};
    if (p.hk < 1 || p.dk < 1 || p.hv < 1 || p.dv < 1 || p.dv > 4096 || p.hv % p.hk || p.K < 2 || p.K > 64 || n < 0)
        return -1;
    const int64_t kd = p.hk * p.dk, vd = p.hv * p.dv, C = 2 * kd + vd, km = p.K - 1;
    int64_t rows = 0;
    for (int64_t i = 0; i < n; i++) {
        if (len[i] < 1 || row0[i] < 0) return -1;
        rows += len[i];
    }
    if (rows == 0) return 0;
    /* per row: c [C] then gb [2 Hv]; the rows of span i start at base[i] */
    const int64_t wrow = C + 2 * p.hv;
    float *work = (float *)malloc(sizeof(float) * (size_t)(rows * wrow));
    int64_t *base = (int64_t *)malloc(sizeof(int64_t) * (size_t)(n + 1));
    if (!work || !base) {
        free(work);
        free(base);
        return -2;
    }
    base[0] = 0;
    for (int64_t i = 0; i < n; i++) base[i + 1] = base[i] + len[i];
    const int par_rows = nthreads > 1 && rows * C >= (1 << 16);
    /* phase A: every row's conv window reads the tails before any tail is written */
#pragma omp parallel for schedule(static) num_threads(nthreads) if (par_rows)
    for (int64_t r = 0; r < rows; r++) {
        int64_t i = 0;
        while (base[i + 1] <= r) i++;
        const int64_t t = r - base[i];
        const float *tail = conv_states + slot[i] * km * C;
        const float *u_rows[64];
        for (int64_t j = 0; j < p.K; j++) {   /* window row j is u[t + j] of [tail ; x] */
            const int64_t s = t + j - km;
            u_rows[j] = s < 0 ? tail + (t + j) * C : xz + (row0[i] + s) * xz_stride;
        }
        float *w = work + r * wrow;
        row_inputs(&p, u_rows, ba + (row0[i] + t) * ba_stride, w, w + C);
    }
    for (int64_t i = 0; i < n; i++) {   /* the tails become the windows' last K - 1 rows */
        float *tail = conv_states + slot[i] * km * C;
        const int64_t T = len[i];
        if (T < km) memmove(tail, tail + T * C, sizeof(float) * (size_t)((km - T) * C));
        for (int64_t j = (T < km ? km - T : 0); j < km; j++)
            memcpy(tail + j * C, xz + (row0[i] + T - km + j) * xz_stride, sizeof(float) * (size_t)C);
    }
    /* phase B: the delta rule per (span, value head) */
    const int par_heads = nthreads > 1 && n * p.hv > 1 && rows * p.hv * p.dk * p.dv >= PAR_MIN_ELEMS;
#pragma omp parallel for schedule(static) num_threads(nthreads) if (par_heads)
    for (int64_t ih = 0; ih < n * p.hv; ih++) {
        const int64_t i = ih / p.hv, h = ih % p.hv;
        const int64_t kh = p.grouped ? h / (p.hv / p.hk) : h % p.hk;
        const float *w = work + base[i] * wrow;
        const dr_span sp = {w + kh * p.dk, w + kd + kh * p.dk, w + 2 * kd + h * p.dv, w + C + h, w + C + p.hv + h,
                            y + row0[i] * vd + h * p.dv, wrow, wrow, wrow, vd};
        dr_head_span(ssm_states + (slot[i] * p.hv + h) * p.dk * p.dv, &sp, len[i], p.dk, p.dv, p.scale);
    }
    /* phase C: the gated norm per row */
#pragma omp parallel for schedule(static) num_threads(nthreads) if (par_rows)
    for (int64_t r = 0; r < rows; r++) {
        int64_t i = 0;
        while (base[i + 1] <= r) i++;
        const int64_t row = row0[i] + r - base[i];
        row_output(&p, y + row * vd, xz + row * xz_stride + C);
    }
    free(work);
    free(base);
    return 0;
}
