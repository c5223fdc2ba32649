/* The walk through the model for one pass (one file, compiled into every variant: each kernels_*.c
 * defines its table, points THIS at it and includes this file, so the walk calls its own variant's
 * kernels directly and its float code gets that variant's vector width). fused_pass.c holds the
 * entry points that pick the variant. */
#ifndef THIS
#error "walk.h is included by a kernels_*.c after it defines THIS, its Kernels table"
#endif
#include "sizes.h"

#define Q4_CHUNK 8  /* 16-output groups of an int4 linear one pass of row blocks reads (8 x k / 32 records) */
#define PARALLEL_MIN (1L << 18)  /* weights of a linear worth splitting over threads (SmolLM2's are ~0.3-1.8 M) */

static void rms_norm(const float *x, const float *w, float *y, int n, float eps) {
    float inv = 1.0f / sqrtf(dot(x, x, n) / (float)n + eps);
    for (int i = 0; i < n; i++) y[i] = x[i] * inv * w[i];
}

/* ---- linears ------------------------------------------------------------------------------ */

typedef struct { uint8_t *q; float *tmp, *amax, *xs, *bs; int32_t *xc; int threads; } Work;  /* a linear's scratch */

/* a part of n items for thread t of `parts`, in multiples of `step` */
static void split(int n, int step, int t, int parts, int *lo, int *hi) {
    int units = (n + step - 1) / step;
    *lo = units * t / parts * step;
    *hi = units * (t + 1) / parts * step;
    *hi = *hi < n ? *hi : n;
}

/* y [R][n] = u8 rows q [R][k] through the int8 weights: (sum - zero point sums) * scale; wide
 * linears' column blocks split over the threads (each output computed by one, the same way) */
static void gemm_s8(const Linear *L, const uint8_t *q, int R, float *y, int threads) {
    int blocks = (L->n + 15) / 16, parts = (long)blocks * L->k >= PARALLEL_MIN ? threads : 1;
    if (parts == 1) {  /* no OpenMP call at all: it costs ~0.3 us a linear even with one thread */
        THIS->gemm_s8(L, q, R, 0, blocks, y);
        return;
    }
#pragma omp parallel for num_threads(parts) schedule(static)
    for (int t = 0; t < parts; t++) {
        int b0, b1;
        split(blocks, COL_SPLIT, t, parts, &b0, &b1);
        THIS->gemm_s8(L, q, R, b0, b1, y);
    }
}

/* y [R][n] = rows x [R][k] (float) through an int8 linear of any activation kind */
static void int8_linear(const Linear *L, const float *x, int R, float *y, const Work *w) {
    int k = L->k, n = L->n, dual = L->kind == LIN_DUAL;
    if (L->kind == LIN_STATIC) {
        for (int r = 0; r < R; r++) THIS->quantize(x + (size_t)r * k, w->q + (size_t)r * k, k, L->step);
        gemm_s8(L, w->q, R, y, w->threads);
        return;
    }
    for (int r = 0; r < R; r++)  /* dual: the R rows, then their R finer rows, one GEMM */
        w->amax[r] = THIS->quantize_row(x + (size_t)r * k, w->q + (size_t)r * k, dual ? w->q + (size_t)(R + r) * k : NULL, k);
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

/* the output groups [g0, g1) of all R rows, 8 rows a sweep */
static void q4_part(const Linear *L, const int8_t *q, const Work *w, int R, int g0, int g1, float *y) {
    int k = L->k, nb = k / Q4_BLOCK;
    for (int c = g0; c < g1; c += Q4_CHUNK)  /* a chunk's records stay in cache while every row block reads them */
        for (int r0 = 0; r0 < R; r0 += ROW_BLOCK)
            THIS->q4_rows(L, q + (size_t)r0 * k, w->xs + r0 * nb, w->bs + r0 * nb, w->xc + r0 * nb,
                          R - r0 < ROW_BLOCK ? R - r0 : ROW_BLOCK, c, g1 - c < Q4_CHUNK ? g1 : c + Q4_CHUNK,
                          y + (size_t)r0 * L->n);
}

static void q4_linear(const Linear *L, const float *x, int R, float *y, const Work *w) {
    int k = L->k, nb = k / Q4_BLOCK;
    int8_t *q = (int8_t *)w->q;
    for (int r = 0; r < R; r++)
        THIS->quantize_blocks(x + (size_t)r * k, q + (size_t)r * k, k, w->xs + r * nb, w->bs + r * nb, w->xc + r * nb);
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



/* attention of T rows (query heads in qkv rows of `width`, at positions L..L+T-1, each over cache
 * rows [0, its position]) for one layer; the keys in keys_t's tiles (sizes.h), the values as the
 * cache holds them. The queries that share a kv head (its group's
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
            THIS->scores(q, nq, KT, D, Ct, n, m->attn_scale, scratch);
            for (int i = 0; i < nq; i++) inv[i] = THIS->softmax_exp(scratch + (size_t)i * Ct, L + (c0 + i) / group + 1, n);
            THIS->values_mix(p, nq, V, D, n, inv, o);
        }
    }
}

/* ---- the pass --------------------------------------------------------------------------------- */

typedef struct { float *resid, *h, *qkv, *attn, *mix, *gu, *scores; Work w; } Scratch;

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

/* one layer's attention for T rows at positions L..L+T-1: every row's keys and values go into the
 * cache, the queries, their mix and the residual only for the last `keep` rows (the final layer of a
 * pass needs no more than the rows it returns; a row's numbers do not depend on its company) */
static void attention_block(const Model *m, int i, int T, int keep, int L, float *kv, float *keys_t, Scratch *s) {
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
            for (int d = 0; d < D; d++) kt[key_index(D, Ct, h, d, pos)] = row[nq + h * D + d];
            memcpy(values + ((size_t)h * C + pos) * D, row + nq + nkv + h * D, sizeof(float) * D);
        }
    }
    int first = T - keep;
    attend(m, s->qkv + (size_t)first * width, width, keep, L + first, kt, values, s->attn, s->scores);
    linear(&ly->o, s->attn, keep, s->mix, &s->w);
    for (int t = 0; t < keep * H; t++) s->resid[first * H + t] += s->mix[t];
}

/* one layer's MLP for the T rows of the residual from row `first` on */
static void mlp_block(const Model *m, int i, int first, int T, Scratch *s) {
    const Layer *ly = &m->layers[i];
    int H = m->hidden, I = m->inter;
    float *resid = s->resid + (size_t)first * H;
    for (int t = 0; t < T; t++) rms_norm(resid + t * H, ly->ln2, s->h + t * H, H, m->eps);
    linear(&ly->gate_up, s->h, T, s->gu, &s->w);
    for (int t = 0; t < T; t++) {
        float *g = s->gu + t * 2 * I;
        THIS->silu_gate(g, I, s->attn + t * I);  /* attn: free until the next layer */
    }
    linear(&ly->down, s->attn, T, s->mix, &s->w);
    for (int t = 0; t < T * H; t++) resid[t] += s->mix[t];
}

/* plain heads' guesses at one final hidden row: head j = argmax w2_j(row + silu(w1_j row)) + offset */
static void draft_heads(const Model *m, const float *row, Scratch *s, int64_t *head_ids) {
    int H = m->hidden, K = m->n_draft;
    linear(&m->heads_w1, row, 1, s->gu, &s->w);
    for (int j = 0; j < K; j++)
        for (int d = 0; d < H; d += 16) store16(s->mix + j * H + d, load16(row + d) + silu16(load16(s->gu + j * H + d)));
    for (int j = 0; j < K; j++) {
        linear(&m->heads_w2[j], s->mix + j * H, 1, s->qkv, &s->w);
        head_ids[j] = THIS->argmax(s->qkv, m->heads_w2[j].n) + m->head_offset;
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
        for (int d = 0; d < H; d += 16) store16(hj + d, load16(row + d) + silu16(load16(u + j * H + d) + load16(v + d)));
        linear(&m->heads_vocab, hj, 1, s->qkv, &s->w);
        head_ids[j] = prev = THIS->argmax(s->qkv, m->heads_vocab.n);
    }
}

/* sol_run, in this variant (fused_pass.c) */
static int walk_run(const Model *m, const int64_t *ids, int T, int L, int rows, int heads_on, float *kv, float *keys_t,
            float *logits, float *probs, int64_t *accepted, int64_t *head_ids, float *scratch) {
    if (T < 1 || rows < 1 || rows > T || L < 0 || L + T > m->capacity) return -1;
    for (int t = 0; t < T; t++)
        if (ids[t] < 0 || ids[t] >= m->vocab) return -1;
    int H = m->hidden;
    Scratch s = carve(m, T, scratch);
    for (int t = 0; t < T; t++) embed_row(m, ids[t], s.resid + t * H);
    int first = T - rows;
    for (int i = 0; i < m->n_layers; i++) {
        int last = i == m->n_layers - 1, keep = last ? rows : T;  /* the final layer: only the rows returned */
        attention_block(m, i, T, keep, L, kv, keys_t, &s);
        mlp_block(m, i, T - keep, keep, &s);
    }
    for (int r = 0; r < rows; r++) rms_norm(s.resid + (first + r) * H, m->final_norm, s.h + r * H, H, m->eps);
    linear(&m->lm_head, s.h, rows, logits, &s.w);
    int n = rows - 1, best_n = 0;
    for (int r = 0; r < rows; r++) {
        const float *row = logits + (size_t)r * m->vocab;
        int best = THIS->argmax(row, m->vocab);
        probs[r] = THIS->top_prob(row, m->vocab, row[best], s.gu);
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
