/* SPDX-License-Identifier: MIT */
/* Routers: logits (n, E) -> expert ids (n, k) and gate weights (n, k).
 *
 * One parameterised router covers the families (hparams: router_*, n_groups, ...):
 *   score     s = softmax(logits), sigmoid(logits) or the logits themselves
 *   choose    c = s (+ selection_bias: DeepSeek-V3's correction, for choosing only); with
 *             groups, only the experts of the topk_groups best groups (a group ranks by its
 *             best c, or the sum of its best two); then the top_k largest c
 *   weigh     w = s of the chosen, or a softmax over their logits; renormalised to sum 1
 *             (+ normalize_eps) when asked; times routed_scale
 * Ties go to the lowest id, so every target chooses the same experts.  Phi-3.5-MoE's sparsemixer
 * is the other model router; the research routers (noisy top-k, hash routing) come last, and
 * colibri_router_for picks a session's.  Each is a colibri_router_def (colibri/moe.h): the model's
 * are registered by name (registry.c), the research ones are session modes. */
#include <math.h>

#include "moe.h"

int32_t colibri_best_untaken(const float *v, int32_t n, const int32_t *taken, int32_t n_taken)
{
    int32_t best = -1, i, p;
    for (i = 0; i < n; i++) {
        int is_taken = 0;
        for (p = 0; p < n_taken; p++) is_taken |= taken[p] == i;
        if (!is_taken && (best < 0 || v[i] > v[best])) best = i;
    }
    return best;
}

void colibri_top_k(const float *v, int32_t n, int32_t k, int32_t *ids)
{
    int32_t i, m = 0, p;
    for (i = 0; i < n; i++) {
        float x = v[i];
        if (x != x) {   /* the picks order a NaN their own way: take them */
            for (p = 0; p < k; p++) ids[p] = colibri_best_untaken(v, n, ids, p);
            return;
        }
        if (m == k && !(x > v[ids[k - 1]])) continue;
        for (p = m < k ? m++ : k - 1; p > 0 && x > v[ids[p - 1]]; p--) ids[p] = ids[p - 1];   /* ties stay behind */
        ids[p] = i;
    }
}

static float sigmoidf(float x) { return 1.0f / (1.0f + colibri_expf(-x)); }

/* (n_experts + n_groups) floats: one token's choice values and group scores */
static size_t topk_scratch(const colibri_moe_shape *shape)
{
    return ((size_t)shape->n_experts + (size_t)shape->n_groups) * sizeof(float);
}

static void route_topk(const colibri_route_call *call, float *logits, int32_t n, void *scratch, int32_t *ids,
                       float *gates)
{
    const colibri_route_core *core = call->core;
    const colibri_hparams *hp = core->hp;
    int32_t E = hp->n_experts, K = hp->top_k, G = hp->n_groups, per_group = E / G, t, i, j, g;
    float *choice = scratch, *group_value = choice + E;   /* (E), (G) */
    const colibri_weight *bias = &core->lw->w[L_SELECTION_BIAS];
    for (t = 0; t < n; t++) {
        const float *lt = logits + (size_t)t * E;
        int32_t *id = ids + (size_t)t * K;
        float *w = gates + (size_t)t * K;
        float max = lt[0], sum = 0.0f, kept = 0.0f;

        /* score, into choice[] (the chosen experts' scores are read back from it before the bias) */
        for (i = 1; i < E; i++) if (lt[i] > max) max = lt[i];
        if (hp->router_score == COLIBRI_SCORE_SOFTMAX) {
            for (i = 0; i < E; i++) { choice[i] = colibri_expf(lt[i] - max); sum += choice[i]; }
            for (i = 0; i < E; i++) choice[i] /= sum;
        } else {
            for (i = 0; i < E; i++) choice[i] = hp->router_score == COLIBRI_SCORE_SIGMOID ? sigmoidf(lt[i]) : lt[i];
        }
        if (hp->router_selection_bias)
            for (i = 0; i < E; i++) choice[i] += colibri_load_f32(bias->data, bias->dtype, (size_t)i);

        if (G > 1) {   /* rank the groups; the topk_groups best are marked +inf, the rest leave the running */
            for (g = 0; g < G; g++) {
                const float *cg = choice + (size_t)g * per_group;
                int32_t first = colibri_best_untaken(cg, per_group, NULL, 0);
                group_value[g] = cg[first];
                if (hp->group_score == COLIBRI_GROUP_TOP2_SUM) group_value[g] += cg[colibri_best_untaken(cg, per_group, &first, 1)];
            }
            for (j = 0; j < hp->topk_groups; j++) {
                int32_t best = -1;
                for (g = 0; g < G; g++)
                    if (group_value[g] != HUGE_VALF && (best < 0 || group_value[g] > group_value[best])) best = g;
                group_value[best] = HUGE_VALF;
            }
            for (g = 0; g < G; g++)
                if (group_value[g] != HUGE_VALF)
                    for (i = 0; i < per_group; i++) choice[(size_t)g * per_group + i] = -HUGE_VALF;
        }
        colibri_top_k(choice, E, K, id);

        /* weigh: the scores again (without the selection bias), or a softmax over the chosen logits */
        if (hp->router_weights == COLIBRI_WEIGHTS_SIGMOID_SELECTED) {
            for (j = 0; j < K; j++) w[j] = sigmoidf(lt[id[j]]);
        } else if (hp->router_weights == COLIBRI_WEIGHTS_SOFTMAX_SELECTED) {
            float top = lt[id[0]], total = 0.0f;
            for (j = 1; j < K; j++) if (lt[id[j]] > top) top = lt[id[j]];
            for (j = 0; j < K; j++) { w[j] = colibri_expf(lt[id[j]] - top); total += w[j]; }
            for (j = 0; j < K; j++) w[j] /= total;
        } else if (!hp->router_selection_bias && G == 1) {   /* choice[] holds the scores themselves */
            for (j = 0; j < K; j++) w[j] = choice[id[j]];
        } else {
            for (j = 0; j < K; j++) {
                float l = lt[id[j]];
                w[j] = hp->router_score == COLIBRI_SCORE_SOFTMAX ? colibri_expf(l - max) / sum
                     : hp->router_score == COLIBRI_SCORE_SIGMOID ? sigmoidf(l) : l;
            }
        }
        if (hp->normalize_topk) {
            for (j = 0; j < K; j++) kept += w[j];
            kept += hp->normalize_eps;
            for (j = 0; j < K; j++) w[j] /= kept;
        }
        if (hp->routed_scale != 1.0f)
            for (j = 0; j < K; j++) w[j] *= hp->routed_scale;
    }
}

const colibri_router_def colibri_router_topk = { "topk", route_topk, topk_scratch };
const colibri_router_def colibri_router_topk_softmax = { "topk_softmax", route_topk, topk_scratch };   /* Mixtral's name */

/* One step of Phi-3.5-MoE's sparsemixer (eval mode) over scores s (E) with `out` (-1 or an
 * expert already chosen) left out: the best expert b, and its weight softmax(s)[b] over the experts
 * that score within 2 * jitter_eps of b, relative to max(|s_j|, s_b). */
static int32_t sparsemixer_step(const float *s, int32_t E, int32_t out, float jitter_eps, float *weight)
{
    int32_t best = -1, j;
    float sum = 0.0f;
    for (j = 0; j < E; j++)
        if (j != out && (best < 0 || s[j] > s[best])) best = j;
    for (j = 0; j < E; j++) {
        float a = s[j] < 0.0f ? -s[j] : s[j], factor = a > s[best] ? a : s[best];
        if (j == out || (s[best] - s[j]) / factor > 2.0f * jitter_eps) continue;   /* masked; 0/0 is kept, as in torch */
        sum += colibri_expf(s[j] - s[best]);
    }
    *weight = 1.0f / sum;   /* exp(s_best - s_best) / sum */
    return best;
}

/* Always two experts; weights not renormalised. */
static void route_sparsemixer(const colibri_route_call *call, float *logits, int32_t n, void *scratch, int32_t *ids,
                              float *gates)
{
    const colibri_hparams *hp = ((const colibri_route_core *)call->core)->hp;
    int32_t E = hp->n_experts, t;
    (void)scratch;
    for (t = 0; t < n; t++) {
        const float *s = logits + (size_t)t * E;
        ids[2 * t] = sparsemixer_step(s, E, -1, hp->jitter_eps, &gates[2 * t]);
        ids[2 * t + 1] = sparsemixer_step(s, E, ids[2 * t], hp->jitter_eps, &gates[2 * t + 1]);
    }
}

const colibri_router_def colibri_router_sparsemixer = { "sparsemixer", route_sparsemixer, NULL };

/* routing.type's router (the loader checked it is registered) */
static const colibri_router_def *model_router(const colibri_hparams *hp)
{
    return colibri_moe_router_at(hp->router_kind);
}

/* Research routers (colibri_session_options.routing): they change what the model computes. */

/* A uniform double in (0, 1] from a 64-bit counter: splitmix64, the top 53 bits. */
static double uniform(uint64_t counter)
{
    uint64_t z = counter + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return ((double)(z >> 11) + 1.0) / 9007199254740992.0;
}

/* Noisy top-k: logits (n, E) += noise * N(0, 1), then the model's router.  Each draw is a function of
 * (seed, layer, position, expert), through Box-Muller on our own log and cos, so every target adds
 * the same noise. */
static void route_noisy(const colibri_route_call *call, float *logits, int32_t n, void *scratch, int32_t *ids,
                        float *gates)
{
    const colibri_routing *r = ((const colibri_route_core *)call->core)->r;
    const colibri_hparams *hp = ((const colibri_route_core *)call->core)->hp;
    int32_t E = hp->n_experts, t, e;
    for (t = 0; t < n; t++)
        for (e = 0; e < E; e++) {
            uint64_t key = r->seed ^ ((uint64_t)(uint32_t)r->layer << 48) ^ ((uint64_t)(uint32_t)(r->positions ? r->positions[t] : r->position + t) << 20)
                           ^ (uint64_t)(uint32_t)e;
            double g = sqrt(-2.0 * colibri_log(uniform(2 * key))) * colibri_cos(6.283185307179586 * uniform(2 * key + 1));
            logits[(size_t)t * E + e] += (float)(r->noise * g);
        }
    model_router(hp)->route(call, logits, n, scratch, ids, gates);
}

/* no scratch of its own: the session sizes the model router's */
const colibri_router_def colibri_router_noisy = { "noisy", route_noisy, NULL };

/* Hash routing: token id -> experts h, h + 1, ... (mod E), h = Knuth's multiplicative hash; weights
 * 1/k.  The logits are not read. */
static void route_hash(const colibri_route_call *call, float *logits, int32_t n, void *scratch, int32_t *ids,
                       float *gates)
{
    const colibri_routing *r = ((const colibri_route_core *)call->core)->r;
    int32_t E = call->shape.n_experts, K = call->shape.top_k, t, j;
    (void)logits; (void)scratch;
    for (t = 0; t < n; t++) {
        uint32_t h = (uint32_t)r->tokens[t] * 2654435761u;
        for (j = 0; j < K; j++) {
            ids[(size_t)t * K + j] = (int32_t)((h % (uint32_t)E + (uint32_t)j) % (uint32_t)E);
            gates[(size_t)t * K + j] = 1.0f / (float)K;
        }
    }
}

const colibri_router_def colibri_router_hash = { "hash", route_hash, NULL };

const colibri_router_def *colibri_router_for(const colibri_hparams *hp, int32_t mode)
{
    if (mode == COLIBRI_ROUTING_NOISY) return &colibri_router_noisy;
    if (mode == COLIBRI_ROUTING_HASH) return &colibri_router_hash;
    return model_router(hp);   /* the model's, and capacity routing's */
}

colibri_moe_shape colibri_moe_shape_of(const colibri_hparams *hp)
{
    colibri_moe_shape shape;
    shape.n_experts = hp->n_experts;
    shape.top_k = hp->top_k;
    shape.n_groups = hp->n_groups;
    shape.dim = hp->hidden_size;
    shape.ffn = hp->intermediate_size;
    return shape;
}

size_t colibri_router_scratch_floats(const colibri_router_def *router, const colibri_hparams *hp)
{
    colibri_moe_shape shape = colibri_moe_shape_of(hp);
    size_t bytes = router->scratch_bytes ? router->scratch_bytes(&shape) : 0;
    return (bytes + sizeof(float) - 1) / sizeof(float);
}

size_t colibri_route_part_floats(const colibri_hparams *hp)
{
    return colibri_router_scratch_floats(model_router(hp), hp);
}

void colibri_router_run(const colibri_router_def *router, const colibri_hparams *hp, const colibri_layer_weights *lw,
                        const colibri_routing *r, float *logits, int32_t n, float *scratch, int32_t *ids, float *gates)
{
    colibri_route_core core;
    colibri_route_call call;
    core.hp = hp; core.lw = lw; core.r = r;
    call.shape = colibri_moe_shape_of(hp);
    call.layer = r ? r->layer : -1;
    call.position = r ? r->position : 0;
    call.positions = r ? r->positions : NULL;
    call.tokens = r ? r->tokens : NULL;
    call.core = &core;
    router->route(&call, logits, n, scratch, ids, gates);
}
