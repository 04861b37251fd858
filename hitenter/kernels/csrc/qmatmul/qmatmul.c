/* y[M, N] = x[M, K] W[N, K]^T with W in GGUF blocks (Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 IQ4_NL MXFP4, 32 elements;
 * Q2_K Q3_K Q4_K Q5_K Q6_K IQ4_XS, 256 elements).
 *
 * x is quantized once per call to int8 blocks (32 per fp32 scale for the 32-wide types, 256 with
 * 16-element sums for the 256-wide ones), then integer dot products run per weight block.
 * Threads take chunks of weight rows (dynamically); within a chunk the row path walks the weight
 * rows once per tile of MT activation rows (M <= MT: every weight byte is streamed from memory
 * once), unpacking each in registers once per MR activation rows (Q4_K/Q5_K/Q6_K: a run of any length up to
 * 8); from M >= 6 (32-wide types) or 9 (K types; 17 on AVX2 without VNNI) every type takes the packed
 * GEMM instead (qm_pack.h; Q8_0 only with VNNI). Every (m, n) output is the same function of
 * (row m of x, row n of W) whatever M, the tiling or the thread count: batch invariant.
 *
 * ISA: chosen at compile time (-march=native, or forced down with -mno-avx512f / -DQM_GENERIC). */
#include <stdlib.h>
#include <math.h>
#include <omp.h>

#include "qm_common.h"

#if !defined(QM_GENERIC) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include "qm_simd.h"
#include "qm_squant.h"
#include "qm_pack.h"
#include "qm_repack.h"
#define QM_ISA (QM_VNNI ? 2 : 1)
#else
#include "qm_generic.h"
#define QM_ISA 0
#endif

#ifndef QM_PF_BYTES
#define QM_PF_BYTES 16384   /* how far ahead in its weight rows the row path prefetches at M <= 2 (run_range) */
#endif
#define MT 64   /* activation rows per pass over a thread's weights (64 x K int8 stays in L2) */

#include "qm_dispatch.h"

int qm_isa(void) { return QM_ISA; }   /* 0 generic, 1 AVX2, 2 AVX512-VNNI */

int qm_supported(int qt) {
    int e, b;
    row_fn f;
    return type_info(qt, &e, &b, &f) == 0;
}

static size_t xrow_size(int elems, int64_t nb) {
#if QM_ISA
    if (elems == 32) return xl_row_bytes(nb);
#endif
    return (size_t)nb * (elems == 32 ? sizeof(xq32) : sizeof(xq256));
}

static void quant_rows(int qt, int elems, const float *x, int64_t ldx, int64_t nb, char *xq, size_t xrow_bytes,
                       int64_t m0, int64_t m1) {
    (void)qt;
    for (int64_t m = m0; m < m1; m++) {
#if QM_ISA
        if (elems == 32) quant_row32(x + m * ldx, nb, xq + m * xrow_bytes, qm_off32(qt));
#else
        if (elems == 32) quant_row32(x + m * ldx, nb, (xq32 *)(xq + m * xrow_bytes));
#endif
        else quant_row256(x + m * ldx, nb, (xq256 *)(xq + m * xrow_bytes));
    }
}

/* the next run of activation rows, `left` of them still to do: 8/4/2/1, or (maxr > 0: a row function with an
 * instance for every R up to maxr) the fewest runs of at most maxr rows, of equal length as near as may be */
static inline int run_rows(int64_t left, int maxr) {
    if (!maxr) return left >= 8 ? 8 : left >= 4 ? 4 : left >= 2 ? 2 : 1;
    const int64_t runs = (left + maxr - 1) / maxr;
    return (int)((left + runs - 1) / runs);
}

/* the rows [n0, n1) of y for all M rows: tiles of MT activation rows, runs of run_rows */
static void run_range(row_fn fn, int maxr, const uint8_t *w, int64_t ldw, int64_t nb, const char *xq, size_t xrow_bytes,
                      int64_t M, int64_t n0, int64_t n1, float *y, int64_t ldy) {
    for (int64_t mt = 0; mt < M; mt += MT) {
        const int64_t mend = mt + MT < M ? mt + MT : M;
        /* decode (1-2 activation rows): one thread's GEMV does not keep enough reads in flight for the
           hardware prefetcher alone to reach the memory's bandwidth (it restarts at every matrix and lags
           behind a loop this slow); fetching the row QM_PF_BYTES ahead (at least one row) raises a thread's
           Q4_K GEMV from ~6.5 to ~10 GB/s on 6144-wide rows and from ~8 to ~9 on 2048-wide ones (Sapphire
           Rapids, bench/memory_bandwidth.py for the ceiling). Up to the end of the thread's chunk. A prefetch
           changes no result. */
        const int64_t ahead = (QM_PF_BYTES + ldw - 1) / ldw;
        const int pf = mend - mt <= 2 && QM_PF_BYTES > 0;
        for (int64_t n = n0; n < n1; n++) {
            if (pf && n + ahead < n1)
                for (int64_t o = 0; o < ldw; o += 64) __builtin_prefetch(w + (n + ahead) * ldw + o);
            for (int64_t m = mt; m < mend;) {
                const int64_t left = mend - m;
                const int R = run_rows(left, maxr);
                fn(w + n * ldw, nb, xq + m * xrow_bytes, (int64_t)xrow_bytes, R, y + m * ldy + n, ldy);
                m += R;
            }
        }
    }
}

#define MAXT 16   /* threads with a range of their own (beyond that, threads share ranges) */

typedef struct {   /* a thread's range of chunks [next, end): its own cache line, so taking a chunk from
                    * it costs the owner no coherence traffic until another thread steals */
    _Alignas(64) int64_t next;
    int64_t end;
} range;

typedef struct {   /* one call's work, shared by the threads */
    row_fn fn;
    int maxr;   /* runs of up to maxr rows of any length (row_max_run), 0: runs of 8/4/2/1 */
    const uint8_t *w;
    int64_t ldw, nb, M, N, ldy, chunk, nchunks;
    int nranges;
    range ranges[MAXT];
    const char *xq;
    size_t xrow_bytes;
    float *y;
    int packed, failed;
#if QM_ISA
    pack_fn pack;
    pkern_fn kern;
    int qt;
    size_t pbytes;
    rkern_fn rkern;   /* a weight repacked at load (qm_repack.h): every M runs it, on x's tiles xt */
    const char *xt;
    size_t rbytes;
#endif
} job;

/* the next chunk for thread t: from its own range first (consecutive chunks, so the hardware prefetcher
 * keeps streaming across them), then stolen from the others' ranges in turn; -1 when none is left */
static int64_t take_chunk(job *j, int t) {
    for (int i = 0; i < j->nranges; i++) {
        range *r = &j->ranges[(t + i) % j->nranges];
        if (__atomic_load_n(&r->next, __ATOMIC_RELAXED) >= r->end) continue;
        const int64_t c = __atomic_fetch_add(&r->next, 1, __ATOMIC_RELAXED);
        if (c < r->end) return c;
    }
    return -1;
}

/* one thread: take chunks of weight rows until none is left */
static void worker(job *j, int t) {
    char *buf = NULL;
#if QM_ISA
    if (j->packed && !(buf = aligned_alloc(64, (size_t)PG * j->nb * j->pbytes)))
        __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED);
#endif
    for (;;) {
        const int64_t c = take_chunk(j, t);
        if (c < 0) break;
        const int64_t n0 = c * j->chunk, n1 = n0 + j->chunk < j->N ? n0 + j->chunk : j->N;
#if QM_ISA
        if (j->rkern) {
            run_repacked(j->rkern, j->rbytes, j->w, j->nb, j->xt, j->M, n0, n1, j->y, j->ldy);
            continue;
        }
        if (j->packed) {
            if (buf) run_packed(j->pack, j->kern, packed_any_r(j->qt), j->pbytes, j->w, j->ldw, j->nb, j->xq, j->xrow_bytes, j->M, n0, n1, j->y, j->ldy, buf);
            continue;
        }
#endif
        run_range(j->fn, j->maxr, j->w, j->ldw, j->nb, j->xq, j->xrow_bytes, j->M, n0, n1, j->y, j->ldy);
    }
    free(buf);
}

/* A weight as the hot call sees it: validated once (qm_desc_init), then passed by pointer, so a
 * decode-step call crosses ctypes with 7 arguments and no weight checks. */
typedef struct {
    const uint8_t *w;
    int64_t N, K, ldw, nb;
    int32_t qt, elems;
    row_fn fn;
    int32_t lanes;   /* 0: the file's rows; PN: repacked at load (qm_repack) */
} qm_desc;

int64_t qm_desc_size(void) { return (int64_t)sizeof(qm_desc); }

/* returns 0, -1 (unsupported type), -2 (K not a whole number of blocks / bad sizes) */
int qm_desc_init(qm_desc *d, int qt, const uint8_t *w, int64_t N, int64_t K, int64_t ldw) {
    int elems, bytes;
    row_fn fn;
    if (type_info(qt, &elems, &bytes, &fn)) return -1;
    if (K <= 0 || K % elems || N < 0 || ldw < K / elems * bytes) return -2;
    d->w = w, d->N = N, d->K = K, d->ldw = ldw, d->nb = K / elems, d->qt = qt, d->elems = elems, d->fn = fn;
    d->lanes = 0;
    return 0;
}

/* Repacking (qm_repack.h): rows per group (0: no repacking in this build), the bytes a repacked [N, K]
 * weight of type qt takes (0: this type is not repacked here), the repacking itself (w: the file's
 * rows, ldw bytes apart; out: qm_repacked_bytes bytes) and a descriptor of the result. */
int qm_repack_lanes(void) {
#if QM_ISA
    return PN;
#else
    return 0;
#endif
}

int64_t qm_repacked_bytes(int qt, int64_t N, int64_t K) {
#if QM_ISA
    return repacked_bytes(qt, N, K);
#else
    (void)qt, (void)N, (void)K;
    return 0;
#endif
}

int qm_repack(int qt, const uint8_t *w, int64_t N, int64_t K, int64_t ldw, uint8_t *out, int nthreads) {
    if (!qm_repacked_bytes(qt, N, K)) return -1;
#if QM_ISA
    int elems, bytes;
    row_fn fn;
    type_info(qt, &elems, &bytes, &fn);
    if (ldw < K / 32 * bytes) return -2;
    repack_all(qt, bytes, w, ldw, N, K, out, nthreads);
#else
    (void)w, (void)ldw, (void)out, (void)nthreads;
#endif
    return 0;
}

int qm_desc_init_repacked(qm_desc *d, int qt, const uint8_t *w, int64_t N, int64_t K) {
    if (!qm_repacked_bytes(qt, N, K)) return -1;
    const int rc = qm_desc_init(d, qt, w, N, K, K / 32 * 34);   /* ldw: any valid stride, unused */
    d->lanes = qm_repack_lanes();
    return rc;
}

/* y[M, N] (row stride ldy) = x[M, K] (row stride ldx) W^T; 0, -2 (bad sizes), -3 (no memory) */
int qm_matmul_desc(const qm_desc *d, const float *x, int64_t M, int64_t ldx, float *y, int64_t ldy, int nthreads) {
    const int elems = d->elems, qt = d->qt;
    const int64_t N = d->N, K = d->K;
    job j = {0};
    if (M < 0 || ldx < K || ldy < N) return -2;
    if (M == 0 || N == 0) return 0;
    j.fn = d->fn, j.maxr = row_max_run(qt), j.w = d->w, j.ldw = d->ldw, j.nb = d->nb, j.M = M, j.N = N, j.y = y, j.ldy = ldy;
    j.xrow_bytes = xrow_size(elems, j.nb);
    char *xq = aligned_alloc(64, (M * j.xrow_bytes + 63) / 64 * 64);
    if (!xq) return -3;
    j.xq = xq;
    char *xt = NULL;   /* the repacked kernel's tiles of x (qm_repack.h: tile_rows) */
#if QM_ISA
    if (d->lanes) {
        j.rkern = repacked_fn(qt), j.rbytes = repack_block_bytes(qt);
        if (!j.rkern || d->lanes != PN) { free(xq); return -2; }
    }
    j.qt = qt;
    j.packed = !d->lanes && M >= (elems == 32 ? PACK_MIN_M32 : PACK_MIN_K) && packed_fns(qt, &j.pack, &j.kern, &j.pbytes);
    if (j.rkern && !(xt = aligned_alloc(64, (M * j.nb * XT_BLOCK(1) + 63) / 64 * 64))) { free(xq); return -3; }
    j.xt = xt;
#else
    (void)qt;
#endif
    /* small products are not worth waking threads for */
    const int nt = (double)M * N * K < 2e5 || nthreads < 1 ? 1 : nthreads;
    /* Chunks of weight rows, each thread starting on a contiguous range of its own (one long stream
     * for the prefetcher: interleaved chunks slow a GEMV on the small matrices), the threads
     * that finish first stealing the rest: on a shared, oversubscribed machine a descheduled thread
     * leaves its work to the others instead of stalling the call at the barrier.
     * Which thread computes a row changes nothing in its result. */
    const int grouped = j.packed || d->lanes;   /* chunks of whole packed groups (PG * PN = 32 rows) */
    /* about 16 chunks per thread: with 8 (N / (nt * 8)), SmolLM2's o/down projections (N = 576) came in 9
     * chunks of 64 rows, 5 + 4 on 2 threads, and its qkv (960) in 15 */
    const int64_t unit = grouped ? 32 : 4, want = N / (nt * 16);
    j.chunk = want > unit ? (want + unit - 1) / unit * unit : (grouped ? 32 : 16);
    j.nchunks = (N + j.chunk - 1) / j.chunk;
    j.nranges = nt < MAXT ? nt : MAXT;
    for (int t = 0; t < j.nranges; t++)
        j.ranges[t].next = j.nchunks * t / j.nranges, j.ranges[t].end = j.nchunks * (t + 1) / j.nranges;
    if (M < 4 * nt) {
        quant_rows(qt, elems, x, ldx, j.nb, xq, j.xrow_bytes, 0, M);
#if QM_ISA
        if (xt) tile_range(xq, j.xrow_bytes, j.nb, 0, M, M, xt);
#endif
    }
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        if (M >= 4 * nt) {
#pragma omp for schedule(dynamic, 1)
            for (int64_t m = 0; m < M; m += 4) quant_rows(qt, elems, x, ldx, j.nb, xq, j.xrow_bytes, m, m + 4 < M ? m + 4 : M);
#if QM_ISA
            if (xt) {
#pragma omp for schedule(dynamic, 1)
                for (int64_t m = 0; m < M; m += RT) tile_range(xq, j.xrow_bytes, j.nb, m, m + RT < M ? m + RT : M, M, xt);
            }
#endif
        }
        worker(&j, omp_get_thread_num() % j.nranges);
    }
    free(xt);
    free(xq);
    return j.failed ? -3 : 0;
}

/* returns 0, -1 (unsupported type), -2 (K not a whole number of blocks / bad sizes), -3 (no memory) */
int qm_matmul(int qt, const float *x, int64_t M, int64_t K, int64_t ldx, const uint8_t *w, int64_t N,
              int64_t ldw, float *y, int64_t ldy, int nthreads) {
    qm_desc d;
    const int rc = qm_desc_init(&d, qt, w, N, K, ldw);
    return rc ? rc : qm_matmul_desc(&d, x, M, ldx, y, ldy, nthreads);
}
