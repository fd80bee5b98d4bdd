/* SPDX-License-Identifier: MIT */
/* The run state of one sequence: everything lives inside the session's arena.  Private to
 * c_core/src/runtime/: the lower rooms (mem, sample, moe, ops) are handed the parts they need. */
#ifndef COLIBRI_SESSION_H
#define COLIBRI_SESSION_H

#include "../devices/devices.h"
#include "../mem/arena.h"
#include "../model/model.h"
#include "../moe/moe.h"
#include "../ops/ops.h"

struct colibri_session {
    const colibri_model *model;
    colibri_compute compute;    /* the kernels, and the threads that share big matmuls */
    colibri_moe moe;
    int32_t n_ctx;
    int32_t n_batch;
    int32_t position;           /* tokens in the KV cache */
    int32_t pending;            /* a sampled token not yet in the KV cache, fed first by the next
                                   forward (colibri_generate_next leaves its last one); -1: none */
    int32_t logits_position;    /* the position count when the logits were computed: they are the
                                   last position's while it equals position */
    int32_t *tokens;            /* (n_ctx) the id at each position of the KV cache */

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
    /* KV cache, per layer */
    float **k_cache;            /* (n_layers) -> (n_ctx, n_kv_heads * head_dim) in kv_type (attention.c's kv_at) */
    float **v_cache;            /* (n_layers) -> (n_ctx, n_kv_heads * head_dim) in kv_type; latent and
                                   convolution layers' caches are f32 whatever kv_type */
    colibri_dtype kv_type;      /* f32, f16 or q8_0 */
    float *kv_rows;             /* (2, n_batch, n_kv_heads * head_dim) f32 keys, values of the new positions
                                   before an f16 or q8_0 cache stores them; NULL for f32 */
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
    float *logits;              /* (vocab) the last position's logits */
    /* sampling */
    float *probs;               /* (vocab) */
    int32_t *candidates;        /* (vocab) */
};
#define COLIBRI_SESSION_SLOT 672   /* bytes reserved for the struct on every target (util.h) */

#endif
