/* A Mamba2 layer's recurrent part, from its in_proj rows to the input of its out_proj, for the spans of a
   step's sequences in one call (hitenter/kernels/mamba2.py; the layer: hitenter/models/recurrent/mamba2.py,
   whose torch path is the reference). With E = Hs P inner channels, G groups of N state rows, Cc = E + 2 G N
   conv channels and z | xBC | dt the in_proj row (E, Cc, Hs wide), per token of a span, in order:

       u      = silu(sum_j U[t + j] w[:, j] + conv_bias)    U = [conv tail ; xBC rows], taps in order
       x | B | C = u                                         (Hs x P, G x N, G x N; head h reads group h / (Hs / G))
       dt     = softplus(dt + dt_bias);  da = e^(dt A)
       y_h    = the scan of ssm_scan.h (S_h = S_h da + B (x) x_h dt; y_h = C S_h) + D_h x_h
       out    = rms_g(y * silu(z)) * norm                   (an RMS norm over each group of E / G channels)

   softplus(x) = x above 20, else log1p(e^x), and e^(dt A) on libm (Hs of each per row); silu on the lanes of
   vec_math.h. Bits: the same operations in the same order whatever the span, the batch or the thread count,
   on every ISA variant (vec_math.h, -ffp-contract=off), so a row's bits depend only on its sequence's tokens.

   Layouts (float32): in_proj rows zs_stride apart, out [rows, E]; conv states [slots, K - 1, Cc] and ssm
   states [slots, Hs, N, P], contiguous, updated in place; span i covers rows row0[i] .. row0[i] + len[i] - 1
   and owns slot[i] (slots distinct within a call). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ssm_scan.h"
#include "vec_math.h"

typedef struct {
    int64_t E, N, G, H, K;
    float eps;
    const float *conv_wt, *conv_bias, *dt_bias, *a, *d, *norm;   /* [K, Cc], [Cc], [H], [H], [H], [E] */
} m2_params;

static float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/* Threads only for work worth waking them for (state elements passed over). */
#define PAR_MIN_ELEMS (1 << 21)

int mamba2_spans(const int64_t *dims, const float *fparams, const float *conv_wt, const float *conv_bias,
                 const float *dt_bias, const float *a, const float *d, const float *norm, float *conv_states,
                 float *ssm_states, const int64_t *row0, const int64_t *len, const int64_t *slot, int64_t n,
                 const float *zs, int64_t zs_stride, float *out, int nthreads) {
    const m2_params p = {dims[0], dims[1], dims[2], dims[3], dims[4], fparams[0], conv_wt, conv_bias, dt_bias, a, d,
                         norm};
    if (p.E < 1 || p.N < 1 || p.G < 1 || p.H < 1 || p.E % p.H || p.H % p.G || p.E % p.G || p.E / p.H > 4096 ||
        p.K < 2 || p.K > 64 || n < 0)
        return -1;
    const int64_t E = p.E, P = E / p.H, GN = p.G * p.N, Cc = E + 2 * GN, km = p.K - 1, H = p.H;
    int64_t rows = 0;
    for (int64_t i = 0; i < n; i++) {
        if (len[i] < 1 || row0[i] < 0) return -1;
        rows += len[i];
    }
    if (rows == 0) return 0;
    const int64_t wrow = Cc + 2 * H;   /* per row: u [Cc], dt [H], da [H] */
    float *work = (float *)malloc(sizeof(float) * (size_t)(rows * wrow));
    int64_t *base = (int64_t *)malloc(sizeof(int64_t) * (size_t)(n + 1));
    if (!work || !base) {
        free(work);
        free(base);
        return -2;
    }
    base[0] = 0;
    for (int64_t i = 0; i < n; i++) base[i + 1] = base[i] + len[i];
    const int par_rows = nthreads > 1 && rows * Cc >= (1 << 16);
#pragma omp parallel for schedule(static) num_threads(nthreads) if (par_rows)
    for (int64_t r = 0; r < rows; r++) {   /* every window reads the tails before any tail is written */
        int64_t i = 0;
        while (base[i + 1] <= r) i++;
        const int64_t t = r - base[i];
        const float *tail = conv_states + slot[i] * km * Cc;
        const float *u_rows[64];
        for (int64_t j = 0; j < p.K; j++) {
            const int64_t s = t + j - km;
            u_rows[j] = s < 0 ? tail + (t + j) * Cc : zs + (row0[i] + s) * zs_stride + E;
        }
        float *w = work + r * wrow;
        vm_conv_silu(u_rows, p.K, p.conv_wt, p.conv_bias, w, Cc);
        const float *dt = zs + (row0[i] + t) * zs_stride + E + Cc;
        for (int64_t h = 0; h < H; h++) {
            w[Cc + h] = softplus(dt[h] + p.dt_bias[h]);
            w[Cc + H + h] = expf(w[Cc + h] * p.a[h]);
        }
    }
    for (int64_t i = 0; i < n; i++) {   /* the tails become the windows' last K - 1 rows */
        float *tail = conv_states + slot[i] * km * Cc;
        const int64_t T = len[i];
        if (T < km) memmove(tail, tail + T * Cc, sizeof(float) * (size_t)((km - T) * Cc));
        for (int64_t j = (T < km ? km - T : 0); j < km; j++)
            memcpy(tail + j * Cc, zs + (row0[i] + T - km + j) * zs_stride + E, sizeof(float) * (size_t)Cc);
    }
    const int par_heads = nthreads > 1 && n * H > 1 && rows * H * p.N * P >= PAR_MIN_ELEMS;
#pragma omp parallel for schedule(static) num_threads(nthreads) if (par_heads)
    for (int64_t ih = 0; ih < n * H; ih++) {
        const int64_t i = ih / H, h = ih % H, g = h / (H / p.G);
        const float *w = work + base[i] * wrow;
        const ss_span sp = {w + h * P, w + Cc + h, w + Cc + H + h, w + E + g * p.N, w + E + GN + g * p.N,
                            out + row0[i] * E + h * P, wrow, wrow, wrow, E};
        float xdt[P];
        ss_head_span(ssm_states + (slot[i] * H + h) * p.N * P, &sp, len[i], P, p.N, xdt);
    }
    const int64_t gw = E / p.G;
#pragma omp parallel for schedule(static) num_threads(nthreads) if (par_rows)
    for (int64_t r = 0; r < rows; r++) {   /* y + D x, gated by silu(z), RMS-normed per group */
        int64_t i = 0;
        while (base[i + 1] <= r) i++;
        const int64_t row = row0[i] + r - base[i];
        const float *x = work + r * wrow, *z = zs + row * zs_stride;
        float *y = out + row * E;
        for (int64_t h = 0; h < H; h++)
            for (int64_t q = 0; q < P; q++) y[h * P + q] = y[h * P + q] + x[h * P + q] * p.d[h];
        vm_gate_silu(y, z, E);
        for (int64_t g = 0; g < p.G; g++) {
            float *yg = y + g * gw;
            const float f = 1.0f / sqrtf(vm_sum_squares(yg, gw) * (1.0f / (float)gw) + p.eps);
            for (int64_t q = 0; q < gw; q++) yg[q] = (yg[q] * f) * p.norm[g * gw + q];
        }
    }
    free(work);
    free(base);
    return 0;
}
