/* Runs the native pass on a dump of a model's packed weights and a sequence of calls, with the kernel
 * variants named on the command line, for the NEON check (tests/test_native_isa.py): built with
 * aarch64-linux-gnu-gcc, run under qemu-aarch64 -cpu max.
 *
 *   driver DUMP OUT VARIANT...   writes OUT.VARIANT per variant: for each call, logits [rows][vocab],
 *                                probs [rows] (float32), accepted [2] and head_ids [n_draft] (int64)
 *
 * DUMP (little endian, written by the test): "SOLDUMP1", u32 arrays, each u64 bytes + bytes; the
 * Model struct (LP64 layout, the same on x86-64 and aarch64) whose pointers hold array index + 1
 * (0: NULL); u32 calls, each i32 T, L, rows, heads_on and T int64 ids. Exit 0, or 1 with a message. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pass.h"

long sol_scratch_floats(const Model *m, int T);
long sol_keys_t_floats(const Model *m);
int sol_run(const Model *m, const int64_t *ids, int T, int L, int rows, int heads_on, float *kv, float *keys_t,
            float *logits, float *probs, int64_t *accepted, int64_t *head_ids, float *scratch);

static void *arrays[4096];
static uint32_t n_arrays;

static void die(const char *what) {
    fprintf(stderr, "driver: %s\n", what);
    exit(1);
}

static void take(FILE *f, void *p, size_t n) {
    if (fread(p, 1, n, f) != n) die("short dump");
}

static void fix(const void **p) {  /* index + 1 -> the array */
    uintptr_t i = (uintptr_t)*p;
    if (i > n_arrays) die("bad array index");
    *p = i ? arrays[i - 1] : NULL;
}

static void fix_linear(Linear *L) {
    fix((const void **)&L->w), fix((const void **)&L->zp_sums), fix((const void **)&L->scale);
}

static void fix_model(Model *m) {
    const void **floats[] = {(const void **)&m->embed, (const void **)&m->embed_q8, (const void **)&m->embed_scales,
                             (const void **)&m->cos, (const void **)&m->sin, (const void **)&m->final_norm};
    for (size_t i = 0; i < sizeof floats / sizeof floats[0]; i++) fix(floats[i]);
    for (int i = 0; i < MAX_LAYERS; i++) {
        Layer *ly = &m->layers[i];
        fix((const void **)&ly->ln1), fix((const void **)&ly->ln2);
        fix_linear(&ly->qkv), fix_linear(&ly->o), fix_linear(&ly->gate_up), fix_linear(&ly->down);
    }
    fix_linear(&m->lm_head), fix_linear(&m->heads_w1), fix_linear(&m->heads_vocab);
    for (int j = 0; j < MAX_HEADS; j++) fix_linear(&m->heads_w2[j]), fix_linear(&m->heads_prev[j]);
    m->kernels = NULL;
}

static void run(const Model *m, FILE *f, long calls_at, FILE *out) {
    uint32_t calls;
    fseek(f, calls_at, SEEK_SET);
    take(f, &calls, 4);
    size_t kv_n = (size_t)2 * m->n_layers * m->kv_heads * m->capacity * m->head_dim;
    float *kv = calloc(kv_n, 4), *keys_t = calloc(sol_keys_t_floats(m), 4);
    float *scratch = calloc(sol_scratch_floats(m, m->capacity), 4);
    float *logits = malloc((size_t)m->capacity * m->vocab * 4), *probs = malloc((size_t)m->capacity * 4);
    int64_t ids[4096], accepted[2], heads[MAX_HEADS];
    for (uint32_t c = 0; c < calls; c++) {
        int32_t a[4];
        take(f, a, sizeof a);
        if (a[0] < 1 || a[0] > 4096) die("bad call");
        take(f, ids, (size_t)a[0] * 8);
        memset(accepted, 0, sizeof accepted), memset(heads, 0, sizeof heads);
        if (sol_run(m, ids, a[0], a[1], a[2], a[3], kv, keys_t, logits, probs, accepted, heads, scratch)) die("sol_run refused a call");
        fwrite(logits, 4, (size_t)a[2] * m->vocab, out), fwrite(probs, 4, a[2], out);
        fwrite(accepted, 8, 2, out), fwrite(heads, 8, m->n_draft, out);
    }
    free(kv), free(keys_t), free(scratch), free(logits), free(probs);
}

int main(int argc, char **argv) {
    if (argc < 4) die("usage: driver DUMP OUT VARIANT...");
    FILE *f = fopen(argv[1], "rb");
    char magic[8];
    if (!f) die("cannot open the dump");
    take(f, magic, 8);
    if (memcmp(magic, "SOLDUMP1", 8)) die("not a dump");
    take(f, &n_arrays, 4);
    if (n_arrays > 4096) die("too many arrays");
    for (uint32_t i = 0; i < n_arrays; i++) {
        uint64_t n;
        take(f, &n, 8);
        arrays[i] = aligned_alloc(64, (n + 63) / 64 * 64 + 64);
        take(f, arrays[i], n);
    }
    Model m;
    take(f, &m, sizeof m);
    fix_model(&m);
    long calls_at = ftell(f);
    for (int v = 3; v < argc; v++) {
        m.kernels = sol_kernels(argv[v]);
        if (!m.kernels) die("a variant this CPU does not run");
        char path[4096];
        snprintf(path, sizeof path, "%s.%s", argv[2], argv[v]);
        FILE *out = fopen(path, "wb");
        if (!out) die("cannot write the output");
        run(&m, f, calls_at, out);
        fclose(out);
    }
    return 0;
}
