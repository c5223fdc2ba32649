/* The 256-bit x86 kernels, written once for AVX2 (kernels_avx2.c) and AVX-VNNI (kernels_avxvnni.c,
 * VEX or EVEX encoding): 8 output columns a register. The including file defines
 *   VARIANT         the table's name (a C identifier and its string),
 *   DOT4(acc, x, w) acc + the 8 columns' sums of 4 u8 x (broadcast) times their 4 s8 weights,
 *   EXACT_BELOW     the largest u8 activation DOT4 sums exactly (255: every one),
 *   Q4_DOT(acc, lo, hi, xa, xb)  acc + the low nibbles (u8) times xa and the high ones times xb (s8),
 *   Q4_WIDEN(a)     those sums as int32.
 * AVX2's vpmaddubsw saturates a pair of u8 x s8 products above 32,767: its rows with an activation
 * above 128 (a static input past twice its calibrated |max|) go through as two exact halves, min(x,
 * 128) and x - 128 saturated at 0, their sums added in int32. */
#include <immintrin.h>

#include "kernels_portable.h"

#ifndef SUB_ROWS  /* rows one sweep carries: 2 x 4 accumulators with 2 blocks, SUB_ROWS x 2 with 1 */
#define SUB_ROWS 6  /* with 32 registers (EVEX); the VEX variants set 4 */
#endif

static inline __m256i bcast4(const void *p) {
    int32_t u;
    memcpy(&u, p, 4);
    return _mm256_set1_epi32(u);
}

/* acc + both halves of a row above EXACT_BELOW: DOT4(min(x, 128)) + DOT4(x - 128, at least 0) */
static inline __m256i dot4_split(__m256i acc, __m256i x, __m256i w) {
    const __m256i cap = _mm256_set1_epi8((char)128);
    return DOT4(DOT4(acc, _mm256_min_epu8(x, cap), w), _mm256_subs_epu8(x, cap), w);
}

/* sums [R][NB * 16] = rows x [R][k] (u8) . NB column blocks of w (each [k / 4][16][4], `stride` apart) */
static inline __attribute__((always_inline)) void sweep(const uint8_t *x, const int R, const int NB, const int split,
                                                       int k, const int8_t *w, size_t stride, int32_t *sums) {
    __m256i acc[SUB_ROWS][4];  /* [row][8 columns]: 2 x NB of them */
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int c = 0; c < 2 * NB; c++) acc[r][c] = _mm256_setzero_si256();
    for (int kb = 0; kb < k / 4; kb++) {
        __m256i wv[4];
#pragma GCC unroll 4
        for (int c = 0; c < 2 * NB; c++) wv[c] = _mm256_loadu_si256((const __m256i *)(w + (c / 2) * stride + kb * 64 + (c % 2) * 32));
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            __m256i xb = bcast4(x + r * k + kb * 4);
#pragma GCC unroll 4
            for (int c = 0; c < 2 * NB; c++) acc[r][c] = split ? dot4_split(acc[r][c], xb, wv[c]) : DOT4(acc[r][c], xb, wv[c]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int c = 0; c < 2 * NB; c++) _mm256_storeu_si256((__m256i *)(sums + r * NB * 16 + c * 8), acc[r][c]);
}

#define SWEEP_CASE(r, nb, s) case r: sweep(x, r, nb, s, k, w, stride, sums); break;
#if SUB_ROWS == 6
#define ONE_BLOCK_CASES(s) SWEEP_CASE(1, 1, s) SWEEP_CASE(2, 1, s) SWEEP_CASE(3, 1, s) SWEEP_CASE(4, 1, s) \
                           SWEEP_CASE(5, 1, s) SWEEP_CASE(6, 1, s)
#elif SUB_ROWS == 4
#define ONE_BLOCK_CASES(s) SWEEP_CASE(1, 1, s) SWEEP_CASE(2, 1, s) SWEEP_CASE(3, 1, s) SWEEP_CASE(4, 1, s)
#else
#error "SUB_ROWS is 4 or 6"
#endif
static void sweep_rows(const uint8_t *x, int R, int NB, int split, int k, const int8_t *w, size_t stride,
                       int32_t *sums) {
    if (split) {
        if (NB == 2) switch (R) { SWEEP_CASE(1, 2, 1) SWEEP_CASE(2, 2, 1) }
        else switch (R) { ONE_BLOCK_CASES(1) }
    } else {
        if (NB == 2) switch (R) { SWEEP_CASE(1, 2, 0) SWEEP_CASE(2, 2, 0) }
        else switch (R) { ONE_BLOCK_CASES(0) }
    }
}
#undef ONE_BLOCK_CASES
#undef SWEEP_CASE

/* does any of the R rows hold an activation DOT4 cannot sum exactly? */
static int needs_split(const uint8_t *x, int R, int k) {
    uint8_t top = 0;
    for (int i = 0; i < R * k; i++) top = x[i] > top ? x[i] : top;
    return top > EXACT_BELOW;
}

#define COL_CHUNK 4  /* column blocks whose weights every row block reads while they are in cache */

/* the column blocks [b0, b1) of y [R][n]: chunks of COL_CHUNK blocks, each through every row block
 * (SUB_ROWS rows, 1-2 blocks a sweep), then the epilogue */
static void gemm_s8_256(const Linear *L, const uint8_t *q, int R, int b0, int b1, float *y) {
    int k = L->k, n = L->n, row_blocks = (R + SUB_ROWS - 1) / SUB_ROWS, split[row_blocks];
    size_t stride = (size_t)k * 16;
    int32_t sums[SUB_ROWS * 32];
    for (int i = 0; i < row_blocks; i++)
        split[i] = needs_split(q + (size_t)i * SUB_ROWS * k, R - i * SUB_ROWS < SUB_ROWS ? R - i * SUB_ROWS : SUB_ROWS, k);
    for (int chunk = b0; chunk < b1; chunk += COL_CHUNK) {
        int chunk_end = b1 - chunk < COL_CHUNK ? b1 : chunk + COL_CHUNK;
        for (int r0 = 0; r0 < R; r0 += SUB_ROWS) {
            int rb = R - r0 < SUB_ROWS ? R - r0 : SUB_ROWS, wide = rb <= 2 ? 2 : 1;
            for (int nb = chunk; nb < chunk_end;) {
                int NB = chunk_end - nb >= wide ? wide : 1, c0 = nb * 16, width = n - c0 < NB * 16 ? n - c0 : NB * 16;
                sweep_rows(q + (size_t)r0 * k, rb, NB, split[r0 / SUB_ROWS], k, L->w + nb * stride, stride, sums);
                for (int r = 0; r < rb; r++) {
                    float *out = y + (size_t)(r0 + r) * n + c0;
                    for (int c = 0; c < width; c++)
                        out[c] = (float)(sums[r * NB * 16 + c] - L->zp_sums[c0 + c]) * L->scale[c0 + c];
                }
                nb += NB;
            }
        }
    }
}

/* int4: one group of 16 outputs for R <= Q4_SUB rows: per block, the integer sums of its nibbles
 * against each row's int8 block (q4_block_sums), less xc, then acc = fma(sum, scale x xs, acc),
 * fma(mins, bs, acc) */
#define Q4_SUB 4

/* s[r][half]: the integer sums of a record's nibbles against each of R rows' int8 blocks (x, rows k
 * apart), one 32-byte slice of nibbles (8 outputs x 4 inputs) at a time so that the rows' sums stay
 * in registers */
static inline __attribute__((always_inline)) void q4_block_sums(__m256i s[Q4_SUB][2], const uint8_t *p,
                                                               const int8_t *x, int k, const int R) {
    __m256i acc[Q4_SUB][2];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
    for (int j = 0; j < 4; j++) {
        __m256i lo[2], hi[2];
        for (int h = 0; h < 2; h++) {
            __m256i raw = _mm256_loadu_si256((const __m256i *)(p + 64 * j + 32 * h));
            lo[h] = _mm256_and_si256(raw, _mm256_set1_epi8(0x0F));
            hi[h] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), _mm256_set1_epi8(0x0F));
        }
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            __m256i xa = bcast4(x + (size_t)r * k + 8 * j), xb = bcast4(x + (size_t)r * k + 8 * j + 4);
            for (int h = 0; h < 2; h++) acc[r][h] = Q4_DOT(acc[r][h], lo[h], hi[h], xa, xb);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
        for (int h = 0; h < 2; h++) s[r][h] = Q4_WIDEN(acc[r][h]);
}
static inline __attribute__((always_inline)) void q4_group(const Linear *L, const int8_t *q, const float *xs,
                                                          const float *bs, const int32_t *xc, const int R, int g,
                                                          float *y) {
    int k = L->k, n = L->n, nb = k / Q4_BLOCK;
    const uint8_t *p = (const uint8_t *)L->w + (size_t)g * nb * Q4_RECORD;
    __m256 acc[Q4_SUB][2];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++, p += Q4_RECORD) {
        __m256i s[Q4_SUB][2];
        q4_block_sums(s, p, q + b * Q4_BLOCK, k, R);
        const __m256 ws[2] = {_mm256_loadu_ps((const float *)(p + 256)), _mm256_loadu_ps((const float *)(p + 288))};
        const __m256 mins[2] = {_mm256_loadu_ps((const float *)(p + 320)), _mm256_loadu_ps((const float *)(p + 352))};
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            __m256 xsv = _mm256_set1_ps(xs[r * nb + b]), bsv = _mm256_set1_ps(bs[r * nb + b]);
            __m256i c = _mm256_set1_epi32(xc[r * nb + b]);
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                __m256 sum = _mm256_cvtepi32_ps(_mm256_sub_epi32(s[r][h], c));
                acc[r][h] = _mm256_fmadd_ps(sum, _mm256_mul_ps(ws[h], xsv), acc[r][h]);
                acc[r][h] = _mm256_fmadd_ps(mins[h], bsv, acc[r][h]);
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
        for (int h = 0; h < 2; h++) _mm256_storeu_ps(y + (size_t)r * n + g * 16 + 8 * h, acc[r][h]);
}

/* the groups [g0, g1) of y [R][n], Q4_SUB rows at a time */
static void q4_rows_256(const Linear *L, const int8_t *q, const float *xs, const float *bs, const int32_t *xc, int R,
                        int g0, int g1, float *y) {
    int k = L->k, nb = k / Q4_BLOCK;
    for (int r0 = 0; r0 < R; r0 += Q4_SUB) {
        const int8_t *qr = q + (size_t)r0 * k;
        const float *xsr = xs + r0 * nb, *bsr = bs + r0 * nb;
        const int32_t *xcr = xc + r0 * nb;
        float *yr = y + (size_t)r0 * L->n;
        int rb = R - r0 < Q4_SUB ? R - r0 : Q4_SUB;
        switch (rb) {
            case 1: for (int g = g0; g < g1; g++) q4_group(L, qr, xsr, bsr, xcr, 1, g, yr); break;
            case 2: for (int g = g0; g < g1; g++) q4_group(L, qr, xsr, bsr, xcr, 2, g, yr); break;
            case 3: for (int g = g0; g < g1; g++) q4_group(L, qr, xsr, bsr, xcr, 3, g, yr); break;
            case 4: for (int g = g0; g < g1; g++) q4_group(L, qr, xsr, bsr, xcr, 4, g, yr); break;
        }
    }
}

/* the portable quantize, 16 at a time: divide, round half to even, shift, saturate, pack */
static void quantize_256(const float *x, uint8_t *q, int n, float step) {
    const __m256 st = _mm256_set1_ps(step), zero_point = _mm256_set1_ps(ZERO_POINT), top = _mm256_set1_ps(255);
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i u[2];
        for (int h = 0; h < 2; h++) {
            __m256 v = _mm256_div_ps(_mm256_loadu_ps(x + i + 8 * h), st);
            v = _mm256_add_ps(_mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), zero_point);
            u[h] = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(v, _mm256_setzero_ps()), top));
        }
        __m256i words = _mm256_permute4x64_epi64(_mm256_packs_epi32(u[0], u[1]), 0xD8);  /* 16 int16 in order */
        __m128i bytes = _mm_packus_epi16(_mm256_castsi256_si128(words), _mm256_extracti128_si256(words, 1));
        _mm_storeu_si128((__m128i *)(q + i), bytes);
    }
    portable_quantize(x + i, q + i, n - i, step);
}

/* the portable argmax, its 16 lanes in two registers */
static int argmax_256(const float *x, int n) {
    float top[16];
    int at[16], i = 16;
    for (int l = 0; l < 16; l++) { top[l] = l < n ? x[l] : -INFINITY; at[l] = l; }
    __m256 t0 = _mm256_loadu_ps(top), t1 = _mm256_loadu_ps(top + 8);
    __m256i a0 = _mm256_loadu_si256((const __m256i *)at), a1 = _mm256_loadu_si256((const __m256i *)(at + 8));
    const __m256i i0 = a0, i1 = a1;
    for (; i + 16 <= n; i += 16) {
        __m256 v0 = _mm256_loadu_ps(x + i), v1 = _mm256_loadu_ps(x + i + 8);
        __m256 m0 = _mm256_cmp_ps(v0, t0, _CMP_GT_OQ), m1 = _mm256_cmp_ps(v1, t1, _CMP_GT_OQ);
        __m256i base = _mm256_set1_epi32(i);
        t0 = _mm256_blendv_ps(t0, v0, m0), t1 = _mm256_blendv_ps(t1, v1, m1);
        a0 = _mm256_blendv_epi8(a0, _mm256_add_epi32(i0, base), _mm256_castps_si256(m0));
        a1 = _mm256_blendv_epi8(a1, _mm256_add_epi32(i1, base), _mm256_castps_si256(m1));
    }
    _mm256_storeu_ps(top, t0), _mm256_storeu_ps(top + 8, t1);
    _mm256_storeu_si256((__m256i *)at, a0), _mm256_storeu_si256((__m256i *)(at + 8), a1);
    return argmax_lanes(top, at, x, i, n);
}

DECLARE_WALK

#define TABLE_NAME2(v) sol_kernels_##v
#define TABLE_NAME(v) TABLE_NAME2(v)
#define STRING2(v) #v
#define STRING(v) STRING2(v)
const Kernels TABLE_NAME(VARIANT) = {
    .name = STRING(VARIANT), .gemm_s8 = gemm_s8_256, .q4_rows = q4_rows_256, .quantize = quantize_256,
    .argmax = argmax_256, PORTABLE_FLOAT_KERNELS, .run = walk_run,
};

#define THIS (&TABLE_NAME(VARIANT))
#include "walk.h"
