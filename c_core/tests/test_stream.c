/* Expert streaming computes bit for bit what the resident session computes: a prompt in chunks
 * (the prefill path, experts read a few ahead), then greedy decode steps (each token's experts
 * requested together, the next layer's guessed), at every budget from the minimum to all the
 * experts, with one pool and with a share per layer, guessing on and off, on one thread and on
 * several where the platform has them; and the session's plan counts the pool.
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
    colibri_sampling greedy = { 0.0f, 0, 1.0f };
    colibri_session *s;
    colibri_error err;
    uint64_t rng = 1;
    int32_t token, step;
    size_t plan;
    colibri_memory_totals totals;
    if (check(colibri_session_create(model, so, &s, &err), &err, "create")) return 1;
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
    return 0;
}

int main(int argc, char **argv)
{
    colibri_model *model;
    colibri_session_options so;
    colibri_error err;
    colibri_expert_cache_stats stats;
    uint64_t slot, min_budget, budgets[4];
    float *resident, *streamed;
    size_t vocab, n;
    int32_t scope, threads, guess, b, runs = 0, failures = 0, n_threads = 1;
    const colibri_hparams *hp;

    if (argc != 2) { fprintf(stderr, "usage: test_stream MODEL_DIR\n"); return 2; }
#ifdef COLIBRI_BARE_METAL
    if (check(load_model_files(argv[1], 0, &model, &err), &err, "load")) return 1;
#else
    if (check(colibri_model_open(argv[1], 0, &model, &err), &err, "open")) return 1;   /* pread from weights.bin */
    n_threads = 2;
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
                colibri_status st = colibri_session_create(model, &so, &s, &err);
                snprintf(want, sizeof want, "at least %llu bytes", (unsigned long long)min_budget);
                if (st != COLIBRI_E_ARG || !strstr(err.message, want)) {
                    fprintf(stderr, "budget %llu: %s, \"%s\"\n", (unsigned long long)so.expert_budget,
                            colibri_status_name(st), err.message);
                    return 1;
                }
            }
            for (b = 0; b < 4; b++) {
                for (guess = 0; guess <= 1; guess++) {
                    so.expert_budget = budgets[b];
                    so.expert_io = guess ? 0 : COLIBRI_EXPERT_IO_NO_PREFETCH;
                    if (run(model, &so, streamed, vocab, &stats)) return 1;
                    runs++;
                    if (memcmp(resident, streamed, n * sizeof(float)) != 0) {
                        failures++;
                        fprintf(stderr, "threads %d, %s cache, budget %llu (%d slots), guessing %s: logits differ\n",
                                threads, scope ? "per-layer" : "global", (unsigned long long)budgets[b], stats.slots,
                                guess ? "on" : "off");
                    }
                    if (stats.hits + stats.misses == 0 || stats.bytes_read < stats.misses * 1u) {
                        failures++;
                        fprintf(stderr, "budget %llu: no demands counted\n", (unsigned long long)budgets[b]);
                    }
                }
            }
        }
    }
    printf("%d streamed runs, %d differ from the resident run (%zu logits each)\n", runs, failures, n);
    free(resident);
    free(streamed);
    colibri_model_close(model);
#ifdef COLIBRI_BARE_METAL
    free_model_files();
#endif
    return failures != 0;
}
