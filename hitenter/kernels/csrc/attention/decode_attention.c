/* Fused paged attention for generation rows (hitenter/models/decode_kernel.py builds and loads it).

   decode_attention: for each row r (one query token) and KV head h, the G = H / KVH query heads of h
   attend to keys 0 .. ctx[r]-1 read straight from the paged cache (no gather copy): 16 keys at a time,
   scores by a fixed shuffle/add tree, online softmax in fp32 (running max, rescaled sums), P.V
   accumulated in fp32, one rounding to the cache dtype at the end.

   Bits: the arithmetic of a (row, head) depends only on its own query, its keys and their order, never
   on the other rows, the thread count or the block layout (a key's address is looked up per key), so
   a row's output is the same alone or in any batch. Cache layout: [2, KVH, NB, BS, D], fp32, bf16 or
   f16 (each element widened exactly to fp32 as it is loaded: the bits of an fp32 cache holding the same
   values), or q8_0 rows of D / 32 blocks of 34 bytes (a tile of 16 keys dequantized once into fp32, the
   same way); q / out: [R, H, D], fp32, bf16 or f16 (`types`). Requires D % 16 == 0, D <= 512, H / KVH <= 16.
   window > 0 (sliding-window layers): a row sees only its last `window` keys, ctx-window .. ctx-1; the
   key loop simply starts there (a function of the row's position only, so the bits stay batch invariant). 
   GCC / Clang vector extensions only (no intrinsics); -march=native picks the vector width. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#include "../common/vec16.h"

#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
#include "attn_avx2.h"   /* 8-lane register blocks for AVX2 (see there) */
#define HITENTER_ATTN_AVX2 1
#endif

#define MAXG 16
#define MAXNV 32   /* head_dim up to 512 */

#define load16 load16t

static inline v16 vmax(v16 a, v16 b) { return vsel(a > b, a, b); }
static inline float hmax(v16 v) {
    v = vmax(v, __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7));
    v = vmax(v, __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11));
    v = vmax(v, __builtin_shufflevector(v, v, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13));
    v = vmax(v, __builtin_shufflevector(v, v, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14));
    return v[0];
}

/* lane j of the result = sum of the lanes of v[j] (a fixed tree of shuffles and adds) */
static inline v16 transpose_add(v16 v[16]) {
#define PAIR(a, b, L, H) (__builtin_shufflevector(a, b, L) + __builtin_shufflevector(a, b, H))
#define L1 0,1,2,3,4,5,6,7,16,17,18,19,20,21,22,23
#define H1 8,9,10,11,12,13,14,15,24,25,26,27,28,29,30,31
#define L2 0,1,2,3,8,9,10,11,16,17,18,19,24,25,26,27
#define H2 4,5,6,7,12,13,14,15,20,21,22,23,28,29,30,31
#define L3 0,1,4,5,8,9,12,13,16,17,20,21,24,25,28,29
#define H3 2,3,6,7,10,11,14,15,18,19,22,23,26,27,30,31
#define L4 0,2,4,6,8,10,12,14,16,18,20,22,24,26,28,30
#define H4 1,3,5,7,9,11,13,15,17,19,21,23,25,27,29,31
    v16 a[8], b[4], c[2];
    for (int i = 0; i < 8; i++) a[i] = PAIR(v[2 * i], v[2 * i + 1], L1, H1);
    for (int i = 0; i < 4; i++) b[i] = PAIR(a[2 * i], a[2 * i + 1], L2, H2);
    for (int i = 0; i < 2; i++) c[i] = PAIR(b[2 * i], b[2 * i + 1], L3, H3);
    return PAIR(c[0], c[1], L4, H4);
}

/* the rows of keys k0 .. k0+n-1 in plane `plane` (K of head h: h; V of head h: KVH + h) of the cache
   [2 * KVH planes, NB, BS, row_bytes] (vec16.h: paged_rows) */
static inline void cache_rows(const char **out, const void *kv, int plane, const int64_t *table, int64_t k0,
                              int n, int64_t NB, int BS, int row_bytes) {
    paged_rows(out, (const char *)kv + (int64_t)plane * NB * BS * row_bytes, table, k0, n, BS, row_bytes);
}

#define INLINE static inline __attribute__((always_inline))

/* keys k0 .. k0+n-1 (n <= 16) for the G query heads: scores, the online softmax update, acc += P.V.
   Called with constant n and NV for the common shapes, so the loops unroll without bound checks. */
INLINE void key_block(const v16 qv[MAXG][MAXNV], v16 acc[MAXG][MAXNV], float *m, float *l, const void *kv,
                      const int kt, int h, int64_t k0, int64_t ctx, const int64_t *table, int G, int KVH, int64_t NB,
                      int BS, const int NV, const int n) {
    const int D = 16 * NV, rb = (int)kv_row_bytes(kt, D);
    const int lt = kt == KV_Q8_0 ? KV_F32 : kt, es = elem_bytes(lt);   /* the rows the loads below read */
    const v16 lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    v16 part[16], prob[MAXG];
    float corrs[MAXG];
    const char *kp[16], *vp[16], *nk[16], *nv[16];
    cache_rows(kp, kv, h, table, k0, n, NB, BS, rb);
    cache_rows(vp, kv, KVH + h, table, k0, n, NB, BS, rb);
    const int nn = ctx - (k0 + 16) < 16 ? (int)(ctx - (k0 + 16)) : 16;   /* start fetching the next keys */
    if (nn > 0) {
        cache_rows(nk, kv, h, table, k0 + 16, nn, NB, BS, rb);
        cache_rows(nv, kv, KVH + h, table, k0 + 16, nn, NB, BS, rb);
        for (int j = 0; j < nn; j++)
            for (int o = 0; o < rb; o += 64) { __builtin_prefetch(nk[j] + o); __builtin_prefetch(nv[j] + o); }
    }
    float kq[16 * 16 * MAXNV], vq[16 * 16 * MAXNV];
    if (kt == KV_Q8_0)   /* a q8_0 tile: its K and V rows dequantized once, then read as fp32 rows */
        for (int j = 0; j < n; j++) {
            q8_0_dequant_row(kq + j * D, kp[j], D);
            q8_0_dequant_row(vq + j * D, vp[j], D);
            kp[j] = (const char *)(kq + j * D);
            vp[j] = (const char *)(vq + j * D);
        }
    for (int g = 0; g < G; g++) {
        for (int j = 0; j < n; j++) {   /* the key rows are read in place (L1 after the first head) */
            v16 t = qv[g][0] * load16(kp[j], lt);
            for (int i = 1; i < NV; i++) t += qv[g][i] * load16(kp[j] + i * 16 * es, lt);
            part[j] = t;
        }
        for (int j = n; j < 16; j++) part[j] = (v16){0};   /* masked to -inf below */
        v16 s = transpose_add(part);
        s = vsel(lane < (float)n, s, (v16){0} - INFINITY);
        float bm = hmax(s), nm = bm > m[g] ? bm : m[g];
        v16 p = vsel(lane < (float)n, vexp(s - nm), (v16){0});   /* keys past ctx: exactly 0 */
        float corr = m[g] == -INFINITY ? 0.f : vexp((v16){0} + (m[g] - nm))[0];
        l[g] = l[g] * corr + hsum(p);
        m[g] = nm;
        prob[g] = p;
        corrs[g] = corr;
    }
    /* acc = acc * corr, then += p_j * v_j for the keys in order: each accumulator stays in a register
       through the keys (the V rows are re-read from L1 per head instead of every accumulator being
       loaded and stored per key); each accumulator sees the same operations as in a key-outer loop */
    for (int g = 0; g < G; g++) {
        v16 pb[16];
        for (int j = 0; j < n; j++) pb[j] = (v16){0} + prob[g][j];
        for (int i = 0; i < NV; i++) {
            v16 a = acc[g][i] * corrs[g];
            for (int j = 0; j < n; j++) a += pb[j] * load16(vp[j] + i * 16 * es, lt);
            acc[g][i] = a;
        }
    }
}

/* one (row, kv head): G query heads over keys first .. end-1, 16 keys at a time; D = 16 * NV. part NULL: the
   normalized result into out; else the chunk's state into part (acc [G][D] unnormalized, m [G], l [G]) */
INLINE void item_nv(const void *q, void *out, float *part, const void *kv, const int kt, int qt, int64_t r, int h,
                    int64_t first, int64_t end, const int64_t *table, int H, int KVH, int64_t NB, int BS,
                    const int NV, float scale) {
    int G = H / KVH, D = 16 * NV, es = elem_bytes(qt);
    v16 qv[MAXG][MAXNV], acc[MAXG][MAXNV];
    float m[MAXG], l[MAXG];
    for (int g = 0; g < G; g++) {
        const char *qp = (const char *)q + ((r * H + h * G + g) * D) * es;
        for (int i = 0; i < NV; i++) { qv[g][i] = load16(qp + i * 16 * es, qt) * scale; acc[g][i] = (v16){0}; }
        m[g] = -INFINITY; l[g] = 0.f;
    }
    int64_t k0 = first;
    for (; k0 + 16 <= end; k0 += 16)
        key_block(qv, acc, m, l, kv, kt, h, k0, end, table, G, KVH, NB, BS, NV, 16);
    if (k0 < end)
        key_block(qv, acc, m, l, kv, kt, h, k0, end, table, G, KVH, NB, BS, NV, (int)(end - k0));
    if (part) {
        for (int g = 0; g < G; g++) {
            for (int i = 0; i < NV; i++) memcpy(part + g * D + i * 16, &acc[g][i], sizeof(v16));
            part[G * D + g] = m[g], part[G * D + G + g] = l[g];
        }
        return;
    }
    for (int g = 0; g < G; g++) {
        char *op = (char *)out + ((r * H + h * G + g) * D) * es;
        float inv = l[g] > 0.f ? 1.f / l[g] : 0.f;   /* ctx == 0: no keys, a zero row (never NaN) */
        for (int i = 0; i < NV; i++) store16t(op + i * 16 * es, acc[g][i] * inv, qt);
    }
}

#ifdef HITENTER_ATTN_AVX2
/* the half-precision kernel in copies of their own (not inlined into item_vec, so one copy's code does not
   change how the other is compiled): head size 64 with its 8-lane vector count a constant, the rest with it a
   runtime value */
static __attribute__((noinline)) void half_d64(const void *q, void *out, float *part, const void *kv, int kt, int qt,
                                               int64_t r, int h, int64_t first, int64_t end, const int64_t *table,
                                               int H, int KVH, int64_t NB, int BS, float scale) {
    decode_half_avx2(q, out, part, kv, kt, qt, r, h, first, end, table, H, KVH, NB, BS, 8, scale);
}
static __attribute__((noinline)) void half_any(const void *q, void *out, float *part, const void *kv, int kt, int qt,
                                               int64_t r, int h, int64_t first, int64_t end, const int64_t *table,
                                               int H, int KVH, int64_t NB, int BS, int NV8, float scale) {
    decode_half_avx2(q, out, part, kv, kt, qt, r, h, first, end, table, H, KVH, NB, BS, NV8, scale);
}
#endif

/* The head sizes 64 and 128 get their own unrolled copies, the others the generic one, the cache type a
   runtime value; for 64 and 128 a half-precision cache gets copies with its type a constant too (a type
   test per load halved their speed). The fp32 copies are left exactly as they were: with the type a
   constant GCC contracts other multiply-adds into FMAs, which would change the fp32 kernel's bits. */
static void item_vec(const void *q, void *out, float *part, const void *kv, int kt, int qt, int64_t r, int h,
                     int64_t first, int64_t end, const int64_t *table, int H, int KVH, int64_t NB, int BS, int NV,
                     float scale) {
#ifdef HITENTER_ATTN_AVX2
    /* NV counts 16-lane vectors here, 8-lane ones there. A bf16 / f16 cache: half_d64 for head size 64, else
       half_any with NV a runtime value (its inner blocks unroll over heads and keys instead); fp32 / q8_0: head
       sizes 64, 128 and 256 get constant copies */
    if (kt == KV_F16 || kt == KV_BF16) {
        if (NV == 4) half_d64(q, out, part, kv, kt, qt, r, h, first, end, table, H, KVH, NB, BS, scale);
        else half_any(q, out, part, kv, kt, qt, r, h, first, end, table, H, KVH, NB, BS, 2 * NV, scale);
        return;
    }
    if (NV == 4) decode_item_avx2(q, out, part, kv, kt, qt, r, h, first, end, table, H, KVH, NB, BS, 8, scale);
    else if (NV == 8) decode_item_avx2(q, out, part, kv, kt, qt, r, h, first, end, table, H, KVH, NB, BS, 16, scale);
    else if (NV == 16) decode_item_avx2(q, out, part, kv, kt, qt, r, h, first, end, table, H, KVH, NB, BS, 32, scale);
    else decode_item_avx2(q, out, part, kv, kt, qt, r, h, first, end, table, H, KVH, NB, BS, 2 * NV, scale);
    return;
#endif
    if (NV == 4 && kt == KV_F16)
        item_nv(q, out, part, kv, KV_F16, qt, r, h, first, end, table, H, KVH, NB, BS, 4, scale);
    else if (NV == 8 && kt == KV_F16)
        item_nv(q, out, part, kv, KV_F16, qt, r, h, first, end, table, H, KVH, NB, BS, 8, scale);
    else if (NV == 4 && kt == KV_BF16)
        item_nv(q, out, part, kv, KV_BF16, qt, r, h, first, end, table, H, KVH, NB, BS, 4, scale);
    else if (NV == 8 && kt == KV_BF16)
        item_nv(q, out, part, kv, KV_BF16, qt, r, h, first, end, table, H, KVH, NB, BS, 8, scale);
    else {
        __asm__("" : "+r"(kt));   /* the type stays a runtime value here */
        if (NV == 4) item_nv(q, out, part, kv, kt, qt, r, h, first, end, table, H, KVH, NB, BS, 4, scale);
        else if (NV == 8) item_nv(q, out, part, kv, kt, qt, r, h, first, end, table, H, KVH, NB, BS, 8, scale);
        else item_nv(q, out, part, kv, kt, qt, r, h, first, end, table, H, KVH, NB, BS, NV, scale);
    }
}

/* Long rows: the keys first .. ctx-1 of a row are cut into chunks of CHUNK keys counted from its first key
   (a function of the row's position and window only, never of the thread count or the batch), each chunk a
   work item of its own (all threads share a long row even where the model has one or two KV heads), and
   the chunks' states merged in chunk order (merge_chunks). A row of <= CHUNK keys is one chunk: its
   arithmetic is that of the unsplit kernel. */
#define CHUNK 256

static inline int64_t row_first(int64_t ctx, int64_t window) { return window > 0 && ctx > window ? ctx - window : 0; }

/* one (row, KV head)'s n > 1 chunk states at part + c * step (acc [G][D] unnormalized, m [G], l [G]) merged in
   order into its G heads' rows of out (type qt): sum_c w_c acc_c / sum_c w_c l_c, w_c = e^(m_c - max m) */
static void merge_chunks(const float *part, int64_t n, int64_t step, int G, int D, char *out, int qt) {
    const int es = elem_bytes(qt), NV = D / 16;
    for (int g = 0; g < G; g++) {
        float mx = -INFINITY, lsum = 0.f;
        for (int64_t c = 0; c < n; c++) mx = part[c * step + G * D + g] > mx ? part[c * step + G * D + g] : mx;
        v16 acc[MAXNV];
        for (int i = 0; i < NV; i++) acc[i] = (v16){0};
        for (int64_t c = 0; c < n; c++) {
            const float *pc = part + c * step, mc = pc[G * D + g];
            const float w = mc == -INFINITY ? 0.f : vexp((v16){0} + (mc - mx))[0];
            lsum += w * pc[G * D + G + g];
            for (int i = 0; i < NV; i++) acc[i] += w * load16t(pc + g * D + i * 16, KV_F32);
        }
        const float inv = lsum > 0.f ? 1.f / lsum : 0.f;
        for (int i = 0; i < NV; i++) store16t(out + (int64_t)(g * D + i * 16) * es, acc[i] * inv, qt);
    }
}

/* types: the cache's element type (0 fp32, 1 bf16, 2 f16, 3 q8_0; vec16.h) + 4 x the type of q / out (0-2).
   0, or -1 an unsupported shape, -2 a row with ctx < 1, -3 out of memory. */
int decode_attention(const void *q, void *out, const void *kv, int types, int64_t R, const int64_t *ctx,
                     const int64_t *table_start, const int64_t *tables, int H, int KVH, int64_t NB, int BS,
                     int D, float scale, int64_t window, int nthreads) {
    const int kt = types % 4, qt = types / 4;
    if (H % KVH || H / KVH > MAXG || D % 16 || D / 16 > MAXNV || BS <= 0 || qt > 2 || (kt == KV_Q8_0 && D % Q8_0_QK))
        return -1;
    for (int64_t r = 0; r < R; r++)
        if (ctx[r] < 1) return -2;      /* the Python wrapper checks too (decode_kernel.check_rows) */
    const int G = H / KVH, es = elem_bytes(qt);
    const int64_t step = (int64_t)G * D + 2 * G;   /* floats of one chunk's state */
    int64_t *cs = malloc((size_t)(R + 1) * sizeof *cs);   /* row r's chunks: cs[r] .. cs[r + 1] - 1 */
    if (!cs) return -3;
    cs[0] = 0;
    for (int64_t r = 0; r < R; r++) cs[r + 1] = cs[r] + (ctx[r] - row_first(ctx[r], window) + CHUNK - 1) / CHUNK;
    const int64_t T = cs[R];
    /* crow: the row of each chunk; left: the chunks of each (row, KV head) not yet done (long rows only) */
    int64_t *crow = malloc((size_t)(T + R * KVH) * sizeof *crow), *left = crow + T;
    float *part = T > R ? malloc((size_t)(T * KVH * step) * sizeof *part) : NULL;
    if (!crow || (T > R && !part)) { free(cs); free(crow); free(part); return -3; }
    for (int64_t r = 0; r < R; r++) {
        for (int64_t c = cs[r]; c < cs[r + 1]; c++) crow[c] = r;
        for (int h = 0; h < KVH; h++) left[r * KVH + h] = cs[r + 1] - cs[r];
    }
    /* the thread that finishes a long row's last chunk (of a KV head) merges its chunks */
    #pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads) if (T * KVH > 1)
    for (int64_t i = 0; i < T * KVH; i++) {
        const int64_t c = i / KVH, r = crow[c], n = cs[r + 1] - cs[r];
        const int h = (int)(i % KVH);
        const int64_t b = row_first(ctx[r], window) + (c - cs[r]) * CHUNK;
        const int64_t e = ctx[r] - b < CHUNK ? ctx[r] : b + CHUNK;
        float *pt = n > 1 ? part + (c * KVH + h) * step : NULL;
        item_vec(q, out, pt, kv, kt, qt, r, h, b, e, tables + table_start[r], H, KVH, NB, BS, D / 16, scale);
        if (pt && __atomic_sub_fetch(&left[r * KVH + h], 1, __ATOMIC_ACQ_REL) == 0)
            merge_chunks(part + (cs[r] * KVH + h) * step, n, KVH * step, G, D,
                         (char *)out + ((r * H + h * G) * (int64_t)D) * es, qt);
    }
    free(cs);
    free(crow);
    free(part);
    return 0;
}

/* n values x (n % 32 == 0) as q8_0 blocks into dst (n / 32 * 34 bytes): the writers' quantizer (vec16.h),
   exported for the tests against the torch codec (hitenter/models/kv_q8_0.py) and llama.cpp's formula */
int q8_0_quantize(const float *x, void *dst, int64_t n) {
    if (n % Q8_0_QK) return -1;
    for (int64_t i = 0; i < n; i += 256) {
        const int m = n - i < 256 ? (int)(n - i) : 256;
        q8_0_quant_row((char *)dst + i / Q8_0_QK * Q8_0_BYTES, x + i, m);
    }
    return 0;
}
