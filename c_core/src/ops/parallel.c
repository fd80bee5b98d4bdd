/* SPDX-License-Identifier: MIT */
/* colibri_matmul: a matmul shared by the session's threads.  One token: each thread takes a run
 * of the weight rows (decode reads every weight once, so the threads split the memory traffic);
 * several tokens: each takes a run of tokens.  Each output is computed by the same kernel call
 * as with one thread, so the result is the same whatever the thread count.
 *
 * The int8_path formats take the variant's int8 path when it has one: x is quantized once, by
 * the calling thread, into the compute's scratch (in blocks as W's format wants them), and the
 * threads share the blocks. */
#include "ops.h"
#include "../platform.h"

/* Below this many multiply-adds, and this many weight bytes, a matmul runs on the calling thread:
 * waking the others costs more.  The bytes count for one token, where a matmul streams its
 * weights (a 64 x 1024 f32 router reads 256 KiB for 64 K multiply-adds). */
#define PARALLEL_MIN_MACS (1u << 18)
#define PARALLEL_MIN_BYTES (1u << 17)
/* A shared matmul's parts (runs of rows or tokens): more than threads, so a thread slowed by a
 * neighbour takes fewer. */
#define MATMUL_PARTS 4

typedef struct matmul_job {
    const colibri_kernels *kernels;
    float *y;
    const float *x;                 /* the float path */
    const colibri_q8_block *xq;     /* the int8 path: NULL for the float one */
    const void *w;
    colibri_dtype dtype;
    int32_t n, cols, rows;
} matmul_job;

/* Rows [r0, r1) for tokens [t0, t1). */
static void matmul_range(const matmul_job *j, int32_t t0, int32_t t1, int32_t r0, int32_t r1)
{
    size_t row_bytes = colibri_row_bytes(j->dtype, (size_t)j->cols);
    const uint8_t *w = (const uint8_t *)j->w + (size_t)r0 * row_bytes;
    float *y = j->y + (size_t)t0 * j->rows + r0;
    int32_t t;
    if (r1 <= r0 || t1 <= t0) return;
    if (r0 == 0 && r1 == j->rows) {   /* whole rows: one call over the tokens */
        if (j->xq) j->kernels->matmul_q8(y, j->xq + (size_t)t0 * (j->cols / COLIBRI_BLOCK), w, j->dtype, t1 - t0, j->cols, j->rows);
        else j->kernels->matmul(y, j->x + (size_t)t0 * j->cols, w, j->dtype, t1 - t0, j->cols, j->rows);
        return;
    }
    for (t = t0; t < t1; t++, y += j->rows) {   /* a run of rows: y's row stride is `rows`, so one token a call */
        if (j->xq) j->kernels->matmul_q8(y, j->xq + (size_t)t * (j->cols / COLIBRI_BLOCK), w, j->dtype, 1, j->cols, r1 - r0);
        else j->kernels->matmul(y, j->x + (size_t)t * j->cols, w, j->dtype, 1, j->cols, r1 - r0);
    }
}

static void matmul_part(void *context, int32_t part, int32_t parts)
{
    const matmul_job *j = context;
    int64_t g = colibri_dtypes[j->dtype].rows, groups = j->rows / g;   /* interleaved rows split by whole groups */
    if (j->n == 1)
        matmul_range(j, 0, 1, (int32_t)(groups * part / parts * g), (int32_t)(groups * (part + 1) / parts * g));
    else
        matmul_range(j, (int32_t)((int64_t)j->n * part / parts), (int32_t)((int64_t)j->n * (part + 1) / parts), 0, j->rows);
}

void colibri_quantize_q8_for(const colibri_kernels *k, colibri_dtype dtype, colibri_q8_block *xq, const float *x,
                             int32_t n, int32_t cols)
{
    (colibri_dtypes[dtype].block == 256 ? k->quantize_q8_256 : k->quantize_q8)(xq, x, n, cols);
}

void colibri_matmul(const colibri_compute *c, float *y, const float *x, const void *w, colibri_dtype dtype,
                    int32_t n, int32_t cols, int32_t rows)
{
    matmul_job job;
    job.kernels = c->kernels; job.y = y; job.x = x; job.xq = NULL; job.w = w; job.dtype = dtype;
    job.n = n; job.cols = cols; job.rows = rows;
    if (colibri_dtype_int8_path(dtype) && c->kernels->matmul_q8 && c->xq) {
        colibri_quantize_q8_for(c->kernels, dtype, c->xq, x, n, cols);
        job.xq = c->xq;
    }
    if (!c->pool || ((uint64_t)n * (uint64_t)cols * (uint64_t)rows < PARALLEL_MIN_MACS
                     && (uint64_t)rows * colibri_row_bytes(dtype, (size_t)cols) < PARALLEL_MIN_BYTES))
        matmul_range(&job, 0, n, 0, rows);
    else colibri_platform_pool_run(c->pool, matmul_part, &job, MATMUL_PARTS < (n == 1 ? rows : n) ? MATMUL_PARTS : (n == 1 ? rows : n));
}
