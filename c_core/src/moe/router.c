/* Routers: logits (n, E) -> expert ids (n, k) and gate weights (n, k). */
#include "moe.h"

/* Mixtral: softmax over all experts, keep the k largest (lowest id on ties),
 * renormalise them to sum 1 when hp->normalize_topk. */
static void route_topk_softmax(const colibri_hparams *hp, const float *logits, int32_t n,
                               int32_t *ids, float *gates)
{
    int32_t E = hp->n_experts, K = hp->top_k, t, i, j;
    for (t = 0; t < n; t++) {
        const float *lt = logits + (size_t)t * E;
        int32_t *id = ids + (size_t)t * K;
        float *g = gates + (size_t)t * K;
        float max = lt[0], sum = 0.0f, kept = 0.0f;
        for (i = 1; i < E; i++) if (lt[i] > max) max = lt[i];
        for (i = 0; i < E; i++) sum += colibri_expf(lt[i] - max);
        for (j = 0; j < K; j++) {
            int32_t best = -1;
            for (i = 0; i < E; i++) {
                int32_t taken = 0, p;
                for (p = 0; p < j; p++) taken |= id[p] == i;
                if (!taken && (best < 0 || lt[i] > lt[best])) best = i;
            }
            id[j] = best;
            g[j] = colibri_expf(lt[best] - max) / sum;
            kept += g[j];
        }
        if (hp->normalize_topk)
            for (j = 0; j < K; j++) g[j] /= kept;
    }
}

const colibri_router colibri_router_topk_softmax = { "topk_softmax", route_topk_softmax };
