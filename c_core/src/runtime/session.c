/* SPDX-License-Identifier: MIT */
/* Sessions: options, the kernels, the arena's layout and its plan, creation and destruction,
 * and the entries that hand a session's parts to the rooms below it (mem, sample).  The
 * forward pass is forward.c's. */
#include <string.h>

#include "forward.h"
#include "../mem/memdump.h"
#include "../sample/sample.h"
#include "../platform.h"
#include "../util.h"

COLIBRI_SLOT_CHECK(colibri_session, COLIBRI_SESSION_SLOT);
COLIBRI_SLOT_CHECK(colibri_arena_record, COLIBRI_RECORD_SLOT);
COLIBRI_SLOT_CHECK(colibri_batch_entry, COLIBRI_ENTRY_SLOT);

#define DEFAULT_BATCH 64
#define DEFAULT_CTX 4096    /* a default, not a limit: a model may allow millions of positions */

/* Whether any layer is a short convolution. */
static int has_conv(const colibri_model *m)
{
    int32_t l;
    for (l = 0; l < m->hp.n_layers; l++)
        if (m->layers[l].conv) return 1;
    return 0;
}

/* Whether layer l's cache is in the session's kv_type: grouped-query attention's keys and values.
 * Latent attention's latents and the convolution's inputs stay f32. */
static int kv_typed(const colibri_model *m, int32_t l)
{
    return !m->layers[l].conv && !m->hp.kv_lora_rank;
}

/* A typed layer's key or value cache, as the memory report shows it. */
static const char *kv_shape(colibri_dtype kv_type)
{
    if (kv_type == COLIBRI_DTYPE_F16) return "(n_seq * n_ctx, n_kv_heads * head_dim) f16";
    if (kv_type == COLIBRI_DTYPE_Q8_0) return "(n_seq * n_ctx, n_kv_heads * head_dim) q8_0";
    return "(n_seq * n_ctx, n_kv_heads * head_dim) f32";
}

/* The widest input of any q8_0 / q4_0 matrix (0: the model has none): the int8 path quantizes
 * activations of that width. */
static size_t widest_block_input(const colibri_model *m)
{
    size_t widest = 0;
    int32_t i;
    for (i = 0; i < m->n_tensors; i++) {
        const colibri_tensor *t = &m->tensors[i];
        if (colibri_dtype_int8_path(t->dtype) && (size_t)t->shape[t->n_dims - 1] > widest)
            widest = (size_t)t->shape[t->n_dims - 1];
    }
    return widest;
}

/* Expert streaming's share of a session: n_slots 0 when the experts are resident. */
typedef struct stream_plan {
    int32_t n_slots;
    uint64_t slot_bytes;
    int32_t scope;              /* COLIBRI_CACHE_* */
    int direct;
    int32_t n_drivers;          /* devices beyond the cpu (colibri/device.h) */
} stream_plan;

/* Carves every buffer of a session from `a`.  Run measuring (a->base == NULL) and then for
 * real: the same sequence, so the plan is exact. */
static void carve_session(colibri_session *s, colibri_arena *a, const colibri_model *m,
                          int32_t n_ctx, int32_t n_batch, int32_t n_seq, colibri_dtype kv_type, const stream_plan *sp)
{
    const colibri_hparams *hp = &m->hp;
    size_t B = (size_t)n_batch, S = (size_t)n_seq, C = (size_t)n_ctx, D = (size_t)hp->hidden_size;
    size_t Q = (size_t)hp->n_heads * hp->head_dim, KV = (size_t)hp->n_kv_heads * hp->head_dim;
    size_t E = (size_t)hp->n_experts, K = (size_t)hp->top_k, F = (size_t)hp->intermediate_size;
    size_t V = (size_t)hp->vocab_size, half = (size_t)hp->rope_dim / 2, f = sizeof(float);
    size_t FF = F;   /* the widest FFN: routed, shared or dense */
    size_t R = (size_t)hp->kv_lora_rank, DR = (size_t)hp->rope_dim, O = Q;   /* O: attention output width */
    size_t KW = R ? R : KV, VW = R ? DR : KV;   /* cache widths: latent attention keeps the latent and the rotary key */
    size_t RS = colibri_route_part_floats(hp);   /* floats of one routing part's scratch */
    int32_t l;
    if ((size_t)hp->shared_intermediate_size > FF) FF = (size_t)hp->shared_intermediate_size;
    if ((size_t)hp->dense_intermediate_size > FF) FF = (size_t)hp->dense_intermediate_size;
    if (R && (size_t)hp->n_heads * hp->v_head_dim > O) O = (size_t)hp->n_heads * hp->v_head_dim;
    if (has_conv(m) && D > O) O = D;   /* the convolution's gated output */

    s->x = colibri_arena_carve(a, colibri_arena_bytes(a, B, D, f), ARENA_ACTIVATIONS, "x", -1, "(n_batch, dim) f32");
    s->xn = colibri_arena_carve(a, colibri_arena_bytes(a, B, D, f), ARENA_ACTIVATIONS, "x_normed", -1, "(n_batch, dim) f32");
    s->q = colibri_arena_carve(a, colibri_arena_bytes(a, B, Q, f), ARENA_ACTIVATIONS, "q", -1, "(n_batch, n_heads * head_dim) f32");
    s->attn = colibri_arena_carve(a, colibri_arena_bytes(a, B, O, f), ARENA_ACTIVATIONS, "attention_out", -1, "(n_batch, n_heads * value dim) f32");
    s->scores = colibri_arena_carve(a, colibri_arena_bytes(a, (size_t)hp->n_heads, C, f), ARENA_ACTIVATIONS, "attention_scores", -1,
                                    "(n_heads, n_ctx) f32");
    if (has_conv(m))
        s->conv_in = colibri_arena_carve(a, colibri_arena_bytes(a, B, 3 * D, f), ARENA_ACTIVATIONS, "conv_in", -1, "(n_batch, 3 * dim) f32");
    if (R) {
        size_t in = (size_t)hp->q_lora_rank > R + DR ? (size_t)hp->q_lora_rank : R + DR;
        s->latent_in = colibri_arena_carve(a, colibri_arena_bytes(a, B, in, f), ARENA_ACTIVATIONS, "latent_in", -1, "(n_batch, max(q_lora, kv_lora + rope_dim)) f32");
        s->q_latent = colibri_arena_carve(a, colibri_arena_bytes(a, (size_t)hp->n_heads, R, f), ARENA_ACTIVATIONS, "q_latent", -1,
                                          "(n_heads, kv_lora) f32");
        s->ctx_latent = colibri_arena_carve(a, colibri_arena_bytes(a, (size_t)hp->n_heads, R, f), ARENA_ACTIVATIONS, "ctx_latent", -1,
                                            "(n_heads, kv_lora) f32");
        if (widest_block_input(m))   /* each head quantizes its ctx_latent for int8 wkv_b weights */
            s->latent_xq = colibri_arena_carve(a, colibri_arena_bytes(a, (size_t)hp->n_heads, R / COLIBRI_BLOCK, sizeof(colibri_q8_block)),
                                               ARENA_ACTIVATIONS, "latent_quantized", -1, "(n_heads, kv_lora / 32) q8 blocks");
    }
    s->block_out = colibri_arena_carve(a, colibri_arena_bytes(a, B, D, f), ARENA_ACTIVATIONS, "block_out", -1, "(n_batch, dim) f32");
    s->row_tokens = colibri_arena_carve(a, colibri_arena_bytes(a, 3, B, sizeof(int32_t)), ARENA_ACTIVATIONS, "rows", -1,
                                        "(3, n_batch) i32: ids, positions, cache rows");
    s->row_pos = s->row_tokens ? s->row_tokens + B : NULL;
    s->row_cache = s->row_tokens ? s->row_tokens + 2 * B : NULL;
    s->kv_type = kv_type;
    /* a mixed chunk's keys and values land in scattered cache rows; a typed cache stores them converted */
    if ((S > 1 || kv_type != COLIBRI_DTYPE_F32) && !R && KV) {
        s->k_rows = colibri_arena_carve(a, colibri_arena_bytes(a, B, KV, f), ARENA_ACTIVATIONS, "k_rows", -1, "(n_batch, n_kv_heads * head_dim) f32");
        s->v_rows = colibri_arena_carve(a, colibri_arena_bytes(a, B, KV, f), ARENA_ACTIVATIONS, "v_rows", -1, "(n_batch, n_kv_heads * head_dim) f32");
    }
    s->k_cache = colibri_arena_carve(a, 2 * (size_t)hp->n_layers * COLIBRI_POINTER_SLOT, ARENA_KV_CACHE, "layer_table", -1, "(2, n_layers) pointers");
    s->v_cache = s->k_cache ? s->k_cache + hp->n_layers : NULL;
    for (l = 0; l < hp->n_layers; l++) {
        int conv = m->layers[l].conv;   /* a convolution layer caches B*x per position, and no value */
        size_t k_row = kv_typed(m, l) ? colibri_row_bytes(kv_type, KV) : (conv ? D : KW) * f;   /* bytes a position */
        size_t v_row = kv_typed(m, l) ? k_row : (conv ? 0 : VW) * f;
        float *k = colibri_arena_carve(a, colibri_arena_bytes(a, S * C, k_row, 1), ARENA_KV_CACHE,
                                       conv ? "conv_input" : R ? "latent" : "k", l,
                                       conv ? "(n_seq * n_ctx, dim) f32" : R ? "(n_seq * n_ctx, kv_lora) f32" : kv_shape(kv_type));
        float *v = colibri_arena_carve(a, colibri_arena_bytes(a, S * C, v_row, 1), ARENA_KV_CACHE, R ? "k_rope" : "v", l,
                                       R ? "(n_seq * n_ctx, rope_dim) f32" : conv ? "(n_seq * n_ctx, 0): none" : kv_shape(kv_type));
        if (s->k_cache) { s->k_cache[l] = k; s->v_cache[l] = v; }
    }
    s->tokens = colibri_arena_carve(a, colibri_arena_bytes(a, S, C, sizeof(int32_t)), ARENA_KV_CACHE, "token_ids", -1, "(n_seq, n_ctx) i32");
    s->seq = colibri_arena_carve(a, S * sizeof(colibri_seq), ARENA_KV_CACHE, "sequences", -1, "(n_seq) struct");
    s->entries = colibri_arena_carve(a, S * COLIBRI_ENTRY_SLOT, ARENA_SAMPLING, "batch_entries", -1, "(n_seq) struct");
    s->rope_cos = colibri_arena_carve(a, colibri_arena_bytes(a, C, half, f), ARENA_ROPE, "cos", -1, "(n_ctx, rope_dim / 2) f32");
    s->rope_sin = colibri_arena_carve(a, colibri_arena_bytes(a, C, half, f), ARENA_ROPE, "sin", -1, "(n_ctx, rope_dim / 2) f32");

    s->moe_buf.router_logits = colibri_arena_carve(a, colibri_arena_bytes(a, B, E, f), ARENA_ROUTER, "router_logits", -1, "(n_batch, n_experts) f32");
    s->moe_buf.ids = colibri_arena_carve(a, colibri_arena_bytes(a, B, K, sizeof(int32_t)), ARENA_ROUTER, "expert_ids", -1, "(n_batch, top_k) i32");
    s->moe_buf.gates = colibri_arena_carve(a, colibri_arena_bytes(a, B, K, f), ARENA_ROUTER, "gates", -1, "(n_batch, top_k) f32");
    s->moe_buf.router_scratch = colibri_arena_carve(a, COLIBRI_ROUTE_PARTS * RS * f, ARENA_ROUTER, "router_scratch", -1,
                                                     "(route parts, the router's scratch) f32");
    s->moe_buf.dropped_from = colibri_arena_carve(a, E * sizeof(int32_t), ARENA_ROUTER, "dropped_from", -1, "(n_experts) i32");
    s->expert_dropped = colibri_arena_carve(a, colibri_arena_bytes(a, (size_t)hp->n_layers, E, sizeof(uint64_t)), ARENA_ROUTER,
                                            "expert_dropped", -1, "(n_layers, n_experts) u64");
    s->moe_buf.expert_start = colibri_arena_carve(a, (E + 1) * sizeof(int32_t), ARENA_ROUTER, "expert_start", -1, "(n_experts + 1) i32");
    s->moe_buf.pair_token = colibri_arena_carve(a, colibri_arena_bytes(a, B, K, sizeof(int32_t)), ARENA_ROUTER, "pair_token", -1, "(n_batch * top_k) i32");
    s->moe_buf.slot_expert = colibri_arena_carve(a, E * sizeof(int32_t), ARENA_ROUTER, "slot_expert", -1, "(n_experts) i32");
    s->moe_buf.n_batch = n_batch;
    s->moe_buf.pair_gate = colibri_arena_carve(a, colibri_arena_bytes(a, B, K, f), ARENA_ROUTER, "pair_gate", -1, "(n_batch * top_k) f32");
    s->expert_load = colibri_arena_carve(a, colibri_arena_bytes(a, (size_t)hp->n_layers, E, sizeof(uint64_t)), ARENA_ROUTER,
                                         "expert_load", -1, "(n_layers, n_experts) u64");
    s->moe_buf.xe = colibri_arena_carve(a, colibri_arena_bytes(a, B, D, f), ARENA_EXPERTS, "expert_in", -1, "(n_batch, dim) f32");
    s->moe_buf.h1 = colibri_arena_carve(a, colibri_arena_bytes(a, B, FF, f), ARENA_EXPERTS, "gate_act", -1, "(n_batch, widest ffn) f32");
    s->moe_buf.h3 = colibri_arena_carve(a, colibri_arena_bytes(a, B, FF, f), ARENA_EXPERTS, "up_act", -1, "(n_batch, widest ffn) f32");
    s->moe_buf.ye = colibri_arena_carve(a, colibri_arena_bytes(a, B, D, f), ARENA_EXPERTS, "expert_out", -1, "(n_batch, dim) f32");
    s->compute.xq_row_blocks = (int32_t)(widest_block_input(m) / COLIBRI_BLOCK);
    s->compute.xq = colibri_arena_carve(a, colibri_arena_bytes(a, B, widest_block_input(m) / COLIBRI_BLOCK, sizeof(colibri_q8_block)),
                                        ARENA_ACTIVATIONS, "quantized_input", -1, "(n_batch, widest q8_0/q4_0 input / 32) q8 blocks");

    s->logits = colibri_arena_carve(a, colibri_arena_bytes(a, S, V, f), ARENA_OUTPUT, "logits", -1, "(n_seq, vocab) f32");
    if (S > 1)
        s->batch_logits = colibri_arena_carve(a, colibri_arena_bytes(a, S < B ? S : B, V, f), ARENA_OUTPUT, "batch_logits", -1,
                                              "(min(n_seq, n_batch), vocab) f32");
    s->probs = colibri_arena_carve(a, V * f, ARENA_SAMPLING, "probs", -1, "(vocab) f32");
    s->candidates = colibri_arena_carve(a, V * sizeof(int32_t), ARENA_SAMPLING, "candidates", -1, "(vocab) i32");

    if (sp->n_slots) {
        s->moe_buf.slot_order = colibri_arena_carve(a, K * sizeof(int32_t), ARENA_EXPERT_CACHE, "slot_order", -1, "(top_k) i32");
        s->moe_buf.slot_wait = colibri_arena_carve(a, K * sizeof(uint64_t), ARENA_EXPERT_CACHE, "slot_wait", -1, "(top_k) u64");
        s->guess_x = colibri_arena_carve(a, D * f, ARENA_EXPERT_CACHE, "guess_in", -1, "(dim) f32");
        s->guess_logits = colibri_arena_carve(a, E * f, ARENA_EXPERT_CACHE, "guess_logits", -1, "(n_experts) f32");
        s->guess_ids = colibri_arena_carve(a, K * sizeof(int32_t), ARENA_EXPERT_CACHE, "guess_ids", -1, "(top_k) i32");
        colibri_cache_carve(&s->cache, a, m, sp->scope, sp->direct, sp->n_slots, sp->slot_bytes);
    }
    if (sp->n_drivers) colibri_devices_carve(&s->devices, a, m, sp->n_drivers, n_batch);
}

/* A kernel variant asked for by name that this build lacks or this CPU cannot run. */
static colibri_status unknown_variant(const char *name, const char *asked_by, colibri_error *err)
{
    char list[96] = "";
    size_t used = 0;
    int32_t i;
    for (i = 0; colibri_kernels_variant(i); i++) {
        const colibri_kernels *k = colibri_kernels_variant(i);
        size_t len = strlen(k->name);
        if (!colibri_kernels_runnable(k) || used + len + 3 > sizeof list) continue;
        if (used) { memcpy(list + used, ", ", 2); used += 2; }
        memcpy(list + used, k->name, len + 1);
        used += len;
    }
    return colibri_fail(err, COLIBRI_E_ARG, "%s \"%s\": no such kernel variant runs here (this build and CPU: %s)",
                        asked_by, name, list);
}

/* The kernels a session computes with: a variant named in the options, else the reference when
 * asked, else one named by the environment, else the best this CPU runs. */
static const colibri_kernels *pick_kernels(const colibri_session_options *o, colibri_error *err)
{
    const char *wanted = colibri_platform_kernels_request();
    if (o && o->kernel_variant) return colibri_kernels_named(o->kernel_variant);
    if (o && o->kernels == COLIBRI_KERNELS_REFERENCE) return colibri_kernels_reference();
    if (!wanted) return colibri_kernels_best();
    if (!colibri_kernels_named(wanted)) unknown_variant(wanted, "COLIBRI_KERNELS", err);
    return colibri_kernels_named(wanted);
}

colibri_dtype colibri_interleaved_form(colibri_dtype dtype, int fast_here)
{
    colibri_dtype x8 = (unsigned)dtype < COLIBRI_DTYPE_COUNT ? colibri_dtype_x8(dtype) : dtype;
    const colibri_kernels *k = x8 != dtype && fast_here ? pick_kernels(NULL, NULL) : NULL;
    return x8 != dtype && (!fast_here || (k && colibri_kernels_interleave(k, x8))) ? x8 : dtype;
}

const char *colibri_kernel_variant(int32_t i, int *runs_here)
{
    const colibri_kernels *k = colibri_kernels_variant(i);
    if (runs_here) *runs_here = k && colibri_kernels_runnable(k);
    return k ? k->name : NULL;
}

/* The slots a budget buys, or why it buys none. */
static colibri_status resolve_stream(const colibri_model *m, const colibri_session_options *o, stream_plan *sp,
                                     colibri_error *err)
{
    memset(sp, 0, sizeof *sp);
    if (o && (o->n_devices < 0 || o->n_devices >= COLIBRI_MAX_DEVICES || (o->n_devices && !o->devices)))
        return colibri_fail(err, COLIBRI_E_ARG, "n_devices = %d: at most %d drivers beside the cpu, in `devices`",
                            o->n_devices, COLIBRI_MAX_DEVICES - 1);
    if (o && o->placement && !o->n_devices)
        return colibri_fail(err, COLIBRI_E_ARG, "a placement without devices: register the drivers it names");
    if (o && o->n_devices && !m->hp.n_experts)
        return colibri_fail(err, COLIBRI_E_ARG, "devices compute routed experts: this model has none");
    sp->n_drivers = o ? o->n_devices : 0;
    if (!o || !o->expert_budget) {
        if (m->experts_elsewhere)
            return colibri_fail(err, COLIBRI_E_ARG, "the model's routed experts are not in its weights "
                                "(COLIBRI_LOAD_EXPERTS_ELSEWHERE): give the session an expert_budget");
        return COLIBRI_OK;
    }
    if (o->expert_io & ~(uint32_t)(COLIBRI_EXPERT_IO_DIRECT | COLIBRI_EXPERT_IO_NO_PREFETCH | COLIBRI_EXPERT_IO_VERIFY))
        return colibri_fail(err, COLIBRI_E_ARG, "expert_io = %u: use COLIBRI_EXPERT_IO_* flags", (unsigned)o->expert_io);
    sp->scope = o->expert_cache;
    sp->direct = (o->expert_io & COLIBRI_EXPERT_IO_DIRECT) != 0;
    return colibri_cache_geometry(m, sp->scope, sp->direct, o->expert_budget, &sp->slot_bytes, NULL, &sp->n_slots, err);
}

static colibri_status resolve_options(const colibri_model *m, const colibri_session_options *o,
                                      int32_t *n_ctx, int32_t *n_batch, int32_t *n_seq, colibri_dtype *kv_type, stream_plan *sp,
                                      colibri_error *err)
{
    const colibri_hparams *hp = &m->hp;
    colibri_status st = resolve_stream(m, o, sp, err);
    if (st) return st;
    *n_ctx = o && o->n_ctx ? o->n_ctx : (hp->max_position_embeddings < DEFAULT_CTX ? hp->max_position_embeddings : DEFAULT_CTX);
    *n_batch = o && o->n_batch ? o->n_batch : DEFAULT_BATCH;
    *n_seq = o && o->n_seq ? o->n_seq : 1;
    *kv_type = o ? o->kv_type : COLIBRI_DTYPE_F32;
    if (*kv_type != COLIBRI_DTYPE_F32 && *kv_type != COLIBRI_DTYPE_F16 && *kv_type != COLIBRI_DTYPE_Q8_0)
        return colibri_fail(err, COLIBRI_E_ARG, "kv_type = %d: the KV cache holds COLIBRI_DTYPE_F32 (%d), _F16 (%d) or "
                            "_Q8_0 (%d)", (int)*kv_type, COLIBRI_DTYPE_F32, COLIBRI_DTYPE_F16, COLIBRI_DTYPE_Q8_0);
    if (*kv_type == COLIBRI_DTYPE_Q8_0 && !hp->kv_lora_rank && hp->head_dim % COLIBRI_BLOCK)
        return colibri_fail(err, COLIBRI_E_ARG, "kv_type q8_0 quantizes each head's keys and values in blocks of 32: "
                            "head_dim = %d is no multiple of 32", hp->head_dim);
    if (o && (o->threads < 0 || o->threads > 256))
        return colibri_fail(err, COLIBRI_E_ARG, "threads = %d must lie in [0, 256] (0: COLIBRI_THREADS, else the cores)",
                            o->threads);
    if (*n_ctx < 1 || *n_ctx > hp->max_position_embeddings)
        return colibri_fail(err, COLIBRI_E_ARG, "n_ctx = %d must lie in [1, %d] (max_position_embeddings)",
                            *n_ctx, hp->max_position_embeddings);
    if (o && (o->routing < COLIBRI_ROUTING_MODEL || o->routing > COLIBRI_ROUTING_CAPACITY))
        return colibri_fail(err, COLIBRI_E_ARG, "routing = %d: use a COLIBRI_ROUTING_* value", o->routing);
    if (o && o->routing == COLIBRI_ROUTING_NOISY && !(o->routing_noise >= 0.0f && o->routing_noise < 1e30f))
        return colibri_fail(err, COLIBRI_E_ARG, "routing_noise must be a finite number >= 0");
    if (o && o->routing == COLIBRI_ROUTING_CAPACITY && o->capacity_factor == 0.0f && !hp->capacity_factor)
        return colibri_fail(err, COLIBRI_E_ARG, "capacity_factor must be a finite number > 0 (0 takes the model's "
                            "routing.capacity_factor, which this model does not give)");
    if (o && o->routing == COLIBRI_ROUTING_CAPACITY && o->capacity_factor != 0.0f &&
        !(o->capacity_factor > 0.0f && o->capacity_factor < 1e30f))
        return colibri_fail(err, COLIBRI_E_ARG, "capacity_factor must be a finite number > 0");
    if (o && o->kernels != COLIBRI_KERNELS_AUTO && o->kernels != COLIBRI_KERNELS_REFERENCE)
        return colibri_fail(err, COLIBRI_E_ARG, "kernels = %d: use COLIBRI_KERNELS_AUTO or _REFERENCE", o->kernels);
    if (o && o->kernel_variant && !colibri_kernels_named(o->kernel_variant))
        return unknown_variant(o->kernel_variant, "kernel_variant", err);
    if (*n_seq < 1 || *n_seq > 4096)
        return colibri_fail(err, COLIBRI_E_ARG, "n_seq = %d must lie in [1, 4096] (0: 1)", *n_seq);
    if (*n_batch < 1 || *n_batch > 4096)
        return colibri_fail(err, COLIBRI_E_ARG, "n_batch = %d must lie in [1, 4096]", *n_batch);
    if (*n_batch > *n_ctx) *n_batch = *n_ctx;
    return COLIBRI_OK;
}

/* Lays the session out in `a`: the struct first, then the table of its n_records carves, then
 * the buffers.  While measuring, the carves land in `scratch`; returns the session, or NULL then.
 * a->n_records counts the carves either way. */
static colibri_session *layout(colibri_arena *a, const colibri_model *m, int32_t n_ctx, int32_t n_batch,
                               int32_t n_seq, colibri_dtype kv_type, const stream_plan *sp, int32_t n_records,
                               colibri_session *scratch)
{
    colibri_session *s = colibri_arena_carve(a, COLIBRI_SESSION_SLOT, ARENA_SESSION, "session", -1, "struct");
    colibri_arena_record *records = colibri_arena_carve(a, (size_t)n_records * COLIBRI_RECORD_SLOT,
                                                        ARENA_SESSION, "memory_records", -1, "(records) struct");
    if (s && records) {
        /* the two carves above were made before the table existed: enter them by hand */
        records[0].name = "session"; records[0].group = ARENA_SESSION; records[0].layer = -1;
        records[0].offset = (size_t)((uint8_t *)s - a->base);
        records[0].size = COLIBRI_SESSION_SLOT; records[0].shape = "struct";
        records[1].name = "memory_records"; records[1].group = ARENA_SESSION; records[1].layer = -1;
        records[1].offset = (size_t)((uint8_t *)records - a->base);
        records[1].size = (size_t)n_records * COLIBRI_RECORD_SLOT; records[1].shape = "(records) struct";
        a->records = records;
        a->max_records = n_records;
    } else {
        if (!scratch) return NULL;   /* out of room */
        s = scratch;
    }
    memset(s, 0, sizeof *s);
    carve_session(s, a, m, n_ctx, n_batch, n_seq, kv_type, sp);
    return s == scratch ? NULL : s;
}

/* The arena bytes and the record count of a session, measured twice: once to count the carves,
 * once with the table that records them. */
static colibri_status measure(const colibri_model *m, int32_t n_ctx, int32_t n_batch, int32_t n_seq, colibri_dtype kv_type,
                              const stream_plan *sp, size_t *bytes, int32_t *n_records, colibri_error *err)
{
    colibri_arena a;
    colibri_session scratch;
    memset(&a, 0, sizeof a);
    layout(&a, m, n_ctx, n_batch, n_seq, kv_type, sp, 0, &scratch);
    *n_records = a.n_records;
    memset(&a, 0, sizeof a);
    layout(&a, m, n_ctx, n_batch, n_seq, kv_type, sp, *n_records, &scratch);
    if (a.overflow)
        return colibri_fail(err, COLIBRI_E_NOMEM, "a session with n_ctx %d, n_batch %d and n_seq %d needs more bytes than size_t counts",
                            n_ctx, n_batch, n_seq);
    *bytes = a.used;
    return COLIBRI_OK;
}

colibri_status colibri_session_plan(const colibri_model *model, const colibri_session_options *options,
                                    size_t *arena_bytes, colibri_error *err)
{
    int32_t n_ctx, n_batch, n_seq, n_records;
    colibri_dtype kv_type;
    stream_plan sp;
    colibri_status st;
    if (!model || !arena_bytes) return colibri_fail(err, COLIBRI_E_ARG, "colibri_session_plan: NULL argument");
    st = resolve_options(model, options, &n_ctx, &n_batch, &n_seq, &kv_type, &sp, err);
    if (st) return st;
    return measure(model, n_ctx, n_batch, n_seq, kv_type, &sp, arena_bytes, &n_records, err);
}

colibri_status colibri_expert_slots(const colibri_model *model, const colibri_session_options *options,
                                    uint64_t *slot_bytes, uint64_t *min_budget, colibri_error *err)
{
    if (!model || !slot_bytes || !min_budget) return colibri_fail(err, COLIBRI_E_ARG, "colibri_expert_slots: NULL argument");
    return colibri_cache_geometry(model, options ? options->expert_cache : COLIBRI_CACHE_GLOBAL,
                                  options && (options->expert_io & COLIBRI_EXPERT_IO_DIRECT), 0, slot_bytes, min_budget,
                                  NULL, err);
}

colibri_status colibri_expert_slot_count(const colibri_model *model, const colibri_session_options *options,
                                         int32_t *n_slots, colibri_error *err)
{
    if (!model || !options || !n_slots) return colibri_fail(err, COLIBRI_E_ARG, "colibri_expert_slot_count: NULL argument");
    return colibri_cache_geometry(model, options->expert_cache, (options->expert_io & COLIBRI_EXPERT_IO_DIRECT) != 0,
                                  options->expert_budget, NULL, NULL, n_slots, err);
}

colibri_status colibri_session_create(const colibri_model *model, const colibri_session_options *options,
                                      colibri_session **out, colibri_error *err)
{
    colibri_arena a;
    colibri_session *s;
    int32_t n_ctx, n_batch, n_seq, n_records, i;
    colibri_dtype kv_type;
    size_t need = 0;
    void *base;
    size_t mapped = 0;
    int hugepages = 0, owned = 0;
    int32_t threads;
    const colibri_kernels *kernels;
    stream_plan sp;
    colibri_status st;

    if (!model || !out) return colibri_fail(err, COLIBRI_E_ARG, "colibri_session_create: NULL argument");
    *out = NULL;
    st = colibri_platform_model_check(model, err);   /* weights.bin rewritten under the mapping: its bytes are not the ones checked */
    if (st) return st;
    st = resolve_options(model, options, &n_ctx, &n_batch, &n_seq, &kv_type, &sp, err);
    if (st) return st;
    st = measure(model, n_ctx, n_batch, n_seq, kv_type, &sp, &need, &n_records, err);
    if (st) return st;
    kernels = pick_kernels(options, err);
    if (!kernels) return err ? err->status : COLIBRI_E_ARG;

    if (options && options->arena) {
        size_t pad = colibri_align_up((size_t)(uintptr_t)options->arena, COLIBRI_ALIGNMENT) - (size_t)(uintptr_t)options->arena;
        if ((uintptr_t)options->arena % 16 != 0)
            return colibri_fail(err, COLIBRI_E_ARG, "arena buffer must be 16-byte aligned");
        if (options->arena_size < need + pad)
            return colibri_fail(err, COLIBRI_E_NOMEM, "arena of %zu bytes is too small: this model and context need %zu "
                                "(%zu planned + %zu to reach a 64-byte boundary)", options->arena_size, need + pad, need, pad);
        base = options->arena;
        mapped = options->arena_size;
    } else {
        st = colibri_platform_map_arena(need + COLIBRI_ALIGNMENT, &base, &mapped, &hugepages, err);
        if (st) return st;
        owned = 1;
    }

    /* Align the base to 64 bytes so carve offsets are addresses' alignment too. */
    memset(&a, 0, sizeof a);
    a.base = (uint8_t *)colibri_align_up((size_t)(uintptr_t)base, COLIBRI_ALIGNMENT);
    a.capacity = mapped - (size_t)(a.base - (uint8_t *)base);
    s = layout(&a, model, n_ctx, n_batch, n_seq, kv_type, &sp, n_records, NULL);
    if (!s || a.used > a.capacity || a.n_records != n_records || (sp.n_slots && !s->cache) || (sp.n_drivers && !s->devices)) {   /* cannot happen: the plan above sized it */
        if (owned) colibri_platform_unmap_arena(base, mapped);
        return colibri_fail(err, COLIBRI_E_NOMEM, "arena layout exceeded its plan");
    }
    if (owned) colibri_arena_poison_tail(&a);
    s->arena = a;
    s->arena_raw = base;
    s->model = model;
    s->compute.kernels = kernels;
    threads = options && options->threads ? options->threads : colibri_platform_default_threads();
    if (threads > 1 && colibri_platform_pool_create(threads, &s->compute.pool, err) != COLIBRI_OK) {
        if (owned) colibri_platform_unmap_arena(base, mapped);
        return err ? err->status : COLIBRI_E_NOMEM;
    }
    if (options && options->profile) s->profile = s->profile_ns;
    if (options) {
        s->routing.mode = options->routing;
        s->routing.noise = options->routing_noise;
        s->routing.seed = options->routing_seed;
        s->routing.capacity_factor = options->capacity_factor != 0.0f ? options->capacity_factor
                                                                       : model->hp.capacity_factor;
    }
    s->moe.router = colibri_router_for(&model->hp, s->routing.mode);
    s->moe.expert = colibri_moe_expert_at(model->hp.expert_kind);
    s->moe.aggregator = colibri_moe_aggregator_at(model->hp.aggregator_kind);
    s->n_ctx = n_ctx;
    s->n_batch = n_batch;
    s->n_seq = n_seq;
    for (i = 0; i < n_seq; i++) colibri_seq_clear(&s->seq[i]);
    s->arena_owned = owned;
    s->arena_hugepages = hugepages;
    s->arena_mapped = mapped;
    colibri_rope_tables_fill(s);
    if (s->cache) {   /* the reader, and the pinned experts read now */
        s->cache->profile = s->profile;
        s->stream.cache = s->cache;
        s->stream.guess_next = colibri_guess_next_layer;
        s->stream.context = s;
        st = colibri_cache_start(s->cache, options->expert_read, options->expert_read_context, options->expert_io,
                                 options->expert_pins, options->n_expert_pins, err);
        if (st) {
            colibri_session_destroy(s);
            return st;
        }
    }
    if (s->devices && (st = colibri_devices_start(s->devices, model, options, err)) != COLIBRI_OK) {
        colibri_session_destroy(s);
        return st;
    }
    *out = s;
    return COLIBRI_OK;
}

void colibri_session_destroy(colibri_session *s)
{
    colibri_arena arena;
    if (!s) return;
    if (s->devices) colibri_devices_stop(s->devices);
    if (s->cache) colibri_cache_stop(s->cache);
    if (s->compute.pool) colibri_platform_pool_destroy(s->compute.pool);
    arena = s->arena;   /* the session lives in the arena: copy before releasing */
    colibri_arena_release(&arena);
    if (s->arena_owned) colibri_platform_unmap_arena(s->arena_raw, s->arena_mapped);
}

void colibri_seq_clear(colibri_seq *q)
{
    q->position = q->logits_position = 0;
    q->pending = q->last_row = -1;
}

void colibri_session_reset(colibri_session *s) { colibri_seq_clear(&s->seq[0]); }
int32_t colibri_session_position(const colibri_session *s) { return s->seq[0].position; }
int32_t colibri_session_pending(const colibri_session *s) { return s->seq[0].pending; }
const int32_t *colibri_session_tokens(const colibri_session *s, int32_t *n) { return colibri_seq_tokens(s, 0, n); }
int32_t colibri_session_n_seq(const colibri_session *s) { return s->n_seq; }

/* Whether `seq` names one of the session's slots (a message in err if not). */
static colibri_status check_seq(const colibri_session *s, int32_t seq, const char *call, colibri_error *err)
{
    if (!s) return colibri_fail(err, COLIBRI_E_ARG, "%s: NULL session", call);
    if (seq < 0 || seq >= s->n_seq)
        return colibri_fail(err, COLIBRI_E_ARG, "%s: sequence %d outside [0, %d)", call, seq, s->n_seq);
    return COLIBRI_OK;
}

int32_t colibri_seq_position(const colibri_session *s, int32_t seq)
{
    return check_seq(s, seq, "", NULL) ? -1 : s->seq[seq].position;
}

int32_t colibri_seq_pending(const colibri_session *s, int32_t seq)
{
    return check_seq(s, seq, "", NULL) ? -1 : s->seq[seq].pending;
}

const int32_t *colibri_seq_tokens(const colibri_session *s, int32_t seq, int32_t *n)
{
    if (n) *n = 0;
    if (check_seq(s, seq, "", NULL)) return NULL;
    if (n) *n = s->seq[seq].position;
    return s->tokens + (size_t)seq * s->n_ctx;
}

const float *colibri_seq_logits(const colibri_session *s, int32_t seq)
{
    return check_seq(s, seq, "", NULL) ? NULL : s->logits + (size_t)seq * s->model->hp.vocab_size;
}

colibri_status colibri_seq_reset(colibri_session *s, int32_t seq, colibri_error *err)
{
    colibri_status st = check_seq(s, seq, "colibri_seq_reset", err);
    if (!st) colibri_seq_clear(&s->seq[seq]);
    return st;
}

/* Bytes of one cache row of layer l: (key, value); kv_type's for attention, f32 for latents and the
 * convolution's inputs; a convolution layer keeps no value. */
static void row_bytes(const colibri_session *s, int32_t l, size_t *kb, size_t *vb)
{
    const colibri_hparams *hp = &s->model->hp;
    int conv = s->model->layers[l].conv;
    size_t KV = (size_t)hp->n_kv_heads * hp->head_dim;
    if (kv_typed(s->model, l)) {
        *kb = *vb = colibri_row_bytes(s->kv_type, KV);
        return;
    }
    *kb = (conv ? (size_t)hp->hidden_size : (size_t)hp->kv_lora_rank) * sizeof(float);
    *vb = conv ? 0 : (size_t)hp->rope_dim * sizeof(float);
}

/* One slot's bytes of the KV cache: every layer's n_ctx rows, and its token ids. */
static size_t seq_kv_bytes(const colibri_session *s)
{
    size_t total = (size_t)s->n_ctx * sizeof(int32_t), kb, vb;
    int32_t l;
    for (l = 0; l < s->model->hp.n_layers; l++) {
        row_bytes(s, l, &kb, &vb);
        total += (size_t)s->n_ctx * (kb + vb);
    }
    return total;
}

/* dst's rows [0, n) of every cache <- src's: keys and values, latents, convolution inputs. */
colibri_status colibri_seq_copy(colibri_session *s, int32_t src, int32_t dst, colibri_error *err)
{
    const colibri_hparams *hp;
    colibri_status st = check_seq(s, src, "colibri_seq_copy (source)", err);
    size_t n, C;
    int32_t l;
    if (st || (st = check_seq(s, dst, "colibri_seq_copy (destination)", err)) != COLIBRI_OK || src == dst) return st;
    hp = &s->model->hp;
    n = (size_t)s->seq[src].position;
    C = (size_t)s->n_ctx;
    for (l = 0; l < hp->n_layers; l++) {
        size_t kb, vb;
        uint8_t *k = (uint8_t *)s->k_cache[l], *v = (uint8_t *)s->v_cache[l];
        row_bytes(s, l, &kb, &vb);
        memcpy(k + (size_t)dst * C * kb, k + (size_t)src * C * kb, n * kb);
        if (vb) memcpy(v + (size_t)dst * C * vb, v + (size_t)src * C * vb, n * vb);
    }
    memcpy(s->tokens + (size_t)dst * C, s->tokens + (size_t)src * C, n * sizeof(int32_t));
    memcpy(s->logits + (size_t)dst * hp->vocab_size, s->logits + (size_t)src * hp->vocab_size,
           (size_t)hp->vocab_size * sizeof(float));
    s->seq[dst] = s->seq[src];
    return COLIBRI_OK;
}

/* Every position's state is kept whole until the session is reset: attention's keys and values
 * (a sliding window masks older positions, it never overwrites them), the latent cache, the
 * convolution's B*x per position.  So any prefix can be kept, and computing from it again gives
 * what a session fed only that prefix computes. */
/* Keeps slot seq's first n tokens; whole_session: slot 0 speaking as the session. */
static colibri_status truncate_seq(colibri_session *s, int32_t seq, int32_t n, int whole_session, colibri_error *err)
{
    colibri_seq *q = &s->seq[seq];
    int32_t held = q->position + (q->pending >= 0);
    char who[32];
    if (n < 0 || n > held) {
        colibri_format(who, sizeof who, whole_session ? "the session" : "sequence %d", seq);
        return colibri_fail(err, COLIBRI_E_ARG, "colibri_%s_truncate: cannot keep %d tokens, %s holds %d (%d positions%s)",
                            whole_session ? "session" : "seq", n, who, held, q->position,
                            q->pending >= 0 ? " and a pending token" : "");
    }
    if (n <= q->position) {   /* the pending token lies past n: dropped */
        q->position = n;
        q->pending = -1;
    }
    return COLIBRI_OK;
}

colibri_status colibri_seq_truncate(colibri_session *s, int32_t seq, int32_t n, colibri_error *err)
{
    colibri_status st = check_seq(s, seq, "colibri_seq_truncate", err);
    return st ? st : truncate_seq(s, seq, n, 0, err);
}

colibri_status colibri_session_truncate(colibri_session *s, int32_t n, colibri_error *err)
{
    if (!s) return colibri_fail(err, COLIBRI_E_ARG, "colibri_session_truncate: NULL session");
    return truncate_seq(s, 0, n, 1, err);
}
int32_t colibri_session_n_ctx(const colibri_session *s) { return s->n_ctx; }
const char *colibri_session_kernels(const colibri_session *s) { return s->compute.kernels->name; }
const float *colibri_session_logits(const colibri_session *s) { return s->logits; }   /* slot 0's */

/* ---- the rooms below, handed the session's parts ---- */

colibri_status colibri_memory(const colibri_session *s, colibri_memory_totals *totals)
{
    if (!s || !totals) return COLIBRI_E_ARG;
    colibri_memory_totals_of(&s->arena, s->model, totals);
    return COLIBRI_OK;
}

colibri_status colibri_memdump(const colibri_session *s, char *buf, size_t cap, size_t *len)
{
    colibri_memdump_header header;
    if (!s || (!buf && cap)) return COLIBRI_E_ARG;
    header.n_ctx = s->n_ctx;
    header.n_batch = s->n_batch;
    header.n_seq = s->n_seq;
    header.seq_kv_bytes = seq_kv_bytes(s);
    header.kernels = s->compute.kernels->name;
    header.kv_type = colibri_dtype_name(s->kv_type);
    header.mapped = s->arena_owned;
    header.hugepages = s->arena_hugepages;
    memset(&header.slots, 0, sizeof header.slots);
    if (s->cache) {
        header.slots.n_slots = s->cache->n_slots;
        header.slots.slot_bytes = s->cache->slot_bytes;
        header.slots.n_experts = s->cache->n_experts;
        header.slots.owner = s->cache->slot_owner;
        header.slots.flags = s->cache->slot_flags;
        header.slots.state = s->cache->slot_state;
    }
    colibri_memdump_report(&s->arena, s->model, &header, buf, cap, len);
    return COLIBRI_OK;
}

colibri_status colibri_sample(colibri_session *s, const colibri_sampling *params, uint64_t *rng,
                              int32_t *token, colibri_error *err)
{
    return colibri_sample_after(s, params, NULL, 0, rng, token, err);
}

colibri_status colibri_sample_after(colibri_session *s, const colibri_sampling *params, const int32_t *recent,
                                    int32_t n_recent, uint64_t *rng, int32_t *token, colibri_error *err)
{
    if (!s || !params || !rng || !token) return colibri_fail(err, COLIBRI_E_ARG, "colibri_sample: NULL argument");
    return colibri_seq_sample(s, 0, params, recent, n_recent, rng, token, err);
}

colibri_status colibri_seq_sample(colibri_session *s, int32_t seq, const colibri_sampling *params, const int32_t *recent,
                                  int32_t n_recent, uint64_t *rng, int32_t *token, colibri_error *err)
{
    const colibri_seq *q = &s->seq[seq];
    uint64_t clock = colibri_profile_start(s->profile);
    colibri_status st;
    if (q->position == 0 || q->logits_position != q->position)   /* none yet, or a truncated position's */
        st = colibri_fail(err, COLIBRI_E_ARG, "colibri_sample: no logits for the last position (forward first)");
    else st = colibri_sample_logits(s->logits + (size_t)seq * s->model->hp.vocab_size, s->model->hp.vocab_size, s->probs,
                                   s->candidates, params, recent, n_recent, rng, token, err);
    colibri_profile_add(s->profile, COLIBRI_PHASE_SAMPLING, &clock);
    return st;
}

colibri_status colibri_expert_cache_stats_get(const colibri_session *s, colibri_expert_cache_stats *stats)
{
    if (!s || !stats || !s->cache) return COLIBRI_E_ARG;
    *stats = s->cache->stats;
    return COLIBRI_OK;
}

void colibri_expert_cache_stats_clear(colibri_session *s)
{
    colibri_expert_cache_stats *st;
    if (!s || !s->cache) return;
    st = &s->cache->stats;
    st->hits = st->misses = st->prefetches = st->prefetch_hits = st->bytes_read = st->reads = st->io_wait_ns = 0;
}

colibri_status colibri_expert_cache_slot(const colibri_session *s, int32_t slot, int32_t *layer, int32_t *expert,
                                         int *pinned)
{
    const colibri_expert_cache *c;
    int32_t owner;
    if (!s || !s->cache || !layer || !expert || !pinned || slot < 0 || slot >= s->cache->n_slots) return COLIBRI_E_ARG;
    c = s->cache;
    owner = c->slot_state[slot] == CACHE_EMPTY ? -1 : c->slot_owner[slot];
    *layer = owner < 0 ? -1 : owner / c->n_experts;
    *expert = owner < 0 ? -1 : owner % c->n_experts;
    *pinned = (c->slot_flags[slot] & CACHE_PINNED) != 0;
    return COLIBRI_OK;
}
