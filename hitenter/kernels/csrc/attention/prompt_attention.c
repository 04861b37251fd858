/* Causal attention for prompt rows, read from the paged cache in place (hitenter/models/prompt_kernel.py).

   Work item: a block of up to RB consecutive rows of one sequence and one KV head (G query heads each).
   Key tiles of 16, from key 0 (tile boundaries fixed by position, never by the chunking): each tile's
   K rows are transposed once into Kt[D][16] and serve every query vector of the block (key reuse, the
   decode kernel has none), the scores of 16 keys are one vector per query (a sequential FMA over d, no
   reduction tree), online softmax in fp32 per query, P.V per key in order.

   Bits: a query vector's arithmetic depends only on itself, its position and the keys (their values and
   fixed tiling), never on the rows sharing its block or the thread: a row's output is the same however
   the prompt is chunked or batched. Masked keys (after the row's position, or outside its window) add
   exact zeros; a tile fully masked for a row is skipped for it. Cache [2, KVH, NB, BS, D] of fp32, bf16
   or f16, or q8_0 rows of D / 32 blocks of 34 bytes (`types`, vec16.h): a half-precision tile's 16 K and V
   rows are widened (exactly) to fp32 once, a q8_0 tile's dequantized once (d * q, exact), and serve every
   query of the block, so the arithmetic is that of an fp32 cache holding the same values. q / out fp32. D % 16 == 0, D <= 512, H / KVH <= 16. */
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <stdlib.h>

#include "../common/vec16.h"

#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
#include "attn_avx2.h"   /* 8-lane register blocks for AVX2 (see there) */
#define ITEM prompt_item_avx2
#else
#define ITEM item
#endif

#define RB 32         /* rows per work item */
#define QG 8          /* query vectors whose scores are computed together */
#define MAXG 16
#define MAXNV 32   /* head_dim up to 512 */

static inline v16 vmax16(v16 a, v16 b) { return vsel(a > b, a, b); }

typedef struct { float m, l; } qstate;

/* softmax step of query qi for the tile: masked scores s -> probabilities (into pr), returns the
   correction of its running sums (0 for its first tile) */
static inline __attribute__((always_inline)) float softmax_step(qstate *st, v16 s, v16i valid, v16 *pr) {
    s = vsel(valid, s, (v16){0} - INFINITY);
    v16 t = vmax16(s, __builtin_shufflevector(s, s, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7));
    t = vmax16(t, __builtin_shufflevector(t, t, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11));
    t = vmax16(t, __builtin_shufflevector(t, t, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13));
    t = vmax16(t, __builtin_shufflevector(t, t, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14));
    const float nm = t[0] > st->m ? t[0] : st->m;
    *pr = vsel(valid, vexp(s - nm), (v16){0});
    const float corr = st->m == -INFINITY ? 0.f : expf(st->m - nm);
    st->l = st->l * corr + hsum(*pr);
    st->m = nm;
    return corr;
}

/* acc[qi[u]] = acc * corr[u] + sum over the tile's keys t (in order) of pr[u][t] * V[t], for nu <= 4
   queries and the d-vectors i0 .. i0+ni-1: each V row is loaded once for all of them. Inlined with
   constant nu and ni for the full case, so the 16 accumulators stay in registers. */
static inline __attribute__((always_inline)) void pv_part(float *acc, const int *qi, const int nu, const float *corr,
                                                          const float (*pr)[16], const float *const vrow[16], int nk,
                                                          int i0, const int ni, int D) {
    v16 x[4][4];
    for (int u = 0; u < nu; u++)
        for (int i = 0; i < ni; i++) {
            memcpy(&x[u][i], acc + (size_t)qi[u] * D + 16 * (i0 + i), 64);
            x[u][i] = x[u][i] * corr[u];
        }
    for (int t = 0; t < nk; t++)
        for (int i = 0; i < ni; i++) {
            v16 vv;
            memcpy(&vv, vrow[t] + 16 * (i0 + i), 64);
            for (int u = 0; u < nu; u++) x[u][i] += pr[u][t] * vv;
        }
    for (int u = 0; u < nu; u++)
        for (int i = 0; i < ni; i++) memcpy(acc + (size_t)qi[u] * D + 16 * (i0 + i), &x[u][i], 64);
}

static void pv_update(float *acc, const int *qi, int nu, const float *corr, const float (*pr)[16],
                      const float *const vrow[16], int nk, int NV, int D) {
    for (int u0 = 0; u0 < nu; u0 += 4) {
        const int nn = nu - u0 < 4 ? nu - u0 : 4;
        for (int i0 = 0; i0 < NV; i0 += 4) {
            if (nn == 4 && NV - i0 >= 4) pv_part(acc, qi + u0, 4, corr + u0, pr + u0, vrow, nk, i0, 4, D);
            else pv_part(acc, qi + u0, nn, corr + u0, pr + u0, vrow, nk, i0, NV - i0 < 4 ? NV - i0 : 4, D);
        }
    }
}

/* rows r0 .. r0+n-1 (flat rows of q/out), positions p0 .. p0+n-1, KV head h */
__attribute__((unused)) static void item(const float *q, float *out, const void *kv, int kvt, int64_t r0, int n, int64_t p0, int h,
                 const int64_t *table, int H, int KVH, int64_t NB, int BS, int D, float scale, int64_t window,
                 float *scratch) {
    const int G = H / KVH, NV = D / 16, nq = n * G;
    float *qs = scratch;                     /* [nq][D] scaled queries */
    float *acc = qs + (size_t)nq * D;        /* [nq][D] */
    float *kt = acc + (size_t)nq * D;        /* [D][16] the tile's keys, transposed */
    float *kf = kt + (size_t)16 * D;         /* [16][D] a half-precision tile's K rows, widened */
    float *vf = kf + (size_t)16 * D;         /* [16][D] and its V rows */
    qstate st[RB * MAXG];
    for (int j = 0; j < n; j++)
        for (int g = 0; g < G; g++) {
            const float *src = q + ((r0 + j) * H + h * G + g) * (int64_t)D;
            float *dst = qs + (size_t)(j * G + g) * D;
            for (int d = 0; d < D; d++) dst[d] = src[d] * scale;
            memset(acc + (size_t)(j * G + g) * D, 0, (size_t)D * sizeof(float));
            st[j * G + g] = (qstate){-INFINITY, 0.f};
        }
    const int64_t plast = p0 + n - 1;
    int64_t kfirst = window > 0 && p0 - window + 1 > 0 ? p0 - window + 1 : 0;
    kfirst -= kfirst % 16;
    const int es = elem_bytes(kvt);
    const int64_t rb = kv_row_bytes(kvt, D);   /* a cache row's bytes */
    const char *kplane = (const char *)kv + (int64_t)h * NB * BS * rb;
    const char *vplane = (const char *)kv + (int64_t)(KVH + h) * NB * BS * rb;
    const v16 lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    for (int64_t k0 = kfirst; k0 <= plast; k0 += 16) {
        const int nk = plast + 1 - k0 < 16 ? (int)(plast + 1 - k0) : 16;
        const float *krow[16], *vrow[16];
        for (int t = 0; t < 16; t++) {
            const int64_t k = k0 + (t < nk ? t : 0);
            const int64_t slot = table[k / BS] * BS + k % BS;
            if (kvt == KV_F32) {
                krow[t] = (const float *)(kplane + slot * rb);
                vrow[t] = (const float *)(vplane + slot * rb);
            } else {
                if (kvt == KV_Q8_0) {
                    q8_0_dequant_row(kf + (size_t)t * D, kplane + slot * rb, D);
                    q8_0_dequant_row(vf + (size_t)t * D, vplane + slot * rb, D);
                } else
                    for (int i = 0; i < D; i += 16) {
                        store16t(kf + (size_t)t * D + i, load16t(kplane + slot * rb + i * es, kvt), KV_F32);
                        store16t(vf + (size_t)t * D + i, load16t(vplane + slot * rb + i * es, kvt), KV_F32);
                    }
                krow[t] = kf + (size_t)t * D;
                vrow[t] = vf + (size_t)t * D;
            }
        }
        for (int d = 0; d < D; d++)
            for (int t = 0; t < 16; t++) kt[d * 16 + t] = t < nk ? krow[t][d] : 0.f;
        /* QG query vectors at a time (any rows / heads of the block): QG independent FMA chains over d */
        const int qstart = (int)(k0 > p0 ? k0 - p0 : 0) * G;   /* earlier rows cannot see this tile */
        for (int q0 = qstart; q0 < nq; q0 += QG) {
            const int nqq = nq - q0 < QG ? nq - q0 : QG;
            const float *qv[QG];
            for (int u = 0; u < QG; u++) qv[u] = qs + (size_t)(q0 + (u < nqq ? u : 0)) * D;
            v16 s[QG];
            for (int u = 0; u < QG; u++) s[u] = (v16){0};
            for (int d = 0; d < D; d++) {
                v16 kd;
                memcpy(&kd, kt + d * 16, 64);
                for (int u = 0; u < QG; u++) s[u] += qv[u][d] * kd;   /* each query: d in order */
            }
            int qi[QG], nu = 0;
            float corr[QG], pr[QG][16];
            for (int u = 0; u < nqq; u++) {
                const int64_t p = p0 + (q0 + u) / G;
                if (window > 0 && k0 + 15 <= p - window) continue;   /* the whole tile is outside its window */
                const v16 kidx = lane + (float)k0;
                v16i valid = kidx <= (float)p;
                if (window > 0) valid &= kidx > (float)(p - window);
                v16 pv;
                corr[nu] = softmax_step(&st[q0 + u], s[u], valid, &pv);
                memcpy(pr[nu], &pv, 64);
                qi[nu++] = q0 + u;
            }
            if (nu) pv_update(acc, qi, nu, corr, (const float (*)[16])pr, vrow, nk, NV, D);
        }
    }
    for (int j = 0; j < n; j++)
        for (int g = 0; g < G; g++) {
            const int qi = j * G + g;
            const float inv = st[qi].l > 0.f ? 1.f / st[qi].l : 0.f;
            float *dst = out + ((r0 + j) * H + h * G + g) * (int64_t)D;
            for (int d = 0; d < D; d++) dst[d] = acc[(size_t)qi * D + d] * inv;
        }
}

/* S sequences; sequence s has rows row0[s] .. row0[s]+nrows[s]-1 of q/out at positions pos0[s] ..,
   its block table at tables[table_start[s]:]. q, out: [R, H, D] fp32; types: the cache's element type
   (+ 4 x the query type, which must be fp32). Returns 0, -1 (shape). */
int prompt_attention(const float *q, float *out, const void *kv, int types, int64_t S, const int64_t *row0,
                     const int64_t *nrows, const int64_t *pos0, const int64_t *table_start, const int64_t *tables,
                     int H, int KVH, int64_t NB, int BS, int D, float scale, int64_t window, int nthreads) {
    const int kvt = types % 4;
    if (H % KVH || H / KVH > MAXG || D % 16 || D / 16 > MAXNV || BS <= 0 || types / 4 || (kvt == KV_Q8_0 && D % Q8_0_QK))
        return -1;
    int64_t nitems = 0;
    for (int64_t s = 0; s < S; s++) nitems += (nrows[s] + RB - 1) / RB * KVH;
    int64_t *seq = malloc(sizeof(int64_t) * (size_t)(nitems > 0 ? nitems : 1) * 2);
    if (!seq) return -3;
    int64_t it = 0;
    for (int64_t s = 0; s < S; s++)     /* items in reverse, longest contexts first: better balance */
        for (int64_t b = 0; b < (nrows[s] + RB - 1) / RB; b++)
            for (int h = 0; h < KVH; h++) seq[2 * it] = s, seq[2 * it + 1] = b * KVH + h, it++;
    const size_t per = ((size_t)2 * RB * MAXG * D + (size_t)3 * 16 * D) * sizeof(float);
    int failed = 0;
    #pragma omp parallel num_threads(nthreads)
    {
        float *scratch = aligned_alloc(64, (per + 63) / 64 * 64);
        if (!scratch) failed = 1;
        #pragma omp for schedule(dynamic, 1)
        for (int64_t i = nitems - 1; i >= 0; i--) {
            if (!scratch) continue;
            const int64_t s = seq[2 * i], b = seq[2 * i + 1] / KVH;
            const int h = (int)(seq[2 * i + 1] % KVH);
            const int n = nrows[s] - b * RB < RB ? (int)(nrows[s] - b * RB) : RB;
            ITEM(q, out, kv, kvt, row0[s] + b * RB, n, pos0[s] + b * RB, h, tables + table_start[s], H, KVH, NB, BS, D,
                 scale, window, scratch);
        }
        free(scratch);
    }
    free(seq);
    return failed ? -3 : 0;
}
