/* The attention kernels' inner loops for AVX2 + FMA CPUs without AVX-512 (decode_attention.c,
   prompt_attention.c include this and use it where __AVX2__ and __FMA__ are set and __AVX512F__ is not).

   Why a second copy: the portable kernels are written with 16-lane vector extensions sized for
   AVX-512's 32 registers; on AVX2 (16 registers of 8 lanes) GCC spills every accumulator and builds
   pointer vectors lane by lane, and they run at a fraction of the speed of
   torch's GEMMs on the same rows. Here every accumulator block fits the 16 ymm
   registers and FMAs are explicit intrinsics (no compiler choice between FMA and multiply-add).

   Bits: the same rules as the portable kernels, with their own (different) arithmetic: a (row, head)'s
   result depends only on its query, its position and its keys (values and a tiling fixed by position),
   never on the rows sharing its block, the thread, or how the queries are grouped into register blocks
   (a query's scores are one FMA chain over d per key, its P.V one FMA chain over the keys in order, in
   every block shape). A half-precision tile is widened (exactly) to fp32 once, a q8_0 tile dequantized
   once (d * q, exact), so the arithmetic is that of an fp32 cache holding the same values. */
#ifndef HITENTER_ATTN_AVX2_H
#define HITENTER_ATTN_AVX2_H
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "../common/avx2_math.h"
#include "../common/vec16.h"

typedef float v8 __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));

/* lane j of the result = the sum of the lanes of p[j] (a fixed tree of horizontal adds) */
A2_INLINE __m256 transpose_sum8(const __m256 p[8]) {
    const __m256 t0 = _mm256_hadd_ps(p[0], p[1]), t1 = _mm256_hadd_ps(p[2], p[3]);
    const __m256 t2 = _mm256_hadd_ps(p[4], p[5]), t3 = _mm256_hadd_ps(p[6], p[7]);
    const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

/* a q8_0 row of D values into dst: d * q per block (exact; vec16.h's q8_0_dequant_row, 8 lanes) */
A2_INLINE void q8_0_dequant_avx2(float *dst, const char *src, int D) {
    for (int b = 0; b < D; b += Q8_0_QK, src += Q8_0_BYTES) {
        uint16_t h;
        memcpy(&h, src, 2);
        const __m256 d = _mm256_set1_ps(h2f(h));
        for (int i = 0; i < Q8_0_QK; i += 8) {
            const __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(src + 2 + i)));
            _mm256_storeu_ps(dst + b + i, _mm256_mul_ps(d, _mm256_cvtepi32_ps(q)));
        }
    }
}

/* n rows of D elements of cache type kt (bf16, f16 or q8_0) at src[j], widened exactly into dst [n][D] */
A2_INLINE void widen_rows(float *dst, const char *const *src, int n, int D, int kt) {
    if (kt == KV_Q8_0) {
        for (int j = 0; j < n; j++) q8_0_dequant_avx2(dst + (size_t)j * D, src[j], D);
        return;
    }
    for (int j = 0; j < n; j++)
        for (int i = 0; i < D; i += 8) {
            const __m128i h = _mm_loadu_si128((const __m128i *)(src[j] + 2 * i));
            const __m256 f = kt == KV_F16 ? _mm256_cvtph_ps(h)
                                          : _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
            _mm256_storeu_ps(dst + (size_t)j * D + i, f);
        }
}

/* ---- decode: one (row, KV head), its G query heads over keys first .. end-1 (a chunk) ----------- */

/* A bf16 / f16 cache (the default) is read in place, each 8 elements widened (exactly) in a register as they
   are loaded, no fp32 copy of the tile (its stores, and the L1 it took: 32 KB a tile at head_dim 256), and a
   key or value vector loaded once serves a block of up to 6 query heads: less CPU than widening the
   tile first. The arithmetic per query is that of the fp32 / q8_0 code below, so the bits are those of an fp32
   cache holding the same values: a score is one FMA chain over d from 0 then the fixed transpose tree, P.V
   one FMA chain over the keys in order. The next tile's cache lines are prefetched one per score step or so
   (tile_lines, tile_scores), not in one burst at the tile's start: with the cache streamed from DRAM (28
   layers x 4,000 keys, Qwen2.5-1.5B's shape) a burst overlaps nothing, the attention taking the compute's
   time plus the read's; spread, the reads overlap the compute, same bits. (The same blocking over an fp32
   cache read in place is slower than that code, so fp32 and q8_0 keep it.) Figures: docs/benchmarks.md. */

/* 8 elements from element i of a cache row of type kt (fp32, bf16 or f16), widened exactly to fp32 */
A2_INLINE __m256 load8_kv(const char *row, int i, const int kt) {
    if (kt == KV_F32) return _mm256_loadu_ps((const float *)row + i);
    const __m128i h = _mm_loadu_si128((const __m128i *)(row + 2 * i));
    return kt == KV_F16 ? _mm256_cvtph_ps(h) : _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* s[u][0 / 1] (lanes: keys 0-7 / 8-15 of the tile kr, nk keys) = q_u . k_j for the GB queries qf + u * D: per
   query and key an FMA chain over d in order from 0, KP keys at a time, then transpose_sum8 over 8 keys.
   Lanes of keys >= nk are 0 (the caller masks them). */
A2_INLINE void tile_scores(const float *qf, const char *const *kr, int nk, const int kt, const int NV, const int GB,
                           __m256 s[][2], const char *const *pl, int npl) {
    const int KP = 8 / (GB < 4 ? GB : 4);   /* keys per pass: GB x KP accumulators, 8 chains or more */
    const int D = 8 * NV, per = (npl + 16 / KP * NV - 1) / (16 / KP * NV);   /* prefetches per step */
    __m256 p[6][16];
    int e = 0;
    for (int j0 = 0; j0 < 16; j0 += KP) {
        __m256 a[6][8];
        for (int u = 0; u < GB; u++)
            for (int j = 0; j < KP; j++) a[u][j] = _mm256_setzero_ps();
        if (j0 < nk) {
            const char *k[8];
            for (int j = 0; j < KP; j++) k[j] = kr[j0 + j < nk ? j0 + j : j0];
            for (int i = 0; i < NV; i++) {
                for (int f = 0; f < per && e < npl; f++) __builtin_prefetch(pl[e++]);
                __m256 x[8];
                for (int j = 0; j < KP; j++) x[j] = load8_kv(k[j], 8 * i, kt);
                for (int u = 0; u < GB; u++) {
                    const __m256 qi = _mm256_load_ps(qf + u * D + 8 * i);
                    for (int j = 0; j < KP; j++) a[u][j] = _mm256_fmadd_ps(qi, x[j], a[u][j]);
                }
            }
        }
        for (int u = 0; u < GB; u++)
            for (int j = 0; j < KP; j++) p[u][j0 + j] = a[u][j];
    }
    for (int u = 0; u < GB; u++) s[u][0] = transpose_sum8(p[u]), s[u][1] = transpose_sum8(p[u] + 8);
}

/* acc_u[0 .. D) = acc_u * corr[u] + sum over keys t < nk (in order) of pr[u][t] * v_t, for the GB queries
   acc + u * D; 16 dims of every query at a time in registers */
A2_INLINE void tile_pv(float *acc, const float *corr, const float (*pr)[16], const char *const *vr, int nk,
                       const int kt, const int NV, const int GB) {
    const int D = 8 * NV;
    for (int i = 0; i < NV; i += 2) {
        __m256 a[6][2];
        for (int u = 0; u < GB; u++) {
            const __m256 c = _mm256_set1_ps(corr[u]);
            a[u][0] = _mm256_mul_ps(_mm256_load_ps(acc + u * D + 8 * i), c);
            a[u][1] = _mm256_mul_ps(_mm256_load_ps(acc + u * D + 8 * i + 8), c);
        }
        for (int t = 0; t < nk; t++) {
            const __m256 x0 = load8_kv(vr[t], 8 * i, kt), x1 = load8_kv(vr[t], 8 * i + 8, kt);
            for (int u = 0; u < GB; u++) {
                const __m256 pt = _mm256_broadcast_ss(&pr[u][t]);
                a[u][0] = _mm256_fmadd_ps(pt, x0, a[u][0]);
                a[u][1] = _mm256_fmadd_ps(pt, x1, a[u][1]);
            }
        }
        for (int u = 0; u < GB; u++) {
            _mm256_store_ps(acc + u * D + 8 * i, a[u][0]);
            _mm256_store_ps(acc + u * D + 8 * i + 8, a[u][1]);
        }
    }
}

/* the tile (nk keys kr / vr, type lt) for the GB query heads g0 .. g0+GB-1: scores, the online softmax update
   (m, l), acc = acc * corr + P.V */
A2_INLINE void tile_heads(const float *qf, float *acc, float *m, float *l, const char *const *kr,
                          const char *const *vr, int nk, const int lt, const int NV, const int GB,
                          const char *const *pl, int npl) {
    const int D = 8 * NV;
    const __m256 lane = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7), ninf = _mm256_set1_ps(-INFINITY);
    const __m256 n8 = _mm256_set1_ps((float)nk);
    const __m256 v0 = _mm256_cmp_ps(lane, n8, _CMP_LT_OQ);
    const __m256 v1 = _mm256_cmp_ps(_mm256_add_ps(lane, _mm256_set1_ps(8.f)), n8, _CMP_LT_OQ);
    __m256 s[6][2];
    float pr[6][16] __attribute__((aligned(32))), corr[6];
    tile_scores(qf, kr, nk, lt, NV, GB, s, pl, npl);
    for (int u = 0; u < GB; u++) {
        const __m256 s0 = _mm256_blendv_ps(ninf, s[u][0], v0), s1 = _mm256_blendv_ps(ninf, s[u][1], v1);
        const float bm = hmax8(_mm256_max_ps(s0, s1)), nm = bm > m[u] ? bm : m[u];
        const __m256 nm8 = _mm256_set1_ps(nm);
        const __m256 e0 = _mm256_and_ps(exp8(_mm256_sub_ps(s0, nm8)), v0);
        const __m256 e1 = _mm256_and_ps(exp8(_mm256_sub_ps(s1, nm8)), v1);
        corr[u] = m[u] == -INFINITY ? 0.f : _mm256_cvtss_f32(exp8(_mm256_set1_ps(m[u] - nm)));
        l[u] = l[u] * corr[u] + hsum8(_mm256_add_ps(e0, e1));
        m[u] = nm;
        _mm256_store_ps(pr[u], e0);
        _mm256_store_ps(pr[u] + 8, e1);
    }
    tile_pv(acc, corr, (const float (*)[16])pr, vr, nk, lt, NV, GB);
}

/* the G heads in blocks of at most 6, as even as they split (GB a constant in each copy) */
A2_INLINE void tile_all(const float *qf, float *acc, float *m, float *l, const char *const *kr,
                        const char *const *vr, int nk, int G, const int lt, const int NV, const char *const *pl,
                        int npl) {
    const int D = 8 * NV, nblk = (G + 5) / 6;
    for (int b = 0, g0 = 0; b < nblk; b++) {
        const int gb = G / nblk + (b < G % nblk);
        const float *qb = qf + g0 * D;
        float *ab = acc + g0 * D, *mb = m + g0, *lb = l + g0;
        switch (gb) {
        case 1: tile_heads(qb, ab, mb, lb, kr, vr, nk, lt, NV, 1, pl, b ? 0 : npl); break;
        case 2: tile_heads(qb, ab, mb, lb, kr, vr, nk, lt, NV, 2, pl, b ? 0 : npl); break;
        case 3: tile_heads(qb, ab, mb, lb, kr, vr, nk, lt, NV, 3, pl, b ? 0 : npl); break;
        case 4: tile_heads(qb, ab, mb, lb, kr, vr, nk, lt, NV, 4, pl, b ? 0 : npl); break;
        case 5: tile_heads(qb, ab, mb, lb, kr, vr, nk, lt, NV, 5, pl, b ? 0 : npl); break;
        default: tile_heads(qb, ab, mb, lb, kr, vr, nk, lt, NV, 6, pl, b ? 0 : npl); break;
        }
        g0 += gb;
    }
}

/* a decode item's start: the G query rows of row r, KV head h, scaled into qf [G][D]; acc, m, l cleared */
A2_INLINE void item_start(const void *q, float *qf, float *acc, float *m, float *l, int64_t r, int h, int G, int H,
                          int D, int qt, float scale) {
    const int qes = elem_bytes(qt);
    for (int g = 0; g < G; g++) {
        const char *qp = (const char *)q + ((r * H + h * G + g) * (int64_t)D) * qes;
        for (int i = 0; i < D; i += 16) {
            const v16 x = load16t(qp + (int64_t)i * qes, qt) * scale;
            memcpy(qf + g * D + i, &x, 64);
        }
        memset(acc + g * D, 0, (size_t)D * sizeof(float));
        m[g] = -INFINITY, l[g] = 0.f;
    }
}

/* the cache rows of keys k0 .. k0+nk-1 (nk <= 16, returned) into kp / vp, and a prefetch of the next tile's */
A2_INLINE int tile_rows(const char **kp, const char **vp, const char *kbase, const char *vbase,
                        const int64_t *table, int64_t k0, int64_t end, int BS, int64_t rb) {
    const int nk = end - k0 < 16 ? (int)(end - k0) : 16;
    paged_rows(kp, kbase, table, k0, nk, BS, rb);
    paged_rows(vp, vbase, table, k0, nk, BS, rb);
    const int nn = end - (k0 + 16) < 16 ? (int)(end - (k0 + 16)) : 16;   /* fetch the next tile's rows */
    if (nn > 0) {
        const char *nkp[16], *nvp[16];
        paged_rows(nkp, kbase, table, k0 + 16, nn, BS, rb);
        paged_rows(nvp, vbase, table, k0 + 16, nn, BS, rb);
        for (int j = 0; j < nn; j++)
            for (int o = 0; o < rb; o += 64) { __builtin_prefetch(nkp[j] + o); __builtin_prefetch(nvp[j] + o); }
    }
    return nk;
}

/* the cache rows of keys k0 .. k0+nk-1 (nk <= 16, returned) into kp / vp, and the cache lines of the next tile's
   rows into pl [*npl] (tile_scores prefetches them spread over its steps: a burst of them at the tile's start
   stalled the loads behind it) */
A2_INLINE int tile_lines(const char **kp, const char **vp, const char **pl, int *npl, const char *kbase,
                         const char *vbase, const int64_t *table, int64_t k0, int64_t end, int BS, int64_t rb) {
    const int nk = end - k0 < 16 ? (int)(end - k0) : 16;
    paged_rows(kp, kbase, table, k0, nk, BS, rb);
    paged_rows(vp, vbase, table, k0, nk, BS, rb);
    const int nn = end - (k0 + 16) < 16 ? (int)(end - (k0 + 16)) : 16;
    int n = 0;
    if (nn > 0) {
        const char *nkp[16], *nvp[16];
        paged_rows(nkp, kbase, table, k0 + 16, nn, BS, rb);
        paged_rows(nvp, vbase, table, k0 + 16, nn, BS, rb);
        for (int j = 0; j < nn; j++)
            for (int o = 0; o < rb; o += 64) pl[n++] = nkp[j] + o, pl[n++] = nvp[j] + o;
    }
    *npl = n;
    return nk;
}

/* a decode item's end: part NULL: the normalized result into out; else the chunk's state into part
   (decode_attention.c's merge): acc [G][D] unnormalized, then m [G], l [G] */
A2_INLINE void item_finish(void *out, float *part, const float *acc, const float *m, const float *l, int64_t r,
                           int h, int G, int H, int D, int qt) {
    const int qes = elem_bytes(qt);
    if (part) {
        memcpy(part, acc, (size_t)G * D * sizeof(float));
        memcpy(part + G * D, m, G * sizeof(float));
        memcpy(part + G * D + G, l, G * sizeof(float));
        return;
    }
    for (int g = 0; g < G; g++) {
        char *op = (char *)out + ((r * H + h * G + g) * (int64_t)D) * qes;
        const float inv = l[g] > 0.f ? 1.f / l[g] : 0.f;   /* ctx == 0: a zero row (never NaN) */
        for (int i = 0; i < D; i += 16) {
            v16 x;
            memcpy(&x, acc + g * D + i, 64);
            store16t(op + (int64_t)i * qes, x * inv, qt);
        }
    }
}

/* decode_item_avx2 (below) for a bf16 or f16 cache (kt), read in place */
A2_INLINE void decode_half_avx2(const void *q, void *out, float *part, const void *kv, const int kt, int qt,
                                int64_t r, int h, int64_t first, int64_t end, const int64_t *table, int H, int KVH,
                                int64_t NB, int BS, const int NV, float scale) {
    enum { MG = 16, MD = 512 };
    const int G = H / KVH, D = 8 * NV;
    const int64_t rb = kv_row_bytes(kt, D);   /* a cache row's bytes */
    float qf[MG * MD] __attribute__((aligned(32))), acc[MG * MD] __attribute__((aligned(32)));
    float m[MG], l[MG];
    item_start(q, qf, acc, m, l, r, h, G, H, D, qt, scale);
    const char *kbase = (const char *)kv + (int64_t)h * NB * BS * rb;
    const char *vbase = (const char *)kv + (int64_t)(KVH + h) * NB * BS * rb;
    for (int64_t k0 = first; k0 < end; k0 += 16) {
        const char *kp[16], *vp[16], *pl[2 * 16 * MD / 32];
        int npl;
        const int nk = tile_lines(kp, vp, pl, &npl, kbase, vbase, table, k0, end, BS, rb);
        if (kt == KV_F16) tile_all(qf, acc, m, l, kp, vp, nk, G, KV_F16, NV, pl, npl);   /* the type a constant */
        else tile_all(qf, acc, m, l, kp, vp, nk, G, KV_BF16, NV, pl, npl);
    }
    item_finish(out, part, acc, m, l, r, h, G, H, D, qt);
}

/* scores of query qv (D = 8 * NV, fp32) against the 8 key rows kr[0..7]: lane j = q . k_j, each an FMA
   chain over d in order, then the fixed transpose tree */
A2_INLINE __m256 scores8(const float *qv, const float *const *kr, const int NV) {
    __m256 p[8];
    for (int j = 0; j < 8; j++) p[j] = _mm256_setzero_ps();
    for (int i = 0; i < NV; i++) {
        const __m256 qi = _mm256_loadu_ps(qv + 8 * i);
        for (int j = 0; j < 8; j++) p[j] = _mm256_fmadd_ps(qi, _mm256_loadu_ps(kr[j] + 8 * i), p[j]);
    }
    return transpose_sum8(p);
}

/* acc[0 .. 8*NV) = acc * corr + sum over keys t < nk (in order) of pr[t] * vr[t]; 8 dims-vectors at a time
   in registers */
A2_INLINE void pv_row(float *acc, float corr, const float *pr, const float *const *vr, int nk, const int NV) {
    const __m256 c = _mm256_set1_ps(corr);
    for (int i0 = 0; i0 < NV; i0 += 8) {
        const int nb = NV - i0 < 8 ? NV - i0 : 8;
        __m256 a[8];
        for (int b = 0; b < nb; b++) a[b] = _mm256_mul_ps(_mm256_loadu_ps(acc + 8 * (i0 + b)), c);
        for (int t = 0; t < nk; t++) {
            const __m256 pt = _mm256_set1_ps(pr[t]);
            for (int b = 0; b < nb; b++) a[b] = _mm256_fmadd_ps(pt, _mm256_loadu_ps(vr[t] + 8 * (i0 + b)), a[b]);
        }
        for (int b = 0; b < nb; b++) _mm256_storeu_ps(acc + 8 * (i0 + b), a[b]);
    }
}

/* q (type qt) row r, heads h*G .. h*G+G-1, over keys first .. end-1 of KV head h; D = 8 * NV. part NULL: the
   normalized result into out; else this chunk's state into part (decode_attention.c's merge): acc [G][D]
   unnormalized, then m [G], l [G] */
A2_INLINE void decode_item_avx2(const void *q, void *out, float *part, const void *kv, const int kt, int qt,
                                int64_t r, int h, int64_t first, int64_t end, const int64_t *table, int H, int KVH,
                                int64_t NB, int BS, const int NV, float scale) {
    enum { MG = 16, MD = 512 };
    const int G = H / KVH, D = 8 * NV;
    const int64_t rb = kv_row_bytes(kt, D);   /* a cache row's bytes */
    float qf[MG * MD] __attribute__((aligned(32))), acc[MG * MD] __attribute__((aligned(32)));
    float kf[16 * MD] __attribute__((aligned(32))), vf[16 * MD] __attribute__((aligned(32)));
    float m[MG], l[MG], pr[MG][16], corr[MG];
    item_start(q, qf, acc, m, l, r, h, G, H, D, qt, scale);
    const char *kbase = (const char *)kv + (int64_t)h * NB * BS * rb;
    const char *vbase = (const char *)kv + (int64_t)(KVH + h) * NB * BS * rb;
    const __m256 lane = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7), ninf = _mm256_set1_ps(-INFINITY);
    for (int64_t k0 = first; k0 < end; k0 += 16) {
        const char *kp[16], *vp[16];
        const int nk = tile_rows(kp, vp, kbase, vbase, table, k0, end, BS, rb);
        const float *kr[16], *vr[16];
        if (kt == KV_F32)
            for (int j = 0; j < 16; j++) kr[j] = (const float *)kp[j < nk ? j : 0], vr[j] = (const float *)vp[j < nk ? j : 0];
        else {
            widen_rows(kf, kp, nk, D, kt);
            widen_rows(vf, vp, nk, D, kt);
            for (int j = 0; j < 16; j++) kr[j] = kf + (j < nk ? j : 0) * D, vr[j] = vf + (j < nk ? j : 0) * D;
        }
        const __m256 n8 = _mm256_set1_ps((float)nk);
        const __m256 v0 = _mm256_cmp_ps(lane, n8, _CMP_LT_OQ);
        const __m256 v1 = _mm256_cmp_ps(_mm256_add_ps(lane, _mm256_set1_ps(8.f)), n8, _CMP_LT_OQ);
        for (int g = 0; g < G; g++) {
            __m256 s0 = scores8(qf + g * D, kr, NV), s1 = scores8(qf + g * D, kr + 8, NV);
            s0 = _mm256_blendv_ps(ninf, s0, v0);
            s1 = _mm256_blendv_ps(ninf, s1, v1);
            const float bm = hmax8(_mm256_max_ps(s0, s1)), nm = bm > m[g] ? bm : m[g];
            const __m256 nm8 = _mm256_set1_ps(nm);
            const __m256 e0 = _mm256_and_ps(exp8(_mm256_sub_ps(s0, nm8)), v0);
            const __m256 e1 = _mm256_and_ps(exp8(_mm256_sub_ps(s1, nm8)), v1);
            corr[g] = m[g] == -INFINITY ? 0.f : _mm256_cvtss_f32(exp8(_mm256_set1_ps(m[g] - nm)));
            l[g] = l[g] * corr[g] + hsum8(_mm256_add_ps(e0, e1));
            m[g] = nm;
            _mm256_storeu_ps(pr[g], e0);
            _mm256_storeu_ps(pr[g] + 8, e1);
        }
        for (int g = 0; g < G; g++) pv_row(acc + g * D, corr[g], pr[g], vr, nk, NV);
    }
    item_finish(out, part, acc, m, l, r, h, G, H, D, qt);
}

/* ---- prompt: a block of n consecutive rows of one sequence, one KV head ---------------------------- */

#define A2_QB 6   /* query vectors whose scores share each key load (6 x 2 accumulators + 2 keys + 1) */

/* s[u] (2 vectors: keys 0-7, 8-15) = q_u . k for the tile kt [D][16], u < A2_QB: per query and key an FMA
   chain over d in order */
A2_INLINE void scores_block(const float *const *qv, const float *kt, int D, __m256 s[A2_QB][2]) {
    /* local accumulators, stored once at the end: __m256 may alias the float loads, so accumulating in s
       itself made GCC store all 12 of them on every d (a third of a prompt's attention time) */
    __m256 a[A2_QB][2];
    for (int u = 0; u < A2_QB; u++) a[u][0] = a[u][1] = _mm256_setzero_ps();
    for (int d = 0; d < D; d++) {
        const __m256 lo = _mm256_load_ps(kt + d * 16), hi = _mm256_load_ps(kt + d * 16 + 8);
        for (int u = 0; u < A2_QB; u++) {
            const __m256 b = _mm256_broadcast_ss(qv[u] + d);
            a[u][0] = _mm256_fmadd_ps(b, lo, a[u][0]);
            a[u][1] = _mm256_fmadd_ps(b, hi, a[u][1]);
        }
    }
    for (int u = 0; u < A2_QB; u++) s[u][0] = a[u][0], s[u][1] = a[u][1];
}

/* for nu (1 or 2) queries: acc_u = acc_u * corr_u + sum over t < nk of pr_u[t] * vr[t] for the nb (4 or 2)
   dim-vectors from i0 (the same operations per query whether it runs alone or paired) */
A2_INLINE void pv_block(float *const *acc, const float *corr, const float *const *pr, const float *const *vr, int nk,
                        int i0, const int nu, const int nb) {
    __m256 a[2][4];
    for (int u = 0; u < nu; u++) {
        const __m256 c = _mm256_set1_ps(corr[u]);
        for (int b = 0; b < nb; b++) a[u][b] = _mm256_mul_ps(_mm256_loadu_ps(acc[u] + i0 + 8 * b), c);
    }
    for (int t = 0; t < nk; t++) {
        __m256 vv[4];
        for (int b = 0; b < nb; b++) vv[b] = _mm256_loadu_ps(vr[t] + i0 + 8 * b);
        for (int u = 0; u < nu; u++) {
            const __m256 pt = _mm256_broadcast_ss(pr[u] + t);
            for (int b = 0; b < nb; b++) a[u][b] = _mm256_fmadd_ps(pt, vv[b], a[u][b]);
        }
    }
    for (int u = 0; u < nu; u++)
        for (int b = 0; b < nb; b++) _mm256_storeu_ps(acc[u] + i0 + 8 * b, a[u][b]);
}

/* pv_block over all D dims (D % 16 == 0): blocks of 32 dims, then one of 16 */
A2_INLINE void pv_pair(float *const *acc, const float *corr, const float *const *pr, const float *const *vr, int nk,
                       int D, const int nu) {
    int i0 = 0;
    for (; i0 + 32 <= D; i0 += 32) pv_block(acc, corr, pr, vr, nk, i0, nu, 4);
    if (i0 < D) pv_block(acc, corr, pr, vr, nk, i0, nu, 2);
}

/* c[i] = lane i of each of r[0..7] (an 8 x 8 transpose, exact) */
A2_INLINE void transpose8(__m256 r[8]) {
    __m256 t[8], u[8];
    for (int j = 0; j < 8; j += 2) t[j] = _mm256_unpacklo_ps(r[j], r[j + 1]), t[j + 1] = _mm256_unpackhi_ps(r[j], r[j + 1]);
    for (int j = 0; j < 8; j += 4) {
        u[j] = _mm256_shuffle_ps(t[j], t[j + 2], 0x44), u[j + 1] = _mm256_shuffle_ps(t[j], t[j + 2], 0xEE);
        u[j + 2] = _mm256_shuffle_ps(t[j + 1], t[j + 3], 0x44), u[j + 3] = _mm256_shuffle_ps(t[j + 1], t[j + 3], 0xEE);
    }
    for (int i = 0; i < 4; i++) r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20), r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
}

/* the 16 rows (type lt: fp32, bf16 or f16) as kt [D][16] by 8 x 8 register transposes */
A2_INLINE void key_tile_full(float *kt, const char *const *rows, int D, const int lt) {
    for (int d0 = 0; d0 < D; d0 += 8)
        for (int t0 = 0; t0 < 16; t0 += 8) {
            __m256 r[8];
            for (int j = 0; j < 8; j++) r[j] = load8_kv(rows[t0 + j], d0, lt);
            transpose8(r);
            for (int i = 0; i < 8; i++) _mm256_store_ps(kt + (d0 + i) * 16 + t0, r[i]);
        }
}

/* the key tile as kt [D][16] (element d of key t at kt[d * 16 + t], keys >= nk zero), each element widened
   exactly from the cache rows kp (type kvt; q8_0 dequantized into kf [16][D] first); a full tile by 8 x 8
   register transposes, a partial one element by element */
A2_INLINE void key_tile_t(float *kt, const char *const *kp, int nk, int D, int kvt, float *kf) {
    const char *rows[16];
    int lt = kvt;
    if (kvt == KV_Q8_0) {
        widen_rows(kf, kp, nk, D, kvt);
        for (int t = 0; t < nk; t++) rows[t] = (const char *)(kf + (size_t)t * D);
        lt = KV_F32;
    } else
        for (int t = 0; t < nk; t++) rows[t] = kp[t];
    if (nk == 16) {   /* the type a constant in each copy */
        if (lt == KV_F16) key_tile_full(kt, rows, D, KV_F16);
        else if (lt == KV_BF16) key_tile_full(kt, rows, D, KV_BF16);
        else key_tile_full(kt, rows, D, KV_F32);
        return;
    }
    if (lt != KV_F32) {
        widen_rows(kf, kp, nk, D, lt);
        for (int t = 0; t < nk; t++) rows[t] = (const char *)(kf + (size_t)t * D);
    }
    for (int d = 0; d < D; d++)
        for (int t = 0; t < 16; t++) kt[d * 16 + t] = t < nk ? ((const float *)rows[t])[d] : 0.f;
}

typedef struct { float m, l; } a2_state;

/* rows r0 .. r0+n-1 of q / out at positions p0 .., KV head h (prompt_attention.c's item, same arguments;
   scratch as there: qs [n*G][D], acc [n*G][D], kt [D][16], kf / vf [16][D], 64-byte aligned) */
static void prompt_item_avx2(const float *q, float *out, const void *kv, int kvt, int64_t r0, int n, int64_t p0,
                             int h, const int64_t *table, int H, int KVH, int64_t NB, int BS, int D, float scale,
                             int64_t window, float *scratch) {
    const int G = H / KVH, nq = n * G;
    float *qs = scratch, *acc = qs + (size_t)nq * D;
    float *kt = acc + (size_t)nq * D;   /* 64-byte aligned: D % 16 == 0 */
    float *kf = kt + (size_t)16 * D, *vf = kf + (size_t)16 * D;
    a2_state st[32 * 16];
    for (int j = 0; j < n; j++)
        for (int g = 0; g < G; g++) {
            const float *src = q + ((r0 + j) * H + h * G + g) * (int64_t)D;
            float *dst = qs + (size_t)(j * G + g) * D;
            for (int d = 0; d < D; d++) dst[d] = src[d] * scale;
            memset(acc + (size_t)(j * G + g) * D, 0, (size_t)D * sizeof(float));
            st[j * G + g] = (a2_state){-INFINITY, 0.f};
        }
    const int64_t plast = p0 + n - 1;
    int64_t kfirst = window > 0 && p0 - window + 1 > 0 ? p0 - window + 1 : 0;
    kfirst -= kfirst % 16;
    const int64_t rb = kv_row_bytes(kvt, D);   /* a cache row's bytes */
    const char *kbase = (const char *)kv + (int64_t)h * NB * BS * rb;
    const char *vbase = (const char *)kv + (int64_t)(KVH + h) * NB * BS * rb;
    const __m256 lane = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7), ninf = _mm256_set1_ps(-INFINITY);
    for (int64_t k0 = kfirst; k0 <= plast; k0 += 16) {
        const int nk = plast + 1 - k0 < 16 ? (int)(plast + 1 - k0) : 16;
        const char *kp[16], *vp[16];
        paged_rows(kp, kbase, table, k0, nk, BS, rb);
        paged_rows(vp, vbase, table, k0, nk, BS, rb);
        const float *vr[16];
        if (kvt == KV_F32)
            for (int t = 0; t < nk; t++) vr[t] = (const float *)vp[t];
        else {
            widen_rows(vf, vp, nk, D, kvt);
            for (int t = 0; t < nk; t++) vr[t] = vf + (size_t)t * D;
        }
        key_tile_t(kt, kp, nk, D, kvt, kf);
        const __m256 kidx0 = _mm256_add_ps(lane, _mm256_set1_ps((float)k0));
        const __m256 kidx1 = _mm256_add_ps(kidx0, _mm256_set1_ps(8.f));
        const int qstart = (int)(k0 > p0 ? k0 - p0 : 0) * G;   /* earlier rows cannot see this tile */
        for (int q0 = qstart; q0 < nq; q0 += A2_QB) {
            const int nqq = nq - q0 < A2_QB ? nq - q0 : A2_QB;
            const float *qv[A2_QB];
            for (int u = 0; u < A2_QB; u++) qv[u] = qs + (size_t)(q0 + (u < nqq ? u : 0)) * D;
            __m256 s[A2_QB][2];
            scores_block(qv, kt, D, s);
            float pr[A2_QB][16] __attribute__((aligned(32))), corr[A2_QB];
            float *accs[A2_QB];
            const float *prs[A2_QB];
            int nu = 0;
            for (int u = 0; u < nqq; u++) {
                const int64_t p = p0 + (q0 + u) / G;
                if (window > 0 && k0 + 15 <= p - window) continue;   /* the whole tile is outside its window */
                const __m256 pp = _mm256_set1_ps((float)p);
                __m256 ok0 = _mm256_cmp_ps(kidx0, pp, _CMP_LE_OQ), ok1 = _mm256_cmp_ps(kidx1, pp, _CMP_LE_OQ);
                if (window > 0) {
                    const __m256 w = _mm256_set1_ps((float)(p - window));
                    ok0 = _mm256_and_ps(ok0, _mm256_cmp_ps(kidx0, w, _CMP_GT_OQ));
                    ok1 = _mm256_and_ps(ok1, _mm256_cmp_ps(kidx1, w, _CMP_GT_OQ));
                }
                const __m256 s0 = _mm256_blendv_ps(ninf, s[u][0], ok0), s1 = _mm256_blendv_ps(ninf, s[u][1], ok1);
                a2_state *sq = &st[q0 + u];
                const float bm = hmax8(_mm256_max_ps(s0, s1)), nm = bm > sq->m ? bm : sq->m;
                const __m256 nm8 = _mm256_set1_ps(nm);
                const __m256 e0 = _mm256_and_ps(exp8(_mm256_sub_ps(s0, nm8)), ok0);
                const __m256 e1 = _mm256_and_ps(exp8(_mm256_sub_ps(s1, nm8)), ok1);
                corr[nu] = sq->m == -INFINITY ? 0.f : _mm256_cvtss_f32(exp8(_mm256_set1_ps(sq->m - nm)));
                sq->l = sq->l * corr[nu] + hsum8(_mm256_add_ps(e0, e1));
                sq->m = nm;
                _mm256_store_ps(pr[nu], e0);
                _mm256_store_ps(pr[nu] + 8, e1);
                accs[nu] = acc + (size_t)(q0 + u) * D;
                prs[nu] = pr[nu];
                nu++;
            }
            int u = 0;
            for (; u + 2 <= nu; u += 2) pv_pair(accs + u, corr + u, prs + u, vr, nk, D, 2);
            if (u < nu) pv_pair(accs + u, corr + u, prs + u, vr, nk, D, 1);
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

#endif
