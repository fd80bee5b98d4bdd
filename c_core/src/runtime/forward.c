/* SPDX-License-Identifier: MIT */
/* The forward pass of a session: the mixtral architecture and the families that vary it.
 *
 *   x = embed(tokens)                                        (n, dim)
 *   for each layer:
 *       x += token_mixer(norm(x))         attention, latent attention or a short convolution
 *       x += aggregate(experts(router(norm(x))))              the MoE triad, or a dense MLP
 *   logits = lm_head @ norm(x)                               (n, vocab)
 */
#include <string.h>

#include "forward.h"
#include "../util.h"

/* x (n, dim) = the tokens' embedding rows, times the embedding multiplier */
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

void colibri_add_bias(float *rows, colibri_weight bias, int32_t n, int32_t cols)
{
    int32_t t, i;
    for (t = 0; t < n; t++)
        for (i = 0; i < cols; i++) rows[(size_t)t * cols + i] += colibri_load_f32(bias.data, bias.dtype, (size_t)i);
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

/* x += y * multiplier (the residual add; Granite scales the block's output) */
static void add_into(float *x, const float *y, size_t n, float multiplier)
{
    size_t i;
    for (i = 0; i < n; i++) x[i] += y[i] * multiplier;
}

/* x (n) /= divisor (the logits' scaling) */
static void divide(float *x, size_t n, float divisor)
{
    size_t i;
    for (i = 0; i < n; i++) x[i] /= divisor;
}

/* Adds the tokens each expert of `layer` computed in the last MoE block: its kept pairs
 * [expert_start[e], dropped_from[e]), all of them unless capacity routing dropped some. */
static void count_expert_load(colibri_session *s, int32_t layer)
{
    int32_t e, E = s->model->hp.n_experts;
    uint64_t *load = s->expert_load + (size_t)layer * E;
    for (e = 0; e < E; e++) load[e] += (uint64_t)(s->moe_buf.dropped_from[e] - s->moe_buf.expert_start[e]);   /* kept pairs */
}

/* Expert streaming, one token: the next MoE layer's likely experts, its router applied to the
 * residual stream as it enters this layer's MoE block (normed as that layer will norm it), are
 * read while this layer computes.  The residual stream changes little from layer to layer. */
void colibri_guess_next_layer(void *context)
{
    colibri_session *s = context;
    const colibri_model *m = s->model;
    const colibri_hparams *hp = &m->hp;
    const colibri_layer_weights *lw;
    int32_t l = s->routing.layer + 1, E = hp->n_experts, K = hp->top_k, j;
    while (l < hp->n_layers && !m->layers[l].moe) l++;
    if (l >= hp->n_layers) return;
    lw = &m->layers[l];
    norm_row(s, s->guess_x, s->x, lw->w[L_FFN_NORM], lw->w[L_FFN_NORM_BIAS]);                     /* (dim) */
    colibri_matmul(&s->compute, s->guess_logits, s->guess_x, lw->w[L_ROUTER].data, lw->w[L_ROUTER].dtype, 1,
                   hp->hidden_size, E);                                                            /* (E) */
    if (hp->router_logit_bias) colibri_add_bias(s->guess_logits, lw->w[L_ROUTER_BIAS], 1, E);
    colibri_top_k(s->guess_logits, E, K, s->guess_ids);
    if (s->devices) {   /* an expert a device in use computes is not read here */
        int32_t kept = 0;
        for (j = 0; j < K; j++)
            if (!colibri_device_takes(s->devices, l, s->guess_ids[j])) s->guess_ids[kept++] = s->guess_ids[j];
        K = kept;
    }
    colibri_cache_guess(s->cache, l, s->guess_ids, K);
}

/* One chunk of at most n_batch tokens; logits (n, vocab) or NULL for the last row only.  Fails only
 * on a read of a streamed expert, the chunk then unfinished. */
static colibri_status forward_chunk(colibri_session *s, const int32_t *tokens, int32_t n, float *logits,
                                    colibri_error *err)
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
        if (lw->conv) colibri_conv_block(s, l, s->position, n);
        else if (hp->kv_lora_rank) colibri_attention_latent(s, l, s->position, n);
        else colibri_attention(s, l, s->position, n);
        add_into(s->x, s->block_out, nd, hp->residual_multiplier);
        colibri_profile_add(s->profile, COLIBRI_PHASE_ATTENTION, &clock);

        for (t = 0; t < n; t++)
            norm_row(s, s->xn + (size_t)t * d, s->x + (size_t)t * d, w[L_FFN_NORM], w[L_FFN_NORM_BIAS]);
        colibri_profile_add(s->profile, COLIBRI_PHASE_NORMS, &clock);
        if (lw->moe) {
            const colibri_moe_context moe = { .moe = &s->moe, .k = k, .hp = hp, .lw = lw, .b = &s->moe_buf,
                                              .r = &s->routing, .stream = s->cache ? &s->stream : NULL,
                                              .dev = s->devices, .profile = s->profile, .layer = l };
            colibri_status st;
            s->routing.tokens = tokens;
            s->routing.position = s->position;
            s->routing.layer = l;
            s->routing.dropped = s->expert_dropped + (size_t)l * hp->n_experts;
            st = colibri_moe_forward(&moe, s->xn, n, s->block_out, err);
            if (st) return st;
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
    memcpy(s->tokens + s->position, tokens, (size_t)n * sizeof *tokens);
    s->position += n;
    s->logits_position = s->position;
    clock = colibri_profile_start(s->profile);

    if (logits) {
        for (t = 0; t < n; t++)
            norm_row(s, s->xn + (size_t)t * d, s->x + (size_t)t * d, m->norm, m->norm_bias);
        colibri_profile_add(s->profile, COLIBRI_PHASE_NORMS, &clock);
        colibri_matmul(k, logits, s->xn, m->lm_head.data, m->lm_head.dtype, n, d, hp->vocab_size);
        if (hp->lm_head_bias) colibri_add_bias(logits, m->lm_head_bias, n, hp->vocab_size);
        if (hp->logits_divisor != 1.0f) divide(logits, (size_t)n * hp->vocab_size, hp->logits_divisor);
        memcpy(s->logits, logits + (size_t)(n - 1) * hp->vocab_size, (size_t)hp->vocab_size * sizeof(float));
    } else {
        norm_row(s, s->xn, s->x + (size_t)(n - 1) * d, m->norm, m->norm_bias);
        colibri_profile_add(s->profile, COLIBRI_PHASE_NORMS, &clock);
        colibri_matmul(k, s->logits, s->xn, m->lm_head.data, m->lm_head.dtype, 1, d, hp->vocab_size);
        if (hp->lm_head_bias) colibri_add_bias(s->logits, m->lm_head_bias, 1, hp->vocab_size);
        if (hp->logits_divisor != 1.0f) divide(s->logits, (size_t)hp->vocab_size, hp->logits_divisor);
    }
    colibri_profile_add(s->profile, COLIBRI_PHASE_LM_HEAD, &clock);
    return COLIBRI_OK;
}

colibri_status colibri_forward(colibri_session *s, const int32_t *tokens, size_t n, float *logits,
                               colibri_error *err)
{
    const colibri_hparams *hp;
    size_t i, done, room;
    int32_t start, pending;
    colibri_status st = COLIBRI_OK;
    if (!s || (!tokens && n)) return colibri_fail(err, COLIBRI_E_ARG, "colibri_forward: NULL argument");
    hp = &s->model->hp;
    pending = s->pending;
    if (n == 0 && pending < 0) return colibri_fail(err, COLIBRI_E_ARG, "colibri_forward: no tokens");
    /* Check everything before touching the cache, so a failed call changes nothing. */
    room = (size_t)(s->n_ctx - s->position);
    if (n > room || (pending >= 0 && n == room))
        return colibri_fail(err, COLIBRI_E_CONTEXT, "%zu tokens%s do not fit: %d of %d positions are used",
                            n, pending >= 0 ? " and the pending one" : "", s->position, s->n_ctx);
    for (i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] >= hp->vocab_size)
            return colibri_fail(err, COLIBRI_E_TOKEN, "token %zu is %d, outside [0, %d)", i, tokens[i], hp->vocab_size);
    }
    start = s->position;
    if (pending >= 0) {   /* the token sampled last enters the cache first; its logits are not asked for */
        st = forward_chunk(s, &pending, 1, NULL, err);
        if (st == COLIBRI_OK) s->pending = -1;
    }
    for (done = 0; done < n && st == COLIBRI_OK; done += (size_t)s->n_batch) {
        int32_t chunk = (int32_t)(n - done < (size_t)s->n_batch ? n - done : (size_t)s->n_batch);
        st = forward_chunk(s, tokens + done, chunk, logits ? logits + done * (size_t)hp->vocab_size : NULL, err);
    }
    if (st) {   /* a failed read: the call leaves the context as it found it */
        s->position = start;
        s->pending = pending;
        if (s->cache) colibri_cache_release_all(s->cache);
    }
    return st;
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
