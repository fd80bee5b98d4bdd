/* Every kernel variant this CPU runs against the reference kernels, over shapes that hit
 * every loop tail and every weight dtype.  Budget per output: float summation can be off by
 * at most cols * 2^-24 * sum|w x| (the classic bound for any order), with the reference
 * itself exact to well inside that.
 *
 *   test_kernels          (exit 0: all within budget, or no variant on this architecture) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/ops/ops.h"

static uint32_t lcg = 12345u;
static float next_float(void)   /* uniform in [-1, 1) */
{
    lcg = lcg * 1664525u + 1013904223u;
    return (float)(lcg >> 8) / 8388608.0f - 1.0f;
}

static uint16_t to_half_bits(float f, colibri_dtype dtype)
{
    uint32_t bits;
    memcpy(&bits, &f, 4);
    if (dtype == COLIBRI_DTYPE_BF16) return (uint16_t)(bits >> 16);   /* truncation is fine for test data */
    {   /* f16 for |f| < 2: exponent rebias, mantissa truncated; tiny values flush to 0 */
        uint32_t sign = (bits >> 16) & 0x8000u, exponent = (bits >> 23) & 0xffu, mantissa = bits & 0x7fffffu;
        if (exponent < 113) return (uint16_t)sign;
        return (uint16_t)(sign | ((exponent - 112u) << 10) | (mantissa >> 13));
    }
}

int main(void)
{
    static const int32_t ns[] = { 1, 3, 8 }, colss[] = { 1, 7, 8, 15, 16, 31, 33, 64, 100, 257 }, rowss[] = { 1, 5 };
    const colibri_kernels *ref = colibri_kernels_reference(), *best = colibri_kernels_best();
    int di, ni, ci, ri, failures = 0, checked = 0;
    if (best == ref) {
        printf("no kernel variant on this architecture: only the reference runs\n");
        return 0;
    }
    for (di = 0; di < 3; di++) {
        colibri_dtype dtype = (colibri_dtype)di;
        for (ni = 0; ni < 3; ni++) for (ci = 0; ci < 10; ci++) for (ri = 0; ri < 2; ri++) {
            int32_t n = ns[ni], cols = colss[ci], rows = rowss[ri], i, t, r;
            size_t wsize = (size_t)rows * cols * (dtype == COLIBRI_DTYPE_F32 ? 4 : 2);
            float *x = malloc((size_t)n * cols * 4), *w32 = malloc((size_t)rows * cols * 4);
            float *y_ref = malloc((size_t)n * rows * 4), *y = malloc((size_t)n * rows * 4);
            void *w = malloc(wsize);
            for (i = 0; i < n * cols; i++) x[i] = next_float();
            for (i = 0; i < rows * cols; i++) {
                w32[i] = next_float();
                if (dtype == COLIBRI_DTYPE_F32) ((float *)w)[i] = w32[i];
                else {
                    ((uint16_t *)w)[i] = to_half_bits(w32[i], dtype);
                    w32[i] = colibri_load_f32(w, dtype, (size_t)i);
                }
            }
            ref->matmul(y_ref, x, w, dtype, n, cols, rows);
            best->matmul(y, x, w, dtype, n, cols, rows);
            for (t = 0; t < n; t++) for (r = 0; r < rows; r++) {
                double mag = 0.0, budget;
                for (i = 0; i < cols; i++) mag += fabs((double)w32[r * cols + i] * x[t * cols + i]);
                budget = cols * ldexp(1.0, -24) * mag + 1e-30;
                checked++;
                if (fabs((double)y[t * rows + r] - y_ref[t * rows + r]) > budget) {
                    if (failures++ < 10)
                        fprintf(stderr, "%s matmul %s n=%d cols=%d rows=%d [%d,%d]: %.9g != reference %.9g (budget %.3g)\n",
                                best->name, dtype == 0 ? "f32" : dtype == 1 ? "f16" : "bf16", (int)n, (int)cols, (int)rows, (int)t, (int)r,
                                y[t * rows + r], y_ref[t * rows + r], budget);
                }
            }
            free(x); free(w32); free(y_ref); free(y); free(w);
        }
    }
    printf("%s kernels: %d outputs compared with the reference, %d outside the budget\n", best->name, checked, failures);
    return failures ? 1 : 0;
}
