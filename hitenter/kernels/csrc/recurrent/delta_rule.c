/* The gated delta rule over one sequence's span (hitenter/kernels/delta_rule.py states it in torch; Gated
   DeltaNet layers, hitenter/models/recurrent/gated_deltanet.py). Per value head h, state S [dk, dv] (row i
   of S: dv contiguous floats), for each token t in order:

       S = S * e^g;  d = (v - k S) * beta;  S = S + k^T d;  o = (q S) * scale

   Two passes over S per token: (1) read only, k S and q S accumulated together (with e^g factored out:
   k (S e^g) = (k S) e^g); then d, and o = ((q S) e^g + (q . k) d) * scale, which is q S_new; (2) S = S e^g +
   k^T d, row by row. The sums run over the rows i in order, lane j holding column j, so there is no
   horizontal reduction: with -ffp-contract=off every variant (AVX-512, AVX2 as two 8-lane halves, the
   portable code) does the same operations in the same order and gives the same bits, on any thread count
   (a head's work never depends on the other heads).

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
        v16 ak[MAXNV], aq[MAXNV], d[MAXNV];
        for (int u = 0; u < nv; u++) ak[u] = aq[u] = (v16){0};
        float qk = 0.0f;
        for (int64_t i = 0; i < dk; i++) {           /* pass 1, read only: k S and q S */
            const v16u *row = (const v16u *)(S + i * dv);
            const float ki = kt[i], qi = qt[i];
            qk = qk + qi * ki;
            for (int u = 0; u < nv; u++) {
                const v16 r = row[u];
                ak[u] = ak[u] + r * ki;
                aq[u] = aq[u] + r * qi;
            }
        }
        v16u *ot = (v16u *)(o + (t * H + h) * dv);
        for (int u = 0; u < nv; u++) {
            d[u] = (((const v16u *)vt)[u] - ak[u] * e) * b;
            ot[u] = (aq[u] * e + d[u] * qk) * scale;
        }
        for (int64_t i = 0; i < dk; i++) {           /* pass 2: S = S e + k d */
            v16u *row = (v16u *)(S + i * dv);
            const float ki = kt[i];
            for (int u = 0; u < nv; u++) row[u] = row[u] * e + d[u] * ki;
        }
    }
}

static void head_span_scalar(float *S, const float *q, const float *k, const float *v, const float *g,
                             const float *beta, float *o, int64_t T, int64_t H, int64_t dk, int64_t dv, int64_t h,
                             float scale, float *ak, float *aq) {
    for (int64_t t = 0; t < T; t++) {
        const float *qt = q + (t * H + h) * dk, *kt = k + (t * H + h) * dk;
        const float *vt = v + (t * H + h) * dv;
        const float e = expf(g[t * H + h]), b = beta[t * H + h];
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
        float *ot = o + (t * H + h) * dv;
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
    float ak[dv], aq[dv];
    head_span_scalar(S, q, k, v, g, beta, o, T, H, dk, dv, h, scale, ak, aq);
}

/* Threads only for work worth waking them for (T H dk dv state elements passed over): a lone token of 16
   heads of 128 x 128 runs slower on two threads of a busy machine than on one. */
#define PAR_MIN_ELEMS (1 << 21)

/* The span's T tokens through every head's state; heads split over nthreads. Returns 0, or -1 for bad
   sizes. */
int delta_rule(float *state, const float *q, const float *k, const float *v, const float *g, const float *beta,
               float *o, int64_t T, int64_t H, int64_t dk, int64_t dv, float scale, int nthreads) {
    if (T < 0 || H <= 0 || dk <= 0 || dv <= 0 || dv > 4096) return -1;
    if (T == 0) return 0;
    const int par = nthreads > 1 && H > 1 && T * H * dk * dv >= PAR_MIN_ELEMS;
#pragma omp parallel for schedule(static) num_threads(nthreads) if (par)
    for (int64_t h = 0; h < H; h++)
        head_span(state + h * dk * dv, q, k, v, g, beta, o, T, H, dk, dv, h, scale);
    return 0;
}

/* N sequences' one token each (generation rows): row r updates the state at states + slots[r] * slot_stride
   (floats; [H, dk, dv] each), with q, k [N, H, dk], v, o [N, H, dv], g, beta [N, H]. Each (row, head) is
   the same arithmetic as delta_rule on that row alone (T = 1), so the bits are those of a one-row span.
   Returns 0, or -1 for bad sizes. */
int delta_rule_rows(float *states, const int64_t *slots, int64_t slot_stride, const float *q, const float *k,
                    const float *v, const float *g, const float *beta, float *o, int64_t N, int64_t H, int64_t dk,
                    int64_t dv, float scale, int nthreads) {
    if (N < 0 || H <= 0 || dk <= 0 || dv <= 0 || dv > 4096 || slot_stride < H * dk * dv) return -1;
    const int par = nthreads > 1 && N * H > 1 && N * H * dk * dv >= PAR_MIN_ELEMS;
#pragma omp parallel for schedule(static) num_threads(nthreads) if (par)
    for (int64_t rh = 0; rh < N * H; rh++) {
        const int64_t r = rh / H, h = rh % H;
        head_span(states + slots[r] * slot_stride + h * dk * dv, q + r * H * dk, k + r * H * dk, v + r * H * dv,
                  g + r * H, beta + r * H, o + r * H * dv, 1, H, dk, dv, h, scale);
    }
    return 0;
}
