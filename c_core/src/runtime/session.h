/* SPDX-License-Identifier: MIT */
/* The run state of a session's sequences: everything lives inside the session's arena.  Private to
 * c_core/src/runtime/: the lower rooms (mem, sample, moe, ops) are handed the parts they need. */
#ifndef COLIBRI_SESSION_H
#define COLIBRI_SESSION_H

#include "../devices/devices.h"
#include "../mem/arena.h"
#include "../model/model.h"
#include "../moe/moe.h"
#include "../ops/ops.h"

/* One sequence slot (no pointers: the same bytes on every target).  Its KV cache rows, token ids
 * and logits lie in the session's arrays at the slot's index. */
typedef struct colibri_seq {
    int32_t position;           /* tokens in the slot's KV cache */
    int32_t pending;            /* a sampled token not yet in the KV cache, fed first by the next
                                   forward (colibri_generate_next leaves its last one); -1: none */
    int32_t logits_position;    /* the position count when the logits were computed: they are the
                                   last position's while it equals position */
    int32_t start, start_pending;   /* forward_batch: position and pending before the call, for a failed one */
    int32_t last_row;           /* forward_batch: the row of the call that is the slot's last, -1: none */
} colibri_seq;

struct colibri_session {
    const colibri_model *model;
    colibri_compute compute;    /* the kernels, and the threads that share big matmuls */
    colibri_moe moe;
    int32_t n_ctx;
    int32_t n_batch;
    int32_t n_seq;              /* sequence slots */
    colibri_seq *seq;           /* (n_seq) */
    int32_t *tokens;            /* (n_seq, n_ctx) the id at each position of each slot's KV cache */
    /* a forward chunk's rows, whatever their slots */
    int32_t *row_tokens;        /* (n_batch) ids: the chunk's tokens, gathered from the call's entries */
    int32_t *row_pos;           /* (n_batch) each row's position in its sequence */
    int32_t *row_cache;         /* (n_batch) its row in the caches: slot * n_ctx + position */
    colibri_batch_entry *entries;   /* (n_seq) colibri_generate_step's call of colibri_forward_batch */

    colibri_arena arena;
    void *arena_raw;            /* start of the mapping or caller buffer (before alignment) */
    int arena_owned;            /* mapped by the platform: unmap on destroy */
    int arena_hugepages;
    size_t arena_mapped;        /* bytes mapped (rounded to pages) */

    /* activations */
    float *x;                   /* (n_batch, dim) residual stream */
    float *xn;                  /* (n_batch, dim) normed input of a block */
    float *q;                   /* (n_batch, n_heads * head_dim) */
    float *attn;                /* (n_batch, n_heads * head_dim) attention output */
    float *scores;              /* (n_heads, n_ctx) each head's attention weights: heads run on any thread */
    float *conv_in;             /* (n_batch, 3 * dim) short-convolution layers' B, C, x */
    /* latent attention only (hparams.kv_lora_rank > 0) */
    float *latent_in;           /* (n_batch, max(q_lora_rank, kv_lora_rank + rope_dim)) projections before their norms */
    float *q_latent;            /* (n_heads, kv_lora_rank) each head's query, folded into the latent space */
    float *ctx_latent;          /* (n_heads, kv_lora_rank) each head's attention-weighted latent */
    colibri_q8_block *latent_xq;   /* (n_heads, kv_lora_rank / 32) each head's ctx_latent quantized (int8 weights) */
    float *block_out;           /* (n_batch, dim) attention or MoE output before the residual add */
    float *k_rows, *v_rows;     /* (n_batch, n_kv_heads * head_dim) a chunk's keys and values before they go
                                   to their cache rows, when those are not one run (n_seq > 1) or the cache
                                   stores them converted (kv_type f16 or q8_0) */
    /* KV cache, per layer: slot s's rows are [s * n_ctx, (s + 1) * n_ctx) */
    float **k_cache;            /* (n_layers) -> (n_seq * n_ctx, n_kv_heads * head_dim) in kv_type (attention.c's kv_at) */
    float **v_cache;            /* (n_layers) -> (n_seq * n_ctx, n_kv_heads * head_dim) in kv_type; latent and
                                   convolution layers' caches are f32 whatever kv_type */
    colibri_dtype kv_type;      /* f32, f16 or q8_0 */
    /* RoPE angle tables */
    float *rope_cos;            /* (n_ctx, head_dim / 2) */
    float *rope_sin;            /* (n_ctx, head_dim / 2) */
    colibri_moe_buffers moe_buf;
    uint64_t *expert_dropped;   /* (n_layers, n_experts) capacity routing's dropped tokens */
    colibri_routing routing;    /* the session's router choice (research routers are opt-in) */
    uint64_t profile_ns[COLIBRI_PHASE_COUNT];   /* the profiler's sums */
    uint64_t *profile;          /* profile_ns when profiling, else NULL: no clock is read */
    uint64_t *expert_load;      /* (n_layers, n_experts) tokens routed to each expert since the last clear */
    /* expert streaming (expert_budget > 0), else NULL */
    colibri_expert_cache *cache;
    colibri_moe_stream stream;  /* the cache and the next layer's guess, for the MoE block */
    float *guess_x;             /* (dim) the residual stream normed as the next MoE layer norms it */
    float *guess_logits;        /* (n_experts) its router's logits */
    int32_t *guess_ids;         /* (top_k) the experts guessed */
    colibri_devices *devices;   /* drivers registered (n_devices > 0), else NULL */
    /* output */
    float *logits;              /* (n_seq, vocab) each slot's last position's logits */
    float *batch_logits;        /* (min(n_seq, n_batch), vocab) a chunk's last rows' logits (n_seq > 1 only) */
    /* sampling */
    float *probs;               /* (vocab) */
    int32_t *candidates;        /* (vocab) */
};
#define COLIBRI_SESSION_SLOT 728   /* bytes reserved for the struct on every target (util.h) */
#define COLIBRI_ENTRY_SLOT 24      /* bytes reserved per colibri_batch_entry on every target */

/* An empty slot: no positions, no pending token. */
void colibri_seq_clear(colibri_seq *q);
/* colibri_sample_after on slot `seq` (in range: the caller checked it). */
colibri_status colibri_seq_sample(colibri_session *s, int32_t seq, const colibri_sampling *params, const int32_t *recent,
                                  int32_t n_recent, uint64_t *rng, int32_t *token, colibri_error *err);

#endif
