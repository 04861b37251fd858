/* Row math the fused recurrent kernels share (gated_deltanet.c, mamba2.c): e^x and silu on 16 lanes, and a
   sum of squares, each of only + - * / and bit operations in a fixed order, so the AVX-512, AVX2 (two 8-lane
   halves) and portable builds give the same bits (with -ffp-contract=off). */
#ifndef HITENTER_VEC_MATH_H
#define HITENTER_VEC_MATH_H

#include <stdint.h>
#include <stddef.h>
#include <string.h>

typedef float vm_v16 __attribute__((vector_size(64)));
typedef float vm_v16u __attribute__((vector_size(64), aligned(4)));   /* an unaligned load / store */
typedef int32_t vm_v16i __attribute__((vector_size(64)));

/* e^x on 16 lanes (Cephes' expf: x = n ln2 + r, |r| <= ln2 / 2, a degree-6 polynomial, times 2^n; within
   2 ulp of e^x), x clamped to [-87.3, 88.0]; only + - * and bit operations, so every ISA gives the same bits. */
static inline vm_v16 v_exp(vm_v16 x) {
    const vm_v16 lo = (vm_v16){0} - 87.3365447f, hi = (vm_v16){0} + 88.0f;
    vm_v16i m = x < lo;
    x = (vm_v16)(((vm_v16i)x & ~m) | ((vm_v16i)lo & m));
    m = x > hi;
    x = (vm_v16)(((vm_v16i)x & ~m) | ((vm_v16i)hi & m));
    const float magic = 12582912.0f;   /* 1.5 * 2^23: adding it rounds to an integer */
    const vm_v16 n = (x * 1.44269504088896341f + magic) - magic;
    vm_v16 r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    vm_v16 p = r * 1.9875691500e-4f + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    const vm_v16 y = (p * (r * r) + r) + 1.0f;
    const vm_v16i e = (__builtin_convertvector(n, vm_v16i) + 127) << 23;
    return y * (vm_v16)e;
}

static inline vm_v16 v_silu(vm_v16 x) { return x / (v_exp((vm_v16){0} - x) + 1.0f); }

/* The same on one float (the lanes past a multiple of 16). */
static inline float silu(float x) {
    vm_v16 v = {0};
    v[0] = x;
    return v_silu(v)[0];
}

/* sum of x^2 over n floats: 16 lanes over the whole vectors, the lanes added pairwise in a fixed order, then
   the tail in order (the same operations on every ISA). */
static float vm_sum_squares(const float *x, int64_t n) {
    vm_v16 acc = {0};
    const int64_t nv = n / 16;
    for (int64_t i = 0; i < nv; i++) {
        const vm_v16 r = ((const vm_v16u *)x)[i];
        acc = acc + r * r;
    }
    float l[16];
    memcpy(l, &acc, sizeof l);
    for (int w = 8; w >= 1; w /= 2)
        for (int j = 0; j < w; j++) l[j] = l[j] + l[j + w];
    float s = l[0];
    for (int64_t i = 16 * nv; i < n; i++) s = s + x[i] * x[i];
    return s;
}

/* y = y * silu(z) over n floats. */
static void vm_gate_silu(float *y, const float *z, int64_t n) {
    const int64_t nv = n / 16;
    for (int64_t i = 0; i < nv; i++) ((vm_v16u *)y)[i] = ((vm_v16u *)y)[i] * v_silu(((const vm_v16u *)z)[i]);
    for (int64_t i = 16 * nv; i < n; i++) y[i] = y[i] * silu(z[i]);
}

/* The depthwise causal conv of one row over C channels and silu: c = silu(sum_j u_rows[j] * wt[j] (+ bias)),
   u_rows[j] the window's row j (K of them), wt [K, C] the taps transposed; the products rounded then added in
   tap order, then the bias added (where not NULL). */
static void vm_conv_silu(const float *const *u_rows, int64_t K, const float *wt, const float *bias, float *c,
                         int64_t C) {
    const int64_t nv = C / 16;
    for (int64_t i = 0; i < nv; i++) {
        vm_v16 s = ((const vm_v16u *)u_rows[0])[i] * ((const vm_v16u *)wt)[i];
        for (int64_t j = 1; j < K; j++) s = s + ((const vm_v16u *)u_rows[j])[i] * ((const vm_v16u *)(wt + j * C))[i];
        if (bias) s = s + ((const vm_v16u *)bias)[i];
        ((vm_v16u *)c)[i] = v_silu(s);
    }
    for (int64_t ch = 16 * nv; ch < C; ch++) {
        float s = u_rows[0][ch] * wt[ch];
        for (int64_t j = 1; j < K; j++) s = s + u_rows[j][ch] * wt[j * C + ch];
        if (bias) s = s + bias[ch];
        c[ch] = silu(s);
    }
}

#endif
