/* The int8 path shared by the AVX2 and AVX-512 variants: each file includes this under its own
 * -m flags and hands the driver its integer block dot products. */
#ifndef COLIBRI_Q8_X86_H
#define COLIBRI_Q8_X86_H

#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "../arch.h"

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

/* A variant's integer primitive: 32 unsigned bytes times 32 signed bytes, four products summed
 * into each of 8 int32 lanes (maddubs + madd on AVX2, vpdpbusd on AVX-512 VNNI). */
typedef __m256i (*dot_us_fn)(__m256i u, __m256i s);

/* One weight block as dot_us's unsigned operand: q4_0's nibbles are unsigned already (the "- 8"
 * comes back as -8 sum(x)); q8_0 gives |w|, and block_dot moves w's sign onto x. */
static inline __m256i w_unsigned(const uint8_t *block, colibri_dtype dtype)
{
    if (dtype == COLIBRI_DTYPE_Q4_0) return q4_nibbles(block + 2);
    {
        __m256i w = _mm256_loadu_si256((const __m256i *)(block + 2));
        return _mm256_sign_epi8(w, w);
    }
}

static inline float w_scale(const uint8_t *block)
{
    uint16_t h;
    memcpy(&h, block, 2);
    return _cvtsh_ss(h);
}

/* The exact integer dot of one weight block (w_u its unsigned form) with one activation block. */
static inline __attribute__((always_inline)) __m256i block_dot(const uint8_t *block, __m256i w_u, colibri_dtype dtype,
                                                               const colibri_q8_block *xb, dot_us_fn dot_us)
{
    __m256i x = _mm256_loadu_si256((const __m256i *)xb->q);
    if (dtype == COLIBRI_DTYPE_Q8_0) return dot_us(w_u, _mm256_sign_epi8(x, _mm256_loadu_si256((const __m256i *)(block + 2))));
    return _mm256_add_epi32(dot_us(w_u, x), _mm256_setr_epi32(-8 * xb->sum, 0, 0, 0, 0, 0, 0, 0));
}

/* One row of W against one token's blocks (decode).  One row at a time: two rows sharing each x
 * block ran 12% faster on weights in cache but up to 20% slower when they stream from DRAM, as
 * the experts' do; the software prefetch keeps the stream ahead.  One accumulator, as each of a
 * tile's: an output does not depend on how many tokens came with it (nor on the thread count,
 * which splits the tokens). */
static inline __attribute__((always_inline)) float row_q8_x86(const uint8_t *w, colibri_dtype dtype, const colibri_q8_block *xb,
                                                              int32_t blocks, dot_us_fn dot_us)
{
    size_t block_bytes = dtype == COLIBRI_DTYPE_Q8_0 ? 34 : 18;
    __m256 acc = _mm256_setzero_ps();
    int32_t b;
    for (b = 0; b < blocks; b++, xb++, w += block_bytes) {
        _mm_prefetch((const char *)w + 1024, _MM_HINT_T0);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(w_scale(w) * xb->d), _mm256_cvtepi32_ps(block_dot(w, w_unsigned(w, dtype), dtype, xb, dot_us)),
                              acc);
    }
    return hsum8(acc);
}

/* An RM x RN tile of y (several tokens: prefill, an expert's group of tokens): RM rows of W
 * against RN tokens, each weight block unpacked once for RN tokens and each activation block
 * loaded once for RM rows; RM * RN accumulators.  y (RN tokens, `rows` apart) gets the tile. */
static inline __attribute__((always_inline)) void tile_q8_x86(int RM, int RN, float *y, int32_t rows, const uint8_t *w,
                                                              size_t row_bytes, colibri_dtype dtype,
                                                              const colibri_q8_block *xq, int32_t blocks, dot_us_fn dot_us)
{
    size_t block_bytes = dtype == COLIBRI_DTYPE_Q8_0 ? 34 : 18;
    __m256 acc[4][4];
    int32_t b, r, t;
    for (r = 0; r < RM; r++) for (t = 0; t < RN; t++) acc[r][t] = _mm256_setzero_ps();
    for (b = 0; b < blocks; b++) {
        __m256i w_u[4], w_s[4];
        __m256 d[4];
        for (r = 0; r < RM; r++) {
            const uint8_t *block = w + (size_t)r * row_bytes + (size_t)b * block_bytes;
            w_u[r] = w_unsigned(block, dtype);
            if (dtype == COLIBRI_DTYPE_Q8_0) w_s[r] = _mm256_loadu_si256((const __m256i *)(block + 2));
            d[r] = _mm256_set1_ps(w_scale(block));
        }
        for (t = 0; t < RN; t++) {
            const colibri_q8_block *xb = xq + (size_t)t * blocks + b;
            __m256i x = _mm256_loadu_si256((const __m256i *)xb->q);
            __m256i minus_8sum = _mm256_setr_epi32(-8 * xb->sum, 0, 0, 0, 0, 0, 0, 0);
            __m256 dx = _mm256_set1_ps(xb->d);
            for (r = 0; r < RM; r++) {
                __m256i dot = dtype == COLIBRI_DTYPE_Q8_0 ? dot_us(w_u[r], _mm256_sign_epi8(x, w_s[r]))
                                                          : _mm256_add_epi32(dot_us(w_u[r], x), minus_8sum);
                acc[r][t] = _mm256_fmadd_ps(_mm256_mul_ps(d[r], dx), _mm256_cvtepi32_ps(dot), acc[r][t]);
            }
        }
    }
    for (t = 0; t < RN; t++) for (r = 0; r < RM; r++) y[(size_t)t * rows + r] = hsum8(acc[r][t]);
}

/* y (n, rows) = xq @ W^T for one block format (a constant once inlined): one token row by row;
 * several in tiles of 4 rows x RN tokens (the edges in smaller tiles). */
static inline __attribute__((always_inline)) void matmul_q8_format(int RN, float *y, const colibri_q8_block *xq, const uint8_t *w,
                                                                   colibri_dtype dtype, int32_t n, int32_t cols, int32_t rows,
                                                                   dot_us_fn dot_us)
{
    size_t row_bytes = colibri_row_bytes(dtype, (size_t)cols);
    int32_t r, t, blocks = cols / COLIBRI_BLOCK;
    if (n == 1) {
        for (r = 0; r < rows; r++) y[r] = row_q8_x86(w + (size_t)r * row_bytes, dtype, xq, blocks, dot_us);
        return;
    }
    for (r = 0; r + 4 <= rows; r += 4) {
        for (t = 0; t + RN <= n; t += RN)
            tile_q8_x86(4, RN, y + (size_t)t * rows + r, rows, w + (size_t)r * row_bytes, row_bytes, dtype, xq + (size_t)t * blocks, blocks, dot_us);
        for (; t < n; t++)
            tile_q8_x86(4, 1, y + (size_t)t * rows + r, rows, w + (size_t)r * row_bytes, row_bytes, dtype, xq + (size_t)t * blocks, blocks, dot_us);
    }
    for (; r < rows; r++)
        for (t = 0; t < n; t++)
            tile_q8_x86(1, 1, y + (size_t)t * rows + r, rows, w + (size_t)r * row_bytes, row_bytes, dtype, xq + (size_t)t * blocks, blocks, dot_us);
}

/* y (n, rows) = xq @ W^T for q8_0 / q4_0 W, given the variant's dot_us and how many tokens its
 * registers hold in a tile (RN). */
static inline __attribute__((always_inline)) void matmul_q8_x86(int RN, float *y, const colibri_q8_block *xq, const void *w,
                                                                colibri_dtype dtype, int32_t n, int32_t cols, int32_t rows,
                                                                dot_us_fn dot_us)
{
    if (dtype == COLIBRI_DTYPE_Q8_0) matmul_q8_format(RN, y, xq, w, COLIBRI_DTYPE_Q8_0, n, cols, rows, dot_us);
    else matmul_q8_format(RN, y, xq, w, COLIBRI_DTYPE_Q4_0, n, cols, rows, dot_us);
}

#endif
