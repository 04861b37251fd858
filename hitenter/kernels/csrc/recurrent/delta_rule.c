/* The gated delta rule over one sequence's span (hitenter/kernels/delta_rule.py states it in torch; Gated
   DeltaNet layers, hitenter/models/recurrent/gated_deltanet.py). Per value head h, state S [dk, dv] (row i
   of S: dv contiguous floats), for each token t in order:

       S = S * e^g;  d = (v - k S) * beta;  S = S + k^T d;  o = (q S) * scale

   Two passes over S per token: (1) read only, k S and q S accumulated together (with e^g factored out:
   k (S e^g) = (k S) e^g); then d, and o = ((q S) e^g + (q . k) d) * scale, which is q S_new; (2) S = S e^g +
   k^T d, row by row. The sums run over the rows i in order, lane j holding column j, so there is no
   horizontal reduction: with -ffp-contract=off every variant (AVX-512, AVX2, the
   portable code) does the same operations in the same order and gives the same bits, on any thread count
   (a head's work never depends on the other heads).

   Layouts (float32, contiguous): state [H, dk, dv] (updated in place), q and k [T, H, dk], v and o
   [T, H, dv], g and beta [T, H]. dv a multiple of 16 up to 256 takes the vector code, any other dv the
   scalar loop (same order of operations); the per-head code is in delta_rule.h. */
#include <stdint.h>

#include "delta_rule.h"

/* Head h of the packed layouts below. */
static void head_span(float *S, const float *q, const float *k, const float *v, const float *g, const float *beta,
                      float *o, int64_t T, int64_t H, int64_t dk, int64_t dv, int64_t h, float scale) {
    const dr_span sp = {q + h * dk, k + h * dk, v + h * dv, g + h, beta + h, o + h * dv, H * dk, H * dv, H, H * dv};
    dr_head_span(S, &sp, T, dk, dv, scale);
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
