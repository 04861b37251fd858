/* Weights repacked once at load (llama.cpp's "repack" idea) for Q4_0, Q4_1 and Q8_0: the packed GEMM's
 * lane layout (qm_pack.h: PN weight rows side by side, int32 lane n = output n), stored instead of the
 * file's rows, so no call unpacks weights (per-call packing would be a sizeable share of a batched decode
 * step) and every M, the GEMV included, runs one kernel on one layout.
 *
 * Same bytes as the file: Q4_0/Q4_1 keep their nibbles (q[j] byte n * 4 + c holds elements 4j + c
 * (low nibble) and 16 + 4j + c (high) of lane n's block, the file's own pairing), d and m stay fp16:
 * 20 bytes per row and block (Q4_1: exactly the file's size; Q4_0: +2). Q8_0: q[e4] holds elements
 * 4 e4 .. 4 e4 + 3 of each lane + 128 (unsigned for dpbusd; the AVX2 kernel takes the 128 off again and
 * dots |w| . sign(x, w)), d fp16: 34 bytes, the file's size. Rows
 * past N (the last group) are zero. Within a group the blocks are stored in the order the kernel reads
 * them, blocks b % 4 == 0 first, then 1, 2, 3 (the four partial sums of the canonical float sequence),
 * so a group is one sequential stream (in file order the 4-block stride defeats the prefetcher, and
 * the GEMV falls behind the row path).
 *
 * Bits: the exact integer sums and the float steps of p_kern32 / s_grp32 (the canonical sequence of
 * qm_simd.h), with d and m converted from the same fp16, so a repacked weight gives the same bits as
 * the file's rows through any path, whatever M. */
#ifndef QM_REPACK_H
#define QM_REPACK_H

#include "qm_pack.h"

typedef struct {
    uint8_t q[4][4 * PN];
    uint16_t d[PN], m[PN];
} rblock4;

typedef struct {
    uint8_t q[8][4 * PN];
    uint16_t d[PN];
} rblock8;

#if QM_VNNI
#define pv_loadu(p) _mm512_loadu_si512((const void *)(p))
#define pv_nib_lo(v) _mm512_and_si512(v, _mm512_set1_epi8(15))
#define pv_nib_hi(v) _mm512_and_si512(_mm512_srli_epi16(v, 4), _mm512_set1_epi8(15))
#define pf_loadh(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p)))
#else
#define pv_loadu(p) _mm256_loadu_si256((const __m256i *)(p))
#define pv_nib_lo(v) _mm256_and_si256(v, _mm256_set1_epi8(15))
#define pv_nib_hi(v) _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(15))
#define pf_loadh(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
#endif

/* bytes of one repacked block (PN rows x 32 elements), 0 for a type not repacked in this build */
static size_t repack_block_bytes(int qt) {
    if (qt == QT_Q4_0 || qt == QT_Q4_1) return sizeof(rblock4);
    if (qt == QT_Q8_0) return sizeof(rblock8);   /* AVX2: the + 128 taken off again in the kernel (signed w) */
    return 0;
}

/* where block b of a group is stored: the kernel's reading order (b % 4, then b / 4) */
static inline int64_t repack_pos(int64_t b, int64_t nb) {
    const int64_t ph = b % 4;
    return ph * (nb / 4) + (ph < nb % 4 ? ph : nb % 4) + b / 4;
}

/* group g (rows g * PN ...) of the file rows w (ldw bytes apart, nb blocks of bb bytes) -> out */
static void repack_group(int qt, int bb, const uint8_t *w, int64_t ldw, int64_t N, int64_t g, int64_t nb, uint8_t *out) {
    const size_t rb = repack_block_bytes(qt);
    memset(out, 0, rb * (size_t)nb);
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *o = out + rb * (size_t)repack_pos(b, nb);
        for (int n = 0; n < PN && g * PN + n < N; n++) {
            const uint8_t *src = w + (g * PN + n) * ldw + b * bb;
            if (qt == QT_Q8_0) {
                rblock8 *r = (rblock8 *)o;
                memcpy(&r->d[n], src, 2);
                for (int e = 0; e < 32; e++) r->q[e / 4][4 * n + e % 4] = (uint8_t)(src[2 + e] ^ 0x80);
            } else {
                rblock4 *r = (rblock4 *)o;
                memcpy(&r->d[n], src, 2);
                if (qt == QT_Q4_1) memcpy(&r->m[n], src + 2, 2);
                const uint8_t *qs = src + (qt == QT_Q4_1 ? 4 : 2);
                for (int e = 0; e < 16; e++) r->q[e / 4][4 * n + e % 4] = qs[e];
            }
        }
    }
}

/* bytes of a repacked [N, K] weight (0: not repacked in this build), and the repacking of all its groups */
static int64_t repacked_bytes(int qt, int64_t N, int64_t K) {
    const size_t rb = repack_block_bytes(qt);
    if (!rb || K <= 0 || K % 32 || N <= 0) return 0;
    return (N + PN - 1) / PN * (K / 32) * (int64_t)rb;
}

static void repack_all(int qt, int bb, const uint8_t *w, int64_t ldw, int64_t N, int64_t K, uint8_t *out, int nthreads) {
    const int64_t nb = K / 32, groups = (N + PN - 1) / PN;
#pragma omp parallel for schedule(static) num_threads(nthreads) if (nthreads > 1)
    for (int64_t g = 0; g < groups; g++)
        repack_group(qt, bb, w, ldw, N, g, nb, out + (size_t)g * (size_t)nb * repack_block_bytes(qt));
}

/* A tile of R activation rows as the repacked kernel reads them (tile_rows builds it from the xl rows once
 * per call): per block, its 8 quant dwords of each row side by side ([e4][r]), then d[r], s[r], c[r]: one
 * pointer per block and constant offsets (with a pointer per row and array, 24 of them at R = 8, GCC
 * reloaded addresses from the stack in every block's float steps) */
#define XT_BLOCK(R) (44 * (R))
static void tile_rows(const char *xq, size_t xrow_bytes, int64_t nb, int64_t m0, int R, char *out) {
    for (int64_t b = 0; b < nb; b++) {
        char *ob = out + b * XT_BLOCK(R);
        if (R == 8) {   /* the quants: one 8 x 8 dword transpose */
            __m256i v[8];
            for (int r = 0; r < 8; r++) v[r] = _mm256_loadu_si256((const __m256i *)(xq + (m0 + r) * xrow_bytes + 32 * b));
            tr8x8_store(v, (uint8_t *)ob, 32);
        }
        for (int r = 0; r < R; r++) {
            const char *xr = xq + (m0 + r) * xrow_bytes;
            for (int e4 = 0; e4 < 8 && R != 8; e4++) memcpy(ob + (e4 * R + r) * 4, xr + 32 * b + 4 * e4, 4);
            memcpy(ob + 32 * R + 4 * r, XL_D(xr, nb) + b, 4);
            memcpy(ob + 36 * R + 4 * r, XL_S(xr, nb) + b, 4);
            memcpy(ob + 40 * R + 4 * r, XL_C(xr, nb) + b, 4);
        }
    }
}
#define XT_Q(xb, e4, r) ((xb) + ((e4) * R + (r)) * 4)
#define XT_D(xb, r) (((const float *)((xb) + 32 * R))[r])
#define XT_S(xb, r) (((const float *)((xb) + 36 * R))[r])
#define XT_C(xb, r) (((const int32_t *)((xb) + 40 * R))[r])

/* y[r, 0..nvalid) for R activation rows (a tile, tile_rows) against one repacked group of nb blocks */
QM_INLINE void r_kern(const int qt, const uint8_t *p, int64_t nb, const char *x, const int R,
                      float *y, int64_t ldy, int nvalid) {
    const size_t rb = qt == QT_Q8_0 ? sizeof(rblock8) : sizeof(rblock4);
    pvf part[4][PR];
    const uint8_t *pb = p;   /* blocks in reading order (repack_pos) */
    for (int ph = 0; ph < 4; ph++) {
        pvf acc[PR];
        for (int r = 0; r < R; r++) acc[r] = pf_zero();
        for (int64_t b = ph; b < nb; b += 4, pb += rb) {
            const char *xb = x + b * XT_BLOCK(R);
            pvi t[PR];
            for (int r = 0; r < R; r++)
                t[r] = qt == QT_Q4_1 || (qt == QT_Q8_0 && !QM_VNNI) ? pv_zero() : pv_set1(XT_C(xb, r));
#if !QM_VNNI
            if (qt == QT_Q8_0) {
                /* AVX2: the stored w + 128 back to signed w, then |w| . sign(x, w) (maddubs pairs <= 2 * 128 * 127:
                 * exact), each dword's pairs to int32 at once (two would overflow int16) */
#pragma GCC unroll 8
                for (int e4 = 0; e4 < 8; e4++) {
                    const __m256i wv = _mm256_xor_si256(pv_loadu(((const rblock8 *)pb)->q[e4]), _mm256_set1_epi8((char)0x80));
                    const __m256i wa = _mm256_abs_epi8(wv);
                    for (int r = 0; r < R; r++)
                        t[r] = _mm256_add_epi32(t[r], _mm256_madd_epi16(a2_dot_sgn(wa, wv, XT_Q(xb, e4, r)),
                                                                       _mm256_set1_epi16(1)));
                }
            } else
#endif
            if (qt == QT_Q8_0) {
#pragma GCC unroll 8
                for (int e4 = 0; e4 < 8; e4++) {
                    const pvi wv = pv_loadu(((const rblock8 *)pb)->q[e4]);
                    for (int r = 0; r < R; r++) {
                        int32_t xv;
                        memcpy(&xv, XT_Q(xb, e4, r), 4);
                        t[r] = pv_dpbusd(t[r], wv, pv_set1(xv));
                    }
                }
            } else {
#if QM_VNNI
#pragma GCC unroll 4
                for (int j = 0; j < 4; j++) {
                    const pvi v = pv_loadu(((const rblock4 *)pb)->q[j]), lo = pv_nib_lo(v), hi = pv_nib_hi(v);
                    for (int r = 0; r < R; r++) {
                        int32_t xl, xh;
                        memcpy(&xl, XT_Q(xb, j, r), 4);
                        memcpy(&xh, XT_Q(xb, 4 + j, r), 4);
                        t[r] = pv_dpbusd(t[r], lo, pv_set1(xl));
                        t[r] = pv_dpbusd(t[r], hi, pv_set1(xh));
                    }
                }
#else           /* AVX2: the block's 16 products per int16 lane summed in int16 (<= 16 * 15 * 127), then one
                 * madd by ones (qm_pack_avx2.h) */
                __m256i t16[PR];
                for (int r = 0; r < R; r++) t16[r] = _mm256_setzero_si256();
#pragma GCC unroll 4
                for (int j = 0; j < 4; j++) {
                    const pvi v = pv_loadu(((const rblock4 *)pb)->q[j]), lo = pv_nib_lo(v), hi = pv_nib_hi(v);
                    for (int r = 0; r < R; r++) {
                        t16[r] = a2_step(t16[r], lo, XT_Q(xb, j, r));
                        t16[r] = a2_step(t16[r], hi, XT_Q(xb, 4 + j, r));
                    }
                }
                for (int r = 0; r < R; r++) t[r] = _mm256_add_epi32(t[r], _mm256_madd_epi16(t16[r], _mm256_set1_epi16(1)));
#endif
            }
            const pvf dv = pf_loadh(qt == QT_Q8_0 ? ((const rblock8 *)pb)->d : ((const rblock4 *)pb)->d);
            for (int r = 0; r < R; r++) {
                acc[r] = pf_fmadd(pf_cvt(t[r]), pf_mul(dv, pf_set1(XT_D(xb, r))), acc[r]);
                if (qt == QT_Q4_1) acc[r] = pf_fmadd(pf_loadh(((const rblock4 *)pb)->m), pf_set1(XT_S(xb, r)), acc[r]);
            }
        }
        for (int r = 0; r < R; r++) part[ph][r] = acc[r];
    }
    for (int r = 0; r < R; r++) {   /* whole groups stored directly (a memcpy of nvalid floats was a libc call) */
        const pvf v = pf_add(pf_add(part[0][r], part[1][r]), pf_add(part[2][r], part[3][r]));
        if (nvalid == PN) {
            pf_storeu(y + r * ldy, v);
            continue;
        }
        float tmp[PN];
        pf_storeu(tmp, v);
        memcpy(y + r * ldy, tmp, (size_t)nvalid * sizeof(float));
    }
}

/* activation rows per repacked kernel call (at most PR) */
#ifndef RT
#define RT 8
#endif

typedef void (*rkern_fn)(const uint8_t *p, int64_t nb, const char *xt, int R, float *y, int64_t ldy, int nvalid);

#define DEF_REPACKED(name, qt)                                                                            \
    static void name(const uint8_t *p, int64_t nb, const char *xt, int R, float *y, int64_t ldy, int nvalid) { \
        if (R == 8) r_kern(qt, p, nb, xt, 8, y, ldy, nvalid);                                             \
        else if (R == 4) r_kern(qt, p, nb, xt, 4, y, ldy, nvalid);                                        \
        else if (R == 2) r_kern(qt, p, nb, xt, 2, y, ldy, nvalid);                                        \
        else r_kern(qt, p, nb, xt, 1, y, ldy, nvalid);                                                    \
    }

/* the rows of a run starting at row m: runs of RT / 4 / 2 / 1 rows, as run_repacked walks them (RMT is a
 * multiple of RT) */
static inline int tile_run(int64_t m, int64_t M) {
    return M - m >= RT ? RT : M - m >= 4 ? 4 : M - m >= 2 ? 2 : 1;
}

DEF_REPACKED(rk_q4_0, QT_Q4_0)
DEF_REPACKED(rk_q4_1, QT_Q4_1)
DEF_REPACKED(rk_q8_0, QT_Q8_0)

static rkern_fn repacked_fn(int qt) {
    return qt == QT_Q4_0 ? rk_q4_0 : qt == QT_Q4_1 ? rk_q4_1 : qt == QT_Q8_0 ? rk_q8_0 : NULL;
}

/* the tiles of rows [m0, m1) of x's M quantized rows into xt (m0 and m1 at run starts: multiples of RT, or M) */
static void tile_range(const char *xq, size_t xrow_bytes, int64_t nb, int64_t m0, int64_t m1, int64_t M, char *xt) {
    for (int64_t m = m0; m < m1;) {
        const int R = tile_run(m, M);
        tile_rows(xq, xrow_bytes, nb, m, R, xt + m * nb * XT_BLOCK(1));
        m += R;
    }
}

/* rows [n0, n1) of y (n0 a multiple of PN) for all M rows: tiles of RMT activation rows (they stay in L2;
 * without tiles, at M = 512 the whole x would stream from L3 once per group of PN rows), each group of PN
 * rows once per tile, then from L1 for every run of RT / 4 / 2 / 1 rows.
 * Calls of more than RMT rows (prefill) take tiles of RT rows instead: one kernel call per group and tile,
 * the tile's x in L1 and the thread's chunk of groups from L2 (faster for prefill: docs/benchmarks.md).
 * Calls of up to RMT rows (decode batches) keep one tile: their weights are read once. */
#ifndef RMT
#define RMT 64
#endif
static void run_repacked(rkern_fn kern, size_t rb, const uint8_t *w, int64_t nb, const char *xt,
                         int64_t M, int64_t n0, int64_t n1, float *y, int64_t ldy) {
    const int64_t tile = M > RMT ? RT : RMT;
    for (int64_t mt = 0; mt < M; mt += tile) {
        const int64_t mend = mt + tile < M ? mt + tile : M;
        for (int64_t s = n0; s < n1; s += PN) {
            const uint8_t *g = w + (size_t)(s / PN) * (size_t)nb * rb;
            const int nvalid = n1 - s < PN ? (int)(n1 - s) : PN;
            for (int64_t m = mt; m < mend;) {
                const int R = tile_run(m, mend);
                kern(g, nb, xt + m * nb * XT_BLOCK(1), R, y + m * ldy + s, ldy, nvalid);
                m += R;
            }
        }
    }
}

#endif
