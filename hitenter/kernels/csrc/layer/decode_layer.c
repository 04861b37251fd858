/* One decoder layer of any family for generation rows, as a single native call (hitenter/models/fused_decode.py).

   For R rows x (the residual stream, [R, H] fp32, updated in place), in this order (the families add
   QK-norm per head or over the whole projection, post-norms, no pre-norms (OLMo 2), GELU, partial or no
   RoPE, a residual multiplier and a sliding window, see `layer`; hitenter/models/decoder.py states them):
     h  = rmsnorm(x) * attn_norm                       qkv = h Wqkv^T (+ bias)     (qm_matmul_desc per part)
     q, k = rotate-half RoPE(q, k) with the rows' cos/sin tables            k, v -> the paged cache slots
     o  = attention of q over each row's keys 0 .. ctx-1                   (decode_attention, in place)
     x += o Wo^T
     h  = rmsnorm(x) * ffn_norm                        gu = h Wgu^T
     x += (silu(g) * u) Wdown^T
   The matmuls and the attention are the engine's own kernels, reached through function pointers set once
   (dl_init), so this file holds only the glue that costs ~130 torch dispatches per layer in eager torch: the
   norms, bias, RoPE, the cache write, SiLU*up and the residual adds, each one pass over a few KB.

   Bits: every step is row-wise with a fixed order (the norm's sum of squares: 16 lanes, then a fixed
   tree; elementwise ops), and the kernels it calls are row invariant, so a row's result does not depend
   on R or on the other rows: batch invariant, as the torch path is. It is not the torch path's bits
   (another summation order, another exp): the engine sends a row down one path or the other by its
   position only (a generation row, position >= prompt length - 1, comes here), so each row always gets
   the same arithmetic. The torch path in llama.py stays the statement of the math; tests compare the two.

   GCC / Clang vector extensions only; -march=native picks the vector width. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#include "../common/vec16.h"

typedef int (*qm_fn)(const void *desc, const float *x, int64_t M, int64_t ldx, float *y, int64_t ldy, int nthreads);
typedef int (*attn_fn)(const void *q, void *out, const void *kv, int types, int64_t R, const int64_t *ctx,
                       const int64_t *table_start, const int64_t *tables, int H, int KVH, int64_t NB, int BS,
                       int D, float scale, int64_t window, int nthreads);

typedef int (*pattn_fn)(const float *q, float *out, const void *kv, int types, int64_t S, const int64_t *row0,
                        const int64_t *nrows, const int64_t *pos0, const int64_t *table_start, const int64_t *tables,
                        int H, int KVH, int64_t NB, int BS, int D, float scale, int64_t window, int nthreads);

static qm_fn g_qm;
static attn_fn g_attn;
static pattn_fn g_pattn;   /* the prompt rows' tiled kernel (prompt_attention.c), or NULL: g_attn for every row */

void dl_init(void *qm, void *attn) { g_qm = (qm_fn)qm; g_attn = (attn_fn)attn; }
void dl_init_prompt(void *pattn) { g_pattn = (pattn_fn)pattn; }

#define MAXP 4   /* parts of one projection (runs of one block type, side by side in the output) */

typedef struct {   /* a projection: parts[i] writes output columns col[i] .. col[i] + its rows */
    const void *desc[MAXP];
    int64_t col[MAXP];
    int32_t nparts, pad;
} proj;

typedef struct {   /* one layer's weights and shapes (built once at load, fused_decode.py) */
    const float *attn_norm, *ffn_norm, *qkv_bias;   /* qkv_bias NULL when the model has none */
    proj qkv, o, gate_up, down;
    int32_t H, NH, KVH, D, F;
    float eps, scale;
    /* Gemma 3 (NULL / 0 for Llama, Qwen2): per-head RMSNorm of q and k over D, norms of the attention
       and FFN outputs before their residual adds, GELU (tanh) instead of SiLU, the second RoPE table
       (local layers), a sliding window of `window` keys */
    const float *q_norm, *k_norm, *post_attn_norm, *post_ffw_norm;
    int32_t gelu, rope_table;
    int64_t window;
    /* attn_norm / ffn_norm NULL: no pre-norm (OLMo 2). qk_full: q_norm / k_norm span all heads (OLMo 2).
       rope_dim: dimensions rotated (tables of rope_dim per row). no_rope: this layer skips RoPE (SmolLM3).
       residual_scale: block outputs multiplied before their residual add (Granite). */
    int32_t qk_full, rope_dim, no_rope, pad2;
    float residual_scale, pad3;
    /* a mixture of experts instead of the dense FFN (E > 0; models/moe.py states the math): router [E, H]
       (+ router_bias [E]), softmax over all E (gating 0) or over the chosen K (gating 1), top-K ties to the
       lower expert, the K weights renormalised when norm_topk; expert e: gate+up descriptor exp_gu[e]
       ([2F, H], F the expert width) and down exp_dn[e] ([H, F]); the K outputs added in rank order. */
    const float *router, *router_bias;
    const void *const *exp_gu, *const *exp_dn;
    int32_t E, K, gating, norm_topk;
    /* q_temp: the rotated queries times the step's per-row temperature qscale (Ministral 3, Llama 4's NoPE
       layers; models/query_temperature.py) */
    int32_t q_temp, pad5;
    /* Gemma 4 (0 / NULL for the others; hitenter/models/gemma4.py states the math):
       kv_shared: the layer projects only q and attends over another layer's cache (the one it is given),
       writing none; v_from_k: V is the K projection before K's norm and RoPE (no Wv: qkv's V columns are
       filled from K's); v_norm: V RMS-normed per head without a weight before it is written;
       per-layer input (ple_n > 0): after the FFN, x += ple_norm(ple_proj(gelu(ple_gate(x)) * p)), p the
       row's ple_n values at column ple_off of the step's per-layer inputs; out_scale: x times it at the end (0: none) */
    int32_t kv_shared, v_from_k, v_norm, ple_n;
    int64_t ple_off;
    proj ple_gate, ple_proj;
    const float *ple_norm;
    float out_scale, pad6;
} layer;

typedef struct {   /* one step's generation rows (shared by the layers) */
    const float *cos, *sin;                           /* [R, D] each */
    const int64_t *slots, *ctx, *starts, *tables;     /* [R], [R], [R], flat block tables */
    int64_t R, NB;
    int32_t BS, nthreads;
    const float *cos2, *sin2;                         /* the second RoPE table (Gemma 3's local layers) */
    int32_t kv_type, pad;                             /* the cache's elements: 0 fp32, 1 bf16, 2 f16, 3 q8_0 (vec16.h) */
    /* prompt rows (position < prompt length - 1) taking the tiled prompt kernel: NP runs of consecutive
       rows, run i = rows p_row0[i] .. + p_nrows[i] - 1 at positions p_pos0[i] .., block table at
       tables[p_tstart[i]:]; the other ND rows d_rows[] (key counts d_ctx[], tables at d_starts[]) the
       decode kernel. NP == 0 (or no prompt kernel): every row the decode kernel with ctx / starts. */
    int64_t NP, ND;
    const int64_t *p_row0, *p_nrows, *p_pos0, *p_tstart, *d_rows, *d_ctx, *d_starts;
    /* the sliding-window layers' own slots and flat tables (same table offsets) into caches of NB2 blocks
       (hitenter/kv_cache/window_group.py); tables2 NULL: every layer reads slots / tables */
    const int64_t *slots2, *tables2;
    int64_t NB2;
    const float *qscale;   /* [R]: each row's query temperature, for the layers with q_temp (NULL: none) */
    const float *ple;      /* [R, ple_ld]: each row's per-layer inputs (Gemma 4; NULL: none) */
    int64_t ple_ld;
} step;

static inline v16 ld(const float *p) { v16 v; memcpy(&v, p, 64); return v; }
static inline void st(float *p, v16 v) { memcpy(p, &v, 64); }

/* y[n] = x[n] / sqrt(mean(x^2) + eps) * w[n]; n % 16 == 0 */
static void rmsnorm(const float *x, const float *w, float *y, int n, float eps) {
    v16 acc = (v16){0};
    for (int i = 0; i < n; i += 16) { v16 v = ld(x + i); acc += v * v; }
    const float inv = 1.0f / sqrtf(hsum(acc) / (float)n + eps);
    for (int i = 0; i < n; i += 16) st(y + i, ld(x + i) * inv * ld(w + i));
}

/* y[n] = x[n] / sqrt(mean(x^2) + eps) (no weight: ggml_rms_norm); n % 16 == 0 */
static void rms_plain(const float *x, float *y, int n, float eps) {
    v16 acc = (v16){0};
    for (int i = 0; i < n; i += 16) { v16 v = ld(x + i); acc += v * v; }
    const float inv = 1.0f / sqrtf(hsum(acc) / (float)n + eps);
    for (int i = 0; i < n; i += 16) st(y + i, ld(x + i) * inv);
}

/* rotate-half RoPE of the first rd dims of `heads` heads of D at p, in place: pairs (i, i + rd/2); cos/sin
   tables of rd */
static void rope(float *p, int heads, int D, int rd, const float *cs, const float *sn) {
    const int half = rd / 2;
    for (int h = 0; h < heads; h++, p += D)
        for (int i = 0; i < half; i++) {
            const float a = p[i], b = p[i + half];
            p[i] = a * cs[i] - b * sn[i];
            p[i + half] = b * cs[i + half] + a * sn[i + half];
        }
}

/* The GLU's vectors: 16 lanes with AVX-512, 8 on AVX2 (there 16-lane vectors split in two and spill
   around the exp, making SiLU and GELU several times slower); vexpg is vec16.h's vexp, operation for
   operation, per lane, so either width gives the same bits */
#if defined(__AVX2__) && !defined(__AVX512F__)
#define GW 8
typedef float vg __attribute__((vector_size(32)));
typedef int32_t vgi __attribute__((vector_size(32)));
#else
#define GW 16
typedef v16 vg;
typedef v16i vgi;
#endif
static inline vg ldg(const float *p) { vg v; memcpy(&v, p, sizeof v); return v; }
static inline void stg(float *p, vg v) { memcpy(p, &v, sizeof v); }
static inline vg vselg(vgi m, vg a, vg b) { return (vg)(((vgi)a & m) | ((vgi)b & ~m)); }
DEF_VEXP(vexpg, vg, vgi, vselg)   /* vec16.h's e^x at this file's width */

/* a[i] = gelu_tanh(g[i]) * u[i] = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) u, tanh z = 1 - 2 / (e^2z + 1) */
static void gelu_mul(const float *g, const float *u, float *a, int64_t F) {
    for (int64_t i = 0; i < F; i += GW) {
        const vg x = ldg(g + i);
        const vg z = 0.7978845608028654f * (x + 0.044715f * x * x * x);
        const vg t = 1.0f - 2.0f / (vexpg(2.0f * z) + 1.0f);
        stg(a + i, 0.5f * x * (1.0f + t) * ldg(u + i));
    }
}

/* Steps of at least PAR_ROWS rows spread the row-wise glue below over the step's threads (on one thread
   it is a noticeable share of a prefill's CPU time, the other threads waiting); a row's arithmetic is the
   same on any thread. Batched decode steps of 16 rows gain a little too. Smaller steps keep it on the
   calling thread, where a parallel region costs about what it gains (figures: docs/benchmarks.md). */
#define PAR_ROWS 16

/* h = rmsnorm(x) * w per row, or h = x where the family has no pre-norm (w NULL) */
static void pre_norm(const float *w, const float *x, float *h, int64_t R, int H, float eps, int nth) {
    if (!w) { memcpy(h, x, (size_t)(R * H) * sizeof(float)); return; }
#pragma omp parallel for schedule(static) num_threads(nth) if (R >= PAR_ROWS && nth > 1)
    for (int64_t r = 0; r < R; r++) rmsnorm(x + r * H, w, h + r * H, H, eps);
}

/* x += y (x += s * y with a residual multiplier s != 1) */
static void residual_add(float *x, const float *y, int64_t n, float s) {
    if (s == 1.0f) { for (int64_t i = 0; i < n; i += 16) st(x + i, ld(x + i) + ld(y + i)); return; }
    for (int64_t i = 0; i < n; i += 16) st(x + i, ld(x + i) + ld(y + i) * s);
}

/* per row: y = post(y) (post-norm, where the family has one), x += y (times the residual multiplier), then
   h = next(x) (the next pre-norm; h = x without one; h NULL: none) */
static void block_out(const float *post, const float *next, float *x, float *y, float *h, int64_t R, int H,
                      float eps, float s, int nth) {
#pragma omp parallel for schedule(static) num_threads(nth) if (R >= PAR_ROWS && nth > 1)
    for (int64_t r = 0; r < R; r++) {
        float *xr = x + r * H, *yr = y + r * H;
        if (post) rmsnorm(yr, post, yr, H, eps);
        residual_add(xr, yr, H, s);
        if (h && next) rmsnorm(xr, next, h + r * H, H, eps);
        else if (h) memcpy(h + r * H, xr, (size_t)H * sizeof(float));
    }
}

static int project(const proj *pr, const float *x, int64_t R, int64_t ldx, float *y, int64_t ldy, int nth) {
    for (int i = 0; i < pr->nparts; i++) {
        const int rc = g_qm(pr->desc[i], x, R, ldx, y + pr->col[i], ldy, nth);
        if (rc) return rc;
    }
    return 0;
}

/* scratch floats needed for R rows */
int64_t dl_scratch(const layer *L, int64_t R) {
    const int64_t q = (int64_t)L->NH * L->D, kv = (int64_t)L->KVH * L->D;
    const int64_t f = L->F > L->ple_n ? L->F : L->ple_n;   /* the per-layer input's gate uses the FFN's buffer */
    const int64_t dense = R * (L->H + (q + 2 * kv) + q + q + L->H + 2 * f + f) + 2 * R * q;
    /* experts, per (row, rank) pair: weights, ids, order; gathered rows, outputs [H] each, gate+up [2F],
       act [F]; per row the router logits [E]; the E + 1 offsets */
    const int64_t P = R * L->K;
    return L->E ? dense + R * L->E + P * (3 + 2 * (int64_t)L->H + 3 * (int64_t)L->F) + L->E + 1 : dense;
}

/* act(g) * u into a: SiLU, or GELU (tanh) */
static void glu(const layer *L, const float *g, const float *u, float *a, int64_t F) {
    if (L->gelu) { gelu_mul(g, u, a, F); return; }
    for (int64_t i = 0; i < F; i += GW) {   /* silu(g) * u = g / (1 + e^-g) * u */
        const vg gv = ldg(g + i);
        stg(a + i, gv / (1.0f + vexpg(-gv)) * ldg(u + i));
    }
}

/* one row's experts (ids by rank) and weights from its router logits (in place: softmax for gating 0) */
static void route(const layer *L, float *logit, int32_t *ids, float *w) {
    const int E = L->E, K = L->K;
    if (L->gating == 0) {   /* softmax over all experts */
        float m = logit[0], sum = 0.0f;
        for (int e = 1; e < E; e++) m = logit[e] > m ? logit[e] : m;
        for (int e = 0; e < E; e++) { logit[e] = expf(logit[e] - m); sum += logit[e]; }
        for (int e = 0; e < E; e++) logit[e] /= sum;
    }
    for (int k = 0; k < K; k++) {   /* the k-th largest, ties to the lower expert */
        int best = -1;
        for (int e = 0; e < E; e++) {
            int taken = 0;
            for (int j = 0; j < k; j++) taken |= ids[j] == e;
            if (!taken && (best < 0 || logit[e] > logit[best])) best = e;
        }
        ids[k] = best;
        w[k] = logit[best];
    }
    if (L->gating == 1) {   /* softmax over the chosen k */
        float m = w[0], sum = 0.0f;
        for (int k = 1; k < K; k++) m = w[k] > m ? w[k] : m;
        for (int k = 0; k < K; k++) { w[k] = expf(w[k] - m); sum += w[k]; }
        for (int k = 0; k < K; k++) w[k] /= sum;
    }
    if (L->norm_topk) {
        float sum = 0.0f;
        for (int k = 0; k < K; k++) sum += w[k];
        sum = sum < 6.103515625e-5f ? 6.103515625e-5f : sum;   /* llama.cpp's clamp */
        for (int k = 0; k < K; k++) w[k] /= sum;
    }
}

/* expert e's n gathered rows (rows [n, H]) through gate+up, act and down into out [n, H]; gu [n, 2F],
   act [n, F] its own buffers */
static int expert_rows(const layer *L, int64_t e, const float *rows, int64_t n, float *gu, float *act, float *out,
                       int nthreads) {
    const int64_t H = L->H, F = L->F;
    int rc = g_qm(L->exp_gu[e], rows, n, H, gu, 2 * F, nthreads);
    if (rc) return rc;
    for (int64_t i = 0; i < n; i++) glu(L, gu + i * 2 * F, gu + i * 2 * F + F, act + i * F, F);
    return g_qm(L->exp_dn[e], act, n, F, out, H, nthreads);
}

/* the mixture of experts on the normed rows h [R, H] into y [R, H]. The R x K (row, rank) pairs are
   sorted by expert (a counting sort: expert e's pairs are entries off[e] .. off[e+1] of `order`), each
   active expert's rows gathered and run as one matmul per projection. With at least as many active
   experts as threads the experts run side by side, one thread each; otherwise one after another on all
   threads. A row's bits do not depend on the other rows nor on the threads (the matmuls' contract). */
static int moe(const layer *L, const step *S, const float *h, float *y, float *scratch) {
    const int64_t R = S->R, H = L->H, F = L->F, E = L->E, K = L->K, P = R * K;
    float *logit = scratch, *w = logit + R * E, *rows = w + P, *out = rows + P * H, *gu = out + P * H;
    float *act = gu + P * 2 * F;
    int32_t *ids = (int32_t *)(act + P * F), *order = ids + P, *off = order + P;   /* off: E + 1 */
    for (int64_t r = 0; r < R; r++) {
        const float *hr = h + r * H;
        for (int64_t e = 0; e < E; e++) {
            const float *wr = L->router + e * H;
            v16 acc = (v16){0};
            for (int64_t i = 0; i < H; i += 16) acc += ld(hr + i) * ld(wr + i);
            logit[r * E + e] = hsum(acc) + (L->router_bias ? L->router_bias[e] : 0.0f);
        }
        route(L, logit + r * E, ids + r * K, w + r * K);
    }
    for (int64_t e = 0; e <= E; e++) off[e] = 0;
    for (int64_t j = 0; j < P; j++) off[ids[j] + 1]++;
    int active = 0;
    for (int64_t e = 0; e < E; e++) { active += off[e + 1] > 0; off[e + 1] += off[e]; }
    {
        int32_t *next = (int32_t *)(logit);   /* the logits are spent: reuse them as E cursors */
        for (int64_t e = 0; e < E; e++) next[e] = off[e];
        for (int64_t j = 0; j < P; j++) {
            const int32_t at = next[ids[j]]++;
            order[at] = (int32_t)j;
            memcpy(rows + (int64_t)at * H, h + (j / K) * H, H * sizeof(float));
        }
    }
    const int side_by_side = S->nthreads > 1 && active >= S->nthreads;
    int rc = 0;
#pragma omp parallel for schedule(dynamic, 1) num_threads(S->nthreads) if (side_by_side) reduction(| : rc)
    for (int64_t e = 0; e < E; e++) {
        const int64_t a = off[e], n = off[e + 1] - a;
        if (n)
            rc |= expert_rows(L, e, rows + a * H, n, gu + a * 2 * F, act + a * F, out + a * H,
                              side_by_side ? 1 : S->nthreads);
    }
    if (rc) return rc;
    /* each pair's output times its weight, added to its row in rank order */
    float *slot = rows;   /* the gathered rows are spent: [P, H] by (row, rank) */
    for (int64_t at = 0; at < P; at++) {
        const int64_t j = order[at];
        const v16 wk = (v16){0} + w[j];
        for (int64_t i = 0; i < H; i += 16) st(slot + j * H + i, ld(out + at * H + i) * wk);
    }
    for (int64_t r = 0; r < R; r++) {
        memcpy(y + r * H, slot + r * K * H, H * sizeof(float));
        for (int64_t k = 1; k < K; k++)
            for (int64_t i = 0; i < H; i += 16) st(y + r * H + i, ld(y + r * H + i) + ld(slot + (r * K + k) * H + i));
    }
    return 0;
}

/* H_n on each run of n = min(64, D) of the D values at x: a q8_0 cache's V rows, and the attention output over
   them (H_64 o back to o; kv_q8_0.py's rotate_v, the same float ops) */
static void q8_0_rotate_v_row(float *x, int D) {
    const int n = D < 64 ? D : 64;
    for (int i = 0; i < D; i += n) q8_0_rotate_row(x + i, n);
}

/* bias, RoPE, the cache write, then the attention of the rows' queries into obuf [R, NH * D]: prompt rows by
   the tiled prompt kernel, generation rows by the decode kernel (step's NP / ND); a q8_0 cache's values are
   H_64 v, so what the kernels compute there is H_64 o (attention_part undoes it) */
static int attention_heads(const layer *L, const step *S, float *qkv, float *qbuf, float *obuf, void *kv,
                           float *dscratch) {
    const int64_t R = S->R, q = (int64_t)L->NH * L->D, kvw = (int64_t)L->KVH * L->D, n = q + 2 * kvw;
    const int D = L->D;
    const int kt = S->kv_type, es = elem_bytes(kt);
    const int64_t rb = kv_row_bytes(kt, D);   /* a cache row's bytes */
    const int loc = L->window > 0 && S->tables2;   /* a local layer with its own tables */
    const int64_t *slots = loc ? S->slots2 : S->slots, *tables = loc ? S->tables2 : S->tables;
    const int64_t NB = loc ? S->NB2 : S->NB;
    char *K = (char *)kv, *V = K + (int64_t)L->KVH * NB * S->BS * rb;
#pragma omp parallel for schedule(static) num_threads(S->nthreads) if (R >= PAR_ROWS && S->nthreads > 1)
    for (int64_t r = 0; r < R; r++) {
        float *row = qkv + r * n;
        if (L->qkv_bias)
            for (int64_t i = 0; i < n; i++) row[i] += L->qkv_bias[i];
        const int heads = L->kv_shared ? L->NH : L->NH + L->KVH;   /* the heads this layer projects */
        if (L->v_from_k && !L->kv_shared) memcpy(row + q + kvw, row + q, kvw * sizeof(float));
        if (L->q_norm && L->qk_full) {
            rmsnorm(row, L->q_norm, row, (int)q, L->eps);
            rmsnorm(row + q, L->k_norm, row + q, (int)kvw, L->eps);
        } else if (L->q_norm)
            for (int h = 0; h < heads; h++)
                rmsnorm(row + (int64_t)h * D, h < L->NH ? L->q_norm : L->k_norm, row + (int64_t)h * D, D, L->eps);
        if (L->v_norm && !L->kv_shared)
            for (int h = 0; h < L->KVH; h++) rms_plain(row + q + kvw + (int64_t)h * D, row + q + kvw + (int64_t)h * D, D, L->eps);
        if (!L->no_rope) {
            const int rd = L->rope_dim ? L->rope_dim : D;
            const float *cs = L->rope_table ? S->cos2 : S->cos, *sn = L->rope_table ? S->sin2 : S->sin;
            rope(row, heads, D, rd, cs + r * rd, sn + r * rd);
        }
        if (L->q_temp && S->qscale) {
            const float t = S->qscale[r];
            for (int64_t i = 0; i < q; i++) row[i] *= t;
        }
        memcpy(qbuf + r * q, row, q * sizeof(float));
        if (kt == KV_Q8_0)   /* its keys are stored rotated, H k: the queries meet them as H q (kv_q8_0.py) */
            for (int h = 0; h < L->NH; h++) q8_0_rotate_row(qbuf + r * q + (int64_t)h * D, D);
        for (int h = 0; h < (L->kv_shared ? 0 : L->KVH); h++) {   /* plane h of K and of V: [KVH][NB * BS][D] */
            const int64_t at = ((int64_t)h * NB * S->BS + slots[r]) * rb;
            const float *kr = row + q + (int64_t)h * D, *vr = row + q + kvw + (int64_t)h * D;
            if (kt == KV_F32) {
                memcpy(K + at, kr, D * sizeof(float));
                memcpy(V + at, vr, D * sizeof(float));
            } else if (kt == KV_Q8_0) {   /* quantized as write_kv does (kv_q8_0.py; ggml's reference), rotated */
                q8_0_rotate_row((float *)kr, D);
                q8_0_rotate_v_row((float *)vr, D);
                q8_0_quant_row(K + at, kr, D);
                q8_0_quant_row(V + at, vr, D);
            } else   /* rounded to the cache type (nearest even, as write_kv's .to()) */
                for (int i = 0; i < D; i += 16) {
                    store16t(K + at + i * es, ld(kr + i), kt);
                    store16t(V + at + i * es, ld(vr + i), kt);
                }
        }
    }
    if (!S->NP || !g_pattn)
        return g_attn(qbuf, obuf, kv, kt, R, S->ctx, S->starts, tables, L->NH, L->KVH, NB, S->BS, D, L->scale,
                      L->window, S->nthreads);
    int rc = g_pattn(qbuf, obuf, kv, kt, S->NP, S->p_row0, S->p_nrows, S->p_pos0, S->p_tstart, tables, L->NH,
                     L->KVH, NB, S->BS, D, L->scale, L->window, S->nthreads);
    if (rc || !S->ND) return rc;
    /* the generation rows, gathered behind the dense buffers (2 R q floats of dl_scratch; the experts' scratch
       there is used only after the attention) */
    float *qd = dscratch, *od = qd + S->ND * q;
    for (int64_t i = 0; i < S->ND; i++) memcpy(qd + i * q, qbuf + S->d_rows[i] * q, q * sizeof(float));
    rc = g_attn(qd, od, kv, kt, S->ND, S->d_ctx, S->d_starts, tables, L->NH, L->KVH, NB, S->BS, D, L->scale,
                L->window, S->nthreads);
    for (int64_t i = 0; i < S->ND && !rc; i++) memcpy(obuf + S->d_rows[i] * q, od + i * q, q * sizeof(float));
    return rc;
}

/* attention_heads, and on a q8_0 cache each output head back from H_64 o to o */
static int attention_part(const layer *L, const step *S, float *qkv, float *qbuf, float *obuf, void *kv,
                          float *dscratch) {
    const int rc = attention_heads(L, S, qkv, qbuf, obuf, kv, dscratch);
    if (rc || S->kv_type != KV_Q8_0) return rc;
    const int64_t heads = S->R * L->NH;
#pragma omp parallel for schedule(static) num_threads(S->nthreads) if (S->R >= PAR_ROWS && S->nthreads > 1)
    for (int64_t h = 0; h < heads; h++) q8_0_rotate_v_row(obuf + h * L->D, L->D);
    return 0;
}

/* one layer over S->R rows of x [R, H] (in place) and the layer's KV cache [2, KVH, NB, BS, D] (fp32, bf16,
   f16 or q8_0 rows: S->kv_type).
   scratch: dl_scratch floats. Returns 0, or the failing kernel's code. */
int dl_layer(const layer *L, const step *S, float *x, void *kv, float *scratch) {
    const int64_t R = S->R, H = L->H, F = L->F, q = (int64_t)L->NH * L->D, n = q + 2 * (int64_t)L->KVH * L->D;
    float *h = scratch, *qkv = h + R * H, *qbuf = qkv + R * n, *obuf = qbuf + R * q, *tmp = obuf + R * q;
    const int64_t f = F > L->ple_n ? F : L->ple_n;   /* dl_scratch's FFN buffers */
    float *gu = tmp + R * H, *act = gu + R * 2 * f;
    int rc;
    if (!g_qm || !g_attn) return -10;
    const int nth = S->nthreads;
    pre_norm(L->attn_norm, x, h, R, (int)H, L->eps, nth);
    if ((rc = project(&L->qkv, h, R, H, qkv, n, nth))) return rc;
    if ((rc = attention_part(L, S, qkv, qbuf, obuf, kv, act + R * f))) return rc;
    if ((rc = project(&L->o, obuf, R, q, tmp, H, nth))) return rc;
    block_out(L->post_attn_norm, L->ffn_norm, x, tmp, h, R, (int)H, L->eps, L->residual_scale, nth);
    if (L->E) {
        if ((rc = moe(L, S, h, tmp, act + R * f))) return rc;
    } else {
        if ((rc = project(&L->gate_up, h, R, H, gu, 2 * F, S->nthreads))) return rc;
#pragma omp parallel for schedule(static) num_threads(nth) if (R >= PAR_ROWS && nth > 1)
        for (int64_t r = 0; r < R; r++) glu(L, gu + r * 2 * F, gu + r * 2 * F + F, act + r * F, F);
        if ((rc = project(&L->down, act, R, F, tmp, H, nth))) return rc;
    }
    block_out(L->post_ffw_norm, NULL, x, tmp, NULL, R, (int)H, L->eps, L->residual_scale, nth);
    if (L->ple_n) {
        if (!S->ple) return -11;
        const int64_t np = L->ple_n;
        if ((rc = project(&L->ple_gate, x, R, H, gu, np, nth))) return rc;
        for (int64_t r = 0; r < R; r++) gelu_mul(gu + r * np, S->ple + r * S->ple_ld + L->ple_off, act + r * np, np);
        if ((rc = project(&L->ple_proj, act, R, np, tmp, H, nth))) return rc;
        block_out(L->ple_norm, NULL, x, tmp, NULL, R, (int)H, L->eps, 1.0f, nth);
    }
    if (L->out_scale != 0.0f && L->out_scale != 1.0f) {   /* 0: not set (the families without one) */
        const v16 s = (v16){0} + L->out_scale;
        for (int64_t i = 0; i < R * H; i += 16) st(x + i, ld(x + i) * s);
    }
    return 0;
}

/* every layer of a model in turn, layer i on cache kvs[i] (a pure generation step: one call per step) */
int dl_forward(const layer *const *Ls, void *const *kvs, int n, const step *S, float *x, float *scratch) {
    for (int i = 0; i < n; i++) {
        const int rc = dl_layer(Ls[i], S, x, kvs[i], scratch);
        if (rc) return rc;
    }
    return 0;
}

/* Shapes the layer supports (checked once at load): vector widths divide H, F and D/2 loops are scalar. */
int dl_supported(int H, int F, int D) { return H % 16 == 0 && F % 16 == 0 && D % 16 == 0; }
