/* Aggregators: combine expert outputs into the layer output, and the MoE block that
 * drives the triad. */
#include <math.h>
#include <string.h>

#include "moe.h"
#include "../platform.h"

/* out (n, dim): row rows[i] += gates[i] * y (i, :) */
static void combine_weighted(float *out, const float *y, const int32_t *rows, const float *gates,
                             int32_t m, int32_t dim)
{
    int32_t i, c;
    for (i = 0; i < m; i++) {
        float *o = out + (size_t)rows[i] * dim;
        const float *yi = y + (size_t)i * dim;
        for (c = 0; c < dim; c++) o[c] += yi[c] * gates[i];
    }
}

const colibri_aggregator colibri_aggregator_weighted = { "weighted_sum", combine_weighted };

/* Route every token, group the (token, slot) pairs by expert with a counting sort
 * (tokens stay in order within an expert), run each hit expert once over its tokens,
 * and let the aggregator add the gated outputs.  Experts run in id order, as
 * transformers adds them. */
/* A uniform double in (0, 1] from a 64-bit counter: splitmix64, the top 53 bits. */
static double uniform(uint64_t counter)
{
    uint64_t z = counter + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return ((double)(z >> 11) + 1.0) / 9007199254740992.0;
}

/* Noisy top-k: logits (n, E) += noise * N(0, 1), each draw a function of (seed, layer, position,
 * expert) through Box-Muller on our own log and cos, so every target adds the same noise. */
static void add_noise(const colibri_routing *r, float *logits, int32_t n, int32_t E)
{
    int32_t t, e;
    for (t = 0; t < n; t++)
        for (e = 0; e < E; e++) {
            uint64_t key = r->seed ^ ((uint64_t)(uint32_t)r->layer << 48) ^ ((uint64_t)(uint32_t)(r->position + t) << 20)
                           ^ (uint64_t)(uint32_t)e;
            double g = sqrt(-2.0 * colibri_log(uniform(2 * key))) * colibri_cos(6.283185307179586 * uniform(2 * key + 1));
            logits[(size_t)t * E + e] += (float)(r->noise * g);
        }
}

/* Hash routing: token id -> experts h, h + 1, ... (mod E), h = Knuth's multiplicative hash; weights 1/k. */
static void route_by_hash(const colibri_routing *r, int32_t n, int32_t E, int32_t K, int32_t *ids, float *gates)
{
    int32_t t, j;
    for (t = 0; t < n; t++) {
        uint32_t h = (uint32_t)r->tokens[t] * 2654435761u;
        for (j = 0; j < K; j++) {
            ids[(size_t)t * K + j] = (int32_t)((h % (uint32_t)E + (uint32_t)j) % (uint32_t)E);
            gates[(size_t)t * K + j] = 1.0f / (float)K;
        }
    }
}

/* Decode (one token): the hit experts shared among the threads, each expert whole on one thread,
 * so the pool is woken once per layer instead of once per matmul.  Slot i (the i-th hit expert,
 * in id order) has its own rows of h1, h3, ye, xe and the quantized-input scratch; each expert
 * runs the same kernel calls as on one thread, and the outputs are added afterwards in id order:
 * the same bits as the sequential loop. */
typedef struct experts_job {
    const colibri_moe *moe;
    const colibri_compute *k;
    const colibri_hparams *hp;
    const colibri_layer_weights *lw;
    const colibri_moe_buffers *b;
    const float *x;             /* (1, dim) */
    const int32_t *slot_expert; /* (n_slots) expert ids */
    int32_t n_slots;
} experts_job;

static void experts_part(void *context, int32_t part, int32_t parts)
{
    const experts_job *j = context;
    int32_t d = j->hp->hidden_size, f = j->hp->intermediate_size, i, c;
    for (i = j->n_slots * part / parts; i < j->n_slots * (part + 1) / parts; i++) {
        const colibri_moe_buffers *b = j->b;
        colibri_compute alone;
        const float *x = j->x;
        alone.kernels = j->k->kernels;
        alone.pool = NULL;
        alone.xq = j->k->xq ? j->k->xq + (size_t)i * j->k->xq_row_blocks : NULL;
        alone.xq_row_blocks = j->k->xq_row_blocks;
        if (j->hp->gate_on_input) {   /* Llama 4: the weight scales what the expert reads */
            int32_t first = b->expert_start[j->slot_expert[i]];
            for (c = 0; c < d; c++) b->xe[(size_t)i * d + c] = x[c] * b->pair_gate[first];
            x = b->xe + (size_t)i * d;
        }
        j->moe->expert->forward(&alone, j->hp, j->lw, j->slot_expert[i], x, 1, b->h1 + (size_t)i * f, b->h3 + (size_t)i * f,
                                b->ye + (size_t)i * d);
    }
}

void colibri_moe_forward(const colibri_moe *moe, const colibri_compute *k, const colibri_hparams *hp,
                         const colibri_layer_weights *lw, const colibri_moe_buffers *b, const colibri_routing *r,
                         const float *x, int32_t n, float *out, uint64_t *profile)
{
    int32_t E = hp->n_experts, K = hp->top_k, d = hp->hidden_size;
    int32_t t, j, e, i;

    uint64_t clock = colibri_profile_start(profile);

    colibri_matmul(k, b->router_logits, x, lw->w[L_ROUTER].data, lw->w[L_ROUTER].dtype, n, d, E);   /* (n, E) */
    if (hp->router_logit_bias)
        for (t = 0; t < n; t++)
            for (e = 0; e < E; e++)
                b->router_logits[(size_t)t * E + e] += colibri_load_f32(lw->w[L_ROUTER_BIAS].data, lw->w[L_ROUTER_BIAS].dtype, (size_t)e);
    if (r->mode == COLIBRI_ROUTING_NOISY) add_noise(r, b->router_logits, n, E);
    if (r->mode == COLIBRI_ROUTING_HASH) route_by_hash(r, n, E, K, b->ids, b->gates);
    else moe->router->route(hp, lw, b->router_logits, n, b->router_scratch, b->ids, b->gates);
    colibri_profile_add(profile, COLIBRI_PHASE_ROUTER, &clock);

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
    if (r->mode == COLIBRI_ROUTING_CAPACITY) {   /* each expert keeps its first `capacity` tokens, in token order */
        double want = (double)r->capacity_factor * n * K / E;
        int32_t capacity = (int32_t)want + ((double)(int32_t)want < want);
        for (e = 0; e < E; e++) {
            int32_t m = b->expert_start[e + 1] - b->expert_start[e];
            if (m > capacity) r->dropped[e] += (uint64_t)(m - capacity);
            b->dropped_from[e] = m > capacity ? b->expert_start[e] + capacity : b->expert_start[e + 1];
        }
    }

    memset(out, 0, (size_t)n * d * sizeof(float));
    colibri_profile_add(profile, COLIBRI_PHASE_DISPATCH, &clock);
    if (n == 1 && k->pool && K <= b->n_batch && r->mode != COLIBRI_ROUTING_CAPACITY) {
        experts_job job;
        int32_t slot = 0;
        for (e = 0; e < E; e++)
            if (b->expert_start[e + 1] > b->expert_start[e]) b->slot_expert[slot++] = e;
        job.moe = moe; job.k = k; job.hp = hp; job.lw = lw; job.b = b; job.x = x;
        job.slot_expert = b->slot_expert; job.n_slots = slot;
        colibri_platform_pool_run(k->pool, experts_part, &job, slot);
        colibri_profile_add(profile, COLIBRI_PHASE_EXPERTS, &clock);
        for (i = 0; i < slot; i++) {
            int32_t first = b->expert_start[b->slot_expert[i]];
            if (hp->gate_on_input) b->pair_gate[first] = 1.0f;   /* the output adds as is */
            moe->aggregator->combine(out, b->ye + (size_t)i * d, b->pair_token + first, b->pair_gate + first, 1, d);
        }
        colibri_profile_add(profile, COLIBRI_PHASE_AGGREGATION, &clock);
        E = 0;   /* the routed experts are done */
    }
    for (e = 0; e < E; e++) {
        int32_t first = b->expert_start[e];
        int32_t m = (r->mode == COLIBRI_ROUTING_CAPACITY ? b->dropped_from[e] : b->expert_start[e + 1]) - first;
        if (m == 0) continue;
        for (i = 0; i < m; i++)
            memcpy(b->xe + (size_t)i * d, x + (size_t)b->pair_token[first + i] * d, (size_t)d * sizeof(float));
        if (hp->gate_on_input) {   /* Llama 4: the weight scales what the expert reads; its output adds as is */
            for (i = 0; i < m; i++) {
                for (j = 0; j < d; j++) b->xe[(size_t)i * d + j] *= b->pair_gate[first + i];
                b->pair_gate[first + i] = 1.0f;
            }
        }
        colibri_profile_add(profile, COLIBRI_PHASE_DISPATCH, &clock);
        moe->expert->forward(k, hp, lw, e, b->xe, m, b->h1, b->h3, b->ye);
        colibri_profile_add(profile, COLIBRI_PHASE_EXPERTS, &clock);
        moe->aggregator->combine(out, b->ye, b->pair_token + first, b->pair_gate + first, m, d);
        colibri_profile_add(profile, COLIBRI_PHASE_AGGREGATION, &clock);
    }

    if (hp->shared_intermediate_size) {   /* every token, after the routed sum, as transformers adds it */
        float *gate = b->router_logits;    /* (n, 1): the logits are spent */
        colibri_swiglu(k, hp->activation, lw->w[L_SHARED_W1], lw->w[L_SHARED_W3], lw->w[L_SHARED_W2], d, hp->shared_intermediate_size,
                       x, n, b->h1, b->h3, b->ye);
        colibri_profile_add(profile, COLIBRI_PHASE_EXPERTS, &clock);
        if (hp->shared_gate) colibri_matmul(k, gate, x, lw->w[L_SHARED_GATE].data, lw->w[L_SHARED_GATE].dtype, n, d, 1);
        for (t = 0; t < n; t++) {
            float g = hp->shared_gate ? 1.0f / (1.0f + colibri_expf(-gate[t])) : 1.0f;
            for (i = 0; i < d; i++) out[(size_t)t * d + i] += g * b->ye[(size_t)t * d + i];
        }
        colibri_profile_add(profile, COLIBRI_PHASE_AGGREGATION, &clock);
    }
}
