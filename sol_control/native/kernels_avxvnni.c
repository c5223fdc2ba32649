/* AVX-VNNI kernels (Alder Lake and later Core, Zen 5): vpdpbusd on 32 bytes, exact. Built twice:
 * VEX-encoded (-mavxvnni, the CPUs that have it) and, with SOL_EVEX, EVEX-encoded (AVX-512 VNNI + VL)
 * as "avxvnni_evex", so the same kernels run and are tested on an AVX-512 VNNI host. */
#ifdef SOL_EVEX
#define VARIANT avxvnni_evex
#define DPBUSD _mm256_dpbusd_epi32
#else
#define VARIANT avxvnni
#define DPBUSD _mm256_dpbusd_avx_epi32
#define SUB_ROWS 4  /* 16 ymm registers (EVEX has 32): 6 rows' accumulators spilled, 14 % slower */
#endif
#define EXACT_BELOW 255
#define DOT4(acc, x, w) DPBUSD((acc), (x), (w))

/* int4: vpdpbusd with the nibbles (u8 0..15) as the unsigned side, the row's int8 as the signed one */
#define Q4_DOT(acc, lo, hi, xa, xb) DPBUSD(DPBUSD((acc), (lo), (xa)), (hi), (xb))
#define Q4_WIDEN(a) (a)

#include "kernels_x86_256.h"
