/* SPDX-License-Identifier: MIT */
/* Expert streaming computes bit for bit what the resident session computes: a prompt in chunks
 * (the prefill path, experts read a few ahead), then greedy decode steps (each token's experts
 * requested together, the next layer's guessed), at every budget from the minimum to all the
 * experts, with one pool and with a share per layer, guessing on and off, on one thread and on
 * several where the platform has them; and the session's plan counts the pool.  A failed or short
 * read (injected by the test's reader) is a status naming the layer, expert and bytes, and leaves the
 * session as it was.
 *
 *   test_stream MODEL_DIR */
#include "model_files.h"

#define N_PROMPT 12
#define N_STEPS 10

static int check(colibri_status st, const colibri_error *err, const char *what)
{
    if (st == COLIBRI_OK) return 0;
    fprintf(stderr, "%s: %s (%s)\n", what, err->message, colibri_status_name(st));
    return 1;
}


/* The prompt's logits, then each greedy step's, into out ((1 + N_STEPS), vocab). */
static int run(colibri_model *model, const colibri_session_options *so, float *out, size_t vocab,
               colibri_expert_cache_stats *stats)
{
    static const int32_t prompt[N_PROMPT] = { 1, 5, 9, 200, 17, 3, 3, 88, 140, 7, 61, 2 };
    colibri_sampling greedy = { .temperature = 0.0f, .top_k = 0, .top_p = 1.0f };
    colibri_session *s;
    colibri_error err;
    uint64_t rng = 1;
    int32_t token, step;
    size_t plan;
    colibri_memory_totals totals;
    void *buffer;
    if (check(create_session(model, so, &s, &buffer, &err), &err, "create")) return 1;
    if (check(colibri_session_plan(model, so, &plan, &err), &err, "plan")) return 1;
    colibri_memory(s, &totals);
    if (totals.arena_used != plan || (so->expert_budget != 0) != (totals.expert_cache != 0)) {
        fprintf(stderr, "plan %zu, arena used %zu, expert cache %zu B\n", plan, totals.arena_used, totals.expert_cache);
        return 1;
    }
    if (check(colibri_forward(s, prompt, N_PROMPT, NULL, &err), &err, "prompt")) return 1;
    memcpy(out, colibri_session_logits(s), vocab * sizeof(float));
    for (step = 1; step <= N_STEPS; step++) {
        if (check(colibri_sample(s, &greedy, &rng, &token, &err), &err, "sample") ||
            check(colibri_forward(s, &token, 1, NULL, &err), &err, "decode"))
            return 1;
        memcpy(out + (size_t)step * vocab, colibri_session_logits(s), vocab * sizeof(float));
    }
    if (stats && colibri_expert_cache_stats_get(s, stats) != COLIBRI_OK) return 1;
    colibri_session_destroy(s);
    free(buffer);
    return 0;
}

/* A reader over the model's own bytes that fails on request: the fault-injection of the bad-read test. */
typedef struct faulty_reader {
    const unsigned char *weights;
    uint64_t weights_len;
    int32_t fail_in;            /* the n-th read from now fails (1: the next); 0: none */
    int64_t fail_with;          /* what it returns: a negative errno, or the bytes a short read gives */
} faulty_reader;

static int64_t faulty_read(void *context, uint64_t offset, void *dst, size_t len)
{
    faulty_reader *r = context;
    if (r->fail_in > 0 && --r->fail_in == 0) return r->fail_with < 0 ? r->fail_with : (int64_t)len - 1;
    if (offset > r->weights_len) return 0;
    if (len > r->weights_len - offset) len = (size_t)(r->weights_len - offset);
    memcpy(dst, r->weights + offset, len);
    return (int64_t)len;
}

/* A failed or short read fails the forward call with the layer, expert and bytes named, leaves the
 * context where it was, and the same call then succeeds with the resident logits. */
static int bad_reads(colibri_model *model, const float *resident, size_t vocab)
{
    static const int32_t prompt[N_PROMPT] = { 1, 5, 9, 200, 17, 3, 3, 88, 140, 7, 61, 2 };
    colibri_sampling greedy = { .temperature = 0.0f, .top_k = 0, .top_p = 1.0f };
    colibri_session_options so;
    colibri_tensor_info info;
    faulty_reader reader;
    colibri_session *s;
    colibri_error err;
    uint64_t slot, min_budget, rng = 1;
    int32_t i, token, kind;
    void *buffer;
    memset(&reader, 0, sizeof reader);
    for (i = 0; i < colibri_model_tensor_count(model); i++) {   /* the bytes of weights.bin, as mapped or loaded */
        colibri_model_tensor(model, i, &info);
        if (i == 0) reader.weights = (const unsigned char *)info.data - info.file_offset;
        if (info.file_offset + info.file_size > reader.weights_len) reader.weights_len = info.file_offset + info.file_size;
    }
    for (kind = 0; kind < 2; kind++) {
        memset(&so, 0, sizeof so);
        so.n_ctx = 32;
        so.n_batch = 5;
        so.threads = 1;
        so.expert_io = COLIBRI_EXPERT_IO_NO_PREFETCH;
        so.expert_read = faulty_read;
        so.expert_read_context = &reader;
        if (check(colibri_expert_slots(model, &so, &slot, &min_budget, &err), &err, "slots")) return 1;
        so.expert_budget = min_budget;
        reader.fail_in = 0;
        if (check(create_session(model, &so, &s, &buffer, &err), &err, "create") ||
            check(colibri_forward(s, prompt, N_PROMPT, NULL, &err), &err, "prompt") ||
            check(colibri_sample(s, &greedy, &rng, &token, &err), &err, "sample"))
            return 1;
        reader.fail_in = 1;
        reader.fail_with = kind == 0 ? -5 : 1;   /* EIO, or one byte short */
        if (colibri_forward(s, &token, 1, NULL, &err) != COLIBRI_E_IO || !strstr(err.message, "layer ") ||
            !strstr(err.message, " expert ") || !strstr(err.message, "bytes [") ||
            !strstr(err.message, kind == 0 ? "I/O error 5" : "shorter than its table says") ||
            colibri_session_position(s) != N_PROMPT) {
            fprintf(stderr, "a %s read: status %s, \"%s\", position %d\n", kind == 0 ? "failed" : "short",
                    colibri_status_name(err.status), err.message, (int)colibri_session_position(s));
            return 1;
        }
        printf("a %s read: %s\n", kind == 0 ? "failed" : "short", err.message);
        if (check(colibri_forward(s, &token, 1, NULL, &err), &err, "the call again") ||
            memcmp(colibri_session_logits(s), resident + vocab, vocab * sizeof(float)) != 0) {
            fprintf(stderr, "after a %s read the session computes other logits\n", kind == 0 ? "failed" : "short");
            return 1;
        }
        colibri_session_destroy(s);
        free(buffer);
    }
    return 0;
}

int main(int argc, char **argv)
{
    colibri_model *model;
    colibri_session_options so;
    colibri_error err;
    colibri_expert_cache_stats stats;
    uint64_t slot, min_budget, budgets[4], demands = 0;
    float *resident, *streamed;
    size_t vocab, n;
    int32_t scope, threads, guess, b, runs = 0, failures = 0, n_threads = 1, n_direct = 0;
    const colibri_hparams *hp;

    if (argc != 2) { fprintf(stderr, "usage: test_stream MODEL_DIR\n"); return 2; }
#ifdef COLIBRI_BARE_METAL
    if (check(load_model_files(argv[1], 0, &model, &err), &err, "load")) return 1;
#else
    if (check(colibri_model_open(argv[1], 0, &model, &err), &err, "open")) return 1;   /* pread from weights.bin */
    n_threads = 2;
    n_direct = 1;
#endif
    hp = colibri_model_hparams(model);
    vocab = (size_t)hp->vocab_size;
    n = (1 + N_STEPS) * vocab;
    resident = malloc(n * sizeof(float));
    streamed = malloc(n * sizeof(float));
    memset(&so, 0, sizeof so);
    so.n_ctx = 32;
    so.n_batch = 5;   /* the prompt in chunks of 5: the prefill path, several experts per layer */

    for (threads = 1; threads <= n_threads; threads++) {
        so.threads = threads;
        so.expert_budget = 0;
        if (run(model, &so, resident, vocab, NULL)) return 1;
        for (scope = COLIBRI_CACHE_GLOBAL; scope <= COLIBRI_CACHE_PER_LAYER; scope++) {
            so.expert_cache = scope;
            if (check(colibri_expert_slots(model, &so, &slot, &min_budget, &err), &err, "slots")) return 1;
            /* the minimum, one slot more, twice it, and every expert */
            budgets[0] = min_budget;
            budgets[1] = min_budget + slot * (scope == COLIBRI_CACHE_PER_LAYER ? (uint64_t)hp->n_layers : 1u);
            budgets[2] = 2 * min_budget;
            budgets[3] = slot * (uint64_t)hp->n_experts * (uint64_t)hp->n_layers;
            /* one byte short of the minimum is refused, naming it */
            so.expert_budget = min_budget - 1;
            {
                colibri_session *s;
                char want[32];
                void *buffer;
                colibri_status st = create_session(model, &so, &s, &buffer, &err);
                free(buffer);
                snprintf(want, sizeof want, "at least %llu bytes", (unsigned long long)min_budget);
                if (st != COLIBRI_E_ARG || !strstr(err.message, want)) {
                    fprintf(stderr, "budget %llu: %s, \"%s\"\n", (unsigned long long)so.expert_budget,
                            colibri_status_name(st), err.message);
                    return 1;
                }
            }
            for (b = 0; b < 4; b++) {
                for (guess = 0; guess < 2 + n_direct; guess++) {   /* off, on, on with direct I/O */
                    so.expert_budget = budgets[b];
                    so.expert_io = guess == 0 ? COLIBRI_EXPERT_IO_NO_PREFETCH : guess == 2 ? COLIBRI_EXPERT_IO_DIRECT : 0;
                    if (guess == 2) {   /* as many slots, of direct I/O's size */
                        uint64_t direct_slot, direct_min;
                        if (check(colibri_expert_slots(model, &so, &direct_slot, &direct_min, &err), &err, "slots")) return 1;
                        so.expert_budget = budgets[b] / slot * direct_slot;
                    }
                    if (run(model, &so, streamed, vocab, &stats)) return 1;
                    runs++;
                    if (memcmp(resident, streamed, n * sizeof(float)) != 0) {
                        failures++;
                        fprintf(stderr, "threads %d, %s cache, budget %llu (%d slots), guessing %s%s: logits differ\n",
                                (int)threads, scope ? "per-layer" : "global", (unsigned long long)so.expert_budget, (int)stats.slots,
                                guess ? "on" : "off", guess == 2 ? ", direct I/O" : "");
                    }
                    /* the experts demanded are the routing's, whatever the cache holds; without guesses
                     * every read is a miss's, at most a slot's bytes */
                    if (!demands) demands = stats.hits + stats.misses;
                    if (stats.hits + stats.misses != demands || demands == 0 ||
                        (guess == 0 && (stats.bytes_read > stats.misses * stats.slot_bytes ||
                                        stats.bytes_read < stats.misses))) {
                        failures++;
                        fprintf(stderr, "budget %llu: %llu hits + %llu misses (first run: %llu demands), %llu bytes read\n",
                                (unsigned long long)so.expert_budget, (unsigned long long)stats.hits,
                                (unsigned long long)stats.misses, (unsigned long long)demands,
                                (unsigned long long)stats.bytes_read);
                    }
                }
            }
        }
    }
    printf("%d streamed runs, %d differ from the resident run (%zu logits each)\n", (int)runs, (int)failures, n);
    so.threads = 1;
    so.expert_budget = 0;
    if (run(model, &so, resident, vocab, NULL) || bad_reads(model, resident, vocab)) return 1;
    free(resident);
    free(streamed);
    colibri_model_close(model);
#ifdef COLIBRI_BARE_METAL
    free_model_files();
#endif
    return failures != 0;
}
