/* One decoder pass of a quantized Llama in the fused graph layout, in C.
 *
 * The same computation as two of sol_control.graph.llama's graphs, without ONNX Runtime's per-node
 * cost: the int8 graphs with "static" activations (the shipped grasp and QC targets: on a 3-layer,
 * 2.9M-parameter model a 5-row ORT pass is ~0.18 ms of fixed cost and ~14 us a row), and the int4
 * graphs of an imported GGUF ("fast" mode: Q4_1 blocks as 4-bit weights plus a mins term, an 8-bit
 * tied embedding and head with "dual" activation rows, chained draft heads; SmolLM2-135M).
 *
 * Every row goes through the same code: its numbers never depend on the other rows of the call
 * (the integer GEMMs are exact; every float reduction runs in one fixed order, 16 lanes then a
 * fixed tree), so a one-token pass equals that token's row in a verify pass bit for bit and
 * speculative decoding equals plain greedy without a query pad or pairs.
 *
 * int8 linears: y = (sum_k (u8(x) - 64) * w_s8) * channel_scale * a, x quantized to u8 on a step
 * of a / 64 (round half to even, saturated): a = the calibrated |max| ("static"), the row's own
 * |max| ("rows"), or the row's |max| with what the 7 bits left as a second row 128 times finer
 * ("dual"); weights packed for AVX-512 VNNI's vpdpbusd as [ceil(n / 16)][k / 4][16][4].
 * int4 linears: w = (q - 8) * scale per block of 32 inputs plus a per-block "min", x quantized to
 * int8 per block (|max| / 127, as ONNX Runtime's MatMulNBits at accuracy level 4); records of 16
 * outputs x 32 inputs (256 bytes of nibbles, 16 scales, 16 mins). Without VNNI the same sums in C.
 * Built by the Makefile (`make native`); sol_control.decoding.native loads it with ctypes.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(__AVX512F__) && defined(__AVX512VNNI__)
#include <immintrin.h>
#define SOL_VNNI 1
#else
#define SOL_VNNI 0
#endif

#define MAX_LAYERS 64
#define MAX_HEADS 16
#define ROW_BLOCK 8  /* rows per GEMM sweep: each weight vector is loaded once for up to 8 rows */
#define ZERO_POINT 64
#define Q4_BLOCK 32
#define Q4_RECORD 384  /* bytes of one int4 record: 4 x 64 of nibbles, 16 scales, 16 mins */
#define PARALLEL_MIN (1L << 18)  /* weights of a linear worth splitting over threads (SmolLM2's are ~0.3-1.8 M) */

enum { LIN_STATIC = 0, LIN_ROWS = 1, LIN_DUAL = 2, LIN_Q4 = 3 };

typedef struct {
    const int8_t *w;          /* int8: [ceil(n / 16)][k / 4][16][4], zeros past n; int4: [n / 16][k / 32] records */
    const int32_t *zp_sums;   /* int8: [n]: 64 * sum_k w[k][n] */
    const float *scale;       /* int8: [n]: channel scale x the static |max| (1 for rows / dual) */
    float step;               /* LIN_STATIC: the activation step (|max| / 64) */
    int32_t k, n, kind;
} Linear;

typedef struct {
    const float *ln1, *ln2;
    Linear qkv, o, gate_up, down;
} Layer;

typedef struct {
    int32_t n_layers, hidden, n_heads, kv_heads, head_dim, inter, vocab, capacity, n_draft, head_offset, chained;
    int32_t threads;            /* the large linears' output columns split over this many threads (OpenMP) */
    float eps, attn_scale;
    const float *embed;         /* [vocab][hidden] fp32, or NULL and: */
    const uint8_t *embed_q8;    /* [vocab][hidden] 8-bit, zero point 128 */
    const float *embed_scales;  /* [vocab][hidden / 32] */
    const float *cos, *sin;     /* [capacity][head_dim / 2] */
    const float *final_norm;
    Layer layers[MAX_LAYERS];
    Linear lm_head, heads_w1;
    Linear heads_w2[MAX_HEADS];    /* plain heads: one output layer each */
    Linear heads_prev[MAX_HEADS];  /* chained heads: the embedding of the token before each guess */
    Linear heads_vocab;            /* chained heads: logits over the first n tokens */
} Model;

int sol_vnni(void) { return SOL_VNNI; }

/* ---- float helpers: fixed-order reductions, a branch-free exp ---------------------------- */

/* 16 floats as one value (GCC vector extension: one zmm with AVX-512, smaller registers elsewhere) */
typedef float v16 __attribute__((vector_size(64)));
typedef float v16u __attribute__((vector_size(64), aligned(4), may_alias));
typedef int32_t v16i __attribute__((vector_size(64)));
static inline v16 load16(const float *p) { return *(const v16u *)p; }
static inline void store16(float *p, v16 v) { *(v16u *)p = v; }

static float tree16(const float *a) {
    float b[8], c[4];
    for (int i = 0; i < 8; i++) b[i] = a[i] + a[i + 8];
    for (int i = 0; i < 4; i++) c[i] = b[i] + b[i + 4];
    return (c[0] + c[2]) + (c[1] + c[3]);
}

static float dot(const float *a, const float *b, int n) {  /* n % 16 == 0 */
    float acc[16] = {0};
    for (int i = 0; i < n; i += 16)
        for (int l = 0; l < 16; l++) acc[l] += a[i + l] * b[i + l];
    return tree16(acc);
}

static float sum16(const float *a, int n) {  /* any n: 16 lanes, the tail in lane 0 */
    float acc[16] = {0};
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; l++) acc[l] += a[i + l];
    for (; i < n; i++) acc[0] += a[i];
    return tree16(acc);
}

/* exp(x) for x <= 0 down to about -87 (softmax and sigmoid arguments are clamped): 2^n * p(r),
 * r = x - n ln2 in [-ln2/2, ln2/2], a degree-6 polynomial, ~2 ulp. */
static inline float fast_exp(float x) {
    x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
    float n = nearbyintf(x * 1.44269504f);
    float r = x - n * 0.693145752f - n * 1.42860677e-6f;
    float p = 1.0f / 720 * r + 1.0f / 120;
    p = p * r + 1.0f / 24;
    p = p * r + 1.0f / 6;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    union { float f; int32_t i; } s = {.i = ((int32_t)n + 127) << 23};
    return p * s.f;
}

static void rms_norm(const float *x, const float *w, float *y, int n, float eps) {
    float inv = 1.0f / sqrtf(dot(x, x, n) / (float)n + eps);
    for (int i = 0; i < n; i++) y[i] = x[i] * inv * w[i];
}

static float silu(float x) { return x / (1.0f + fast_exp(-x)); }

/* the first largest, as ONNX ArgMax: 16 lanes each keep their first largest, then the lanes'
 * largest with the smallest index */
static int argmax(const float *x, int n) {
    float top[16];
    int at[16], i = 16;
    for (int l = 0; l < 16; l++) { top[l] = l < n ? x[l] : -INFINITY; at[l] = l; }
#if SOL_VNNI
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
#else
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; l++) {
            int more = x[i + l] > top[l];
            top[l] = more ? x[i + l] : top[l];
            at[l] = more ? i + l : at[l];
        }
#endif
    int best = at[0];
    float m = top[0];
    for (int l = 1; l < 16; l++)
        if (top[l] > m || (top[l] == m && at[l] < best)) { m = top[l]; best = at[l]; }
    for (; i < n; i++)
        if (x[i] > m) { m = x[i]; best = i; }
    return best;
}

/* the largest softmax probability of a row whose largest value is m: 1 / sum exp(x - m) */
static float top_prob(const float *x, int n, float m, float *tmp) {
    for (int i = 0; i < n; i++) tmp[i] = fast_exp(x[i] - m);
    return 1.0f / sum16(tmp, n);
}

/* ---- int8 linears ------------------------------------------------------------------------- */

typedef struct { uint8_t *q; float *tmp, *amax, *xs, *bs; int32_t *xc; int threads; } Work;  /* a linear's scratch */

/* a part of n items for thread t of `parts`, in multiples of `step` */
static void split(int n, int step, int t, int parts, int *lo, int *hi) {
    int units = (n + step - 1) / step;
    *lo = units * t / parts * step;
    *hi = units * (t + 1) / parts * step;
    *hi = *hi < n ? *hi : n;
}

static uint8_t to_u8(float v) { return (uint8_t)(v < 0 ? 0 : (v > 255 ? 255 : v)); }

static void quantize(const float *x, uint8_t *q, int n, float step) {
#if SOL_VNNI  /* the same operations 16 at a time: divide, round half to even, shift, saturate */
    const __m512 st = _mm512_set1_ps(step), zero_point = _mm512_set1_ps(ZERO_POINT), top = _mm512_set1_ps(255);
    for (int i = 0; i < n; i += 16) {
        __mmask16 mk = n - i >= 16 ? 0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        __m512 v = _mm512_div_ps(_mm512_maskz_loadu_ps(mk, x + i), st);
        v = _mm512_add_ps(_mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), zero_point);
        v = _mm512_min_ps(_mm512_max_ps(v, _mm512_setzero_ps()), top);
        _mm512_mask_cvtusepi32_storeu_epi8(q + i, mk, _mm512_cvtps_epi32(v));
    }
#else
    for (int i = 0; i < n; i++) q[i] = to_u8(nearbyintf(x[i] / step) + ZERO_POINT);
#endif
}

/* a row on its own |max| ("rows", "dual"): unit = x / |max|, q = round(unit / step) + 64 and, with
 * `fine`, what that left in steps 128 times finer; returns the |max| */
static float quantize_row(const float *x, uint8_t *q, uint8_t *fine, int n) {
    const float step = 1.0f / ZERO_POINT, fine_step = step / (2 * ZERO_POINT);
    float amax = 1e-30f;  /* an all-zero row stays zero */
    for (int i = 0; i < n; i++) amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
    for (int i = 0; i < n; i++) {
        float unit = x[i] / amax;
        q[i] = to_u8(nearbyintf(unit / step) + ZERO_POINT);
        if (fine) fine[i] = to_u8(nearbyintf((unit - (float)(q[i] - ZERO_POINT) * step) / fine_step) + ZERO_POINT);
    }
    return amax;
}

#define MAX_NB 4  /* 16-column blocks a sweep covers: 4 x up to 6 rows = 24 accumulators of 32 registers */

#if SOL_VNNI
/* y [R][width] (rows ldy apart) = (rows x [R][k] (u8) . NB column blocks of w (each [k / 4][16][4],
 * `stride` apart) - zp) * scale: the integer sums, then the epilogue on them in registers */
static inline __attribute__((always_inline)) void sweep(const uint8_t *x, const int R, const int NB, int k,
                                                       const int8_t *w, size_t stride, const int32_t *zp,
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
        for (int b = 0; b < NB; b++) wv[b] = _mm512_loadu_si512((const void *)(w + b * stride + kb * 64));
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
#define SWEEP_CASE(r, nb) case r: sweep(x, r, nb, k, w, stride, zp, scale, y, ldy, width); break;
/* NB = 4 for up to 6 rows, 2 for 7-8 (register budget), 1 for the last blocks */
static void sweep_rows(const uint8_t *x, int R, int NB, int k, const int8_t *w, size_t stride, const int32_t *zp,
                       const float *scale, float *y, size_t ldy, int width) {
    if (NB == 4) {
        switch (R) { SWEEP_CASE(1, 4) SWEEP_CASE(2, 4) SWEEP_CASE(3, 4) SWEEP_CASE(4, 4) SWEEP_CASE(5, 4)
                     SWEEP_CASE(6, 4) }
    } else if (NB == 2) {
        switch (R) { SWEEP_CASE(7, 2) SWEEP_CASE(8, 2) }
    } else {
        switch (R) { SWEEP_CASE(1, 1) SWEEP_CASE(2, 1) SWEEP_CASE(3, 1) SWEEP_CASE(4, 1) SWEEP_CASE(5, 1)
                     SWEEP_CASE(6, 1) SWEEP_CASE(7, 1) SWEEP_CASE(8, 1) }
    }
}
#else
static void sweep_rows(const uint8_t *x, int R, int NB, int k, const int8_t *w, size_t stride, const int32_t *zp,
                       const float *scale, float *y, size_t ldy, int width) {
    for (int r = 0; r < R; r++)
        for (int b = 0; b < NB && b * 16 < width; b++) {
            int32_t acc[16] = {0};
            for (int kb = 0; kb < k / 4; kb++)
                for (int j = 0; j < 16; j++)
                    for (int i = 0; i < 4; i++)
                        acc[j] += (int32_t)x[r * k + kb * 4 + i] * (int32_t)w[b * stride + kb * 64 + j * 4 + i];
            for (int j = 0; j < 16 && b * 16 + j < width; j++)
                y[r * ldy + b * 16 + j] = (float)(acc[j] - zp[b * 16 + j]) * scale[b * 16 + j];
        }
}
#endif

/* the column blocks [b0, b1) of y [R][n] = u8 rows q [R][k] through the int8 weights */
static void gemm_s8_blocks(const Linear *L, const uint8_t *q, int R, int b0, int b1, float *y) {
    int k = L->k, n = L->n;
    size_t stride = (size_t)k * 16;
    for (int r0 = 0; r0 < R; r0 += ROW_BLOCK) {
        int rb = R - r0 < ROW_BLOCK ? R - r0 : ROW_BLOCK, wide = rb <= 6 ? 4 : 2;
        for (int nb = b0; nb < b1;) {
            int NB = b1 - nb >= wide ? wide : 1, c0 = nb * 16, width = n - c0 < NB * 16 ? n - c0 : NB * 16;
            sweep_rows(q + r0 * k, rb, NB, k, L->w + nb * stride, stride, L->zp_sums + c0, L->scale + c0,
                       y + (size_t)r0 * n + c0, n, width);
            nb += NB;
        }
    }
}

/* y [R][n] = u8 rows q [R][k] through the int8 weights: (sum - zero point sums) * scale; wide
 * linears' column blocks split over the threads (each output computed by one, the same way) */
static void gemm_s8(const Linear *L, const uint8_t *q, int R, float *y, int threads) {
    int blocks = (L->n + 15) / 16, parts = (long)blocks * L->k >= PARALLEL_MIN ? threads : 1;
    if (parts == 1) {  /* no OpenMP call at all: it costs ~0.3 us a linear even with one thread */
        gemm_s8_blocks(L, q, R, 0, blocks, y);
        return;
    }
#pragma omp parallel for num_threads(parts) schedule(static)
    for (int t = 0; t < parts; t++) {
        int b0, b1;
        split(blocks, MAX_NB, t, parts, &b0, &b1);
        gemm_s8_blocks(L, q, R, b0, b1, y);
    }
}

/* y [R][n] = rows x [R][k] (float) through an int8 linear of any activation kind */
static void int8_linear(const Linear *L, const float *x, int R, float *y, const Work *w) {
    int k = L->k, n = L->n, dual = L->kind == LIN_DUAL;
    if (L->kind == LIN_STATIC) {
        for (int r = 0; r < R; r++) quantize(x + (size_t)r * k, w->q + (size_t)r * k, k, L->step);
        gemm_s8(L, w->q, R, y, w->threads);
        return;
    }
    for (int r = 0; r < R; r++)  /* dual: the R rows, then their R finer rows, one GEMM */
        w->amax[r] = quantize_row(x + (size_t)r * k, w->q + (size_t)r * k, dual ? w->q + (size_t)(R + r) * k : NULL, k);
    gemm_s8(L, w->q, dual ? 2 * R : R, dual ? w->tmp : y, w->threads);
    for (int r = 0; r < R; r++) {
        float *out = y + (size_t)r * n;
        const float *hi = w->tmp + (size_t)r * n, *lo = w->tmp + (size_t)(R + r) * n;
        if (dual)
            for (int c = 0; c < n; c++) out[c] = (hi[c] + lo[c] * (1.0f / (2 * ZERO_POINT))) * w->amax[r];
        else
            for (int c = 0; c < n; c++) out[c] *= w->amax[r];
    }
}

/* ---- int4 linears ------------------------------------------------------------------------- */

/* one row to int8 per block of 32: q = round(x * 127 / |max|) with scale xs = |max| / 127, xc = 8 x
 * the sum of q (the weights' implicit zero point 8), bs = the sum of x (for the mins term) */
static void quantize_blocks(const float *x, int8_t *q, int k, float *xs, float *bs, int32_t *xc) {
    for (int b = 0; b < k / Q4_BLOCK; b++) {
        const float *v = x + b * Q4_BLOCK;
        float amax = 0, halves[16];
        for (int i = 0; i < Q4_BLOCK; i++) amax = fabsf(v[i]) > amax ? fabsf(v[i]) : amax;
        float inv = amax > 0 ? 127.0f / amax : 0.0f;
        int32_t sum = 0;
        for (int i = 0; i < Q4_BLOCK; i++) {
            q[b * Q4_BLOCK + i] = (int8_t)nearbyintf(v[i] * inv);
            sum += q[b * Q4_BLOCK + i];
        }
        for (int l = 0; l < 16; l++) halves[l] = v[l] + v[l + 16];
        xs[b] = amax / 127.0f, bs[b] = tree16(halves), xc[b] = 8 * sum;
    }
}

#if SOL_VNNI
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
#else
static void q4_rows(const Linear *L, const int8_t *q, const float *xs, const float *bs, const int32_t *xc, int R,
                    int g0, int g1, float *y) {
    int k = L->k, n = L->n, nb = k / Q4_BLOCK;
    for (int r = 0; r < R; r++)
        for (int g = g0; g < g1; g++) {
            float acc[16] = {0};
            for (int b = 0; b < nb; b++) {
                const uint8_t *p = (const uint8_t *)L->w + ((size_t)g * nb + b) * Q4_RECORD;
                const int8_t *x = q + (size_t)r * k + b * Q4_BLOCK;
                const float *ws = (const float *)(p + 256), *mins = (const float *)(p + 320);
                for (int l = 0; l < 16; l++) {
                    int32_t sum = -xc[r * nb + b];
                    for (int j = 0; j < 4; j++)
                        for (int i = 0; i < 4; i++) {
                            uint8_t v = p[64 * j + 4 * l + i];
                            sum += (v & 15) * x[8 * j + i] + (v >> 4) * x[8 * j + 4 + i];
                        }
                    acc[l] += (float)sum * (ws[l] * xs[r * nb + b]);
                    acc[l] += mins[l] * bs[r * nb + b];
                }
            }
            memcpy(y + (size_t)r * n + g * 16, acc, sizeof acc);
        }
}
#endif

/* the output groups [g0, g1) of all R rows, 8 rows a sweep */
static void q4_part(const Linear *L, const int8_t *q, const Work *w, int R, int g0, int g1, float *y) {
    int k = L->k, nb = k / Q4_BLOCK;
    for (int r0 = 0; r0 < R; r0 += ROW_BLOCK)
        q4_rows(L, q + (size_t)r0 * k, w->xs + r0 * nb, w->bs + r0 * nb, w->xc + r0 * nb,
                R - r0 < ROW_BLOCK ? R - r0 : ROW_BLOCK, g0, g1, y + (size_t)r0 * L->n);
}

static void q4_linear(const Linear *L, const float *x, int R, float *y, const Work *w) {
    int k = L->k, nb = k / Q4_BLOCK;
    int8_t *q = (int8_t *)w->q;
    for (int r = 0; r < R; r++)
        quantize_blocks(x + (size_t)r * k, q + (size_t)r * k, k, w->xs + r * nb, w->bs + r * nb, w->xc + r * nb);
    int groups = L->n / 16, parts = (long)L->n * k >= PARALLEL_MIN ? w->threads : 1;
    if (parts == 1) {
        q4_part(L, q, w, R, 0, groups, y);
        return;
    }
#pragma omp parallel for num_threads(parts) schedule(static)
    for (int t = 0; t < parts; t++) {  /* output groups split over the threads, each computed the same way */
        int g0, g1;
        split(groups, 1, t, parts, &g0, &g1);
        q4_part(L, q, w, R, g0, g1, y);
    }
}

static void linear(const Linear *L, const float *x, int R, float *y, const Work *w) {
    if (L->kind == LIN_Q4)
        q4_linear(L, x, R, y, w);
    else
        int8_linear(L, x, R, y, w);
}

/* ---- attention ------------------------------------------------------------------------------ */

/* rotate one head's vector at position pos (rotary_interleaved = 0: halves, not pairs) */
static void rotate(float *v, const float *cos, const float *sin, int d) {
    int h = d / 2;
    for (int i = 0; i < h; i++) {
        float a = v[i], b = v[i + h];
        v[i] = a * cos[i] - b * sin[i];
        v[i + h] = b * cos[i] + a * sin[i];
    }
}

static int padded16(int n) { return (n + 15) / 16 * 16; }

#define ATT_Q 6  /* query vectors one sweep over a kv head's keys or values serves (4 chains each) */

/* the scores s [nq][Ct] at positions [0, n rounded up to 16) of nq <= ATT_Q query vectors q[i]
 * against one kv head's transposed keys KT [head_dim][Ct]: each key vector loaded once for all of
 * them. A score is a sum over d in four chains (d mod 4) added in one order, whatever nq is. */
static inline __attribute__((always_inline)) void score_sweep(const float *const *q, const int nq, const float *KT,
                                                             int D, int Ct, int n, float scale, float *s) {
    for (int j0 = 0; j0 < n; j0 += 16) {
        v16 a[ATT_Q][4];
#pragma GCC unroll 6
        for (int i = 0; i < nq; i++) a[i][0] = a[i][1] = a[i][2] = a[i][3] = (v16){0};
        for (int d = 0; d < D; d += 4) {
            const float *k = KT + (size_t)d * Ct + j0;
            v16 k0 = load16(k), k1 = load16(k + Ct), k2 = load16(k + 2 * Ct), k3 = load16(k + 3 * Ct);
#pragma GCC unroll 6
            for (int i = 0; i < nq; i++) {
                a[i][0] += q[i][d] * k0;
                a[i][1] += q[i][d + 1] * k1;
                a[i][2] += q[i][d + 2] * k2;
                a[i][3] += q[i][d + 3] * k3;
            }
        }
#pragma GCC unroll 6
        for (int i = 0; i < nq; i++) store16(s + (size_t)i * Ct + j0, ((a[i][0] + a[i][1]) + (a[i][2] + a[i][3])) * scale);
    }
}

/* out[i] = inv[i] x sum_j p[i][j] V[j] over j < n (V [n][D], D % 16 == 0; a query's p is 0 past its
 * own positions): each value row loaded once for all nq <= ATT_Q queries, each sum in the order of j */
static inline __attribute__((always_inline)) void value_sweep(const float *const *p, const int nq, const float *V,
                                                             int D, int n, const float *inv, float *const *out) {
    int d0 = 0;
    for (; d0 + 64 <= D; d0 += 64) {  /* 64 columns in registers over all positions */
        v16 a[ATT_Q][4];
#pragma GCC unroll 6
        for (int i = 0; i < nq; i++) a[i][0] = a[i][1] = a[i][2] = a[i][3] = (v16){0};
        for (int j = 0; j < n; j++) {
            const float *v = V + (size_t)j * D + d0;
            v16 v0 = load16(v), v1 = load16(v + 16), v2 = load16(v + 32), v3 = load16(v + 48);
#pragma GCC unroll 6
            for (int i = 0; i < nq; i++) {
                a[i][0] += p[i][j] * v0;
                a[i][1] += p[i][j] * v1;
                a[i][2] += p[i][j] * v2;
                a[i][3] += p[i][j] * v3;
            }
        }
#pragma GCC unroll 6
        for (int i = 0; i < nq; i++)
            for (int c = 0; c < 4; c++) store16(out[i] + d0 + 16 * c, a[i][c] * inv[i]);
    }
    for (; d0 < D; d0 += 16)
        for (int i = 0; i < nq; i++) {
            v16 acc = {0};
            for (int j = 0; j < n; j++) acc += p[i][j] * load16(V + (size_t)j * D + d0);
            store16(out[i] + d0, acc * inv[i]);
        }
}

#define ATT_CASE(c) case c: score_sweep(q, c, KT, D, Ct, n, scale, s); break;
static void scores(const float *const *q, int nq, const float *KT, int D, int Ct, int n, float scale, float *s) {
    switch (nq) { ATT_CASE(1) ATT_CASE(2) ATT_CASE(3) ATT_CASE(4) ATT_CASE(5) ATT_CASE(6) }
}
#undef ATT_CASE
#define ATT_CASE(c) case c: value_sweep(p, c, V, D, n, inv, out); break;
static void values_mix(const float *const *p, int nq, const float *V, int D, int n, const float *inv, float *const *out) {
    switch (nq) { ATT_CASE(1) ATT_CASE(2) ATT_CASE(3) ATT_CASE(4) ATT_CASE(5) ATT_CASE(6) }
}
#undef ATT_CASE

/* scores s [0, n) -> exp(s - max), zeros on [n, upto); returns 1 / their sum (16 lanes, a fixed tree) */
static float softmax_exp(float *s, int n, int upto) {
    v16 lanes = load16(s);  /* the largest score, 16 lanes at a time (any order gives the same) */
    int j = 16;
    for (; j + 16 <= n; j += 16) {
        v16 v = load16(s + j);
        v16i more = v > lanes;  /* -1 where v is larger */
        lanes = (v16)(((v16i)v & more) | ((v16i)lanes & ~more));
    }
    float top = s[0];
    for (int l = 0; l < 16 && l < n; l++) top = lanes[l] > top ? lanes[l] : top;
    for (; j < n; j++) top = s[j] > top ? s[j] : top;
    for (int j = 0; j < n; j++) s[j] = fast_exp(s[j] - top);
    float inv = 1.0f / sum16(s, n);
    for (int j = n; j < upto; j++) s[j] = 0.0f;
    return inv;
}

/* attention of T rows (query heads in qkv rows of `width`, at positions L..L+T-1, each over cache
 * rows [0, its position]) for one layer; the keys transposed ([kv_heads][head_dim][capacity rounded
 * up to 16]), the values as the cache holds them. The queries that share a kv head (its group's
 * heads in all T rows) go through its keys and values together, ATT_Q at a time; a query's
 * numbers are the same in any company (its sums in fixed orders, zeros past its own positions). */
static void attend(const Model *m, const float *qkv, int width, int T, int L, const float *keys_t,
                   const float *values, float *out, float *scratch) {
    int D = m->head_dim, C = m->capacity, Ct = padded16(C), group = m->n_heads / m->kv_heads, Q = T * group;
    int chunks = (Q + ATT_Q - 1) / ATT_Q, size = (Q + chunks - 1) / chunks;
    for (int h = 0; h < m->kv_heads; h++) {
        const float *KT = keys_t + (size_t)h * D * Ct, *V = values + (size_t)h * C * D;
        for (int c0 = 0; c0 < Q; c0 += size) {
            int nq = Q - c0 < size ? Q - c0 : size, n = L + (c0 + nq - 1) / group + 1;  /* the last query's positions */
            const float *q[ATT_Q], *p[ATT_Q];
            float *o[ATT_Q], inv[ATT_Q];
            for (int i = 0; i < nq; i++) {
                int t = (c0 + i) / group, head = h * group + (c0 + i) % group;
                q[i] = qkv + (size_t)t * width + head * D;
                o[i] = out + (size_t)t * m->n_heads * D + head * D;
                p[i] = scratch + (size_t)i * Ct;
            }
            scores(q, nq, KT, D, Ct, n, m->attn_scale, scratch);
            for (int i = 0; i < nq; i++) inv[i] = softmax_exp(scratch + (size_t)i * Ct, L + (c0 + i) / group + 1, n);
            values_mix(p, nq, V, D, n, inv, o);
        }
    }
}

/* ---- the pass --------------------------------------------------------------------------------- */

typedef struct { float *resid, *h, *qkv, *attn, *mix, *gu, *scores; Work w; } Scratch;

static int max3(int a, int b, int c) { return a > b ? (a > c ? a : c) : (b > c ? b : c); }

static int max_width(const Model *m) {  /* the widest output of a linear */
    int w = max3(2 * m->inter, m->vocab, (m->n_heads + 2 * m->kv_heads) * m->head_dim);
    return max3(w, m->n_draft * m->hidden, m->chained ? m->heads_vocab.n : 0);
}

static int mix_width(const Model *m) {  /* attention rows, then the MLP's gated rows */
    return max3(m->n_heads * m->head_dim, m->inter, m->hidden);
}

/* the parts of a pass's scratch, in floats: [resid, h, attn, mix, qkv, gu, tmp, scores, amax, xs, bs,
 * xc, q]; `rows` = the call's rows or the heads' */
static void parts(const Model *m, long rows, long *size) {
    long H = m->hidden, W = max_width(m), blocks = rows * mix_width(m) / Q4_BLOCK + rows;
    long sizes[13] = {rows * H, rows * H, rows * mix_width(m), 2 * rows * H, rows * W, rows * W, 2 * rows * W,
                      ATT_Q * padded16(m->capacity), rows, blocks, blocks, blocks, (2 * rows * W + 3) / 4};
    memcpy(size, sizes, sizeof sizes);
}

/* floats of scratch a pass of T tokens needs */
long sol_scratch_floats(const Model *m, int T) {
    long size[13], total = 64;
    parts(m, T > m->n_draft ? T : m->n_draft, size);
    for (int i = 0; i < 13; i++) total += size[i];
    return total;
}

static Scratch carve(const Model *m, int T, float *s) {
    long size[13];
    float *at[13];
    parts(m, T > m->n_draft ? T : m->n_draft, size);
    for (int i = 0; i < 13; i++) at[i] = s, s += size[i];
    Scratch c = {at[0], at[1], at[4], at[2], at[3], at[5], at[7],
                 {(uint8_t *)at[12], at[6], at[8], at[9], at[10], (int32_t *)at[11], m->threads > 1 ? m->threads : 1}};
    return c;
}

static void embed_row(const Model *m, int64_t id, float *out) {
    int H = m->hidden;
    if (m->embed) {
        memcpy(out, m->embed + (size_t)id * H, sizeof(float) * H);
        return;
    }
    const uint8_t *q = m->embed_q8 + (size_t)id * H;
    const float *scale = m->embed_scales + (size_t)id * (H / Q4_BLOCK);
    for (int i = 0; i < H; i++) out[i] = (float)((int)q[i] - 128) * scale[i / Q4_BLOCK];
}

static void attention_block(const Model *m, int i, int T, int L, float *kv, float *keys_t, Scratch *s) {
    const Layer *ly = &m->layers[i];
    int H = m->hidden, D = m->head_dim, nq = m->n_heads * D, nkv = m->kv_heads * D, C = m->capacity;
    int width = nq + 2 * nkv, Ct = padded16(C);
    float *keys = kv + (size_t)(2 * i) * m->kv_heads * C * D, *values = keys + (size_t)m->kv_heads * C * D;
    float *kt = keys_t + (size_t)i * m->kv_heads * D * Ct;
    for (int t = 0; t < T; t++) rms_norm(s->resid + t * H, ly->ln1, s->h + t * H, H, m->eps);
    linear(&ly->qkv, s->h, T, s->qkv, &s->w);
    for (int t = 0; t < T; t++) {
        int pos = L + t;
        float *row = s->qkv + t * width;
        const float *cs = m->cos + (size_t)pos * D / 2, *sn = m->sin + (size_t)pos * D / 2;
        for (int h = 0; h < m->n_heads; h++) rotate(row + h * D, cs, sn, D);
        for (int h = 0; h < m->kv_heads; h++) {
            rotate(row + nq + h * D, cs, sn, D);
            memcpy(keys + ((size_t)h * C + pos) * D, row + nq + h * D, sizeof(float) * D);
            for (int d = 0; d < D; d++) kt[((size_t)h * D + d) * Ct + pos] = row[nq + h * D + d];
            memcpy(values + ((size_t)h * C + pos) * D, row + nq + nkv + h * D, sizeof(float) * D);
        }
    }
    attend(m, s->qkv, width, T, L, kt, values, s->attn, s->scores);
    linear(&ly->o, s->attn, T, s->mix, &s->w);
    for (int t = 0; t < T * H; t++) s->resid[t] += s->mix[t];
}

static void mlp_block(const Model *m, int i, int T, Scratch *s) {
    const Layer *ly = &m->layers[i];
    int H = m->hidden, I = m->inter;
    for (int t = 0; t < T; t++) rms_norm(s->resid + t * H, ly->ln2, s->h + t * H, H, m->eps);
    linear(&ly->gate_up, s->h, T, s->gu, &s->w);
    for (int t = 0; t < T; t++) {
        float *g = s->gu + t * 2 * I;
        for (int j = 0; j < I; j++) s->attn[t * I + j] = silu(g[j]) * g[I + j];  /* attn: free until the next layer */
    }
    linear(&ly->down, s->attn, T, s->mix, &s->w);
    for (int t = 0; t < T * H; t++) s->resid[t] += s->mix[t];
}

/* plain heads' guesses at one final hidden row: head j = argmax w2_j(row + silu(w1_j row)) + offset */
static void draft_heads(const Model *m, const float *row, Scratch *s, int64_t *head_ids) {
    int H = m->hidden, K = m->n_draft;
    linear(&m->heads_w1, row, 1, s->gu, &s->w);
    for (int j = 0; j < K; j++)
        for (int d = 0; d < H; d++) s->mix[j * H + d] = row[d] + silu(s->gu[j * H + d]);
    for (int j = 0; j < K; j++) {
        linear(&m->heads_w2[j], s->mix + j * H, 1, s->qkv, &s->w);
        head_ids[j] = argmax(s->qkv, m->heads_w2[j].n) + m->head_offset;
    }
}

/* chained heads, one after another: head j reads the row and the embedding e of the token before its
 * guess (the row's own argmax `prev` for the first): argmax vocab(row + silu(w1_j row + prev_j e)) */
static void chained_heads(const Model *m, const float *row, int64_t prev, Scratch *s, int64_t *head_ids) {
    int H = m->hidden;
    float *u = s->gu, *e = s->mix, *v = s->mix + H, *hj = s->attn;
    linear(&m->heads_w1, row, 1, u, &s->w);
    for (int j = 0; j < m->n_draft; j++) {
        embed_row(m, prev, e);
        linear(&m->heads_prev[j], e, 1, v, &s->w);
        for (int d = 0; d < H; d++) hj[d] = row[d] + silu(u[j * H + d] + v[d]);
        linear(&m->heads_vocab, hj, 1, s->qkv, &s->w);
        head_ids[j] = prev = argmax(s->qkv, m->heads_vocab.n);
    }
}

/* floats of the transposed keys a session keeps beside its cache (sol_run's keys_t) */
long sol_keys_t_floats(const Model *m) {
    return (long)m->n_layers * m->kv_heads * m->head_dim * padded16(m->capacity);
}

/* keys_t rows [L0, L1) from the cache's keys, after another engine wrote them (a prefill graph) */
void sol_sync_keys(const Model *m, const float *kv, float *keys_t, int L0, int L1) {
    int D = m->head_dim, C = m->capacity, Ct = padded16(C);
    for (int i = 0; i < m->n_layers; i++) {
        const float *keys = kv + (size_t)(2 * i) * m->kv_heads * C * D;
        float *kt = keys_t + (size_t)i * m->kv_heads * D * Ct;
        for (int h = 0; h < m->kv_heads; h++)
            for (int pos = L0; pos < L1; pos++)
                for (int d = 0; d < D; d++) kt[((size_t)h * D + d) * Ct + pos] = keys[((size_t)h * C + pos) * D + d];
    }
}

/* One call: ids [T] after L cached positions (kv: [2 * layers][kv_heads][capacity][head_dim], the
 * new rows written at L..L+T-1, and keys_t the same keys transposed, sol_keys_t_floats); logits
 * [rows][vocab] and probs [rows] of the last `rows` ids. With draft heads: accepted [2] = n, how
 * many of the last rows - 1 ids equal the argmax of the row before each (the first mismatch), and
 * the argmax of row n; the heads' guesses at row n with heads_on 1, or with 2 where a guess was
 * rejected (n < rows - 1: a pass that may end the answer needs them only then), else zeros.
 * Returns 0, or -1 for arguments out of range (checked by the caller too). */
int sol_run(const Model *m, const int64_t *ids, int T, int L, int rows, int heads_on, float *kv, float *keys_t,
            float *logits, float *probs, int64_t *accepted, int64_t *head_ids, float *scratch) {
    if (T < 1 || rows < 1 || rows > T || L < 0 || L + T > m->capacity) return -1;
    for (int t = 0; t < T; t++)
        if (ids[t] < 0 || ids[t] >= m->vocab) return -1;
    int H = m->hidden;
    Scratch s = carve(m, T, scratch);
    for (int t = 0; t < T; t++) embed_row(m, ids[t], s.resid + t * H);
    for (int i = 0; i < m->n_layers; i++) {
        attention_block(m, i, T, L, kv, keys_t, &s);
        mlp_block(m, i, T, &s);
    }
    int first = T - rows;
    for (int r = 0; r < rows; r++) rms_norm(s.resid + (first + r) * H, m->final_norm, s.h + r * H, H, m->eps);
    linear(&m->lm_head, s.h, rows, logits, &s.w);
    int n = rows - 1, best_n = 0;
    for (int r = 0; r < rows; r++) {
        const float *row = logits + (size_t)r * m->vocab;
        int best = argmax(row, m->vocab);
        probs[r] = top_prob(row, m->vocab, row[best], s.gu);
        if (r == n) best_n = best;
        if (n == rows - 1 && r < n && ids[first + r + 1] != best) n = r, best_n = best;  /* the first guess missed */
    }
    if (m->n_draft) {
        accepted[0] = n, accepted[1] = best_n;
        if (!heads_on || (heads_on == 2 && n == rows - 1))
            memset(head_ids, 0, sizeof(int64_t) * m->n_draft);
        else if (m->chained)
            chained_heads(m, s.h + n * H, best_n, &s, head_ids);
        else
            draft_heads(m, s.h + n * H, &s, head_ids);
    }
    return 0;
}
