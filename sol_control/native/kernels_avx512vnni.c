/* AVX-512 VNNI kernels (Zen 4, Ice Lake and later Xeons): vpdpbusd on 64 bytes of weights, 16
 * output columns a vector. The int8 sums are exact (u8 x s8 into int32); the int4 groups use
 * vfmadd where generic C writes fmaf; quantize and argmax are the portable ones 16 lanes at a time. */
#include <immintrin.h>

#include "kernels_portable.h"

#define MAX_NB 4  /* 16-column blocks a sweep covers: 4 x up to 6 rows = 24 accumulators of 32 registers */

/* y [R][width] (rows ldy apart) = (rows x [R][k] (u8) . NB column blocks of w (each [k / 4][16][4],
 * `stride` apart) - zp) * scale: the integer sums, then the epilogue on them in registers */
static inline __attribute__((always_inline)) void sweep(const uint8_t *x, const int R, const int NB, int k,
                                                       const int8_t *w, size_t stride, const int pf, const int32_t *zp,
                                                       const float *scale, float *y, size_t ldy, int width) {
    __m512i acc[ROW_BLOCK][MAX_NB];
    int32_t sums[ROW_BLOCK * MAX_NB * 16];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int b = 0; b < NB; b++) acc[r][b] = _mm512_setzero_si512();
    for (int kb = 0; kb < k / 4; kb++) {
        __m512i wv[MAX_NB];
#pragma GCC unroll 4
        for (int b = 0; b < NB; b++) {
            if (pf) _mm_prefetch((const char *)(w + b * stride + kb * 64 + PF_AHEAD), _MM_HINT_T0);
            wv[b] = _mm512_loadu_si512((const void *)(w + b * stride + kb * 64));
        }
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            int32_t u;
            memcpy(&u, x + r * k + kb * 4, 4);
            __m512i xb = _mm512_set1_epi32(u);
#pragma GCC unroll 4
            for (int b = 0; b < NB; b++) acc[r][b] = _mm512_dpbusd_epi32(acc[r][b], xb, wv[b]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int b = 0; b < NB; b++) _mm512_storeu_si512((void *)(sums + (r * NB + b) * 16), acc[r][b]);
    for (int b = 0; b < NB; b++) {  /* the epilogue: 16 columns a vector, the last block's tail masked */
        int left = width - b * 16;
        if (left <= 0) break;
        __mmask16 mk = left >= 16 ? 0xFFFF : (__mmask16)((1u << left) - 1);
        __m512i z = _mm512_maskz_loadu_epi32(mk, zp + b * 16);
        __m512 sc = _mm512_maskz_loadu_ps(mk, scale + b * 16);
        for (int r = 0; r < R; r++) {
            __m512i a = _mm512_loadu_si512((const void *)(sums + (r * NB + b) * 16));
            _mm512_mask_storeu_ps(y + r * ldy + b * 16, mk, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(a, z)), sc));
        }
    }
}
#define SWEEP_CASE(r, nb, p) case r: sweep(x, r, nb, k, w, stride, p, zp, scale, y, ldy, width); break;
/* NB = 4 for up to 6 rows, 2 for 7-8 (register budget), 1 for the last blocks; p: prefetch or not */
#define SWEEP_SWITCH(p)                                                                                        \
    if (NB == 4) {                                                                                             \
        switch (R) { SWEEP_CASE(1, 4, p) SWEEP_CASE(2, 4, p) SWEEP_CASE(3, 4, p) SWEEP_CASE(4, 4, p)          \
                     SWEEP_CASE(5, 4, p) SWEEP_CASE(6, 4, p) }                                                 \
    } else if (NB == 2) {                                                                                      \
        switch (R) { SWEEP_CASE(7, 2, p) SWEEP_CASE(8, 2, p) }                                                 \
    } else {                                                                                                   \
        switch (R) { SWEEP_CASE(1, 1, p) SWEEP_CASE(2, 1, p) SWEEP_CASE(3, 1, p) SWEEP_CASE(4, 1, p)          \
                     SWEEP_CASE(5, 1, p) SWEEP_CASE(6, 1, p) SWEEP_CASE(7, 1, p) SWEEP_CASE(8, 1, p) }        \
    }
static void sweep_rows(const uint8_t *x, int R, int NB, int k, const int8_t *w, size_t stride, int pf, const int32_t *zp,
                       const float *scale, float *y, size_t ldy, int width) {
    if (pf) {
        SWEEP_SWITCH(1)
    } else {
        SWEEP_SWITCH(0)
    }
}
#undef SWEEP_SWITCH
#undef SWEEP_CASE

/* the column blocks [b0, b1) of y [R][n]: chunks of MAX_NB blocks, each through every 8 rows (up to 4
 * blocks a sweep), so that a chunk's weights stay in cache while all the rows read them */
static void avx512_gemm_s8(const Linear *L, const uint8_t *q, int R, int b0, int b1, float *y) {
    int k = L->k, n = L->n;
    size_t stride = (size_t)k * 16;
    int pf = (size_t)k * n >= PF_MIN_WEIGHTS;
    for (int chunk = b0; chunk < b1; chunk += MAX_NB) {
        int chunk_end = b1 - chunk < MAX_NB ? b1 : chunk + MAX_NB;
        for (int r0 = 0; r0 < R; r0 += ROW_BLOCK) {
            int rb = R - r0 < ROW_BLOCK ? R - r0 : ROW_BLOCK, wide = rb <= 6 ? 4 : 2;
            for (int nb = chunk; nb < chunk_end;) {
                int NB = chunk_end - nb >= wide ? wide : 1, c0 = nb * 16, width = n - c0 < NB * 16 ? n - c0 : NB * 16;
                sweep_rows(q + r0 * k, rb, NB, k, L->w + nb * stride, stride, pf, L->zp_sums + c0, L->scale + c0,
                           y + (size_t)r0 * n + c0, n, width);
                nb += NB;
            }
        }
    }
}

/* y [R][n] for R <= 8 rows: each record's nibbles against the rows' int8 blocks (the low nibbles as
 * they are, the high ones in place: 16 q, the sum shifted back), then scale and mins in float */
static inline __attribute__((always_inline)) void q4_sweep(const Linear *L, const int8_t *q, const float *xs,
                                                          const float *bs, const int32_t *xc, const int R, int g0,
                                                          int g1, float *y) {
    int k = L->k, n = L->n, nb = k / Q4_BLOCK;
    const __m512i low = _mm512_set1_epi8(0x0F), high = _mm512_set1_epi8((char)0xF0);
    const uint8_t *p = (const uint8_t *)L->w + (size_t)g0 * nb * Q4_RECORD;
    for (int g = g0; g < g1; g++) {
        __m512 acc[ROW_BLOCK];
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
        for (int b = 0; b < nb; b++, p += Q4_RECORD) {
            for (int l = 0; l < Q4_RECORD; l += 64) _mm_prefetch((const char *)(p + PF_AHEAD + l), _MM_HINT_T0);
            __m512i lo_sum[ROW_BLOCK], hi_sum[ROW_BLOCK];
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) lo_sum[r] = hi_sum[r] = _mm512_setzero_si512();
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) {
                __m512i v = _mm512_loadu_si512((const void *)(p + 64 * j));
                __m512i lo = _mm512_and_si512(v, low), hi = _mm512_and_si512(v, high);
#pragma GCC unroll 8
                for (int r = 0; r < R; r++) {
                    int32_t a, c;
                    memcpy(&a, q + (size_t)r * k + b * Q4_BLOCK + 8 * j, 4);
                    memcpy(&c, q + (size_t)r * k + b * Q4_BLOCK + 8 * j + 4, 4);
                    lo_sum[r] = _mm512_dpbusd_epi32(lo_sum[r], lo, _mm512_set1_epi32(a));
                    hi_sum[r] = _mm512_dpbusd_epi32(hi_sum[r], hi, _mm512_set1_epi32(c));
                }
            }
            __m512 ws = _mm512_loadu_ps((const float *)(p + 256)), mins = _mm512_loadu_ps((const float *)(p + 320));
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) {
                __m512i sum = _mm512_sub_epi32(_mm512_add_epi32(lo_sum[r], _mm512_srai_epi32(hi_sum[r], 4)),
                                               _mm512_set1_epi32(xc[r * nb + b]));
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(ws, _mm512_set1_ps(xs[r * nb + b])), acc[r]);
                acc[r] = _mm512_fmadd_ps(mins, _mm512_set1_ps(bs[r * nb + b]), acc[r]);
            }
        }
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) _mm512_storeu_ps(y + (size_t)r * n + g * 16, acc[r]);
    }
}
#define Q4_CASE(r) case r: q4_sweep(L, q, xs, bs, xc, r, g0, g1, y); break;
/* the 16-output groups [g0, g1) of y [R][n] for R <= 8 rows */
static void q4_rows(const Linear *L, const int8_t *q, const float *xs, const float *bs, const int32_t *xc, int R,
                    int g0, int g1, float *y) {
    switch (R) { Q4_CASE(1) Q4_CASE(2) Q4_CASE(3) Q4_CASE(4) Q4_CASE(5) Q4_CASE(6) Q4_CASE(7) Q4_CASE(8) }
}

/* the portable quantize, 16 at a time: divide, round half to even, shift, saturate */
static void avx512_quantize(const float *x, uint8_t *q, int n, float step) {
    const __m512 st = _mm512_set1_ps(step), zero_point = _mm512_set1_ps(ZERO_POINT), top = _mm512_set1_ps(255);
    for (int i = 0; i < n; i += 16) {
        __mmask16 mk = n - i >= 16 ? 0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        __m512 v = _mm512_div_ps(_mm512_maskz_loadu_ps(mk, x + i), st);
        v = _mm512_add_ps(_mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), zero_point);
        v = _mm512_min_ps(_mm512_max_ps(v, _mm512_setzero_ps()), top);
        _mm512_mask_cvtusepi32_storeu_epi8(q + i, mk, _mm512_cvtps_epi32(v));
    }
}

/* the portable argmax with its 16 lanes in one register */
static int avx512_argmax(const float *x, int n) {
    float top[16];
    int at[16], i = 16;
    for (int l = 0; l < 16; l++) { top[l] = l < n ? x[l] : -INFINITY; at[l] = l; }
    __m512 tv = _mm512_loadu_ps(top);
    __m512i av = _mm512_loadu_si512((const void *)at), iv = av;
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_loadu_ps(x + i);
        __mmask16 more = _mm512_cmp_ps_mask(v, tv, _CMP_GT_OQ);
        tv = _mm512_mask_mov_ps(tv, more, v);
        av = _mm512_mask_mov_epi32(av, more, _mm512_add_epi32(iv, _mm512_set1_epi32(i)));
    }
    _mm512_storeu_ps(top, tv);
    _mm512_storeu_si512((void *)at, av);
    return argmax_lanes(top, at, x, i, n);
}

DECLARE_WALK

const Kernels sol_kernels_avx512vnni = {
    .name = "avx512vnni", .gemm_s8 = avx512_gemm_s8, .q4_rows = q4_rows, .quantize = avx512_quantize,
    .argmax = avx512_argmax, PORTABLE_FLOAT_KERNELS, .run = walk_run,
};

#define THIS (&sol_kernels_avx512vnni)
#include "walk.h"
