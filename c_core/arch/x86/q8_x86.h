/* The int8 path shared by the AVX2 and AVX-512 variants: each file includes this under its own
 * -m flags and hands the driver its integer block dot products. */
#ifndef COLIBRI_Q8_X86_H
#define COLIBRI_Q8_X86_H

#include <immintrin.h>
#include <string.h>

#include "../../src/ops/ops.h"

static inline float hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* The 32 nibbles of a q4_0 block in weight order (byte j: weight j low, weight j + 16 high), 0..15. */
static inline __m256i q4_nibbles(const uint8_t *q)
{
    __m128i v = _mm_loadu_si128((const __m128i *)q);
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(v, 4), v), _mm256_set1_epi8(0x0f));
}

/* xq (n, cols / 32) = x (n, cols) in blocks of 32, as colibri_ref_quantize_q8 (same rounding). */
static inline void quantize_q8_x86(colibri_q8_block *xq, const float *x, int32_t n, int32_t cols)
{
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    int32_t b, blocks = n * (cols / COLIBRI_BLOCK);
    for (b = 0; b < blocks; b++, x += COLIBRI_BLOCK, xq++) {
        __m256 v0 = _mm256_loadu_ps(x), v1 = _mm256_loadu_ps(x + 8), v2 = _mm256_loadu_ps(x + 16), v3 = _mm256_loadu_ps(x + 24);
        __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(v0, abs_mask), _mm256_and_ps(v1, abs_mask)),
                                 _mm256_max_ps(_mm256_and_ps(v2, abs_mask), _mm256_and_ps(v3, abs_mask)));
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        __m256i i0, i1, i2, i3, q16a, q16b, sum;
        __m256 id;
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_movehdup_ps(h));
        xq->d = _mm_cvtss_f32(h) / 127.0f;
        id = _mm256_set1_ps(xq->d != 0.0f ? 1.0f / xq->d : 0.0f);
        i0 = _mm256_cvtps_epi32(_mm256_mul_ps(v0, id));   /* rounds to nearest even */
        i1 = _mm256_cvtps_epi32(_mm256_mul_ps(v1, id));
        i2 = _mm256_cvtps_epi32(_mm256_mul_ps(v2, id));
        i3 = _mm256_cvtps_epi32(_mm256_mul_ps(v3, id));
        sum = _mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3));
        {
            __m128i s = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
            s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
            s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
            xq->sum = _mm_cvtsi128_si32(s);
        }
        /* the packs work within 128-bit lanes: one permute puts the bytes back in order */
        q16a = _mm256_packs_epi32(i0, i1);
        q16b = _mm256_packs_epi32(i2, i3);
        _mm256_storeu_si256((__m256i *)xq->q, _mm256_permutevar8x32_epi32(_mm256_packs_epi16(q16a, q16b),
                                                                          _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    }
}

#ifndef PREFETCH_AHEAD
#define PREFETCH_AHEAD 1024
#endif

/* R rows of W (row_bytes apart) against one token's blocks: y[0..R) (y_stride apart).  R
 * independent accumulators hide the FMA latency, and each x block is loaded once for all R.
 * q4_0's nibbles are unsigned: sum(u x) - 8 sum(x), the second term subtracted in lane 0. */
static inline __attribute__((always_inline)) void dot_rows_x86(int R, float *y, size_t y_stride, const uint8_t *w, size_t row_bytes, colibri_dtype dtype,
                                const colibri_q8_block *xb, int32_t blocks,
                                __m256i (*dot_q8_0)(const uint8_t *block, const int8_t *x),
                                __m256i (*dot_q4_0)(const uint8_t *block, const int8_t *x))
{
    __m256 acc[4];
    int32_t b, r;
    size_t block_bytes = dtype == COLIBRI_DTYPE_Q8_0 ? 34 : 18;
    for (r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (b = 0; b < blocks; b++, xb++, w += block_bytes) {
        __m256i minus_8sum = _mm256_setr_epi32(-8 * xb->sum, 0, 0, 0, 0, 0, 0, 0);
        _mm_prefetch((const char *)w + PREFETCH_AHEAD, _MM_HINT_T0);
        for (r = 0; r < R; r++) {
            const uint8_t *wb = w + (size_t)r * row_bytes;
            uint16_t h;
            __m256i dot;
            memcpy(&h, wb, 2);
            dot = dtype == COLIBRI_DTYPE_Q8_0 ? dot_q8_0(wb + 2, xb->q) : _mm256_add_epi32(dot_q4_0(wb + 2, xb->q), minus_8sum);
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(h) * xb->d), _mm256_cvtepi32_ps(dot), acc[r]);
        }
    }
    for (r = 0; r < R; r++) y[(size_t)r * y_stride] = hsum8(acc[r]);
}

/* y (n, rows) = xq @ W^T for q8_0 / q4_0 W, given the variant's block dot products (8 int32
 * partial sums each): one row at a time against every token while it is in L1.  Two rows at a
 * time (sharing each x block) ran 12% faster on weights in cache but up to 20% slower on decode,
 * where the experts' weights stream from DRAM. */
static inline void matmul_q8_x86(float *y, const colibri_q8_block *xq, const void *w, colibri_dtype dtype,
                                 int32_t n, int32_t cols, int32_t rows,
                                 __m256i (*dot_q8_0)(const uint8_t *block, const int8_t *x),
                                 __m256i (*dot_q4_0)(const uint8_t *block, const int8_t *x))
{
    size_t row_bytes = colibri_row_bytes(dtype, (size_t)cols);
    int32_t r, t, blocks = cols / COLIBRI_BLOCK;
    for (r = 0; r < rows; r++)
        for (t = 0; t < n; t++)
            dot_rows_x86(1, y + (size_t)t * rows + r, 1, (const uint8_t *)w + (size_t)r * row_bytes, row_bytes, dtype,
                         xq + (size_t)t * blocks, blocks, dot_q8_0, dot_q4_0);
}

#endif
