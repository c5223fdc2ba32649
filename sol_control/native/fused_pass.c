/* One decoder pass of a quantized Llama in the fused graph layout, in C: this file walks the model;
 * the kernels it calls come from a table (pass.h's Kernels), one per instruction set, chosen when
 * the library loads from a CPU probe (dispatch.c) or per model (Model.kernels).
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
 * speculative decoding equals plain greedy without a query pad or pairs. Every variant computes
 * generic C's numbers (kernels_generic.c, the reference; tests/test_native_isa.py).
 *
 * int8 linears: y = (sum_k (u8(x) - 64) * w_s8) * channel_scale * a, x quantized to u8 on a step
 * of a / 64 (round half to even, saturated): a = the calibrated |max| ("static"), the row's own
 * |max| ("rows"), or the row's |max| with what the 7 bits left as a second row 128 times finer
 * ("dual"); weights packed as [ceil(n / 16)][k / 4][16][4] (vpdpbusd's, sdot's and vpmaddubsw's order).
 * int4 linears: w = (q - 8) * scale per block of 32 inputs plus a per-block "min", x quantized to
 * int8 per block (|max| / 127, as ONNX Runtime's MatMulNBits at accuracy level 4); records of 16
 * outputs x 32 inputs (256 bytes of nibbles, 16 scales, 16 mins).
 * Built by sol_control/native/build.py (`make native`); sol_control.decoding.native loads it with ctypes.
 */
#include "kernels_portable.h"

#define PARALLEL_MIN (1L << 18)  /* weights of a linear worth splitting over threads (SmolLM2's are ~0.3-1.8 M) */

static const Kernels *kernels_of(const Model *m) { return m->kernels ? m->kernels : sol_kernels_best(); }

static void rms_norm(const float *x, const float *w, float *y, int n, float eps) {
    float inv = 1.0f / sqrtf(dot(x, x, n) / (float)n + eps);
    for (int i = 0; i < n; i++) y[i] = x[i] * inv * w[i];
}

/* ---- linears ------------------------------------------------------------------------------ */

typedef struct { uint8_t *q; float *tmp, *amax, *xs, *bs; int32_t *xc; int threads; const Kernels *K; } Work;  /* a linear's scratch */

/* a part of n items for thread t of `parts`, in multiples of `step` */
static void split(int n, int step, int t, int parts, int *lo, int *hi) {
    int units = (n + step - 1) / step;
    *lo = units * t / parts * step;
    *hi = units * (t + 1) / parts * step;
    *hi = *hi < n ? *hi : n;
}

/* y [R][n] = u8 rows q [R][k] through the int8 weights: (sum - zero point sums) * scale; wide
 * linears' column blocks split over the threads (each output computed by one, the same way) */
static void gemm_s8(const Kernels *K, const Linear *L, const uint8_t *q, int R, float *y, int threads) {
    int blocks = (L->n + 15) / 16, parts = (long)blocks * L->k >= PARALLEL_MIN ? threads : 1;
    if (parts == 1) {  /* no OpenMP call at all: it costs ~0.3 us a linear even with one thread */
        K->gemm_s8(L, q, R, 0, blocks, y);
        return;
    }
#pragma omp parallel for num_threads(parts) schedule(static)
    for (int t = 0; t < parts; t++) {
        int b0, b1;
        split(blocks, COL_SPLIT, t, parts, &b0, &b1);
        K->gemm_s8(L, q, R, b0, b1, y);
    }
}

/* y [R][n] = rows x [R][k] (float) through an int8 linear of any activation kind */
static void int8_linear(const Linear *L, const float *x, int R, float *y, const Work *w) {
    int k = L->k, n = L->n, dual = L->kind == LIN_DUAL;
    if (L->kind == LIN_STATIC) {
        for (int r = 0; r < R; r++) w->K->quantize(x + (size_t)r * k, w->q + (size_t)r * k, k, L->step);
        gemm_s8(w->K, L, w->q, R, y, w->threads);
        return;
    }
    for (int r = 0; r < R; r++)  /* dual: the R rows, then their R finer rows, one GEMM */
        w->amax[r] = w->K->quantize_row(x + (size_t)r * k, w->q + (size_t)r * k, dual ? w->q + (size_t)(R + r) * k : NULL, k);
    gemm_s8(w->K, L, w->q, dual ? 2 * R : R, dual ? w->tmp : y, w->threads);
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
    for (int r0 = 0; r0 < R; r0 += ROW_BLOCK)
        w->K->q4_rows(L, q + (size_t)r0 * k, w->xs + r0 * nb, w->bs + r0 * nb, w->xc + r0 * nb,
                R - r0 < ROW_BLOCK ? R - r0 : ROW_BLOCK, g0, g1, y + (size_t)r0 * L->n);
}

static void q4_linear(const Linear *L, const float *x, int R, float *y, const Work *w) {
    int k = L->k, nb = k / Q4_BLOCK;
    int8_t *q = (int8_t *)w->q;
    for (int r = 0; r < R; r++)
        w->K->quantize_blocks(x + (size_t)r * k, q + (size_t)r * k, k, w->xs + r * nb, w->bs + r * nb, w->xc + r * nb);
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

/* attention of T rows (query heads in qkv rows of `width`, at positions L..L+T-1, each over cache
 * rows [0, its position]) for one layer; the keys transposed ([kv_heads][head_dim][capacity rounded
 * up to 16]), the values as the cache holds them. The queries that share a kv head (its group's
 * heads in all T rows) go through its keys and values together, ATT_Q at a time; a query's
 * numbers are the same in any company (its sums in fixed orders, zeros past its own positions). */
static void attend(const Model *m, const float *qkv, int width, int T, int L, const float *keys_t,
                   const float *values, float *out, float *scratch) {
    const Kernels *K = kernels_of(m);
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
            K->scores(q, nq, KT, D, Ct, n, m->attn_scale, scratch);
            for (int i = 0; i < nq; i++) inv[i] = K->softmax_exp(scratch + (size_t)i * Ct, L + (c0 + i) / group + 1, n);
            K->values_mix(p, nq, V, D, n, inv, o);
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
                 {(uint8_t *)at[12], at[6], at[8], at[9], at[10], (int32_t *)at[11], m->threads > 1 ? m->threads : 1,
                  kernels_of(m)}};
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
        s->w.K->silu_gate(g, I, s->attn + t * I);  /* attn: free until the next layer */
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
        head_ids[j] = s->w.K->argmax(s->qkv, m->heads_w2[j].n) + m->head_offset;
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
        head_ids[j] = prev = s->w.K->argmax(s->qkv, m->heads_vocab.n);
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
        int best = s.w.K->argmax(row, m->vocab);
        probs[r] = s.w.K->top_prob(row, m->vocab, row[best], s.gu);
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
