/* The gated delta rule over one sequence's span (hitenter/kernels/delta_rule.py states it in torch; Gated
   DeltaNet layers, hitenter/models/recurrent/gated_deltanet.py). Per value head h, state S [dk, dv] (row i
   of S: dv contiguous floats), for each token t in order:

       S = S * e^g;  d = (v - k S) * beta;  S = S + k^T d;  o = (q S) * scale

   Two passes over S per token: (1) decay each row and accumulate k_i * row into the dv-wide k S;
   (2) add k_i * d to each row and accumulate q_i * row into o. The sums run over the rows i in order,
   lane j holding column j, so there is no horizontal reduction: with -ffp-contract=off every variant
   (AVX-512, AVX2 as two 8-lane halves, the portable code) does the same operations in the same order and
   gives the same bits, on any thread count (a head's work never depends on the other heads).

   Layouts (float32, contiguous): state [H, dk, dv] (updated in place), q and k [T, H, dk], v and o
   [T, H, dv], g and beta [T, H]. dv a multiple of 16 up to 256 takes the vector code, any other dv the
   scalar loop (same order of operations). */
#include <math.h>
#include <stdint.h>

typedef float v16 __attribute__((vector_size(64)));
typedef float v16u __attribute__((vector_size(64), aligned(4)));   /* an unaligned load / store */

#define MAXNV 16

static inline __attribute__((always_inline)) void head_span_vec(
        float *S, const float *q, const float *k, const float *v, const float *g, const float *beta, float *o,
        int64_t T, int64_t H, int64_t dk, int64_t h, const int nv, float scale) {
    const int64_t dv = 16 * nv;
    for (int64_t t = 0; t < T; t++) {
        const float *qt = q + (t * H + h) * dk, *kt = k + (t * H + h) * dk;
        const float *vt = v + (t * H + h) * dv;
        const float e = expf(g[t * H + h]), b = beta[t * H + h];
        v16 acc[MAXNV], d[MAXNV];
        for (int u = 0; u < nv; u++) acc[u] = (v16){0};
        for (int64_t i = 0; i < dk; i++) {
            v16u *row = (v16u *)(S + i * dv);
            const float ki = kt[i];
            for (int u = 0; u < nv; u++) {
                const v16 r = row[u] * e;
                row[u] = r;
                acc[u] = acc[u] + r * ki;
            }
        }
        for (int u = 0; u < nv; u++) {
            d[u] = (((const v16u *)vt)[u] - acc[u]) * b;
            acc[u] = (v16){0};
        }
        for (int64_t i = 0; i < dk; i++) {
            v16u *row = (v16u *)(S + i * dv);
            const float ki = kt[i], qi = qt[i];
            for (int u = 0; u < nv; u++) {
                const v16 r = row[u] + d[u] * ki;
                row[u] = r;
                acc[u] = acc[u] + r * qi;
            }
        }
        v16u *ot = (v16u *)(o + (t * H + h) * dv);
        for (int u = 0; u < nv; u++) ot[u] = acc[u] * scale;
    }
}

static void head_span_scalar(float *S, const float *q, const float *k, const float *v, const float *g,
                             const float *beta, float *o, int64_t T, int64_t H, int64_t dk, int64_t dv, int64_t h,
                             float scale, float *acc, float *d) {
    for (int64_t t = 0; t < T; t++) {
        const float *qt = q + (t * H + h) * dk, *kt = k + (t * H + h) * dk;
        const float *vt = v + (t * H + h) * dv;
        const float e = expf(g[t * H + h]), b = beta[t * H + h];
        for (int64_t j = 0; j < dv; j++) acc[j] = 0.0f;
        for (int64_t i = 0; i < dk; i++) {
            float *row = S + i * dv;
            for (int64_t j = 0; j < dv; j++) {
                const float r = row[j] * e;
                row[j] = r;
                acc[j] = acc[j] + r * kt[i];
            }
        }
        for (int64_t j = 0; j < dv; j++) {
            d[j] = (vt[j] - acc[j]) * b;
            acc[j] = 0.0f;
        }
        for (int64_t i = 0; i < dk; i++) {
            float *row = S + i * dv;
            for (int64_t j = 0; j < dv; j++) {
                const float r = row[j] + d[j] * kt[i];
                row[j] = r;
                acc[j] = acc[j] + r * qt[i];
            }
        }
        float *ot = o + (t * H + h) * dv;
        for (int64_t j = 0; j < dv; j++) ot[j] = acc[j] * scale;
    }
}

#define CASE(NV) case NV: head_span_vec(S, q, k, v, g, beta, o, T, H, dk, h, NV, scale); break;

static void head_span(float *S, const float *q, const float *k, const float *v, const float *g, const float *beta,
                      float *o, int64_t T, int64_t H, int64_t dk, int64_t dv, int64_t h, float scale) {
    if (dv % 16 == 0 && dv / 16 <= MAXNV) {
        switch (dv / 16) {
            CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) CASE(8)
            CASE(9) CASE(10) CASE(11) CASE(12) CASE(13) CASE(14) CASE(15) CASE(16)
        }
        return;
    }
    float acc[dv], d[dv];
    head_span_scalar(S, q, k, v, g, beta, o, T, H, dk, dv, h, scale, acc, d);
}

/* The span's T tokens through every head's state; heads split over nthreads. Returns 0, or -1 for bad
   sizes. */
int delta_rule(float *state, const float *q, const float *k, const float *v, const float *g, const float *beta,
               float *o, int64_t T, int64_t H, int64_t dk, int64_t dv, float scale, int nthreads) {
    if (T < 0 || H <= 0 || dk <= 0 || dv <= 0 || dv > 4096) return -1;
    if (T == 0) return 0;
#pragma omp parallel for schedule(static) num_threads(nthreads) if (nthreads > 1 && H > 1)
    for (int64_t h = 0; h < H; h++)
        head_span(state + h * dk * dv, q, k, v, g, beta, o, T, H, dk, dv, h, scale);
    return 0;
}
