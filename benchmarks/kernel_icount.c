/* One kernel call of a kernel set, for counting retired instructions from outside
 * (benchmarks/rvv_icount.py runs it under QEMU and counts; with `setup` it does all but the
 * call, so the difference is the call's).  Data is random bytes and floats: the counts do not
 * depend on it.
 *
 *   kernel_icount KERNELS OP ROWS COLS [setup]   OP: a format of the int8 path (matmul_q8 on x
 *                                                quantized), f32, f16 (matmul), quantize
 *                                                (quantize_q8 of COLS), softmax (of COLS) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/ops/ops.h"

static uint32_t lcg = 12345u;
static uint32_t next(void) { lcg = lcg * 1664525u + 1013904223u; return lcg >> 8; }

int main(int argc, char **argv)
{
    const colibri_kernels *k;
    const char *op;
    int32_t rows, cols, b, dtype = -1, d;
    size_t i, bytes, row;
    uint8_t *w;
    float *x, *y;
    colibri_q8_block *xq;
    if (argc != 5 && !(argc == 6 && strcmp(argv[5], "setup") == 0)) {
        fprintf(stderr, "usage: kernel_icount KERNELS OP ROWS COLS [setup]\n");
        return 2;
    }
    k = colibri_kernels_named(argv[1]);
    op = argv[2];
    rows = atoi(argv[3]);
    cols = atoi(argv[4]);
    if (!k || rows < 1 || cols < 32 || cols % 256) { fprintf(stderr, "kernel_icount: no kernels %s here, or a bad shape\n", argv[1]); return 2; }
    for (d = 0; d < COLIBRI_DTYPE_COUNT; d++)
        if (strcmp(colibri_dtypes[d].name, op) == 0) dtype = d;
    bytes = colibri_row_bytes(dtype >= 0 ? (colibri_dtype)dtype : COLIBRI_DTYPE_F32, (size_t)cols) * (size_t)rows;
    w = calloc(bytes, 1);
    x = malloc((size_t)cols * 4);
    y = malloc((size_t)(rows > cols ? rows : cols) * 4);
    xq = malloc((size_t)(cols / 32) * sizeof *xq);
    row = bytes / (size_t)rows;   /* one random row, copied to the others: the setup stays cheap */
    for (i = 0; i < row; i++) w[i] = (uint8_t)next();
    if (dtype == COLIBRI_DTYPE_F32) for (i = 0; i < row / 4; i++) ((float *)w)[i] = (float)next() / 8388608.0f - 1.0f;
    if (dtype >= 0 && colibri_dtypes[dtype].f16_count)   /* finite, normal block scales */
        for (i = 0; i < row; i += (size_t)colibri_dtypes[dtype].block_bytes)
            for (b = 0; b < colibri_dtypes[dtype].f16_count; b++) {
                uint16_t h = (uint16_t)(0x2000u + next() % 0x400u);
                memcpy(w + i + (size_t)colibri_dtypes[dtype].f16_at + 2 * (size_t)b, &h, 2);
            }
    if (dtype == COLIBRI_DTYPE_F16) for (i = 0; i < row / 2; i++) ((uint16_t *)w)[i] = (uint16_t)(0x3000u + next() % 0x800u);
    for (i = 1; i < (size_t)rows; i++) memcpy(w + i * row, w, row);
    for (i = 0; i < (size_t)cols; i++) x[i] = (float)next() / 8388608.0f - 1.0f;
    colibri_ref_quantize_q8(xq, x, 1, cols);
    if (argc == 6) { /* the setup alone */ }
    else if (strcmp(op, "quantize") == 0) k->quantize_q8(xq, x, 1, cols);
    else if (strcmp(op, "softmax") == 0) k->softmax(x, cols);
    else if (dtype == COLIBRI_DTYPE_F32 || dtype == COLIBRI_DTYPE_F16) k->matmul(y, x, w, (colibri_dtype)dtype, 1, cols, rows);
    else if (dtype >= 0 && colibri_dtype_int8_path((colibri_dtype)dtype) && k->matmul_q8) k->matmul_q8(y, xq, w, (colibri_dtype)dtype, 1, cols, rows);
    else { fprintf(stderr, "kernel_icount: unknown op %s for %s\n", op, argv[1]); return 2; }
    printf("%g\n", (double)y[0] + (double)x[0]);   /* the result is used */
    free(w); free(x); free(y); free(xq);
    return 0;
}
