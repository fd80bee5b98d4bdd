/* NEON kernels (AArch64, where Advanced SIMD is part of the base architecture).
 * Each is tested against ops/reference.c. */
#include <arm_neon.h>

#include "../../src/ops/ops.h"

/* 4 weights of row w starting at c, as floats. */
static inline float32x4_t load4(const void *w, colibri_dtype dtype, size_t c)
{
    if (dtype == COLIBRI_DTYPE_F32) return vld1q_f32((const float *)w + c);
    {
        uint16x4_t h = vld1_u16((const uint16_t *)w + c);
        if (dtype == COLIBRI_DTYPE_F16) return vcvt_f32_f16(vreinterpret_f16_u16(h));
        return vreinterpretq_f32_u32(vshll_n_u16(h, 16));   /* bf16 */
    }
}

/* y (n, rows) = x (n, cols) @ W (rows, cols)^T: four 4-wide accumulators per dot product. */
static void matmul_neon(float *y, const float *x, const void *w, colibri_dtype dtype,
                        int32_t n, int32_t cols, int32_t rows)
{
    size_t row_bytes = (size_t)cols * (dtype == COLIBRI_DTYPE_F32 ? 4 : 2);
    int32_t r, t;
    if (colibri_dtype_is_block(dtype)) { colibri_ref_matmul(y, x, w, dtype, n, cols, rows); return; }   /* no kernel yet */
    for (r = 0; r < rows; r++) {
        const void *wr = (const uint8_t *)w + (size_t)r * row_bytes;
        for (t = 0; t < n; t++) {
            const float *xt = x + (size_t)t * cols;
            float32x4_t a0 = vdupq_n_f32(0.0f), a1 = a0, a2 = a0, a3 = a0;
            size_t c = 0, end = (size_t)cols;
            float acc;
            for (; c + 16 <= end; c += 16) {
                a0 = vfmaq_f32(a0, load4(wr, dtype, c), vld1q_f32(xt + c));
                a1 = vfmaq_f32(a1, load4(wr, dtype, c + 4), vld1q_f32(xt + c + 4));
                a2 = vfmaq_f32(a2, load4(wr, dtype, c + 8), vld1q_f32(xt + c + 8));
                a3 = vfmaq_f32(a3, load4(wr, dtype, c + 12), vld1q_f32(xt + c + 12));
            }
            for (; c + 4 <= end; c += 4) a0 = vfmaq_f32(a0, load4(wr, dtype, c), vld1q_f32(xt + c));
            acc = vaddvq_f32(vaddq_f32(vaddq_f32(a0, a1), vaddq_f32(a2, a3)));
            for (; c < end; c++) acc += colibri_load_f32(wr, dtype, c) * xt[c];
            y[(size_t)t * rows + r] = acc;
        }
    }
}

static const colibri_kernels neon_kernels = { "neon", matmul_neon, colibri_ref_rmsnorm };

const colibri_kernels *colibri_kernels_neon(void) { return &neon_kernels; }
