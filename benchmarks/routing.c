/* Routing alone, as the speed issue states it: 128 tokens x hidden 4096, 8 experts, top-2
 * (router matmul, softmax, top-k, renormalise), f32, the best kernels and a pool of THREADS (as a
 * session routes: the matmul, then the tokens' routing, both shared by the threads),
 * caches warm as in PyTorch's timing loop.  Prints the median of REPS runs in microseconds.
 *
 *   routing THREADS [REPS]      (benchmarks/vs_llamacpp.py runs it beside PyTorch) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/moe/moe.h"
#include "src/ops/ops.h"
#include "src/platform.h"

enum { TOKENS = 128, HIDDEN = 4096, EXPERTS = 8, TOP_K = 2 };

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    int32_t threads = argc > 1 ? atoi(argv[1]) : 1, reps = argc > 2 ? atoi(argv[2]) : 200, i;
    colibri_compute compute;
    colibri_hparams hp;
    colibri_layer_weights lw;
    colibri_error err;
    float *w = malloc((size_t)EXPERTS * HIDDEN * 4), *x = malloc((size_t)TOKENS * HIDDEN * 4);
    float *logits = malloc((size_t)TOKENS * EXPERTS * 4), scratch[COLIBRI_ROUTE_PARTS * (EXPERTS + 1)], *gates = malloc((size_t)TOKENS * TOP_K * 4);
    int32_t *ids = malloc((size_t)TOKENS * TOP_K * sizeof *ids);
    double *us = malloc((size_t)reps * sizeof *us);
    uint32_t seed = 1;
    if (!w || !x || !logits || !gates || !ids || !us || threads < 1 || reps < 1) { fprintf(stderr, "routing: bad arguments\n"); return 1; }
    for (i = 0; i < EXPERTS * HIDDEN; i++) { seed = seed * 1664525u + 1013904223u; w[i] = (float)(seed >> 8) / 16777216.0f - 0.5f; }
    for (i = 0; i < TOKENS * HIDDEN; i++) { seed = seed * 1664525u + 1013904223u; x[i] = (float)(seed >> 8) / 8388608.0f - 1.0f; }

    memset(&compute, 0, sizeof compute);
    compute.kernels = colibri_kernels_best();
    if (threads > 1 && colibri_platform_pool_create(threads, &compute.pool, &err) != COLIBRI_OK) {
        fprintf(stderr, "routing: %s\n", err.message);
        return 1;
    }
    memset(&hp, 0, sizeof hp);
    memset(&lw, 0, sizeof lw);
    hp.n_experts = EXPERTS; hp.top_k = TOP_K; hp.router_score = COLIBRI_SCORE_SOFTMAX; hp.n_groups = 1;
    hp.normalize_topk = 1; hp.routed_scale = 1.0f;
    lw.moe = 1;

    for (i = 0; i < reps; i++) {
        uint64_t start = colibri_platform_now_ns();
        colibri_matmul(&compute, logits, x, w, COLIBRI_DTYPE_F32, TOKENS, HIDDEN, EXPERTS);   /* (128, 8) */
        colibri_moe_route(&colibri_router_topk, &compute, &hp, &lw, NULL, logits, TOKENS, scratch, ids, gates);
        us[i] = (double)(colibri_platform_now_ns() - start) / 1e3;
    }
    qsort(us, (size_t)reps, sizeof *us, by_value);
    printf("%.1f\n", us[reps / 2]);
    fprintf(stderr, "routing alone: %s kernels, %d threads, median of %d: %.1f us (token 0 -> experts %d, %d)\n",
            compute.kernels->name, (int)threads, (int)reps, us[reps / 2], (int)ids[0], (int)ids[1]);
    if (compute.pool) colibri_platform_pool_destroy(compute.pool);
    free(w); free(x); free(logits); free(gates); free(ids); free(us);
    return 0;
}
