/* Sessions and the forward pass of the mixtral architecture.
 *
 *   x = embed(tokens)                                        (n, dim)
 *   for each layer:
 *       x += wo @ attention(rope(wq @ norm(x)), KV cache)     grouped-query heads
 *       x += aggregate(experts(router(norm(x))))              the MoE triad
 *   logits = lm_head @ norm(x)                               (n, vocab)
 */
#include <math.h>
#include <string.h>

#include "session.h"
#include "../platform.h"
#include "../util.h"

COLIBRI_SLOT_CHECK(colibri_session, COLIBRI_SESSION_SLOT);
COLIBRI_SLOT_CHECK(colibri_arena_record, COLIBRI_RECORD_SLOT);

#define DEFAULT_BATCH 64
#define DEFAULT_CTX 4096    /* a default, not a limit: a model may allow millions of positions */

/* Carves every buffer of a session from `a`.  Run once measuring (a->base == NULL) and
 * once for real: the same sequence, so the plan is exact. */
static int has_conv(const colibri_model *m)
{
    int32_t l;
    for (l = 0; l < m->hp.n_layers; l++)
        if (m->layers[l].conv) return 1;
    return 0;
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

static void carve_session(colibri_session *s, colibri_arena *a, const colibri_model *m,
                          int32_t n_ctx, int32_t n_batch)
{
    const colibri_hparams *hp = &m->hp;
    size_t B = (size_t)n_batch, C = (size_t)n_ctx, D = (size_t)hp->hidden_size;
    size_t Q = (size_t)hp->n_heads * hp->head_dim, KV = (size_t)hp->n_kv_heads * hp->head_dim;
    size_t E = (size_t)hp->n_experts, K = (size_t)hp->top_k, F = (size_t)hp->intermediate_size;
    size_t V = (size_t)hp->vocab_size, half = (size_t)hp->rope_dim / 2, f = sizeof(float);
    size_t FF = F;   /* the widest FFN: routed, shared or dense */
    size_t R = (size_t)hp->kv_lora_rank, DR = (size_t)hp->rope_dim, O = Q;   /* O: attention output width */
    size_t KW = R ? R : KV, VW = R ? DR : KV;   /* cache widths: latent attention keeps the latent and the rotary key */
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
        s->q_latent = colibri_arena_carve(a, R * f, ARENA_ACTIVATIONS, "q_latent", -1, "(kv_lora) f32");
        s->ctx_latent = colibri_arena_carve(a, R * f, ARENA_ACTIVATIONS, "ctx_latent", -1, "(kv_lora) f32");
    }
    s->block_out = colibri_arena_carve(a, colibri_arena_bytes(a, B, D, f), ARENA_ACTIVATIONS, "block_out", -1, "(n_batch, dim) f32");

    s->k_cache = colibri_arena_carve(a, 2 * (size_t)hp->n_layers * COLIBRI_POINTER_SLOT, ARENA_KV_CACHE, "layer_table", -1, "(2, n_layers) pointers");
    s->v_cache = s->k_cache ? s->k_cache + hp->n_layers : NULL;
    for (l = 0; l < hp->n_layers; l++) {
        int conv = m->layers[l].conv;   /* a convolution layer caches B*x per position, and no value */
        float *k = colibri_arena_carve(a, colibri_arena_bytes(a, C, conv ? D : KW, f), ARENA_KV_CACHE,
                                       conv ? "conv_input" : R ? "latent" : "k", l,
                                       conv ? "(n_ctx, dim) f32" : R ? "(n_ctx, kv_lora) f32" : "(n_ctx, n_kv_heads * head_dim) f32");
        float *v = colibri_arena_carve(a, colibri_arena_bytes(a, C, conv ? 0 : VW, f), ARENA_KV_CACHE, R ? "k_rope" : "v", l,
                                       R ? "(n_ctx, rope_dim) f32" : "(n_ctx, n_kv_heads * head_dim) f32");
        if (s->k_cache) { s->k_cache[l] = k; s->v_cache[l] = v; }
    }
    s->rope_cos = colibri_arena_carve(a, colibri_arena_bytes(a, C, half, f), ARENA_ROPE, "cos", -1, "(n_ctx, rope_dim / 2) f32");
    s->rope_sin = colibri_arena_carve(a, colibri_arena_bytes(a, C, half, f), ARENA_ROPE, "sin", -1, "(n_ctx, rope_dim / 2) f32");

    s->moe_buf.router_logits = colibri_arena_carve(a, colibri_arena_bytes(a, B, E, f), ARENA_ROUTER, "router_logits", -1, "(n_batch, n_experts) f32");
    s->moe_buf.ids = colibri_arena_carve(a, colibri_arena_bytes(a, B, K, sizeof(int32_t)), ARENA_ROUTER, "expert_ids", -1, "(n_batch, top_k) i32");
    s->moe_buf.gates = colibri_arena_carve(a, colibri_arena_bytes(a, B, K, f), ARENA_ROUTER, "gates", -1, "(n_batch, top_k) f32");
    s->moe_buf.router_scratch = colibri_arena_carve(a, (E + (size_t)hp->n_groups) * f, ARENA_ROUTER, "router_scratch", -1, "(n_experts + n_groups) f32");
    s->moe_buf.dropped_from = colibri_arena_carve(a, E * sizeof(int32_t), ARENA_ROUTER, "dropped_from", -1, "(n_experts) i32");
    s->expert_dropped = colibri_arena_carve(a, colibri_arena_bytes(a, (size_t)hp->n_layers, E, sizeof(uint64_t)), ARENA_ROUTER,
                                            "expert_dropped", -1, "(n_layers, n_experts) u64");
    s->moe_buf.expert_start = colibri_arena_carve(a, (E + 1) * sizeof(int32_t), ARENA_ROUTER, "expert_start", -1, "(n_experts + 1) i32");
    s->moe_buf.pair_token = colibri_arena_carve(a, colibri_arena_bytes(a, B, K, sizeof(int32_t)), ARENA_ROUTER, "pair_token", -1, "(n_batch * top_k) i32");
    s->moe_buf.slot_expert = colibri_arena_carve(a, K * sizeof(int32_t), ARENA_ROUTER, "slot_expert", -1, "(top_k) i32");
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

    s->logits = colibri_arena_carve(a, V * f, ARENA_OUTPUT, "logits", -1, "(vocab) f32");
    s->probs = colibri_arena_carve(a, V * f, ARENA_SAMPLING, "probs", -1, "(vocab) f32");
    s->candidates = colibri_arena_carve(a, V * sizeof(int32_t), ARENA_SAMPLING, "candidates", -1, "(vocab) i32");
}

/* Carves: the session struct, the record table, then carve_session's 28 + 2 per layer. */
static int32_t record_count(const colibri_model *m)
{
    return 30 + 2 * m->hp.n_layers + (m->hp.kv_lora_rank ? 3 : 0) + has_conv(m);
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

const char *colibri_kernel_variant(int32_t i, int *runs_here)
{
    const colibri_kernels *k = colibri_kernels_variant(i);
    if (runs_here) *runs_here = k && colibri_kernels_runnable(k);
    return k ? k->name : NULL;
}

static colibri_status resolve_options(const colibri_model *m, const colibri_session_options *o,
                                      int32_t *n_ctx, int32_t *n_batch, colibri_error *err)
{
    const colibri_hparams *hp = &m->hp;
    *n_ctx = o && o->n_ctx ? o->n_ctx : (hp->max_position_embeddings < DEFAULT_CTX ? hp->max_position_embeddings : DEFAULT_CTX);
    *n_batch = o && o->n_batch ? o->n_batch : DEFAULT_BATCH;
    if (*n_ctx < 1 || *n_ctx > hp->max_position_embeddings)
        return colibri_fail(err, COLIBRI_E_ARG, "n_ctx = %d must lie in [1, %d] (max_position_embeddings)",
                            *n_ctx, hp->max_position_embeddings);
    if (o && (o->routing < COLIBRI_ROUTING_MODEL || o->routing > COLIBRI_ROUTING_CAPACITY))
        return colibri_fail(err, COLIBRI_E_ARG, "routing = %d: use a COLIBRI_ROUTING_* value", o->routing);
    if (o && o->routing == COLIBRI_ROUTING_NOISY && !(o->routing_noise >= 0.0f && o->routing_noise < 1e30f))
        return colibri_fail(err, COLIBRI_E_ARG, "routing_noise must be a finite number >= 0");
    if (o && o->routing == COLIBRI_ROUTING_CAPACITY && !(o->capacity_factor > 0.0f && o->capacity_factor < 1e30f))
        return colibri_fail(err, COLIBRI_E_ARG, "capacity_factor must be a finite number > 0");
    if (o && o->kernels != COLIBRI_KERNELS_AUTO && o->kernels != COLIBRI_KERNELS_REFERENCE)
        return colibri_fail(err, COLIBRI_E_ARG, "kernels = %d: use COLIBRI_KERNELS_AUTO or _REFERENCE", o->kernels);
    if (o && o->kernel_variant && !colibri_kernels_named(o->kernel_variant))
        return unknown_variant(o->kernel_variant, "kernel_variant", err);
    if (*n_batch < 1 || *n_batch > 4096)
        return colibri_fail(err, COLIBRI_E_ARG, "n_batch = %d must lie in [1, 4096]", *n_batch);
    if (*n_batch > *n_ctx) *n_batch = *n_ctx;
    return COLIBRI_OK;
}

/* Lays the session out in `a`: the struct first, then its record table, then the buffers.
 * While measuring, the carves land in `scratch`; returns the session, or NULL then. */
static colibri_session *layout(colibri_arena *a, const colibri_model *m, int32_t n_ctx, int32_t n_batch,
                               colibri_session *scratch)
{
    int32_t n_records = record_count(m);
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
    carve_session(s, a, m, n_ctx, n_batch);
    return s == scratch ? NULL : s;
}

colibri_status colibri_session_plan(const colibri_model *model, const colibri_session_options *options,
                                    size_t *arena_bytes, colibri_error *err)
{
    colibri_arena a;
    colibri_session scratch;
    int32_t n_ctx, n_batch;
    colibri_status st;
    if (!model || !arena_bytes) return colibri_fail(err, COLIBRI_E_ARG, "colibri_session_plan: NULL argument");
    st = resolve_options(model, options, &n_ctx, &n_batch, err);
    if (st) return st;
    memset(&a, 0, sizeof a);
    layout(&a, model, n_ctx, n_batch, &scratch);
    if (a.overflow)
        return colibri_fail(err, COLIBRI_E_NOMEM, "a session with n_ctx %d and n_batch %d needs more bytes than size_t counts",
                            n_ctx, n_batch);
    *arena_bytes = a.used;
    return COLIBRI_OK;
}

static const colibri_expert *hp_expert(const colibri_hparams *hp)
{
    return hp->expert_kind == COLIBRI_EXPERT_SWIGLU_CLAMPED ? &colibri_expert_swiglu_clamped : &colibri_expert_swiglu;
}

/* YaRN's correction range: the dimension at which a frequency makes `rotations` turns over the
 * original context (transformers' find_correction_dim, in double as it computes it). */
static double yarn_dim(double rotations, const colibri_hparams *hp)
{
    const double two_pi = 6.283185307179586;
    return hp->rope_dim * colibri_log(hp->rope_original_max / (rotations * two_pi)) / (2.0 * colibri_log((double)hp->rope_theta));
}

/* Angles as transformers computes them in float32: inv_freq = 1 / theta^(2j/d) (YaRN blends it
 * with inv_freq / factor across its correction range), angle = pos * inv_freq; cos and sin of our
 * own (ops/math.c), so every platform fills the same table, times the attention factor. */
static void fill_rope_tables(colibri_session *s)
{
    const colibri_hparams *hp = &s->model->hp;
    int32_t half = hp->rope_dim / 2, p, j;
    double low = 0.0, high = 0.0;
    if (hp->rope_type == COLIBRI_ROPE_YARN) {
        low = yarn_dim(hp->rope_beta_fast, hp);
        high = yarn_dim(hp->rope_beta_slow, hp);
        if (hp->rope_truncate) { low = floor(low); high = ceil(high); }
        if (low < 0.0) low = 0.0;
        if (high > hp->rope_dim - 1) high = hp->rope_dim - 1;
        if (low == high) high += 0.001;
    }
    for (j = 0; j < half; j++) {
        float exponent = (float)(2 * j) / (float)hp->rope_dim;
        float pos_freq = (float)colibri_exp((double)exponent * colibri_log((double)hp->rope_theta));
        float inv_freq = 1.0f / pos_freq;
        if (hp->rope_type == COLIBRI_ROPE_LONGROPE)   /* transformers divides by the short factors at every length */
            inv_freq = 1.0f / (colibri_load_f32(s->model->rope_factors.data, s->model->rope_factors.dtype, (size_t)j) * pos_freq);
        if (hp->rope_type == COLIBRI_ROPE_LLAMA3) {   /* long wavelengths slowed by factor, a blend between */
            float wavelen = 6.2831855f / inv_freq, orig = (float)hp->rope_original_max;
            float low_wavelen = (float)((double)hp->rope_original_max / hp->rope_low_freq_factor);
            float high_wavelen = (float)((double)hp->rope_original_max / hp->rope_high_freq_factor);
            float slowed = wavelen > low_wavelen ? inv_freq / hp->rope_factor : inv_freq;
            float smooth = (orig / wavelen - hp->rope_low_freq_factor) /
                           (float)((double)hp->rope_high_freq_factor - hp->rope_low_freq_factor);
            if (!(wavelen < high_wavelen) && !(wavelen > low_wavelen))
                slowed = (1.0f - smooth) * slowed / hp->rope_factor + smooth * slowed;
            inv_freq = slowed;
        }
        if (hp->rope_type == COLIBRI_ROPE_YARN) {
            float ramp = ((float)j - (float)low) / (float)(high - low);
            float extrapolation = 1.0f - (ramp < 0.0f ? 0.0f : ramp > 1.0f ? 1.0f : ramp);
            inv_freq = 1.0f / (hp->rope_factor * pos_freq) * (1.0f - extrapolation) + inv_freq * extrapolation;
        }
        for (p = 0; p < s->n_ctx; p++) {
            float angle = (float)p * inv_freq, factor = hp->rope_attention_factor;
            if (hp->rope_type == COLIBRI_ROPE_LONGROPE)   /* past the trained context, the long factor */
                factor = p + 1 > hp->rope_original_max ? hp->rope_long_mscale : hp->rope_short_mscale;
            s->rope_cos[(size_t)p * half + j] = (float)colibri_cos((double)angle) * factor;
            s->rope_sin[(size_t)p * half + j] = (float)colibri_sin((double)angle) * factor;
        }
    }
}

colibri_status colibri_session_create(const colibri_model *model, const colibri_session_options *options,
                                      colibri_session **out, colibri_error *err)
{
    colibri_arena a;
    colibri_session *s;
    int32_t n_ctx, n_batch;
    size_t need;
    void *base;
    size_t mapped = 0;
    int hugepages = 0, owned = 0;
    int32_t threads;
    const colibri_kernels *kernels;
    colibri_status st;

    if (!model || !out) return colibri_fail(err, COLIBRI_E_ARG, "colibri_session_create: NULL argument");
    *out = NULL;
    st = colibri_session_plan(model, options, &need, err);
    if (st) return st;
    resolve_options(model, options, &n_ctx, &n_batch, err);
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
    s = layout(&a, model, n_ctx, n_batch, NULL);
    if (!s || a.used > a.capacity) {   /* cannot happen: the plan above sized it */
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
        s->routing.capacity_factor = options->capacity_factor;
    }
    s->moe.router = colibri_router_for(&model->hp, s->routing.mode);
    s->moe.expert = hp_expert(&model->hp);
    s->moe.aggregator = &colibri_aggregator_weighted;
    s->n_ctx = n_ctx;
    s->n_batch = n_batch;
    s->arena_owned = owned;
    s->arena_hugepages = hugepages;
    s->arena_mapped = mapped;
    fill_rope_tables(s);
    *out = s;
    return COLIBRI_OK;
}

void colibri_session_destroy(colibri_session *s)
{
    colibri_arena arena;
    if (!s) return;
    if (s->compute.pool) colibri_platform_pool_destroy(s->compute.pool);
    arena = s->arena;   /* the session lives in the arena: copy before releasing */
    colibri_arena_release(&arena);
    if (s->arena_owned) colibri_platform_unmap_arena(s->arena_raw, s->arena_mapped);
}

void colibri_session_reset(colibri_session *s) { s->position = 0; }
int32_t colibri_session_position(const colibri_session *s) { return s->position; }
int32_t colibri_session_n_ctx(const colibri_session *s) { return s->n_ctx; }
const char *colibri_session_kernels(const colibri_session *s) { return s->compute.kernels->name; }
const float *colibri_session_logits(const colibri_session *s) { return s->logits; }

/* ---- forward ---- */

static void embed(const colibri_session *s, const int32_t *tokens, int32_t n)
{
    const colibri_hparams *hp = &s->model->hp;
    const colibri_weight *w = &s->model->tok_embeddings;
    size_t d = (size_t)hp->hidden_size, i;
    int32_t t;
    for (t = 0; t < n; t++) {
        size_t row = (size_t)tokens[t] * d;
        for (i = 0; i < d; i++) s->x[(size_t)t * d + i] = colibri_load_f32(w->data, w->dtype, row + i) * hp->embedding_multiplier;
    }
}

/* rows (n, cols) += bias (cols) */
static void add_bias(float *rows, colibri_weight bias, int32_t n, int32_t cols)
{
    int32_t t, i;
    for (t = 0; t < n; t++)
        for (i = 0; i < cols; i++) rows[(size_t)t * cols + i] += colibri_load_f32(bias.data, bias.dtype, (size_t)i);
}

static void clamp(float *x, size_t n, float limit)
{
    size_t i;
    for (i = 0; i < n; i++) x[i] = x[i] > limit ? limit : x[i] < -limit ? -limit : x[i];
}

/* rows (n_rows, width) <- each row times 1/sqrt(mean(row^2) + eps): RMSNorm with no weight */
static void rms_plain(float *rows, size_t n_rows, int32_t width, float eps)
{
    size_t r;
    int32_t i;
    for (r = 0; r < n_rows; r++) {
        float *x = rows + r * width, scale;
        double ss = 0.0;
        for (i = 0; i < width; i++) ss += (double)x[i] * x[i];
        scale = 1.0f / sqrtf((float)(ss / width) + eps);
        for (i = 0; i < width; i++) x[i] *= scale;
    }
}

/* QK-norm of rows (n, n_heads * head_dim) in place: RMSNorm per head or over the whole row. */
static void qk_norm(const colibri_session *s, float *rows, colibri_weight w, int32_t n, int32_t n_heads)
{
    const colibri_hparams *hp = &s->model->hp;
    int32_t hd = hp->head_dim, width = hp->qk_norm == COLIBRI_QK_NORM_HEAD ? hd : n_heads * hd;
    size_t r, n_rows = (size_t)n * n_heads * hd / width;
    for (r = 0; r < n_rows; r++)
        s->compute.kernels->rmsnorm(rows + r * width, rows + r * width, w.data, w.dtype, width, hp->rms_norm_eps);
}

/* block_out (n, dim) for DeepSeek's multi-head latent attention.  The cache holds per position the
 * normed latent c (kv_lora) and the rotary key k_pe (rope_dim) every head shares; each head's key
 * and value up-projections (wkv_b) are folded into its query and its output instead of expanding
 * the cache:  q_nope . (Wk c) = (Wk^T q_nope) . c  and  sum_j p_j Wv c_j = Wv sum_j p_j c_j. */
static void attention_latent(colibri_session *s, int32_t layer, int32_t pos0, int32_t n)
{
    const colibri_hparams *hp = &s->model->hp;
    const colibri_weight *w = s->model->layers[layer].w;
    const colibri_compute *k = &s->compute;
    int32_t d = hp->hidden_size, H = hp->n_heads, dn = hp->nope_dim, dr = hp->rope_dim, dv = hp->v_head_dim;
    int32_t R = hp->kv_lora_rank, qd = hp->head_dim, QL = hp->q_lora_rank, half = dr / 2, t, h, j, i, r;
    float *latent = s->k_cache[layer], *k_rope = s->v_cache[layer];   /* (n_ctx, R), (n_ctx, dr) */
    size_t wkv_row = colibri_row_bytes(w[L_WKV_B].dtype, (size_t)R);   /* bytes of one wkv_b row */

    /* queries (n, H * qd): [nope | rope] per head */
    if (QL) {
        colibri_matmul(k, s->latent_in, s->xn, w[L_WQ_A].data, w[L_WQ_A].dtype, n, d, QL);
        if (hp->attention_bias) add_bias(s->latent_in, w[L_BQ_A], n, QL);
        for (t = 0; t < n; t++)
            k->kernels->rmsnorm(s->latent_in + (size_t)t * QL, s->latent_in + (size_t)t * QL, w[L_Q_A_NORM].data,
                       w[L_Q_A_NORM].dtype, QL, hp->latent_norm_eps);
        colibri_matmul(k, s->q, s->latent_in, w[L_WQ_B].data, w[L_WQ_B].dtype, n, QL, H * qd);
    } else {
        colibri_matmul(k, s->q, s->xn, w[L_WQ].data, w[L_WQ].dtype, n, d, H * qd);
    }
    /* the new positions' latent and rotary key, into the cache */
    colibri_matmul(k, s->latent_in, s->xn, w[L_WKV_A].data, w[L_WKV_A].dtype, n, d, R + dr);   /* (n, R + dr) */
    if (hp->attention_bias) add_bias(s->latent_in, w[L_BKV_A], n, R + dr);
    for (t = 0; t < n; t++) {
        const float *row = s->latent_in + (size_t)t * (R + dr);
        const float *c = s->rope_cos + (size_t)(pos0 + t) * half, *sn = s->rope_sin + (size_t)(pos0 + t) * half;
        k->kernels->rmsnorm(latent + (size_t)(pos0 + t) * R, row, w[L_KV_A_NORM].data, w[L_KV_A_NORM].dtype, R, hp->latent_norm_eps);
        memcpy(k_rope + (size_t)(pos0 + t) * dr, row + R, (size_t)dr * sizeof(float));
        colibri_rope(k_rope + (size_t)(pos0 + t) * dr, 1, dr, dr, hp->rope_interleaved, c, sn);
        colibri_rope(s->q + (size_t)t * H * qd + dn, H, qd, dr, hp->rope_interleaved, c, sn);
    }

    for (t = 0; t < n; t++) {
        int32_t span = pos0 + t + 1;
        for (h = 0; h < H; h++) {
            const float *qh = s->q + ((size_t)t * H + h) * qd;
            const uint8_t *wk = (const uint8_t *)w[L_WKV_B].data + (size_t)h * (dn + dv) * wkv_row;   /* (dn, R) */
            for (r = 0; r < R; r++) s->q_latent[r] = 0.0f;
            for (i = 0; i < dn; i++)
                for (r = 0; r < R; r++)
                    s->q_latent[r] += qh[i] * colibri_load_f32(wk, w[L_WKV_B].dtype, (size_t)i * R + r);
            for (j = 0; j < span; j++) {
                const float *cj = latent + (size_t)j * R, *pj = k_rope + (size_t)j * dr;
                float dot = 0.0f;
                for (r = 0; r < R; r++) dot += s->q_latent[r] * cj[r];
                for (i = 0; i < dr; i++) dot += qh[dn + i] * pj[i];
                s->scores[j] = dot * hp->attention_scale;
            }
            colibri_softmax(s->scores, span);
            for (r = 0; r < R; r++) s->ctx_latent[r] = 0.0f;
            for (j = 0; j < span; j++)
                for (r = 0; r < R; r++) s->ctx_latent[r] += s->scores[j] * latent[(size_t)j * R + r];
            colibri_matmul(k, s->attn + ((size_t)t * H + h) * dv, s->ctx_latent, wk + (size_t)dn * wkv_row, w[L_WKV_B].dtype,
                      1, R, dv);
        }
    }
    colibri_matmul(k, s->block_out, s->attn, w[L_WO].data, w[L_WO].dtype, n, H * dv, d);
    if (hp->attention_out_bias) add_bias(s->block_out, w[L_BO], n, d);
}

/* block_out (n, dim) for LFM2's short convolution: B, C, x = in_proj(x_normed); u = B * x, cached per
 * position; y = C * (causal depthwise convolution of u over the last conv_kernel positions);
 * out_proj(y).  Positions before the first are zeros. */
static void conv_block(colibri_session *s, int32_t layer, int32_t pos0, int32_t n)
{
    const colibri_hparams *hp = &s->model->hp;
    const colibri_weight *w = s->model->layers[layer].w;
    const colibri_compute *k = &s->compute;
    int32_t d = hp->hidden_size, K = hp->conv_kernel, t, c, j;
    float *u = s->k_cache[layer];   /* (n_ctx, d) */
    float *y = s->attn;             /* (n, d) */

    colibri_matmul(k, s->conv_in, s->xn, w[L_CONV_IN].data, w[L_CONV_IN].dtype, n, d, 3 * d);   /* (n, 3d): B | C | x */
    if (hp->conv_bias) add_bias(s->conv_in, w[L_CONV_IN_BIAS], n, 3 * d);
    for (t = 0; t < n; t++) {
        const float *bcx = s->conv_in + (size_t)t * 3 * d;
        for (c = 0; c < d; c++) u[(size_t)(pos0 + t) * d + c] = bcx[c] * bcx[2 * d + c];
    }
    for (t = 0; t < n; t++) {
        int32_t pos = pos0 + t;
        const float *gate = s->conv_in + (size_t)t * 3 * d + d;
        for (c = 0; c < d; c++) {
            float acc = hp->conv_bias ? colibri_load_f32(w[L_CONV_KERNEL_BIAS].data, w[L_CONV_KERNEL_BIAS].dtype, (size_t)c) : 0.0f;
            for (j = 0; j < K; j++) {
                int32_t p = pos - (K - 1) + j;
                if (p >= 0) acc += colibri_load_f32(w[L_CONV_KERNEL].data, w[L_CONV_KERNEL].dtype, (size_t)c * K + j) * u[(size_t)p * d + c];
            }
            y[(size_t)t * d + c] = gate[c] * acc;
        }
    }
    colibri_matmul(k, s->block_out, y, w[L_CONV_OUT].data, w[L_CONV_OUT].dtype, n, d, d);
    if (hp->conv_bias) add_bias(s->block_out, w[L_CONV_OUT_BIAS], n, d);
}

/* x (n) <- the first n of softmax(x, sink): the sink takes its share of the probability and is dropped */
static void softmax_with_sink(float *x, int32_t n, float sink)
{
    float max = sink, sum;
    int32_t i;
    for (i = 0; i < n; i++) if (x[i] > max) max = x[i];
    sum = colibri_expf(sink - max);
    for (i = 0; i < n; i++) { x[i] = colibri_expf(x[i] - max); sum += x[i]; }
    for (i = 0; i < n; i++) x[i] /= sum;
}

/* block_out (n, dim) = wo @ attention(x_normed) for the n tokens at positions pos0 .. pos0 + n - 1. */
/* softmax(q k^T * scale) v for heads [part * H / parts, (part + 1) * H / parts) of n queries at
 * positions pos0.., over the cached keys and values: the threads share a layer's heads, each head
 * with its own scores row, so the result does not depend on the split. */
typedef struct heads_job { colibri_session *s; int32_t layer, pos0, n; } heads_job;

static void attend_heads(void *context, int32_t part, int32_t parts)
{
    const heads_job *job = context;
    colibri_session *s = job->s;
    const colibri_hparams *hp = &s->model->hp;
    const colibri_layer_weights *lw = &s->model->layers[job->layer];
    const colibri_kernels *kernels = s->compute.kernels;
    int32_t hd = hp->head_dim, H = hp->n_heads, q_dim = H * hd, kv_dim = hp->n_kv_heads * hd, group = H / hp->n_kv_heads;
    int32_t t, h;
    for (h = H * part / parts; h < H * (part + 1) / parts; h++) {
        float *scores = s->scores + (size_t)h * s->n_ctx;
        size_t kv_off = (size_t)(h / group) * hd;
        for (t = 0; t < job->n; t++) {
            int32_t pos = job->pos0 + t, first = 0, span;
            const float *qh = s->q + (size_t)t * q_dim + (size_t)h * hd;
            float *out = s->attn + (size_t)t * q_dim + (size_t)h * hd;
            if (lw->window > 0 && pos - lw->window + 1 > 0) first = pos - lw->window + 1;
            if (lw->chunk) first = pos / lw->chunk * lw->chunk;
            span = pos - first + 1;
            kernels->attention_scores(scores, qh, s->k_cache[job->layer] + (size_t)first * kv_dim + kv_off, (size_t)kv_dim,
                                      span, hd, hp->attention_scale);
            if (hp->attention_sinks) softmax_with_sink(scores, span, colibri_load_f32(lw->w[L_SINKS].data, lw->w[L_SINKS].dtype, (size_t)h));
            else kernels->softmax(scores, span);
            kernels->attention_values(out, scores, s->v_cache[job->layer] + (size_t)first * kv_dim + kv_off, (size_t)kv_dim,
                                      span, hd);
        }
    }
}

static void attention(colibri_session *s, int32_t layer, int32_t pos0, int32_t n)
{
    const colibri_hparams *hp = &s->model->hp;
    const colibri_layer_weights *lw = &s->model->layers[layer];
    const colibri_weight *w = lw->w;
    const colibri_compute *k = &s->compute;
    int32_t d = hp->hidden_size, hd = hp->head_dim, H = hp->n_heads, half = hp->rope_dim / 2;
    int32_t q_dim = H * hd, kv_dim = hp->n_kv_heads * hd;
    float *k_rows = s->k_cache[layer] + (size_t)pos0 * kv_dim;     /* (n, kv_dim) */
    float *v_rows = s->v_cache[layer] + (size_t)pos0 * kv_dim;
    int32_t t, i;

    colibri_matmul(k, s->q, s->xn, w[L_WQ].data, w[L_WQ].dtype, n, d, q_dim);
    colibri_matmul(k, k_rows, s->xn, w[L_WK].data, w[L_WK].dtype, n, d, kv_dim);
    colibri_matmul(k, v_rows, s->xn, w[L_WV].data, w[L_WV].dtype, n, d, kv_dim);
    if (hp->attention_bias) {
        add_bias(s->q, w[L_BQ], n, q_dim);
        add_bias(k_rows, w[L_BK], n, kv_dim);
        add_bias(v_rows, w[L_BV], n, kv_dim);
    }
    if (hp->qk_norm != COLIBRI_QK_NORM_NONE && hp->qk_norm != COLIBRI_QK_NORM_HEAD_PLAIN) {
        qk_norm(s, s->q, w[L_Q_NORM], n, H);
        qk_norm(s, k_rows, w[L_K_NORM], n, hp->n_kv_heads);
    }
    if (hp->qk_norm == COLIBRI_QK_NORM_HEAD_PLAIN && lw->rope) {   /* rotation keeps a head's norm: order is free */
        rms_plain(s->q, (size_t)n * H, hd, hp->rms_norm_eps);
        rms_plain(k_rows, (size_t)n * hp->n_kv_heads, hd, hp->rms_norm_eps);
    }
    if (hp->clip_qkv > 0.0f) {
        clamp(s->q, (size_t)n * q_dim, hp->clip_qkv);
        clamp(k_rows, (size_t)n * kv_dim, hp->clip_qkv);
        clamp(v_rows, (size_t)n * kv_dim, hp->clip_qkv);
    }
    for (t = 0; t < n && lw->rope; t++) {
        const float *c = s->rope_cos + (size_t)(pos0 + t) * half, *sn = s->rope_sin + (size_t)(pos0 + t) * half;
        colibri_rope(s->q + (size_t)t * q_dim, H, hd, hp->rope_dim, hp->rope_interleaved, c, sn);
        colibri_rope(k_rows + (size_t)t * kv_dim, hp->n_kv_heads, hd, hp->rope_dim, hp->rope_interleaved, c, sn);
    }
    if (!lw->rope && hp->nope_temperature_floor > 0.0f) {   /* Llama 4: sharper attention far into the context */
        for (t = 0; t < n; t++) {
            float steps = (float)floor((double)((float)(pos0 + t) + 1.0f) / hp->nope_temperature_floor);
            float scale = (float)colibri_log(1.0 + steps) * hp->nope_temperature_scale + 1.0f;
            for (i = 0; i < q_dim; i++) s->q[(size_t)t * q_dim + i] *= scale;
        }
    }

    {
        heads_job job;
        job.s = s; job.layer = layer; job.pos0 = pos0; job.n = n;
        if (k->pool && (uint64_t)n * (uint64_t)(pos0 + n) * (uint64_t)q_dim >= (1u << 16))
            colibri_platform_pool_run(k->pool, attend_heads, &job, hp->n_heads);
        else
            attend_heads(&job, 0, 1);
    }
    colibri_matmul(k, s->block_out, s->attn, w[L_WO].data, w[L_WO].dtype, n, q_dim, d);
    if (hp->attention_out_bias) add_bias(s->block_out, w[L_BO], n, d);
}

/* x += y * multiplier (the residual add; Granite scales the block's output) */
static void add_into(float *x, const float *y, size_t n, float multiplier)
{
    size_t i;
    for (i = 0; i < n; i++) x[i] += y[i] * multiplier;
}

/* Adds the tokens each expert of `layer` received in the last MoE block (expert_start is the
 * block's grouping of routed pairs by expert). */
static void count_expert_load(colibri_session *s, int32_t layer)
{
    int32_t e, E = s->model->hp.n_experts;
    uint64_t *load = s->expert_load + (size_t)layer * E;
    const int32_t *end = s->routing.mode == COLIBRI_ROUTING_CAPACITY ? s->moe_buf.dropped_from : s->moe_buf.expert_start + 1;
    for (e = 0; e < E; e++) load[e] += (uint64_t)(end[e] - s->moe_buf.expert_start[e]);
}

/* counts (n_layers, n_experts) <- one of the session's per-expert counters */
static colibri_status copy_counts(const colibri_session *s, const uint64_t *from, uint64_t *counts)
{
    if (!s || !counts) return COLIBRI_E_ARG;
    memcpy(counts, from, (size_t)s->model->hp.n_layers * s->model->hp.n_experts * sizeof(uint64_t));
    return COLIBRI_OK;
}

colibri_status colibri_expert_load(const colibri_session *s, uint64_t *counts)
{
    return copy_counts(s, s ? s->expert_load : NULL, counts);
}

void colibri_expert_load_clear(colibri_session *s)
{
    const colibri_hparams *hp = &s->model->hp;
    memset(s->expert_load, 0, (size_t)hp->n_layers * hp->n_experts * sizeof(uint64_t));
    memset(s->expert_dropped, 0, (size_t)hp->n_layers * hp->n_experts * sizeof(uint64_t));
}

colibri_status colibri_expert_dropped(const colibri_session *s, uint64_t *counts)
{
    return copy_counts(s, s ? s->expert_dropped : NULL, counts);
}

/* out (dim) = the model's norm of x: RMSNorm, or LayerNorm with its bias */
static void norm_row(const colibri_session *s, float *out, const float *x, colibri_weight w, colibri_weight b)
{
    const colibri_hparams *hp = &s->model->hp;
    if (hp->norm_kind == COLIBRI_NORM_LAYER)
        colibri_layernorm(out, x, w.data, w.dtype, b.data, b.dtype, hp->hidden_size, hp->rms_norm_eps);
    else
        s->compute.kernels->rmsnorm(out, x, w.data, w.dtype, hp->hidden_size, hp->rms_norm_eps);
}

static void divide(float *x, size_t n, float divisor)
{
    size_t i;
    for (i = 0; i < n; i++) x[i] /= divisor;
}

/* One chunk of at most n_batch tokens; logits (n, vocab) or NULL for the last row only. */
static void forward_chunk(colibri_session *s, const int32_t *tokens, int32_t n, float *logits)
{
    const colibri_model *m = s->model;
    const colibri_hparams *hp = &m->hp;
    const colibri_compute *k = &s->compute;
    int32_t d = hp->hidden_size, t, l;
    size_t nd = (size_t)n * d;

    uint64_t clock;

    embed(s, tokens, n);
    clock = colibri_profile_start(s->profile);
    for (l = 0; l < hp->n_layers; l++) {
        const colibri_layer_weights *lw = &m->layers[l];
        const colibri_weight *w = lw->w;
        for (t = 0; t < n; t++)
            norm_row(s, s->xn + (size_t)t * d, s->x + (size_t)t * d, w[L_ATTN_NORM], w[L_ATTN_NORM_BIAS]);
        colibri_profile_add(s->profile, COLIBRI_PHASE_NORMS, &clock);
        if (lw->conv) conv_block(s, l, s->position, n);
        else if (hp->kv_lora_rank) attention_latent(s, l, s->position, n);
        else attention(s, l, s->position, n);
        add_into(s->x, s->block_out, nd, hp->residual_multiplier);
        colibri_profile_add(s->profile, COLIBRI_PHASE_ATTENTION, &clock);

        for (t = 0; t < n; t++)
            norm_row(s, s->xn + (size_t)t * d, s->x + (size_t)t * d, w[L_FFN_NORM], w[L_FFN_NORM_BIAS]);
        colibri_profile_add(s->profile, COLIBRI_PHASE_NORMS, &clock);
        if (lw->moe) {
            s->routing.tokens = tokens;
            s->routing.position = s->position;
            s->routing.layer = l;
            s->routing.dropped = s->expert_dropped + (size_t)l * hp->n_experts;
            colibri_moe_forward(&s->moe, k, hp, lw, &s->moe_buf, &s->routing, s->xn, n, s->block_out, s->profile);
            count_expert_load(s, l);
            clock = colibri_profile_start(s->profile);   /* the MoE block timed its own phases */
        } else {
            colibri_swiglu(k, hp->activation, w[L_MLP_W1], w[L_MLP_W3], w[L_MLP_W2], d, hp->dense_intermediate_size, s->xn, n,
                           s->moe_buf.h1, s->moe_buf.h3, s->block_out);
            colibri_profile_add(s->profile, COLIBRI_PHASE_DENSE, &clock);
        }
        add_into(s->x, s->block_out, nd, hp->residual_multiplier);
        colibri_profile_add(s->profile, COLIBRI_PHASE_AGGREGATION, &clock);
    }
    s->position += n;
    clock = colibri_profile_start(s->profile);

    if (logits) {
        for (t = 0; t < n; t++)
            norm_row(s, s->xn + (size_t)t * d, s->x + (size_t)t * d, m->norm, m->norm_bias);
        colibri_profile_add(s->profile, COLIBRI_PHASE_NORMS, &clock);
        colibri_matmul(k, logits, s->xn, m->lm_head.data, m->lm_head.dtype, n, d, hp->vocab_size);
        if (hp->lm_head_bias) add_bias(logits, m->lm_head_bias, n, hp->vocab_size);
        if (hp->logits_divisor != 1.0f) divide(logits, (size_t)n * hp->vocab_size, hp->logits_divisor);
        memcpy(s->logits, logits + (size_t)(n - 1) * hp->vocab_size, (size_t)hp->vocab_size * sizeof(float));
    } else {
        norm_row(s, s->xn, s->x + (size_t)(n - 1) * d, m->norm, m->norm_bias);
        colibri_profile_add(s->profile, COLIBRI_PHASE_NORMS, &clock);
        colibri_matmul(k, s->logits, s->xn, m->lm_head.data, m->lm_head.dtype, 1, d, hp->vocab_size);
        if (hp->lm_head_bias) add_bias(s->logits, m->lm_head_bias, 1, hp->vocab_size);
        if (hp->logits_divisor != 1.0f) divide(s->logits, (size_t)hp->vocab_size, hp->logits_divisor);
    }
    colibri_profile_add(s->profile, COLIBRI_PHASE_LM_HEAD, &clock);
}

const char *colibri_phase_name(int32_t phase)
{
    static const char *const names[COLIBRI_PHASE_COUNT] = {
        "norms", "attention", "router", "dispatch", "experts", "aggregation", "dense_mlp", "lm_head", "sampling",
    };
    return phase >= 0 && phase < COLIBRI_PHASE_COUNT ? names[phase] : "?";
}

colibri_status colibri_profile(const colibri_session *s, uint64_t ns[COLIBRI_PHASE_COUNT])
{
    if (!s || !ns) return COLIBRI_E_ARG;
    memcpy(ns, s->profile_ns, sizeof s->profile_ns);
    return COLIBRI_OK;
}

colibri_status colibri_forward(colibri_session *s, const int32_t *tokens, size_t n, float *logits,
                               colibri_error *err)
{
    const colibri_hparams *hp;
    size_t i, done;
    if (!s || (!tokens && n)) return colibri_fail(err, COLIBRI_E_ARG, "colibri_forward: NULL argument");
    hp = &s->model->hp;
    if (n == 0) return colibri_fail(err, COLIBRI_E_ARG, "colibri_forward: no tokens");
    /* Check everything before touching the cache, so a failed call changes nothing. */
    if (n > (size_t)(s->n_ctx - s->position))
        return colibri_fail(err, COLIBRI_E_CONTEXT, "%zu tokens do not fit: %d of %d positions are used",
                            n, s->position, s->n_ctx);
    for (i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] >= hp->vocab_size)
            return colibri_fail(err, COLIBRI_E_TOKEN, "token %zu is %d, outside [0, %d)", i, tokens[i], hp->vocab_size);
    }
    for (done = 0; done < n; done += (size_t)s->n_batch) {
        int32_t chunk = (int32_t)(n - done < (size_t)s->n_batch ? n - done : (size_t)s->n_batch);
        forward_chunk(s, tokens + done, chunk, logits ? logits + done * (size_t)hp->vocab_size : NULL);
    }
    return COLIBRI_OK;
}
