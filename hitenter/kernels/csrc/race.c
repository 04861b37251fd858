/* The exponential race of the sampler (hitenter/kernels/race.py has the statement in torch and numpy):
 * for each row, token = argmax_i p_i / q_i over the vocabulary, p = softmax(x) of the processed logits,
 * q_i = -log(u_i) ~ Exp(1), u_i = (2 * (h_i >> 41) + 1) * 2^-24 with h_i the i-th output of SplitMix64
 * seeded with the row's seed. The draws are counter-based (u_i needs only the seed and i), so one pass
 * makes, uses and forgets them: no [rows, V] array of draws is written or read, and a trace can recompute
 * the q of any token afterwards.
 *
 * Per 16 tokens: two SplitMix64 hashes of 8 lanes, one log, one exp, one division (vec16.h style GCC
 * vector code; -march=native picks AVX-512 or 2 x AVX2). exp(x - max) is the unnormalized p (argmax is
 * unchanged by the row's constant 1 / sum). Tokens more than 87 below the row's max (and -inf, filtered
 * ones) score 0: with q >= 2^-24 such a token's p / q stays below 1e-30, under any finite winner's 1 / 17.
 * Ties go to the lower id, a row of only -inf / NaN gives token 0, as the reference's argmax does. */
#include <stdint.h>
#include <string.h>
#include "vec16.h"

#define GOLDEN 0x9E3779B97F4A7C15ULL

typedef uint64_t v8u __attribute__((vector_size(64)));
typedef int32_t v8i __attribute__((vector_size(32)));

static inline v8u mix8(v8u z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

/* u of tokens i0 .. i0 + 15: exact in fp32, in (0, 1) */
static inline v16 uniforms16(uint64_t seed, int64_t i0) {
    const v8u lane = {1, 2, 3, 4, 5, 6, 7, 8};
    const v8u a = mix8(seed + (lane + (uint64_t)i0) * GOLDEN);
    const v8u b = mix8(seed + (lane + (uint64_t)(i0 + 8)) * GOLDEN);
    const v8i ka = __builtin_convertvector(a >> 41, v8i), kb = __builtin_convertvector(b >> 41, v8i);
    const v16i k = __builtin_shufflevector(ka, kb, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    return __builtin_convertvector(k * 2 + 1, v16) * 0x1p-24f;
}

/* natural log of normal positive floats (the Cephes logf polynomial, ~1 ulp) */
static inline v16 vlog(v16 u) {
    const v16i bits = (v16i)u;
    v16 e = __builtin_convertvector(((bits >> 23) & 0xff) - 126, v16);
    v16 m = (v16)((bits & 0x007fffff) | 0x3f000000);        /* [0.5, 1) */
    const v16i small = m < 0.707106781186547524f;
    e = vsel(small, e - 1.0f, e);
    const v16 x = vsel(small, m + m, m) - 1.0f;
    const v16 z = x * x;
    v16 y = x * 7.0376836292E-2f - 1.1514610310E-1f;
    y = y * x + 1.1676998740E-1f;
    y = y * x - 1.2420140846E-1f;
    y = y * x + 1.4249322787E-1f;
    y = y * x - 1.6668057665E-1f;
    y = y * x + 2.0000714765E-1f;
    y = y * x - 2.4999993993E-1f;
    y = y * x + 3.3333331174E-1f;
    y = y * x * z + e * -2.12194440e-4f - 0.5f * z;
    return x + y + e * 0.693359375f;
}

static float row_max(const float *x, int64_t v) {
    v16 mx = (v16){0} - __builtin_inff();
    int64_t i = 0;
    for (; i + 16 <= v; i += 16) {
        v16 t;
        memcpy(&t, x + i, sizeof t);
        mx = vsel(t > mx, t, mx);   /* NaN never wins */
    }
    float m = -__builtin_inff();
    for (int l = 0; l < 16; l++) m = mx[l] > m ? mx[l] : m;
    for (; i < v; i++) m = x[i] > m ? x[i] : m;
    return m;
}

static int64_t race_row(const float *x, int64_t v, uint64_t seed) {
    const float m = row_max(x, v);
    if (!(m > -__builtin_inff()) || m != m || m == __builtin_inff()) return 0;
    const v16i lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    v16 best = (v16){0} - 1.0f;
    v16i arg = (v16i){0};
    for (int64_t i = 0; i < v; i += 16) {
        v16 t;
        if (i + 16 <= v) {
            memcpy(&t, x + i, sizeof t);
        } else {   /* the tail, padded with -inf */
            for (int l = 0; l < 16; l++) t[l] = i + l < v ? x[i + l] : -__builtin_inff();
        }
        const v16 d = t - m;
        const v16 q = (v16){0} - vlog(uniforms16(seed, i));
        const v16 s = vsel(d > -87.0f, vexp(d) / q, (v16){0});    /* NaN: d > -87 false */
        const v16i gt = s > best;
        best = vsel(gt, s, best);
        arg = (v16i)vsel(gt, (v16)(lane + (int32_t)i), (v16)arg);
    }
    float bs = -1.0f;
    int64_t tok = 0;
    for (int l = 0; l < 16; l++)
        if (best[l] > bs || (best[l] == bs && arg[l] < tok)) bs = best[l], tok = arg[l];
    return tok;
}

/* tokens[r] for the n rows of x (row stride ldx floats, v tokens), seeds[r] per row; returns 0 */
int race_argmax(const float *x, int64_t n, int64_t v, int64_t ldx, const uint64_t *seeds, int64_t *tokens,
                int nthreads) {
#pragma omp parallel for schedule(static) num_threads(nthreads) if (nthreads > 1 && n > 1)
    for (int64_t r = 0; r < n; r++) tokens[r] = race_row(x + r * ldx, v, seeds[r]);
    return 0;
}

/* the race's q = -log(u) of tokens ids[0 .. k) for one seed (the kernel's own log, for tests and traces) */
void race_q(uint64_t seed, const int64_t *ids, int64_t k, float *q) {
    for (int64_t j = 0; j < k; j++) {
        const v16 u = uniforms16(seed, ids[j]);
        q[j] = -vlog(u)[0];
    }
}
