/* Shared definitions of the quantized-matmul library: GGUF block layouts, the quantized activations,
 * fp16 conversion. Block layouts follow ggml-common.h (bytes as stored in the GGUF file). */
#ifndef QM_COMMON_H
#define QM_COMMON_H

#include <stdint.h>
#include <string.h>

/* ggml type ids (gguf.GGMLQuantizationType) */
enum { QT_Q4_0 = 2, QT_Q4_1 = 3, QT_Q5_0 = 6, QT_Q5_1 = 7, QT_Q8_0 = 8, QT_Q4_K = 12, QT_Q5_K = 13, QT_Q6_K = 14 };

/* bytes per block; elements per block are 32 (legacy) or 256 (K types) */
enum { B_Q4_0 = 18, B_Q4_1 = 20, B_Q5_0 = 22, B_Q5_1 = 24, B_Q8_0 = 34, B_Q4_K = 144, B_Q5_K = 176, B_Q6_K = 210 };

/* Activations for the legacy types in the generic build (the SIMD builds lay a row out as arrays,
 * qm_simd.h): 32 int8 with a fp32 scale (Q8_0-style, but fp32 so the
 * activation rounding is the only error), s = d * sum(q) for the offset/min terms. */
typedef struct {
    int8_t q[32];
    float d;
    float s;
} xq32;

/* Activations for the K types (Q8_K-style): 256 int8, one fp32 scale, sums of each 16 elements
 * (the mins of Q4_K/Q5_K and the -32 offset of Q6_K are applied through them). */
typedef struct {
    int8_t q[256];
    int16_t bsum[16];
    float d;
    float pad;
    int16_t bsum32[8];   /* sums of each 32 elements (the packed GEMM's Q4_K/Q5_K mins: half the products) */
    int32_t off6[16];    /* -32 * bsum: the packed GEMM starts each Q6_K group's dot there (offset for free) */
} xq256;

static inline float qm_h2f(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    } else if (man == 0) {
        bits = sign;
    } else {    /* subnormal: normalise */
        exp = 113;
        while (!(man & 0x400)) { man <<= 1; exp--; }
        bits = sign | (exp << 23) | ((man & 0x3ff) << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* Q4_K/Q5_K 6-bit scales and mins (12 bytes) -> sc[8] in bytes 0..7, mins in bytes 8..15 of out */
static inline void qm_k4_scales(const uint8_t *s12, uint32_t out[4]) {
    const uint32_t k1 = 0x3f3f3f3f, k2 = 0x0f0f0f0f, k3 = 0x03030303;
    uint32_t u[3];
    memcpy(u, s12, 12);
    out[3] = ((u[2] >> 4) & k2) | (((u[1] >> 6) & k3) << 4);
    out[2] = u[1] & k1;
    out[1] = (u[2] & k2) | (((u[0] >> 6) & k3) << 4);
    out[0] = u[0] & k1;
}

#endif
