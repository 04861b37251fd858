/* Shared definitions of the quantized-matmul library: GGUF block layouts, the quantized activations,
 * fp16 conversion. Block layouts follow ggml-common.h (bytes as stored in the GGUF file). */
#ifndef QM_COMMON_H
#define QM_COMMON_H

#include <stdint.h>
#include <string.h>

/* ggml type ids (gguf.GGMLQuantizationType) */
enum { QT_Q4_0 = 2, QT_Q4_1 = 3, QT_Q5_0 = 6, QT_Q5_1 = 7, QT_Q8_0 = 8, QT_Q2_K = 10, QT_Q3_K = 11, QT_Q4_K = 12,
       QT_Q5_K = 13, QT_Q6_K = 14, QT_IQ4_NL = 20, QT_IQ4_XS = 23, QT_MXFP4 = 39 };

/* bytes per block; elements per block are 32 (legacy, IQ4_NL, MXFP4) or 256 (K types, IQ4_XS) */
enum { B_Q4_0 = 18, B_Q4_1 = 20, B_Q5_0 = 22, B_Q5_1 = 24, B_Q8_0 = 34, B_Q2_K = 84, B_Q3_K = 110, B_Q4_K = 144,
       B_Q5_K = 176, B_Q6_K = 210, B_IQ4_NL = 18, B_IQ4_XS = 136, B_MXFP4 = 17 };

/* 256-wide types whose blocks carry mins (w = d * sc * q - dmin * m: two float steps per block); the others
 * (Q3_K, Q6_K, IQ4_XS) are d * sc * (q - offset), one float step on the exact I - Mn */
#define QM_KMIN(qt) ((qt) == QT_Q4_K || (qt) == QT_Q5_K || (qt) == QT_Q2_K)
/* 32-wide types whose weights are signed bytes (Q8_0 as stored, IQ4_NL's table values): + 128 for dpbusd
 * with VNNI, |w| with the sign moved onto x otherwise (maddubs would saturate on + 128) */
#define QM_SIGNED32(qt) ((qt) == QT_Q8_0 || (qt) == QT_IQ4_NL)

/* the non-linear 4-bit codebooks (ggml-common.h kvalues_iq4nl, kvalues_mxfp4: e2m1 values doubled) */
static const int8_t qm_kv_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
static const int8_t qm_kv_mxfp4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
#define QM_MXFP4_OFF 12   /* the SIMD builds store MXFP4 codes + 12 (0..24: unsigned, safe for maddubs) */

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

/* MXFP4's E8M0 block exponent as fp32, halved (the codebook is doubled): ggml's GGML_E8M0_TO_FP32_HALF */
static inline float qm_e8m0_half(uint8_t e) {
    const uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* Q3_K's 16 6-bit scales (12 bytes) minus 32: scale i has its low nibble in byte i % 8 (nibble i / 8) and
 * its high two bits in byte 8 + i % 4 (bits 2 (i / 4)) */
static inline void qm_q3k_scales(const uint8_t *s12, int sc[16]) {
    for (int i = 0; i < 16; i++)
        sc[i] = (((s12[i % 8] >> (4 * (i / 8))) & 15) | (((s12[8 + i % 4] >> (2 * (i / 4))) & 3) << 4)) - 32;
}

/* IQ4_XS's 8 6-bit scales minus 32 (the block's bytes 2..7: scales_h uint16, then scales_l[4]) */
static inline void qm_iq4xs_scales(const uint8_t *b, int sc[8]) {
    const unsigned h = (unsigned)b[2] | (unsigned)b[3] << 8;
    for (int i = 0; i < 8; i++) sc[i] = (((b[4 + i / 2] >> (4 * (i % 2))) & 15) | (((h >> (2 * i)) & 3) << 4)) - 32;
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
