/* The float parts of the pass, written once in portable C (GCC vector extensions) and compiled into
 * every variant with that variant's flags: each variant's table points at its own copy. The order
 * of every sum is fixed here (16 lanes, then a fixed tree); the compiler contracts nothing
 * (-ffp-contract=off) and the attention sweeps fuse where the code says so (fma16: fmaf per lane,
 * one vfmadd / fmla where the variant has FMA), so every variant gets these numbers bit for bit;
 * they are the reference's. Included by each kernels_*.c (and walk.h through it). */
#ifndef SOL_KERNELS_PORTABLE_H
#define SOL_KERNELS_PORTABLE_H

#include <math.h>
#include <string.h>

#include "sizes.h"

/* 16 floats as one value (one zmm with AVX-512, two ymm with AVX2, four q registers on NEON) */
typedef float v16 __attribute__((vector_size(64)));
typedef float v16u __attribute__((vector_size(64), aligned(4), may_alias));
typedef int32_t v16i __attribute__((vector_size(64)));
static inline v16 load16(const float *p) { return *(const v16u *)p; }
static inline void store16(float *p, v16 v) { *(v16u *)p = v; }

static inline float tree16(const float *a) {
    float b[8], c[4];
    for (int i = 0; i < 8; i++) b[i] = a[i] + a[i + 8];
    for (int i = 0; i < 4; i++) c[i] = b[i] + b[i + 4];
    return (c[0] + c[2]) + (c[1] + c[3]);
}

static inline float dot(const float *a, const float *b, int n) {  /* n % 16 == 0 */
    float acc[16] = {0};
    for (int i = 0; i < n; i += 16)
        for (int l = 0; l < 16; l++) acc[l] += a[i + l] * b[i + l];
    return tree16(acc);
}

static inline float sum16(const float *a, int n) {  /* any n: 16 lanes, the tail in lane 0 */
    float acc[16] = {0};
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; l++) acc[l] += a[i + l];
    for (; i < n; i++) acc[0] += a[i];
    return tree16(acc);
}

/* round half to even for |x| < 2^22 (in the default rounding mode, as nearbyintf): the sum with
 * 1.5 x 2^23 keeps no fraction; past 2^22 callers clamp the result anyway */
#define ROUND_MAGIC 12582912.0f
static inline float round_even(float x) { return (x + ROUND_MAGIC) - ROUND_MAGIC; }

/* 16 lanes' a < b ? c : d, as a mask (GCC's vector ?: is C++ only) */
static inline v16 round_even16(v16 x) { return (x + ROUND_MAGIC) - ROUND_MAGIC; }
static inline v16 select16(v16i mask, v16 c, v16 d) { return (v16)(((v16i)c & mask) | ((v16i)d & ~mask)); }
static inline v16 splat16(float x) { return (v16){0} + x; }
/* a x b + c per lane, fused (fmaf: one rounding), as every variant's FMA instruction computes it */
static inline v16 fmav16(v16 a, v16 b, v16 c) {
    v16 r;
    for (int l = 0; l < 16; l++) r[l] = __builtin_fmaf(a[l], b[l], c[l]);
    return r;
}

/* a + b x c per lane, fused */
static inline v16 fma16(v16 a, float b, v16 c) {
    v16 r;
    for (int l = 0; l < 16; l++) r[l] = __builtin_fmaf(b, c[l], a[l]);
    return r;
}

/* exp(x) for x <= 0 down to about -87 (softmax and sigmoid arguments are clamped): 2^n * p(r),
 * r = x - n ln2 in [-ln2/2, ln2/2] (two fused steps), a degree-6 polynomial in fused
 * multiply-adds (Horner), ~2 ulp; 16 lanes, or one. */
static inline v16 fast_exp16(v16 x) {
    x = select16(x < -87.0f, splat16(-87.0f), select16(x > 88.0f, splat16(88.0f), x));
    v16 n = (x * 1.44269504f + ROUND_MAGIC) - ROUND_MAGIC;
    v16 r = fmav16(n, splat16(-1.42860677e-6f), fmav16(n, splat16(-0.693145752f), x));
    v16 p = fmav16(splat16(1.0f / 720), r, splat16(1.0f / 120));
    p = fmav16(p, r, splat16(1.0f / 24));
    p = fmav16(p, r, splat16(1.0f / 6));
    p = fmav16(p, r, splat16(0.5f));
    p = fmav16(p, r, splat16(1.0f));
    p = fmav16(p, r, splat16(1.0f));
    v16i e = (__builtin_convertvector(n, v16i) + 127) << 23;
    return p * (v16)e;
}

static inline float fast_exp(float x) {  /* one lane of fast_exp16, the same operations */
    x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
    float n = round_even(x * 1.44269504f);
    float r = __builtin_fmaf(n, -1.42860677e-6f, __builtin_fmaf(n, -0.693145752f, x));
    float p = __builtin_fmaf(1.0f / 720, r, 1.0f / 120);
    p = __builtin_fmaf(p, r, 1.0f / 24);
    p = __builtin_fmaf(p, r, 1.0f / 6);
    p = __builtin_fmaf(p, r, 0.5f);
    p = __builtin_fmaf(p, r, 1.0f);
    p = __builtin_fmaf(p, r, 1.0f);
    union { float f; int32_t i; } s = {.i = ((int32_t)n + 127) << 23};
    return p * s.f;
}

static inline float silu(float x) { return x / (1.0f + fast_exp(-x)); }
static inline v16 silu16(v16 x) { return x / (1.0f + fast_exp16(-x)); }

static inline uint8_t to_u8(float v) { return (uint8_t)(v < 0 ? 0 : (v > 255 ? 255 : v)); }

/* ---- portable kernels (a variant may override any with its own, equal numbers) ---------------- */

/* u8 = round(x / step) + 64, saturated to [0, 255] */
static inline void portable_quantize(const float *x, uint8_t *q, int n, float step) {
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        v16 v = round_even16(load16(x + i) / step) + ZERO_POINT;
        v = select16(v < 0.0f, splat16(0.0f), select16(v > 255.0f, splat16(255.0f), v));
        v16i u = __builtin_convertvector(v, v16i);
        for (int l = 0; l < 16; l++) q[i + l] = (uint8_t)u[l];
    }
    for (; i < n; i++) q[i] = to_u8(round_even(x[i] / step) + ZERO_POINT);
}

/* a row on its own |max| ("rows", "dual"): unit = x / |max|, q = round(unit / step) + 64 and, with
 * `fine`, what that left in steps 128 times finer; returns the |max| */
static inline float portable_quantize_row(const float *x, uint8_t *q, uint8_t *fine, int n) {
    const float step = 1.0f / ZERO_POINT, fine_step = step / (2 * ZERO_POINT);
    float amax = 1e-30f;  /* an all-zero row stays zero */
    for (int i = 0; i < n; i++) amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
    for (int i = 0; i < n; i++) {
        float unit = x[i] / amax;
        q[i] = to_u8(round_even(unit / step) + ZERO_POINT);
        if (fine) fine[i] = to_u8(round_even((unit - (float)(q[i] - ZERO_POINT) * step) / fine_step) + ZERO_POINT);
    }
    return amax;
}

/* one row to int8 per block of 32: q = round(x * 127 / |max|) with scale xs = |max| / 127, xc = 8 x
 * the sum of q (the weights' implicit zero point 8), bs = the sum of x (for the mins term) */
static inline void portable_quantize_blocks(const float *x, int8_t *q, int k, float *xs, float *bs, int32_t *xc) {
    for (int b = 0; b < k / Q4_BLOCK; b++) {
        const float *v = x + b * Q4_BLOCK;
        float amax = 0, halves[16];
        for (int i = 0; i < Q4_BLOCK; i++) amax = fabsf(v[i]) > amax ? fabsf(v[i]) : amax;
        float inv = amax > 0 ? 127.0f / amax : 0.0f;
        int32_t sum = 0;
        for (int i = 0; i < Q4_BLOCK; i++) {
            q[b * Q4_BLOCK + i] = (int8_t)round_even(v[i] * inv);
            sum += q[b * Q4_BLOCK + i];
        }
        for (int l = 0; l < 16; l++) halves[l] = v[l] + v[l + 16];
        xs[b] = amax / 127.0f, bs[b] = tree16(halves), xc[b] = 8 * sum;
    }
}

/* the end of an argmax: the 16 lanes' largest with the smallest index, then x [i, n) one by one */
static inline int argmax_lanes(const float *top, const int *at, const float *x, int i, int n) {
    int best = at[0];
    float m = top[0];
    for (int l = 1; l < 16; l++)
        if (top[l] > m || (top[l] == m && at[l] < best)) { m = top[l]; best = at[l]; }
    for (; i < n; i++)
        if (x[i] > m) { m = x[i]; best = i; }
    return best;
}

/* the first largest, as ONNX ArgMax: 16 lanes each keep their first largest, then the lanes'
 * largest with the smallest index */
static inline int portable_argmax(const float *x, int n) {
    float top[16];
    int at[16], i = 16;
    for (int l = 0; l < 16; l++) { top[l] = l < n ? x[l] : -INFINITY; at[l] = l; }
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; l++) {
            int more = x[i + l] > top[l];
            top[l] = more ? x[i + l] : top[l];
            at[l] = more ? i + l : at[l];
        }
    return argmax_lanes(top, at, x, i, n);
}

/* the largest softmax probability of a row whose largest value is m: 1 / sum exp(x - m) */
static inline float portable_top_prob(const float *x, int n, float m, float *tmp) {
    (void)tmp;
    v16 acc = {0};  /* sum16's lanes and order */
    int i = 0;
    for (; i + 16 <= n; i += 16) acc += fast_exp16(load16(x + i) - m);
    for (; i < n; i++) acc[0] += fast_exp(x[i] - m);
    float lanes[16];
    store16(lanes, acc);
    return 1.0f / tree16(lanes);
}

/* scores s [0, n) -> exp(s - max), zeros on [n, upto); returns 1 / their sum (16 lanes, a fixed tree) */
static inline float portable_softmax_exp(float *s, int n, int upto) {
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
    for (j = 0; j + 16 <= n; j += 16) store16(s + j, fast_exp16(load16(s + j) - top));
    for (; j < n; j++) s[j] = fast_exp(s[j] - top);
    float inv = 1.0f / sum16(s, n);
    for (int j = n; j < upto; j++) s[j] = 0.0f;
    return inv;
}

static inline void portable_silu_gate(const float *g, int I, float *out) {
    int j = 0;
    for (; j + 16 <= I; j += 16) store16(out + j, silu16(load16(g + j)) * load16(g + I + j));
    for (; j < I; j++) out[j] = silu(g[j]) * g[I + j];
}

/* the scores s [nq][Ct] at positions [0, n rounded up to 16) of nq <= ATT_Q query vectors q[i]
 * against one kv head's keys KT (sizes.h's tiles of 16 positions): each key vector loaded once for all of
 * them. A score is a sum over d in four chains (d mod 4) added in one order, whatever nq is. */
static inline __attribute__((always_inline)) void score_sweep(const float *const *q, const int nq, const float *KT,
                                                             int D, int Ct, int n, float scale, float *s) {
    for (int j0 = 0; j0 < n; j0 += 16) {
        v16 a[ATT_Q][4];
#pragma GCC unroll 6
        for (int i = 0; i < nq; i++) a[i][0] = a[i][1] = a[i][2] = a[i][3] = (v16){0};
        for (int d = 0; d < D; d += 4) {
            const float *k = key_row(KT, D, j0, d);
            v16 k0 = load16(k), k1 = load16(k + KEY_TILE), k2 = load16(k + 2 * KEY_TILE), k3 = load16(k + 3 * KEY_TILE);
#pragma GCC unroll 6
            for (int i = 0; i < nq; i++) {
                a[i][0] = fma16(a[i][0], q[i][d], k0);
                a[i][1] = fma16(a[i][1], q[i][d + 1], k1);
                a[i][2] = fma16(a[i][2], q[i][d + 2], k2);
                a[i][3] = fma16(a[i][3], q[i][d + 3], k3);
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
                a[i][0] = fma16(a[i][0], p[i][j], v0);
                a[i][1] = fma16(a[i][1], p[i][j], v1);
                a[i][2] = fma16(a[i][2], p[i][j], v2);
                a[i][3] = fma16(a[i][3], p[i][j], v3);
            }
        }
#pragma GCC unroll 6
        for (int i = 0; i < nq; i++)
            for (int c = 0; c < 4; c++) store16(out[i] + d0 + 16 * c, a[i][c] * inv[i]);
    }
    for (; d0 < D; d0 += 16)
        for (int i = 0; i < nq; i++) {
            v16 acc = {0};
            for (int j = 0; j < n; j++) acc = fma16(acc, p[i][j], load16(V + (size_t)j * D + d0));
            store16(out[i] + d0, acc * inv[i]);
        }
}

#define ATT_CASE(c) case c: score_sweep(q, c, KT, D, Ct, n, scale, s); break;
static inline void portable_scores(const float *const *q, int nq, const float *KT, int D, int Ct, int n, float scale,
                                   float *s) {
    switch (nq) { ATT_CASE(1) ATT_CASE(2) ATT_CASE(3) ATT_CASE(4) ATT_CASE(5) ATT_CASE(6) }
}
#undef ATT_CASE
#define ATT_CASE(c) case c: value_sweep(p, c, V, D, n, inv, out); break;
static inline void portable_values_mix(const float *const *p, int nq, const float *V, int D, int n, const float *inv,
                                       float *const *out) {
    switch (nq) { ATT_CASE(1) ATT_CASE(2) ATT_CASE(3) ATT_CASE(4) ATT_CASE(5) ATT_CASE(6) }
}
#undef ATT_CASE

/* a variant's table: its name, its GEMMs, then the kernels it overrides or the portable ones */
#define PORTABLE_FLOAT_KERNELS \
    .quantize_row = portable_quantize_row, .quantize_blocks = portable_quantize_blocks, \
    .top_prob = portable_top_prob, .softmax_exp = portable_softmax_exp, .scores = portable_scores, \
    .values_mix = portable_values_mix, .silu_gate = portable_silu_gate

#endif
