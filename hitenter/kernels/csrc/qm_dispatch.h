/* Which kernel serves which block type (qmatmul.c includes this once, after the ISA headers): the row
 * path's functions (one instance per type and R in 8/4/2/1), the packed GEMM's (pack + kernel) and the
 * block geometry of each type. */
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
/* the longest run of activation rows qt's row function takes when it has an instance for every R (DEF_ROW_ANY),
 * 0 for the others (runs of 8, 4, 2, 1) */
#ifndef QM_RUN_Q6K
#define QM_RUN_Q6K 8
#endif
static inline int row_max_run(int qt) {
    return qt == QT_Q4_K || qt == QT_Q5_K ? 8 : qt == QT_Q6_K ? QM_RUN_Q6K : 0;
}
#else
#define DEF_ROW_ANY DEF_ROW
static inline int row_max_run(int qt) { (void)qt; return 0; }   /* the generic build keeps its 8/4/2/1 runs */
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

#if QM_ISA
/* whether qt's packed kernel has an instance for every R in 1..8 (DEF_PACKED_ANY) */
static inline int packed_any_r(int qt) { return qt == QT_Q4_K || qt == QT_Q5_K || qt == QT_Q6_K; }

static int packed_fns(int qt, pack_fn *pack, pkern_fn *kern, size_t *pbytes) {
    *pbytes = sizeof(pblock32);
    switch (qt) {
    case QT_Q4_0: *pack = pk_q4_0_pack; *kern = pk_q4_0_kern; return 1;
    case QT_Q4_1: *pack = pk_q4_1_pack; *kern = pk_q4_1_kern; return 1;
    case QT_Q5_0: *pack = pk_q5_0_pack; *kern = pk_q5_0_kern; return 1;
    case QT_Q5_1: *pack = pk_q5_1_pack; *kern = pk_q5_1_kern; return 1;
    /* Q8_0 + 128 needs dpbusd's exact u8 x s8 sums: AVX2's maddubs would saturate (the row path then) */
    case QT_Q8_0: *pack = pk_q8_0_pack; *kern = pk_q8_0_kern; return QM_VNNI;
    case QT_IQ4_NL: *pack = pk_iq4_nl_pack; *kern = pk_iq4_nl_kern; return 1;   /* AVX2: |w| . sign(x, w) */
    case QT_MXFP4: *pack = pk_mxfp4_pack; *kern = pk_mxfp4_kern; return 1;           /* codes + 12 <= 24 */
    }
    *pbytes = sizeof(pblock);
    switch (qt) {
    case QT_Q4_K: *pack = pk_q4_k_pack; *kern = pk_q4_k_kern; return 1;
    case QT_Q5_K: *pack = pk_q5_k_pack; *kern = pk_q5_k_kern; return 1;
    case QT_Q6_K: *pack = pk_q6_k_pack; *kern = pk_q6_k_kern; return 1;
    case QT_Q2_K: *pack = pk_q2_k_pack; *kern = pk_q2_k_kern; return 1;
    case QT_Q3_K: *pack = pk_q3_k_pack; *kern = pk_q3_k_kern; return 1;
    case QT_IQ4_XS: *pack = pk_iq4_xs_pack; *kern = pk_iq4_xs_kern; return 1;   /* AVX2: |w| . sign(x, w) */
    }
    return 0;
}
#endif


static int type_info(int qt, int *elems, int *bytes, row_fn *fn) {
    *elems = 32;
    switch (qt) {
    case QT_Q4_0: *bytes = B_Q4_0; *fn = row_q4_0; return 0;
    case QT_Q4_1: *bytes = B_Q4_1; *fn = row_q4_1; return 0;
    case QT_Q5_0: *bytes = B_Q5_0; *fn = row_q5_0; return 0;
    case QT_Q5_1: *bytes = B_Q5_1; *fn = row_q5_1; return 0;
    case QT_Q8_0: *bytes = B_Q8_0; *fn = row_q8_0; return 0;
    case QT_IQ4_NL: *bytes = B_IQ4_NL; *fn = row_iq4_nl; return 0;
    case QT_MXFP4: *bytes = B_MXFP4; *fn = row_mxfp4; return 0;
    }
    *elems = 256;
    switch (qt) {
    case QT_Q4_K: *bytes = B_Q4_K; *fn = row_q4_k; return 0;
    case QT_Q5_K: *bytes = B_Q5_K; *fn = row_q5_k; return 0;
    case QT_Q6_K: *bytes = B_Q6_K; *fn = row_q6_k; return 0;
    case QT_Q2_K: *bytes = B_Q2_K; *fn = row_q2_k; return 0;
    case QT_Q3_K: *bytes = B_Q3_K; *fn = row_q3_k; return 0;
    case QT_IQ4_XS: *bytes = B_IQ4_XS; *fn = row_iq4_xs; return 0;
    }
    return -1;
}

#endif
