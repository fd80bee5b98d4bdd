/* SPDX-License-Identifier: MIT */
/* What the loader's files share: load.c drives, schema.c reads the JSON fields and sections,
 * tensors.c knows the tensors a model has and checks them.  Internal to c_core/src/model. */
#ifndef COLIBRI_LOADER_H
#define COLIBRI_LOADER_H

#include "json.h"
#include "model.h"

/* The JSON being read: its text, its tokens (borrowed from the metadata block) and the error
 * every reader fills. */
typedef struct loader {
    const char *text;
    const json_token *tok;
    colibri_error *err;
} loader;

/* ---- schema.c: fields and sections ---- */

void colibri_copy_token_text(char *dst, size_t cap, const char *text, const json_token *t);
/* Every key of the object must be in `allowed` (NULL-terminated) and appear once. */
colibri_status colibri_check_keys(loader *L, int32_t obj, const char *where, const char *const *allowed);
/* tokens[*index] is the value of `key`, of that type (JSON_TRUE: either boolean). */
colibri_status colibri_get_field(loader *L, int32_t obj, const char *where, const char *key,
                                 json_type type, int32_t *index);
/* names into buf as `"a", "b" or "c"` (quoted) or `a, b or c`; cut short at cap bytes. */
const char *colibri_list_names(char *buf, size_t cap, const char *const *names, int32_t count, int quoted);

/* The sections, in the order colibri_model_load reads them: the header (format, version,
 * architecture), the hyper-parameters with routing and experts, then each layer's kinds
 * (once m->layers points at its table). */
colibri_status colibri_read_header(loader *L, int32_t root, colibri_model *m);
colibri_status colibri_read_hparams(loader *L, int32_t root, colibri_hparams *hp);
colibri_status colibri_read_layer_kinds(loader *L, int32_t root, colibri_model *m);
/* experts.quantization's object form against the routed experts' dtypes (once the tensors are read). */
colibri_status colibri_check_quantization(loader *L, int32_t root, const colibri_model *m);

/* ---- tensors.c: the tensors a model has, and their checks ---- */

/* The model-wide tensors; their slots come before the layers'. */
enum { G_TOK_EMBEDDINGS, G_NORM, G_LM_HEAD, G_TOKEN_BYTES, G_TOKEN_OFFSETS, G_NORM_BIAS, G_LM_HEAD_BIAS,
       G_ROPE_FACTORS, G_MERGES, G_MERGE_ORDER, G_BYTE_IDS, G_ADDED, G_ADDED_BYTES, G_VOCAB_ORDER, T_GLOBAL };
/* The tokenizer's integer tables (G_TOKEN_BYTES .. and G_MERGES ..): their one dtype, else -1. */
int colibri_slot_integer_dtype(int64_t slot);
extern const char *const colibri_global_tensor_names[];   /* (T_GLOBAL) */
extern const char *const colibri_layer_tensor_names[];    /* (L_KINDS) */

/* Slots: global slots first, then T_GLOBAL + layer * L_KINDS + kind. */
int colibri_slot_used(int64_t slot, const colibri_model *m);
int colibri_slot_optional(int64_t slot);
int colibri_slot_is_routed_expert(int64_t slot);   /* L_W1 .. L_B2 of a layer */
int colibri_slot_multiplied_whole(int64_t slot);   /* only colibri_matmul reads it: interleaved rows may be */

/* One entry of "tensors": fills t and returns its slot. */
colibri_status colibri_read_tensor(loader *L, int32_t obj, uint32_t index, const colibri_model *m,
                                   colibri_tensor *t, int64_t *slot);
/* The routed experts' strides and, interleaved, each layer's extents (tensors.c says the rules);
 * index: (n_tensors) int32 scratch. */
colibri_status colibri_check_experts(colibri_model *m, int32_t *index, colibri_error *err);
/* order: (n_tensors) int32 scratch for the sort. */
colibri_status colibri_check_overlaps(const colibri_model *m, int32_t *order, colibri_error *err);
colibri_status colibri_verify_tensor(const colibri_model *m, const colibri_tensor *t, colibri_error *err);
colibri_status colibri_check_vocabulary(colibri_model *m, colibri_error *err);

/* ---- encoder.c: the tokenizer's encoder ---- */

/* colibri_model.json's "encoder" into m->enc, whose table pointers the tensor table set, checked
 * (colibri_encoder_check) against the vocabulary.  A model with no "encoder" gets kind NONE and must
 * carry none of its tensors. */
colibri_status colibri_read_encoder(loader *L, int32_t root, colibri_model *m);

#endif
