/* ARM NEON kernels with the dot product (ARMv8.2 dotprod: Jetson Orin's Cortex-A78AE, Raspberry Pi 5's
 * Cortex-A76): sdot, signed x signed int8 into int32, exact, 4 output columns a register.
 * int8: sdot has no unsigned side, so the u8 activations go in as x - 128 (the sign bit flipped) and
 * the sum comes back with 128 x the column's weights: sum x w - zp = sum (x - 128) w + zp, since
 * zp = 64 x sum w. int4: the nibbles (0..15) are int8 already. Built with -march=armv8.2-a+dotprod;
 * checked under qemu-aarch64 against generic C (tests/test_native_isa.py), not timed here. */
#include <arm_neon.h>

#include "kernels_portable.h"

#define SUB_ROWS 4

static inline int8x16_t bcast4(const void *p) {
    int32_t u;
    memcpy(&u, p, 4);
    return vreinterpretq_s8_s32(vdupq_n_s32(u));
}

/* sums [R][16] of one column block: rows x [R][k] (u8, flipped to x - 128) . w [k / 4][16][4] */
static inline __attribute__((always_inline)) void sweep(const uint8_t *x, const int R, int k, const int8_t *w,
                                                       int32_t *sums) {
    int32x4_t acc[SUB_ROWS][4];
    const uint8x16_t flip = vdupq_n_u8(0x80);
    for (int r = 0; r < R; r++)
        for (int c = 0; c < 4; c++) acc[r][c] = vdupq_n_s32(0);
    for (int kb = 0; kb < k / 4; kb++) {
        int8x16_t wv[4];
        for (int c = 0; c < 4; c++) wv[c] = vld1q_s8(w + kb * 64 + 16 * c);
        for (int r = 0; r < R; r++) {
            int8x16_t xb = vreinterpretq_s8_u8(veorq_u8(vreinterpretq_u8_s8(bcast4(x + r * k + kb * 4)), flip));
            for (int c = 0; c < 4; c++) acc[r][c] = vdotq_s32(acc[r][c], wv[c], xb);
        }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < 4; c++) vst1q_s32(sums + r * 16 + 4 * c, acc[r][c]);
}

#define SWEEP_CASE(r) case r: sweep(x, r, k, w, sums); break;
static void sweep_rows(const uint8_t *x, int R, int k, const int8_t *w, int32_t *sums) {
    switch (R) { SWEEP_CASE(1) SWEEP_CASE(2) SWEEP_CASE(3) SWEEP_CASE(4) }
}

static void neon_gemm_s8(const Linear *L, const uint8_t *q, int R, int b0, int b1, float *y) {
    int k = L->k, n = L->n;
    size_t stride = (size_t)k * 16;
    int32_t sums[SUB_ROWS * 16];
    for (int r0 = 0; r0 < R; r0 += SUB_ROWS) {
        int rb = R - r0 < SUB_ROWS ? R - r0 : SUB_ROWS;
        for (int b = b0; b < b1; b++) {
            int c0 = b * 16, width = n - c0 < 16 ? n - c0 : 16;
            sweep_rows(q + (size_t)r0 * k, rb, k, L->w + b * stride, sums);
            for (int r = 0; r < rb; r++) {
                float *out = y + (size_t)(r0 + r) * n + c0;
                for (int c = 0; c < width; c++)
                    out[c] = (float)(sums[r * 16 + c] + L->zp_sums[c0 + c]) * L->scale[c0 + c];
            }
        }
    }
}

/* one group of 16 outputs for R rows (as kernels_generic.c: the integer sums, then two fused
 * multiply-adds a block) */
static inline __attribute__((always_inline)) void q4_group(const Linear *L, const int8_t *q, const float *xs,
                                                          const float *bs, const int32_t *xc, const int R, int g,
                                                          float *y) {
    int k = L->k, n = L->n, nb = k / Q4_BLOCK;
    const uint8_t *p = (const uint8_t *)L->w + (size_t)g * nb * Q4_RECORD;
    float32x4_t acc[ROW_BLOCK][4];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < 4; c++) acc[r][c] = vdupq_n_f32(0);
    for (int b = 0; b < nb; b++, p += Q4_RECORD) {
        int8x16_t lo[16], hi[16];  /* [j][quarter]: outputs 4 quarter .. 4 quarter + 3 */
        for (int v = 0; v < 16; v++) {
            uint8x16_t raw = vld1q_u8(p + 16 * v);
            lo[v] = vreinterpretq_s8_u8(vandq_u8(raw, vdupq_n_u8(15))), hi[v] = vreinterpretq_s8_u8(vshrq_n_u8(raw, 4));
        }
        for (int r = 0; r < R; r++) {
            const int8_t *x = q + (size_t)r * k + b * Q4_BLOCK;
            float32x4_t xsv = vdupq_n_f32(xs[r * nb + b]), bsv = vdupq_n_f32(bs[r * nb + b]);
            for (int c = 0; c < 4; c++) {
                int32x4_t s = vdupq_n_s32(-xc[r * nb + b]);
                for (int j = 0; j < 4; j++) {
                    s = vdotq_s32(s, lo[4 * j + c], bcast4(x + 8 * j));
                    s = vdotq_s32(s, hi[4 * j + c], bcast4(x + 8 * j + 4));
                }
                float32x4_t ws = vld1q_f32((const float *)(p + 256) + 4 * c), mins = vld1q_f32((const float *)(p + 320) + 4 * c);
                acc[r][c] = vfmaq_f32(acc[r][c], vcvtq_f32_s32(s), vmulq_f32(ws, xsv));
                acc[r][c] = vfmaq_f32(acc[r][c], mins, bsv);
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < 4; c++) vst1q_f32(y + (size_t)r * n + g * 16 + 4 * c, acc[r][c]);
}

#define Q4_CASE(r) case r: for (int g = g0; g < g1; g++) q4_group(L, q, xs, bs, xc, r, g, y); break;
static void neon_q4_rows(const Linear *L, const int8_t *q, const float *xs, const float *bs, const int32_t *xc, int R,
                         int g0, int g1, float *y) {
    switch (R) { Q4_CASE(1) Q4_CASE(2) Q4_CASE(3) Q4_CASE(4) Q4_CASE(5) Q4_CASE(6) Q4_CASE(7) Q4_CASE(8) }
}

DECLARE_WALK

const Kernels sol_kernels_neon = {
    .name = "neon", .gemm_s8 = neon_gemm_s8, .q4_rows = neon_q4_rows, .quantize = portable_quantize,
    .argmax = portable_argmax, PORTABLE_FLOAT_KERNELS, .run = walk_run,
};

#define THIS (&sol_kernels_neon)
#include "walk.h"
