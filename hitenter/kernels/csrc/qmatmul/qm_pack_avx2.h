/* The packed GEMM's microkernels for AVX2 without VNNI (qm_pack.h includes this; the AVX512-VNNI build
 * keeps p_kern / p_kern32 there). Same packed layouts, same exact integer sums per block, same float
 * steps, so the same bits as the row path and the VNNI kernels; only the way the integers are summed
 * differs (llama.cpp's AVX2 Q4_K x Q8_K idea):
 *
 * AVX2 has no dpbusd, so a 4-byte dot was maddubs (u8 x s8 -> int16 pairs) + madd with ones (-> int32)
 * + add: two multiplies per 32 products. Here the int16 pairs of SEG consecutive dwords are added in
 * int16 (exact while SEG * 2 * wmax * 127 <= 32767), then one madd by the group's scale, duplicated
 * into both int16 halves of each lane (pblock.sc on AVX2), turns them into the scaled int32 sum: per 4
 * activation bytes one maddubs and one 16-bit add, and no mullo per scale group.
 *   SEG: Q4_K 8 (w <= 15), Q5_K 4 (<= 31), Q3_K 4 (<= 7), Q2_K 4 (<= 3); Q6_K 4 on q - 32, signed (the sign
 *   moved onto x: |w| <= 32); IQ4_XS 1 (|w| <= 127 with the sign on x: a pair may reach 32258, so each
 *   dword gets its own madd).
 * Offsets: Q3_K's 4 comes off I through the per-16 mins (offset * scale, int16 pairs in pblock.mn, as
 * Q2_K's) times the activations' 16-element sums, as in the row path (I - Mn); Q6_K's 32 is in its
 * signed weights.
 * Legacy types (pblock32): one block is 8 dwords; SEG32 Q4_0/Q4_1 8, Q5_0/Q5_1/MXFP4 4, Q8_0/IQ4_NL 1. */
#ifndef QM_PACK_AVX2_H
#define QM_PACK_AVX2_H

/* dwords of int16 sums before a madd, per type */
#define A2_SEG(qt) ((qt) == QT_Q4_K ? 8 : (qt) == QT_Q5_K ? 4 : (qt) == QT_Q6_K ? 4 : (qt) == QT_IQ4_XS ? 1 : 4)
#define A2_SEG32(qt) ((qt) == QT_Q4_0 || (qt) == QT_Q4_1 ? 8 : QM_SIGNED32(qt) ? 1 : 4)
/* K types whose offset comes off I through per-16 mins (pblock.mn pairs) */
#define A2_OFFMINS(qt) ((qt) == QT_Q3_K)
/* K types packed as signed weights (|w| . sign(x, w)): IQ4_XS's codebook values, Q6_K's q - 32 */
#define A2_SIGNED(qt) ((qt) == QT_IQ4_XS || (qt) == QT_Q6_K)

QM_INLINE __m256i a2_bcast(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

/* t + maddubs(w, the dword at xp in every lane), int16 lanes. One asm statement per step, so each step is
 * broadcast -> maddubs -> add with one temporary: written as intrinsics, GCC hoisted every maddubs of a
 * tile ahead of the adds and spilled the products (a third of the instructions were stack moves). */
QM_INLINE __m256i a2_step(__m256i t, __m256i w, const void *xp) {
    __m256i tmp;
    __asm__("vpbroadcastd %[xp], %t[tmp]\n\t"
            "vpmaddubsw %t[tmp], %t[w], %t[tmp]\n\t"
            "vpaddw %t[tmp], %t[t], %t[t]"
            : [t] "+x"(t), [tmp] "=&x"(tmp)
            : [w] "x"(w), [xp] "m"(*(const int32_t *)xp));
    return t;
}

/* the same with signed weights w (wa = |w|): t + maddubs(wa, sign(x, w)) */
QM_INLINE __m256i a2_step_sgn(__m256i t, __m256i wa, __m256i w, const void *xp) {
    __m256i tmp;
    __asm__("vpbroadcastd %[xp], %t[tmp]\n\t"
            "vpsignb %t[w], %t[tmp], %t[tmp]\n\t"
            "vpmaddubsw %t[tmp], %t[wa], %t[tmp]\n\t"
            "vpaddw %t[tmp], %t[t], %t[t]"
            : [t] "+x"(t), [tmp] "=&x"(tmp)
            : [wa] "x"(wa), [w] "x"(w), [xp] "m"(*(const int32_t *)xp));
    return t;
}

/* maddubs(wa, sign(the dword at xp in every lane, w)) alone, int16 pairs (signed weights w, wa = |w|) */
QM_INLINE __m256i a2_dot_sgn(__m256i wa, __m256i w, const void *xp) {
    __m256i tmp;
    __asm__("vpbroadcastd %[xp], %t[tmp]\n\t"
            "vpsignb %t[w], %t[tmp], %t[tmp]\n\t"
            "vpmaddubsw %t[tmp], %t[wa], %t[tmp]"
            : [tmp] "=&x"(tmp)
            : [wa] "x"(wa), [w] "x"(w), [xp] "m"(*(const int32_t *)xp));
    return tmp;
}

/* y[r, 0..nvalid) for R activation rows against one packed group (K types) */
QM_INLINE void p_kern_a2(const int qt, const pblock *p, int64_t nb, const xq256 *x, int64_t xrow, const int R,
                         float *y, int64_t ldy, int nvalid) {
    const int GS = qt == QT_Q4_K || qt == QT_Q5_K || qt == QT_IQ4_XS ? 8 : 4;   /* dwords per scale group */
    const int SEG = A2_SEG(qt), sgn = A2_SIGNED(qt);
    __m256 acc[PR];
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const pblock *pb = p + b;
        __m256i I[PR];
        for (int r = 0; r < R; r++) I[r] = _mm256_setzero_si256();
#pragma GCC unroll 1
        for (int g = 0; g < 64 / GS; g++) {
            const __m256i s = _mm256_load_si256((const __m256i *)pb->sc[g]);
#pragma GCC unroll 8
            for (int h = 0; h < GS / SEG; h++) {
                __m256i t[PR];
                for (int r = 0; r < R; r++) t[r] = _mm256_setzero_si256();
#pragma GCC unroll 8
                for (int k = 0; k < SEG; k++) {
                    const int e4 = g * GS + h * SEG + k;
                    const __m256i wv = _mm256_load_si256((const __m256i *)pb->q[e4]);
                    const __m256i wa = sgn ? _mm256_abs_epi8(wv) : wv;
                    for (int r = 0; r < R; r++) {
                        t[r] = sgn ? a2_step_sgn(t[r], wa, wv, x[r * xrow + b].q + 4 * e4)
                                   : a2_step(t[r], wv, x[r * xrow + b].q + 4 * e4);
                    }
                }
                for (int r = 0; r < R; r++) I[r] = _mm256_add_epi32(I[r], _mm256_madd_epi16(t[r], s));
            }
        }
        __m256i Mn[PR];
        for (int r = 0; r < R; r++) Mn[r] = _mm256_setzero_si256();
        /* Q4_K/Q5_K: 4 pairs of per-32 sums; Q2_K, Q6_K, Q3_K: 8 pairs of per-16 sums */
        const int npairs = qt == QT_Q4_K || qt == QT_Q5_K ? 4 : QM_KMIN(qt) || A2_OFFMINS(qt) ? 8 : 0;
#pragma GCC unroll 8
        for (int i = 0; i < npairs; i++) {
            const __m256i mv = _mm256_load_si256((const __m256i *)pb->mn[i]);
            for (int r = 0; r < R; r++) {
                const xq256 *xb = x + r * xrow + b;
                const __m256i bs = a2_bcast((qt == QT_Q4_K || qt == QT_Q5_K ? xb->bsum32 : xb->bsum) + 2 * i);
                Mn[r] = _mm256_add_epi32(Mn[r], _mm256_madd_epi16(mv, bs));
            }
        }
        const __m256 dv = _mm256_load_ps(pb->d), dmv = _mm256_load_ps(pb->dmin);
        for (int r = 0; r < R; r++) {   /* k_step, lane-wise */
            const __m256 dx = _mm256_set1_ps(x[r * xrow + b].d);
            if (!QM_KMIN(qt)) {
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(I[r], Mn[r])), _mm256_mul_ps(dv, dx), acc[r]);
            } else {
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(I[r]), _mm256_mul_ps(dv, dx), acc[r]);
                acc[r] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(Mn[r]), _mm256_mul_ps(dmv, dx), acc[r]);
            }
        }
    }
    for (int r = 0; r < R; r++) {   /* whole groups stored directly (a memcpy of nvalid floats was a libc call) */
        const __m256 v = acc[r];
        if (nvalid == PN) {
            _mm256_storeu_ps(y + r * ldy, v);
            continue;
        }
        float tmp[PN];
        _mm256_storeu_ps(tmp, v);
        memcpy(y + r * ldy, tmp, (size_t)nvalid * sizeof(float));
    }
}

/* y[r, 0..nvalid) for R activation rows (xl layout, row stride xrow bytes) against one packed group of a
 * legacy type: p_kern32's canonical float steps, rows inner (each weight vector loaded once per tile) */
QM_INLINE void p_kern32_a2(const int qt, const pblock32 *p, int64_t nb, const char *x, int64_t xrow, const int R,
                           float *y, int64_t ldy, int nvalid) {
    const int SEG = A2_SEG32(qt), sgn = QM_SIGNED32(qt);
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 part[4][PR];
    for (int ph = 0; ph < 4; ph++) {
        __m256 acc[PR];
        for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
        for (int64_t b = ph; b < nb; b += 4) {
            const pblock32 *pb = p + b;
            __m256i t32[PR];
            for (int r = 0; r < R; r++)
                t32[r] = qt == QT_Q4_1 || qt == QT_Q5_1 || sgn ? _mm256_setzero_si256()
                                                             : _mm256_set1_epi32(XL_C(x + r * xrow, nb)[b]);
#pragma GCC unroll 8
            for (int h = 0; h < 8 / SEG; h++) {
                __m256i t[PR];
                for (int r = 0; r < R; r++) t[r] = _mm256_setzero_si256();
#pragma GCC unroll 8
                for (int k = 0; k < SEG; k++) {
                    const int e4 = h * SEG + k;
                    const __m256i wv = _mm256_load_si256((const __m256i *)pb->q[e4]);
                    const __m256i wa = sgn ? _mm256_abs_epi8(wv) : wv;
                    for (int r = 0; r < R; r++) {
                        if (!sgn) {
                            t[r] = a2_step(t[r], wv, x + r * xrow + 32 * b + 4 * e4);
                            continue;
                        }
                        const __m256i xv = _mm256_sign_epi8(a2_bcast(x + r * xrow + 32 * b + 4 * e4), wv);
                        t[r] = _mm256_add_epi16(t[r], _mm256_maddubs_epi16(wa, xv));
                    }
                }
                for (int r = 0; r < R; r++) t32[r] = _mm256_add_epi32(t32[r], _mm256_madd_epi16(t[r], ones));
            }
            const __m256 dv = _mm256_load_ps(pb->d);
            for (int r = 0; r < R; r++) {
                const char *xr = x + r * xrow;
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t32[r]), _mm256_mul_ps(dv, _mm256_set1_ps(XL_D(xr, nb)[b])), acc[r]);
                if (qt == QT_Q4_1 || qt == QT_Q5_1)
                    acc[r] = _mm256_fmadd_ps(_mm256_load_ps(pb->m), _mm256_set1_ps(XL_S(xr, nb)[b]), acc[r]);
            }
        }
        for (int r = 0; r < R; r++) part[ph][r] = acc[r];
    }
    for (int r = 0; r < R; r++) {   /* whole groups stored directly (a memcpy of nvalid floats was a libc call) */
        const __m256 v = _mm256_add_ps(_mm256_add_ps(part[0][r], part[1][r]), _mm256_add_ps(part[2][r], part[3][r]));
        if (nvalid == PN) {
            _mm256_storeu_ps(y + r * ldy, v);
            continue;
        }
        float tmp[PN];
        _mm256_storeu_ps(tmp, v);
        memcpy(y + r * ldy, tmp, (size_t)nvalid * sizeof(float));
    }
}

#endif
