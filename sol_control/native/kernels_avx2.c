/* AVX2 + FMA kernels (Haswell and later, Zen 1-3): vpmaddubsw + vpmaddwd for the int8 sums, exact
 * (kernels_x86_256.h: rows with an activation above 128 in two halves). */
#define VARIANT avx2
#define EXACT_BELOW 128

/* acc + vpmaddwd(vpmaddubsw(x, w), 1): u8 x s8 pairs in int16 (exact for x <= 128), then int32 */
#define DOT4(acc, x, w) _mm256_add_epi32((acc), _mm256_madd_epi16(_mm256_maddubs_epi16((x), (w)), _mm256_set1_epi16(1)))

/* s[half]: a record's nibbles (0..15) times a row's int8 block: the 8 vpmaddubsw pairs of a column
 * add up in int16 (at most 8 x 2 x 15 x 127 = 30,480), then vpmaddwd to int32 */
#define Q4_BLOCK_SUMS(s, lo, hi, x)                                                                     \
    for (int h = 0; h < 2; h++) {                                                                       \
        __m256i pairs = _mm256_setzero_si256();                                                          \
        for (int j = 0; j < 4; j++) {                                                                   \
            pairs = _mm256_add_epi16(pairs, _mm256_maddubs_epi16(lo[2 * j + h], bcast4((x) + 8 * j)));    \
            pairs = _mm256_add_epi16(pairs, _mm256_maddubs_epi16(hi[2 * j + h], bcast4((x) + 8 * j + 4))); \
        }                                                                                               \
        s[h] = _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));                                           \
    }

#include "kernels_x86_256.h"
