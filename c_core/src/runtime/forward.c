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

/* Every layer over one chunk of n rows: tokens (n) their ids, s->row_pos and s->row_cache (n) their
 * positions and cache rows, whatever their slots.  x (n, dim) leaves as the final norm's input.
 * Fails only on a read of a streamed expert (or a strict device), the chunk then unfinished. */
static colibri_status layers(colibri_session *s, const int32_t *tokens, int32_t n, colibri_error *err)
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
        if (lw->conv) colibri_conv_block(s, l, s->row_pos, s->row_cache, n);
        else if (hp->kv_lora_rank) colibri_attention_latent(s, l, s->row_pos, s->row_cache, n);
        else colibri_attention(s, l, s->row_pos, s->row_cache, n);
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
            s->routing.positions = s->row_pos;
            s->routing.position = s->row_pos[0];
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
    return COLIBRI_OK;
}

/* out (n, vocab) = lm_head @ xn (n, dim), the rows normed already (+ bias, / divisor) */
static void lm_head(colibri_session *s, float *out, int32_t n)
{
    const colibri_model *m = s->model;
    const colibri_hparams *hp = &m->hp;
    colibri_matmul(&s->compute, out, s->xn, m->lm_head.data, m->lm_head.dtype, n, hp->hidden_size, hp->vocab_size);
    if (hp->lm_head_bias) colibri_add_bias(out, m->lm_head_bias, n, hp->vocab_size);
    if (hp->logits_divisor != 1.0f) divide(out, (size_t)n * hp->vocab_size, hp->logits_divisor);
}

/* One chunk of at most n_batch tokens of slot `seq`, appended at its position; logits (n, vocab) or
 * NULL for the last row only, into the slot's logits either way.  Fails as layers() does. */
static colibri_status slot_chunk(colibri_session *s, int32_t seq, const int32_t *tokens, int32_t n, float *logits,
                                 colibri_error *err)
{
    const colibri_model *m = s->model;
    const colibri_hparams *hp = &m->hp;
    colibri_seq *q = &s->seq[seq];
    float *slot_logits = s->logits + (size_t)seq * hp->vocab_size;
    int32_t d = hp->hidden_size, t, first_row = seq * s->n_ctx + q->position;
    uint64_t clock;
    colibri_status st;

    for (t = 0; t < n; t++) {
        s->row_pos[t] = q->position + t;
        s->row_cache[t] = first_row + t;
    }
    if ((st = layers(s, tokens, n, err)) != COLIBRI_OK) return st;
    memcpy(s->tokens + first_row, tokens, (size_t)n * sizeof *tokens);
    q->position += n;
    q->logits_position = q->position;
    clock = colibri_profile_start(s->profile);

    if (logits) {
        for (t = 0; t < n; t++)
            norm_row(s, s->xn + (size_t)t * d, s->x + (size_t)t * d, m->norm, m->norm_bias);
        colibri_profile_add(s->profile, COLIBRI_PHASE_NORMS, &clock);
        lm_head(s, logits, n);
        memcpy(slot_logits, logits + (size_t)(n - 1) * hp->vocab_size, (size_t)hp->vocab_size * sizeof(float));
    } else {
        norm_row(s, s->xn, s->x + (size_t)(n - 1) * d, m->norm, m->norm_bias);
        colibri_profile_add(s->profile, COLIBRI_PHASE_NORMS, &clock);
        lm_head(s, slot_logits, 1);
    }
    colibri_profile_add(s->profile, COLIBRI_PHASE_LM_HEAD, &clock);
    return COLIBRI_OK;
}

/* Whether slot q has room for n more tokens after its pending one. */
static int fits(const colibri_session *s, const colibri_seq *q, size_t n)
{
    size_t room = (size_t)(s->n_ctx - q->position);
    return !(n > room || (q->pending >= 0 && n == room));
}

colibri_status colibri_forward(colibri_session *s, const int32_t *tokens, size_t n, float *logits,
                               colibri_error *err)
{
    const colibri_hparams *hp;
    colibri_seq *q;
    size_t i, done;
    int32_t start, pending;
    colibri_status st = COLIBRI_OK;
    if (!s || (!tokens && n)) return colibri_fail(err, COLIBRI_E_ARG, "colibri_forward: NULL argument");
    hp = &s->model->hp;
    q = &s->seq[0];
    pending = q->pending;
    if (n == 0 && pending < 0) return colibri_fail(err, COLIBRI_E_ARG, "colibri_forward: no tokens");
    /* Check everything before touching the cache, so a failed call changes nothing. */
    if (!fits(s, q, n))
        return colibri_fail(err, COLIBRI_E_CONTEXT, "%zu tokens%s do not fit: %d of %d positions are used",
                            n, pending >= 0 ? " and the pending one" : "", q->position, s->n_ctx);
    for (i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] >= hp->vocab_size)
            return colibri_fail(err, COLIBRI_E_TOKEN, "token %zu is %d, outside [0, %d)", i, tokens[i], hp->vocab_size);
    }
    start = q->position;
    if (pending >= 0) {   /* the token sampled last enters the cache first; its logits are not asked for */
        st = slot_chunk(s, 0, &pending, 1, NULL, err);
        if (st == COLIBRI_OK) q->pending = -1;
    }
    for (done = 0; done < n && st == COLIBRI_OK; done += (size_t)s->n_batch) {
        int32_t chunk = (int32_t)(n - done < (size_t)s->n_batch ? n - done : (size_t)s->n_batch);
        st = slot_chunk(s, 0, tokens + done, chunk, logits ? logits + done * (size_t)hp->vocab_size : NULL, err);
    }
    if (st) {   /* a failed read: the call leaves the context as it found it */
        q->position = start;
        q->pending = pending;
        if (s->cache) colibri_cache_release_all(s->cache);
    }
    return st;
}

/* Every entry checked before anything is computed; marks each slot's last_row. */
static colibri_status check_entries(colibri_session *s, const colibri_batch_entry *entries, int32_t n_entries,
                                    colibri_error *err)
{
    int32_t e, i, vocab = s->model->hp.vocab_size;
    for (e = 0; e < n_entries; e++) {
        int32_t seq = entries[e].seq;
        if (seq < 0 || seq >= s->n_seq)
            return colibri_fail(err, COLIBRI_E_ARG, "colibri_forward_batch: entry %d: sequence %d outside [0, %d)",
                                e, seq, s->n_seq);
        s->seq[seq].last_row = -1;
    }
    for (e = 0; e < n_entries; e++) {
        const colibri_batch_entry *b = &entries[e];
        colibri_seq *q = &s->seq[b->seq];
        if (q->last_row != -1)
            return colibri_fail(err, COLIBRI_E_ARG, "colibri_forward_batch: sequence %d appears twice (entries %d and %d)",
                                b->seq, q->last_row, e);
        q->last_row = e;
        if (b->n_tokens < 0 || (b->n_tokens && !b->tokens))
            return colibri_fail(err, COLIBRI_E_ARG, "colibri_forward_batch: entry %d: %d tokens at %s", e, b->n_tokens,
                                b->tokens ? "a pointer" : "NULL");
        if (b->n_tokens == 0 && q->pending < 0)
            return colibri_fail(err, COLIBRI_E_ARG, "colibri_forward_batch: entry %d: no tokens, and sequence %d has no "
                                "pending one", e, b->seq);
        if (!fits(s, q, (size_t)b->n_tokens))
            return colibri_fail(err, COLIBRI_E_CONTEXT, "sequence %d: %d tokens%s do not fit: %d of %d positions are used",
                                b->seq, b->n_tokens, q->pending >= 0 ? " and the pending one" : "", q->position, s->n_ctx);
        for (i = 0; i < b->n_tokens; i++)
            if (b->tokens[i] < 0 || b->tokens[i] >= vocab)
                return colibri_fail(err, COLIBRI_E_TOKEN, "sequence %d: token %d is %d, outside [0, %d)", b->seq, i,
                                    b->tokens[i], vocab);
    }
    return COLIBRI_OK;
}

/* The chunk's rows whose entries want logits and end in it (rows [0, n)), normed into xn and through
 * the lm_head into their slots' logits. */
static void batch_logits(colibri_session *s, const colibri_batch_entry *entries, int32_t n_entries, int32_t row0,
                         int32_t n)
{
    const colibri_model *m = s->model;
    int32_t d = m->hp.hidden_size, V = m->hp.vocab_size, e, j = 0, last = -1;
    uint64_t clock = colibri_profile_start(s->profile);
    for (e = 0; e < n_entries; e++) {
        int32_t row = s->seq[entries[e].seq].last_row - row0;
        if (!entries[e].logits || row < 0 || row >= n) continue;
        norm_row(s, s->xn + (size_t)j * d, s->x + (size_t)row * d, m->norm, m->norm_bias);
        j++;
        last = e;
    }
    colibri_profile_add(s->profile, COLIBRI_PHASE_NORMS, &clock);
    if (j == 1) {
        lm_head(s, s->logits + (size_t)entries[last].seq * V, 1);
    } else if (j > 1) {   /* batch_logits holds min(n_seq, n_batch) rows: j is at most both */
        lm_head(s, s->batch_logits, j);
        for (e = 0, j = 0; e < n_entries; e++) {
            int32_t row = s->seq[entries[e].seq].last_row - row0;
            if (!entries[e].logits || row < 0 || row >= n) continue;
            memcpy(s->logits + (size_t)entries[e].seq * V, s->batch_logits + (size_t)j++ * V, (size_t)V * sizeof(float));
        }
    }
    colibri_profile_add(s->profile, COLIBRI_PHASE_LM_HEAD, &clock);
}

colibri_status colibri_forward_batch(colibri_session *s, const colibri_batch_entry *entries, int32_t n_entries,
                                     colibri_error *err)
{
    int32_t e, total = 0, row0, entry = 0, offset = 0;
    colibri_status st;
    if (!s || (!entries && n_entries) || n_entries < 0)
        return colibri_fail(err, COLIBRI_E_ARG, "colibri_forward_batch: NULL argument or a negative count");
    if ((st = check_entries(s, entries, n_entries, err)) != COLIBRI_OK) return st;
    for (e = 0; e < n_entries; e++) {   /* rows: each entry's pending token, then its tokens */
        colibri_seq *q = &s->seq[entries[e].seq];
        q->start = q->position;
        q->start_pending = q->pending;
        total += (q->pending >= 0) + entries[e].n_tokens;
        q->last_row = total - 1;
    }
    for (row0 = 0; row0 < total && st == COLIBRI_OK; row0 += s->n_batch) {
        int32_t n = total - row0 < s->n_batch ? total - row0 : s->n_batch, t;
        for (t = 0; t < n; t++) {   /* the chunk's rows, from the entry and offset where the last chunk stopped */
            const colibri_batch_entry *b = &entries[entry];
            colibri_seq *q = &s->seq[b->seq];
            int32_t has_pending = q->start_pending >= 0, pos = q->start + offset;
            s->row_tokens[t] = has_pending && offset == 0 ? q->start_pending : b->tokens[offset - has_pending];
            s->row_pos[t] = pos;
            s->row_cache[t] = b->seq * s->n_ctx + pos;
            s->tokens[s->row_cache[t]] = s->row_tokens[t];
            if (++offset == has_pending + b->n_tokens) { entry++; offset = 0; }
        }
        st = layers(s, s->row_tokens, n, err);
        if (st == COLIBRI_OK) batch_logits(s, entries, n_entries, row0, n);
    }
    for (e = 0; e < n_entries; e++) {
        colibri_seq *q = &s->seq[entries[e].seq];
        if (st) {   /* a failed read: positions and pending tokens as they were; logits computed since are not the last position's */
            if (entries[e].logits && q->last_row < row0 - s->n_batch) q->logits_position = -1;
            continue;
        }
        q->position = q->start + (q->start_pending >= 0) + entries[e].n_tokens;
        q->pending = -1;
        if (entries[e].logits) q->logits_position = q->position;
    }
    if (st && s->cache) colibri_cache_release_all(s->cache);
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
