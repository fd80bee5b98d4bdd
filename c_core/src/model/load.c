/* SPDX-License-Identifier: MIT */
/* Loading and validation of colibri_model.json against weights.bin: the metadata block's layout
 * and the driver that reads the sections (schema.c) and the tensor table (tensors.c) into it.
 *
 * Everything the forward pass trusts is checked at load, once: field types and ranges,
 * every tensor's presence, dtype, shape, size, alignment, bounds and overlap (and, in
 * verify mode, checksum and finiteness).  The hot path only checks token ids. */
#include <string.h>

#include "loader.h"
#include "../text/tokenize.h"
#include "../ops/ops.h"
#include "../util.h"

#define MIN_LAYER_TENSORS 9   /* norm, attention (four), norm, a dense MLP (three) */

/* ---- the metadata block: model struct, tensor table, layer table, JSON tokens ---- */

COLIBRI_SLOT_CHECK(colibri_model, COLIBRI_MODEL_SLOT);
COLIBRI_SLOT_CHECK(colibri_tensor, COLIBRI_TENSOR_SLOT);
COLIBRI_SLOT_CHECK(colibri_layer_weights, COLIBRI_LAYER_SLOT);

typedef struct meta_layout {
    size_t tensors, layers, order, tokens, total;   /* byte offsets */
    uint32_t max_tensors, max_layers;               /* table capacities */
    uint32_t n_tokens;
} meta_layout;

static meta_layout layout_for(uint32_t n_tokens)
{
    /* Each tensor entry needs at least 14 tokens and each layer at least MIN_LAYER_TENSORS
     * tensors, so n_tokens / 14 bounds both tables without reading the JSON first. */
    uint32_t max_tensors = n_tokens / 14 + 1;
    meta_layout l;
    l.n_tokens = n_tokens;
    l.max_tensors = max_tensors;
    l.max_layers = max_tensors / MIN_LAYER_TENSORS + 1;
    l.tensors = colibri_align_up(COLIBRI_MODEL_SLOT, 16);
    l.layers = l.tensors + colibri_align_up(max_tensors * COLIBRI_TENSOR_SLOT, 16);
    l.order = l.layers + colibri_align_up(l.max_layers * COLIBRI_LAYER_SLOT, 16);
    /* order: the overlap sort (an int32 per tensor), and before it one byte per tensor slot */
    {
        size_t sort = (size_t)max_tensors * sizeof(int32_t), seen = T_GLOBAL + (size_t)l.max_layers * L_KINDS;
        l.tokens = l.order + colibri_align_up(sort > seen ? sort : seen, 16);
    }
    l.total = l.tokens + (size_t)n_tokens * sizeof(json_token);
    return l;
}

colibri_status colibri_model_meta_bytes(const char *json, size_t json_len, size_t *meta_bytes,
                                        colibri_error *err)
{
    uint32_t n_tokens;
    colibri_status st;
    if (!json || !meta_bytes) return colibri_fail(err, COLIBRI_E_ARG, "colibri_model_meta_bytes: NULL argument");
    st = colibri_json_parse(json, json_len, NULL, 0, &n_tokens, err);
    if (st) return st;
    *meta_bytes = layout_for(n_tokens).total;
    return COLIBRI_OK;
}

/* json's tokens into meta, laid out for them and zeroed: the first step of every reading. */
static colibri_status parse_into_meta(const char *json, size_t json_len, void *meta, size_t meta_bytes,
                                      meta_layout *lay, json_token **tokens, colibri_error *err)
{
    uint32_t n_tokens;
    colibri_status st = colibri_json_parse(json, json_len, NULL, 0, &n_tokens, err);
    if (st) return st;
    *lay = layout_for(n_tokens);
    if (meta_bytes < lay->total)
        return colibri_fail(err, COLIBRI_E_NOMEM, "model metadata needs %zu bytes, %zu given", lay->total, meta_bytes);
    memset(meta, 0, lay->total);
    *tokens = (json_token *)((uint8_t *)meta + lay->tokens);
    return colibri_json_parse(json, json_len, *tokens, n_tokens, &n_tokens, err);
}

colibri_status colibri_hparams_read(const char *json, size_t json_len, void *meta, size_t meta_bytes,
                                    colibri_hparams *hp, colibri_error *err)
{
    meta_layout lay;
    json_token *tokens = NULL;
    loader L;
    colibri_status st;
    if (!json || !meta || !hp) return colibri_fail(err, COLIBRI_E_ARG, "colibri_hparams_read: NULL argument");
    if ((uintptr_t)meta % 16 != 0)
        return colibri_fail(err, COLIBRI_E_ARG, "colibri_hparams_read: meta buffer must be 16-byte aligned");
    st = parse_into_meta(json, json_len, meta, meta_bytes, &lay, &tokens, err);
    if (st) return st;
    L.text = json; L.tok = tokens; L.err = err;
    memset(hp, 0, sizeof *hp);
    return colibri_read_hparams(&L, 0, hp);
}

/* Where the forward pass finds the tensor in slot `slot`: w for the matrices and vectors, the
 * vocabulary's and the encoder's tables as their element types. */
static void place_tensor(colibri_model *m, const colibri_tensor *t, int64_t slot, colibri_weight w)
{
    const void *p = m->weights + t->file_offset;
    if (colibri_slot_is_routed_expert(slot))
        m->layers[(slot - T_GLOBAL) / L_KINDS].expert_offset[(slot - T_GLOBAL) % L_KINDS - L_EXPERT_FIRST] = t->file_offset;
    if (slot == G_TOK_EMBEDDINGS) m->tok_embeddings = w;
    else if (slot == G_NORM) m->norm = w;
    else if (slot == G_LM_HEAD) m->lm_head = w;
    else if (slot == G_NORM_BIAS) m->norm_bias = w;
    else if (slot == G_LM_HEAD_BIAS) m->lm_head_bias = w;
    else if (slot == G_ROPE_FACTORS) m->rope_factors = w;
    else if (slot == G_TOKEN_BYTES) m->token_bytes = (const uint8_t *)p;
    else if (slot == G_TOKEN_OFFSETS) m->token_offsets = (const int32_t *)p;
    else if (slot >= G_MERGES && slot <= G_VOCAB_ORDER) {   /* the encoder's tables: text/tokenize.c checks them */
        if (slot == G_MERGES) m->enc.merges = (const int32_t *)p, m->enc.n_merges = (int32_t)t->shape[0];
        else if (slot == G_MERGE_ORDER) m->enc.merge_order = (const int32_t *)p;
        else if (slot == G_BYTE_IDS) m->enc.byte_ids = (const int32_t *)p;
        else if (slot == G_ADDED) m->enc.added = (const int32_t *)p, m->enc.n_added = (int32_t)t->shape[0];
        else if (slot == G_ADDED_BYTES) m->enc.added_bytes = (const uint8_t *)p;
        else m->enc.vocab_order = (const int32_t *)p, m->enc.n_vocab_order = (int32_t)t->shape[0];
    }
    else m->layers[(slot - T_GLOBAL) / L_KINDS].w[(slot - T_GLOBAL) % L_KINDS] = w;
}

/* Each entry of model.tensors (token tensors_tok) into m->tensors and its slot; seen: one byte per slot. */
static colibri_status read_tensor_table(loader *L, int32_t tensors_tok, colibri_model *m, unsigned flags,
                                        uint8_t *seen)
{
    int32_t k, entry;
    colibri_status st;
    for (k = 0, entry = tensors_tok + 1; k < m->n_tensors; k++, entry += (int32_t)L->tok[entry].subtree) {
        colibri_tensor *t = &m->tensors[k];
        int64_t slot = 0;
        colibri_weight w;
        int elsewhere;
        st = colibri_read_tensor(L, entry, (uint32_t)k, m, t, &slot);
        if (st) return st;
        if (seen[slot])
            return colibri_fail(L->err, COLIBRI_E_TENSOR, "tensor `%s` is listed twice", t->name);
        seen[slot] = 1;
        if (t->file_offset % COLIBRI_TENSOR_ALIGNMENT != 0)
            return colibri_fail(L->err, COLIBRI_E_ALIGN, "tensor `%s`: file_offset %llu is not a multiple of %d",
                                t->name, (unsigned long long)t->file_offset, COLIBRI_TENSOR_ALIGNMENT);
        t->slot = (int32_t)slot;
        elsewhere = (flags & COLIBRI_LOAD_EXPERTS_ELSEWHERE) && colibri_slot_is_routed_expert(slot);
        if (elsewhere) {   /* read through the session's reader, which checks each read's length */
            if (t->file_offset + t->span < t->file_offset)
                return colibri_fail(L->err, COLIBRI_E_BOUNDS, "tensor `%s`: bytes past 2^64", t->name);
        } else if (t->file_offset > m->weights_len || t->span > m->weights_len - t->file_offset)   /* span: all its parts */
            return colibri_fail(L->err, COLIBRI_E_BOUNDS, "tensor `%s`: bytes [%llu, %llu) lie past the end of weights.bin (%zu bytes)",
                                t->name, (unsigned long long)t->file_offset,
                                (unsigned long long)(t->file_offset + t->span), m->weights_len);
        w.data = elsewhere ? m->weights : m->weights + t->file_offset;   /* elsewhere: a placeholder, never read */
        w.dtype = t->dtype;
        place_tensor(m, t, slot, w);
    }
    return COLIBRI_OK;
}

/* Every tensor the hyper-parameters call for was listed (seen: one byte per slot), the vocabulary's
 * two or neither. */
static colibri_status check_tensors_present(const colibri_model *m, const uint8_t *seen, colibri_error *err)
{
    int64_t s, n_slots = T_GLOBAL + (int64_t)m->hp.n_layers * L_KINDS;
    for (s = 0; s < n_slots; s++) {
        if (seen[s] || colibri_slot_optional(s) || !colibri_slot_used(s, m)) continue;
        if (s < T_GLOBAL)
            return colibri_fail(err, COLIBRI_E_TENSOR, "tensor `%s` is missing", colibri_global_tensor_names[s]);
        return colibri_fail(err, COLIBRI_E_TENSOR, "tensor `layers.%lld.%s` is missing",
                            (long long)((s - T_GLOBAL) / L_KINDS), colibri_layer_tensor_names[(s - T_GLOBAL) % L_KINDS]);
    }
    if (seen[G_TOKEN_BYTES] != seen[G_TOKEN_OFFSETS])
        return colibri_fail(err, COLIBRI_E_TENSOR, "tensor `%s` is missing: the vocabulary needs both tokenizer tensors",
                            colibri_global_tensor_names[seen[G_TOKEN_BYTES] ? G_TOKEN_OFFSETS : G_TOKEN_BYTES]);
    return COLIBRI_OK;
}

colibri_status colibri_model_load(const char *json, size_t json_len, const void *weights, size_t weights_len,
                                  unsigned flags, void *meta, size_t meta_bytes, colibri_model **out,
                                  colibri_error *err)
{
    uint32_t k, n_tensors;
    meta_layout lay;
    colibri_model *m;
    json_token *tokens = NULL;
    loader L;
    int32_t tensors_tok = 0;
    colibri_hparams *hp;
    colibri_status st;
    int32_t *order;
    uint8_t *seen;

    if (!json || !meta || !out || (!weights && weights_len))
        return colibri_fail(err, COLIBRI_E_ARG, "colibri_model_load: NULL argument");
    *out = NULL;
    if ((uintptr_t)meta % 16 != 0)
        return colibri_fail(err, COLIBRI_E_ARG, "colibri_model_load: meta buffer must be 16-byte aligned");
    if ((uintptr_t)weights % COLIBRI_TENSOR_ALIGNMENT != 0)   /* tensor offsets are aligned relative to it */
        return colibri_fail(err, COLIBRI_E_ALIGN, "colibri_model_load: weights must start at a %d-byte boundary",
                            COLIBRI_TENSOR_ALIGNMENT);
    st = parse_into_meta(json, json_len, meta, meta_bytes, &lay, &tokens, err);
    if (st) return st;
    m = (colibri_model *)meta;
    order = (int32_t *)(void *)((uint8_t *)meta + lay.order);

    L.text = json; L.tok = tokens; L.err = err;
    hp = &m->hp;
    st = colibri_read_header(&L, 0, m);
    if (st) return st;
    st = colibri_read_hparams(&L, 0, hp);
    if (st) return st;

    st = colibri_get_field(&L, 0, "model", "tensors", JSON_ARRAY, &tensors_tok);
    if (st) return st;
    n_tensors = tokens[tensors_tok].n_children;
    /* A valid entry takes at least 14 tokens and a layer at least MIN_LAYER_TENSORS entries, so these
     * hold only for a broken tensor table or one too short for num_layers. */
    if (n_tensors > lay.max_tensors)
        return colibri_fail(err, COLIBRI_E_TENSOR, "model.tensors lists %u entries, more than its %u JSON tokens "
                            "hold as tensor entries (14 or more each)", n_tensors, lay.n_tokens);
    if ((uint32_t)hp->n_layers > lay.max_layers)
        return colibri_fail(err, COLIBRI_E_TENSOR, "model.tensors lists %u entries, too few for a %d-layer model",
                            n_tensors, hp->n_layers);
    m->tensors = (colibri_tensor *)((uint8_t *)meta + lay.tensors);
    m->layers = (colibri_layer_weights *)((uint8_t *)meta + lay.layers);
    m->n_tensors = (int32_t)n_tensors;
    m->weights = (const uint8_t *)weights;
    m->weights_len = weights_len;
    m->experts_elsewhere = (flags & COLIBRI_LOAD_EXPERTS_ELSEWHERE) != 0;
    m->json = json;
    m->json_tokens = tokens;
    m->meta_bytes = lay.total;

    st = colibri_read_layer_kinds(&L, 0, m);
    if (st) return st;
    seen = (uint8_t *)order;   /* one byte per slot, zeroed; the overlap sort reuses the room later */
    st = read_tensor_table(&L, tensors_tok, m, flags, seen);
    if (st) return st;
    st = check_tensors_present(m, seen, err);
    if (st) return st;
    if (hp->tie_word_embeddings) m->lm_head = m->tok_embeddings;
    if (m->token_offsets) {
        st = colibri_check_vocabulary(m, err);
        if (st) return st;
    }
    st = colibri_read_encoder(&L, 0, m);
    if (st) return st;

    st = colibri_check_quantization(&L, 0, m);
    if (st) return st;
    st = colibri_check_experts(m, order, err);
    if (st) return st;
    st = colibri_check_overlaps(m, order, err);
    if (st) return st;
    if (flags & COLIBRI_LOAD_VERIFY) {
        for (k = 0; k < n_tensors; k++) {
            if (m->experts_elsewhere && colibri_slot_is_routed_expert(m->tensors[k].slot)) continue;   /* not here */
            st = colibri_verify_tensor(m, &m->tensors[k], err);
            if (st) return st;
        }
    }
    *out = m;
    return COLIBRI_OK;
}

/* ---- the fast forms, repacked at open ---- */

const colibri_tensor *colibri_layer_tensor(const colibri_model *m, int32_t layer, int kind)
{
    int32_t i;
    for (i = 0; i < m->n_tensors; i++)
        if (m->tensors[i].slot == T_GLOBAL + (int64_t)layer * L_KINDS + kind) return &m->tensors[i];
    return NULL;
}

colibri_dtype colibri_run_dtype(const colibri_model *m, const colibri_tensor *t)
{
    colibri_dtype plain, fast;
    if (!m->fast_forms || t->n_dims < 2 || !colibri_slot_multiplied_whole(t->slot)) return t->dtype;
    plain = colibri_dtype_plain(t->dtype);
    fast = colibri_interleaved_form(plain, 1);   /* the plain form itself where the kernels here have no other */
    return fast == plain || t->shape[t->n_dims - 2] % 8 == 0 ? fast : t->dtype;
}

void colibri_repack_in_place(uint8_t *bytes, colibri_dtype from, int64_t rows, int64_t cols, uint8_t *scratch)
{
    size_t group = 8 * colibri_row_bytes(from, (size_t)cols);
    int64_t r;
    for (r = 0; r < rows; r += 8, bytes += group) {   /* an 8-row group is a permutation of its own bytes */
        memcpy(scratch, bytes, group);
        colibri_interleave_rows(bytes, scratch, from, 8, cols, NULL);
    }
}

static int repacked_by(const colibri_model *m, const colibri_tensor *t, int what)
{
    return colibri_run_dtype(m, t) != t->dtype &&
           (what & (colibri_slot_is_routed_expert(t->slot) ? COLIBRI_REPACK_EXPERTS : COLIBRI_REPACK_DENSE));
}

size_t colibri_repack_scratch(const colibri_model *m, int what)
{
    size_t most = 0;
    int32_t i;
    for (i = 0; i < m->n_tensors; i++) {
        const colibri_tensor *t = &m->tensors[i];
        size_t group = repacked_by(m, t, what) ? 8 * colibri_row_bytes(t->dtype, (size_t)t->shape[t->n_dims - 1]) : 0;
        if (group > most) most = group;
    }
    return most;
}

/* What the forward pass reads tensor t as: the layer's or the model's weight (NULL: none it multiplies). */
static colibri_weight *weight_of(colibri_model *m, const colibri_tensor *t)
{
    if (t->slot == G_LM_HEAD) return &m->lm_head;
    if (t->slot < T_GLOBAL) return NULL;
    return &m->layers[(t->slot - T_GLOBAL) / L_KINDS].w[(t->slot - T_GLOBAL) % L_KINDS];
}

colibri_status colibri_model_repack(colibri_model *m, uint8_t *weights, int what, uint8_t *scratch,
                                    size_t scratch_bytes, colibri_error *err)
{
    int32_t i;
    if (!m || !m->fast_forms || weights != m->weights || (!scratch && scratch_bytes))
        return colibri_fail(err, COLIBRI_E_ARG, "colibri_model_repack: the model's own weights, made writable");
    if (m->experts_elsewhere) what &= ~COLIBRI_REPACK_EXPERTS;   /* not in `weights` */
    if (scratch_bytes < colibri_repack_scratch(m, what))
        return colibri_fail(err, COLIBRI_E_NOMEM, "colibri_model_repack: %zu bytes of scratch, %zu needed",
                            scratch_bytes, colibri_repack_scratch(m, what));
    for (i = 0; i < m->n_tensors; i++) {
        const colibri_tensor *t = &m->tensors[i];
        colibri_weight *w = weight_of(m, t);
        int64_t rows, cols, parts, e;
        size_t stride;
        if (!w || !repacked_by(m, t, what)) continue;   /* a matrix, (rows, cols) or (experts, rows, cols) */
        rows = t->shape[t->n_dims - 2], cols = t->shape[t->n_dims - 1], parts = t->n_dims == 3 ? t->shape[0] : 1;
        stride = (size_t)rows * colibri_row_bytes(t->dtype, (size_t)cols);
        if (colibri_slot_is_routed_expert(t->slot))   /* each expert's part, wherever the layout puts it */
            stride = m->layers[(t->slot - T_GLOBAL) / L_KINDS].expert_stride[(t->slot - T_GLOBAL) % L_KINDS - L_EXPERT_FIRST];
        for (e = 0; e < parts; e++)
            colibri_repack_in_place(weights + ((const uint8_t *)w->data - m->weights) + (size_t)e * stride, t->dtype,
                                    rows, cols, scratch);
        w->dtype = colibri_run_dtype(m, t);
    }
    return COLIBRI_OK;
}

/* ---- accessors ---- */

const colibri_hparams *colibri_model_hparams(const colibri_model *model) { return &model->hp; }
const char *colibri_model_architecture(const colibri_model *model) { return model->architecture; }
int32_t colibri_model_tensor_count(const colibri_model *model) { return model->n_tensors; }

uint64_t colibri_model_weight_bytes(const colibri_model *model)
{
    uint64_t total = 0;
    int32_t i = 0;
    for (i = 0; i < model->n_tensors; i++) total += model->tensors[i].file_size;
    return total;
}

colibri_status colibri_model_tensor(const colibri_model *model, int32_t index, colibri_tensor_info *info)
{
    const colibri_tensor *t;
    int d;
    if (!model || !info || index < 0 || index >= model->n_tensors) return COLIBRI_E_ARG;
    t = &model->tensors[index];
    info->name = t->name;
    info->dtype = t->dtype;
    info->n_dims = t->n_dims;
    for (d = 0; d < 4; d++) info->shape[d] = d < t->n_dims ? t->shape[d] : 1;
    info->file_offset = t->file_offset;
    info->file_size = t->file_size;
    info->crc32 = t->crc32;
    info->data = model->weights + t->file_offset;
    info->expert_stride = t->expert_stride;
    info->run_dtype = t->slot == G_LM_HEAD ? model->lm_head.dtype
                    : t->slot >= T_GLOBAL ? model->layers[(t->slot - T_GLOBAL) / L_KINDS].w[(t->slot - T_GLOBAL) % L_KINDS].dtype
                    : t->dtype;
    return COLIBRI_OK;
}

/* Bytes of one expert's part of the routed-expert tensor `kind`: (ffn, dim), (dim, ffn), (ffn) or (dim). */
static uint64_t expert_part_bytes(const colibri_hparams *hp, int kind, colibri_dtype dtype)
{
    size_t d = (size_t)hp->hidden_size, f = (size_t)hp->intermediate_size;
    switch (kind) {
    case L_W1: case L_W3: return (uint64_t)f * colibri_row_bytes(dtype, d);
    case L_W2: return (uint64_t)d * colibri_row_bytes(dtype, f);
    case L_B2: return colibri_row_bytes(dtype, d);
    default: return colibri_row_bytes(dtype, f);   /* L_B1, L_B3 */
    }
}

colibri_status colibri_expert_part(const colibri_model *model, int32_t layer, int kind, int32_t expert,
                                   uint64_t *offset, uint64_t *bytes)
{
    const colibri_layer_weights *lw;
    if (!model || !offset || !bytes || layer < 0 || layer >= model->hp.n_layers || expert < 0 ||
        expert >= model->hp.n_experts || kind < L_EXPERT_FIRST || kind >= L_EXPERT_FIRST + L_EXPERT_KINDS)
        return COLIBRI_E_ARG;
    lw = &model->layers[layer];
    if (!lw->w[kind].data) return COLIBRI_E_ARG;
    *offset = lw->expert_offset[kind - L_EXPERT_FIRST] + (uint64_t)expert * lw->expert_stride[kind - L_EXPERT_FIRST];
    *bytes = expert_part_bytes(&model->hp, kind, lw->w[kind].dtype);
    return COLIBRI_OK;
}

colibri_status colibri_expert_extent(const colibri_model *model, int32_t layer, int32_t expert,
                                     uint64_t *offset, uint64_t *bytes)
{
    const colibri_layer_weights *lw;
    if (!model || !offset || !bytes || layer < 0 || layer >= model->hp.n_layers || expert < 0 ||
        expert >= model->hp.n_experts || !model->layers[layer].moe)
        return COLIBRI_E_ARG;
    lw = &model->layers[layer];
    if (!lw->extent_bytes) return COLIBRI_E_TENSOR;   /* stacked */
    *offset = (uint64_t)lw->extent_offset + (uint64_t)expert * lw->extent_bytes;
    *bytes = lw->extent_bytes;
    return COLIBRI_OK;
}

/* every routed-expert tensor of a layer may be a part of its own */
typedef char colibri_expert_parts_check[COLIBRI_EXPERT_PARTS >= L_EXPERT_KINDS ? 1 : -1];

colibri_status colibri_expert_location(const colibri_model *model, int32_t layer, int32_t expert,
                                       uint64_t offset[COLIBRI_EXPERT_PARTS], uint64_t bytes[COLIBRI_EXPERT_PARTS],
                                       uint64_t stride[COLIBRI_EXPERT_PARTS], int32_t *n_parts)
{
    const colibri_layer_weights *lw;
    int32_t k, n = 0, i;
    if (!model || !offset || !bytes || !stride || !n_parts || layer < 0 || layer >= model->hp.n_layers ||
        expert < 0 || expert >= model->hp.n_experts)
        return COLIBRI_E_ARG;
    lw = &model->layers[layer];
    *n_parts = 0;
    if (!lw->moe) return COLIBRI_OK;
    if (colibri_expert_extent(model, layer, expert, &offset[0], &bytes[0]) == COLIBRI_OK) {   /* interleaved */
        stride[0] = lw->extent_bytes;
        *n_parts = 1;
        return COLIBRI_OK;
    }
    for (k = 0; k < L_EXPERT_KINDS; k++) {   /* stacked: each tensor's part, inserted in file order */
        uint64_t at, size;
        if (colibri_expert_part(model, layer, L_EXPERT_FIRST + k, expert, &at, &size) != COLIBRI_OK) continue;
        for (i = n; i > 0 && offset[i - 1] > at; i--) {
            offset[i] = offset[i - 1];
            bytes[i] = bytes[i - 1];
            stride[i] = stride[i - 1];
        }
        offset[i] = at;
        bytes[i] = size;
        stride[i] = lw->expert_stride[k];
        n++;
    }
    *n_parts = n;
    return COLIBRI_OK;
}

colibri_status colibri_token_bytes(const colibri_model *model, int32_t token, const uint8_t **bytes, size_t *len)
{
    if (!model || !bytes || !len) return COLIBRI_E_ARG;
    if (!model->token_offsets) return COLIBRI_E_TENSOR;
    if (token < 0 || token >= model->hp.vocab_size) return COLIBRI_E_TOKEN;
    *bytes = model->token_bytes + model->token_offsets[token];
    *len = (size_t)(model->token_offsets[token + 1] - model->token_offsets[token]);
    return COLIBRI_OK;
}

void colibri_model_close(colibri_model *model)
{
    if (model && model->release) model->release(model);
}
