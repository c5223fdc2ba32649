/* AVX2 + FMA kernels (Haswell and later, Zen 1-3): vpmaddubsw + vpmaddwd for the int8 sums, exact
 * (kernels_x86_256.h: rows with an activation above 128 in two halves). */
#define VARIANT avx2
#define EXACT_BELOW 128

/* acc + vpmaddwd(vpmaddubsw(x, w), 1): u8 x s8 pairs in int16 (exact for x <= 128), then int32 */
#define DOT4(acc, x, w) _mm256_add_epi32((acc), _mm256_madd_epi16(_mm256_maddubs_epi16((x), (w)), _mm256_set1_epi16(1)))

/* s[r][half]: a record's nibbles (0..15) times each of R rows' int8 blocks (x, rows k apart): per
 * 32 bytes of nibbles (8 outputs x 4 inputs), the low and high nibbles through vpmaddubsw; a
 * column's 8 pairs add up in int16 (at most 8 x 2 x 15 x 127 = 30,480), then vpmaddwd to int32 */
#define Q4_BLOCK_SUMS(s, p, x, k, R)                                                                  \
    do {                                                                                              \
        __m256i pairs[Q4_SUB][2];                                                                     \
        for (int r = 0; r < (R); r++) pairs[r][0] = pairs[r][1] = _mm256_setzero_si256();             \
        for (int j = 0; j < 4; j++) {                                                                 \
            __m256i lo[2], hi[2];                                                                     \
            for (int h = 0; h < 2; h++) {                                                             \
                __m256i raw = _mm256_loadu_si256((const __m256i *)((p) + 64 * j + 32 * h));            \
                lo[h] = _mm256_and_si256(raw, _mm256_set1_epi8(0x0F));                                \
                hi[h] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), _mm256_set1_epi8(0x0F));          \
            }                                                                                         \
            for (int r = 0; r < (R); r++) {                                                           \
                __m256i xa = bcast4((x) + (size_t)r * (k) + 8 * j), xb = bcast4((x) + (size_t)r * (k) + 8 * j + 4); \
                for (int h = 0; h < 2; h++)                                                           \
                    pairs[r][h] = _mm256_add_epi16(pairs[r][h], _mm256_add_epi16(_mm256_maddubs_epi16(lo[h], xa), \
                                                                                 _mm256_maddubs_epi16(hi[h], xb))); \
            }                                                                                         \
        }                                                                                             \
        for (int r = 0; r < (R); r++)                                                                 \
            for (int h = 0; h < 2; h++) s[r][h] = _mm256_madd_epi16(pairs[r][h], _mm256_set1_epi16(1)); \
    } while (0)

#include "kernels_x86_256.h"
