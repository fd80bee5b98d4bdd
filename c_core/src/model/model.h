/* The loaded model: validated hyper-parameters and typed pointers into the mapped weights. */
#ifndef COLIBRI_MODEL_H
#define COLIBRI_MODEL_H

#include "colibri/colibri.h"

/* A weight used in place: `data` points into weights.bin. */
typedef struct colibri_weight {
    const void *data;
    colibri_dtype dtype;
} colibri_weight;

/* One decoder layer of the mixtral architecture. */
typedef struct colibri_layer_weights {
    colibri_weight attn_norm;   /* (dim) */
    colibri_weight wq;          /* (n_heads * head_dim, dim) */
    colibri_weight wk;          /* (n_kv_heads * head_dim, dim) */
    colibri_weight wv;          /* (n_kv_heads * head_dim, dim) */
    colibri_weight wo;          /* (dim, n_heads * head_dim) */
    colibri_weight ffn_norm;    /* (dim) */
    colibri_weight router;      /* (n_experts, dim) */
    colibri_weight w1;          /* (n_experts, ffn, dim)  gate */
    colibri_weight w3;          /* (n_experts, ffn, dim)  up */
    colibri_weight w2;          /* (n_experts, dim, ffn)  down */
} colibri_layer_weights;
#define COLIBRI_LAYER_SLOT 160     /* bytes per entry on every target (util.h) */

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
    char architecture[16];

    const uint8_t *weights;         /* weights.bin, mapped or linked in */
    size_t weights_len;

    int32_t n_tensors;
    colibri_tensor *tensors;        /* (n_tensors), in file order of the JSON */
    colibri_layer_weights *layers;  /* (n_layers) */
    colibri_weight tok_embeddings;  /* (vocab, dim) */
    colibri_weight norm;            /* (dim) */
    colibri_weight lm_head;         /* (vocab, dim); tok_embeddings when tied */
    const uint8_t *token_bytes;     /* (n_bytes) every token's bytes, concatenated; NULL: none */
    const int32_t *token_offsets;   /* (vocab + 1) token t is bytes [offsets[t], offsets[t+1]) */

    size_t meta_bytes;              /* this struct and its tables */
    /* Set by the platform that opened the model, called by colibri_model_close. */
    void (*release)(colibri_model *model);
    void *platform;
};
#define COLIBRI_MODEL_SLOT 224

size_t colibri_dtype_size(colibri_dtype dtype);
const char *colibri_dtype_name(colibri_dtype dtype);

uint32_t colibri_crc32(uint32_t crc, const void *data, size_t len);

#endif
