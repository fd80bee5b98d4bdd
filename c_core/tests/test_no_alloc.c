/* Proves that generation allocates nothing: every malloc, calloc, realloc and free in
 * the process (the C library's own included) is counted across 64 decode steps, with the
 * experts resident and then streamed through the expert cache.
 *
 *   test_no_alloc MODEL_DIR
 *
 * glibc only: the counters forward to glibc's __libc_* entry points. */
#define _GNU_SOURCE
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "colibri/colibri.h"

extern void *__libc_malloc(size_t size);
extern void *__libc_calloc(size_t n, size_t size);
extern void *__libc_realloc(void *p, size_t size);
extern void __libc_free(void *p);

static volatile int counting;
static volatile long calls;

void *malloc(size_t size) { if (counting) calls++; return __libc_malloc(size); }
void *calloc(size_t n, size_t size) { if (counting) calls++; return __libc_calloc(n, size); }
void *realloc(void *p, size_t size) { if (counting) calls++; return __libc_realloc(p, size); }
void free(void *p) { if (counting && p) calls++; __libc_free(p); }

int main(int argc, char **argv)
{
    colibri_model *model;
    colibri_session *session;
    colibri_session_options so;
    colibri_sampling samplers[2];
    colibri_error err;
    int32_t prompt[8] = { 1, 17, 42, 99, 5, 250, 3, 64 }, token;
    uint64_t rng = 7;
    int step;

    if (argc != 2) { fprintf(stderr, "usage: test_no_alloc MODEL_DIR\n"); return 2; }
    if (colibri_model_open(argv[1], 0, &model, &err)) { fprintf(stderr, "%s\n", err.message); return 1; }
    memset(&so, 0, sizeof so);
    so.n_ctx = 128;
    if (colibri_session_create(model, &so, &session, &err)) { fprintf(stderr, "%s\n", err.message); return 1; }
    if (colibri_forward(session, prompt, 8, NULL, &err)) { fprintf(stderr, "%s\n", err.message); return 1; }

    /* greedy and full sampling (temperature, top-k, top-p) alternate */
    samplers[0].temperature = 0.0f; samplers[0].top_k = 0; samplers[0].top_p = 1.0f;
    samplers[1].temperature = 0.9f; samplers[1].top_k = 50; samplers[1].top_p = 0.9f;
    counting = 1;
    for (step = 0; step < 64; step++) {
        if (colibri_sample(session, &samplers[step % 2], &rng, &token, &err) ||
            colibri_forward(session, &token, 1, NULL, &err)) {
            counting = 0;
            fprintf(stderr, "step %d: %s\n", step, err.message);
            return 1;
        }
    }
    counting = 0;
    printf("allocator calls during 64 decode steps: %ld (position %d)\n", calls,
           colibri_session_position(session));
    colibri_session_destroy(session);
    if (calls) return 1;

    /* the same with the experts streamed: reads, guesses and evictions allocate nothing either */
    {
        uint64_t slot, min_budget;
        if (colibri_expert_slots(model, &so, &slot, &min_budget, &err)) { fprintf(stderr, "%s\n", err.message); return 1; }
        so.expert_budget = min_budget + slot;   /* room for a guess beside the demanded experts */
        so.threads = 2;
    }
    if (colibri_session_create(model, &so, &session, &err) || colibri_forward(session, prompt, 8, NULL, &err)) {
        fprintf(stderr, "%s\n", err.message);
        return 1;
    }
    counting = 1;
    for (step = 0; step < 64; step++) {
        if (colibri_sample(session, &samplers[step % 2], &rng, &token, &err) ||
            colibri_forward(session, &token, 1, NULL, &err)) {
            counting = 0;
            fprintf(stderr, "streamed step %d: %s\n", step, err.message);
            return 1;
        }
    }
    counting = 0;
    {
        colibri_expert_cache_stats stats;
        colibri_expert_cache_stats_get(session, &stats);
        printf("allocator calls during 64 streamed decode steps: %ld (%llu expert reads, %llu guesses)\n", calls,
               (unsigned long long)stats.reads, (unsigned long long)stats.prefetches);
        if (stats.reads == 0) return 1;
    }
    colibri_session_destroy(session);
    colibri_model_close(model);
    return calls == 0 ? 0 : 1;
}
