/* Which kernel serves which block type (qmatmul.c includes this once, after the ISA headers): the row
 * path's functions (one instance per type and R in 8/4/2/1), then one traits table that the dispatch reads:
 * each type's block geometry, row function and packed GEMM (pack + kernel). */
#ifndef QM_DISPATCH_H
#define QM_DISPATCH_H

/* x: the first of R activation rows, xrow bytes apart */
typedef void (*row_fn)(const uint8_t *w, int64_t nb, const void *x, int64_t xrow, int R, float *y, int64_t ldy);

#if QM_ISA
/* one instance per (type, R in 8/4/2/1): R must be a constant for the accumulators to live in registers */
#define DEF_ROW(name, kern, xt, qt, bb)                                                                   \
    static void name(const uint8_t *w, int64_t nb, const void *xv, int64_t xrow, int R, float *y,          \
                     int64_t ldy) {                                                                        \
        const xt *x = (const xt *)xv;                                                                      \
        xrow /= (int64_t)sizeof(xt);                                                                       \
        if (R == 8) kern(qt, bb, w, nb, x, xrow, 8, y, ldy);                                               \
        else if (R == 4) kern(qt, bb, w, nb, x, xrow, 4, y, ldy);                                          \
        else if (R == 2) kern(qt, bb, w, nb, x, xrow, 2, y, ldy);                                          \
        else kern(qt, bb, w, nb, x, xrow, 1, y, ldy);                                                      \
    }
/* the K types most files use: an instance for every R in 1..8, so a run of 3, 5, 6 or 7 rows (a speculative
 * verification: the drafts + 1) unpacks each weight block once instead of once per 4/2/1 run */
#define DEF_ROW_ANY(name, kern, xt, qt, bb)                                                               \
    static void name(const uint8_t *w, int64_t nb, const void *xv, int64_t xrow, int R, float *y,          \
                     int64_t ldy) {                                                                        \
        const xt *x = (const xt *)xv;                                                                      \
        xrow /= (int64_t)sizeof(xt);                                                                       \
        switch (R) {                                                                                       \
        case 8: kern(qt, bb, w, nb, x, xrow, 8, y, ldy); break;                                            \
        case 7: kern(qt, bb, w, nb, x, xrow, 7, y, ldy); break;                                            \
        case 6: kern(qt, bb, w, nb, x, xrow, 6, y, ldy); break;                                            \
        case 5: kern(qt, bb, w, nb, x, xrow, 5, y, ldy); break;                                            \
        case 4: kern(qt, bb, w, nb, x, xrow, 4, y, ldy); break;                                            \
        case 3: kern(qt, bb, w, nb, x, xrow, 3, y, ldy); break;                                            \
        case 2: kern(qt, bb, w, nb, x, xrow, 2, y, ldy); break;                                            \
        default: kern(qt, bb, w, nb, x, xrow, 1, y, ldy);                                                  \
        }                                                                                                  \
    }
#else
#define DEF_ROW_ANY DEF_ROW   /* the generic build keeps its 8/4/2/1 runs (max_run 0 in its traits) */
#define DEF_ROW(name, kern, xt, qt, bb)                                                                   \
    static void name(const uint8_t *w, int64_t nb, const void *xv, int64_t xrow, int R, float *y,          \
                     int64_t ldy) {                                                                        \
        kern(qt, bb, w, nb, (const xt *)xv, xrow / (int64_t)sizeof(xt), R, y, ldy);                        \
    }
#define s_row32 g_row32
#define s_row256 g_row256
#endif

#if QM_ISA
#define XT32 char    /* legacy activations: the xl row layout of qm_simd.h, addressed in bytes */
#else
#define XT32 xq32
#endif

DEF_ROW(row_q4_0, s_row32, XT32, QT_Q4_0, B_Q4_0)
DEF_ROW(row_q4_1, s_row32, XT32, QT_Q4_1, B_Q4_1)
DEF_ROW(row_q5_0, s_row32, XT32, QT_Q5_0, B_Q5_0)
DEF_ROW(row_q5_1, s_row32, XT32, QT_Q5_1, B_Q5_1)
DEF_ROW(row_q8_0, s_row32, XT32, QT_Q8_0, B_Q8_0)
DEF_ROW_ANY(row_q4_k, s_row256, xq256, QT_Q4_K, B_Q4_K)
DEF_ROW_ANY(row_q5_k, s_row256, xq256, QT_Q5_K, B_Q5_K)
DEF_ROW_ANY(row_q6_k, s_row256, xq256, QT_Q6_K, B_Q6_K)
DEF_ROW(row_q2_k, s_row256, xq256, QT_Q2_K, B_Q2_K)
DEF_ROW(row_q3_k, s_row256, xq256, QT_Q3_K, B_Q3_K)
DEF_ROW(row_iq4_xs, s_row256, xq256, QT_IQ4_XS, B_IQ4_XS)
DEF_ROW(row_iq4_nl, s_row32, XT32, QT_IQ4_NL, B_IQ4_NL)
DEF_ROW(row_mxfp4, s_row32, XT32, QT_MXFP4, B_MXFP4)

/* One row per block type (ggml's type-traits idea): its block geometry, its row-path function, the longest run
 * of activation rows that function takes at any length (0: runs of 8/4/2/1), and, in the ISA builds, its packed
 * GEMM (pack + kernel, the packed block's size, whether that kernel has an instance for every R in 1..8, and
 * whether this build may use it). Indexed by the ggml type id; a zero row (elems 0) is a type with no kernel. */
typedef struct {
    int elems, bytes;
    row_fn row;
    int max_run;
#if QM_ISA
    pack_fn pack;
    pkern_fn kern;
    size_t pbytes;
    int any_r, packed;
#endif
} qm_traits;

#if QM_ISA
#define QM_T32(qt, B, row, pk, ok) [qt] = {32, B, row, 0, pk##_pack, pk##_kern, sizeof(pblock32), 0, ok}
#define QM_T256(qt, B, row, run, pk, any) [qt] = {256, B, row, run, pk##_pack, pk##_kern, sizeof(pblock), any, 1}
#else
#define QM_T32(qt, B, row, pk, ok) [qt] = {32, B, row, 0}
#define QM_T256(qt, B, row, run, pk, any) [qt] = {256, B, row, 0}
#endif
#ifndef QM_RUN_Q6K
#define QM_RUN_Q6K 8
#endif

static const qm_traits QM_TRAITS[QT_MXFP4 + 1] = {
    QM_T32(QT_Q4_0, B_Q4_0, row_q4_0, pk_q4_0, 1),
    QM_T32(QT_Q4_1, B_Q4_1, row_q4_1, pk_q4_1, 1),
    QM_T32(QT_Q5_0, B_Q5_0, row_q5_0, pk_q5_0, 1),
    QM_T32(QT_Q5_1, B_Q5_1, row_q5_1, pk_q5_1, 1),
    /* Q8_0 + 128 needs dpbusd's exact u8 x s8 sums: AVX2's maddubs would saturate (the row path then) */
    QM_T32(QT_Q8_0, B_Q8_0, row_q8_0, pk_q8_0, QM_VNNI),
    QM_T32(QT_IQ4_NL, B_IQ4_NL, row_iq4_nl, pk_iq4_nl, 1),   /* AVX2: |w| . sign(x, w) */
    QM_T32(QT_MXFP4, B_MXFP4, row_mxfp4, pk_mxfp4, 1),       /* codes + 12 <= 24 */
    QM_T256(QT_Q4_K, B_Q4_K, row_q4_k, 8, pk_q4_k, 1),
    QM_T256(QT_Q5_K, B_Q5_K, row_q5_k, 8, pk_q5_k, 1),
    QM_T256(QT_Q6_K, B_Q6_K, row_q6_k, QM_RUN_Q6K, pk_q6_k, 1),
    QM_T256(QT_Q2_K, B_Q2_K, row_q2_k, 0, pk_q2_k, 0),
    QM_T256(QT_Q3_K, B_Q3_K, row_q3_k, 0, pk_q3_k, 0),
    QM_T256(QT_IQ4_XS, B_IQ4_XS, row_iq4_xs, 0, pk_iq4_xs, 0),   /* AVX2: |w| . sign(x, w) */
};

static inline const qm_traits *qm_traits_of(int qt) {
    return qt >= 0 && qt <= QT_MXFP4 && QM_TRAITS[qt].elems ? &QM_TRAITS[qt] : 0;
}

/* the longest run of activation rows qt's row function takes at any length, 0 for runs of 8, 4, 2, 1 */
static inline int row_max_run(int qt) { const qm_traits *t = qm_traits_of(qt); return t ? t->max_run : 0; }

#if QM_ISA
/* whether qt's packed kernel has an instance for every R in 1..8 (DEF_PACKED_ANY) */
static inline int packed_any_r(int qt) { const qm_traits *t = qm_traits_of(qt); return t && t->any_r; }

static int packed_fns(int qt, pack_fn *pack, pkern_fn *kern, size_t *pbytes) {
    const qm_traits *t = qm_traits_of(qt);
    if (!t) return 0;
    *pack = t->pack, *kern = t->kern, *pbytes = t->pbytes;
    return t->packed;
}
#endif

static int type_info(int qt, int *elems, int *bytes, row_fn *fn) {
    const qm_traits *t = qm_traits_of(qt);
    if (!t) return -1;
    *elems = t->elems, *bytes = t->bytes, *fn = t->row;
    return 0;
}

#endif
