/* SPDX-License-Identifier: MIT */
/* The spec's mixtral_router.c (section 4.1): a program adds its own routers to colibri without
 * touching the engine, registering them by name before it opens a model; the model's
 * colibri_model.json picks one with `routing.type`.  Two routers, each keeping the spec's
 * expert_counts (how many tokens each expert was given, for load balancing):
 *
 *   "user_top1"     each token to its best expert (lowest id on ties), gate 1
 *   "mixtral_top2"  Mixtral's: the two best experts, gates a softmax over their two logits; every
 *                   call is written to the log (layer, position, the logits, ids and gates)
 *
 * and an expert and an aggregator that count the rows they see and hand them on to the core's own,
 * found by name (a model names them in experts.type and routing.aggregator):
 *
 *   "counting_swiglu"  the core's "swiglu"
 *   "counting_sum"     the core's "weighted_sum"
 *
 *   mixtral_router MODEL_DIR OUT_PREFIX TOKEN...
 *       runs the tokens (the first half in one chunk, then one at a time) on one thread, writes
 *       OUT_PREFIX.logits (n_tokens, vocab) f32, OUT_PREFIX.log, and prints the expert counts, then
 *       the rows the counting expert and aggregator saw
 *   mixtral_router --registry MODEL_DIR
 *       checks the registry's refusals: a taken name, a full table, an unknown routing.type
 *
 * Exit 0: done; 1: an error, on stderr. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "colibri/colibri.h"
#include "colibri/moe.h"

#define MAX_EXPERTS 64
#define MAX_TOKENS 64

static uint32_t expert_counts[MAX_EXPERTS];   /* the spec's load-balancing counters, over all layers */
static FILE *route_log;
static uint64_t expert_rows, aggregated_rows;
static const colibri_expert_def *swiglu;
static const colibri_aggregator_def *weighted_sum;

/* Index of the largest of v (n), the lowest on ties, leaving out `skip` (-1: none). */
static int32_t best(const float *v, int32_t n, int32_t skip)
{
    int32_t i, b = -1;
    for (i = 0; i < n; i++)
        if (i != skip && (b < 0 || v[i] > v[b])) b = i;
    return b;
}

static void route_top1(const colibri_route_call *call, float *logits, int32_t n, void *scratch, int32_t *ids,
                       float *gates)
{
    int32_t E = call->shape.n_experts, t;
    (void)scratch;
    for (t = 0; t < n; t++) {
        ids[t] = best(logits + (size_t)t * E, E, -1);
        gates[t] = 1.0f;
        expert_counts[ids[t]]++;
    }
}

/* scratch: the token's two logits, as floats (the registration's 2 * sizeof(float)) */
static size_t top2_scratch(const colibri_moe_shape *shape)
{
    (void)shape;
    return 2 * sizeof(float);
}

static void route_mixtral_top2(const colibri_route_call *call, float *logits, int32_t n, void *scratch,
                               int32_t *ids, float *gates)
{
    int32_t E = call->shape.n_experts, t, e;
    float *chosen = scratch;
    for (t = 0; t < n; t++) {
        const float *l = logits + (size_t)t * E;
        int32_t *id = ids + (size_t)t * 2;
        float *g = gates + (size_t)t * 2, sum;
        id[0] = best(l, E, -1);
        id[1] = best(l, E, id[0]);
        chosen[0] = 1.0f;                               /* exp(l0 - l0) */
        chosen[1] = expf(l[id[1]] - l[id[0]]);
        sum = chosen[0] + chosen[1];
        g[0] = chosen[0] / sum;
        g[1] = chosen[1] / sum;
        expert_counts[id[0]]++;
        expert_counts[id[1]]++;
        fprintf(route_log, "%d %d", (int)call->layer, (int)(call->position + t));
        for (e = 0; e < E; e++) fprintf(route_log, " %.9g", (double)l[e]);
        fprintf(route_log, " %d %d %.9g %.9g\n", (int)id[0], (int)id[1], (double)g[0], (double)g[1]);
    }
}

static void counting_swiglu(const colibri_expert_call *call, const float *x, int32_t m, float *h1, float *h3, float *y)
{
    expert_rows += (uint64_t)m;
    swiglu->forward(call, x, m, h1, h3, y);
}

static void counting_sum(float *out, const float *y, const int32_t *rows, const float *gates, int32_t m, int32_t dim)
{
    aggregated_rows += (uint64_t)m;
    weighted_sum->combine(out, y, rows, gates, m, dim);
}

static const colibri_router_def user_top1 = { "user_top1", route_top1, NULL };
static const colibri_router_def mixtral_top2 = { "mixtral_top2", route_mixtral_top2, top2_scratch };
static const colibri_expert_def counting_expert = { "counting_swiglu", counting_swiglu };
static const colibri_aggregator_def counting_aggregator = { "counting_sum", counting_sum };

static int failed(colibri_status st, const colibri_error *err, const char *what)
{
    if (st == COLIBRI_OK) return 0;
    fprintf(stderr, "%s: %s (%s)\n", what, err->message, colibri_status_name(st));
    return 1;
}

static int run(const char *dir, const char *prefix, int n, char **words)
{
    colibri_model *model;
    colibri_session *s;
    colibri_session_options so;
    colibri_error err;
    int32_t tokens[MAX_TOKENS], half = n / 2, i, E;
    size_t vocab;
    char path[4096];
    FILE *out;

    if (n < 2 || n > MAX_TOKENS) { fprintf(stderr, "mixtral_router: 2 to %d tokens\n", MAX_TOKENS); return 1; }
    for (i = 0; i < n; i++) tokens[i] = (int32_t)atoi(words[i]);
    if (failed(colibri_register_router(&user_top1, &err), &err, "register user_top1")) return 1;
    if (failed(colibri_register_router(&mixtral_top2, &err), &err, "register mixtral_top2")) return 1;
    if (failed(colibri_register_expert(&counting_expert, &err), &err, "register counting_swiglu")) return 1;
    if (failed(colibri_register_aggregator(&counting_aggregator, &err), &err, "register counting_sum")) return 1;
    swiglu = colibri_find_expert("swiglu");
    weighted_sum = colibri_find_aggregator("weighted_sum");
    if (!swiglu || !weighted_sum) { fprintf(stderr, "mixtral_router: the core's swiglu or weighted_sum is missing\n"); return 1; }
    snprintf(path, sizeof path, "%s.log", prefix);
    if (!(route_log = fopen(path, "w"))) { perror(path); return 1; }

    if (failed(colibri_model_open(dir, 0, &model, &err), &err, "open")) return 1;
    E = colibri_model_hparams(model)->n_experts;
    if (E > MAX_EXPERTS) { fprintf(stderr, "mixtral_router: more than %d experts\n", MAX_EXPERTS); return 1; }
    vocab = (size_t)colibri_model_hparams(model)->vocab_size;
    memset(&so, 0, sizeof so);
    so.n_ctx = 2 * MAX_TOKENS;
    so.threads = 1;   /* the routers count and log without locks */
    if (failed(colibri_session_create(model, &so, &s, &err), &err, "session")) return 1;

    snprintf(path, sizeof path, "%s.logits", prefix);
    if (!(out = fopen(path, "wb"))) { perror(path); return 1; }
    for (i = half - 1; i < n; i++) {   /* tokens [0, half) in one chunk, then one at a time */
        const int32_t *chunk = i == half - 1 ? tokens : tokens + i;
        size_t len = i == half - 1 ? (size_t)half : 1;
        if (failed(colibri_forward(s, chunk, len, NULL, &err), &err, "forward")) return 1;
        if (fwrite(colibri_session_logits(s), sizeof(float), vocab, out) != vocab) { perror(path); return 1; }
    }
    fclose(out);
    fclose(route_log);
    for (i = 0; i < E; i++) printf(i + 1 < E ? "%u " : "%u\n", (unsigned)expert_counts[i]);
    printf("%llu %llu\n", (unsigned long long)expert_rows, (unsigned long long)aggregated_rows);
    colibri_session_destroy(s);
    colibri_model_close(model);
    return 0;
}

/* A taken name, then a full registry, are refused with their statuses; an unknown routing.type at
 * load names it and lists the registered routers, ours among them. */
static int check_registry(const char *dir)
{
    static colibri_router_def extra[COLIBRI_MOE_REGISTRY_SIZE];
    static char names[COLIBRI_MOE_REGISTRY_SIZE][16];
    colibri_router_def unnamed = { NULL, route_top1, NULL };
    colibri_model *model;
    colibri_error err;
    colibri_status st;
    int i;

    if (failed(colibri_register_router(&user_top1, &err), &err, "register user_top1")) return 1;
    if ((st = colibri_register_router(&user_top1, &err)) != COLIBRI_E_VALUE || !strstr(err.message, "\"user_top1\" is registered already")) {
        fprintf(stderr, "a name registered twice: %s %s\n", colibri_status_name(st), err.message);
        return 1;
    }
    if ((st = colibri_register_router(&unnamed, &err)) != COLIBRI_E_ARG) {
        fprintf(stderr, "a router without a name: %s\n", colibri_status_name(st));
        return 1;
    }
    if (colibri_find_router("user_top1") != &user_top1 || colibri_find_router("topk") != &colibri_router_topk
        || colibri_find_expert("linear") != &colibri_expert_linear || colibri_find_aggregator("sparse") != &colibri_aggr_sparse
        || colibri_find_router("nobody")) {
        fprintf(stderr, "colibri_find_* do not find what is registered\n");
        return 1;
    }

    if ((st = colibri_model_open(dir, 0, &model, &err)) != COLIBRI_E_VALUE
        || !strstr(err.message, "routing.type: unsupported value \"nobody\" (expected \"topk_softmax\", \"topk\", "
                                "\"sparsemixer\" or \"user_top1\")")) {
        fprintf(stderr, "an unknown routing.type: %s %s\n", colibri_status_name(st), err.message);
        return 1;
    }

    for (i = 0; i < COLIBRI_MOE_REGISTRY_SIZE; i++) {
        snprintf(names[i], sizeof names[i], "extra%d", i);
        extra[i].name = names[i];
        extra[i].route = route_top1;
        st = colibri_register_router(&extra[i], &err);
        if (st == COLIBRI_E_NOMEM) break;
        if (failed(st, &err, "register an extra router")) return 1;
    }
    /* the core's 3 and user_top1 came first */
    if (i != COLIBRI_MOE_REGISTRY_SIZE - 4 || !strstr(err.message, "the registry holds")) {
        fprintf(stderr, "the registry took %d extra routers before refusing: %s\n", i, err.message);
        return 1;
    }
    printf("registry ok\n");
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--registry") == 0) return check_registry(argv[2]);
    if (argc >= 4) return run(argv[1], argv[2], argc - 3, argv + 3);
    fprintf(stderr, "usage: mixtral_router MODEL_DIR OUT_PREFIX TOKEN... | mixtral_router --registry MODEL_DIR\n");
    return 1;
}
