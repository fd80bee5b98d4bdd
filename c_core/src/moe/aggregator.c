/* Aggregators: combine expert outputs into the layer output, and the MoE block that
 * drives the triad. */
#include <string.h>

#include "moe.h"

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
void colibri_moe_forward(const colibri_moe *moe, const colibri_kernels *k, const colibri_hparams *hp,
                         const colibri_layer_weights *lw, const colibri_moe_buffers *b,
                         const float *x, int32_t n, float *out)
{
    int32_t E = hp->n_experts, K = hp->top_k, d = hp->hidden_size;
    int32_t t, j, e, i;

    k->matmul(b->router_logits, x, lw->w[L_ROUTER].data, lw->w[L_ROUTER].dtype, n, d, E);   /* (n, E) */
    if (hp->router_logit_bias)
        for (t = 0; t < n; t++)
            for (e = 0; e < E; e++)
                b->router_logits[(size_t)t * E + e] += colibri_load_f32(lw->w[L_ROUTER_BIAS].data, lw->w[L_ROUTER_BIAS].dtype, (size_t)e);
    moe->router->route(hp, lw, b->router_logits, n, b->router_scratch, b->ids, b->gates);

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

    memset(out, 0, (size_t)n * d * sizeof(float));
    for (e = 0; e < E; e++) {
        int32_t first = b->expert_start[e], m = b->expert_start[e + 1] - first;
        if (m == 0) continue;
        for (i = 0; i < m; i++)
            memcpy(b->xe + (size_t)i * d, x + (size_t)b->pair_token[first + i] * d, (size_t)d * sizeof(float));
        moe->expert->forward(k, hp, lw, e, b->xe, m, b->h1, b->h3, b->ye);
        moe->aggregator->combine(out, b->ye, b->pair_token + first, b->pair_gate + first, m, d);
    }

    if (hp->shared_intermediate_size) {   /* every token, after the routed sum, as transformers adds it */
        float *gate = b->router_logits;    /* (n, 1): the logits are spent */
        colibri_swiglu(k, lw->w[L_SHARED_W1], lw->w[L_SHARED_W3], lw->w[L_SHARED_W2], d, hp->shared_intermediate_size,
                       x, n, b->h1, b->h3, b->ye);
        if (hp->shared_gate) k->matmul(gate, x, lw->w[L_SHARED_GATE].data, lw->w[L_SHARED_GATE].dtype, n, d, 1);
        for (t = 0; t < n; t++) {
            float g = hp->shared_gate ? 1.0f / (1.0f + colibri_expf(-gate[t])) : 1.0f;
            for (i = 0; i < d; i++) out[(size_t)t * d + i] += g * b->ye[(size_t)t * d + i];
        }
    }
}
