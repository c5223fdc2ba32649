/* The reference kernels, in plain C: what every variant computes, and the specification of its
 * numbers. The int8 sums are exact integers; the int4 groups accumulate in float with one fmaf for
 * the scaled sum and one for the mins term a block, in block order (the variants use their FMA
 * instructions there and nowhere else). Compiled for the architecture's baseline. */
#include "kernels_portable.h"

/* the column blocks [b0, b1) of y [R][n]: y = (sum_k u8(x) * w - zp) * scale, exact integer sums */
static void generic_gemm_s8(const Linear *L, const uint8_t *q, int R, int b0, int b1, float *y) {
    int k = L->k, n = L->n;
    size_t stride = (size_t)k * 16;
    for (int r = 0; r < R; r++)
        for (int b = b0; b < b1; b++) {
            const int8_t *w = L->w + b * stride;
            int32_t acc[16] = {0};
            for (int kb = 0; kb < k / 4; kb++)
                for (int j = 0; j < 16; j++)
                    for (int i = 0; i < 4; i++) acc[j] += (int32_t)q[r * k + kb * 4 + i] * (int32_t)w[kb * 64 + j * 4 + i];
            for (int j = 0; j < 16 && b * 16 + j < n; j++)
                y[(size_t)r * n + b * 16 + j] = (float)(acc[j] - L->zp_sums[b * 16 + j]) * L->scale[b * 16 + j];
        }
}

/* one record's 16 integer sums for one row's int8 block x: sum q * x over the 32 inputs, less xc
 * (byte 64j + 4l + i: output l's input 8j + i in the low nibble, 8j + 4 + i in the high one) */
static void q4_record_sums(const uint8_t *p, const int8_t *x, int32_t xc, int32_t *sums) {
    for (int l = 0; l < 16; l++) {
        int32_t sum = -xc;
        for (int j = 0; j < 4; j++)
            for (int i = 0; i < 4; i++) {
                uint8_t v = p[64 * j + 4 * l + i];
                sum += (v & 15) * x[8 * j + i] + (v >> 4) * x[8 * j + 4 + i];
            }
        sums[l] = sum;
    }
}

static void generic_q4_rows(const Linear *L, const int8_t *q, const float *xs, const float *bs, const int32_t *xc,
                            int R, int g0, int g1, float *y) {
    int k = L->k, n = L->n, nb = k / Q4_BLOCK;
    for (int r = 0; r < R; r++)
        for (int g = g0; g < g1; g++) {
            float acc[16] = {0};
            for (int b = 0; b < nb; b++) {
                const uint8_t *p = (const uint8_t *)L->w + ((size_t)g * nb + b) * Q4_RECORD;
                const float *ws = (const float *)(p + 256), *mins = (const float *)(p + 320);
                int32_t sums[16];
                q4_record_sums(p, q + (size_t)r * k + b * Q4_BLOCK, xc[r * nb + b], sums);
                for (int l = 0; l < 16; l++) {
                    acc[l] = fmaf((float)sums[l], ws[l] * xs[r * nb + b], acc[l]);
                    acc[l] = fmaf(mins[l], bs[r * nb + b], acc[l]);
                }
            }
            memcpy(y + (size_t)r * n + g * 16, acc, sizeof acc);
        }
}

DECLARE_WALK

const Kernels sol_kernels_generic = {
    .name = "generic", .gemm_s8 = generic_gemm_s8, .q4_rows = generic_q4_rows, .quantize = portable_quantize,
    .argmax = portable_argmax, PORTABLE_FLOAT_KERNELS, .run = walk_run,
};

#define THIS (&sol_kernels_generic)
#include "walk.h"
