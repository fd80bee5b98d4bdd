/* SPDX-License-Identifier: MIT */
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
#include "colibri/device.h"

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

/* Allocator calls in 64 decode steps after an 8-token prompt, greedy and full sampling (temperature,
 * top-k, top-p) alternating; -1 when a step fails. */
static long decode_counting(colibri_session *session, const char *what)
{
    static const int32_t prompt[8] = { 1, 17, 42, 99, 5, 250, 3, 64 };
    colibri_sampling samplers[2] = { { .temperature = 0.0f, .top_k = 0, .top_p = 1.0f },
                                     { .temperature = 0.9f, .top_k = 50, .top_p = 0.9f } };
    colibri_error err;
    uint64_t rng = 7;
    int32_t token;
    int step;
    if (colibri_forward(session, prompt, 8, NULL, &err)) { fprintf(stderr, "%s prompt: %s\n", what, err.message); return -1; }
    colibri_expert_cache_stats_clear(session);   /* count the decode's reads only (resident: a no-op) */
    calls = 0;
    counting = 1;
    for (step = 0; step < 64; step++) {
        if (colibri_sample(session, &samplers[step % 2], &rng, &token, &err) ||
            colibri_forward(session, &token, 1, NULL, &err)) {
            counting = 0;
            fprintf(stderr, "%s step %d: %s\n", what, step, err.message);
            return -1;
        }
    }
    counting = 0;
    printf("allocator calls during 64 %s decode steps: %ld (position %d)\n", what, calls,
           (int)colibri_session_position(session));
    return calls;
}

static void count_bytes(void *context, const char *bytes, size_t len)
{
    (void)bytes;
    *(size_t *)context += len;
}

/* Allocator calls in a generation (colibri_generate_start/_next, 64 sampled tokens after the same
 * prompt) writing its text through a colibri_text_sink; -1 when a call fails. */
static long generation_counting(const colibri_model *model, colibri_session *session)
{
    static const int32_t prompt[8] = { 1, 17, 42, 99, 5, 250, 3, 64 };
    colibri_generate_options options = { 64, { .temperature = 0.9f, .top_k = 50, .top_p = 0.9f }, 7, 0 };
    colibri_generation g;
    colibri_text_sink sink;
    colibri_error err;
    size_t written = 0;
    int32_t token;
    colibri_session_reset(session);
    colibri_text_sink_init(&sink, count_bytes, &written);
    calls = 0;
    counting = 1;
    if (colibri_generate_start(&g, session, &options, prompt, 8, &err)) token = -2;
    else do {
        if (colibri_generate_next(&g, &token, &err)) token = -2;
        else if (token >= 0) colibri_text_put_token(&sink, model, token);
    } while (token >= 0);
    colibri_text_flush(&sink);
    counting = 0;
    if (token == -2) { fprintf(stderr, "generation: %s\n", err.message); return -1; }
    if (g.generated != 64) { fprintf(stderr, "generation: %d tokens, not 64\n", (int)g.generated); return -1; }
    printf("allocator calls during a generation of 64 tokens: %ld (%zu bytes of text)\n", calls, written);
    return calls;
}

int main(int argc, char **argv)
{
    colibri_model *model;
    colibri_session *session;
    colibri_session_options so;
    colibri_expert_cache_stats stats;
    colibri_error err;
    uint64_t slot, min_budget;

    if (argc != 2) { fprintf(stderr, "usage: test_no_alloc MODEL_DIR\n"); return 2; }
    if (colibri_model_open(argv[1], 0, &model, &err)) { fprintf(stderr, "%s\n", err.message); return 1; }
    memset(&so, 0, sizeof so);
    so.n_ctx = 128;
    if (colibri_session_create(model, &so, &session, &err)) { fprintf(stderr, "%s\n", err.message); return 1; }
    if (decode_counting(session, "resident") != 0) return 1;
    if (generation_counting(model, session) != 0) return 1;
    colibri_session_destroy(session);

    /* the same with the experts streamed: reads, guesses and evictions allocate nothing either */
    if (colibri_expert_slots(model, &so, &slot, &min_budget, &err)) { fprintf(stderr, "%s\n", err.message); return 1; }
    so.expert_budget = min_budget + slot;   /* one slot beside a layer's top_k: room for a guess */
    so.threads = 2;
    if (colibri_session_create(model, &so, &session, &err)) { fprintf(stderr, "%s\n", err.message); return 1; }
    if (decode_counting(session, "streamed") != 0) return 1;
    colibri_expert_cache_stats_get(session, &stats);
    printf("streamed: %llu expert reads, %llu guesses in those steps\n", (unsigned long long)stats.reads,
           (unsigned long long)stats.prefetches);
    if (stats.reads == 0 || stats.prefetches == 0) return 1;   /* the path under test ran */
    colibri_session_destroy(session);

    /* and with every expert on a registered device (another session's cpu driver, renamed): the
     * placement, the gathering, the calls and the latency rings allocate nothing */
    {
        colibri_session *computer;
        colibri_device_driver driver;
        const colibri_device_driver *drivers[1];
        colibri_device_stats ds;
        uint8_t placement[64 * 64];
        const colibri_hparams *hp = colibri_model_hparams(model);
        memset(&so, 0, sizeof so);
        so.n_ctx = 16;
        if (colibri_session_create(model, &so, &computer, &err)) { fprintf(stderr, "%s\n", err.message); return 1; }
        colibri_cpu_driver(computer, &driver);
        driver.name = "other";
        drivers[0] = &driver;
        if ((size_t)hp->n_layers * hp->n_experts > sizeof placement) return 1;
        memset(placement, 1, sizeof placement);
        so.n_ctx = 128;
        so.devices = drivers;
        so.n_devices = 1;
        so.placement = placement;
        if (colibri_session_create(model, &so, &session, &err)) { fprintf(stderr, "%s\n", err.message); return 1; }
        if (decode_counting(session, "device") != 0) return 1;
        colibri_device_stats_get(session, 1, &ds);
        printf("device: %llu calls, %llu experts in those steps\n", (unsigned long long)ds.calls,
               (unsigned long long)ds.experts);
        if (ds.calls == 0) return 1;
        colibri_session_destroy(session);
        colibri_session_destroy(computer);
    }
    colibri_model_close(model);
    return 0;
}
