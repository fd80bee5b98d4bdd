/* SPDX-License-Identifier: MIT */
/* The expert cache (cache.h): slots, their reads, and which expert leaves when one must. */
#include <string.h>

#include "cache.h"
#include "../util.h"

COLIBRI_SLOT_CHECK(colibri_expert_cache, COLIBRI_CACHE_SLOT);
COLIBRI_SLOT_CHECK(colibri_cache_layer, COLIBRI_CACHE_LAYER_SLOT);
COLIBRI_SLOT_CHECK(colibri_io_read, COLIBRI_IO_READ_SLOT);

#define BLOCK 4096u             /* direct I/O's unit: offsets, lengths and buffers */
#define AGING_TOKENS 64         /* demand counts halve after this many tokens' worth of demands */
#define LOOKAHEAD 4             /* prefill: experts of the layer requested ahead of the one computed */

/* ---- geometry ---- */

/* Bytes a read of `bytes` takes in a slot: whole blocks and one more for the shift with direct I/O. */
static uint64_t read_room(uint64_t bytes, int direct)
{
    return direct ? colibri_align_up((size_t)bytes, BLOCK) + BLOCK : colibri_align_up((size_t)bytes, COLIBRI_ALIGNMENT);
}

/* The reads that bring one of the layer's experts: its extent, or each tensor's part. */
static void plan_layer(const colibri_model *m, int32_t l, int direct, colibri_cache_layer *cl)
{
    const colibri_layer_weights *lw = &m->layers[l];
    uint64_t at = 0, offset, bytes;
    int32_t k;
    memset(cl, 0, sizeof *cl);
    for (k = 0; k < L_EXPERT_KINDS; k++) cl->part_read[k] = -1, cl->runs[k] = (uint8_t)lw->w[L_EXPERT_FIRST + k].dtype;
    if (!lw->moe) return;
    if (m->fast_forms) m->fast_forms->plan(m, l, cl);
    if (colibri_expert_extent(m, l, 0, &offset, &bytes) == COLIBRI_OK) {   /* interleaved: one read */
        cl->read[0].offset = offset;
        cl->read[0].stride = lw->extent_bytes;
        cl->read[0].bytes = bytes;
        cl->n_reads = 1;
        for (k = 0; k < L_EXPERT_KINDS; k++) {
            if (!lw->w[L_EXPERT_FIRST + k].data) continue;
            cl->part_read[k] = 0;
            cl->part_at[k] = lw->expert_offset[k] - offset;
        }
        return;
    }
    for (k = 0; k < L_EXPERT_KINDS; k++) {   /* stacked: a read per tensor */
        colibri_cache_read *r = &cl->read[cl->n_reads];
        if (colibri_expert_part(m, l, L_EXPERT_FIRST + k, 0, &offset, &bytes) != COLIBRI_OK) continue;
        r->offset = offset;
        r->stride = lw->expert_stride[k];
        r->bytes = bytes;
        r->at = at;
        at += read_room(bytes, direct);
        cl->part_read[k] = cl->n_reads++;
    }
}

static uint64_t slot_bytes_of(const colibri_cache_layer *cl, int direct)
{
    return cl->n_reads ? cl->read[cl->n_reads - 1].at + read_room(cl->read[cl->n_reads - 1].bytes, direct) : 0;
}

static int32_t moe_layers(const colibri_model *m)
{
    int32_t l, n = 0;
    for (l = 0; l < m->hp.n_layers; l++) n += m->layers[l].moe != 0;
    return n;
}

colibri_status colibri_cache_geometry(const colibri_model *m, int32_t scope, int direct, uint64_t budget,
                                      uint64_t *slot_bytes, uint64_t *min_budget, int32_t *n_slots, colibri_error *err)
{
    const colibri_hparams *hp = &m->hp;
    int32_t l, layers = moe_layers(m);
    uint64_t slot = 0, need, most, slots;
    if (layers == 0) return colibri_fail(err, COLIBRI_E_ARG, "expert streaming: the model has no routed experts");
    if (scope != COLIBRI_CACHE_GLOBAL && scope != COLIBRI_CACHE_PER_LAYER)
        return colibri_fail(err, COLIBRI_E_ARG, "expert_cache = %d: use COLIBRI_CACHE_GLOBAL or _PER_LAYER", scope);
    for (l = 0; l < hp->n_layers; l++) {
        colibri_cache_layer cl;
        plan_layer(m, l, direct, &cl);
        if (slot_bytes_of(&cl, direct) > slot) slot = slot_bytes_of(&cl, direct);
    }
    if (m->fast_forms) slot += m->fast_forms->room(m, direct);
    /* one layer's top_k experts computed together: in the pool, or in each layer's share of it */
    need = (uint64_t)hp->top_k * (scope == COLIBRI_CACHE_PER_LAYER ? (uint64_t)layers : 1u);
    most = (uint64_t)hp->n_experts * (uint64_t)layers;
    slots = budget / slot;
    if (slots > most) slots = most;
    if (scope == COLIBRI_CACHE_PER_LAYER && slots > 0) slots -= slots % (uint64_t)layers;   /* even shares */
    if (slot_bytes) *slot_bytes = slot;
    if (min_budget) *min_budget = need * slot;
    if (n_slots) *n_slots = (int32_t)slots;
    if (budget && slots < need)
        return colibri_fail(err, COLIBRI_E_ARG, "expert_budget %llu bytes holds %llu slots of %llu bytes: this model needs "
                            "at least %llu bytes (%llu slots: top_k %d%s)", (unsigned long long)budget,
                            (unsigned long long)slots, (unsigned long long)slot, (unsigned long long)(need * slot),
                            (unsigned long long)need, hp->top_k,
                            scope == COLIBRI_CACHE_PER_LAYER ? " for each MoE layer" : " of one layer");
    return COLIBRI_OK;
}

void colibri_cache_carve(colibri_expert_cache **out, colibri_arena *a, const colibri_model *m, int32_t scope,
                         int direct, int32_t n_slots, uint64_t slot_bytes)
{
    const colibri_hparams *hp = &m->hp;
    size_t S = (size_t)n_slots, LE = (size_t)hp->n_layers * hp->n_experts, K = L_EXPERT_KINDS;
    size_t align = direct ? BLOCK : COLIBRI_ALIGNMENT;
    uint8_t *pool;
    colibri_expert_cache *c = colibri_arena_carve(a, COLIBRI_CACHE_SLOT, ARENA_EXPERT_CACHE, "cache", -1, "struct");
    colibri_cache_layer *layers = colibri_arena_carve(a, (size_t)hp->n_layers * COLIBRI_CACHE_LAYER_SLOT, ARENA_EXPERT_CACHE,
                                                      "read_plans", -1, "(n_layers) struct");
    int32_t *owner = colibri_arena_carve(a, S * sizeof(int32_t), ARENA_EXPERT_CACHE, "slot_owner", -1, "(slots) i32");
    int32_t *state = colibri_arena_carve(a, S * sizeof(int32_t), ARENA_EXPERT_CACHE, "slot_state", -1, "(slots) i32");
    int32_t *flags = colibri_arena_carve(a, S * sizeof(int32_t), ARENA_EXPERT_CACHE, "slot_flags", -1, "(slots) i32");
    uint64_t *used = colibri_arena_carve(a, S * sizeof(uint64_t), ARENA_EXPERT_CACHE, "slot_used", -1, "(slots) u64");
    uint32_t *shift = colibri_arena_carve(a, colibri_arena_bytes(a, S, K, sizeof(uint32_t)), ARENA_EXPERT_CACHE,
                                          "slot_shift", -1, "(slots, 6) u32");
    int32_t *where = colibri_arena_carve(a, LE * sizeof(int32_t), ARENA_EXPERT_CACHE, "expert_slot", -1, "(n_layers, n_experts) i32");
    uint32_t *uses = colibri_arena_carve(a, LE * sizeof(uint32_t), ARENA_EXPERT_CACHE, "expert_uses", -1, "(n_layers, n_experts) u32");
    uint8_t *verified = colibri_arena_carve(a, LE, ARENA_EXPERT_CACHE, "expert_verified", -1, "(n_layers, n_experts) u8");
    colibri_io_read *reads = colibri_arena_carve(a, colibri_arena_bytes(a, S, K, COLIBRI_IO_READ_SLOT), ARENA_EXPERT_CACHE,
                                                 "reads", -1, "(slots, 6) struct");
    void *io_state = colibri_arena_carve(a, COLIBRI_IO_STATE_SLOT, ARENA_EXPERT_CACHE, "reader", -1, "struct");
    uint64_t room = m->fast_forms ? m->fast_forms->room(m, direct) : 0;   /* 0: no part is rewritten */
    uint8_t *prepared = room ? m->fast_forms->carve(a, S) : NULL;
    /* the pool last, aligned for direct I/O inside its carve */
    pool = colibri_arena_carve(a, colibri_arena_bytes(a, S, (size_t)slot_bytes, 1) + align - COLIBRI_ALIGNMENT,
                               ARENA_EXPERT_CACHE, "slots", -1, "(slots, slot_bytes) u8");
    int32_t l, i, layers_moe = moe_layers(m), next = 0, share;
    *out = NULL;
    if (!a->base || !c || !pool || (room && !prepared)) return;   /* measuring, or out of room (the caller sees it) */

    memset(c, 0, sizeof *c);
    c->model = m;
    c->n_slots = n_slots;
    c->n_layers = hp->n_layers;
    c->n_experts = hp->n_experts;
    c->top_k = hp->top_k;
    c->slot_bytes = slot_bytes;
    c->scope = scope;
    c->direct = direct;
    c->layers = layers;
    c->pool = (uint8_t *)colibri_align_up((size_t)(uintptr_t)pool, align);
    c->slot_owner = owner; c->slot_state = state; c->slot_flags = flags; c->slot_used = used;
    c->slot_shift = shift; c->where = where; c->uses = uses; c->verified = verified; c->reads = reads;
    c->io_state = io_state;
    c->slot_prepared = prepared;
    c->repack_scratch = room;
    c->demands_per_token = (float)layers_moe * (float)hp->top_k;
    c->aging_period = (uint64_t)AGING_TOKENS * (uint64_t)layers_moe * (uint64_t)hp->top_k;
    c->stats.slots = n_slots;
    c->stats.slot_bytes = slot_bytes;
    share = scope == COLIBRI_CACHE_PER_LAYER ? n_slots / layers_moe : n_slots;
    for (l = 0; l < hp->n_layers; l++) {
        plan_layer(m, l, direct, &layers[l]);
        if (!layers[l].n_reads) continue;
        layers[l].first_slot = scope == COLIBRI_CACHE_PER_LAYER ? next : 0;
        layers[l].n_slots = share;
        next += share;
    }
    for (i = 0; i < n_slots; i++) { owner[i] = -1; state[i] = CACHE_EMPTY; flags[i] = 0; used[i] = 0; }
    for (i = 0; i < (int32_t)LE; i++) { where[i] = -1; uses[i] = 0; verified[i] = 0; }
    memset(reads, 0, S * K * sizeof *reads);
    *out = c;
}

/* ---- the reader ---- */

/* A model loaded from memory with its experts in it: its weights are the storage. */
static int64_t copy_from_weights(void *context, uint64_t offset, void *dst, size_t len)
{
    const colibri_model *m = context;
    if (offset >= m->weights_len) return 0;
    if (len > m->weights_len - offset) len = (size_t)(m->weights_len - offset);
    memcpy(dst, m->weights + offset, len);
    return (int64_t)len;
}

static colibri_status fill_now(colibri_expert_cache *c, int32_t slot, int32_t layer, int32_t e, colibri_error *err);
static void evict(colibri_expert_cache *c, int32_t slot);

colibri_status colibri_cache_start(colibri_expert_cache *c, colibri_read_fn read, void *context, uint32_t io,
                                   const int32_t *pins, int32_t n_pins, colibri_error *err)
{
    const colibri_model *m = c->model;
    colibri_status st;
    int32_t i;
    uint32_t crc;
    c->verify = (io & COLIBRI_EXPERT_IO_VERIFY) != 0;
    for (i = 0; c->verify && i < c->n_layers; i++)
        if (c->layers[i].n_reads && !colibri_extent_checksum(m, i, 0, &crc))
            return colibri_fail(err, COLIBRI_E_ARG, "expert streaming: verifying extents needs their checksums, and "
                                "layer %d lists none (extent_checksums: the interleaved layout colibri convert writes)", i);
    if (!read && m->experts_elsewhere)
        return colibri_fail(err, COLIBRI_E_ARG, "expert streaming: the model's routed experts are not in its weights "
                            "(COLIBRI_LOAD_EXPERTS_ELSEWHERE): pass expert_read in the session options");
    if (!read && !m->platform) { read = copy_from_weights; context = (void *)(uintptr_t)m; }
    st = colibri_platform_io_create(m, read, context, c->direct, c->reads, c->n_slots * L_EXPERT_KINDS, c->io_state,
                                    &c->io, err);
    if (st) return st;
    c->guessing = !(io & COLIBRI_EXPERT_IO_NO_PREFETCH) && colibri_platform_io_async(c->io);

    if (n_pins < 0 || (n_pins && !pins)) return colibri_fail(err, COLIBRI_E_ARG, "n_expert_pins = %d without pins", n_pins);
    for (i = 0; i < n_pins; i++) {
        int32_t l = pins[2 * i], e = pins[2 * i + 1], slot, free_slots = 0, j;
        const colibri_cache_layer *cl;
        if (l < 0 || l >= c->n_layers || !c->layers[l].n_reads || e < 0 || e >= c->n_experts)
            return colibri_fail(err, COLIBRI_E_ARG, "expert pin %d: (layer %d, expert %d) is not a routed expert of the model",
                                i, l, e);
        if (c->where[l * c->n_experts + e] >= 0)
            return colibri_fail(err, COLIBRI_E_ARG, "expert pin %d: (layer %d, expert %d) is pinned twice", i, l, e);
        cl = &c->layers[l];
        for (j = cl->first_slot; j < cl->first_slot + cl->n_slots; j++) free_slots += c->slot_owner[j] < 0;
        if (free_slots <= c->top_k)   /* a layer's top_k must stay free for what its tokens demand */
            return colibri_fail(err, COLIBRI_E_ARG, "expert pin %d (layer %d, expert %d): %d pins leave fewer than top_k %d "
                                "slots of %d %s", i, l, e, i, c->top_k, cl->n_slots,
                                c->scope == COLIBRI_CACHE_PER_LAYER ? "in the layer's share" : "in the pool");
        for (slot = cl->first_slot; c->slot_owner[slot] >= 0; slot++) {}
        st = fill_now(c, slot, l, e, err);
        if (st) return st;
        c->slot_flags[slot] = CACHE_PINNED;
        c->stats.pinned++;
    }
    return COLIBRI_OK;
}

void colibri_cache_stop(colibri_expert_cache *c)
{
    if (c && c->io) colibri_platform_io_destroy(c->io);
}

/* Queues the reads that bring expert e of `layer` into `slot`. */
static void queue_reads(colibri_expert_cache *c, int32_t slot, int32_t layer, int32_t e, int urgent)
{
    const colibri_cache_layer *cl = &c->layers[layer];
    uint8_t *base = c->pool + (size_t)slot * c->slot_bytes;
    int32_t r;
    c->slot_owner[slot] = layer * c->n_experts + e;
    c->slot_state[slot] = CACHE_LOADING;
    if (c->slot_prepared) c->slot_prepared[slot] = 0;
    c->where[layer * c->n_experts + e] = slot;
    for (r = 0; r < cl->n_reads; r++) {
        colibri_io_read *io = &c->reads[(size_t)slot * L_EXPERT_KINDS + r];
        uint64_t offset = cl->read[r].offset + (uint64_t)e * cl->read[r].stride;
        uint64_t shift = c->direct ? offset % BLOCK : 0;
        io->offset = offset - shift;
        io->need = (size_t)(shift + cl->read[r].bytes);
        io->len = c->direct ? colibri_align_up(io->need, BLOCK) : io->need;
        io->dst = base + cl->read[r].at;
        c->slot_shift[(size_t)slot * L_EXPERT_KINDS + r] = (uint32_t)shift;
        colibri_platform_io_submit(c->io, (int32_t)((size_t)slot * L_EXPERT_KINDS + r), urgent);
        c->stats.reads++;
    }
}

/* Whether a slot's extent, read whole (an interleaved layout: one read), has the CRC-32 that the
 * model's description gives it; *got and *want for a message. */
static int extent_matches(const colibri_expert_cache *c, int32_t slot, uint32_t *got, uint32_t *want)
{
    int32_t owner = c->slot_owner[slot], layer = owner / c->n_experts;
    const colibri_io_read *io = &c->reads[(size_t)slot * L_EXPERT_KINDS];
    *want = 0;
    colibri_extent_checksum(c->model, layer, owner % c->n_experts, want);
    *got = colibri_crc32(0, (const uint8_t *)io->dst + c->slot_shift[(size_t)slot * L_EXPERT_KINDS],
                         (size_t)c->layers[layer].read[0].bytes);
    return *got == *want;
}

/* Waits for a loading slot's reads (all of them, so none still writes into it), then READY, or
 * EMPTY with the first failed read reported. */
static colibri_status settle(colibri_expert_cache *c, int32_t slot, colibri_error *err)
{
    int32_t owner = c->slot_owner[slot], layer = owner / c->n_experts, e = owner % c->n_experts, r, bad = -1;
    const colibri_cache_layer *cl = &c->layers[layer];
    int64_t bad_result = 0;
    uint64_t clock;
    if (c->slot_state[slot] != CACHE_LOADING) return COLIBRI_OK;
    clock = colibri_platform_now_ns();
    for (r = 0; r < cl->n_reads; r++) {
        const colibri_io_read *io = &c->reads[(size_t)slot * L_EXPERT_KINDS + r];
        int64_t got = colibri_platform_io_wait(c->io, (int32_t)((size_t)slot * L_EXPERT_KINDS + r));
        if (got > 0) c->stats.bytes_read += (uint64_t)got;
        if ((got < 0 || (uint64_t)got < io->need) && bad < 0) { bad = r; bad_result = got; }
    }
    clock = colibri_platform_now_ns() - clock;
    c->stats.io_wait_ns += clock;
    if (c->profile) c->profile[COLIBRI_PHASE_EXPERT_IO] += clock;
    if (bad < 0 && c->model->fast_forms) c->model->fast_forms->prepare(c, slot);   /* checked there, if it can be */
    if (bad < 0 && c->verify && !c->verified[owner]) {   /* interleaved: one read, the whole extent */
        const colibri_io_read *io = &c->reads[(size_t)slot * L_EXPERT_KINDS];
        uint32_t want, got;
        if (!extent_matches(c, slot, &got, &want)) {
            evict(c, slot);
            return colibri_fail(err, COLIBRI_E_CHECKSUM, "layer %d expert %d: the crc32 of its extent [%llu, %llu) of "
                                "weights.bin is %x, colibri_model.json says %x", layer, e,
                                (unsigned long long)(io->offset + c->slot_shift[(size_t)slot * L_EXPERT_KINDS]),
                                (unsigned long long)(io->offset + io->need), got, want);
        }
        c->verified[owner] = 1;
    }
    if (bad < 0) {
        c->slot_state[slot] = CACHE_READY;
        return COLIBRI_OK;
    }
    c->slot_state[slot] = CACHE_EMPTY;
    c->slot_owner[slot] = -1;
    c->slot_flags[slot] = 0;
    c->where[owner] = -1;
    {
        const colibri_io_read *io = &c->reads[(size_t)slot * L_EXPERT_KINDS + bad];
        int32_t k;
        for (k = 0; k < L_EXPERT_KINDS && cl->part_read[k] != bad; k++) {}
        if (bad_result < 0)
            return colibri_fail(err, COLIBRI_E_IO, "layer %d expert %d: reading bytes [%llu, %llu) of weights.bin "
                                "(layers.%d.%s%s) failed: I/O error %lld", layer, e, (unsigned long long)io->offset,
                                (unsigned long long)(io->offset + io->len), layer, colibri_layer_tensor_name(L_EXPERT_FIRST + k),
                                cl->n_reads == 1 ? " and the expert's other tensors" : "", (long long)-bad_result);
        return colibri_fail(err, COLIBRI_E_IO, "layer %d expert %d: reading bytes [%llu, %llu) of weights.bin "
                            "(layers.%d.%s%s) returned %lld bytes: the file is shorter than its table says",
                            layer, e, (unsigned long long)io->offset, (unsigned long long)(io->offset + io->need), layer,
                            colibri_layer_tensor_name(L_EXPERT_FIRST + k),
                            cl->n_reads == 1 ? " and the expert's other tensors" : "", (long long)bad_result);
    }
}

/* Reads expert e of `layer` into `slot` and waits (pins). */
static colibri_status fill_now(colibri_expert_cache *c, int32_t slot, int32_t layer, int32_t e, colibri_error *err)
{
    queue_reads(c, slot, layer, e, 1);
    return settle(c, slot, err);
}

/* Whether a loading slot's reads are all done, without waiting. */
static int reads_done(colibri_expert_cache *c, int32_t slot)
{
    const colibri_cache_layer *cl = &c->layers[c->slot_owner[slot] / c->n_experts];
    int32_t r;
    for (r = 0; r < cl->n_reads; r++)
        if (!colibri_platform_io_idle(c->io, (int32_t)((size_t)slot * L_EXPERT_KINDS + r))) return 0;
    return 1;
}

/* ---- the policy ---- */

/* When the expert in slot i will be demanded next, in layers from now (the read is for `layer`): its
 * layer comes round in `dist` layers, and a token demands it with probability p = its demands per
 * token, so after dist + n_layers * (1/p - 1) on average.  Never demanded: never. */
static float next_use(const colibri_expert_cache *c, int32_t i, int32_t layer)
{
    int32_t owner = c->slot_owner[i], dist = (owner / c->n_experts - layer + c->n_layers) % c->n_layers;
    float per_token = (float)c->uses[owner] * c->demands_per_token / c->recent_demands;
    if (c->uses[owner] == 0) return 1e30f;
    if (per_token > 1.0f) per_token = 1.0f;
    return (float)(dist ? dist : c->n_layers) + (float)c->n_layers * (1.0f / per_token - 1.0f);
}

/* The slot a read for `layer` may take: an empty one, else the ready, unbusy, unpinned one whose
 * expert will be demanded last (an estimate of Belady's choice), the least recent on ties; -1 when
 * every slot is busy, pinned or loading. */
static int32_t victim(colibri_expert_cache *c, int32_t layer)
{
    const colibri_cache_layer *cl = &c->layers[layer];
    int32_t i, best = -1;
    float best_next = 0.0f;
    for (i = cl->first_slot; i < cl->first_slot + cl->n_slots; i++) {
        float next;
        if (c->slot_state[i] == CACHE_EMPTY) return i;
        if (c->slot_state[i] == CACHE_LOADING && !(c->slot_flags[i] & CACHE_BUSY) && reads_done(c, i))
            settle(c, i, NULL);   /* a finished guess: ready, or empty if its read failed */
        if (c->slot_state[i] == CACHE_EMPTY) return i;
        if (c->slot_state[i] != CACHE_READY || (c->slot_flags[i] & (CACHE_PINNED | CACHE_BUSY))) continue;
        next = next_use(c, i, layer);
        if (best < 0 || next > best_next || (next == best_next && c->slot_used[i] < c->slot_used[best])) {
            best = i;
            best_next = next;
        }
    }
    return best;
}

/* Waits out a slot's reads without judging them (a guess given up). */
static void drain(colibri_expert_cache *c, int32_t slot)
{
    int32_t r, n = c->layers[c->slot_owner[slot] / c->n_experts].n_reads;
    for (r = 0; r < n; r++) {
        int32_t i = (int32_t)((size_t)slot * L_EXPERT_KINDS + r);
        if (!colibri_platform_io_cancel(c->io, i)) colibri_platform_io_wait(c->io, i);
    }
}

/* An unbusy slot whose guess is still reading, to wait for when nothing else is free. */
static int32_t guess_in_flight(const colibri_expert_cache *c, int32_t layer)
{
    const colibri_cache_layer *cl = &c->layers[layer];
    int32_t i;
    for (i = cl->first_slot; i < cl->first_slot + cl->n_slots; i++)
        if (c->slot_state[i] == CACHE_LOADING && !(c->slot_flags[i] & CACHE_BUSY)) return i;
    return -1;
}

static void evict(colibri_expert_cache *c, int32_t slot)
{
    if (c->slot_owner[slot] >= 0) c->where[c->slot_owner[slot]] = -1;
    c->slot_owner[slot] = -1;
    c->slot_state[slot] = CACHE_EMPTY;
    c->slot_flags[slot] = 0;
}

/* A demand: counted for the policy, the counts halved once per aging period. */
static void count_demand(colibri_expert_cache *c, int32_t owner)
{
    c->uses[owner]++;
    c->recent_demands += 1.0f;
    if (++c->clock % c->aging_period == 0) {
        int32_t i;
        for (i = 0; i < c->n_layers * c->n_experts; i++) c->uses[i] >>= 1;
        c->recent_demands *= 0.5f;
    }
}

int colibri_cache_request(colibri_expert_cache *c, int32_t layer, int32_t e, int must)
{
    int32_t owner = layer * c->n_experts + e, slot = c->where[owner];
    if (slot >= 0 && (c->slot_flags[slot] & CACHE_BUSY)) return 1;   /* asked for already in this block */
    if (slot >= 0) {
        if (c->slot_flags[slot] & CACHE_GUESSED) c->stats.prefetch_hits++;
        if (c->slot_state[slot] == CACHE_LOADING && reads_done(c, slot)) settle(c, slot, NULL);
        slot = c->where[owner];   /* a failed guess left it empty */
    }
    if (slot >= 0) {
        if (c->slot_state[slot] == CACHE_READY) c->stats.hits++;
        else c->stats.misses++;
        c->slot_flags[slot] = (c->slot_flags[slot] & ~CACHE_GUESSED) | CACHE_BUSY;
    } else {
        slot = victim(c, layer);
        while (slot < 0 && must) {   /* only unfinished guesses left: cancel one, or let it finish */
            int32_t guess = guess_in_flight(c, layer);
            if (guess < 0) return 0;   /* cannot happen: the budget holds a layer's top_k beside the pins */
            drain(c, guess);   /* waits only for a read already started */
            evict(c, guess);
            slot = victim(c, layer);
        }
        if (slot < 0) return 0;
        evict(c, slot);
        queue_reads(c, slot, layer, e, 1);
        c->slot_flags[slot] = CACHE_BUSY;
        c->stats.misses++;
    }
    c->slot_used[slot] = c->clock;
    count_demand(c, owner);
    return 1;
}

colibri_status colibri_cache_wait(colibri_expert_cache *c, int32_t layer, int32_t e, colibri_error *err)
{
    int32_t slot = c->where[layer * c->n_experts + e];
    if (slot < 0) return colibri_fail(err, COLIBRI_E_ARG, "layer %d expert %d was not requested", layer, e);
    return settle(c, slot, err);
}

uint64_t colibri_cache_await(colibri_expert_cache *c, int32_t layer, int32_t e)
{
    int32_t slot = c->where[layer * c->n_experts + e], r, n = c->layers[layer].n_reads;
    uint64_t clock;
    if (c->slot_state[slot] != CACHE_LOADING) return 0;
    clock = colibri_platform_now_ns();
    for (r = 0; r < n; r++) colibri_platform_io_wait(c->io, (int32_t)((size_t)slot * L_EXPERT_KINDS + r));
    clock = colibri_platform_now_ns() - clock;
    if (c->model->fast_forms) c->model->fast_forms->prepare(c, slot);   /* before this thread computes from it */
    return clock;
}

int colibri_cache_ready(const colibri_expert_cache *c, int32_t layer, int32_t e)
{
    int32_t slot = c->where[layer * c->n_experts + e];
    return slot >= 0 && c->slot_state[slot] == CACHE_READY;
}

void colibri_cache_weights(const colibri_expert_cache *c, int32_t layer, int32_t e, colibri_expert_weights *w)
{
    const colibri_cache_layer *cl = &c->layers[layer];
    int32_t slot = c->where[layer * c->n_experts + e], k;
    const uint8_t *base = c->pool + (size_t)slot * c->slot_bytes;
    for (k = 0; k < L_EXPERT_KINDS; k++) {
        int32_t r = cl->part_read[k];
        w->w[k].dtype = (colibri_dtype)cl->runs[k];
        w->w[k].data = r < 0 ? NULL
                             : base + cl->read[r].at + c->slot_shift[(size_t)slot * L_EXPERT_KINDS + r] + cl->part_at[k];
    }
}

void colibri_cache_release(colibri_expert_cache *c, int32_t layer, int32_t e)
{
    int32_t slot = c->where[layer * c->n_experts + e];
    if (slot >= 0) c->slot_flags[slot] &= ~CACHE_BUSY;
}

void colibri_cache_release_all(colibri_expert_cache *c)
{
    int32_t i;
    for (i = 0; i < c->n_slots; i++) c->slot_flags[i] &= ~CACHE_BUSY;
}

void colibri_cache_guess(colibri_expert_cache *c, int32_t layer, const int32_t *ids, int32_t n)
{
    const colibri_cache_layer *cl = &c->layers[layer];
    int32_t i, j, in_flight = 0, pinned = 0;
    if (!c->guessing || !cl->n_reads) return;
    for (j = cl->first_slot; j < cl->first_slot + cl->n_slots; j++) {
        in_flight += c->slot_state[j] == CACHE_LOADING && !(c->slot_flags[j] & CACHE_BUSY);
        pinned += (c->slot_flags[j] & CACHE_PINNED) != 0;
    }
    for (i = 0; i < n; i++) {
        int32_t owner = layer * c->n_experts + ids[i], slot;
        /* guesses in flight never take the slots the next demand needs: top_k beside the pins */
        if (c->where[owner] >= 0 || in_flight >= cl->n_slots - pinned - c->top_k) continue;
        slot = victim(c, layer);
        if (slot < 0) return;
        /* a guess takes an empty slot, or one whose expert was demanded no more than the guessed one */
        if (c->slot_state[slot] != CACHE_EMPTY && c->uses[c->slot_owner[slot]] > c->uses[owner]) continue;
        evict(c, slot);
        queue_reads(c, slot, layer, ids[i], 0);
        c->slot_flags[slot] = CACHE_GUESSED;
        c->slot_used[slot] = c->clock;
        c->stats.prefetches++;
        in_flight++;
    }
}

/* ---- the fast forms: reached only through colibri_fast_forms_here, which a hosted platform's open
 * sets (posix.c), so that a firmware image links none of it ---- */

/* Each of the layer's parts as the file stores it, and as it runs. */
static void plan_fast(const colibri_model *m, int32_t layer, colibri_cache_layer *cl)
{
    int32_t k;
    for (k = 0; k < L_EXPERT_KINDS; k++) {
        const colibri_tensor *t = colibri_layer_tensor(m, layer, L_EXPERT_FIRST + k);
        if (!t) continue;
        cl->stored[k] = (uint8_t)t->dtype;
        cl->runs[k] = (uint8_t)colibri_run_dtype(m, t);
    }
}

/* Once a slot's reads are all done and whole: its extent checked against its CRC-32 when verifying
 * (first read only; a mismatch leaves the bytes as read, for settle to report), then its parts that
 * run in a fast form rewritten in it, 8 rows at a time through the room at the slot's end.  By the
 * thread that first needs the bytes (a worker computing the expert, or the forward pass), one per
 * slot at a time. */
static void prepare_fast(colibri_expert_cache *c, int32_t slot)
{
    int32_t owner = c->slot_owner[slot], layer = owner / c->n_experts, k, r;
    const colibri_cache_layer *cl = &c->layers[layer];
    const colibri_hparams *hp = &c->model->hp;
    uint8_t *base = c->pool + (size_t)slot * c->slot_bytes;
    if (!c->slot_prepared || c->slot_prepared[slot]) return;   /* nothing to rewrite, or done */
    for (r = 0; r < cl->n_reads; r++) {   /* a failed or short read: settle reports it */
        const colibri_io_read *io = &c->reads[(size_t)slot * L_EXPERT_KINDS + r];
        if (io->result < 0 || (uint64_t)io->result < io->need) return;
    }
    if (c->verify && !c->verified[owner]) {
        uint32_t got, want;
        if (!extent_matches(c, slot, &got, &want)) return;
        c->verified[owner] = 1;
    }
    for (k = 0; k < L_EXPERT_KINDS; k++) {
        int w2 = k == L_W2 - L_EXPERT_FIRST;   /* (dim, ffn); w1, w3: (ffn, dim) */
        r = cl->part_read[k];
        if (r < 0 || cl->runs[k] == cl->stored[k]) continue;
        colibri_repack_in_place(base + cl->read[r].at + c->slot_shift[(size_t)slot * L_EXPERT_KINDS + r] + cl->part_at[k],
                                (colibri_dtype)cl->stored[k], w2 ? hp->hidden_size : hp->intermediate_size,
                                w2 ? hp->intermediate_size : hp->hidden_size, base + c->slot_bytes - c->repack_scratch);
    }
    c->slot_prepared[slot] = 1;
}

/* Room at a slot's end for rewriting its parts, 8 rows at a time; 0: none runs in a fast form. */
static uint64_t room_fast(const colibri_model *m, int direct)
{
    size_t bytes = colibri_repack_scratch(m, COLIBRI_REPACK_EXPERTS);
    return bytes ? colibri_align_up(bytes, direct ? BLOCK : COLIBRI_ALIGNMENT) : 0;
}

/* (slots) u8, zeroed when carved for real: which slots' bytes were prepared. */
static uint8_t *carve_fast(colibri_arena *a, size_t slots)
{
    uint8_t *prepared = colibri_arena_carve(a, slots, ARENA_EXPERT_CACHE, "slot_prepared", -1, "(slots) u8");
    if (a->base && prepared) memset(prepared, 0, slots);
    return prepared;
}

const colibri_fast_forms colibri_fast_forms_here = { room_fast, carve_fast, plan_fast, prepare_fast };
