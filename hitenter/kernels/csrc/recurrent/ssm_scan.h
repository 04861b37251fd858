/* One Mamba2 head's selective scan over a span's tokens: the arithmetic ssm_scan.c and mamba2.c share
   (ssm_scan.c's header comment states the order of operations). The caller points each input at the head's
   first token and gives the strides (floats) from one token to the next. */
#ifndef HITENTER_SSM_SCAN_H
#define HITENTER_SSM_SCAN_H

#include <stdint.h>

typedef struct {
    const float *x, *dt, *da, *b, *c;   /* this head's token 0: x [P], dt, da, and its group's B, C [N] */
    float *y;
    int64_t x_stride, d_stride, bc_stride, y_stride;
} ss_span;

/* S [N, P] (row i: P contiguous floats, updated in place) through n tokens; xdt: P floats of scratch. */
static void ss_head_span(float *S, const ss_span *sp, int64_t n, int64_t P, int64_t N, float *xdt) {
    for (int64_t t = 0; t < n; t++) {
        const float d = sp->dt[t * sp->d_stride], a = sp->da[t * sp->d_stride];
        const float *b = sp->b + t * sp->bc_stride, *c = sp->c + t * sp->bc_stride;
        const float *x = sp->x + t * sp->x_stride;
        float *y = sp->y + t * sp->y_stride;
        for (int64_t p = 0; p < P; p++) {
            xdt[p] = x[p] * d;
            y[p] = 0.0f;
        }
        for (int64_t i = 0; i < N; i++) {
            float *row = S + i * P;
            const float bi = b[i], ci = c[i];
            for (int64_t p = 0; p < P; p++) {
                const float s = row[p] * a + bi * xdt[p];
                row[p] = s;
                y[p] = y[p] + s * ci;
            }
        }
    }
}

#endif
