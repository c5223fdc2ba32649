/* AVX2 + FMA kernels (Haswell and later, Zen 1-3): vpmaddubsw + vpmaddwd for the int8 sums, exact
 * (kernels_x86_256.h: rows with an activation above 128 in two halves). */
#define VARIANT avx2
#define EXACT_BELOW 128
/* 16 ymm registers: 4 rows x 2 accumulators, 2 weight vectors, the broadcast row, vpmaddwd's ones
 * and its product fit; 6 rows spilled (a QC decision 17 % slower) */
#define SUB_ROWS 4

/* acc + vpmaddwd(vpmaddubsw(x, w), 1): u8 x s8 pairs in int16 (exact for x <= 128), then int32 */
#define DOT4(acc, x, w) _mm256_add_epi32((acc), _mm256_madd_epi16(_mm256_maddubs_epi16((x), (w)), _mm256_set1_epi16(1)))

/* int4: a record's nibbles (0..15, the unsigned side) times a row's int8 (the signed side) through
 * vpmaddubsw, low and high nibbles added in int16: a column's 8 pairs stay below 8 x 2 x 15 x 127 =
 * 30,480, then vpmaddwd widens them to int32 */
#define Q4_DOT(acc, lo, hi, xa, xb) _mm256_add_epi16((acc), _mm256_add_epi16(_mm256_maddubs_epi16((lo), (xa)), _mm256_maddubs_epi16((hi), (xb))))
#define Q4_WIDEN(a) _mm256_madd_epi16((a), _mm256_set1_epi16(1))

#include "kernels_x86_256.h"
