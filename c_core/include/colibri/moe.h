/* SPDX-License-Identifier: MIT */
/* The MoE triad, public: Router -> Experts -> Aggregator, each a component registered by name.
 *
 *   router      logits (n, n_experts)      -> ids (n, top_k), gates (n, top_k)
 *   expert      x (m, dim) of one expert   -> y (m, dim)
 *   aggregator  y (m, dim), gates (m)      -> out (n, dim) += gate * y, into each pair's token row
 *
 * The core's own components are registered from the start (routers "topk_softmax", "topk",
 * "sparsemixer"; experts "swiglu", "swiglu_clamped", "linear", "mlp"; aggregators "weighted_sum",
 * "sparse").  A program adds its own with colibri_register_* BEFORE it opens a model; the model's
 * colibri_model.json names its router (`routing.type`), expert (`experts.type`, by default the
 * gated FFN `experts.activation` implies) and aggregator (`routing.aggregator`, by default
 * "weighted_sum"), and colibri_model_open fails on a name that is not registered, listing those
 * that are.  Nothing else changes: the session sizes a router's scratch from its registration
 * (colibri_session_plan includes it) and the block drives the components as it drives the core's
 * own.  The core's own read call->core, which only the core fills: a program calls them through
 * a call the core gave it (an expert of its own may hand its call on to colibri_find_expert
 * ("swiglu")->forward).
 *
 * Lifetime: the registry keeps the pointer it is given, so a registration (and its name) lives in
 * static storage, as long as any model that uses it.  Registering is not thread-safe: do it once,
 * at start-up.  The registry is static storage of COLIBRI_MOE_REGISTRY_SIZE entries per kind, the
 * core's own included; registering allocates nothing. */
#ifndef COLIBRI_MOE_PUBLIC_H
#define COLIBRI_MOE_PUBLIC_H

#include "colibri/colibri.h"

#define COLIBRI_MOE_REGISTRY_SIZE 16   /* entries per kind, the core's own included */
#define COLIBRI_MOE_NAME_MAX 31        /* bytes of a component's name */

/* What the model's colibri_model.json says of its MoE layers' shape. */
typedef struct colibri_moe_shape {
    int32_t n_experts;   /* experts.count */
    int32_t top_k;       /* routing.top_k */
    int32_t n_groups;    /* routing.groups, 1 without */
    int32_t dim;         /* hparams.hidden_size */
    int32_t ffn;         /* hparams.intermediate_size: a routed expert's width */
} colibri_moe_shape;

/* ---- Router ------------------------------------------------------------------------------------ */

/* One call of a router, over a run of n tokens of one layer. */
typedef struct colibri_route_call {
    colibri_moe_shape shape;
    int32_t layer;              /* -1 when the router runs alone (no session) */
    int32_t position;           /* of the run's first token */
    const int32_t *positions;   /* (n) each token's position in its own sequence (a run may mix sequences);
                                   NULL when the router runs alone */
    const int32_t *tokens;      /* (n) the run's token ids; NULL when the router runs alone */
    const void *core;           /* the core's own routers read the model's routing hyper-parameters
                                   and weights through it; a registered router leaves it alone */
} colibri_route_call;

/* ids, gates (n, top_k) = route(logits (n, n_experts)).  The router may overwrite logits; scratch
 * holds the registration's scratch_bytes(shape), 4-byte aligned (floats, int32s), its own for the
 * call (calls over other tokens may run at the same time, on other threads, each with its own
 * scratch: a router routes each token alone).  Each id must lie in [0, n_experts) and a token's
 * top_k ids must differ. */
typedef void (*colibri_route_fn)(const colibri_route_call *call, float *logits, int32_t n, void *scratch,
                                 int32_t *ids, float *gates);

typedef struct colibri_router_def {
    const char *name;                                           /* routing.type */
    colibri_route_fn route;
    size_t (*scratch_bytes)(const colibri_moe_shape *shape);    /* one call's scratch; NULL: none */
} colibri_router_def;

/* ---- Expert ------------------------------------------------------------------------------------ */

/* One expert's part of a routed-expert tensor, where it lies (the mapped file or a cache slot). */
typedef struct colibri_expert_tensor {
    const void *data;           /* NULL: the model has no such tensor */
    colibri_dtype dtype;
} colibri_expert_tensor;

/* One call of an expert over the m tokens routed to it. */
typedef struct colibri_expert_call {
    colibri_moe_shape shape;
    colibri_expert_tensor w1;     /* (ffn, dim) experts.w1: the gate, or an MLP's first matrix */
    colibri_expert_tensor w3;     /* (ffn, dim) experts.w3: the up projection of a gated FFN */
    colibri_expert_tensor w2;     /* (dim, ffn) experts.w2: the down projection */
    colibri_expert_tensor b1, b3, b2;   /* (ffn), (ffn), (dim) with experts.bias */
    const void *core;           /* the compute context (kernels, threads) and hyper-parameters, for
                                   colibri_expert_matmul and the core's own experts */
} colibri_expert_call;

/* y (m, dim) = expert(x (m, dim)); h1, h3 (m, ffn) are the session's scratch for the expert's
 * hidden activations. */
typedef void (*colibri_expert_fn)(const colibri_expert_call *call, const float *x, int32_t m, float *h1,
                                  float *h3, float *y);

typedef struct colibri_expert_def {
    const char *name;
    colibri_expert_fn forward;
} colibri_expert_def;

/* y (m, rows) = x (m, cols) @ W (rows, cols)^T, W one of call's parts in any weight dtype, through
 * the session's kernels and threads: what an expert multiplies with. */
void colibri_expert_matmul(const colibri_expert_call *call, const colibri_expert_tensor *w, const float *x,
                           int32_t m, int32_t cols, int32_t rows, float *y);

/* ---- Aggregator -------------------------------------------------------------------------------- */

/* out (n, dim): row rows[i] += gates[i] * y (i, :) for i < m, one expert's pairs. */
typedef void (*colibri_combine_fn)(float *out, const float *y, const int32_t *rows, const float *gates,
                                   int32_t m, int32_t dim);

typedef struct colibri_aggregator_def {
    const char *name;
    colibri_combine_fn combine;
} colibri_aggregator_def;

/* ---- Registry ---------------------------------------------------------------------------------- */

/* Adds def under def->name.  COLIBRI_E_ARG: NULL def, function or name, a name empty or longer than
 * COLIBRI_MOE_NAME_MAX; COLIBRI_E_VALUE: the name is taken; COLIBRI_E_NOMEM: the registry is full. */
colibri_status colibri_register_router(const colibri_router_def *def, colibri_error *err);
colibri_status colibri_register_expert(const colibri_expert_def *def, colibri_error *err);
colibri_status colibri_register_aggregator(const colibri_aggregator_def *def, colibri_error *err);

/* The registered component named `name`, NULL when none is. */
const colibri_router_def *colibri_find_router(const char *name);
const colibri_expert_def *colibri_find_expert(const char *name);
const colibri_aggregator_def *colibri_find_aggregator(const char *name);

/* The core's own components under the spec's names (also registered under the names above):
 *   colibri_router_topk      the parameterised top-k router (routing.score, weights, groups, ...)
 *   colibri_expert_linear    y = W1 @ x, a dense linear expert: experts.w1 alone, (dim, dim)
 *   colibri_expert_mlp       y = W2 @ act(W1 @ x) (+ biases), a non-gated MLP expert: experts.w1, w2,
 *                            act experts.activation's
 *   colibri_aggr_weighted    out += gate * y for every pair
 *   colibri_aggr_sparse      the same, skipping the pairs whose gate is 0: their y is never read,
 *                            so an expert's inf or NaN cannot reach the sum through a zero gate */
extern const colibri_router_def colibri_router_topk;
extern const colibri_expert_def colibri_expert_linear;
extern const colibri_expert_def colibri_expert_mlp;
extern const colibri_aggregator_def colibri_aggr_weighted;
extern const colibri_aggregator_def colibri_aggr_sparse;

#endif
