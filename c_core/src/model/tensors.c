/* SPDX-License-Identifier: MIT */
/* The tensors a model has, and their checks: which slots its options use, each slot's name and
 * shape, one "tensors" entry read against them, and the checks over the whole table (overlaps,
 * the vocabulary, and in verify mode checksums and finiteness). */
#include <string.h>

#include "loader.h"
#include "../ops/ops.h"
#include "../util.h"

/* ---- dtypes ---- */

const char *colibri_dtype_name(colibri_dtype dtype)
{
    return (unsigned)dtype < COLIBRI_DTYPE_COUNT ? colibri_dtypes[dtype].name : "?";
}

/* The dtype names (all, or those that hold weights), as colibri_list_names writes them. */
static const char *list_dtypes(char *buf, size_t cap, int weights_only)
{
    const char *names[COLIBRI_DTYPE_COUNT];
    int32_t n = 0, d;
    for (d = 0; d < COLIBRI_DTYPE_COUNT; d++)
        if (!weights_only || colibri_dtypes[d].holds_weights) names[n++] = colibri_dtypes[d].name;
    return colibri_list_names(buf, cap, names, n, 0);
}

/* ---- the tensors a model has ---- */

/* Per-layer tensors: "layers.{i}." + the name of model.h's L_* kind. */
const char *const colibri_layer_tensor_names[] = {
    [L_ATTN_NORM] = "attn_norm", [L_ATTN_NORM_BIAS] = "attn_norm_bias",
    [L_WQ] = "attn.wq", [L_WK] = "attn.wk", [L_WV] = "attn.wv", [L_WO] = "attn.wo",
    [L_BQ] = "attn.bq", [L_BK] = "attn.bk", [L_BV] = "attn.bv", [L_BO] = "attn.bo",
    [L_Q_NORM] = "attn.q_norm", [L_K_NORM] = "attn.k_norm", [L_SINKS] = "attn.sinks",
    [L_WQ_A] = "attn.wq_a", [L_BQ_A] = "attn.bq_a", [L_Q_A_NORM] = "attn.q_a_norm", [L_WQ_B] = "attn.wq_b",
    [L_WKV_A] = "attn.wkv_a", [L_BKV_A] = "attn.bkv_a", [L_KV_A_NORM] = "attn.kv_a_norm", [L_WKV_B] = "attn.wkv_b",
    [L_CONV_IN] = "conv.in_proj", [L_CONV_IN_BIAS] = "conv.in_bias",
    [L_CONV_KERNEL] = "conv.kernel", [L_CONV_KERNEL_BIAS] = "conv.kernel_bias",
    [L_CONV_OUT] = "conv.out_proj", [L_CONV_OUT_BIAS] = "conv.out_bias",
    [L_FFN_NORM] = "ffn_norm", [L_FFN_NORM_BIAS] = "ffn_norm_bias",
    [L_ROUTER] = "router", [L_ROUTER_BIAS] = "router.bias", [L_SELECTION_BIAS] = "router.selection_bias",
    [L_W1] = "experts.w1", [L_W3] = "experts.w3", [L_W2] = "experts.w2",
    [L_B1] = "experts.b1", [L_B3] = "experts.b3", [L_B2] = "experts.b2",
    [L_SHARED_W1] = "shared.w1", [L_SHARED_W3] = "shared.w3", [L_SHARED_W2] = "shared.w2", [L_SHARED_GATE] = "shared.gate",
    [L_MLP_W1] = "mlp.w1", [L_MLP_W3] = "mlp.w3", [L_MLP_W2] = "mlp.w2",
};
COLIBRI_TABLE_CHECK(colibri_layer_tensor_names, L_KINDS);

/* Whether layer `lw` has a tensor of `kind`, given the model's options. */
static int layer_has(const colibri_hparams *hp, const colibri_layer_weights *lw, int kind)
{
    int mla = hp->kv_lora_rank > 0;
    if (kind >= L_CONV_IN && kind <= L_CONV_OUT_BIAS)
        return lw->conv && (hp->conv_bias || (kind != L_CONV_IN_BIAS && kind != L_CONV_KERNEL_BIAS && kind != L_CONV_OUT_BIAS));
    if (lw->conv && kind >= L_WQ && kind <= L_WKV_B) return 0;   /* no attention in a convolution layer */
    switch (kind) {
    case L_WQ: return !mla || hp->q_lora_rank == 0;
    case L_WK: case L_WV: return !mla;
    case L_WQ_A: case L_Q_A_NORM: case L_WQ_B: return mla && hp->q_lora_rank > 0;
    case L_BQ_A: return mla && hp->q_lora_rank > 0 && hp->attention_bias;
    case L_WKV_A: case L_KV_A_NORM: case L_WKV_B: return mla;
    case L_BKV_A: return mla && hp->attention_bias;
    case L_BQ: case L_BK: case L_BV: return !mla && hp->attention_bias;
    case L_BO: return hp->attention_out_bias;
    case L_Q_NORM: case L_K_NORM: return hp->qk_norm != COLIBRI_QK_NORM_NONE && hp->qk_norm != COLIBRI_QK_NORM_HEAD_PLAIN;
    case L_SINKS: return hp->attention_sinks;
    case L_ATTN_NORM_BIAS: case L_FFN_NORM_BIAS: return hp->norm_kind == COLIBRI_NORM_LAYER;
    case L_B1: case L_B3: case L_B2: return lw->moe && hp->expert_bias;
    case L_ROUTER: case L_W1: case L_W3: case L_W2: return lw->moe;
    case L_ROUTER_BIAS: return lw->moe && hp->router_logit_bias;
    case L_SELECTION_BIAS: return lw->moe && hp->router_selection_bias;
    case L_SHARED_W1: case L_SHARED_W3: case L_SHARED_W2: return lw->moe && hp->shared_intermediate_size > 0;
    case L_SHARED_GATE: return lw->moe && hp->shared_intermediate_size > 0 && hp->shared_gate;
    case L_MLP_W1: case L_MLP_W3: case L_MLP_W2: return !lw->moe;
    default: return 1;   /* norms and the attention projections */
    }
}

/* The model-wide tensors' names, by slot (loader.h's G_*). */
const char *const colibri_global_tensor_names[] = {
    [G_TOK_EMBEDDINGS] = "tok_embeddings", [G_NORM] = "norm", [G_LM_HEAD] = "lm_head",
    [G_TOKEN_BYTES] = "tokenizer.token_bytes", [G_TOKEN_OFFSETS] = "tokenizer.token_offsets",
    [G_NORM_BIAS] = "norm_bias", [G_LM_HEAD_BIAS] = "lm_head_bias", [G_ROPE_FACTORS] = "rope.factors",
    [G_MERGES] = "tokenizer.merges", [G_MERGE_ORDER] = "tokenizer.merge_order", [G_BYTE_IDS] = "tokenizer.byte_ids",
    [G_ADDED] = "tokenizer.added", [G_ADDED_BYTES] = "tokenizer.added_bytes", [G_VOCAB_ORDER] = "tokenizer.vocab_order",
};
COLIBRI_TABLE_CHECK(colibri_global_tensor_names, T_GLOBAL);

/* Whether the model has a tensor in `slot` (layers: from layer_has; the vocabulary table is
 * optional, so it counts as "has" too: colibri_read_tensor accepts it, the missing check skips it). */
int colibri_slot_used(int64_t slot, const colibri_model *m)
{
    if (slot >= T_GLOBAL)
        return layer_has(&m->hp, &m->layers[(slot - T_GLOBAL) / L_KINDS], (int)((slot - T_GLOBAL) % L_KINDS));
    switch (slot) {
    case G_LM_HEAD: return !m->hp.tie_word_embeddings;
    case G_NORM_BIAS: return m->hp.norm_kind == COLIBRI_NORM_LAYER;
    case G_LM_HEAD_BIAS: return m->hp.lm_head_bias;
    case G_ROPE_FACTORS: return m->hp.rope_type == COLIBRI_ROPE_LONGROPE;
    default: return 1;
    }
}

const char *colibri_layer_tensor_name(int kind)
{
    return kind >= 0 && kind < L_KINDS ? colibri_layer_tensor_names[kind] : "?";
}

int colibri_slot_optional(int64_t slot)
{
    return colibri_slot_integer_dtype(slot) >= 0;   /* the tokenizer's tables (encoder: text/tokenize.c) */
}

int colibri_slot_integer_dtype(int64_t slot)
{
    switch (slot) {
    case G_TOKEN_BYTES: case G_ADDED_BYTES: return COLIBRI_DTYPE_U8;
    case G_TOKEN_OFFSETS: case G_MERGES: case G_MERGE_ORDER: case G_BYTE_IDS: case G_ADDED: case G_VOCAB_ORDER:
        return COLIBRI_DTYPE_I32;
    default: return -1;
    }
}

int colibri_slot_multiplied_whole(int64_t slot)
{
    if (slot == G_LM_HEAD) return 1;   /* a separate head: tied, tok_embeddings is the head and is read by row */
    if (slot < T_GLOBAL) return 0;
    switch ((slot - T_GLOBAL) % L_KINDS) {
    case L_WQ: case L_WK: case L_WV: case L_WO: case L_WQ_A: case L_WQ_B: case L_WKV_A:
    case L_CONV_IN: case L_CONV_OUT: case L_ROUTER: case L_W1: case L_W3: case L_W2:
    case L_SHARED_W1: case L_SHARED_W3: case L_SHARED_W2: case L_SHARED_GATE:
    case L_MLP_W1: case L_MLP_W3: case L_MLP_W2:
        return 1;
    default: return 0;   /* norms, biases, the convolution kernel, attn.wkv_b (latent_query reads its rows) */
    }
}

int colibri_slot_is_routed_expert(int64_t slot)
{
    int64_t kind = slot >= T_GLOBAL ? (slot - T_GLOBAL) % L_KINDS : -1;
    return kind >= L_EXPERT_FIRST && kind < L_EXPERT_FIRST + L_EXPERT_KINDS;
}

/* Slot of a tensor name: global slots first, then layer * L_KINDS + kind; -1 unknown. */
static int64_t tensor_slot(const char *text, const json_token *t, int32_t n_layers)
{
    const char *s = text + t->start;
    uint32_t n = t->len, i = 7;
    int64_t layer = 0;
    int k;
    for (k = 0; k < T_GLOBAL; k++)
        if (colibri_json_string_equals(text, t, colibri_global_tensor_names[k])) return k;
    if (n < 9 || memcmp(s, "layers.", 7) != 0) return -1;
    if (s[i] < '0' || s[i] > '9' || (s[i] == '0' && s[i + 1] != '.')) return -1;
    for (; i < n && s[i] >= '0' && s[i] <= '9'; i++) {
        layer = layer * 10 + (s[i] - '0');
        if (layer >= n_layers) return -1;
    }
    if (i >= n || s[i] != '.') return -1;
    i++;
    for (k = 0; k < L_KINDS; k++) {
        size_t m = strlen(colibri_layer_tensor_names[k]);
        if (n - i == m && memcmp(s + i, colibri_layer_tensor_names[k], m) == 0)
            return T_GLOBAL + layer * L_KINDS + k;
    }
    return -1;
}

static int expected_shape(const colibri_hparams *hp, int64_t slot, int64_t shape[4])
{
    int64_t d = hp->hidden_size, f = hp->intermediate_size, e = hp->n_experts, hd = hp->head_dim;
    int64_t q = (int64_t)hp->n_heads * hd, kv = (int64_t)hp->n_kv_heads * hd;
    int64_t fs = hp->shared_intermediate_size, fd = hp->dense_intermediate_size;
    int full = hp->qk_norm == COLIBRI_QK_NORM_FULL;
    if (slot < T_GLOBAL) {
        if (slot == G_NORM || slot == G_NORM_BIAS) { shape[0] = d; return 1; }
        if (slot == G_LM_HEAD_BIAS) { shape[0] = hp->vocab_size; return 1; }
        if (slot == G_ROPE_FACTORS) { shape[0] = hp->rope_dim / 2; return 1; }
        if (slot == G_TOKEN_BYTES) { shape[0] = -1; return 1; }    /* any length */
        if (slot == G_TOKEN_OFFSETS) { shape[0] = (int64_t)hp->vocab_size + 1; return 1; }
        if (slot == G_MERGE_ORDER || slot == G_ADDED_BYTES || slot == G_VOCAB_ORDER) { shape[0] = -1; return 1; }
        if (slot == G_BYTE_IDS) { shape[0] = 256; return 1; }
        if (slot == G_MERGES || slot == G_ADDED) { shape[0] = -1; shape[1] = 3; return 2; }
        shape[0] = hp->vocab_size; shape[1] = d; return 2;
    }
    switch ((slot - T_GLOBAL) % L_KINDS) {
    case L_ATTN_NORM: case L_FFN_NORM: case L_BO: case L_ATTN_NORM_BIAS: case L_FFN_NORM_BIAS: shape[0] = d; return 1;
    case L_WQ: shape[0] = q; shape[1] = d; return 2;
    case L_WK: case L_WV: shape[0] = kv; shape[1] = d; return 2;
    case L_WO: shape[0] = d; shape[1] = hp->kv_lora_rank ? (int64_t)hp->n_heads * hp->v_head_dim : q; return 2;
    case L_WQ_A: shape[0] = hp->q_lora_rank; shape[1] = d; return 2;
    case L_BQ_A: case L_Q_A_NORM: shape[0] = hp->q_lora_rank; return 1;
    case L_WQ_B: shape[0] = q; shape[1] = hp->q_lora_rank; return 2;
    case L_WKV_A: shape[0] = (int64_t)hp->kv_lora_rank + hp->rope_dim; shape[1] = d; return 2;
    case L_BKV_A: shape[0] = (int64_t)hp->kv_lora_rank + hp->rope_dim; return 1;
    case L_KV_A_NORM: shape[0] = hp->kv_lora_rank; return 1;
    case L_WKV_B: shape[0] = (int64_t)hp->n_heads * (hp->nope_dim + hp->v_head_dim); shape[1] = hp->kv_lora_rank; return 2;
    case L_CONV_IN: shape[0] = 3 * d; shape[1] = d; return 2;
    case L_CONV_IN_BIAS: shape[0] = 3 * d; return 1;
    case L_CONV_KERNEL: shape[0] = d; shape[1] = hp->conv_kernel; return 2;
    case L_CONV_OUT: shape[0] = d; shape[1] = d; return 2;
    case L_CONV_KERNEL_BIAS: case L_CONV_OUT_BIAS: shape[0] = d; return 1;
    case L_BQ: shape[0] = q; return 1;
    case L_BK: case L_BV: shape[0] = kv; return 1;
    case L_Q_NORM: shape[0] = full ? q : hd; return 1;
    case L_K_NORM: shape[0] = full ? kv : hd; return 1;
    case L_ROUTER: shape[0] = e; shape[1] = d; return 2;
    case L_ROUTER_BIAS: case L_SELECTION_BIAS: shape[0] = e; return 1;
    case L_W1: case L_W3: shape[0] = e; shape[1] = f; shape[2] = d; return 3;
    case L_W2: shape[0] = e; shape[1] = d; shape[2] = f; return 3;
    case L_B1: case L_B3: shape[0] = e; shape[1] = f; return 2;
    case L_B2: shape[0] = e; shape[1] = d; return 2;
    case L_SINKS: shape[0] = hp->n_heads; return 1;
    case L_SHARED_W1: case L_SHARED_W3: shape[0] = fs; shape[1] = d; return 2;
    case L_SHARED_W2: shape[0] = d; shape[1] = fs; return 2;
    case L_SHARED_GATE: shape[0] = 1; shape[1] = d; return 2;
    case L_MLP_W1: case L_MLP_W3: shape[0] = fd; shape[1] = d; return 2;
    default: shape[0] = d; shape[1] = fd; return 2;   /* L_MLP_W2 */
    }
}

static int is_hex_digit(char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
}

/* One entry of "tensors": fills t and returns its slot. */
/* "crc32:" and 8 lower-case hex digits -> *crc; 0 if the token is not that. */
static int crc_value(const char *text, const json_token *t, uint32_t *crc)
{
    const char *s = text + t->start;
    uint32_t k;
    if (t->type != JSON_STRING || t->len != 14 || memcmp(s, "crc32:", 6) != 0) return 0;
    *crc = 0;
    for (k = 6; k < 14; k++) {
        if (!is_hex_digit(s[k])) return 0;
        *crc = *crc << 4 | (uint32_t)(s[k] <= '9' ? s[k] - '0' : s[k] - 'a' + 10);
    }
    return 1;
}

/* tensor.dtype: one colibri reads, and the one its slot holds (a weight, or the tokenizer's integers). */
static colibri_status read_dtype(loader *L, int32_t obj, const char *where, int64_t slot, colibri_tensor *t)
{
    int32_t i = 0;
    int choice, need = colibri_slot_integer_dtype(slot);
    char list[160];
    colibri_status st = colibri_get_field(L, obj, where, "dtype", JSON_STRING, &i);
    if (st) return st;
    for (choice = 0; choice < COLIBRI_DTYPE_COUNT; choice++)
        if (colibri_json_string_equals(L->text, &L->tok[i], colibri_dtypes[choice].name)) break;
    if (colibri_json_string_equals(L->text, &L->tok[i], "fp16")) choice = COLIBRI_DTYPE_F16;   /* the spec's spelling */
    if (choice == COLIBRI_DTYPE_COUNT) {
        char text[24];
        colibri_copy_token_text(text, sizeof text, L->text, &L->tok[i]);
        return colibri_fail(L->err, COLIBRI_E_DTYPE, "%s: unknown dtype \"%s\" (expected %s)",
                            where, text, list_dtypes(list, sizeof list, 0));
    }
    t->dtype = (colibri_dtype)choice;
    if (need >= 0 ? (int)t->dtype != need : !colibri_dtypes[t->dtype].holds_weights)
        return colibri_fail(L->err, COLIBRI_E_DTYPE, "%s: dtype %s, expected %s", where, colibri_dtype_name(t->dtype),
                            need >= 0 ? colibri_dtype_name((colibri_dtype)need) : list_dtypes(list, sizeof list, 1));
    return COLIBRI_OK;
}

/* tensor.shape: the one the hyper-parameters give its slot; *elements its product (*overflow set past 2^64). */
static colibri_status read_shape(loader *L, int32_t obj, const char *where, const colibri_hparams *hp, int64_t slot,
                                 colibri_tensor *t, uint64_t *elements, int *overflow)
{
    int32_t shape_tok = 0, dim_tok;
    int64_t expected[4], v;
    int n_expected, ok, k;
    char got[96], want[96];
    size_t gl = 0, wl = 0;
    uint32_t d;
    colibri_status st = colibri_get_field(L, obj, where, "shape", JSON_ARRAY, &shape_tok);
    if (st) return st;
    n_expected = expected_shape(hp, slot, expected);
    t->n_dims = (int32_t)L->tok[shape_tok].n_children;
    ok = t->n_dims == n_expected;
    if (L->tok[shape_tok].n_children > 4)
        return colibri_fail(L->err, COLIBRI_E_SHAPE, "%s: shape has %u dimensions (at most 4)", where,
                            L->tok[shape_tok].n_children);
    *elements = 1;
    for (d = 0, dim_tok = shape_tok + 1; d < L->tok[shape_tok].n_children; d++, dim_tok += (int32_t)L->tok[dim_tok].subtree) {
        const json_token *dim = &L->tok[dim_tok];
        if (!colibri_json_as_int64(L->text, dim, &v) || v < 0)
            return colibri_fail(L->err, COLIBRI_E_TYPE, "%s: shape[%u] must be a non-negative integer", where, d);
        if (d < 4) t->shape[d] = v;
        if ((int)d >= n_expected || (v != expected[d] && expected[d] >= 0)) ok = 0;
        *elements = colibri_mul_u64(*elements, (uint64_t)v, overflow);
        if (gl < sizeof got) gl += colibri_format(got + gl, sizeof got - gl, d ? ",%lld" : "%lld", (long long)v);
    }
    if (ok) return COLIBRI_OK;
    for (k = 0; k < n_expected; k++) {
        if (expected[k] < 0) wl += colibri_format(want + wl, sizeof want - wl, k ? ",n" : "n");
        else wl += colibri_format(want + wl, sizeof want - wl, k ? ",%lld" : "%lld", (long long)expected[k]);
    }
    if (L->tok[shape_tok].n_children == 0) got[0] = '\0';
    return colibri_fail(L->err, COLIBRI_E_SHAPE, "%s: shape [%s] != expected [%s]", where, got, want);
}

/* tensor.file_offset and file_size: the bytes of `elements` elements of its dtype, in whole blocks
 * (and row groups, for the dtypes that interleave rows). */
static colibri_status read_extent(loader *L, int32_t obj, const char *where, int64_t slot, colibri_tensor *t,
                                  uint64_t elements, int overflow)
{
    const colibri_dtype_traits *traits = &colibri_dtypes[t->dtype];
    int32_t i = 0;
    int64_t v;
    uint64_t need;
    colibri_status st = colibri_get_field(L, obj, where, "file_offset", JSON_NUMBER, &i);
    if (st) return st;
    if (!colibri_json_as_int64(L->text, &L->tok[i], &v) || v < 0)
        return colibri_fail(L->err, COLIBRI_E_TYPE, "%s: file_offset must be a non-negative integer", where);
    t->file_offset = (uint64_t)v;
    st = colibri_get_field(L, obj, where, "file_size", JSON_NUMBER, &i);
    if (st) return st;
    if (!colibri_json_as_int64(L->text, &L->tok[i], &v) || v < 0)
        return colibri_fail(L->err, COLIBRI_E_TYPE, "%s: file_size must be a non-negative integer", where);
    t->file_size = (uint64_t)v;
    if (colibri_dtype_is_block(t->dtype) && (t->n_dims == 0 || t->shape[t->n_dims - 1] % traits->block != 0))
        return colibri_fail(L->err, COLIBRI_E_SHAPE, "%s: %s rows must be whole blocks: the last dimension (%lld) is not a multiple of %d",
                            where, colibri_dtype_name(t->dtype), t->n_dims ? (long long)t->shape[t->n_dims - 1] : 0LL,
                            (int)traits->block);
    if (traits->rows > 1) {   /* interleaved rows: only matrices multiplied whole, rows in groups */
        int64_t rows = t->n_dims >= 2 ? t->shape[t->n_dims - 2] : 0;
        if (!colibri_slot_multiplied_whole(slot))
            return colibri_fail(L->err, COLIBRI_E_VALUE, "%s: dtype %s interleaves rows, which only a matrix the forward "
                                "pass multiplies whole may (not the embedding nor one read by row; docs/FORMAT.md)",
                                where, colibri_dtype_name(t->dtype));
        if (rows % traits->rows != 0)
            return colibri_fail(L->err, COLIBRI_E_VALUE, "%s: dtype %s interleaves groups of %d rows, but it has %lld rows",
                                where, colibri_dtype_name(t->dtype), (int)traits->rows, (long long)rows);
    }
    /* elements / block blocks: exact, rows are whole blocks */
    need = colibri_mul_u64(elements / (uint64_t)traits->block, (uint64_t)traits->block_bytes, &overflow);
    if (overflow || need != t->file_size)
        return colibri_fail(L->err, COLIBRI_E_SIZE, "%s: file_size %llu != %llu bytes of %s",
                            where, (unsigned long long)t->file_size, (unsigned long long)need,
                            colibri_dtype_name(t->dtype));
    return COLIBRI_OK;
}

/* tensor.expert_stride: interleaved routed experts only, E parts, expert e's at file_offset + e * expert_stride;
 * t->span is then from expert 0's part to the end of the last's, for the bounds check. */
static colibri_status read_expert_stride(loader *L, int32_t obj, const char *where, const colibri_hparams *hp,
                                         int64_t slot, colibri_tensor *t)
{
    int interleaved = colibri_slot_is_routed_expert(slot) && hp->expert_layout == COLIBRI_LAYOUT_INTERLEAVED;
    uint64_t part = t->file_size / (uint64_t)hp->n_experts;   /* exact: shape[0] is n_experts */
    int32_t i = 0;
    int64_t v;
    int overflow = 0;
    colibri_status st;
    t->expert_stride = 0;
    t->span = t->file_size;
    if (!interleaved && colibri_json_object_get(L->text, L->tok, obj, "expert_stride") >= 0)
        return colibri_fail(L->err, COLIBRI_E_VALUE, "%s: expert_stride belongs only to the routed experts' tensors "
                            "of the interleaved layout (experts.weight_layout)", where);
    if (!interleaved) return COLIBRI_OK;
    st = colibri_get_field(L, obj, where, "expert_stride", JSON_NUMBER, &i);
    if (st) return st;
    if (!colibri_json_as_int64(L->text, &L->tok[i], &v) || v <= 0)
        return colibri_fail(L->err, COLIBRI_E_TYPE, "%s: expert_stride must be a positive integer", where);
    t->expert_stride = (uint64_t)v;
    if (t->expert_stride % COLIBRI_ALIGNMENT != 0)
        return colibri_fail(L->err, COLIBRI_E_ALIGN, "%s: expert_stride %llu is not a multiple of %d",
                            where, (unsigned long long)t->expert_stride, COLIBRI_ALIGNMENT);
    if (t->expert_stride < part)
        return colibri_fail(L->err, COLIBRI_E_OVERLAP, "%s: expert_stride %llu is below one expert's part "
                            "(%llu bytes): the parts overlap", where, (unsigned long long)t->expert_stride,
                            (unsigned long long)part);
    t->span = colibri_mul_u64((uint64_t)hp->n_experts - 1, t->expert_stride, &overflow) + part;
    if (overflow || t->span < part)
        return colibri_fail(L->err, COLIBRI_E_BOUNDS, "%s: %d experts of expert_stride %llu lie past any weights.bin",
                            where, hp->n_experts, (unsigned long long)t->expert_stride);
    return COLIBRI_OK;
}

/* tensor.checksum, and for interleaved experts optionally extent_checksums: one CRC per expert
 * extent, checked when a session streams it. */
static colibri_status read_checksums(loader *L, int32_t obj, const char *where, const colibri_hparams *hp,
                                     colibri_tensor *t)
{
    const json_token *list;
    uint32_t e, crc;
    int32_t i = 0;
    colibri_status st = colibri_get_field(L, obj, where, "checksum", JSON_STRING, &i);
    if (st) return st;
    if (!crc_value(L->text, &L->tok[i], &t->crc32))
        return colibri_fail(L->err, COLIBRI_E_VALUE, "%s: checksum must be \"crc32:\" and 8 hex digits", where);
    t->extent_checksums = colibri_json_object_get(L->text, L->tok, obj, "extent_checksums");
    if (t->extent_checksums < 0) return COLIBRI_OK;
    list = &L->tok[t->extent_checksums];
    if (!t->expert_stride)
        return colibri_fail(L->err, COLIBRI_E_VALUE, "%s: extent_checksums belong only to the routed experts' "
                            "tensors of the interleaved layout", where);
    if (list->type != JSON_ARRAY || list->n_children != (uint32_t)hp->n_experts)
        return colibri_fail(L->err, COLIBRI_E_VALUE, "%s: extent_checksums must list %d checksums, one per expert",
                            where, hp->n_experts);
    for (e = 0; e < list->n_children; e++)   /* strings: one token each, in order */
        if (!crc_value(L->text, list + 1 + e, &crc))
            return colibri_fail(L->err, COLIBRI_E_VALUE, "%s: extent_checksums[%u] must be \"crc32:\" and 8 hex digits",
                                where, e);
    return COLIBRI_OK;
}

colibri_status colibri_read_tensor(loader *L, int32_t obj, uint32_t index, const colibri_model *m,
                                   colibri_tensor *t, int64_t *slot)
{
    const colibri_hparams *hp = &m->hp;
    static const char *const keys[] = { "name", "dtype", "shape", "file_offset", "file_size", "checksum",
                                        "expert_stride", "extent_checksums", NULL };
    char where[64];
    int32_t i = 0;
    int overflow = 0;
    uint64_t elements = 1;
    colibri_status st;

    colibri_format(where, sizeof where, "tensors[%u]", index);
    if (L->tok[obj].type != JSON_OBJECT)
        return colibri_fail(L->err, COLIBRI_E_TYPE, "%s must be an object", where);
    st = colibri_get_field(L, obj, where, "name", JSON_STRING, &i);
    if (st) return st;
    colibri_copy_token_text(t->name, sizeof t->name, L->text, &L->tok[i]);
    *slot = tensor_slot(L->text, &L->tok[i], hp->n_layers);
    if (*slot < 0 || !colibri_slot_used(*slot, m))
        return colibri_fail(L->err, COLIBRI_E_TENSOR, "tensor `%s` is not part of a %s model with %d layers%s",
                            t->name, m->architecture, hp->n_layers,
                            *slot == G_LM_HEAD ? " and tied embeddings"
                            : *slot >= T_GLOBAL ? " and these options (docs/FORMAT.md)" : "");
    colibri_format(where, sizeof where, "tensor `%s`", t->name);
    st = colibri_check_keys(L, obj, where, keys);
    if (!st) st = read_dtype(L, obj, where, *slot, t);
    if (!st) st = read_shape(L, obj, where, hp, *slot, t, &elements, &overflow);
    if (!st) st = read_extent(L, obj, where, *slot, t, elements, overflow);
    if (!st) st = read_expert_stride(L, obj, where, hp, *slot, t);
    if (!st) st = read_checksums(L, obj, where, hp, t);
    return st;
}

int colibri_extent_checksum(const colibri_model *m, int32_t layer, int32_t expert, uint32_t *crc)
{
    int32_t list = m->layers[layer].extent_checksums;
    return list > 0 && crc_value(m->json, m->json_tokens + list + 1 + expert, crc);
}

/* The routed experts' strides, and with the interleaved layout each layer's extents: one
 * expert_stride for all the layer's expert tensors (the extent's size), expert 0's parts side by side
 * inside [base, base + stride) where base is the lowest of them, all E extents inside weights.bin.
 * Expert e's parts are expert 0's moved by e * stride, so checking expert 0's checks them all.
 * index: (n_layers, L_EXPERT_KINDS) int32 scratch (every layer has more tensors than that). */
colibri_status colibri_check_experts(colibri_model *m, int32_t *index, colibri_error *err)
{
    const colibri_hparams *hp = &m->hp;
    uint64_t E = (uint64_t)hp->n_experts;
    int32_t l, i, a, b;
    for (i = 0; i < hp->n_layers * L_EXPERT_KINDS; i++) index[i] = -1;
    for (i = 0; i < m->n_tensors; i++) {
        int64_t s = (int64_t)m->tensors[i].slot - T_GLOBAL;
        int kind = s >= 0 ? (int)(s % L_KINDS) : -1;
        if (kind >= L_EXPERT_FIRST && kind < L_EXPERT_FIRST + L_EXPERT_KINDS)
            index[(s / L_KINDS) * L_EXPERT_KINDS + kind - L_EXPERT_FIRST] = i;
    }
    for (l = 0; l < hp->n_layers; l++) {
        colibri_layer_weights *lw = &m->layers[l];
        const int32_t *idx = index + (size_t)l * L_EXPERT_KINDS;
        const colibri_tensor *first = NULL;
        uint64_t base = UINT64_MAX, stride, all;
        int overflow = 0;
        for (a = 0; a < L_EXPERT_KINDS; a++) {
            const colibri_tensor *t = idx[a] < 0 ? NULL : &m->tensors[idx[a]];
            if (!t) continue;
            lw->expert_stride[a] = (size_t)(t->expert_stride ? t->expert_stride : t->file_size / E);
            if (!t->expert_stride) continue;   /* stacked */
            if (!first) first = t;
            else if (t->expert_stride != first->expert_stride)
                return colibri_fail(err, COLIBRI_E_VALUE, "layer %d: tensor `%s` has expert_stride %llu, tensor `%s` %llu: "
                                    "a layer's expert tensors share one stride, the size of an expert's extent", l,
                                    t->name, (unsigned long long)t->expert_stride, first->name,
                                    (unsigned long long)first->expert_stride);
            if (t->file_offset < base) base = t->file_offset;
        }
        if (!first) continue;
        stride = first->expert_stride;
        for (a = 0; a < L_EXPERT_KINDS; a++) {
            const colibri_tensor *t = idx[a] < 0 ? NULL : &m->tensors[idx[a]];
            uint64_t at, part;
            if (!t) continue;
            at = t->file_offset - base;
            part = t->file_size / E;
            if (at > stride || part > stride - at)
                return colibri_fail(err, COLIBRI_E_OVERLAP, "tensor `%s`: expert 0's part [%llu, %llu) lies outside "
                                    "its extent [%llu, %llu) (layer %d, expert_stride %llu)", t->name,
                                    (unsigned long long)t->file_offset, (unsigned long long)(t->file_offset + part),
                                    (unsigned long long)base, (unsigned long long)(base + stride), l,
                                    (unsigned long long)stride);
            for (b = 0; b < a; b++) {
                const colibri_tensor *u = idx[b] < 0 ? NULL : &m->tensors[idx[b]];
                if (u && t->file_offset < u->file_offset + u->file_size / E && u->file_offset < t->file_offset + part)
                    return colibri_fail(err, COLIBRI_E_OVERLAP, "layer %d: tensors `%s` [%llu, %llu) and `%s` [%llu, %llu) "
                                        "share bytes of expert 0's extent", l, u->name,
                                        (unsigned long long)u->file_offset,
                                        (unsigned long long)(u->file_offset + u->file_size / E), t->name,
                                        (unsigned long long)t->file_offset, (unsigned long long)(t->file_offset + part));
            }
        }
        all = colibri_mul_u64(E, stride, &overflow);
        if (overflow || base + all < base || (!m->experts_elsewhere && base + all > m->weights_len))
            return colibri_fail(err, COLIBRI_E_BOUNDS, "layer %d: expert %d's extent [%llu, %llu) lies past the end of "
                                "weights.bin (%zu bytes)", l, hp->n_experts - 1,
                                (unsigned long long)(base + (E - 1) * stride), (unsigned long long)(base + (E - 1) * stride + stride),
                                m->weights_len);
        for (a = 0; a < L_EXPERT_KINDS; a++)   /* the overlap check sees the layer's extents as one claim */
            if (idx[a] >= 0) m->tensors[idx[a]].span = m->tensors[idx[a]].file_offset == base ? all : 0;
        lw->extent_offset = (size_t)base;
        lw->extent_bytes = (size_t)stride;
        for (a = 0; a < L_EXPERT_KINDS; a++) {
            const colibri_tensor *t = idx[a] < 0 ? NULL : &m->tensors[idx[a]];
            if (!t || t->extent_checksums < 0) continue;
            if (lw->extent_checksums)
                return colibri_fail(err, COLIBRI_E_VALUE, "layer %d: tensor `%s` lists extent_checksums again: one of the "
                                    "layer's expert tensors carries them", l, t->name);
            lw->extent_checksums = t->extent_checksums;
        }
    }
    return COLIBRI_OK;
}

/* Tensors sorted by offset, to find overlaps in one pass: a heap sort, no allocation. */
static int offset_less(const colibri_tensor *ts, int32_t a, int32_t b)
{
    return ts[a].file_offset < ts[b].file_offset ||
           (ts[a].file_offset == ts[b].file_offset && a < b);
}

static void sift_down(const colibri_tensor *ts, int32_t *order, int32_t root, int32_t n)
{
    for (;;) {
        int32_t child = 2 * root + 1, tmp;
        if (child >= n) return;
        if (child + 1 < n && offset_less(ts, order[child], order[child + 1])) child++;
        if (!offset_less(ts, order[root], order[child])) return;
        tmp = order[root]; order[root] = order[child]; order[child] = tmp;
        root = child;
    }
}

/* What a tensor claims, for the overlap message: its bytes, or an interleaved layer's extents. */
static const char *claim_name(const colibri_tensor *t)
{
    return t->expert_stride ? "'s expert extents" : "";
}

/* Each tensor claims [file_offset, file_offset + span): sorted by offset, a claim overlaps another
 * exactly when it starts before the furthest end so far.  Empty claims take no bytes. */
colibri_status colibri_check_overlaps(const colibri_model *m, int32_t *order, colibri_error *err)
{
    int32_t n = m->n_tensors, i;
    const colibri_tensor *furthest = NULL;
    for (i = 0; i < n; i++) order[i] = i;
    for (i = n / 2; i-- > 0;) sift_down(m->tensors, order, i, n);
    for (i = n - 1; i > 0; i--) {
        int32_t tmp = order[0]; order[0] = order[i]; order[i] = tmp;
        sift_down(m->tensors, order, 0, i);
    }
    for (i = 0; i < n; i++) {
        const colibri_tensor *b = &m->tensors[order[i]];
        if (!b->span) continue;
        if (furthest && furthest->file_offset + furthest->span > b->file_offset)
            return colibri_fail(err, COLIBRI_E_OVERLAP, "tensor `%s`%s [%llu, %llu) overlaps tensor `%s`%s at %llu",
                                furthest->name, claim_name(furthest), (unsigned long long)furthest->file_offset,
                                (unsigned long long)(furthest->file_offset + furthest->span), b->name, claim_name(b),
                                (unsigned long long)b->file_offset);
        if (!furthest || b->file_offset + b->span > furthest->file_offset + furthest->span) furthest = b;
    }
    return COLIBRI_OK;
}

/* Verify mode: the bytes match their CRC and hold no NaN or infinity; an interleaved tensor's
 * bytes are its E parts in expert order. */
colibri_status colibri_verify_tensor(const colibri_model *m, const colibri_tensor *t, colibri_error *err)
{
    uint64_t parts = t->expert_stride ? (uint64_t)m->hp.n_experts : 1, part = t->file_size / parts;
    /* a unit: a block, or an interleaved format's group of 8 blocks (its 8 scales) */
    uint64_t unit = (uint64_t)colibri_dtypes[t->dtype].block_bytes * (uint64_t)colibri_dtypes[t->dtype].rows, e, i, n = part / unit;
    uint32_t crc = 0;
    for (e = 0; e < parts; e++) crc = colibri_crc32(crc, m->weights + t->file_offset + e * t->expert_stride, (size_t)part);
    if (crc != t->crc32)
        return colibri_fail(err, COLIBRI_E_CHECKSUM, "tensor `%s`: crc32 %x != %x in colibri_model.json",
                            t->name, crc, t->crc32);
    for (e = 0; e < parts; e++) {
        const uint8_t *p = m->weights + t->file_offset + e * t->expert_stride;
        if (colibri_dtype_is_block(t->dtype)) {   /* the quants are integers: only the scales can be inf or nan */
            const colibri_dtype_traits *tr = &colibri_dtypes[t->dtype];
            for (i = 0; i < n; i++) {
                int32_t k, finite = 1;
                for (k = 0; k < tr->rows && colibri_dtype_plain(t->dtype) == COLIBRI_DTYPE_MXFP4; k++)
                    if (p[i * unit + (size_t)k] == 0xff) finite = 0;   /* E8M0's nan */
                for (k = 0; k < tr->f16_count; k++) {
                    uint16_t bits;
                    memcpy(&bits, p + i * unit + (size_t)tr->f16_at + 2 * (size_t)k, 2);
                    if ((bits & 0x7c00u) == 0x7c00u) finite = 0;
                }
                if (!finite)
                    return colibri_fail(err, COLIBRI_E_VALUE, "tensor `%s`: the scale of block %s%llu is not finite",
                                        t->name, tr->rows > 1 ? "group " : "", (unsigned long long)(e * n + i));
            }
            continue;
        }
        if (t->dtype > COLIBRI_DTYPE_BF16) continue;   /* integers are always finite */
        for (i = 0; i < n; i++) {
            int finite;
            if (t->dtype == COLIBRI_DTYPE_F32) {
                uint32_t bits;
                memcpy(&bits, p + 4 * i, 4);
                finite = (bits & 0x7f800000u) != 0x7f800000u;
            } else {
                uint16_t bits;
                memcpy(&bits, p + 2 * i, 2);
                finite = t->dtype == COLIBRI_DTYPE_F16 ? (bits & 0x7c00u) != 0x7c00u
                                                        : (bits & 0x7f80u) != 0x7f80u;
            }
            if (!finite)
                return colibri_fail(err, COLIBRI_E_VALUE, "tensor `%s`: element %llu is not finite",
                                    t->name, (unsigned long long)(e * n + i));
        }
    }
    return COLIBRI_OK;
}

/* The byte table is data: every offset is checked once here, so decoding can trust it. */
colibri_status colibri_check_vocabulary(colibri_model *m, colibri_error *err)
{
    const colibri_tensor *bytes_t = NULL;
    int32_t i, V = m->hp.vocab_size;
    for (i = 0; i < m->n_tensors; i++)
        if (strcmp(m->tensors[i].name, colibri_global_tensor_names[G_TOKEN_BYTES]) == 0) bytes_t = &m->tensors[i];
    if (m->token_offsets[0] != 0)
        return colibri_fail(err, COLIBRI_E_VALUE, "tensor `tokenizer.token_offsets`: entry 0 is %d, not 0",
                            m->token_offsets[0]);
    for (i = 0; i < V; i++) {
        if (m->token_offsets[i + 1] < m->token_offsets[i])
            return colibri_fail(err, COLIBRI_E_VALUE, "tensor `tokenizer.token_offsets`: entry %d (%d) is below entry %d (%d)",
                                i + 1, m->token_offsets[i + 1], i, m->token_offsets[i]);
    }
    if ((uint64_t)m->token_offsets[V] != bytes_t->file_size)
        return colibri_fail(err, COLIBRI_E_VALUE, "tensor `tokenizer.token_offsets`: last entry %d != %llu bytes in tokenizer.token_bytes",
                            m->token_offsets[V], (unsigned long long)bytes_t->file_size);
    return COLIBRI_OK;
}
