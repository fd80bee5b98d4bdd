/* SPDX-License-Identifier: MIT */
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
 * A few tokens (decode: one per running sequence) with a thread pool share the hit experts among
 * the threads instead of splitting each matmul, for the same bits.
 *
 * Devices (colibri/device.h, src/devices/): the calls of the hit experts bound to a driver are
 * started before the local experts run; each device's outputs are collected when the id-ordered
 * sum reaches its first expert, so the sum adds in the same order either way. */
#include <string.h>

#include "moe.h"
#include "../devices/devices.h"
#include "../platform.h"
#include "../util.h"

/* One part of a pooled routing: its run of tokens, with its own scratch. */
typedef struct route_job {
    const colibri_router *router;
    const colibri_hparams *hp;
    const colibri_layer_weights *lw;
    const colibri_routing *r;
    float *logits, *scratch;
    int32_t *ids;
    float *gates;
    int32_t n;
} route_job;

static void route_part(void *context, int32_t part, int32_t parts)
{
    const route_job *j = context;
    int32_t E = j->hp->n_experts, K = j->hp->top_k;
    int32_t t0 = (int32_t)((int64_t)j->n * part / parts), t1 = (int32_t)((int64_t)j->n * (part + 1) / parts);
    colibri_routing r;
    if (t1 <= t0) return;
    if (j->r) {   /* the research routers read the tokens' positions and ids */
        r = *j->r;
        if (r.positions) { r.positions += t0; r.position = r.positions[0]; }
        else r.position += t0;
        if (r.tokens) r.tokens += t0;
    }
    colibri_router_run(j->router, j->hp, j->lw, j->r ? &r : NULL, j->logits + (size_t)t0 * E, t1 - t0,
                       j->scratch + (size_t)part * colibri_route_part_floats(j->hp), j->ids + (size_t)t0 * K,
                       j->gates + (size_t)t0 * K);
}

void colibri_moe_route(const colibri_router *router, const colibri_compute *k, const colibri_hparams *hp,
                       const colibri_layer_weights *lw, const colibri_routing *r, float *logits, int32_t n,
                       float *scratch, int32_t *ids, float *gates)
{
    route_job job;
    job.router = router; job.hp = hp; job.lw = lw; job.r = r; job.logits = logits; job.scratch = scratch;
    job.ids = ids; job.gates = gates; job.n = n;
    if (!k->pool || n < 2 * COLIBRI_ROUTE_PARTS) route_part(&job, 0, 1);
    else colibri_platform_pool_run(k->pool, route_part, &job, COLIBRI_ROUTE_PARTS);
}

/* logits (n, E) = x (n, dim) @ router (E, dim)^T (+ router bias), then ids, gates (n, K) from the
 * session's router. */
static colibri_status route(const colibri_moe_context *c, const float *x, int32_t n, colibri_error *err)
{
    const colibri_hparams *hp = c->hp;
    const colibri_moe_buffers *b = c->b;
    const colibri_weight *bias = &c->lw->w[L_ROUTER_BIAS];
    int32_t E = hp->n_experts, t, e;
    colibri_matmul(c->k, b->router_logits, x, c->lw->w[L_ROUTER].data, c->lw->w[L_ROUTER].dtype, n, hp->hidden_size, E);
    if (hp->router_logit_bias)
        for (t = 0; t < n; t++)
            for (e = 0; e < E; e++) b->router_logits[(size_t)t * E + e] += colibri_load_f32(bias->data, bias->dtype, (size_t)e);
    colibri_moe_route(c->moe->router, c->k, hp, c->lw, c->r, b->router_logits, n, b->router_scratch, b->ids, b->gates);
    /* a registered router is a program's own code: its ids index the dispatch tables */
    for (t = 0; t < n * hp->top_k; t++)
        if (b->ids[t] < 0 || b->ids[t] >= E)
            return colibri_fail(err, COLIBRI_E_VALUE, "layer %d: router \"%s\" chose expert %d, outside [0, %d)",
                                c->layer, c->moe->router->name, b->ids[t], E);
    return COLIBRI_OK;
}

/* ids, gates (n, K) -> pair_token, pair_gate (n * K) grouped by expert with a counting sort, tokens
 * in order within an expert: expert e's pairs are [expert_start[e], expert_start[e + 1]). */
static void group_by_expert(const colibri_moe_context *c, int32_t n)
{
    const colibri_moe_buffers *b = c->b;
    int32_t E = c->hp->n_experts, K = c->hp->top_k, t, j, e, i;
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
static void keep_pairs(const colibri_moe_context *c, int32_t n)
{
    const colibri_moe_buffers *b = c->b;
    const colibri_routing *r = c->r;
    int32_t E = c->hp->n_experts, capacity = INT32_MAX, e;
    if (r->mode == COLIBRI_ROUTING_CAPACITY) {
        double want = (double)r->capacity_factor * n * c->hp->top_k / E;
        capacity = (int32_t)want + ((double)(int32_t)want < want);
    }
    for (e = 0; e < E; e++) {
        int32_t m = b->expert_start[e + 1] - b->expert_start[e];
        if (m > capacity) r->dropped[e] += (uint64_t)(m - capacity);
        b->dropped_from[e] = m > capacity ? b->expert_start[e] + capacity : b->expert_start[e + 1];
    }
}

/* With gate_on_input (Llama 4) the gate scales what the expert reads, and the expert's output then
 * adds as is. */
void colibri_moe_gather(const colibri_moe_context *c, const float *x, int32_t first, int32_t m, float *xe)
{
    const colibri_moe_buffers *b = c->b;
    int32_t d = c->hp->hidden_size, i, col;
    for (i = 0; i < m; i++) {
        float *row = xe + (size_t)i * d;
        memcpy(row, x + (size_t)b->pair_token[first + i] * d, (size_t)d * sizeof(float));
        if (c->hp->gate_on_input) {
            for (col = 0; col < d; col++) row[col] *= b->pair_gate[first + i];
            b->pair_gate[first + i] = 1.0f;
        }
    }
}

/* Where expert e's weights are: the mapped file, or the cache slot it was read into. */
static void expert_weights(const colibri_moe_context *c, int32_t e, colibri_expert_weights *w)
{
    const colibri_weight *lw = c->lw->w;
    int32_t k;
    if (c->stream) { colibri_cache_weights(c->stream->cache, c->layer, e, w); return; }
    for (k = 0; k < L_EXPERT_KINDS; k++)
        w->w[k] = lw[L_EXPERT_FIRST + k].data ? colibri_expert_weight(c->lw, L_EXPERT_FIRST + k, e) : lw[L_EXPERT_FIRST + k];
}

/* Pairs expert e computes here, on the cpu, in this chunk: 0 when none or when a device runs it. */
static int32_t local(const colibri_moe_context *c, int32_t e)
{
    return c->dev && colibri_device_of(c->dev, e) ? 0 : colibri_moe_kept(c->b, e);
}

colibri_status colibri_moe_expert_rows(const colibri_moe_context *c, int32_t e, const float *x, int32_t m, float *y,
                                       colibri_error *err)
{
    colibri_expert_weights w;
    if (c->stream) {
        colibri_status st;
        if (!colibri_cache_request(c->stream->cache, c->layer, e, 1))
            return colibri_fail(err, COLIBRI_E_NOMEM, "layer %d: no cache slot for expert %d", c->layer, e);
        st = colibri_cache_wait(c->stream->cache, c->layer, e, err);
        if (st) return st;
    }
    expert_weights(c, e, &w);
    colibri_expert_run(c->moe->expert, c->k, c->hp, &w, x, m, c->b->h1, c->b->h3, y);   /* (m, dim) */
    if (c->stream) colibri_cache_release(c->stream->cache, c->layer, e);
    return COLIBRI_OK;
}

/* Streaming: waits for expert e's reads, the wait timed as expert I/O instead of as `phase`. */
static colibri_status wait_for(const colibri_moe_context *c, int32_t e, int32_t phase, uint64_t *clock,
                               colibri_error *err)
{
    colibri_status st;
    colibri_profile_add(c->profile, phase, clock);
    st = colibri_cache_wait(c->stream->cache, c->layer, e, err);
    *clock = colibri_profile_start(c->profile);
    return st;
}

#define WHOLE_EXPERTS_TOKENS 32  /* up to this many tokens, each hit expert runs whole on one thread */
#define LOOKAHEAD 4     /* streaming: experts of the layer whose reads are queued ahead of the one computed */

/* Every hit expert in turn, each over its m kept tokens with all the threads.  Streaming, the next
 * few hit experts' reads are queued while one computes, as far as free slots allow. */
static colibri_status run_experts(const colibri_moe_context *c, const float *x, float *out, uint64_t *clock,
                                  colibri_error *err)
{
    const colibri_moe_buffers *b = c->b;
    const colibri_moe_stream *stream = c->stream;
    int32_t d = c->hp->hidden_size, E = c->hp->n_experts, e, ahead = 0, in_flight = 0;
    for (e = 0; e < E; e++) {
        int32_t first = b->expert_start[e], m = colibri_moe_kept(b, e);
        colibri_expert_weights w;
        if (m == 0) continue;
        if (!local(c, e)) {   /* a device's: its outputs, in this expert's place in the sum */
            colibri_status st = colibri_devices_collect(c, colibri_device_of(c->dev, e), err);
            if (st) return st;
            colibri_profile_add(c->profile, COLIBRI_PHASE_EXPERTS, clock);
            c->moe->aggregator->combine(out, colibri_devices_output(c, e), b->pair_token + first, b->pair_gate + first,
                                        m, d);
            colibri_profile_add(c->profile, COLIBRI_PHASE_AGGREGATION, clock);
            continue;
        }
        if (stream) {
            colibri_status st;
            if (ahead <= e) {
                if (!colibri_cache_request(stream->cache, c->layer, e, 1))
                    return colibri_fail(err, COLIBRI_E_NOMEM, "layer %d: no cache slot for expert %d", c->layer, e);
                ahead = e + 1;
            } else {
                in_flight--;
            }
            for (; ahead < E && in_flight < LOOKAHEAD; ahead++) {
                if (!local(c, ahead)) continue;
                if (!colibri_cache_request(stream->cache, c->layer, ahead, 0)) break;
                in_flight++;
            }
            st = wait_for(c, e, COLIBRI_PHASE_DISPATCH, clock, err);
            if (st) return st;
        }
        colibri_moe_gather(c, x, first, m, b->xe);                                     /* (m, dim) */
        colibri_profile_add(c->profile, COLIBRI_PHASE_DISPATCH, clock);
        expert_weights(c, e, &w);
        colibri_expert_run(c->moe->expert, c->k, c->hp, &w, b->xe, m, b->h1, b->h3, b->ye);   /* (m, dim) */
        if (stream) colibri_cache_release(stream->cache, c->layer, e);
        colibri_profile_add(c->profile, COLIBRI_PHASE_EXPERTS, clock);
        c->moe->aggregator->combine(out, b->ye, b->pair_token + first, b->pair_gate + first, m, d);
        colibri_profile_add(c->profile, COLIBRI_PHASE_AGGREGATION, clock);
    }
    return COLIBRI_OK;
}

#ifndef COLIBRI_ONE_THREAD
/* Few tokens (decode: one, or one per running sequence): the hit experts shared among the threads,
 * each expert whole on one thread, so the pool is woken once per wave of experts instead of once
 * per matmul.  Expert e's kept pairs [expert_start[e], + m) have their own rows of xe, h1, h3, ye and
 * of the quantized-input scratch, counted from the wave's first pair: a wave is the run of experts
 * whose pairs fit the n_batch rows.  Each expert runs the same kernel calls as on one thread, and
 * the outputs are added after each wave in id order: the same bits as run_experts. */
typedef struct experts_job {
    const colibri_moe_context *c;   /* b->slot_expert (n_slots): the wave's hit experts */
    const float *x;                 /* (n, dim) */
    int32_t n_slots;
    int32_t row0;                   /* the wave's first pair: row 0 of its buffers */
} experts_job;

static void experts_part(void *context, int32_t part, int32_t parts)
{
    const experts_job *j = context;
    const colibri_moe_context *c = j->c;
    const colibri_moe_buffers *b = c->b;
    int32_t d = c->hp->hidden_size, f = c->hp->intermediate_size, p;
    for (p = j->n_slots * part / parts; p < j->n_slots * (part + 1) / parts; p++) {
        int32_t i = c->stream ? b->slot_order[p] : p, e = b->slot_expert[i];
        int32_t first = b->expert_start[e], m = colibri_moe_kept(b, e), row = first - j->row0;
        float *xe = b->xe + (size_t)row * d;   /* (m, dim) */
        colibri_compute alone = *c->k;
        colibri_expert_weights w;
        alone.pool = NULL;
        alone.xq = c->k->xq ? c->k->xq + (size_t)row * c->k->xq_row_blocks : NULL;
        colibri_moe_gather(c, j->x, first, m, xe);
        if (c->stream) b->slot_wait[i] = colibri_cache_await(c->stream->cache, c->layer, e);
        expert_weights(c, e, &w);
        colibri_expert_run(c->moe->expert, &alone, c->hp, &w, xe, m, b->h1 + (size_t)row * f, b->h3 + (size_t)row * f,
                           b->ye + (size_t)row * d);
    }
}

static colibri_status run_experts_whole(const colibri_moe_context *c, const float *x, float *out, uint64_t *clock,
                                        colibri_error *err)
{
    const colibri_moe_buffers *b = c->b;
    const colibri_moe_stream *stream = c->stream;
    int32_t d = c->hp->hidden_size, E = c->hp->n_experts, e0, e1, e, i, collected = 0;
    experts_job job;
    for (e = 0; e < E; e++)   /* a registered router may choose an expert twice for a token */
        if (b->expert_start[e + 1] - b->expert_start[e] > b->n_batch) return run_experts(c, x, out, clock, err);
    for (e0 = 0; e0 < E; e0 = e1) {
        int32_t slots = 0;
        for (e1 = e0; e1 < E && b->expert_start[e1 + 1] - b->expert_start[e0] <= b->n_batch; e1++)
            if (local(c, e1)) b->slot_expert[slots++] = e1;
        if (stream) {   /* requested already (colibri_moe_forward): the threads take those in a slot first */
            int32_t n = 0, pass;
            for (pass = 0; pass < 2; pass++)
                for (i = 0; i < slots; i++)
                    if (colibri_cache_ready(stream->cache, c->layer, b->slot_expert[i]) == !pass) b->slot_order[n++] = i;
        }
        job.c = c; job.x = x; job.n_slots = slots; job.row0 = b->expert_start[e0];
        if (slots) colibri_platform_pool_run(c->k->pool, experts_part, &job, slots);
        if (stream) {
            uint64_t waited = 0;   /* the longest a thread waited: the forward pass waited at least that */
            for (i = 0; i < slots; i++) {   /* a failed read shows here: what its thread computed is dropped */
                colibri_status st = colibri_cache_wait(stream->cache, c->layer, b->slot_expert[i], err);
                if (st) return st;
                colibri_cache_release(stream->cache, c->layer, b->slot_expert[i]);
                if (b->slot_wait[i] > waited) waited = b->slot_wait[i];
            }
            stream->cache->stats.io_wait_ns += waited;
            if (c->profile) { c->profile[COLIBRI_PHASE_EXPERT_IO] += waited; *clock += waited; }
        }
        if (c->dev && !collected) {
            colibri_status st = colibri_devices_collect_all(c, err);
            if (st) return st;
            collected = 1;
        }
        colibri_profile_add(c->profile, COLIBRI_PHASE_EXPERTS, clock);
        for (e = e0; e < e1; e++) {   /* in id order: the slots' and the devices' outputs */
            int32_t first = b->expert_start[e], m = colibri_moe_kept(b, e);
            const float *y;   /* (m, dim) */
            if (!m) continue;
            y = local(c, e) ? b->ye + (size_t)(first - job.row0) * d : colibri_devices_output(c, e);
            c->moe->aggregator->combine(out, y, b->pair_token + first, b->pair_gate + first, m, d);
        }
        colibri_profile_add(c->profile, COLIBRI_PHASE_AGGREGATION, clock);
    }
    return COLIBRI_OK;
}
#endif

/* out (n, dim) += g * shared expert (x (n, dim)), g = sigmoid(x @ shared_gate) or 1, after the
 * routed sum as transformers adds it. */
static void add_shared_expert(const colibri_moe_context *c, const float *x, int32_t n, float *out, uint64_t *clock)
{
    const colibri_hparams *hp = c->hp;
    const colibri_layer_weights *lw = c->lw;
    const colibri_moe_buffers *b = c->b;
    int32_t d = hp->hidden_size, t, i;
    float *gate = b->router_logits;   /* (n, 1): the logits are spent */
    colibri_swiglu(c->k, hp->activation, lw->w[L_SHARED_W1], lw->w[L_SHARED_W3], lw->w[L_SHARED_W2], d,
                   hp->shared_intermediate_size, x, n, b->h1, b->h3, b->ye);   /* (n, dim) */
    colibri_profile_add(c->profile, COLIBRI_PHASE_EXPERTS, clock);
    if (hp->shared_gate) colibri_matmul(c->k, gate, x, lw->w[L_SHARED_GATE].data, lw->w[L_SHARED_GATE].dtype, n, d, 1);
    for (t = 0; t < n; t++) {
        float g = hp->shared_gate ? 1.0f / (1.0f + colibri_expf(-gate[t])) : 1.0f;
        for (i = 0; i < d; i++) out[(size_t)t * d + i] += g * b->ye[(size_t)t * d + i];
    }
    colibri_profile_add(c->profile, COLIBRI_PHASE_AGGREGATION, clock);
}

colibri_status colibri_moe_forward(const colibri_moe_context *c, const float *x, int32_t n, float *out,
                                   colibri_error *err)
{
    const colibri_hparams *hp = c->hp;
    uint64_t clock = colibri_profile_start(c->profile);
    colibri_status st;
    int32_t e;

    if ((st = route(c, x, n, err)) != COLIBRI_OK) return st;
    colibri_profile_add(c->profile, COLIBRI_PHASE_ROUTER, &clock);

    group_by_expert(c, n);
    keep_pairs(c, n);
    memset(out, 0, (size_t)n * hp->hidden_size * sizeof(float));
    /* the devices' calls first, so they compute while the local experts do */
    if (c->dev && (st = colibri_devices_start_calls(c, x, err)) != COLIBRI_OK) {
        colibri_devices_drain(c->dev);
        return st;
    }
    /* streaming one token: its experts' reads first, then the guesses for the next layer behind them */
    if (c->stream && n == 1) {
        for (e = 0; e < hp->n_experts; e++)
            if (local(c, e) && !colibri_cache_request(c->stream->cache, c->layer, e, 1)) {
                if (c->dev) colibri_devices_drain(c->dev);
                return colibri_fail(err, COLIBRI_E_NOMEM, "layer %d: no cache slot for expert %d", c->layer, e);
            }
        if (c->stream->guess_next) c->stream->guess_next(c->stream->context);
    }
    colibri_profile_add(c->profile, COLIBRI_PHASE_DISPATCH, &clock);

    /* few tokens on threads, each expert whole (streaming: one token, whose experts were requested) */
#ifndef COLIBRI_ONE_THREAD
    if (c->k->pool && n <= WHOLE_EXPERTS_TOKENS && (n == 1 || !c->stream))
        st = run_experts_whole(c, x, out, &clock, err);
    else
#endif
        st = run_experts(c, x, out, &clock, err);
    if (st) {
        if (c->dev) colibri_devices_drain(c->dev);
        return st;
    }

    if (hp->shared_intermediate_size) add_shared_expert(c, x, n, out, &clock);
    return COLIBRI_OK;
}
