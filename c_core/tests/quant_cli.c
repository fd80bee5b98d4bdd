/* SPDX-License-Identifier: MIT */
/* One weight matrix through the block formats' reference code and a kernel set, for
 * tests/test_gguf_quants.py to compare with the gguf package and numpy.
 *
 *   quant_cli DTYPE KERNELS ROWS COLS W X OUT
 *     W    ROWS rows of COLS weights stored in DTYPE (a file of raw blocks)
 *     X    n x COLS float32 (any n >= 1)
 *     OUT  written: the dequantized W (ROWS x COLS float32), then y = X @ W^T (n x ROWS float32)
 *          by KERNELS' matmul (reference, avx2, ...); for an int8_path DTYPE and KERNELS with an
 *          int8 path, then y again (n x ROWS) by its quantize_q8 and matmul_q8
 *
 * exit 1: bad arguments or files; 77: KERNELS is not a variant this CPU runs. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/ops/ops.h"

static void *read_file(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    void *data = NULL;
    long n;
    if (!f) return NULL;
    if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0 && (data = malloc((size_t)n + 1))) {
        *size = fread(data, 1, (size_t)n, f);
        if (*size != (size_t)n) { free(data); data = NULL; }
    }
    fclose(f);
    return data;
}

int main(int argc, char **argv)
{
    const colibri_kernels *k;
    colibri_q8_block *xq;
    int32_t d, rows, cols, n, q8;
    size_t w_size = 0, x_size = 0;
    void *w, *x;
    float *out;
    FILE *f;
    if (argc != 8) { fprintf(stderr, "usage: quant_cli DTYPE KERNELS ROWS COLS W X OUT\n"); return 1; }
    for (d = 0; d < COLIBRI_DTYPE_COUNT; d++)
        if (strcmp(colibri_dtypes[d].name, argv[1]) == 0) break;
    if (d == COLIBRI_DTYPE_COUNT || !colibri_dtypes[d].holds_weights) { fprintf(stderr, "quant_cli: dtype %s?\n", argv[1]); return 1; }
    k = colibri_kernels_named(argv[2]);
    if (!k) { fprintf(stderr, "quant_cli: no kernels %s on this CPU\n", argv[2]); return 77; }
    rows = atoi(argv[3]);
    cols = atoi(argv[4]);
    if (rows <= 0 || cols <= 0 || cols % colibri_dtypes[d].block) { fprintf(stderr, "quant_cli: bad shape\n"); return 1; }
    w = read_file(argv[5], &w_size);
    x = read_file(argv[6], &x_size);
    if (!w || !x || w_size != (size_t)rows * colibri_row_bytes((colibri_dtype)d, (size_t)cols)
        || x_size == 0 || x_size % (4 * (size_t)cols)) { fprintf(stderr, "quant_cli: bad W or X\n"); return 1; }
    n = (int32_t)(x_size / (4 * (size_t)cols));
    q8 = colibri_dtypes[d].int8_path && k->matmul_q8 && cols % COLIBRI_BLOCK == 0;
    out = malloc(((size_t)rows * cols + (size_t)(1 + q8) * n * rows) * sizeof *out);
    xq = malloc((size_t)n * (cols / COLIBRI_BLOCK + 1) * sizeof *xq);
    if (!out || !xq) return 1;
    if (rows % colibri_dtypes[d].rows) { fprintf(stderr, "quant_cli: %s needs rows in groups of 8\n", argv[1]); return 1; }
    colibri_dequantize_rows(out, w, (colibri_dtype)d, rows, cols);
    k->matmul(out + (size_t)rows * cols, x, w, (colibri_dtype)d, n, cols, rows);
    if (q8) {
        colibri_quantize_q8_for(k, (colibri_dtype)d, xq, x, n, cols);
        k->matmul_q8(out + (size_t)rows * cols + (size_t)n * rows, xq, w, (colibri_dtype)d, n, cols, rows);
    }
    f = fopen(argv[7], "wb");
    if (!f || fwrite(out, sizeof *out, (size_t)rows * cols + (size_t)(1 + q8) * n * rows, f)
                  != (size_t)rows * cols + (size_t)(1 + q8) * n * rows) return 1;
    fclose(f);
    free(out); free(xq); free(w); free(x);
    return 0;
}
