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
 * Decode (one token) with a thread pool shares the hit experts among the threads instead of
 * splitting each matmul, for the same bits.
 *
 * Devices (colibri/device.h): the hit experts bound to a driver are gathered device by device and
 * their calls started before the local experts run; each device's outputs are collected (sync) when
 * the id-ordered sum reaches its first expert, so the sum adds in the same order either way.  A
 * failed call's experts are computed here instead. */
#include <string.h>

#include "moe.h"
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
        r.position += t0;
        if (r.tokens) r.tokens += t0;
    }
    colibri_router_run(j->router, j->hp, j->lw, j->r ? &r : NULL, j->logits + (size_t)t0 * E, t1 - t0,
                       j->scratch + (size_t)part * colibri_router_scratch_floats(j->router, j->hp), j->ids + (size_t)t0 * K,
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
    colibri_moe_route(moe->router, k, hp, lw, r, b->router_logits, n, b->router_scratch, b->ids, b->gates);
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

/* Where expert e's weights are: the mapped file, or the cache slot it was read into. */
static void expert_weights(const colibri_layer_weights *lw, const colibri_moe_stream *stream, int32_t layer, int32_t e,
                           colibri_expert_weights *w)
{
    int32_t k;
    if (stream) { colibri_cache_weights(stream->cache, layer, e, w); return; }
    for (k = 0; k < L_EXPERT_KINDS; k++)
        w->w[k] = lw->w[L_EXPERT_FIRST + k].data ? colibri_expert_weight(lw, L_EXPERT_FIRST + k, e) : lw->w[L_EXPERT_FIRST + k];
}

static int32_t kept(const colibri_moe_buffers *b, int32_t e) { return b->dropped_from[e] - b->expert_start[e]; }

/* Pairs expert e computes here, on the cpu, in this chunk: 0 when none or when a device runs it. */
static int32_t local(const colibri_moe_buffers *b, const colibri_devices *dev, int32_t e)
{
    return dev && dev->run_on[e] ? 0 : kept(b, e);
}

colibri_status colibri_moe_expert_rows(const colibri_moe *moe, const colibri_compute *k, const colibri_hparams *hp,
                                       const colibri_layer_weights *lw, const colibri_moe_buffers *b,
                                       const colibri_moe_stream *stream, int32_t layer, int32_t e, const float *x,
                                       int32_t m, float *y, colibri_error *err)
{
    colibri_expert_weights w;
    if (stream) {
        colibri_status st;
        if (!colibri_cache_request(stream->cache, layer, e, 1))
            return colibri_fail(err, COLIBRI_E_NOMEM, "layer %d: no cache slot for expert %d", layer, e);
        st = colibri_cache_wait(stream->cache, layer, e, err);
        if (st) return st;
    }
    expert_weights(lw, stream, layer, e, &w);
    colibri_expert_run(moe->expert, k, hp, &w, x, m, b->h1, b->h3, y);   /* (m, dim) */
    if (stream) colibri_cache_release(stream->cache, layer, e);
    return COLIBRI_OK;
}

/* Strict: a driver's failure (its message in err) as the forward's status. */
static colibri_status device_failed(colibri_error *err, const colibri_device_state *s, int32_t layer, const char *what)
{
    char detail[COLIBRI_ERROR_MESSAGE_SIZE] = "";
    if (err) memcpy(detail, err->message, sizeof detail);
    detail[sizeof detail - 1] = '\0';
    return colibri_fail(err, COLIBRI_E_DEVICE, "device %s failed to %s layer %d (strict, no fallback): %s", s->driver->name,
                        what, layer, detail);
}

/* Which device runs each hit expert, then each device's experts gathered into its rows of dev->x
 * and its call started.  Strict: a bypassed device or a failed start is the status. */
static colibri_status start_devices(const colibri_hparams *hp, const colibri_moe_buffers *b, colibri_devices *dev,
                                    int32_t layer, const float *x, colibri_error *err)
{
    int32_t E = hp->n_experts, d = hp->hidden_size, row = 0, e, i;
    uint64_t now = colibri_devices_now(dev);
    colibri_status st;
    memset(dev->run_on, 0, (size_t)E);
    for (e = 0; e < E; e++) {
        int32_t on;
        if (!kept(b, e)) continue;
        st = colibri_device_pick(dev, layer, e, now, &on, err);
        if (st) return st;
        dev->run_on[e] = (uint8_t)on;
        if (!on) { dev->dev[0].stats.experts++; dev->dev[0].stats.rows += (uint64_t)kept(b, e); }
    }
    for (i = 1; i < dev->n; i++) {
        colibri_device_state *s = &dev->dev[i];
        colibri_device_task *t = &s->task;
        int32_t n = 0, first = row;
        for (e = 0; e < E; e++) {
            int32_t m = kept(b, e);
            if (!m || dev->run_on[e] != i) continue;
            gather(hp, b, x, b->expert_start[e], m, dev->x + (size_t)row * d);   /* (m, dim) */
            memcpy(dev->gates + row, b->pair_gate + b->expert_start[e], (size_t)m * sizeof(float));
            dev->first_row[e] = row;
            s->task_experts[n] = e;
            s->task_rows[n++] = row - first;
            row += m;
        }
        if (!n) continue;
        s->task_rows[n] = row - first;
        t->layer = layer; t->n_experts = n; t->experts = s->task_experts; t->rows = s->task_rows;
        t->gates = dev->gates + first; t->x = dev->x + (size_t)first * d; t->y = dev->y + (size_t)first * d;
        t->n_rows = row - first; t->hidden_size = d; t->latency_ns = 0;
        s->pending = 1;
        s->stats.calls++;
        s->started_ns = colibri_devices_now(dev);
        s->failed = s->driver->compute(s->driver->context, t, err) != COLIBRI_OK;
        if (s->failed && dev->strict) return device_failed(err, s, layer, "start");
    }
    return COLIBRI_OK;
}

/* Device i's outputs for this chunk in dev->y: its call synced and recorded, or, when it failed, its
 * experts computed here from the rows it was given (the same inputs: the same bits). */
static colibri_status collect(const colibri_moe *moe, const colibri_compute *k, const colibri_hparams *hp,
                              const colibri_layer_weights *lw, const colibri_moe_buffers *b,
                              const colibri_moe_stream *stream, colibri_devices *dev, int32_t i, colibri_error *err)
{
    colibri_device_state *s = &dev->dev[i];
    colibri_device_task *t = &s->task;
    colibri_status st = COLIBRI_E_DEVICE;
    uint64_t now;
    int32_t d = hp->hidden_size, j;
    if (!s->pending) return COLIBRI_OK;
    s->pending = 0;
    if (!s->failed) st = s->driver->sync(s->driver->context, t, err);
    now = colibri_devices_now(dev);
    colibri_device_record(dev, i, t->latency_ns ? t->latency_ns : now - s->started_ns, st != COLIBRI_OK, now);
    if (st == COLIBRI_OK) {
        s->stats.experts += (uint64_t)t->n_experts;
        s->stats.rows += (uint64_t)t->n_rows;
        return COLIBRI_OK;
    }
    if (dev->strict) return device_failed(err, s, t->layer, "compute");
    for (j = 0; j < t->n_experts; j++) {
        int32_t r = t->rows[j], m = t->rows[j + 1] - r;
        st = colibri_moe_expert_rows(moe, k, hp, lw, b, stream, t->layer, t->experts[j], t->x + (size_t)r * d, m,
                                     t->y + (size_t)r * d, err);
        if (st) return st;
        s->stats.fallbacks++;
        dev->dev[0].stats.fallbacks++;
        dev->dev[0].stats.experts++;
        dev->dev[0].stats.rows += (uint64_t)m;
    }
    return COLIBRI_OK;
}

/* After an error: every started call synced, its outputs dropped, so none outlives the chunk. */
static void drain(colibri_devices *dev)
{
    int32_t i;
    for (i = 1; i < dev->n; i++) {
        colibri_device_state *s = &dev->dev[i];
        if (s->pending && !s->failed) s->driver->sync(s->driver->context, &s->task, NULL);
        s->pending = 0;
    }
}

/* Streaming: waits for expert e's reads, the wait timed as expert I/O instead of as `phase`. */
static colibri_status wait_for(const colibri_moe_stream *stream, int32_t layer, int32_t e, uint64_t *profile,
                               int32_t phase, uint64_t *clock, colibri_error *err)
{
    colibri_status st;
    colibri_profile_add(profile, phase, clock);
    st = colibri_cache_wait(stream->cache, layer, e, err);
    *clock = colibri_profile_start(profile);
    return st;
}

#define LOOKAHEAD 4     /* streaming: experts of the layer whose reads are queued ahead of the one computed */

/* Every hit expert in turn, each over its m kept tokens with all the threads.  Streaming, the next
 * few hit experts' reads are queued while one computes, as far as free slots allow. */
static colibri_status run_experts(const colibri_moe *moe, const colibri_compute *k, const colibri_hparams *hp,
                                  const colibri_layer_weights *lw, const colibri_moe_buffers *b, int32_t layer,
                                  const colibri_moe_stream *stream, colibri_devices *dev, const float *x, float *out,
                                  uint64_t *profile, uint64_t *clock, colibri_error *err)
{
    int32_t d = hp->hidden_size, e, ahead = 0, in_flight = 0;
    for (e = 0; e < hp->n_experts; e++) {
        int32_t first = b->expert_start[e], m = kept(b, e);
        colibri_expert_weights w;
        if (m == 0) continue;
        if (!local(b, dev, e)) {   /* a device's: its outputs, in this expert's place in the sum */
            colibri_status st = collect(moe, k, hp, lw, b, stream, dev, dev->run_on[e], err);
            if (st) return st;
            colibri_profile_add(profile, COLIBRI_PHASE_EXPERTS, clock);
            moe->aggregator->combine(out, dev->y + (size_t)dev->first_row[e] * d, b->pair_token + first,
                                     b->pair_gate + first, m, d);
            colibri_profile_add(profile, COLIBRI_PHASE_AGGREGATION, clock);
            continue;
        }
        if (stream) {
            colibri_status st;
            if (ahead <= e) {
                if (!colibri_cache_request(stream->cache, layer, e, 1))
                    return colibri_fail(err, COLIBRI_E_NOMEM, "layer %d: no cache slot for expert %d", layer, e);
                ahead = e + 1;
            } else {
                in_flight--;
            }
            for (; ahead < hp->n_experts && in_flight < LOOKAHEAD; ahead++) {
                if (!local(b, dev, ahead)) continue;
                if (!colibri_cache_request(stream->cache, layer, ahead, 0)) break;
                in_flight++;
            }
            st = wait_for(stream, layer, e, profile, COLIBRI_PHASE_DISPATCH, clock, err);
            if (st) return st;
        }
        gather(hp, b, x, first, m, b->xe);                                            /* (m, dim) */
        colibri_profile_add(profile, COLIBRI_PHASE_DISPATCH, clock);
        expert_weights(lw, stream, layer, e, &w);
        colibri_expert_run(moe->expert, k, hp, &w, b->xe, m, b->h1, b->h3, b->ye);    /* (m, dim) */
        if (stream) colibri_cache_release(stream->cache, layer, e);
        colibri_profile_add(profile, COLIBRI_PHASE_EXPERTS, clock);
        moe->aggregator->combine(out, b->ye, b->pair_token + first, b->pair_gate + first, m, d);
        colibri_profile_add(profile, COLIBRI_PHASE_AGGREGATION, clock);
    }
    return COLIBRI_OK;
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
    const colibri_moe_stream *stream;
    const float *x;                 /* (1, dim) */
    int32_t n_slots;
    int32_t layer;
} experts_job;

static void experts_part(void *context, int32_t part, int32_t parts)
{
    const experts_job *j = context;
    const colibri_moe_buffers *b = j->b;
    int32_t d = j->hp->hidden_size, f = j->hp->intermediate_size, p;
    for (p = j->n_slots * part / parts; p < j->n_slots * (part + 1) / parts; p++) {
        int32_t i = j->stream ? b->slot_order[p] : p, e = b->slot_expert[i];
        float *xe = b->xe + (size_t)i * d;   /* (1, dim) */
        colibri_compute alone = *j->k;
        colibri_expert_weights w;
        alone.pool = NULL;
        alone.xq = j->k->xq ? j->k->xq + (size_t)i * j->k->xq_row_blocks : NULL;
        gather(j->hp, b, j->x, b->expert_start[e], 1, xe);
        if (j->stream) b->slot_wait[i] = colibri_cache_await(j->stream->cache, j->layer, e);
        expert_weights(j->lw, j->stream, j->layer, e, &w);
        colibri_expert_run(j->moe->expert, &alone, j->hp, &w, xe, 1, b->h1 + (size_t)i * f, b->h3 + (size_t)i * f,
                           b->ye + (size_t)i * d);
    }
}

static colibri_status run_decode_experts(const colibri_moe *moe, const colibri_compute *k, const colibri_hparams *hp,
                                         const colibri_layer_weights *lw, const colibri_moe_buffers *b, int32_t layer,
                                         const colibri_moe_stream *stream, colibri_devices *dev, const float *x,
                                         float *out, uint64_t *profile, uint64_t *clock, colibri_error *err)
{
    int32_t d = hp->hidden_size, slots = 0, e, i;
    experts_job job;
    for (e = 0; e < hp->n_experts; e++)
        if (local(b, dev, e)) b->slot_expert[slots++] = e;
    if (stream) {   /* requested already (colibri_moe_forward): the threads take those in a slot first */
        int32_t n = 0, pass;
        for (pass = 0; pass < 2; pass++)
            for (i = 0; i < slots; i++)
                if (colibri_cache_ready(stream->cache, layer, b->slot_expert[i]) == !pass) b->slot_order[n++] = i;
    }
    job.moe = moe; job.k = k; job.hp = hp; job.lw = lw; job.b = b; job.stream = stream; job.x = x;
    job.n_slots = slots; job.layer = layer;
    colibri_platform_pool_run(k->pool, experts_part, &job, slots);
    if (stream) {
        uint64_t waited = 0;   /* the longest a thread waited: the forward pass waited at least that */
        for (i = 0; i < slots; i++) {   /* a failed read shows here: what its thread computed is dropped */
            colibri_status st = colibri_cache_wait(stream->cache, layer, b->slot_expert[i], err);
            if (st) return st;
            colibri_cache_release(stream->cache, layer, b->slot_expert[i]);
            if (b->slot_wait[i] > waited) waited = b->slot_wait[i];
        }
        stream->cache->stats.io_wait_ns += waited;
        if (profile) { profile[COLIBRI_PHASE_EXPERT_IO] += waited; *clock += waited; }
    }
    for (i = 1; dev && i < dev->n; i++) {
        colibri_status st = collect(moe, k, hp, lw, b, stream, dev, i, err);
        if (st) return st;
    }
    colibri_profile_add(profile, COLIBRI_PHASE_EXPERTS, clock);
    for (e = 0, i = 0; e < hp->n_experts; e++) {   /* in id order: the slots' and the devices' outputs */
        int32_t first = b->expert_start[e];
        if (!kept(b, e)) continue;
        if (local(b, dev, e)) moe->aggregator->combine(out, b->ye + (size_t)i++ * d, b->pair_token + first, b->pair_gate + first, 1, d);
        else moe->aggregator->combine(out, dev->y + (size_t)dev->first_row[e] * d, b->pair_token + first, b->pair_gate + first, 1, d);
    }
    colibri_profile_add(profile, COLIBRI_PHASE_AGGREGATION, clock);
    return COLIBRI_OK;
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

colibri_status colibri_moe_forward(const colibri_moe *moe, const colibri_compute *k, const colibri_hparams *hp,
                                   const colibri_layer_weights *lw, const colibri_moe_buffers *b, const colibri_routing *r,
                                   const colibri_moe_stream *stream, colibri_devices *dev, const float *x, int32_t n,
                                   float *out, uint64_t *profile, colibri_error *err)
{
    uint64_t clock = colibri_profile_start(profile);
    colibri_status st;
    int32_t e;

    route(moe, k, hp, lw, b, r, x, n);
    colibri_profile_add(profile, COLIBRI_PHASE_ROUTER, &clock);

    group_by_expert(hp, b, n);
    keep_pairs(hp, b, r, n);
    memset(out, 0, (size_t)n * hp->hidden_size * sizeof(float));
    /* the devices' calls first, so they compute while the local experts do */
    if (dev && (st = start_devices(hp, b, dev, r->layer, x, err)) != COLIBRI_OK) {
        drain(dev);
        return st;
    }
    /* streaming one token: its experts' reads first, then the guesses for the next layer behind them */
    if (stream && n == 1) {
        for (e = 0; e < hp->n_experts; e++)
            if (local(b, dev, e) && !colibri_cache_request(stream->cache, r->layer, e, 1)) {
                if (dev) drain(dev);
                return colibri_fail(err, COLIBRI_E_NOMEM, "layer %d: no cache slot for expert %d", r->layer, e);
            }
        if (stream->guess_next) stream->guess_next(stream->context);
    }
    colibri_profile_add(profile, COLIBRI_PHASE_DISPATCH, &clock);

    /* one token on threads, with rows of xe, h1, h3, ye for each of its top_k experts */
    if (n == 1 && k->pool && hp->top_k <= b->n_batch)
        st = run_decode_experts(moe, k, hp, lw, b, r->layer, stream, dev, x, out, profile, &clock, err);
    else
        st = run_experts(moe, k, hp, lw, b, r->layer, stream, dev, x, out, profile, &clock, err);
    if (st) {
        if (dev) drain(dev);
        return st;
    }

    if (hp->shared_intermediate_size) add_shared_expert(k, hp, lw, b, x, n, out, profile, &clock);
    return COLIBRI_OK;
}
