/* The loaded model: validated hyper-parameters and typed pointers into the mapped weights. */
#ifndef COLIBRI_MODEL_H
#define COLIBRI_MODEL_H

#include "colibri/colibri.h"

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

typedef struct colibri_layer_weights {
    colibri_weight w[L_KINDS];  /* data NULL: the layer has no such tensor */
    int32_t moe;                /* the MLP is the MoE block (else dense) */
    int32_t window;             /* attention sees this many positions, the query's included; 0: all */
    int32_t chunk;              /* or only the positions of the query's chunk of this size; 0: no chunks */
    int32_t rope;               /* the layer rotates q and k (else NoPE) */
    int32_t conv;               /* a short-convolution block instead of attention */
} colibri_layer_weights;
#define COLIBRI_LAYER_SLOT 752     /* bytes per entry on every target (util.h) */

typedef struct colibri_tensor {
    char name[COLIBRI_MAX_NAME];
    colibri_dtype dtype;
    int32_t n_dims;
    int64_t shape[4];
    uint64_t file_offset;
    uint64_t file_size;
    uint32_t crc32;
} colibri_tensor;
#define COLIBRI_TENSOR_SLOT 112

struct colibri_model {
    colibri_hparams hp;
    char architecture[24];

    const uint8_t *weights;         /* weights.bin, mapped or linked in */
    size_t weights_len;

    int32_t n_tensors;
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

    size_t meta_bytes;              /* this struct and its tables */
    /* Set by the platform that opened the model, called by colibri_model_close. */
    void (*release)(colibri_model *model);
    void *platform;
};
#define COLIBRI_MODEL_SLOT 512

const char *colibri_dtype_name(colibri_dtype dtype);

uint32_t colibri_crc32(uint32_t crc, const void *data, size_t len);

#endif
