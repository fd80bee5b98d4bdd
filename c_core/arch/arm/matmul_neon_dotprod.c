/* SPDX-License-Identifier: MIT */
/* NEON with the dot-product extension (Armv8.2 sdot): the int8 path four products to a lane.
 * Compiled with +dotprod; called only after colibri_cpu_has_dotprod() said yes.  Its float path
 * and attention are the plain NEON ones: its base in arch/dispatch.c fills those slots. */
#include "q8_neon.h"

static int32x4_t sdot16(int32x4_t acc, int8x16_t a, int8x16_t b) { return vdotq_s32(acc, a, b); }

static void matmul_q8_dotprod(float *y, const colibri_q8_block *xq, const void *w, colibri_dtype dtype,
                              int32_t n, int32_t cols, int32_t rows)
{
    matmul_q8_neon_with(y, xq, w, dtype, n, cols, rows, sdot16);
}

static const colibri_kernels dotprod_kernels = {
    .name = "neon-dotprod", .quantize_q8 = quantize_q8_neon, .quantize_q8_256 = quantize_q8_256_neon, .matmul_q8 = matmul_q8_dotprod,
};

const colibri_kernels *colibri_kernels_neon_dotprod(void) { return &dotprod_kernels; }
