/* Read and copy bandwidth of this machine's memory: the ceiling a batch-1 decode step (which streams every
 * weight byte once) can reach. Driven by bench/memory_bandwidth.py, built by hitenter/kernels/build.py.
 *
 * bw_read: each of `threads` OpenMP threads reads its contiguous share of buf[0, n) with 64-byte vector
 * loads (four independent accumulators, so the loads are not serialised on one register), optionally
 * issuing a software prefetch `prefetch` bytes ahead of each cache line; repeated `reps` times, the
 * fastest pass's seconds returned. bw_copy_rw: the same split, reading src and writing dst (what an
 * in-place state update costs per byte). n is a multiple of 256 * threads.
 */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stddef.h>

#if defined(__AVX512F__)
typedef __m512i vec;
#define VLOAD(p) _mm512_load_si512((const void *)(p))
#define VSTORE(p, v) _mm512_store_si512((void *)(p), v)
#define VXOR(a, b) _mm512_xor_si512(a, b)
#define VZERO() _mm512_setzero_si512()
#define VW 64
static int64_t vsum(vec v) { return _mm512_reduce_add_epi64(v); }
#else
typedef __m256i vec;
#define VLOAD(p) _mm256_load_si256((const __m256i *)(p))
#define VSTORE(p, v) _mm256_store_si256((__m256i *)(p), v)
#define VXOR(a, b) _mm256_xor_si256(a, b)
#define VZERO() _mm256_setzero_si256()
#define VW 32
static int64_t vsum(vec v) {
    int64_t t[4];
    _mm256_storeu_si256((__m256i *)t, v);
    return t[0] + t[1] + t[2] + t[3];
}
#endif

int bw_vector_bytes(void) { return VW; }

/* prefetch > 0: a T0 prefetch that far ahead of each line; < 0: a non-temporal (NTA) prefetch -prefetch
   ahead (the line is not kept in L2 / L3 when evicted from L1, so it does not push other data out) */
static int64_t read_span(const uint8_t *p, const uint8_t *end, int64_t prefetch) {
    vec a = VZERO(), b = VZERO(), c = VZERO(), d = VZERO();
    for (; p < end; p += 4 * VW) {
        if (prefetch > 0) {
            for (int k = 0; k < 4 * VW; k += 64)
                _mm_prefetch((const char *)p + prefetch + k, _MM_HINT_T0);
        } else if (prefetch < 0) {
            for (int k = 0; k < 4 * VW; k += 64)
                _mm_prefetch((const char *)p - prefetch + k, _MM_HINT_NTA);
        }
        a = VXOR(a, VLOAD(p));
        b = VXOR(b, VLOAD(p + VW));
        c = VXOR(c, VLOAD(p + 2 * VW));
        d = VXOR(d, VLOAD(p + 3 * VW));
    }
    return vsum(VXOR(VXOR(a, b), VXOR(c, d)));
}

double bw_read(const uint8_t *buf, int64_t n, int threads, int64_t prefetch, int reps, int64_t *sink) {
    double best = 1e30;
    int64_t s = 0;
    for (int r = 0; r < reps; r++) {
        double t0 = omp_get_wtime();
#pragma omp parallel num_threads(threads) reduction(^ : s)
        {
            int t = omp_get_thread_num(), nt = omp_get_num_threads();
            int64_t share = n / nt;
            s ^= read_span(buf + t * share, buf + (t + 1) * share, prefetch);
        }
        double dt = omp_get_wtime() - t0;
        if (dt < best) best = dt;
    }
    *sink = s;
    return best;
}

/* One pass = buf[0, keep) read plainly, then buf[keep, n) read with NTA prefetches `nta` bytes ahead, each
   range split between the threads: whether a part of a stream larger than the last-level cache can be
   kept there across passes by streaming the rest around it. Fastest of `reps` passes (after one unmeasured
   pass that fills the cache). keep and n - keep are multiples of 256 * threads. */
double bw_read_keep(const uint8_t *buf, int64_t n, int64_t keep, int64_t nta, int threads, int reps, int64_t *sink) {
    double best = 1e30;
    int64_t s = 0;
    for (int r = 0; r <= reps; r++) {
        double t0 = omp_get_wtime();
#pragma omp parallel num_threads(threads) reduction(^ : s)
        {
            int t = omp_get_thread_num(), nt = omp_get_num_threads();
            int64_t share = keep / nt, rest = (n - keep) / nt;
            s ^= read_span(buf + t * share, buf + (t + 1) * share, 0);
            s ^= read_span(buf + keep + t * rest, buf + keep + (t + 1) * rest, -nta);
        }
        double dt = omp_get_wtime() - t0;
        if (r && dt < best) best = dt;
    }
    *sink = s;
    return best;
}

double bw_copy_rw(const uint8_t *src, uint8_t *dst, int64_t n, int threads, int reps) {
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = omp_get_wtime();
#pragma omp parallel num_threads(threads)
        {
            int t = omp_get_thread_num(), nt = omp_get_num_threads();
            int64_t share = n / nt;
            const uint8_t *p = src + t * share;
            uint8_t *q = dst + t * share;
            vec one = VZERO();
            for (int64_t i = 0; i < share; i += VW) VSTORE(q + i, VXOR(VLOAD(p + i), one));
        }
        double dt = omp_get_wtime() - t0;
        if (dt < best) best = dt;
    }
    return best;
}
