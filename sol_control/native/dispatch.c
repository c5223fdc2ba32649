/* Which kernel table runs: a CPU probe when the library loads picks the best variant this CPU
 * executes (as ggml-cpu scores its variants); sol_kernels(name) gives a named one, or NULL when the
 * CPU lacks its instructions (sol_control.native.isa names the missing flags). */
#include <string.h>

#include "pass.h"
#if defined(__aarch64__)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20)
#endif
#endif

/* can this CPU (and its OS: the AVX and AVX-512 states) execute variant k? */
static int runs(const Kernels *k) {
#if defined(__x86_64__)
    __builtin_cpu_init();
    int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    int avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                 __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
    if (k == &sol_kernels_avx512vnni || k == &sol_kernels_avxvnni_evex) return avx512;
    if (k == &sol_kernels_avxvnni) return avx2 && __builtin_cpu_supports("avxvnni");
    if (k == &sol_kernels_avx2) return avx2;
#elif defined(__aarch64__)
    if (k == &sol_kernels_neon) return (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
#endif
    return k == &sol_kernels_generic;
}

/* every variant of this architecture, best first; the probe skips the forced-only ones */
static const Kernels *const VARIANTS[] = {
#if defined(__x86_64__)
    &sol_kernels_avx512vnni, &sol_kernels_avxvnni, &sol_kernels_avx2, &sol_kernels_avxvnni_evex,
#elif defined(__aarch64__)
    &sol_kernels_neon,
#endif
    &sol_kernels_generic,
};
#define N_VARIANTS (int)(sizeof VARIANTS / sizeof VARIANTS[0])

static int forced_only(const Kernels *k) { return strcmp(k->name, "avxvnni_evex") == 0; }

const Kernels *sol_kernels(const char *name) {
    for (int i = 0; i < N_VARIANTS; i++)
        if (strcmp(VARIANTS[i]->name, name) == 0) return runs(VARIANTS[i]) ? VARIANTS[i] : NULL;
    return NULL;
}

const Kernels *sol_kernels_best(void) {
    static const Kernels *best;
    if (!best)
        for (int i = 0; i < N_VARIANTS && !best; i++)
            if (!forced_only(VARIANTS[i]) && runs(VARIANTS[i])) best = VARIANTS[i];
    return best;
}

/* for Python: the variants built into this library (NULL past the last), and a table's name */
const char *sol_variant_name(int i) { return i >= 0 && i < N_VARIANTS ? VARIANTS[i]->name : NULL; }
const char *sol_kernels_name(const Kernels *k) { return k ? k->name : NULL; }
