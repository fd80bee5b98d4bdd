/* The MoE block: one layer's x (n, dim) through the triad into out (n, dim).
 *
 *   route     logits (n, E) = x @ router^T (+ bias); the router: ids, gates (n, K)
 *   dispatch  the n * K (token, gate) pairs grouped by expert, tokens in order within an expert;
 *             the dispatch policy says which of its pairs an expert keeps (all, or with capacity
 *             routing the first ones)
 *   experts   each hit expert once over its kept tokens, in id order as transformers adds them:
 *             xe (m, dim) -> ye (m, dim); the aggregator adds out (n, dim) += gate * ye
 *   shared    out += the shared expert of every token, after the routed sum
 *
 * Decode (one token) with a thread pool shares the hit experts among the threads instead of
 * splitting each matmul, for the same bits. */
#include <string.h>

#include "moe.h"
#include "../platform.h"
#include "../util.h"

/* logits (n, E) = x (n, dim) @ router (E, dim)^T (+ router bias), then ids, gates (n, K) from the
 * session's router. */
static void route(const colibri_moe *moe, const colibri_compute *k, const colibri_hparams *hp,
                  const colibri_layer_weights *lw, const colibri_moe_buffers *b, const colibri_routing *r,
                  const float *x, int32_t n)
{
    int32_t E = hp->n_experts, t, e;
    const colibri_weight *bias = &lw->w[L_ROUTER_BIAS];
    colibri_matmul(k, b->router_logits, x, lw->w[L_ROUTER].data, lw->w[L_ROUTER].dtype, n, hp->hidden_size, E);
    if (hp->router_logit_bias)
        for (t = 0; t < n; t++)
            for (e = 0; e < E; e++) b->router_logits[(size_t)t * E + e] += colibri_load_f32(bias->data, bias->dtype, (size_t)e);
    moe->router->route(hp, lw, r, b->router_logits, n, b->router_scratch, b->ids, b->gates);
}

/* ids, gates (n, K) -> pair_token, pair_gate (n * K) grouped by expert with a counting sort, tokens
 * in order within an expert: expert e's pairs are [expert_start[e], expert_start[e + 1]). */
static void group_by_expert(const colibri_hparams *hp, const colibri_moe_buffers *b, int32_t n)
{
    int32_t E = hp->n_experts, K = hp->top_k, t, j, e, i;
    for (e = 0; e <= E; e++) b->expert_start[e] = 0;
    for (i = 0; i < n * K; i++) b->expert_start[b->ids[i] + 1]++;
    for (e = 0; e < E; e++) b->expert_start[e + 1] += b->expert_start[e];
    /* scatter the pairs; expert_start[e] serves as expert e's cursor, then shifts back */
    for (t = 0; t < n; t++) {
        for (j = 0; j < K; j++) {
            int32_t id = b->ids[(size_t)t * K + j];
            int32_t at = b->expert_start[id]++;
            b->pair_token[at] = t;
            b->pair_gate[at] = b->gates[(size_t)t * K + j];
        }
    }
    for (e = E; e > 0; e--) b->expert_start[e] = b->expert_start[e - 1];   /* undo the cursor shift */
    b->expert_start[0] = 0;
}

/* The dispatch policy: expert e computes its pairs [expert_start[e], dropped_from[e]).  All of them,
 * or with capacity routing its first ceil(capacity_factor * n * K / E), in token order; the rest are
 * added to r->dropped. */
static void keep_pairs(const colibri_hparams *hp, const colibri_moe_buffers *b, const colibri_routing *r, int32_t n)
{
    int32_t E = hp->n_experts, capacity = INT32_MAX, e;
    if (r->mode == COLIBRI_ROUTING_CAPACITY) {
        double want = (double)r->capacity_factor * n * hp->top_k / E;
        capacity = (int32_t)want + ((double)(int32_t)want < want);
    }
    for (e = 0; e < E; e++) {
        int32_t m = b->expert_start[e + 1] - b->expert_start[e];
        if (m > capacity) r->dropped[e] += (uint64_t)(m - capacity);
        b->dropped_from[e] = m > capacity ? b->expert_start[e] + capacity : b->expert_start[e + 1];
    }
}

/* xe (m, dim) <- the rows of x (n, dim) that pairs [first, first + m) route.  With gate_on_input
 * (Llama 4) the gate scales what the expert reads, and the expert's output then adds as is. */
static void gather(const colibri_hparams *hp, const colibri_moe_buffers *b, const float *x, int32_t first, int32_t m,
                   float *xe)
{
    int32_t d = hp->hidden_size, i, c;
    for (i = 0; i < m; i++) {
        float *row = xe + (size_t)i * d;
        memcpy(row, x + (size_t)b->pair_token[first + i] * d, (size_t)d * sizeof(float));
        if (hp->gate_on_input) {
            for (c = 0; c < d; c++) row[c] *= b->pair_gate[first + i];
            b->pair_gate[first + i] = 1.0f;
        }
    }
}

/* Every hit expert in turn, each over its m kept tokens with all the threads. */
static void run_experts(const colibri_moe *moe, const colibri_compute *k, const colibri_hparams *hp,
                        const colibri_layer_weights *lw, const colibri_moe_buffers *b, const float *x, float *out,
                        uint64_t *profile, uint64_t *clock)
{
    int32_t d = hp->hidden_size, e;
    for (e = 0; e < hp->n_experts; e++) {
        int32_t first = b->expert_start[e], m = b->dropped_from[e] - first;
        if (m == 0) continue;
        gather(hp, b, x, first, m, b->xe);                                            /* (m, dim) */
        colibri_profile_add(profile, COLIBRI_PHASE_DISPATCH, clock);
        moe->expert->forward(k, hp, lw, e, b->xe, m, b->h1, b->h3, b->ye);           /* (m, dim) */
        colibri_profile_add(profile, COLIBRI_PHASE_EXPERTS, clock);
        moe->aggregator->combine(out, b->ye, b->pair_token + first, b->pair_gate + first, m, d);
        colibri_profile_add(profile, COLIBRI_PHASE_AGGREGATION, clock);
    }
}

/* Decode: the hit experts shared among the threads, each expert whole on one thread, so the pool
 * is woken once per layer instead of once per matmul.  Slot i (the i-th hit expert, in id order)
 * has its own rows of xe, h1, h3, ye and the quantized-input scratch; each expert runs the same
 * kernel calls as on one thread, and the outputs are added afterwards in id order: the same bits
 * as run_experts. */
typedef struct experts_job {
    const colibri_moe *moe;
    const colibri_compute *k;
    const colibri_hparams *hp;
    const colibri_layer_weights *lw;
    const colibri_moe_buffers *b;   /* slot_expert (n_slots): the hit experts */
    const float *x;                 /* (1, dim) */
    int32_t n_slots;
} experts_job;

static void experts_part(void *context, int32_t part, int32_t parts)
{
    const experts_job *j = context;
    const colibri_moe_buffers *b = j->b;
    int32_t d = j->hp->hidden_size, f = j->hp->intermediate_size, i;
    for (i = j->n_slots * part / parts; i < j->n_slots * (part + 1) / parts; i++) {
        int32_t e = b->slot_expert[i];
        float *xe = b->xe + (size_t)i * d;   /* (1, dim) */
        colibri_compute alone = *j->k;
        alone.pool = NULL;
        alone.xq = j->k->xq ? j->k->xq + (size_t)i * j->k->xq_row_blocks : NULL;
        gather(j->hp, b, j->x, b->expert_start[e], 1, xe);
        j->moe->expert->forward(&alone, j->hp, j->lw, e, xe, 1, b->h1 + (size_t)i * f, b->h3 + (size_t)i * f,
                                b->ye + (size_t)i * d);
    }
}

static void run_decode_experts(const colibri_moe *moe, const colibri_compute *k, const colibri_hparams *hp,
                               const colibri_layer_weights *lw, const colibri_moe_buffers *b, const float *x,
                               float *out, uint64_t *profile, uint64_t *clock)
{
    int32_t d = hp->hidden_size, slots = 0, e, i;
    experts_job job;
    for (e = 0; e < hp->n_experts; e++)
        if (b->dropped_from[e] > b->expert_start[e]) b->slot_expert[slots++] = e;
    job.moe = moe; job.k = k; job.hp = hp; job.lw = lw; job.b = b; job.x = x; job.n_slots = slots;
    colibri_platform_pool_run(k->pool, experts_part, &job, slots);
    colibri_profile_add(profile, COLIBRI_PHASE_EXPERTS, clock);
    for (i = 0; i < slots; i++) {
        int32_t first = b->expert_start[b->slot_expert[i]];
        moe->aggregator->combine(out, b->ye + (size_t)i * d, b->pair_token + first, b->pair_gate + first, 1, d);
    }
    colibri_profile_add(profile, COLIBRI_PHASE_AGGREGATION, clock);
}

/* out (n, dim) += g * shared expert (x (n, dim)), g = sigmoid(x @ shared_gate) or 1, after the
 * routed sum as transformers adds it. */
static void add_shared_expert(const colibri_compute *k, const colibri_hparams *hp, const colibri_layer_weights *lw,
                              const colibri_moe_buffers *b, const float *x, int32_t n, float *out,
                              uint64_t *profile, uint64_t *clock)
{
    int32_t d = hp->hidden_size, t, i;
    float *gate = b->router_logits;   /* (n, 1): the logits are spent */
    colibri_swiglu(k, hp->activation, lw->w[L_SHARED_W1], lw->w[L_SHARED_W3], lw->w[L_SHARED_W2], d,
                   hp->shared_intermediate_size, x, n, b->h1, b->h3, b->ye);   /* (n, dim) */
    colibri_profile_add(profile, COLIBRI_PHASE_EXPERTS, clock);
    if (hp->shared_gate) colibri_matmul(k, gate, x, lw->w[L_SHARED_GATE].data, lw->w[L_SHARED_GATE].dtype, n, d, 1);
    for (t = 0; t < n; t++) {
        float g = hp->shared_gate ? 1.0f / (1.0f + colibri_expf(-gate[t])) : 1.0f;
        for (i = 0; i < d; i++) out[(size_t)t * d + i] += g * b->ye[(size_t)t * d + i];
    }
    colibri_profile_add(profile, COLIBRI_PHASE_AGGREGATION, clock);
}

void colibri_moe_forward(const colibri_moe *moe, const colibri_compute *k, const colibri_hparams *hp,
                         const colibri_layer_weights *lw, const colibri_moe_buffers *b, const colibri_routing *r,
                         const float *x, int32_t n, float *out, uint64_t *profile)
{
    uint64_t clock = colibri_profile_start(profile);

    route(moe, k, hp, lw, b, r, x, n);
    colibri_profile_add(profile, COLIBRI_PHASE_ROUTER, &clock);

    group_by_expert(hp, b, n);
    keep_pairs(hp, b, r, n);
    memset(out, 0, (size_t)n * hp->hidden_size * sizeof(float));
    colibri_profile_add(profile, COLIBRI_PHASE_DISPATCH, &clock);

    /* one token on threads, with rows of xe, h1, h3, ye for each of its top_k experts */
    if (n == 1 && k->pool && hp->top_k <= b->n_batch) run_decode_experts(moe, k, hp, lw, b, x, out, profile, &clock);
    else run_experts(moe, k, hp, lw, b, x, out, profile, &clock);

    if (hp->shared_intermediate_size) add_shared_expert(k, hp, lw, b, x, n, out, profile, &clock);
}
