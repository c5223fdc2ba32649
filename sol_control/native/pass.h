/* The native pass's shared types: a model's weights (Model, Linear), and the kernel table that each
 * instruction-set variant fills (kernels_*.c): each fills its table, points THIS at it and includes
 * walk.h, the walk through the model compiled with that variant's flags and calling its kernels
 * directly. fused_pass.c holds the entry points; dispatch.c picks the table from a CPU probe.
 * Every variant computes generic C's numbers: the integer sums exactly, the float parts in the order
 * kernels_portable.h fixes (no contraction: everything builds with -ffp-contract=off; an FMA only
 * where the generic code writes one). */
#ifndef SOL_PASS_H
#define SOL_PASS_H

#include <stddef.h>
#include <stdint.h>

#define MAX_LAYERS 64
#define MAX_HEADS 16
#define ROW_BLOCK 8  /* rows per GEMM sweep: each weight vector is loaded once for up to 8 rows */
#define ZERO_POINT 64
#define Q4_BLOCK 32
#define Q4_RECORD 384  /* bytes of one int4 record: 4 x 64 of nibbles, 16 scales, 16 mins */
#define ATT_Q 6        /* query vectors one sweep over a kv head's keys or values serves */
/* bytes ahead of a weight stream that the x86 kernels prefetch: with the hardware's prefetchers alone
 * one core read SmolLM2's weights at ~14 of its ~18 GB/s (docs/BENCHMARKS.md) */
#define PF_AHEAD 3072
#define PF_MIN_WEIGHTS (1 << 20)  /* int8 linears smaller than this stay in cache (the policies': none prefetched) */
#define COL_SPLIT 4    /* a wide int8 linear splits over threads in multiples of this many blocks of 16 */

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

struct Kernels;

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
    const struct Kernels *kernels; /* the variant this model runs (sol_kernels); NULL: the probe's */
} Model;

/* What a variant computes. Rows are independent in every kernel: a row's numbers never depend on
 * the other rows of its call. */
typedef struct Kernels {
    const char *name;
    /* the column blocks [b0, b1) of y [R][n] = (u8 rows q [R][k] . int8 weights - zp) * scale */
    void (*gemm_s8)(const Linear *L, const uint8_t *q, int R, int b0, int b1, float *y);
    /* the 16-output groups [g0, g1) of y [R][n], R <= ROW_BLOCK, through int4 records: int8 blocks q
     * with scales xs, sums bs and 8 x sum(q) xc per block */
    void (*q4_rows)(const Linear *L, const int8_t *q, const float *xs, const float *bs, const int32_t *xc, int R,
                    int g0, int g1, float *y);
    void (*quantize)(const float *x, uint8_t *q, int n, float step);           /* static u8, zero point 64 */
    float (*quantize_row)(const float *x, uint8_t *q, uint8_t *fine, int n);  /* on the row's |max| */
    void (*quantize_blocks)(const float *x, int8_t *q, int k, float *xs, float *bs, int32_t *xc);
    int (*argmax)(const float *x, int n);                                      /* the first largest */
    float (*top_prob)(const float *x, int n, float m, float *tmp);             /* 1 / sum exp(x - m) */
    float (*softmax_exp)(float *s, int n, int upto);
    void (*scores)(const float *const *q, int nq, const float *KT, int D, int Ct, int n, float scale, float *s);
    void (*values_mix)(const float *const *p, int nq, const float *V, int D, int n, const float *inv,
                       float *const *out);
    void (*silu_gate)(const float *g, int I, float *out);                      /* silu(g[j]) * g[I + j] */
    /* the whole pass (walk.h compiled with this table's kernels; sol_run's arguments) */
    int (*run)(const Model *m, const int64_t *ids, int T, int L, int rows, int heads_on, float *kv, float *keys_t,
               float *logits, float *probs, int64_t *accepted, int64_t *head_ids, float *scratch);
} Kernels;

/* what each kernels_*.c declares before its table (walk.h defines it) */
#define DECLARE_WALK                                                                                         \
    static int walk_run(const Model *m, const int64_t *ids, int T, int L, int rows, int heads_on, float *kv, \
                        float *keys_t, float *logits, float *probs, int64_t *accepted, int64_t *head_ids,    \
                        float *scratch);

extern const Kernels sol_kernels_generic;
#if defined(__x86_64__)
extern const Kernels sol_kernels_avx2, sol_kernels_avxvnni, sol_kernels_avxvnni_evex, sol_kernels_avx512vnni;
#elif defined(__aarch64__)
extern const Kernels sol_kernels_neon;
#endif

const Kernels *sol_kernels(const char *name);  /* dispatch.c: a variant this CPU runs, or NULL */
const Kernels *sol_kernels_best(void);

#endif
