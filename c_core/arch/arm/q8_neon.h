/* The int8 path shared by the NEON variants: each file includes this under its own flags and
 * hands the driver its integer dot product of 16 bytes by 16 bytes. */
#ifndef COLIBRI_Q8_NEON_H
#define COLIBRI_Q8_NEON_H

#include <arm_neon.h>
#include <math.h>
#include <string.h>

#include "../arch.h"

/* xq (n, cols / 32) = x (n, cols) in blocks of 32, as colibri_ref_quantize_q8 (same rounding). */
static inline void quantize_q8_neon(colibri_q8_block *xq, const float *x, int32_t n, int32_t cols)
{
    int32_t b, i, blocks = n * (cols / COLIBRI_BLOCK);
    for (b = 0; b < blocks; b++, x += COLIBRI_BLOCK, xq++) {
        float32x4_t v[8], m = vdupq_n_f32(0.0f);
        int32x4_t q[8], sum = vdupq_n_s32(0);
        float id;
        for (i = 0; i < 8; i++) { v[i] = vld1q_f32(x + 4 * i); m = vmaxq_f32(m, vabsq_f32(v[i])); }
        xq->d = vmaxvq_f32(m) / 127.0f;
        id = xq->d != 0.0f ? 1.0f / xq->d : 0.0f;
        for (i = 0; i < 8; i++) { q[i] = vcvtnq_s32_f32(vmulq_n_f32(v[i], id)); sum = vaddq_s32(sum, q[i]); }
        xq->sum = vaddvq_s32(sum);
        for (i = 0; i < 2; i++) {   /* 16 int32 -> 16 int8, in order */
            int16x8_t lo = vcombine_s16(vmovn_s32(q[4 * i]), vmovn_s32(q[4 * i + 1]));
            int16x8_t hi = vcombine_s16(vmovn_s32(q[4 * i + 2]), vmovn_s32(q[4 * i + 3]));
            vst1q_s8(xq->q + 16 * i, vcombine_s8(vmovn_s16(lo), vmovn_s16(hi)));
        }
    }
}

/* y (n, rows) = xq @ W^T for q8_0 / q4_0 W; q4_0's nibbles minus 8 are signed bytes like q8_0's. */
static inline void matmul_q8_neon_with(float *y, const colibri_q8_block *xq, const void *w, colibri_dtype dtype,
                                       int32_t n, int32_t cols, int32_t rows,
                                       int32x4_t (*dot16)(int32x4_t acc, int8x16_t a, int8x16_t b))
{
    size_t row_bytes = colibri_row_bytes(dtype, (size_t)cols), block_bytes = dtype == COLIBRI_DTYPE_Q8_0 ? 34 : 18;
    int32_t r, t, b, blocks = cols / COLIBRI_BLOCK;
    for (r = 0; r < rows; r++) {
        for (t = 0; t < n; t++) {
            const uint8_t *wb = (const uint8_t *)w + (size_t)r * row_bytes;
            const colibri_q8_block *xb = xq + (size_t)t * blocks;
            float32x4_t acc = vdupq_n_f32(0.0f);
            for (b = 0; b < blocks; b++, wb += block_bytes, xb++) {
                int8x16_t w0, w1;
                int32x4_t dot;
                uint16_t h;
                memcpy(&h, wb, 2);
                if (dtype == COLIBRI_DTYPE_Q8_0) {
                    w0 = vld1q_s8((const int8_t *)wb + 2);
                    w1 = vld1q_s8((const int8_t *)wb + 18);
                } else {   /* byte j: weight j (low nibble), weight j + 16 (high) */
                    uint8x16_t v = vld1q_u8(wb + 2);
                    w0 = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(0x0f))), vdupq_n_s8(8));
                    w1 = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(v, 4)), vdupq_n_s8(8));
                }
                dot = dot16(dot16(vdupq_n_s32(0), w0, vld1q_s8(xb->q)), w1, vld1q_s8(xb->q + 16));
                acc = vfmaq_n_f32(acc, vcvtq_f32_s32(dot), colibri_f16_to_f32(h) * xb->d);
            }
            y[(size_t)t * rows + r] = vaddvq_f32(acc);
        }
    }
}

#endif
