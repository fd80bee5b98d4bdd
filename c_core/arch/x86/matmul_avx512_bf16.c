/* SPDX-License-Identifier: MIT */
/* "avx512-bf16": avx512's kernels, but bf16 weights multiplied by vdpbf16ps against the activations
 * rounded to bf16 (to nearest, ties to even).  A numerics choice a user names (kernels="avx512-bf16",
 * COLIBRI_KERNELS=avx512-bf16), never the default: each activation loses 16 bits of mantissa, so
 * the logits move (benchmarks/bf16_numerics.py measures how far); in exchange one instruction takes 32
 * weights where avx512's float path converts and multiplies 16.  Tested against the reference on
 * the rounded activations (test_kernels.c). */
#include <immintrin.h>
#include <string.h>

#include "../arch.h"

/* x rounded to bf16 as vcvtne2ps2bf16 rounds it (nearest, ties to even; a NaN stays a NaN), as a float. */
static float bf16_round(float x)
{
    uint32_t bits;
    memcpy(&bits, &x, 4);
    if ((bits & 0x7fffffffu) > 0x7f800000u) bits |= 0x00400000u;
    else bits += 0x7fffu + ((bits >> 16) & 1u);
    bits &= 0xffff0000u;
    memcpy(&x, &bits, 4);
    return x;
}

/* An RM x RN tile of y: each 32 activations of a token rounded once for RM rows, each 32 weights
 * loaded once for RN tokens; every output one chain of vdpbf16ps in column order, then the
 * columns past the last 32 one by one, whatever the tile: an output does not depend on how many
 * tokens or rows came with it. */
static inline __attribute__((always_inline)) void tile_bf16(int RM, int RN, float *y, size_t y_stride, const uint8_t *w,
                                                            size_t row_bytes, const float *x, int32_t cols)
{
    __m512 acc[4][4];
    int32_t r, t;
    size_t c = 0, end = (size_t)cols & ~(size_t)31;
    for (r = 0; r < RM; r++) for (t = 0; t < RN; t++) acc[r][t] = _mm512_setzero_ps();
    for (; c < end; c += 32) {
        __m512bh wv[4];
        for (r = 0; r < RM; r++) wv[r] = (__m512bh)_mm512_loadu_si512((const void *)(w + (size_t)r * row_bytes + 2 * c));
        for (t = 0; t < RN; t++) {
            const float *xt = x + (size_t)t * cols + c;
            __m512bh xv = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(xt + 16), _mm512_loadu_ps(xt));
            for (r = 0; r < RM; r++) acc[r][t] = _mm512_dpbf16_ps(acc[r][t], wv[r], xv);
        }
    }
    for (t = 0; t < RN; t++)
        for (r = 0; r < RM; r++) {
            float sum = _mm512_reduce_add_ps(acc[r][t]);
            for (c = end; c < (size_t)cols; c++)
                sum += colibri_load_f32(w + (size_t)r * row_bytes, COLIBRI_DTYPE_BF16, c) * bf16_round(x[(size_t)t * cols + c]);
            y[(size_t)t * y_stride + r] = sum;
        }
}

/* y (n, rows) = bf16(x) (n, cols) @ W^T: 4 x 4 tiles, the edges one output at a time; one token
 * (decode) row after row (4 rows x 1 token, rounding each 32 activations once for the 4, ran at half
 * the speed here: four weight streams at once).  Every other dtype: avx512's matmul. */
static void matmul_avx512_bf16(float *y, const float *x, const void *w, colibri_dtype dtype, int32_t n, int32_t cols, int32_t rows)
{
    size_t row_bytes = (size_t)cols * 2;
    int32_t r, t, i, j;
    if (dtype != COLIBRI_DTYPE_BF16) { colibri_kernels_avx512()->matmul(y, x, w, dtype, n, cols, rows); return; }
    for (r = 0; r < rows; r += 4)
        for (t = 0; t < n; t += 4) {
            if (rows - r >= 4 && n - t >= 4) {
                tile_bf16(4, 4, y + (size_t)t * rows + r, (size_t)rows, (const uint8_t *)w + (size_t)r * row_bytes, row_bytes,
                          x + (size_t)t * cols, cols);
                continue;
            }
            for (i = r; i < r + 4 && i < rows; i++)
                for (j = t; j < t + 4 && j < n; j++)
                    tile_bf16(1, 1, y + (size_t)j * rows + i, (size_t)rows, (const uint8_t *)w + (size_t)i * row_bytes, row_bytes,
                              x + (size_t)j * cols, cols);
        }
}

static const colibri_kernels avx512_bf16_kernels = { .name = "avx512-bf16", .matmul = matmul_avx512_bf16 };

const colibri_kernels *colibri_kernels_avx512_bf16(void) { return &avx512_bf16_kernels; }
