/* SPDX-License-Identifier: MIT */
/* The loaded model: validated hyper-parameters and typed pointers into the mapped weights. */
#ifndef COLIBRI_MODEL_H
#define COLIBRI_MODEL_H

#include "colibri/colibri.h"
#include "../text/tokenize.h"

/* A weight used in place: `data` points into weights.bin. */
typedef struct colibri_weight {
    const void *data;
    colibri_dtype dtype;
} colibri_weight;

/* The tensors a decoder layer may have, as named in colibri_model.json ("layers.{i}." + name,
 * tensors.c lists the names and shapes).  Which ones a layer has follows from the hyper-parameters:
 * the attention options, and whether the layer's MLP is the MoE block or a dense one. */
enum {
    L_ATTN_NORM, L_ATTN_NORM_BIAS,          /* (dim), (dim) with LayerNorm */
    L_WQ, L_WK, L_WV, L_WO,                 /* (q_dim, dim), (kv_dim, dim) x 2, (dim, q_dim) */
    L_BQ, L_BK, L_BV, L_BO,                 /* attention biases: (q_dim), (kv_dim) x 2, (dim) */
    L_Q_NORM, L_K_NORM,                     /* QK-norm: (head_dim) per head, or (q_dim) / (kv_dim) whole */
    L_SINKS,                                /* (n_heads): one more logit per head in the softmax */
    /* multi-head latent attention (DeepSeek): L_WQ is (heads * head_dim, dim) when q_lora_rank is 0 */
    L_WQ_A, L_BQ_A, L_Q_A_NORM, L_WQ_B,     /* (q_lora, dim), (q_lora), (q_lora), (heads * head_dim, q_lora) */
    L_WKV_A, L_BKV_A, L_KV_A_NORM,          /* (kv_lora + rope_dim, dim), (kv_lora + rope_dim), (kv_lora) */
    L_WKV_B,                                /* (heads * (nope_dim + v_head_dim), kv_lora) */
    /* short-convolution layers (LFM2) instead of attention */
    L_CONV_IN, L_CONV_IN_BIAS,              /* (3 * dim, dim), (3 * dim): B, C and x */
    L_CONV_KERNEL, L_CONV_KERNEL_BIAS,      /* (dim, conv_kernel), (dim): depthwise, causal */
    L_CONV_OUT, L_CONV_OUT_BIAS,            /* (dim, dim), (dim) */
    L_FFN_NORM, L_FFN_NORM_BIAS,            /* (dim), (dim) with LayerNorm */
    L_ROUTER, L_ROUTER_BIAS,                /* (n_experts, dim), (n_experts) added to the logits */
    L_SELECTION_BIAS,                       /* (n_experts): added to the scores for choosing only */
    L_W1, L_W3, L_W2,                       /* experts: (E, ffn, dim) gate, (E, ffn, dim) up, (E, dim, ffn) down */
    L_B1, L_B3, L_B2,                       /* their biases: (E, ffn), (E, ffn), (E, dim) */
    L_SHARED_W1, L_SHARED_W3, L_SHARED_W2,  /* shared expert: (shared_ffn, dim) x 2, (dim, shared_ffn) */
    L_SHARED_GATE,                          /* (1, dim): sigmoid gate of the shared expert */
    L_MLP_W1, L_MLP_W3, L_MLP_W2,           /* dense layers: (dense_ffn, dim) x 2, (dim, dense_ffn) */
    L_KINDS
};
/* The routed experts' tensors, L_W1 .. L_B2: each holds every expert's part, expert e's at
 * base + e * stride (colibri_expert_weight). */
enum { L_EXPERT_FIRST = L_W1, L_EXPERT_KINDS = L_B2 - L_W1 + 1 };

typedef struct colibri_layer_weights {
    colibri_weight w[L_KINDS];  /* data NULL: the layer has no such tensor; routed experts: expert 0's part */
    size_t expert_stride[L_EXPERT_KINDS];   /* bytes from expert e's part to e + 1's: stacked, the part's
                                               size; interleaved, the extent's (all kinds alike) */
    uint64_t expert_offset[L_EXPERT_KINDS]; /* where expert 0's part lies in weights.bin (an expert cache
                                               reads from here; w[].data may not be in memory) */
    size_t extent_offset;       /* interleaved: expert e's extent is [extent_offset + e * extent_bytes, */
    size_t extent_bytes;        /*   + extent_bytes) of weights.bin, all its tensors' parts; stacked: 0, 0 */
    int32_t extent_checksums;   /* the JSON token of its extents' CRC list (colibri_extent_checksum); 0: none */
    int32_t moe;                /* the MLP is the MoE block (else dense) */
    int32_t window;             /* attention sees this many positions, the query's included; 0: all */
    int32_t chunk;              /* or only the positions of the query's chunk of this size; 0: no chunks */
    int32_t rope;               /* the layer rotates q and k (else NoPE) */
    int32_t conv;               /* a short-convolution block instead of attention */
} colibri_layer_weights;
#define COLIBRI_LAYER_SLOT 864     /* bytes per entry on every target (util.h) */

typedef struct colibri_tensor {
    char name[COLIBRI_MAX_NAME];
    colibri_dtype dtype;
    int32_t n_dims;
    int64_t shape[4];
    uint64_t file_offset;
    uint64_t file_size;         /* interleaved experts: the sum of the E parts */
    uint64_t expert_stride;     /* interleaved experts: expert e's part at file_offset + e * expert_stride; else 0 */
    uint64_t span;              /* bytes from file_offset it claims for the overlap check: file_size; for
                                   interleaved experts, the layer's first part all E extents, the others 0 */
    uint32_t crc32;             /* of its bytes, the parts in expert order: the same in either layout */
    int32_t slot;               /* where the loader keeps it (loader.h) */
    int32_t extent_checksums;   /* its "extent_checksums" list's JSON token; -1: none */
} colibri_tensor;
#define COLIBRI_TENSOR_SLOT 136

struct colibri_model {
    colibri_hparams hp;
    char architecture[24];

    const uint8_t *weights;         /* weights.bin, mapped or linked in */
    size_t weights_len;
    const struct colibri_fast_forms *fast_forms;   /* matrices run in the row-interleaved form the kernels
                                       here multiply faster: repacked at open, streamed experts in their
                                       slots (set by a hosted platform's open); NULL: as the file stores them */
    const char *json;               /* colibri_model.json, which outlives the model, and its tokens in */
    const struct json_token *json_tokens;   /* the metadata: read again for the extents' checksums */

    int32_t n_tensors;
    int32_t experts_elsewhere;      /* COLIBRI_LOAD_EXPERTS_ELSEWHERE: `weights` lacks the routed experts */
    colibri_tensor *tensors;        /* (n_tensors), in file order of the JSON */
    colibri_layer_weights *layers;  /* (n_layers) */
    colibri_weight tok_embeddings;  /* (vocab, dim) */
    colibri_weight norm;            /* (dim) */
    colibri_weight lm_head;         /* (vocab, dim); tok_embeddings when tied */
    colibri_weight norm_bias;       /* (dim) LayerNorm only */
    colibri_weight lm_head_bias;    /* (vocab) when hparams.lm_head_bias */
    colibri_weight rope_factors;    /* (rope_dim / 2) LongRoPE: each frequency's divisor */
    const uint8_t *token_bytes;     /* (n_bytes) every token's bytes, concatenated; NULL: none */
    const int32_t *token_offsets;   /* (vocab + 1) token t is bytes [offsets[t], offsets[t+1]) */
    colibri_encoder enc;            /* text to ids (read by encoder.c, used by text/); kind NONE: ids only */

    size_t meta_bytes;              /* this struct and its tables */
    /* Set by the platform that opened the model, called by colibri_model_close. */
    void (*release)(colibri_model *model);
    void *platform;
};
#define COLIBRI_MODEL_SLOT 640

/* Expert e's part of a routed-expert tensor `kind` (L_W1 .. L_B2) in either layout: base + e * stride,
 * the one place expert weights are located (the experts' forward pass, an expert cache).  The loader
 * checked e's part lies inside weights.bin for every e < n_experts. */
static inline colibri_weight colibri_expert_weight(const colibri_layer_weights *lw, int kind, int32_t e)
{
    colibri_weight w;
    w.data = (const uint8_t *)lw->w[kind].data + (size_t)e * lw->expert_stride[kind - L_EXPERT_FIRST];
    w.dtype = lw->w[kind].dtype;
    return w;
}

/* Where expert `expert` of layer `layer` lies in weights.bin (offset, bytes): with the interleaved
 * layout its extent, all its tensors' parts in one read.  COLIBRI_E_ARG for a layer without routed
 * experts or an expert out of range, COLIBRI_E_TENSOR for the stacked layout (no extent: the parts
 * lie apart; colibri_expert_part gives each). */
colibri_status colibri_expert_extent(const colibri_model *model, int32_t layer, int32_t expert,
                                     uint64_t *offset, uint64_t *bytes);
/* Expert `expert`'s part of the layer's routed-expert tensor `kind` (L_W1 .. L_B2), either layout;
 * COLIBRI_E_ARG when the layer has no such tensor or the expert is out of range. */
colibri_status colibri_expert_part(const colibri_model *model, int32_t layer, int kind, int32_t expert,
                                   uint64_t *offset, uint64_t *bytes);

/* What tensor t runs as when the model runs fast forms: its row-interleaved form when the forward
 * pass multiplies it whole, its (per-expert) rows come in groups of 8 and the kernels here multiply
 * that form faster (colibri_interleaved_form); its plain form when it is stored interleaved and the
 * kernels here have none for that form (they would run it through the reference); else the dtype
 * the file stores. */
colibri_dtype colibri_run_dtype(const colibri_model *m, const colibri_tensor *t);
/* Bytes of scratch a rewrite of the tensors `what` (below) takes: 8 rows of the widest; 0: none. */
size_t colibri_repack_scratch(const colibri_model *m, int what);
/* The bytes of one matrix (rows, cols) of `from`, a plain block dtype, rewritten in place in its
 * row-interleaved form (an interleaved one: in its plain form), 8 rows at a time through `scratch`
 * (8 rows' bytes). */
void colibri_repack_in_place(uint8_t *bytes, colibri_dtype from, int64_t rows, int64_t cols, uint8_t *scratch);
/* The table of the fast forms that a hosted platform's open sets (moe/cache.c's
 * colibri_fast_forms_here), so that a firmware image, whose models run as stored, links none of
 * it: the slots' room for a rewrite, each layer's parts' dtypes as stored and as run, and a slot's
 * bytes checked and rewritten once read. */
struct colibri_arena;
struct colibri_cache_layer;
struct colibri_expert_cache;
typedef struct colibri_fast_forms {
    uint64_t (*room)(const colibri_model *m, int direct);
    uint8_t *(*carve)(struct colibri_arena *a, size_t slots);
    void (*plan)(const colibri_model *m, int32_t layer, struct colibri_cache_layer *cl);
    void (*prepare)(struct colibri_expert_cache *c, int32_t slot);
} colibri_fast_forms;
extern const colibri_fast_forms colibri_fast_forms_here;
/* The table's entry for tensor `kind` (L_KINDS) of `layer`; NULL: the layer has none. */
const colibri_tensor *colibri_layer_tensor(const colibri_model *m, int32_t layer, int kind);

/* Rewrites each tensor of `weights` (the model's weights, made writable at the same addresses by the
 * platform: a private mapping's pages, copied on write) whose run dtype differs, and points the
 * forward pass at that dtype: the dense ones (COLIBRI_REPACK_DENSE: all but the routed experts), the
 * routed experts (COLIBRI_REPACK_EXPERTS: not when sessions will stream them, which rewrites each in
 * its slot as it is read).  The tensor table keeps describing the file.  m->fast_forms set; scratch:
 * colibri_repack_scratch(m, what) bytes. */
enum { COLIBRI_REPACK_DENSE = 1, COLIBRI_REPACK_EXPERTS = 2 };
colibri_status colibri_model_repack(colibri_model *m, uint8_t *weights, int what, uint8_t *scratch,
                                    size_t scratch_bytes, colibri_error *err);

const char *colibri_dtype_name(colibri_dtype dtype);
const char *colibri_layer_tensor_name(int kind);   /* "experts.w1", ... (L_KINDS) */
/* The CRC-32 colibri_model.json lists for expert `expert`'s extent of `layer`; 0 when it lists none. */
int colibri_extent_checksum(const colibri_model *m, int32_t layer, int32_t expert, uint32_t *crc);

uint32_t colibri_crc32(uint32_t crc, const void *data, size_t len);

#endif
