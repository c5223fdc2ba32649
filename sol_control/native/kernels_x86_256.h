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
#include "sizes.h"

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
                                                       int k, const int8_t *w, size_t stride, const int pf, int32_t *sums) {
    __m256i acc[SUB_ROWS][4];  /* [row][8 columns]: 2 x NB of them */
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int c = 0; c < 2 * NB; c++) acc[r][c] = _mm256_setzero_si256();
    for (int kb = 0; kb < k / 4; kb++) {
        __m256i wv[4];
        if (pf)
#pragma GCC unroll 2
            for (int b = 0; b < NB; b++) _mm_prefetch((const char *)(w + b * stride + kb * 64 + PF_AHEAD), _MM_HINT_T0);
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

/* every case compiled with its own split (s) and prefetch (p): no test of either in a sweep's loop */
#define SWEEP_CASE(r, nb, s, p) case r: sweep(x, r, nb, s, k, w, stride, p, sums); break;
#if SUB_ROWS == 6
#define ONE_BLOCK_CASES(s, p) SWEEP_CASE(1, 1, s, p) SWEEP_CASE(2, 1, s, p) SWEEP_CASE(3, 1, s, p) \
                              SWEEP_CASE(4, 1, s, p) SWEEP_CASE(5, 1, s, p) SWEEP_CASE(6, 1, s, p)
#elif SUB_ROWS == 4
#define ONE_BLOCK_CASES(s, p) SWEEP_CASE(1, 1, s, p) SWEEP_CASE(2, 1, s, p) SWEEP_CASE(3, 1, s, p) \
                              SWEEP_CASE(4, 1, s, p)
#else
#error "SUB_ROWS is 4 or 6"
#endif
#define ROW_SWITCH(s, p)                                                            \
    {                                                                               \
        if (NB == 2) switch (R) { SWEEP_CASE(1, 2, s, p) SWEEP_CASE(2, 2, s, p) }  \
        else switch (R) { ONE_BLOCK_CASES(s, p) }                                   \
    }
static void sweep_rows(const uint8_t *x, int R, int NB, int split, int k, const int8_t *w, size_t stride, int pf,
                       int32_t *sums) {
    if (split && pf) ROW_SWITCH(1, 1)
    else if (split) ROW_SWITCH(1, 0)
    else if (pf) ROW_SWITCH(0, 1)
    else ROW_SWITCH(0, 0)
}
#undef ROW_SWITCH
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
    int pf = (size_t)k * n >= PF_MIN_WEIGHTS;
    int32_t sums[SUB_ROWS * 32];
    for (int i = 0; i < row_blocks; i++)
        split[i] = needs_split(q + (size_t)i * SUB_ROWS * k, R - i * SUB_ROWS < SUB_ROWS ? R - i * SUB_ROWS : SUB_ROWS, k);
    for (int chunk = b0; chunk < b1; chunk += COL_CHUNK) {
        int chunk_end = b1 - chunk < COL_CHUNK ? b1 : chunk + COL_CHUNK;
        for (int r0 = 0; r0 < R; r0 += SUB_ROWS) {
            int rb = R - r0 < SUB_ROWS ? R - r0 : SUB_ROWS, wide = rb <= 2 ? 2 : 1;
            for (int nb = chunk; nb < chunk_end;) {
                int NB = chunk_end - nb >= wide ? wide : 1, c0 = nb * 16, width = n - c0 < NB * 16 ? n - c0 : NB * 16;
                sweep_rows(q + (size_t)r0 * k, rb, NB, split[r0 / SUB_ROWS], k, L->w + nb * stride, stride, pf, sums);
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

/* int4: half h of a group of 16 outputs (8 columns, one register) for R <= Q4_SUB rows, through the
 * group's records: per record the integer sums of its nibbles against each row's int8 block (one
 * register a row), less xc, then acc = fma(sum, scale x xs, acc), fma(mins, bs, acc) as generic C.
 * A half at a time, the R rows' sums and accumulators (2 R), the nibbles and the broadcast rows fit
 * in 16 registers; both halves at once spilled. */
#define Q4_SUB 4

static inline __attribute__((always_inline)) void q4_half(const Linear *L, const int8_t *q, const float *xs,
                                                         const float *bs, const int32_t *xc, const int R, int g,
                                                         int h, float *y) {
    int k = L->k, nb = k / Q4_BLOCK;
    const uint8_t *p = (const uint8_t *)L->w + (size_t)g * nb * Q4_RECORD + 32 * h;  /* the half's nibbles */
    const __m256i low = _mm256_set1_epi8(0x0F);
    __m256 acc[Q4_SUB];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++, p += Q4_RECORD) {
        const int8_t *x = q + b * Q4_BLOCK;
        if (h == 0)  /* the first half's sweep brings the group's records in; the second reads them from cache */
            for (int l = 0; l < Q4_RECORD; l += 64) _mm_prefetch((const char *)(p + PF_AHEAD + l), _MM_HINT_T0);
        __m256i s[Q4_SUB];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) s[r] = _mm256_setzero_si256();
#pragma GCC unroll 1  /* unrolled, GCC loads all four slices' nibbles first and spills */
        for (int j = 0; j < 4; j++) {
            __m256i raw = _mm256_loadu_si256((const __m256i *)(p + 64 * j));
            __m256i lo = _mm256_and_si256(raw, low), hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++)
                s[r] = Q4_DOT(s[r], lo, hi, bcast4(x + (size_t)r * k + 8 * j), bcast4(x + (size_t)r * k + 8 * j + 4));
        }
        const __m256 ws = _mm256_loadu_ps((const float *)(p + 256)), mins = _mm256_loadu_ps((const float *)(p + 320));
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            __m256 sum = _mm256_cvtepi32_ps(_mm256_sub_epi32(Q4_WIDEN(s[r]), _mm256_set1_epi32(xc[r * nb + b])));
            acc[r] = _mm256_fmadd_ps(sum, _mm256_mul_ps(ws, _mm256_set1_ps(xs[r * nb + b])), acc[r]);
            acc[r] = _mm256_fmadd_ps(mins, _mm256_set1_ps(bs[r * nb + b]), acc[r]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) _mm256_storeu_ps(y + (size_t)r * L->n + g * 16 + 8 * h, acc[r]);
}

static inline __attribute__((always_inline)) void q4_group(const Linear *L, const int8_t *q, const float *xs,
                                                          const float *bs, const int32_t *xc, const int R, int g,
                                                          float *y) {
    q4_half(L, q, xs, bs, xc, R, g, 0, y);
    q4_half(L, q, xs, bs, xc, R, g, 1, y);
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

/* ---- attention in 16 registers: portable_scores' and portable_values_mix's numbers (each lane's
 * sums in the same chains and order), 8 lanes and up to 2 queries a sweep instead of 16 lanes and 6
 * queries, whose accumulators would not fit in 16 ymm registers (the keys or values a sweep reads
 * are read again from cache for the next pair) */

/* scores of queries q[0..NQ) at positions [j0, j0 + 8): four chains over d mod 4, as score_sweep */
static inline __attribute__((always_inline)) void score_8(const float *const *q, const int NQ, const float *KT,
                                                         int D, int Ct, int j0, __m256 scale, float *s) {
    __m256 a[2][4];
#pragma GCC unroll 2
    for (int i = 0; i < NQ; i++) a[i][0] = a[i][1] = a[i][2] = a[i][3] = _mm256_setzero_ps();
    for (int d = 0; d < D; d += 4) {
        const float *k = key_row(KT, D, j0, d);
        __m256 kv[4] = {_mm256_loadu_ps(k), _mm256_loadu_ps(k + KEY_TILE), _mm256_loadu_ps(k + 2 * KEY_TILE),
                        _mm256_loadu_ps(k + 3 * KEY_TILE)};
#pragma GCC unroll 2
        for (int i = 0; i < NQ; i++)
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++) a[i][c] = _mm256_fmadd_ps(_mm256_set1_ps(q[i][d + c]), kv[c], a[i][c]);
    }
#pragma GCC unroll 2
    for (int i = 0; i < NQ; i++)
        _mm256_storeu_ps(s + (size_t)i * Ct + j0,
                         _mm256_mul_ps(_mm256_add_ps(_mm256_add_ps(a[i][0], a[i][1]), _mm256_add_ps(a[i][2], a[i][3])), scale));
}

static void scores_256(const float *const *q, int nq, const float *KT, int D, int Ct, int n, float scale, float *s) {
    const __m256 sc = _mm256_set1_ps(scale);
    for (int j0 = 0; j0 < padded16(n); j0 += 8)
        for (int i = 0; i < nq; i += 2) {
            if (nq - i >= 2)
                score_8(q + i, 2, KT, D, Ct, j0, sc, s + (size_t)i * Ct);
            else
                score_8(q + i, 1, KT, D, Ct, j0, sc, s + (size_t)i * Ct);
        }
}

/* out[i][d0, d0 + 8 NC) of queries p[0..NQ): sums over j < n in the order of j, as value_sweep */
static inline __attribute__((always_inline)) void values_8(const float *const *p, const int NQ, const int NC,
                                                          const float *V, int D, int n, int d0, const float *inv,
                                                          float *const *out) {
    __m256 a[2][4];
#pragma GCC unroll 2
    for (int i = 0; i < NQ; i++)
#pragma GCC unroll 4
        for (int c = 0; c < NC; c++) a[i][c] = _mm256_setzero_ps();
    for (int j = 0; j < n; j++) {
        __m256 v[4];
#pragma GCC unroll 4
        for (int c = 0; c < NC; c++) v[c] = _mm256_loadu_ps(V + (size_t)j * D + d0 + 8 * c);
#pragma GCC unroll 2
        for (int i = 0; i < NQ; i++) {
            __m256 pij = _mm256_set1_ps(p[i][j]);
#pragma GCC unroll 4
            for (int c = 0; c < NC; c++) a[i][c] = _mm256_fmadd_ps(pij, v[c], a[i][c]);
        }
    }
#pragma GCC unroll 2
    for (int i = 0; i < NQ; i++)
#pragma GCC unroll 4
        for (int c = 0; c < NC; c++) _mm256_storeu_ps(out[i] + d0 + 8 * c, _mm256_mul_ps(a[i][c], _mm256_set1_ps(inv[i])));
}

static void values_mix_256(const float *const *p, int nq, const float *V, int D, int n, const float *inv,
                           float *const *out) {
    for (int d0 = 0; d0 < D; d0 += 32)  /* D % 16 == 0: 32 columns, or the last 16 */
        for (int i = 0; i < nq; i += 2) {
            int two = nq - i >= 2, wide = D - d0 >= 32;
            if (two && wide) values_8(p + i, 2, 4, V, D, n, d0, inv + i, out + i);
            else if (two) values_8(p + i, 2, 2, V, D, n, d0, inv + i, out + i);
            else if (wide) values_8(p + i, 1, 4, V, D, n, d0, inv + i, out + i);
            else values_8(p + i, 1, 2, V, D, n, d0, inv + i, out + i);
        }
}

DECLARE_WALK

#define TABLE_NAME2(v) sol_kernels_##v
#define TABLE_NAME(v) TABLE_NAME2(v)
#define STRING2(v) #v
#define STRING(v) STRING2(v)
const Kernels TABLE_NAME(VARIANT) = {
    .name = STRING(VARIANT), .gemm_s8 = gemm_s8_256, .q4_rows = q4_rows_256, .quantize = quantize_256,
    .argmax = argmax_256, PORTABLE_FLOAT_KERNELS, .scores = scores_256,
    .values_mix = values_mix_256, .run = walk_run,
};

#define THIS (&TABLE_NAME(VARIANT))
#include "walk.h"
