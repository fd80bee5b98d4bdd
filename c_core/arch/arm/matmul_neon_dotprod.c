/* NEON with the dot-product extension (Armv8.2 sdot): the int8 path four products to a lane.
 * Compiled with +dotprod; called only after colibri_cpu_has_dotprod() said yes.  Its float path
 * and attention are the plain NEON ones. */
#include "q8_neon.h"

static int32x4_t sdot16(int32x4_t acc, int8x16_t a, int8x16_t b) { return vdotq_s32(acc, a, b); }

static void quantize_q8_dotprod(colibri_q8_block *xq, const float *x, int32_t n, int32_t cols)
{
    quantize_q8_neon(xq, x, n, cols);
}

static void matmul_q8_dotprod(float *y, const colibri_q8_block *xq, const void *w, colibri_dtype dtype,
                              int32_t n, int32_t cols, int32_t rows)
{
    matmul_q8_neon_with(y, xq, w, dtype, n, cols, rows, sdot16);
}

static void matmul_dotprod(float *y, const float *x, const void *w, colibri_dtype dtype, int32_t n, int32_t cols, int32_t rows)
{
    colibri_kernels_neon()->matmul(y, x, w, dtype, n, cols, rows);
}

static void attention_scores(float *scores, const float *q, const float *k, size_t stride, int32_t span,
                             int32_t hd, float scale)
{
    colibri_kernels_neon()->attention_scores(scores, q, k, stride, span, hd, scale);
}

static void attention_values(float *out, const float *p, const float *v, size_t stride, int32_t span, int32_t hd)
{
    colibri_kernels_neon()->attention_values(out, p, v, stride, span, hd);
}

static void softmax(float *x, int32_t n) { colibri_kernels_neon()->softmax(x, n); }

static void rmsnorm(float *y, const float *x, const void *w, colibri_dtype dtype, int32_t dim, float eps)
{
    colibri_kernels_neon()->rmsnorm(y, x, w, dtype, dim, eps);
}

static void silu_mul(float *g, const float *u, size_t n) { colibri_kernels_neon()->silu_mul(g, u, n); }

static const colibri_kernels dotprod_kernels = { "neon-dotprod", matmul_dotprod, rmsnorm,
                                                 quantize_q8_dotprod, matmul_q8_dotprod, attention_scores, attention_values,
                                                 softmax, silu_mul, colibri_ref_latent_query, colibri_ref_latent_scores };

const colibri_kernels *colibri_kernels_neon_dotprod(void) { return &dotprod_kernels; }
