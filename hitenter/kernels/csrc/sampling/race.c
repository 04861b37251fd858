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
#include <math.h>
#include <stdint.h>
#include <string.h>
#include "../common/vec16.h"

#define GOLDEN 0x9E3779B97F4A7C15ULL

#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
#define RACE_AVX2 1   /* race_row below: 8-lane intrinsics */
#endif

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

#ifndef RACE_AVX2
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

#endif

#ifdef RACE_AVX2
/* AVX2 without AVX-512: the same race over 8 lanes in explicit intrinsics. The generic code above, written
   for 16 lanes of AVX-512, compiles here to spills and emulated 64-bit lanes, many times slower. The draws u
   are the same integers; the log and exp are the same polynomials with explicit FMAs (GCC's contraction of
   the generic code may round differently in the last bit). */
#include "../common/avx2_math.h"

/* Pruning, exact: every q is at least -log(1 - 2^-24) ~ 5.96e-8 (u <= 1 - 2^-24), so a token with
   e^d < best * Q_FLOOR (d = its logit minus the row's max) scores e^d / q < best: it can neither win nor tie,
   and its draw is not made. The floor is refreshed from the best score every PRUNE_EVERY blocks of 8 (0.01
   below, for the polynomials' rounding). At temperature 1 with real logits few tokens are cut; at lower
   temperatures, and rows a top-k / top-p / min-p filter left mostly -inf, most blocks are skipped. */
#define Q_FLOOR 5.0e-8f
#define PRUNE_EVERY 32

/* the low 64 bits of z * c in each of 4 lanes (AVX2 has no 64-bit multiply): three 32 x 32 products */
A2_INLINE __m256i mul64(__m256i z, uint64_t c) {
    const __m256i clo = _mm256_set1_epi64x((int64_t)(c & 0xffffffffu)), chi = _mm256_set1_epi64x((int64_t)(c >> 32));
    const __m256i cross = _mm256_add_epi64(_mm256_mul_epu32(_mm256_srli_epi64(z, 32), clo), _mm256_mul_epu32(z, chi));
    return _mm256_add_epi64(_mm256_mul_epu32(z, clo), _mm256_slli_epi64(cross, 32));
}

A2_INLINE __m256i mix4(__m256i z) {
    z = mul64(_mm256_xor_si256(z, _mm256_srli_epi64(z, 30)), 0xBF58476D1CE4E5B9ULL);
    z = mul64(_mm256_xor_si256(z, _mm256_srli_epi64(z, 27)), 0x94D049BB133111EBULL);
    return _mm256_xor_si256(z, _mm256_srli_epi64(z, 31));
}

/* vlog's polynomial, 8 lanes */
A2_INLINE __m256 log8(__m256 u) {
    const __m256i bits = _mm256_castps_si256(u);
    __m256 e = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(_mm256_srli_epi32(bits, 23), _mm256_set1_epi32(0xff)),
                                                   _mm256_set1_epi32(126)));
    const __m256 m = _mm256_castsi256_ps(_mm256_or_si256(_mm256_and_si256(bits, _mm256_set1_epi32(0x007fffff)),
                                                         _mm256_set1_epi32(0x3f000000)));
    const __m256 small = _mm256_cmp_ps(m, _mm256_set1_ps(0.707106781186547524f), _CMP_LT_OQ);
    e = _mm256_blendv_ps(e, _mm256_sub_ps(e, _mm256_set1_ps(1.0f)), small);
    const __m256 x = _mm256_sub_ps(_mm256_blendv_ps(m, _mm256_add_ps(m, m), small), _mm256_set1_ps(1.0f));
    const __m256 z = _mm256_mul_ps(x, x);
    __m256 y = _mm256_fmsub_ps(x, _mm256_set1_ps(7.0376836292E-2f), _mm256_set1_ps(1.1514610310E-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.1676998740E-1f));
    y = _mm256_fmsub_ps(y, x, _mm256_set1_ps(1.2420140846E-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.4249322787E-1f));
    y = _mm256_fmsub_ps(y, x, _mm256_set1_ps(1.6668057665E-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(2.0000714765E-1f));
    y = _mm256_fmsub_ps(y, x, _mm256_set1_ps(2.4999993993E-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(3.3333331174E-1f));
    y = _mm256_fmadd_ps(_mm256_mul_ps(y, x), z, _mm256_mul_ps(e, _mm256_set1_ps(-2.12194440e-4f)));
    y = _mm256_fnmadd_ps(_mm256_set1_ps(0.5f), z, y);
    return _mm256_fmadd_ps(e, _mm256_set1_ps(0.693359375f), _mm256_add_ps(x, y));
}

/* u of tokens i0 .. i0 + 7 from z0 = seed + (i0 + 1) * GOLDEN: lanes 0, 2, 4, 6 hashed in one 64-bit vector,
   1, 3, 5, 7 in another, so their low halves interleave into token order */
A2_INLINE __m256 uniforms8(uint64_t z0) {
    const uint64_t g = GOLDEN;
    const __m256i ev = _mm256_setr_epi64x((int64_t)z0, (int64_t)(z0 + 2 * g), (int64_t)(z0 + 4 * g), (int64_t)(z0 + 6 * g));
    const __m256i a = _mm256_srli_epi64(mix4(ev), 41);
    const __m256i b = _mm256_srli_epi64(mix4(_mm256_add_epi64(ev, _mm256_set1_epi64x((int64_t)g))), 41);
    const __m256i k = _mm256_blend_epi32(a, _mm256_slli_epi64(b, 32), 0xAA);
    const __m256i odd = _mm256_add_epi32(_mm256_add_epi32(k, k), _mm256_set1_epi32(1));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(odd), _mm256_set1_ps(0x1p-24f));
}

static float row_max8(const float *x, int64_t v) {
    __m256 mx = _mm256_set1_ps(-__builtin_inff());
    int64_t i = 0;
    for (; i + 8 <= v; i += 8) {
        const __m256 t = _mm256_loadu_ps(x + i);
        mx = _mm256_blendv_ps(mx, t, _mm256_cmp_ps(t, mx, _CMP_GT_OQ));   /* NaN never wins */
    }
    float m = hmax8(mx);
    for (; i < v; i++) m = x[i] > m ? x[i] : m;
    return m;
}

static int64_t race_row(const float *x, int64_t v, uint64_t seed) {
    const float m = row_max8(x, v);
    if (!(m > -__builtin_inff()) || m != m || m == __builtin_inff()) return 0;
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256 mm = _mm256_set1_ps(m), cut = _mm256_set1_ps(-87.0f), zero = _mm256_setzero_ps();
    __m256 best = _mm256_set1_ps(-1.0f);
    __m256i arg = _mm256_setzero_si256();
    uint64_t z0 = seed + GOLDEN;   /* token i's hash input: seed + (i + 1) * GOLDEN */
    __m256 floor_d = cut;   /* d below this: the token cannot reach the best score so far (see PRUNE_EVERY) */
    for (int64_t i = 0; i < v; i += 8, z0 += 8 * GOLDEN) {
        if ((i & (8 * PRUNE_EVERY - 1)) == 0 && i) {
            const float bm = hmax8(best);
            if (bm > 0.0f) floor_d = _mm256_max_ps(cut, _mm256_set1_ps(logf(bm * Q_FLOOR) - 0.01f));
        }
        __m256 t;
        if (i + 8 <= v) t = _mm256_loadu_ps(x + i);
        else {   /* the tail, padded with -inf */
            float tail[8];
            for (int l = 0; l < 8; l++) tail[l] = i + l < v ? x[i + l] : -__builtin_inff();
            t = _mm256_loadu_ps(tail);
        }
        const __m256 d = _mm256_sub_ps(t, mm);
        const __m256 live = _mm256_cmp_ps(d, cut, _CMP_GT_OQ);   /* NaN: false */
        const __m256 hope = _mm256_cmp_ps(d, floor_d, _CMP_GE_OQ);
        if (_mm256_testz_ps(hope, hope)) continue;   /* none of the 8 can win (dead lanes score 0 anyway) */
        const __m256 q = _mm256_sub_ps(zero, log8(uniforms8(z0)));
        const __m256 s = _mm256_and_ps(_mm256_div_ps(exp8(d), q), live);
        const __m256 gt = _mm256_cmp_ps(s, best, _CMP_GT_OQ);
        best = _mm256_blendv_ps(best, s, gt);
        arg = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(arg),
                                                   _mm256_castsi256_ps(_mm256_add_epi32(lane, _mm256_set1_epi32((int)i))), gt));
    }
    float b[8] __attribute__((aligned(32)));
    int32_t a[8] __attribute__((aligned(32)));
    _mm256_store_ps(b, best);
    _mm256_store_si256((__m256i *)a, arg);
    float bs = -1.0f;
    int64_t tok = 0;
    for (int l = 0; l < 8; l++)
        if (b[l] > bs || (b[l] == bs && a[l] < tok)) bs = b[l], tok = a[l];
    return tok;
}

/* the kernel's q = -log(u) of token i (race_q below) */
static float token_q(uint64_t seed, int64_t i) {
    float q[8];
    _mm256_storeu_ps(q, _mm256_sub_ps(_mm256_setzero_ps(), log8(uniforms8(seed + (uint64_t)(i + 1) * GOLDEN))));
    return q[0];
}
#else
static float token_q(uint64_t seed, int64_t i) { return -vlog(uniforms16(seed, i))[0]; }
#endif

/* tokens[r] for the n rows of x (row stride ldx floats, v tokens), seeds[r] per row; returns 0 */
int race_argmax(const float *x, int64_t n, int64_t v, int64_t ldx, const uint64_t *seeds, int64_t *tokens,
                int nthreads) {
#pragma omp parallel for schedule(static) num_threads(nthreads) if (nthreads > 1 && n > 1)
    for (int64_t r = 0; r < n; r++) tokens[r] = race_row(x + r * ldx, v, seeds[r]);
    return 0;
}

/* the race's q = -log(u) of tokens ids[0 .. k) for one seed (the kernel's own log, for tests and traces) */
void race_q(uint64_t seed, const int64_t *ids, int64_t k, float *q) {
    for (int64_t j = 0; j < k; j++) q[j] = token_q(seed, ids[j]);
}
