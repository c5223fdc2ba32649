/* One decoder pass of a quantized Llama in the fused graph layout, in C: this file holds the library's
 * entry points; walk.h walks the model, compiled into each instruction set's kernel file with that
 * file's kernels (pass.h's Kernels table), the variant chosen when the library loads from a CPU
 * probe (dispatch.c) or per model (Model.kernels).
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
#include "sizes.h"

static const Kernels *kernels_of(const Model *m) { return m->kernels ? m->kernels : sol_kernels_best(); }

long sol_scratch_floats(const Model *m, int T) { return scratch_floats(m, T); }

/* floats of the keys a session keeps beside its cache in tiles of 16 positions (sizes.h; sol_run's keys_t) */
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
                for (int d = 0; d < D; d++) kt[key_index(D, Ct, h, d, pos)] = keys[((size_t)h * C + pos) * D + d];
    }
}

/* One call: ids [T] after L cached positions (kv: [2 * layers][kv_heads][capacity][head_dim], the
 * new rows written at L..L+T-1, and keys_t the same keys in tiles, sol_keys_t_floats); logits
 * [rows][vocab] and probs [rows] of the last `rows` ids. With draft heads: accepted [2] = n, how
 * many of the last rows - 1 ids equal the argmax of the row before each (the first mismatch), and
 * the argmax of row n; the heads' guesses at row n with heads_on 1, or with 2 where a guess was
 * rejected (n < rows - 1: a pass that may end the answer needs them only then), else zeros.
 * Returns 0, or -1 for arguments out of range (checked by the caller too). */
int sol_run(const Model *m, const int64_t *ids, int T, int L, int rows, int heads_on, float *kv, float *keys_t,
            float *logits, float *probs, int64_t *accepted, int64_t *head_ids, float *scratch) {
    return kernels_of(m)->run(m, ids, T, L, rows, heads_on, kv, keys_t, logits, probs, accepted, head_ids, scratch);
}
