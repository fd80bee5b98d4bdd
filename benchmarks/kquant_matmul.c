/* y (n, 4096) = x (n, 4096) @ W (4096, 4096)^T in each block format, per kernel set: the
 * reference's float matmul, and every int8 path this CPU runs (activations quantized, then
 * matmul_q8, as a session does).  Runs interleaved (each rep times every kernel set once), one
 * thread; prints the median per cell in ms per token, with the weights' GB/s.
 *
 *   kquant_matmul [REPS [N [FORMAT...]]]   default: 7 reps, n = 1 (a matvec); the int8 path's formats */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/ops/ops.h"
#include "src/platform.h"

enum { ROWS = 4096, COLS = 4096, MAX_SETS = 8 };

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    static const char *defaults[] = { "q4_k", "q6_k", "q5_k", "q3_k", "q2_k", "iq4_xs", "iq4_nl", "mxfp4", "q4_1", "q5_0", "q5_1",
                                      "q4_0", "q8_0", "q4_0x8", "q8_0x8" };
    const char **formats = argc > 3 ? (const char **)argv + 3 : defaults;
    int32_t reps = argc > 1 ? atoi(argv[1]) : 7, n = argc > 2 ? atoi(argv[2]) : 1, n_formats = argc > 3 ? argc - 3 : (int32_t)(sizeof defaults / sizeof defaults[0]);
    int32_t n_sets = 0, f, s, i, r;
    const colibri_kernels *sets[MAX_SETS];
    float *x, *y;
    colibri_q8_block *xq;
    double *ms;
    uint32_t seed = 1;
    if (reps < 1 || n < 1) { fprintf(stderr, "kquant_matmul: bad arguments\n"); return 1; }
    x = malloc((size_t)n * COLS * 4);
    y = malloc((size_t)n * ROWS * 4);
    xq = malloc((size_t)n * COLS / COLIBRI_BLOCK * sizeof *xq);
    ms = malloc((size_t)MAX_SETS * (size_t)reps * sizeof *ms);
    if (!x || !y || !xq || !ms) { fprintf(stderr, "kquant_matmul: bad arguments\n"); return 1; }
    for (i = 0; colibri_kernels_variant(i) && n_sets < MAX_SETS; i++)
        if (colibri_kernels_runnable(colibri_kernels_variant(i))) sets[n_sets++] = colibri_kernels_variant(i);
    for (i = 0; i < n * COLS; i++) { seed = seed * 1664525u + 1013904223u; x[i] = (float)(seed >> 8) / 8388608.0f - 1.0f; }
    printf("(%d, %d) @ (%d, %d)^T, 1 thread, median of %d interleaved runs: ms per token (weight GB/s per token)\n\n| format |",
           (int)n, COLS, ROWS, COLS, (int)reps);
    for (s = 0; s < n_sets; s++) printf(" %s |", sets[s]->name);
    printf("\n|---|");
    for (s = 0; s < n_sets; s++) printf("---|");
    printf("\n");
    for (f = 0; f < n_formats; f++) {
        colibri_dtype dtype = COLIBRI_DTYPE_COUNT;
        const colibri_dtype_traits *tr;
        size_t bytes, b;
        uint8_t *w;
        for (i = 0; i < COLIBRI_DTYPE_COUNT; i++) if (strcmp(colibri_dtypes[i].name, formats[f]) == 0) dtype = (colibri_dtype)i;
        if (dtype == COLIBRI_DTYPE_COUNT || !colibri_dtype_is_block(dtype)) { fprintf(stderr, "kquant_matmul: %s?\n", formats[f]); return 1; }
        tr = &colibri_dtypes[dtype];
        bytes = (size_t)ROWS * colibri_row_bytes(dtype, COLS);
        if (!(w = malloc(bytes))) return 1;
        for (b = 0; b < bytes; b++) { seed = seed * 1664525u + 1013904223u; w[b] = (uint8_t)(seed >> 24); }
        for (b = 0; b < bytes; b += (size_t)tr->block_bytes) {   /* finite scales: 0x2000 is f16 2^-7 */
            if (dtype == COLIBRI_DTYPE_MXFP4) w[b] = 120;
            for (i = 0; i < tr->f16_count; i++) { w[b + (size_t)tr->f16_at + 2 * (size_t)i] = 0; w[b + (size_t)tr->f16_at + 2 * (size_t)i + 1] = 0x20; }
        }
        for (r = 0; r < reps; r++)
            for (s = 0; s < n_sets; s++) {
                uint64_t start = colibri_platform_now_ns();
                if (sets[s]->matmul_q8 && tr->int8_path) {
                    sets[s]->quantize_q8(xq, x, n, COLS);
                    sets[s]->matmul_q8(y, xq, w, dtype, n, COLS, ROWS);
                } else sets[s]->matmul(y, x, w, dtype, n, COLS, ROWS);
                ms[s * reps + r] = (double)(colibri_platform_now_ns() - start) / 1e6 / n;
            }
        printf("| %s |", tr->name);
        for (s = 0; s < n_sets; s++) {
            qsort(ms + s * reps, (size_t)reps, sizeof *ms, by_value);
            printf(" %.2f (%.1f) |", ms[s * reps + reps / 2], (double)bytes / 1e6 / ms[s * reps + reps / 2]);
        }
        printf("\n");
        fflush(stdout);
        free(w);
    }
    free(x); free(y); free(xq); free(ms);
    return 0;
}
