/* AVX-VNNI kernels (Alder Lake and later Core, Zen 5): vpdpbusd on 32 bytes, exact. Built twice:
 * VEX-encoded (-mavxvnni, the CPUs that have it) and, with SOL_EVEX, EVEX-encoded (AVX-512 VNNI + VL)
 * as "avxvnni_evex", so the same kernels run and are tested on an AVX-512 VNNI host. */
#ifdef SOL_EVEX
#define VARIANT avxvnni_evex
#define DPBUSD _mm256_dpbusd_epi32
#else
#define VARIANT avxvnni
#define DPBUSD _mm256_dpbusd_avx_epi32
#endif
#define EXACT_BELOW 255
#define DOT4(acc, x, w) DPBUSD((acc), (x), (w))

/* s[r][half]: vpdpbusd with the nibbles (u8 0..15) as the unsigned side, each of R rows' int8 (x,
 * rows k apart) as the signed one, one 32-byte slice of nibbles at a time */
#define Q4_BLOCK_SUMS(s, p, x, k, R)                                                                  \
    do {                                                                                              \
        for (int r = 0; r < (R); r++) s[r][0] = s[r][1] = _mm256_setzero_si256();                     \
        for (int j = 0; j < 4; j++) {                                                                 \
            __m256i lo[2], hi[2];                                                                     \
            for (int h = 0; h < 2; h++) {                                                             \
                __m256i raw = _mm256_loadu_si256((const __m256i *)((p) + 64 * j + 32 * h));            \
                lo[h] = _mm256_and_si256(raw, _mm256_set1_epi8(0x0F));                                \
                hi[h] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), _mm256_set1_epi8(0x0F));          \
            }                                                                                         \
            for (int r = 0; r < (R); r++) {                                                           \
                __m256i xa = bcast4((x) + (size_t)r * (k) + 8 * j), xb = bcast4((x) + (size_t)r * (k) + 8 * j + 4); \
                for (int h = 0; h < 2; h++) s[r][h] = DPBUSD(DPBUSD(s[r][h], lo[h], xa), hi[h], xb);  \
            }                                                                                         \
        }                                                                                             \
    } while (0)

#include "kernels_x86_256.h"
