/* 16-lane fp32 vector helpers shared by the decode kernels (decode_attention.c, decode_layer.c): GCC / Clang
   vector extensions only, so -march=native picks the width (AVX-512, 2 x AVX2, or scalar code). */
#ifndef HITENTER_VEC16_H
#define HITENTER_VEC16_H
#include <math.h>
#include <stdint.h>
#include <string.h>

typedef float v16 __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));

static inline v16 vsel(v16i m, v16 a, v16 b) { return (v16)(((v16i)a & m) | ((v16i)b & ~m)); }

/* e^x: 2^n * p(r) with the Cephes expf polynomial; 0 below -87, clamped at 88 above (no inf). One body for
   every vector width (vt floats, vti int32 lanes, sel their select): the same operations lane for lane, so
   the same bits at any width (decode_layer.c instantiates an 8-lane one for AVX2). 12582912 = 1.5 * 2^23:
   adding it rounds to an integer (ties even). */
#define DEF_VEXP(name, vt, vti, sel)                                                                 \
    static inline vt name(vt x) {                                                                    \
        const vt lo = (vt){0} - 87.0f, hi = (vt){0} + 88.0f;                                         \
        x = sel(x < lo, lo, x);                                                                      \
        x = sel(x > hi, hi, x);                                                                      \
        const vt magic = (vt){0} + 12582912.0f;                                                      \
        vt n = (x * 1.44269504088896341f + magic) - magic;                                           \
        vt r = x - n * 0.693359375f;                                                                 \
        r = r - n * -2.12194440e-4f;                                                                 \
        vt p = r * 1.9875691500E-4f + 1.3981999507E-3f;                                              \
        p = p * r + 8.3334519073E-3f;                                                                \
        p = p * r + 4.1665795894E-2f;                                                                \
        p = p * r + 1.6666665459E-1f;                                                                \
        p = p * r + 5.0000001201E-1f;                                                                \
        p = p * r * r + r + 1.0f;                                                                    \
        vti e = (__builtin_convertvector(n, vti) + 127) << 23;                                       \
        return p * (vt)e;                                                                            \
    }
DEF_VEXP(vexp, v16, v16i, vsel)

static inline float hsum(v16 v) {   /* a fixed tree: lanes i and i+8, then i+4, i+2, i+1 */
    v = v + __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7);
    v = v + __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11);
    v = v + __builtin_shufflevector(v, v, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13);
    v = v + __builtin_shufflevector(v, v, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14);
    return v[0];
}

/* Elements of the KV cache and the queries: type 0 fp32, 1 bf16, 2 f16 (hitenter/models/kv_dtype.py).
   Loads widen exactly to fp32; stores round to nearest even (torch's .to()). f16 uses the compiler's
   _Float16 (vcvtph2ps / vcvtps2ph with F16C), else a bit-exact scalar conversion.
   Type 3, q8_0 (the cache only): a row of D values is D / 32 blocks of llama.cpp's block_q8_0 (fp16 d, 32
   int8 q: 34 bytes), written by q8_0_quant_row and read by q8_0_dequant_row (below). */
typedef uint16_t v16h __attribute__((vector_size(32)));
typedef uint32_t v16u __attribute__((vector_size(64)));
#define KV_F32 0
#define KV_BF16 1
#define KV_F16 2
#define KV_Q8_0 3
#define Q8_0_QK 32      /* values per q8_0 block */
#define Q8_0_BYTES 34   /* bytes per q8_0 block */

#if !defined(__FLT16_MAX__)
static inline float h2f_scalar(uint16_t h) {
    uint32_t s = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ffu, u;
    if (e == 0) {
        if (!m) u = s;
        else { e = 113; while (!(m & 0x400u)) { m <<= 1; e--; } u = s | (e << 23) | ((m & 0x3ffu) << 13); }
    } else if (e == 31) u = s | 0x7f800000u | (m << 13);
    else u = s | ((e + 112) << 23) | (m << 13);
    float f; memcpy(&f, &u, 4); return f;
}
static inline uint16_t f2h_scalar(float f) {
    uint32_t u; memcpy(&u, &f, 4);
    const uint32_t s = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a >= 0x7f800000u) return (uint16_t)(s | 0x7c00u | (a > 0x7f800000u ? 0x200u : 0));
    if (a >= 0x477ff000u) return (uint16_t)(s | 0x7c00u);            /* rounds to inf */
    if (a < 0x38800000u) {                                           /* subnormal or zero */
        if (a < 0x33000000u) return (uint16_t)s;
        const uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u, sh = 126 - e;
        uint32_t r = m >> sh; const uint32_t rem = m & ((1u << sh) - 1), half = 1u << (sh - 1);
        if (rem > half || (rem == half && (r & 1))) r++;
        return (uint16_t)(s | r);
    }
    uint32_t r = ((a >> 13) - (112u << 10));
    const uint32_t rem = a & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1))) r++;
    return (uint16_t)(s | r);
}
#endif

static inline v16 load16t(const void *p, const int t) {
    if (t == KV_BF16) {
        v16h h; memcpy(&h, p, 32);
        return (v16)(__builtin_convertvector(h, v16u) << 16);
    }
    if (t == KV_F16) {
#if defined(__FLT16_MAX__)
        typedef _Float16 v16f16 __attribute__((vector_size(32)));
        v16f16 h; memcpy(&h, p, 32);
        return __builtin_convertvector(h, v16);
#else
        v16 f; const uint16_t *hp = (const uint16_t *)p;
        for (int i = 0; i < 16; i++) f[i] = h2f_scalar(hp[i]);
        return f;
#endif
    }
    v16 f; memcpy(&f, p, 64); return f;
}

static inline void store16t(void *p, v16 x, const int t) {
    if (t == KV_BF16) {
        v16u u = (v16u)x;
        u = u + 0x7fffu + ((u >> 16) & 1u);
        v16h hv = __builtin_convertvector(u >> 16, v16h);
        memcpy(p, &hv, 32);
    } else if (t == KV_F16) {
#if defined(__FLT16_MAX__)
        typedef _Float16 v16f16 __attribute__((vector_size(32)));
        v16f16 h = __builtin_convertvector(x, v16f16);
        memcpy(p, &h, 32);
#else
        uint16_t *hp = (uint16_t *)p;
        for (int i = 0; i < 16; i++) hp[i] = f2h_scalar(x[i]);
#endif
    } else memcpy(p, &x, 64);
}

static inline int elem_bytes(int t) { return t == KV_F32 ? 4 : 2; }

/* bytes of one cache row of D values of type t */
static inline int64_t kv_row_bytes(int t, int D) {
    return t == KV_Q8_0 ? (int64_t)(D / Q8_0_QK) * Q8_0_BYTES : (int64_t)D * elem_bytes(t);
}

static inline float h2f(uint16_t h) {
#if defined(__FLT16_MAX__)
    _Float16 x; memcpy(&x, &h, 2); return (float)x;
#else
    return h2f_scalar(h);
#endif
}

static inline uint16_t f2h(float f) {   /* round to nearest even */
#if defined(__FLT16_MAX__)
    const _Float16 x = (_Float16)f; uint16_t h; memcpy(&h, &x, 2); return h;
#else
    return f2h_scalar(f);
#endif
}

/* the q8_0 row of D values x (D % 32 == 0) into dst, as ggml-quants.c's quantize_row_q8_0_ref: per block
   amax = max |x|, d = amax / 127, id = d ? 1 / d : 0, q = roundf(x * id) (halves away from zero), d stored
   as fp16 (nearest even); hitenter/models/kv_q8_0.py is its torch twin (tested bit-equal) */
static inline void q8_0_quant_row(char *dst, const float *x, int D) {
    for (int b = 0; b < D / Q8_0_QK; b++, dst += Q8_0_BYTES, x += Q8_0_QK) {
        float amax = 0.0f;
        for (int j = 0; j < Q8_0_QK; j++) { const float a = fabsf(x[j]); amax = amax > a ? amax : a; }
        const float d = amax / 127, id = d != 0.0f ? 1.0f / d : 0.0f;
        const uint16_t h = f2h(d);
        memcpy(dst, &h, 2);
        for (int j = 0; j < Q8_0_QK; j++) dst[2 + j] = (char)(int8_t)roundf(x[j] * id);
    }
}

/* x = H x in place, H the normalized Walsh-Hadamard transform over D (a power of two): a q8_0 cache's K rows and
   the queries that meet them (kv_q8_0.py's rotate, float op for float: a + b, a - b per stage, then * 1/sqrt(D)) */
static inline void q8_0_rotate_row(float *x, int D) {
    for (int h = 1; h < D; h *= 2)
        for (int i = 0; i < D; i += 2 * h)
            for (int j = i; j < i + h; j++) { const float a = x[j], b = x[j + h]; x[j] = a + b; x[j + h] = a - b; }
    const float s = (float)(1.0 / sqrt((double)D));
    for (int j = 0; j < D; j++) x[j] *= s;
}

/* the D values of a q8_0 row: fp32(d) * q, exact in fp32 (11 x 8 significant bits) */
static inline void q8_0_dequant_row(float *dst, const char *src, int D) {
    for (int b = 0; b < D / Q8_0_QK; b++, src += Q8_0_BYTES, dst += Q8_0_QK) {
        uint16_t h;
        memcpy(&h, src, 2);
        const float d = h2f(h);
        const int8_t *q = (const int8_t *)(src + 2);
        for (int j = 0; j < Q8_0_QK; j++) dst[j] = d * (float)q[j];
    }
}

/* the addresses of keys k0 .. k0+n-1 in a cache plane starting at `base` (rows of row_bytes, blocks of BS
   rows): key k lives in block table[k / BS] at k % BS (one division per call, the block walked after that:
   a division per key cost more than the attention arithmetic) */
static inline void paged_rows(const char **out, const char *base, const int64_t *table, int64_t k0, int n, int BS,
                              int64_t row_bytes) {
    int64_t b = k0 / BS;
    int o = (int)(k0 - b * BS);
    if (o + n <= BS) {   /* one block (a 16-key tile of 16-token blocks): one lookup, then consecutive rows (the
                            general loop below tests the block per key, which slows decode attention) */
        const char *p = base + (table[b] * BS + o) * row_bytes;
        for (int j = 0; j < n; j++, p += row_bytes) out[j] = p;
        return;
    }
    for (int j = 0; j < n; j++) {
        out[j] = base + (table[b] * BS + o) * row_bytes;
        if (++o == BS) o = 0, b++;
    }
}

#endif
