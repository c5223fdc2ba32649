/* The sizes of a pass's buffers (fused_pass.c's entry points and walk.h's carving agree on them). */
#ifndef SOL_SIZES_H
#define SOL_SIZES_H

#include <string.h>

#include "pass.h"

static inline int padded16(int n) { return (n + 15) / 16 * 16; }

/* keys_t, the keys the pass reads (the cache holds them too): per layer and kv head [Ct / 16] tiles of
 * 16 positions, each [head_dim][16], so that a score sweep over 8 or 16 positions streams one tile
 * (a [head_dim][capacity] layout put each dimension's keys a page apart at long capacities) */
#define KEY_TILE 16
static inline size_t key_index(int D, int Ct, int h, int d, int pos) {
    return (size_t)h * D * Ct + (size_t)(pos / KEY_TILE) * KEY_TILE * D + (size_t)d * KEY_TILE + pos % KEY_TILE;
}

/* within one head's tiles KT: the keys at dimension d of positions [j0, j0 + 16 - j0 % 16) */
static inline const float *key_row(const float *KT, int D, int j0, int d) {
    return KT + (size_t)(j0 / KEY_TILE) * KEY_TILE * D + (size_t)d * KEY_TILE + j0 % KEY_TILE;
}

static inline int max3(int a, int b, int c) { return a > b ? (a > c ? a : c) : (b > c ? b : c); }

static inline int max_width(const Model *m) {  /* the widest output of a linear */
    int w = max3(2 * m->inter, m->vocab, (m->n_heads + 2 * m->kv_heads) * m->head_dim);
    return max3(w, m->n_draft * m->hidden, m->chained ? m->heads_vocab.n : 0);
}

static inline int mix_width(const Model *m) {  /* attention rows, then the MLP's gated rows */
    return max3(m->n_heads * m->head_dim, m->inter, m->hidden);
}

/* the parts of a pass's scratch, in floats: [resid, h, attn, mix, qkv, gu, tmp, scores, amax, xs, bs,
 * xc, q]; `rows` = the call's rows or the heads' */
static inline void parts(const Model *m, long rows, long *size) {
    long H = m->hidden, W = max_width(m), blocks = rows * mix_width(m) / Q4_BLOCK + rows;
    long sizes[13] = {rows * H, rows * H, rows * mix_width(m), 2 * rows * H, rows * W, rows * W, 2 * rows * W,
                      ATT_Q * padded16(m->capacity), rows, blocks, blocks, blocks, (2 * rows * W + 3) / 4};
    memcpy(size, sizes, sizeof sizes);
}

/* floats of scratch a pass of T tokens needs */
static inline long scratch_floats(const Model *m, int T) {
    long size[13], total = 64;
    parts(m, T > m->n_draft ? T : m->n_draft, size);
    for (int i = 0; i < 13; i++) total += size[i];
    return total;
}

#endif
