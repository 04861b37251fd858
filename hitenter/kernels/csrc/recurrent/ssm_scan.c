/* The recurrences of the Mamba2 and short-convolution mixers over one sequence's span
   (hitenter/kernels/ssm_scan.py states them in torch; hitenter/models/recurrent/mamba2.py, short_conv.py).

   causal_conv: the depthwise causal convolution with its tail. For the window u = [tail ; x]
   ([K - 1 + n, C]) and taps w [C, K]: y[t, c] = u[t, c] w[c, 0] + u[t + 1, c] w[c, 1] + ... in tap order,
   each product rounded then added (-ffp-contract=off: the torch reference's bits exactly); the tail
   becomes u's last K - 1 rows.

   mamba2_scan: per head h (group g = h / (H / G); heads split over threads), per token in order, with the
   head's state S [N, P] (row i: P contiguous floats, lanes on p): xdt = x dt; for i = 0..N-1 in order:
   S[i] = S[i] da + B[g, i] xdt; y = y + S[i] C[g, i]. The state's bits equal the reference's (the same
   two roundings per element); y's sum runs in index order (torch's reduction order may differ: agreement
   to float rounding). A head's work never depends on the other heads, the thread count or how the tokens
   were cut into spans, so a row's bits depend only on its sequence.

   Layouts (float32, contiguous): tail [K - 1, C], x [n, C], w [C, K], y [n, C]; state [H, N, P],
   xs [n, H, P], dt and da [n, H], B and C [n, G, N], ys [n, H, P]. The per-head scan is in ssm_scan.h. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ssm_scan.h"

int causal_conv(float *tail, const float *x, const float *w, float *y, int64_t n, int64_t C, int64_t K) {
    if (n < 0 || C < 1 || K < 2) return 1;
    const int64_t km = K - 1;
    float *u = (float *)malloc(sizeof(float) * (size_t)((km + n) * C));
    if (!u) return 2;
    memcpy(u, tail, sizeof(float) * (size_t)(km * C));
    memcpy(u + km * C, x, sizeof(float) * (size_t)(n * C));
    for (int64_t t = 0; t < n; t++) {
        float *yt = y + t * C;
        for (int64_t c = 0; c < C; c++) yt[c] = u[t * C + c] * w[c * K];
        for (int64_t j = 1; j < K; j++) {
            const float *ut = u + (t + j) * C;
            for (int64_t c = 0; c < C; c++) yt[c] = yt[c] + ut[c] * w[c * K + j];
        }
    }
    memcpy(tail, u + n * C, sizeof(float) * (size_t)(km * C));
    free(u);
    return 0;
}

/* Head h of the packed layouts above. */
static void head_span(float *S, const float *xs, const float *dt, const float *da, const float *B, const float *Cm,
                      float *ys, int64_t n, int64_t H, int64_t P, int64_t N, int64_t G, int64_t h, float *xdt) {
    const int64_t g = h / (H / G);
    const ss_span sp = {xs + h * P, dt + h, da + h, B + g * N, Cm + g * N, ys + h * P, H * P, H, G * N, H * P};
    ss_head_span(S, &sp, n, P, N, xdt);
}

int mamba2_scan(float *state, const float *xs, const float *dt, const float *da, const float *B, const float *Cm,
                float *ys, int64_t n, int64_t H, int64_t P, int64_t N, int64_t G, int nthreads) {
    if (n < 0 || H < 1 || P < 1 || P > 4096 || N < 1 || G < 1 || H % G) return 1;
    if (n == 0) return 0;
#pragma omp parallel for schedule(static) num_threads(nthreads) if (nthreads > 1 && H > 1)
    for (int64_t h = 0; h < H; h++) {
        float xdt[P];
        head_span(state + h * N * P, xs, dt, da, B, Cm, ys, n, H, P, N, G, h, xdt);
    }
    return 0;
}
