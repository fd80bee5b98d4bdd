/* colibri_matmul: a matmul shared by the session's threads.  One token: each thread takes a run
 * of the weight rows (decode reads every weight once, so the threads split the memory traffic);
 * several tokens: each takes a run of tokens.  Each output is computed by the same kernel call
 * as with one thread, so the result is the same whatever the thread count. */
#include "ops.h"
#include "../platform.h"

/* Below this many multiply-adds a matmul runs on the calling thread: waking the others costs more. */
#define PARALLEL_MIN_MACS (1u << 18)

typedef struct matmul_job {
    const colibri_kernels *kernels;
    float *y;
    const float *x;
    const void *w;
    colibri_dtype dtype;
    int32_t n, cols, rows;
} matmul_job;

static void matmul_part(void *context, int32_t part, int32_t parts)
{
    const matmul_job *j = context;
    if (j->n == 1) {
        int32_t r0 = (int32_t)((int64_t)j->rows * part / parts), r1 = (int32_t)((int64_t)j->rows * (part + 1) / parts);
        if (r1 > r0)
            j->kernels->matmul(j->y + r0, j->x, (const uint8_t *)j->w + (size_t)r0 * colibri_row_bytes(j->dtype, (size_t)j->cols),
                               j->dtype, 1, j->cols, r1 - r0);
    } else {
        int32_t t0 = (int32_t)((int64_t)j->n * part / parts), t1 = (int32_t)((int64_t)j->n * (part + 1) / parts);
        if (t1 > t0)
            j->kernels->matmul(j->y + (size_t)t0 * j->rows, j->x + (size_t)t0 * j->cols, j->w, j->dtype, t1 - t0,
                               j->cols, j->rows);
    }
}

void colibri_matmul(const colibri_compute *c, float *y, const float *x, const void *w, colibri_dtype dtype,
                    int32_t n, int32_t cols, int32_t rows)
{
    matmul_job job;
    if (!c->pool || (uint64_t)n * (uint64_t)cols * (uint64_t)rows < PARALLEL_MIN_MACS) {
        c->kernels->matmul(y, x, w, dtype, n, cols, rows);
        return;
    }
    job.kernels = c->kernels; job.y = y; job.x = x; job.w = w; job.dtype = dtype;
    job.n = n; job.cols = cols; job.rows = rows;
    colibri_platform_pool_run(c->pool, matmul_part, &job);
}
