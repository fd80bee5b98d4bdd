/* Decode on a fine-grained MoE: one token's y (rows) = W (rows, cols) @ x for expert after expert,
 * each expert's W once, so the weights stream from DRAM (MB of them in all, past the caches), in
 * each plain format against its x8 form (the same bytes, rows interleaved: q4_0, q8_0, q4_k, q5_k, q6_k, iq4_xs, mxfp4).  One thread,
 * one kernel set; the formats of a pair alternate within each rep; prints the median per format
 * in us per expert with the weights' GB/s, and the median of the reps' ratios.
 *
 *   x8_matmul KERNELS [ROWS COLS [MB [REPS]]]   default: 768 2048 512 9 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/ops/ops.h"
#include "src/platform.h"

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    static const colibri_dtype pairs[][2] = { { COLIBRI_DTYPE_Q4_0, COLIBRI_DTYPE_Q4_0X8 }, { COLIBRI_DTYPE_Q8_0, COLIBRI_DTYPE_Q8_0X8 },
                                              { COLIBRI_DTYPE_Q4_K, COLIBRI_DTYPE_Q4_KX8 }, { COLIBRI_DTYPE_Q5_K, COLIBRI_DTYPE_Q5_KX8 },
                                              { COLIBRI_DTYPE_Q6_K, COLIBRI_DTYPE_Q6_KX8 }, { COLIBRI_DTYPE_IQ4_XS, COLIBRI_DTYPE_IQ4_XSX8 },
                                              { COLIBRI_DTYPE_MXFP4, COLIBRI_DTYPE_MXFP4X8 } };
    const colibri_kernels *k = argc > 1 ? colibri_kernels_named(argv[1]) : NULL;
    int32_t rows = argc > 3 ? atoi(argv[2]) : 768, cols = argc > 3 ? atoi(argv[3]) : 2048;
    int32_t mb = argc > 4 ? atoi(argv[4]) : 512, reps = argc > 5 ? atoi(argv[5]) : 9, p, f, r, e, i;
    float *x = malloc((size_t)cols * 4), *y = malloc((size_t)rows * 4);
    colibri_q8_block *xq = malloc((size_t)cols / COLIBRI_BLOCK * sizeof *xq);
    double *us = malloc(3 * (size_t)reps * sizeof *us);
    uint32_t seed = 1;
    if (!k || !k->matmul_q8 || rows % 8 || cols % 256 || rows <= 0 || mb < 1 || reps < 1 || !x || !y || !xq || !us) {
        fprintf(stderr, "usage: x8_matmul KERNELS [ROWS COLS [MB [REPS]]] (kernels with an int8 path, on this CPU; rows %% 8 == 0, cols %% 256 == 0)\n");
        return 1;
    }
    for (i = 0; i < cols; i++) { seed = seed * 1664525u + 1013904223u; x[i] = (float)(seed >> 8) / 8388608.0f - 1.0f; }
    printf("%s, 1 thread: y (%d) = W (%d, %d) @ x per expert, experts cycled through %d MB; median of %d reps\n\n",
           k->name, (int)rows, (int)rows, (int)cols, (int)mb, (int)reps);
    printf("| format | us per expert | weight GB/s |\n|---|---|---|\n");
    for (p = 0; p < (int32_t)(sizeof pairs / sizeof pairs[0]); p++) {
        size_t expert = (size_t)rows * colibri_row_bytes(pairs[p][0], (size_t)cols), bytes, b;
        int32_t experts = (int32_t)(((size_t)mb << 20) / expert);
        uint8_t *w[2];
        if (experts < 1) experts = 1;
        bytes = (size_t)experts * expert;
        for (f = 0; f < 2; f++) {
            const colibri_dtype_traits *tr = &colibri_dtypes[pairs[p][f]];
            size_t unit = (size_t)tr->block_bytes * (size_t)tr->rows;
            if (!(w[f] = malloc(bytes))) return 1;
            for (b = 0; b < bytes; b++) { seed = seed * 1664525u + 1013904223u; w[f][b] = (uint8_t)(seed >> 24); }
            for (b = 0; b < bytes; b += unit)   /* finite scales: 0x2000 is f16 2^-7 */
                for (i = 0; i < tr->f16_count; i++) { w[f][b + (size_t)tr->f16_at + 2 * (size_t)i] = 0; w[f][b + (size_t)tr->f16_at + 2 * (size_t)i + 1] = 0x20; }
        }
        colibri_quantize_q8_for(k, pairs[p][0], xq, x, 1, cols);
        for (r = 0; r < reps; r++) {
            for (f = 0; f < 2; f++) {
                int32_t which = r % 2 ? 1 - f : f;   /* alternate which goes first */
                uint64_t start = colibri_platform_now_ns();
                for (e = 0; e < experts; e++) k->matmul_q8(y, xq, w[which] + (size_t)e * expert, pairs[p][which], 1, cols, rows);
                us[which * reps + r] = (double)(colibri_platform_now_ns() - start) / 1e3 / experts;
            }
            us[2 * reps + r] = us[reps + r] / us[r];
        }
        for (f = 0; f < 3; f++) qsort(us + f * reps, (size_t)reps, sizeof *us, by_value);
        for (f = 0; f < 2; f++)
            printf("| %s | %.1f | %.1f |\n", colibri_dtypes[pairs[p][f]].name, us[f * reps + reps / 2],
                   (double)expert / 1e3 / us[f * reps + reps / 2]);
        printf("| %s / %s time | %.3f (median of the reps' ratios) | |\n", colibri_dtypes[pairs[p][1]].name,
               colibri_dtypes[pairs[p][0]].name, us[2 * reps + reps / 2]);
        fflush(stdout);
        free(w[0]); free(w[1]);
    }
    free(x); free(y); free(xq); free(us);
    return 0;
}
