/* SPDX-License-Identifier: MIT */
/* The MoE triad: Router -> Experts -> Aggregator, each behind a small interface so a
 * new MoE family plugs in a component instead of rewriting the forward pass.
 *
 *   router      logits (n, E)            -> ids (n, k), gates (n, k)
 *   expert      x (m, dim) of one expert -> y (m, dim)
 *   aggregator  y (m, dim), gates        -> out (n, dim) += gate * y, per routed token
 * and beside them, when the model has one, a shared expert every token goes through.  The block
 * (block.c) drives them; each is a definition of colibri/moe.h, found by name in the registry
 * (registry.c), the model's choice by its index in colibri_hparams.  The research routers are routers too; capacity routing (which pairs an
 * expert keeps) is the block's dispatch. */
#ifndef COLIBRI_MOE_H
#define COLIBRI_MOE_H

#include "registry.h"
#include "cache.h"
#include "../model/model.h"
#include "../ops/ops.h"

/* The session's routing mode (colibri_session_options.routing) and what it needs beyond the router
 * logits: the research routers read noise, seed, layer, position, token ids; capacity dispatch the rest. */
typedef struct colibri_routing {
    int32_t mode;               /* COLIBRI_ROUTING_* */
    float noise;                /* noisy: the noise's standard deviation */
    uint64_t seed;
    float capacity_factor;      /* capacity: an expert keeps ceil(factor * n * top_k / n_experts) pairs */
    const int32_t *tokens;      /* (n) the chunk's token ids: hash routing */
    const int32_t *positions;   /* (n) each token's position in its sequence: the noise */
    int32_t position;           /* of the chunk's first token */
    int32_t layer;
    uint64_t *dropped;          /* (n_experts) this layer's dropped-token counters */
} colibri_routing;

/* The components are colibri/moe.h's registered definitions; the block calls them by these names. */
typedef colibri_router_def colibri_router;
typedef colibri_expert_def colibri_expert;
typedef colibri_aggregator_def colibri_aggregator;

/* What colibri_route_call.core and colibri_expert_call.core point to: the core's own components read
 * the model's hyper-parameters and weights and the session's routing through them. */
typedef struct colibri_route_core {
    const colibri_hparams *hp;
    const colibri_layer_weights *lw;
    const colibri_routing *r;           /* NULL when the router runs alone (router_cli) */
} colibri_route_core;

typedef struct colibri_expert_core {
    const colibri_compute *k;
    const colibri_hparams *hp;
} colibri_expert_core;

extern const colibri_router_def colibri_router_topk_softmax;   /* colibri_router_topk under Mixtral's name */
extern const colibri_router_def colibri_router_noisy;   /* research: seeded noise on the logits, then the model's router */
extern const colibri_router_def colibri_router_hash;    /* research: experts fixed by the token id */
extern const colibri_expert_def colibri_expert_swiglu;
extern const colibri_expert_def colibri_expert_swiglu_clamped;

colibri_moe_shape colibri_moe_shape_of(const colibri_hparams *hp);

/* Floats of scratch one call of `router` takes on this model: its registration's bytes, rounded up. */
size_t colibri_router_scratch_floats(const colibri_router_def *router, const colibri_hparams *hp);
/* Floats of one routing part's scratch, whatever the session's routing mode: routing.type's router's
 * (the research routers take it, passing it on to that router, or none). */
size_t colibri_route_part_floats(const colibri_hparams *hp);

/* ids, gates (n, K) = router(logits (n, E)) over one run of tokens: the call built from hp, lw and r. */
void colibri_router_run(const colibri_router_def *router, const colibri_hparams *hp, const colibri_layer_weights *lw,
                        const colibri_routing *r, float *logits, int32_t n, float *scratch, int32_t *ids, float *gates);

/* y (m, dim) = expert(x (m, dim)) with its weights w: the call built from k, hp and w. */
void colibri_expert_run(const colibri_expert_def *expert, const colibri_compute *k, const colibri_hparams *hp,
                        const colibri_expert_weights *w, const float *x, int32_t m, float *h1, float *h3, float *y);

/* Index of the largest v[i] over i < n not yet in taken[0..n_taken), lowest index on ties; -1 when
 * all are taken: the routers' top-k, one pick at a time. */
int32_t colibri_best_untaken(const float *v, int32_t n, const int32_t *taken, int32_t n_taken);
/* ids (k) = what k picks of colibri_best_untaken give (k <= n), in one pass that keeps the k best so
 * far in order: O(n k) instead of O(n k^2). */
void colibri_top_k(const float *v, int32_t n, int32_t k, int32_t *ids);

/* ids, gates (n, K) = router(logits (n, E)), the tokens shared among k's threads in COLIBRI_ROUTE_PARTS
 * runs (several tokens), each with its own colibri_route_part_floats of scratch: the same bits as
 * one call, since a router routes each token alone. */
#define COLIBRI_ROUTE_PARTS 4
void colibri_moe_route(const colibri_router *router, const colibri_compute *k, const colibri_hparams *hp,
                       const colibri_layer_weights *lw, const colibri_routing *r, float *logits, int32_t n,
                       float *scratch, int32_t *ids, float *gates);

/* The router a session of this model uses in routing mode `mode` (COLIBRI_ROUTING_*, validated):
 * capacity routing keeps the model's router, the block drops the pairs over capacity. */
const colibri_router *colibri_router_for(const colibri_hparams *hp, int32_t mode);

/* y (m, dim) = W2 @ (act(W1 @ x) * (W3 @ x)) for x (m, dim): one gated FFN of width f with
 * weights (f, dim), (f, dim), (dim, f); h1, h3 (m, f) scratch.  Experts, shared experts and
 * dense layers all are one. */
void colibri_swiglu(const colibri_compute *k, int activation, colibri_weight w1, colibri_weight w3, colibri_weight w2,
                    int32_t dim, int32_t f, const float *x, int32_t m, float *h1, float *h3, float *y);

/* Buffers of one MoE block, carved from the session arena. */
typedef struct colibri_moe_buffers {
    float *router_logits;   /* (n_batch, n_experts) */
    float *router_scratch;  /* (COLIBRI_ROUTE_PARTS, the router's scratch floats) per part */
    int32_t *ids;           /* (n_batch, top_k) */
    float *gates;           /* (n_batch, top_k) */
    int32_t *expert_start;  /* (n_experts + 1): routed pairs grouped by expert */
    int32_t *dropped_from;  /* (n_experts) expert e computes pairs [start[e], dropped_from[e]): capacity routing drops the rest */
    int32_t *pair_token;    /* (n_batch * top_k) */
    float *pair_gate;       /* (n_batch * top_k) */
    float *xe;              /* (n_batch, dim): tokens gathered for one expert */
    float *h1;              /* (n_batch, ffn) */
    float *h3;              /* (n_batch, ffn) */
    float *ye;              /* (n_batch, dim) */
    int32_t *slot_expert;   /* (n_experts) few tokens: the hit experts, in id order, that the threads share */
    int32_t *slot_order;    /* (top_k) streaming: the slots in the order threads take them (those read first) */
    uint64_t *slot_wait;    /* (top_k) streaming: ns each slot's thread waited for its expert's reads */
    int32_t n_batch;        /* rows of xe, h1, h3, ye: a few tokens' experts run in parallel, as many as their pairs fit */
} colibri_moe_buffers;

typedef struct colibri_moe {
    const colibri_router *router;
    const colibri_expert *expert;
    const colibri_aggregator *aggregator;
} colibri_moe;


/* Expert streaming, for the block: the cache its experts come from, and what to do once a token's
 * reads for this layer are queued (guess the next layer's experts and queue theirs behind them). */
typedef struct colibri_moe_stream {
    colibri_expert_cache *cache;
    void (*guess_next)(void *context);
    void *context;
} colibri_moe_stream;

/* What one layer's MoE block computes with, built by its caller (runtime/forward.c) for each layer
 * and passed by pointer: beside it the block's functions take the tokens x (n, dim) and their out. */
typedef struct colibri_moe_context {
    const colibri_moe *moe;                 /* the triad */
    const colibri_compute *k;               /* the kernels, the thread pool */
    const colibri_hparams *hp;
    const colibri_layer_weights *lw;        /* the layer's */
    const colibri_moe_buffers *b;
    const colibri_routing *r;               /* NULL where nothing is routed (colibri_moe_expert_rows) */
    const colibri_moe_stream *stream;       /* NULL: the experts are resident */
    struct colibri_devices *dev;            /* NULL: no drivers, every expert computes here (src/devices/) */
    uint64_t *profile;                      /* NULL: not profiled */
    int32_t layer;
} colibri_moe_context;

/* out (n, dim) = MoE(x (n, dim)) for the context's layer (block.c).  A failed read (or, strict, a
 * failed device) is the status, with out unfinished. */
colibri_status colibri_moe_forward(const colibri_moe_context *c, const float *x, int32_t n, float *out,
                                   colibri_error *err);

/* y (m, dim) = expert e's FFN of x (m, dim) on the cpu, m <= b->n_batch, its weights through the
 * cache when streaming: what a device's failed call falls back to, and the cpu driver's compute. */
colibri_status colibri_moe_expert_rows(const colibri_moe_context *c, int32_t e, const float *x, int32_t m, float *y,
                                       colibri_error *err);

/* Pairs expert e keeps in this chunk: [expert_start[e], dropped_from[e]). */
static inline int32_t colibri_moe_kept(const colibri_moe_buffers *b, int32_t e)
{
    return b->dropped_from[e] - b->expert_start[e];
}

/* xe (m, dim) <- the rows of x (n, dim) that pairs [first, first + m) route (block.c): for the
 * local experts and for the devices' calls. */
void colibri_moe_gather(const colibri_moe_context *c, const float *x, int32_t first, int32_t m, float *xe);

#endif
