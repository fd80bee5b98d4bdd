/* SPDX-License-Identifier: MIT */
/* The int8 path for q4_0x8 and q8_0x8 (8 rows interleaved, docs/FORMAT.md) on NEON: a 64-byte
 * chunk is four registers of two rows' 8 quant bytes each, and one load of 8 activation bytes
 * (duplicated) meets all four.  With the dot-product extension (the file compiled with +dotprod)
 * one sdot gives each row two lanes; plain NEON gets the same lanes from two widening multiplies,
 * a pairwise add and a pairwise accumulate.  q4_0's nibbles minus 8 are signed bytes like q8_0's.
 * Each token's outputs take the same operations whichever tokens came with it, and a group's rows
 * do not depend on the others. */
#ifndef COLIBRI_ROWS8_NEON_H
#define COLIBRI_ROWS8_NEON_H

#include <arm_neon.h>

#include "../../src/ops/ops.h"

/* acc lanes 0, 1 += row a's products with x (bytes 0..7 of w), lanes 2, 3 += row b's (bytes 8..15);
 * x: 8 activation bytes twice. */
static inline int32x4_t dot_2rows(int32x4_t acc, int8x16_t w, int8x16_t x)
{
#if defined(__ARM_FEATURE_DOTPROD)
    return vdotq_s32(acc, w, x);
#else   /* a pair of products is at most 2 * 128 * 127: no int16 overflow */
    return vpadalq_s16(acc, vpaddq_s16(vmull_s8(vget_low_s8(w), vget_low_s8(x)), vmull_s8(vget_high_s8(w), vget_high_s8(x))));
#endif
}

/* One group of 8 rows (blocks block groups at g) against one token: y[0..7]. */
static inline __attribute__((always_inline)) void group_row_x8_neon(int q8, float *y, const uint8_t *g, const colibri_q8_block *xb,
                                                                    int32_t blocks)
{
    const size_t gb = q8 ? 272 : 144;
    float32x4_t f0 = vdupq_n_f32(0.0f), f1 = vdupq_n_f32(0.0f);
    int32_t b;
    for (b = 0; b < blocks; b++, g += gb, xb++) {
        int32x4_t acc[4];
        int8x16_t xv[4];
        float32x4_t d0, d1;
        int c, j;
        __builtin_prefetch(g + 1024);
        for (c = 0; c < 4; c++) xv[c] = vreinterpretq_s8_s64(vld1q_dup_s64((const int64_t *)(const void *)(xb->q + 8 * c)));
        for (j = 0; j < 4; j++) acc[j] = vdupq_n_s32(0);
        if (q8) {
            for (c = 0; c < 4; c++)
                for (j = 0; j < 4; j++) acc[j] = dot_2rows(acc[j], vld1q_s8((const int8_t *)g + 16 + 64 * c + 16 * j), xv[c]);
        } else {   /* chunk c: low nibbles weights 8c .. 8c + 7, high ones 8c + 16 .. */
            for (c = 0; c < 2; c++)
                for (j = 0; j < 4; j++) {
                    uint8x16_t v = vld1q_u8(g + 16 + 64 * c + 16 * j);
                    acc[j] = dot_2rows(acc[j], vsubq_s8(vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(0x0f))), vdupq_n_s8(8)), xv[c]);
                    acc[j] = dot_2rows(acc[j], vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(v, 4)), vdupq_n_s8(8)), xv[c + 2]);
                }
        }
        {   /* d[0..7] dx */
            uint16x8_t h = vld1q_u16((const uint16_t *)(const void *)g);
            d0 = vmulq_n_f32(vcvt_f32_f16(vreinterpret_f16_u16(vget_low_u16(h))), xb->d);
            d1 = vmulq_n_f32(vcvt_f32_f16(vreinterpret_f16_u16(vget_high_u16(h))), xb->d);
        }
        f0 = vfmaq_f32(f0, vcvtq_f32_s32(vpaddq_s32(acc[0], acc[1])), d0);   /* rows 0..3 */
        f1 = vfmaq_f32(f1, vcvtq_f32_s32(vpaddq_s32(acc[2], acc[3])), d1);   /* rows 4..7 */
    }
    vst1q_f32(y, f0);
    vst1q_f32(y + 4, f1);
}

/* y (n, rows) = xq @ W^T, W q4_0x8 or q8_0x8 (rows % 8 == 0): group by group, each against every
 * token while it is in L1. */
static inline void matmul_x8_neon(float *y, const colibri_q8_block *xq, const void *w, colibri_dtype dtype,
                                  int32_t n, int32_t cols, int32_t rows)
{
    int q8 = dtype == COLIBRI_DTYPE_Q8_0X8;
    size_t group_bytes = (size_t)cols / 32 * (q8 ? 272 : 144);
    int32_t g, t, blocks = cols / COLIBRI_BLOCK;
    for (g = 0; g < rows / 8; g++)
        for (t = 0; t < n; t++) {
            const uint8_t *wg = (const uint8_t *)w + (size_t)g * group_bytes;
            if (q8) group_row_x8_neon(1, y + (size_t)t * rows + 8 * g, wg, xq + (size_t)t * blocks, blocks);
            else group_row_x8_neon(0, y + (size_t)t * rows + 8 * g, wg, xq + (size_t)t * blocks, blocks);
        }
}

#endif
