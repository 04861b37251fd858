/* 16-lane fp32 vector helpers shared by the decode kernels (decode_attention.c, decode_layer.c): GCC / Clang
   vector extensions only, so -march=native picks the width (AVX-512, 2 x AVX2, or scalar code). */
#ifndef HITENTER_VEC16_H
#define HITENTER_VEC16_H
#include <stdint.h>

typedef float v16 __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));

static inline v16 vsel(v16i m, v16 a, v16 b) { return (v16)(((v16i)a & m) | ((v16i)b & ~m)); }

/* e^x: 2^n * p(r) with the Cephes expf polynomial; 0 below -87, clamped at 88 above (no inf) */
static inline v16 vexp(v16 x) {
    const v16 lo = (v16){0} - 87.0f, hi = (v16){0} + 88.0f;
    x = vsel(x < lo, lo, x);
    x = vsel(x > hi, hi, x);
    const v16 magic = (v16){0} + 12582912.0f;   /* 1.5 * 2^23: adding it rounds to an integer (ties even) */
    v16 n = (x * 1.44269504088896341f + magic) - magic;
    v16 r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    v16 p = r * 1.9875691500E-4f + 1.3981999507E-3f;
    p = p * r + 8.3334519073E-3f;
    p = p * r + 4.1665795894E-2f;
    p = p * r + 1.6666665459E-1f;
    p = p * r + 5.0000001201E-1f;
    p = p * r * r + r + 1.0f;
    v16i e = (__builtin_convertvector(n, v16i) + 127) << 23;
    return p * (v16)e;
}

static inline float hsum(v16 v) {   /* a fixed tree: lanes i and i+8, then i+4, i+2, i+1 */
    v = v + __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7);
    v = v + __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11);
    v = v + __builtin_shufflevector(v, v, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13);
    v = v + __builtin_shufflevector(v, v, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14);
    return v[0];
}

#endif
