/* Loading and validation of colibri_model.json against weights.bin.
 *
 * Everything the forward pass trusts is checked here, once: field types and ranges,
 * every tensor's presence, dtype, shape, size, alignment, bounds and overlap (and, in
 * verify mode, checksum and finiteness).  The hot path only checks token ids. */
#include <math.h>
#include <string.h>

#include "json.h"
#include "model.h"
#include "../ops/ops.h"
#include "../util.h"

/* Limits on hyper-parameters: far above any released MoE, low enough that sizes never overflow. */
#define MAX_VOCAB        (1 << 24)
#define MAX_HIDDEN       (1 << 16)
#define MAX_FFN          (1 << 20)
#define MAX_LAYERS       1024
#define MAX_HEADS        1024
#define MAX_HEAD_DIM     1024
#define MAX_EXPERTS      4096
#define MAX_TOP_K        64
#define MAX_POSITIONS    (1 << 24)

#define MIN_LAYER_TENSORS 9

/* ---- dtypes ---- */

const char *colibri_dtype_name(colibri_dtype dtype)
{
    return (unsigned)dtype < COLIBRI_DTYPE_COUNT ? colibri_dtypes[dtype].name : "?";
}

/* ---- the tensors a model has ---- */

/* Per-layer tensors: "layers.{i}." + the name of model.h's L_* kind. */
static const char *const layer_tensor_names[] = {
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
COLIBRI_TABLE_CHECK(layer_tensor_names, L_KINDS);

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

/* The model-wide tensors; their slots come before the layers'. */
enum { G_TOK_EMBEDDINGS, G_NORM, G_LM_HEAD, G_TOKEN_BYTES, G_TOKEN_OFFSETS, G_NORM_BIAS, G_LM_HEAD_BIAS,
       G_ROPE_FACTORS, T_GLOBAL };
static const char *const global_tensor_names[] = {
    [G_TOK_EMBEDDINGS] = "tok_embeddings", [G_NORM] = "norm", [G_LM_HEAD] = "lm_head",
    [G_TOKEN_BYTES] = "tokenizer.token_bytes", [G_TOKEN_OFFSETS] = "tokenizer.token_offsets",
    [G_NORM_BIAS] = "norm_bias", [G_LM_HEAD_BIAS] = "lm_head_bias", [G_ROPE_FACTORS] = "rope.factors",
};
COLIBRI_TABLE_CHECK(global_tensor_names, T_GLOBAL);

/* Whether the model has a tensor in `slot` (layers: from layer_has; the vocabulary table is
 * optional, so it counts as "has" too: read_tensor accepts it, the missing check skips it). */
static int slot_used(int64_t slot, const colibri_model *m)
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

static int slot_optional(int64_t slot)
{
    return slot == G_TOKEN_BYTES || slot == G_TOKEN_OFFSETS;
}

/* Slot of a tensor name: global slots first, then layer * L_KINDS + kind; -1 unknown. */
static int64_t tensor_slot(const char *text, const json_token *t, int32_t n_layers)
{
    const char *s = text + t->start;
    uint32_t n = t->len, i = 7;
    int64_t layer = 0;
    int k;
    for (k = 0; k < T_GLOBAL; k++)
        if (json_string_equals(text, t, global_tensor_names[k])) return k;
    if (n < 9 || memcmp(s, "layers.", 7) != 0) return -1;
    if (s[i] < '0' || s[i] > '9' || (s[i] == '0' && s[i + 1] != '.')) return -1;
    for (; i < n && s[i] >= '0' && s[i] <= '9'; i++) {
        layer = layer * 10 + (s[i] - '0');
        if (layer >= n_layers) return -1;
    }
    if (i >= n || s[i] != '.') return -1;
    i++;
    for (k = 0; k < L_KINDS; k++) {
        size_t m = strlen(layer_tensor_names[k]);
        if (n - i == m && memcmp(s + i, layer_tensor_names[k], m) == 0)
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

/* ---- the choices of the string fields ----
 *
 * Each table holds the spellings of one field, keyed by the value the loader stores: the
 * lookup, the error message's list of choices and the enum read the same table. */

static const char *const qk_norms[] = {
    [COLIBRI_QK_NORM_NONE] = "none", [COLIBRI_QK_NORM_HEAD] = "head", [COLIBRI_QK_NORM_FULL] = "full",
    [COLIBRI_QK_NORM_HEAD_PLAIN] = "head_plain",
};
static const char *const norm_kinds[] = { [COLIBRI_NORM_RMS] = "rms", [COLIBRI_NORM_LAYER] = "layer" };
static const char *const rope_types[] = {
    [COLIBRI_ROPE_DEFAULT] = "default", [COLIBRI_ROPE_YARN] = "yarn", [COLIBRI_ROPE_LONGROPE] = "longrope",
    [COLIBRI_ROPE_LLAMA3] = "llama3",
};
static const char *const router_scores[] = {
    [COLIBRI_SCORE_SOFTMAX] = "softmax", [COLIBRI_SCORE_SIGMOID] = "sigmoid", [COLIBRI_SCORE_LOGITS] = "logits",
};
static const char *const router_weightings[] = {
    [COLIBRI_WEIGHTS_SCORES] = "scores", [COLIBRI_WEIGHTS_SOFTMAX_SELECTED] = "softmax_of_selected",
    [COLIBRI_WEIGHTS_SIGMOID_SELECTED] = "sigmoid_of_selected",
};
static const char *const group_scores[] = { [COLIBRI_GROUP_MAX] = "max", [COLIBRI_GROUP_TOP2_SUM] = "top2_sum" };
static const char *const shared_gates[] = { [0] = "none", [1] = "sigmoid" };   /* hparams.shared_gate: 0 or 1 */
COLIBRI_TABLE_CHECK(qk_norms, COLIBRI_QK_NORM_COUNT);
COLIBRI_TABLE_CHECK(norm_kinds, COLIBRI_NORM_COUNT);
COLIBRI_TABLE_CHECK(rope_types, COLIBRI_ROPE_COUNT);
COLIBRI_TABLE_CHECK(router_scores, COLIBRI_SCORE_COUNT);
COLIBRI_TABLE_CHECK(router_weightings, COLIBRI_WEIGHTS_COUNT);
COLIBRI_TABLE_CHECK(group_scores, COLIBRI_GROUP_COUNT);

/* routing.type: "topk_softmax" is Mixtral's name for the top-k router. */
enum { ROUTING_TOPK_SOFTMAX, ROUTING_TOPK, ROUTING_SPARSEMIXER, ROUTING_TYPES };
static const char *const routing_types[] = {
    [ROUTING_TOPK_SOFTMAX] = "topk_softmax", [ROUTING_TOPK] = "topk", [ROUTING_SPARSEMIXER] = "sparsemixer",
};
COLIBRI_TABLE_CHECK(routing_types, ROUTING_TYPES);

/* experts.activation names the gate's activation and, for gpt-oss, the clamped SwiGLU. */
enum { GATE_SILU, GATE_SWIGLU_CLAMPED, GATE_GELU, GATE_GELU_TANH, GATE_RELU, GATE_KINDS };
static const char *const gate_names[] = {
    [GATE_SILU] = "silu", [GATE_SWIGLU_CLAMPED] = "swiglu_clamped", [GATE_GELU] = "gelu",
    [GATE_GELU_TANH] = "gelu_tanh", [GATE_RELU] = "relu",
};
static const struct { int32_t expert_kind, activation; } gates[] = {
    [GATE_SILU] = { COLIBRI_EXPERT_SWIGLU, COLIBRI_ACT_SILU },
    [GATE_SWIGLU_CLAMPED] = { COLIBRI_EXPERT_SWIGLU_CLAMPED, COLIBRI_ACT_SILU },
    [GATE_GELU] = { COLIBRI_EXPERT_SWIGLU, COLIBRI_ACT_GELU },
    [GATE_GELU_TANH] = { COLIBRI_EXPERT_SWIGLU, COLIBRI_ACT_GELU_TANH },
    [GATE_RELU] = { COLIBRI_EXPERT_SWIGLU, COLIBRI_ACT_RELU },
};
COLIBRI_TABLE_CHECK(gate_names, GATE_KINDS);
COLIBRI_TABLE_CHECK(gates, GATE_KINDS);

/* hparams.attention_layers, per layer. */
enum { ATTENTION_FULL, ATTENTION_SLIDING, ATTENTION_CHUNKED, ATTENTION_KINDS };
static const char *const attention_kinds[] = {
    [ATTENTION_FULL] = "full", [ATTENTION_SLIDING] = "sliding", [ATTENTION_CHUNKED] = "chunked",
};
COLIBRI_TABLE_CHECK(attention_kinds, ATTENTION_KINDS);

/* Fields with a single choice. */
static const char *const formats[] = { "colibri" };
static const char *const layouts[] = { "stacked" };
static const char *const quantizations[] = { "none" };

/* A table and its length, as the lookups take them. */
#define CHOICES(table) table, (int32_t)COLIBRI_COUNT_OF(table)

/* Index of the string token `t` in names, or -1. */
static int32_t find_name(const char *text, const json_token *t, const char *const *names, int32_t count)
{
    int32_t c;
    for (c = 0; c < count; c++)
        if (json_string_equals(text, t, names[c])) return c;
    return -1;
}

/* names into buf as `"a", "b" or "c"` (quoted) or `a, b or c`; cut short at cap bytes. */
static const char *list_names(char *buf, size_t cap, const char *const *names, int32_t count, int quoted)
{
    const char *q = quoted ? "\"" : "";
    size_t len = 0;
    int32_t c;
    buf[0] = '\0';
    for (c = 0; c < count && len < cap; c++)
        len += colibri_format(buf + len, cap - len, "%s%s%s%s", c == 0 ? "" : c == count - 1 ? " or " : ", ",
                              q, names[c], q);
    return buf;
}

/* The dtype names (all, or those that hold weights), as list_names writes them. */
static const char *list_dtypes(char *buf, size_t cap, int weights_only)
{
    const char *names[COLIBRI_DTYPE_COUNT];
    int32_t n = 0, d;
    for (d = 0; d < COLIBRI_DTYPE_COUNT; d++)
        if (!weights_only || colibri_dtypes[d].holds_weights) names[n++] = colibri_dtypes[d].name;
    return list_names(buf, cap, names, n, 0);
}

/* ---- reading fields ---- */

typedef struct loader {
    const char *text;
    const json_token *tok;
    colibri_error *err;
} loader;

static void copy_token_text(char *dst, size_t cap, const char *text, const json_token *t)
{
    size_t n = t->len < cap - 1 ? t->len : cap - 1;
    memcpy(dst, text + t->start, n);
    dst[n] = '\0';
}

/* Every key of the object must be in `allowed` (NULL-terminated) and appear once. */
static colibri_status check_keys(loader *L, int32_t obj, const char *where, const char *const *allowed)
{
    uint32_t k, j;
    int32_t key_tok = obj + 1;
    for (k = 0; k < L->tok[obj].n_children; k++, key_tok += 1 + (int32_t)L->tok[key_tok + 1].subtree) {
        const json_token *key = &L->tok[key_tok];
        const char *const *a;
        int32_t earlier = obj + 1;
        for (a = allowed; *a; a++)
            if (json_string_equals(L->text, key, *a)) break;
        if (!*a) {
            char name[40];
            copy_token_text(name, sizeof name, L->text, key);
            return colibri_fail(L->err, COLIBRI_E_VALUE, "%s: unknown field \"%s\"", where, name);
        }
        /* only allowed keys get here, so this loop runs over at most a dozen keys before it finds a twin */
        for (j = 0; j < k; j++, earlier += 1 + (int32_t)L->tok[earlier + 1].subtree) {
            if (json_string_equals(L->text, &L->tok[earlier], *a))
                return colibri_fail(L->err, COLIBRI_E_JSON, "%s: field \"%s\" appears twice", where, *a);
        }
    }
    return COLIBRI_OK;
}

static colibri_status get_field(loader *L, int32_t obj, const char *where, const char *key,
                                json_type type, int32_t *index)
{
    static const char *const type_names[] = { "an object", "an array", "a string", "a number",
                                              "a boolean", "a boolean", "null" };
    int32_t i = json_object_get(L->text, L->tok, obj, key);
    *index = 0;
    if (i < 0) return colibri_fail(L->err, COLIBRI_E_MISSING, "%s.%s is missing", where, key);
    if (L->tok[i].type != type && !(type == JSON_TRUE && L->tok[i].type == JSON_FALSE))
        return colibri_fail(L->err, COLIBRI_E_TYPE, "%s.%s must be %s", where, key, type_names[type]);
    *index = i;
    return COLIBRI_OK;
}

static colibri_status get_int(loader *L, int32_t obj, const char *where, const char *key,
                              int64_t lo, int64_t hi, int32_t *value)
{
    int32_t i = 0;
    int64_t v;
    colibri_status st = get_field(L, obj, where, key, JSON_NUMBER, &i);
    if (st) return st;
    if (!json_as_int64(L->text, &L->tok[i], &v)) {
        char text[32];
        copy_token_text(text, sizeof text, L->text, &L->tok[i]);
        return colibri_fail(L->err, COLIBRI_E_TYPE, "%s.%s must be an integer, not %s", where, key, text);
    }
    if (v < lo || v > hi)
        return colibri_fail(L->err, COLIBRI_E_VALUE, "%s.%s = %lld is outside [%lld, %lld]",
                            where, key, (long long)v, (long long)lo, (long long)hi);
    *value = (int32_t)v;
    return COLIBRI_OK;
}

static colibri_status get_float(loader *L, int32_t obj, const char *where, const char *key,
                                double lo, double hi, float *value)
{
    int32_t i = 0;
    double v;
    colibri_status st = get_field(L, obj, where, key, JSON_NUMBER, &i);
    if (st) return st;
    json_as_double(L->text, &L->tok[i], &v);
    /* checked after the conversion to float: 1e-50 is positive but would be stored as 0 */
    if (!(v > lo && v <= hi) || !((float)v >= 1.17549435e-38f)) {
        char text[32];
        copy_token_text(text, sizeof text, L->text, &L->tok[i]);
        return colibri_fail(L->err, COLIBRI_E_VALUE, "%s.%s = %s is out of range", where, key, text);
    }
    *value = (float)v;
    return COLIBRI_OK;
}

static colibri_status get_bool(loader *L, int32_t obj, const char *where, const char *key, int32_t *value)
{
    int32_t i = 0;
    colibri_status st = get_field(L, obj, where, key, JSON_TRUE, &i);
    if (st) return st;
    *value = L->tok[i].type == JSON_TRUE;
    return COLIBRI_OK;
}

/* A string field that must be one of names (CHOICES(table)): *choice is its index. */
static colibri_status get_choice(loader *L, int32_t obj, const char *where, const char *key,
                                 const char *const *names, int32_t count, int32_t *choice)
{
    int32_t i = 0;
    char text[40], list[128];
    colibri_status st = get_field(L, obj, where, key, JSON_STRING, &i);
    if (st) return st;
    *choice = find_name(L->text, &L->tok[i], names, count);
    if (*choice >= 0) return COLIBRI_OK;
    copy_token_text(text, sizeof text, L->text, &L->tok[i]);
    return colibri_fail(L->err, COLIBRI_E_VALUE, "%s.%s: unsupported value \"%s\" (expected %s)", where, key, text,
                        list_names(list, sizeof list, names, count, 1));
}

/* Optional fields: absent means `fallback`; present, the field is checked as a required one. */
static int has_field(loader *L, int32_t obj, const char *key) { return json_object_get(L->text, L->tok, obj, key) >= 0; }

static colibri_status opt_int(loader *L, int32_t obj, const char *where, const char *key, int64_t lo, int64_t hi,
                              int32_t fallback, int32_t *value)
{
    *value = fallback;
    return has_field(L, obj, key) ? get_int(L, obj, where, key, lo, hi, value) : COLIBRI_OK;
}

static colibri_status opt_float(loader *L, int32_t obj, const char *where, const char *key, double lo, double hi,
                                float fallback, float *value)
{
    *value = fallback;
    return has_field(L, obj, key) ? get_float(L, obj, where, key, lo, hi, value) : COLIBRI_OK;
}

static colibri_status opt_bool(loader *L, int32_t obj, const char *where, const char *key, int32_t *value)
{
    *value = 0;
    return has_field(L, obj, key) ? get_bool(L, obj, where, key, value) : COLIBRI_OK;
}

/* Absent: the table's first value, each enum's default. */
static colibri_status opt_choice(loader *L, int32_t obj, const char *where, const char *key,
                                 const char *const *names, int32_t count, int32_t *value)
{
    *value = 0;
    return has_field(L, obj, key) ? get_choice(L, obj, where, key, names, count, value) : COLIBRI_OK;
}

/* ---- sections ---- */

static colibri_status read_header(loader *L, int32_t root, colibri_model *m)
{
    static const char *const top_keys[] = { "format", "version", "architecture", "hparams", "routing",
                                            "experts", "tokenizer", "metadata", "tensors", NULL };
    int32_t i = 0, choice;
    uint32_t k;
    colibri_status st;

    if (L->tok[root].type != JSON_OBJECT)
        return colibri_fail(L->err, COLIBRI_E_TYPE, "colibri_model.json must hold a JSON object");
    st = get_choice(L, root, "model", "format", CHOICES(formats), &choice);
    if (st == COLIBRI_E_VALUE)
        return colibri_fail(L->err, COLIBRI_E_VERSION, "model.format must be \"colibri\"");
    if (st) return st;
    st = get_field(L, root, "model", "version", JSON_NUMBER, &i);
    if (st) return st;
    {
        int64_t v;
        if (!json_as_int64(L->text, &L->tok[i], &v) || v != COLIBRI_FORMAT_VERSION) {
            char text[32];
            copy_token_text(text, sizeof text, L->text, &L->tok[i]);
            return colibri_fail(L->err, COLIBRI_E_VERSION,
                                "model.version %s is not supported (this build reads version %d)",
                                text, COLIBRI_FORMAT_VERSION);
        }
    }
    st = check_keys(L, root, "model", top_keys);
    if (st) return st;
    /* The family's name, for messages and reports: the hyper-parameters alone decide what the
     * forward pass computes.  Reports print it as is, hence printable and without escapes. */
    st = get_field(L, root, "model", "architecture", JSON_STRING, &i);
    if (st) return st;
    if (L->tok[i].len == 0 || L->tok[i].len >= sizeof m->architecture)
        return colibri_fail(L->err, COLIBRI_E_VALUE, "model.architecture must be 1 to %u characters, not %u",
                            (unsigned)sizeof m->architecture - 1, L->tok[i].len);
    for (k = 0; k < L->tok[i].len; k++) {
        unsigned char c = (unsigned char)L->text[L->tok[i].start + k];
        if (c < 0x20 || c > 0x7e || c == '\\')
            return colibri_fail(L->err, COLIBRI_E_VALUE,
                                "model.architecture must be printable ASCII without escapes (character %u)", k);
    }
    copy_token_text(m->architecture, sizeof m->architecture, L->text, &L->tok[i]);
    i = json_object_get(L->text, L->tok, root, "tokenizer");
    if (i >= 0 && L->tok[i].type != JSON_STRING)
        return colibri_fail(L->err, COLIBRI_E_TYPE, "model.tokenizer must be a string");
    i = json_object_get(L->text, L->tok, root, "metadata");
    if (i >= 0 && L->tok[i].type != JSON_OBJECT)
        return colibri_fail(L->err, COLIBRI_E_TYPE, "model.metadata must be an object");
    return COLIBRI_OK;
}

static colibri_status read_hparams(loader *L, int32_t root, colibri_hparams *hp)
{
    static const char *const keys[] = { "vocab_size", "hidden_size", "intermediate_size", "num_layers",
                                        "num_heads", "num_kv_heads", "head_dim", "max_position_embeddings",
                                        "rope_theta", "rms_norm_eps", "sliding_window",
                                        "tie_word_embeddings", "bos_token_id", "eos_token_id",
                                        "mlp_layers", "attention_layers", "dense_intermediate_size", "attention_bias",
                                        "attention_out_bias", "qk_norm", "rope_dim", "rope_interleaved",
                                        "clip_qkv", "attention_scale", "embedding_multiplier",
                                        "residual_multiplier", "logits_divisor", "rope_scaling",
                                        "attention_sinks", "latent_attention", "norm", "lm_head_bias",
                                        "attention_chunk", "position_layers", "nope_temperature",
                                        "operator_layers", "conv_kernel", "conv_bias", NULL };
    static const char *const temperature_keys[] = { "floor_scale", "attn_scale", NULL };
    static const char *const latent_keys[] = { "q_lora_rank", "kv_lora_rank", "v_head_dim", "norm_eps", NULL };
    static const char *const rope_keys[] = { "type", "factor", "original_max_position_embeddings", "beta_fast",
                                             "beta_slow", "truncate", "attention_factor", "short_mscale",
                                             "long_mscale", "low_freq_factor", "high_freq_factor", NULL };
    static const char *const routing_keys[] = { "type", "top_k", "normalize", "score", "weights", "logit_bias",
                                                "selection_bias", "groups", "topk_groups", "group_score",
                                                "normalize_eps", "scale", "jitter_eps", "gate_on_input", NULL };
    static const char *const expert_keys[] = { "count", "weight_layout", "quantization", "activation", "shared",
                                               "bias", "swiglu_limit", "swiglu_alpha", NULL };
    static const char *const shared_keys[] = { "intermediate_size", "gate", NULL };
    const char *w = "hparams";
    int32_t h = 0, r = 0, e = 0, sh = 0, rs = 0, la = 0, choice = 0;
    colibri_status st;

#define TRY(call) do { st = (call); if (st) return st; } while (0)
    TRY(get_field(L, root, "model", "hparams", JSON_OBJECT, &h));
    TRY(check_keys(L, h, w, keys));
    TRY(get_int(L, h, w, "vocab_size", 1, MAX_VOCAB, &hp->vocab_size));
    TRY(get_int(L, h, w, "hidden_size", 1, MAX_HIDDEN, &hp->hidden_size));
    TRY(get_int(L, h, w, "intermediate_size", 1, MAX_FFN, &hp->intermediate_size));
    TRY(get_int(L, h, w, "num_layers", 1, MAX_LAYERS, &hp->n_layers));
    TRY(get_int(L, h, w, "num_heads", 1, MAX_HEADS, &hp->n_heads));
    TRY(get_int(L, h, w, "num_kv_heads", 1, MAX_HEADS, &hp->n_kv_heads));
    TRY(get_int(L, h, w, "head_dim", 2, MAX_HEAD_DIM, &hp->head_dim));
    TRY(get_int(L, h, w, "max_position_embeddings", 1, MAX_POSITIONS, &hp->max_position_embeddings));
    TRY(get_float(L, h, w, "rope_theta", 0.0, 1e12, &hp->rope_theta));
    TRY(get_float(L, h, w, "rms_norm_eps", 0.0, 1.0, &hp->rms_norm_eps));
    TRY(get_int(L, h, w, "sliding_window", 0, MAX_POSITIONS, &hp->sliding_window));
    TRY(get_bool(L, h, w, "tie_word_embeddings", &hp->tie_word_embeddings));
    TRY(get_int(L, h, w, "bos_token_id", -1, hp->vocab_size - 1, &hp->bos_token_id));
    TRY(get_int(L, h, w, "eos_token_id", -1, hp->vocab_size - 1, &hp->eos_token_id));
    if (hp->n_heads % hp->n_kv_heads != 0)
        return colibri_fail(L->err, COLIBRI_E_VALUE, "hparams.num_heads = %d is not a multiple of num_kv_heads = %d",
                            hp->n_heads, hp->n_kv_heads);
    if (hp->head_dim % 2 != 0)
        return colibri_fail(L->err, COLIBRI_E_VALUE, "hparams.head_dim = %d must be even for RoPE", hp->head_dim);
    if ((int64_t)hp->n_heads * hp->head_dim > MAX_FFN)
        return colibri_fail(L->err, COLIBRI_E_VALUE, "hparams.num_heads * head_dim exceeds %d", MAX_FFN);
    TRY(opt_int(L, h, w, "dense_intermediate_size", 1, MAX_FFN, 0, &hp->dense_intermediate_size));
    TRY(opt_bool(L, h, w, "attention_bias", &hp->attention_bias));
    TRY(opt_bool(L, h, w, "attention_out_bias", &hp->attention_out_bias));
    TRY(opt_choice(L, h, w, "qk_norm", CHOICES(qk_norms), &hp->qk_norm));
    TRY(opt_int(L, h, w, "rope_dim", 2, hp->head_dim, hp->head_dim, &hp->rope_dim));
    if (hp->rope_dim % 2 != 0)
        return colibri_fail(L->err, COLIBRI_E_VALUE, "hparams.rope_dim = %d must be even", hp->rope_dim);
    TRY(opt_bool(L, h, w, "rope_interleaved", &hp->rope_interleaved));
    TRY(opt_float(L, h, w, "clip_qkv", 0.0, 1e30, 0.0f, &hp->clip_qkv));
    TRY(opt_float(L, h, w, "attention_scale", 0.0, 1e6, (float)(1.0 / sqrt((double)hp->head_dim)), &hp->attention_scale));
    TRY(opt_float(L, h, w, "embedding_multiplier", 0.0, 1e6, 1.0f, &hp->embedding_multiplier));
    TRY(opt_float(L, h, w, "residual_multiplier", 0.0, 1e6, 1.0f, &hp->residual_multiplier));
    TRY(opt_float(L, h, w, "logits_divisor", 0.0, 1e6, 1.0f, &hp->logits_divisor));
    TRY(opt_bool(L, h, w, "attention_sinks", &hp->attention_sinks));
    TRY(opt_choice(L, h, w, "norm", CHOICES(norm_kinds), &hp->norm_kind));
    TRY(opt_int(L, h, w, "attention_chunk", 1, MAX_POSITIONS, 0, &hp->attention_chunk));
    TRY(opt_int(L, h, w, "conv_kernel", 1, 64, 0, &hp->conv_kernel));
    TRY(opt_bool(L, h, w, "conv_bias", &hp->conv_bias));
    if (has_field(L, h, "nope_temperature")) {
        int32_t nt = 0;
        TRY(get_field(L, h, w, "nope_temperature", JSON_OBJECT, &nt));
        TRY(check_keys(L, nt, "hparams.nope_temperature", temperature_keys));
        TRY(get_float(L, nt, "hparams.nope_temperature", "floor_scale", 0.0, 1e12, &hp->nope_temperature_floor));
        TRY(get_float(L, nt, "hparams.nope_temperature", "attn_scale", 0.0, 1e6, &hp->nope_temperature_scale));
    }
    TRY(opt_bool(L, h, w, "lm_head_bias", &hp->lm_head_bias));
    if (has_field(L, h, "latent_attention")) {   /* MLA: head_dim = nope + rope dimensions, every head its own key */
        const char *where = "hparams.latent_attention";
        TRY(get_field(L, h, w, "latent_attention", JSON_OBJECT, &la));
        TRY(check_keys(L, la, where, latent_keys));
        TRY(get_int(L, la, where, "q_lora_rank", 0, MAX_FFN, &hp->q_lora_rank));
        TRY(get_int(L, la, where, "kv_lora_rank", 1, MAX_FFN, &hp->kv_lora_rank));
        TRY(get_int(L, la, where, "v_head_dim", 1, MAX_HEAD_DIM, &hp->v_head_dim));
        TRY(get_float(L, la, where, "norm_eps", 0.0, 1.0, &hp->latent_norm_eps));
        if (!has_field(L, h, "rope_dim") || hp->rope_dim >= hp->head_dim || hp->n_kv_heads != hp->n_heads)
            return colibri_fail(L->err, COLIBRI_E_VALUE, "hparams.latent_attention needs rope_dim < head_dim and num_kv_heads = num_heads");
        hp->nope_dim = hp->head_dim - hp->rope_dim;
    }
    hp->rope_attention_factor = 1.0f;
    if (has_field(L, h, "rope_scaling")) {
        const char *where = "hparams.rope_scaling";
        TRY(get_field(L, h, w, "rope_scaling", JSON_OBJECT, &rs));
        TRY(check_keys(L, rs, where, rope_keys));
        TRY(get_choice(L, rs, where, "type", CHOICES(rope_types), &hp->rope_type));
        TRY(opt_float(L, rs, where, "attention_factor", 0.0, 1e6, 1.0f, &hp->rope_attention_factor));
        if (hp->rope_type == COLIBRI_ROPE_YARN) {
            TRY(get_float(L, rs, where, "factor", 0.0, 1e6, &hp->rope_factor));
            TRY(get_int(L, rs, where, "original_max_position_embeddings", 1, MAX_POSITIONS, &hp->rope_original_max));
            TRY(opt_float(L, rs, where, "beta_fast", 0.0, 1e6, 32.0f, &hp->rope_beta_fast));
            TRY(opt_float(L, rs, where, "beta_slow", 0.0, 1e6, 1.0f, &hp->rope_beta_slow));
            hp->rope_truncate = 1;
            if (has_field(L, rs, "truncate")) TRY(get_bool(L, rs, where, "truncate", &hp->rope_truncate));
        } else if (hp->rope_type == COLIBRI_ROPE_LLAMA3) {
            TRY(get_float(L, rs, where, "factor", 0.0, 1e6, &hp->rope_factor));
            TRY(get_int(L, rs, where, "original_max_position_embeddings", 1, MAX_POSITIONS, &hp->rope_original_max));
            TRY(get_float(L, rs, where, "low_freq_factor", 0.0, 1e6, &hp->rope_low_freq_factor));
            TRY(get_float(L, rs, where, "high_freq_factor", 0.0, 1e6, &hp->rope_high_freq_factor));
            if (!(hp->rope_high_freq_factor > hp->rope_low_freq_factor))
                return colibri_fail(L->err, COLIBRI_E_VALUE, "%s: high_freq_factor must exceed low_freq_factor", where);
        } else if (hp->rope_type == COLIBRI_ROPE_LONGROPE) {   /* the per-frequency factors are tensor rope.factors */
            TRY(get_int(L, rs, where, "original_max_position_embeddings", 1, MAX_POSITIONS, &hp->rope_original_max));
            TRY(get_float(L, rs, where, "short_mscale", 0.0, 1e6, &hp->rope_short_mscale));
            TRY(get_float(L, rs, where, "long_mscale", 0.0, 1e6, &hp->rope_long_mscale));
        }
    }

    TRY(get_field(L, root, "model", "routing", JSON_OBJECT, &r));
    TRY(check_keys(L, r, "routing", routing_keys));
    TRY(get_choice(L, r, "routing", "type", CHOICES(routing_types), &choice));
    hp->router_kind = choice == ROUTING_SPARSEMIXER ? COLIBRI_ROUTER_SPARSEMIXER : COLIBRI_ROUTER_TOPK;
    TRY(get_field(L, root, "model", "experts", JSON_OBJECT, &e));
    TRY(check_keys(L, e, "experts", expert_keys));
    TRY(get_int(L, e, "experts", "count", 1, MAX_EXPERTS, &hp->n_experts));
    TRY(get_choice(L, e, "experts", "weight_layout", CHOICES(layouts), &choice));
    TRY(get_choice(L, e, "experts", "quantization", CHOICES(quantizations), &choice));
    TRY(get_choice(L, e, "experts", "activation", CHOICES(gate_names), &choice));
    hp->expert_kind = gates[choice].expert_kind;
    hp->activation = gates[choice].activation;
    TRY(opt_bool(L, e, "experts", "bias", &hp->expert_bias));
    TRY(opt_float(L, e, "experts", "swiglu_limit", 0.0, 1e6, 7.0f, &hp->swiglu_limit));
    TRY(opt_float(L, e, "experts", "swiglu_alpha", 0.0, 1e6, 1.702f, &hp->swiglu_alpha));
    if (has_field(L, e, "shared")) {
        TRY(get_field(L, e, "experts", "shared", JSON_OBJECT, &sh));
        TRY(check_keys(L, sh, "experts.shared", shared_keys));
        TRY(get_int(L, sh, "experts.shared", "intermediate_size", 1, MAX_FFN, &hp->shared_intermediate_size));
        TRY(opt_choice(L, sh, "experts.shared", "gate", CHOICES(shared_gates), &hp->shared_gate));
    }
    TRY(get_int(L, r, "routing", "top_k", 1, MAX_TOP_K, &hp->top_k));
    if (hp->top_k > hp->n_experts)
        return colibri_fail(L->err, COLIBRI_E_VALUE, "routing.top_k = %d exceeds experts.count = %d",
                            hp->top_k, hp->n_experts);
    hp->normalize_topk = 1;
    if (has_field(L, r, "normalize"))
        TRY(get_bool(L, r, "routing", "normalize", &hp->normalize_topk));
    TRY(opt_choice(L, r, "routing", "score", CHOICES(router_scores), &hp->router_score));
    TRY(opt_choice(L, r, "routing", "weights", CHOICES(router_weightings), &hp->router_weights));
    TRY(opt_bool(L, r, "routing", "logit_bias", &hp->router_logit_bias));
    TRY(opt_bool(L, r, "routing", "selection_bias", &hp->router_selection_bias));
    TRY(opt_int(L, r, "routing", "groups", 1, MAX_EXPERTS, 1, &hp->n_groups));
    TRY(opt_int(L, r, "routing", "topk_groups", 1, hp->n_groups, hp->n_groups, &hp->topk_groups));
    TRY(opt_choice(L, r, "routing", "group_score", CHOICES(group_scores), &hp->group_score));
    TRY(opt_float(L, r, "routing", "normalize_eps", -1.0, 1.0, 0.0f, &hp->normalize_eps));
    TRY(opt_float(L, r, "routing", "scale", 0.0, 1e6, 1.0f, &hp->routed_scale));
    TRY(opt_float(L, r, "routing", "jitter_eps", 0.0, 1e6, 0.01f, &hp->jitter_eps));
    TRY(opt_bool(L, r, "routing", "gate_on_input", &hp->gate_on_input));
    if (hp->router_kind == COLIBRI_ROUTER_SPARSEMIXER && hp->top_k != 2)
        return colibri_fail(L->err, COLIBRI_E_VALUE, "routing.top_k = %d: the sparsemixer router chooses 2", hp->top_k);
    if (hp->n_experts % hp->n_groups != 0)
        return colibri_fail(L->err, COLIBRI_E_VALUE, "routing.groups = %d does not divide experts.count = %d",
                            hp->n_groups, hp->n_experts);
    if (hp->top_k > hp->topk_groups * (hp->n_experts / hp->n_groups))
        return colibri_fail(L->err, COLIBRI_E_VALUE, "routing.top_k = %d exceeds the %d experts of the %d chosen groups",
                            hp->top_k, hp->topk_groups * (hp->n_experts / hp->n_groups), hp->topk_groups);
    if (hp->group_score == COLIBRI_GROUP_TOP2_SUM && hp->n_experts / hp->n_groups < 2)
        return colibri_fail(L->err, COLIBRI_E_VALUE, "routing.group_score top2_sum needs 2 experts per group");
#undef TRY
    return COLIBRI_OK;
}

/* An optional per-layer array of strings, each `first` or `second`: flags[l] = 1 for `first`.
 * Absent: every flag stays as it is. */
static colibri_status read_layer_choices(loader *L, int32_t h, const char *key, const char *first, const char *second,
                                         colibri_model *m, size_t flag_offset)
{
    int32_t a = 0, item, l;
    colibri_status st;
    if (!has_field(L, h, key)) return COLIBRI_OK;
    st = get_field(L, h, "hparams", key, JSON_ARRAY, &a);
    if (st) return st;
    if ((int32_t)L->tok[a].n_children != m->hp.n_layers)
        return colibri_fail(L->err, COLIBRI_E_VALUE, "hparams.%s has %u entries for %d layers", key,
                            L->tok[a].n_children, m->hp.n_layers);
    for (l = 0, item = a + 1; l < m->hp.n_layers; l++, item += (int32_t)L->tok[item].subtree) {
        int is_first = L->tok[item].type == JSON_STRING && json_string_equals(L->text, &L->tok[item], first);
        if (!is_first && !(L->tok[item].type == JSON_STRING && json_string_equals(L->text, &L->tok[item], second)))
            return colibri_fail(L->err, COLIBRI_E_VALUE, "hparams.%s[%d] must be \"%s\" or \"%s\"", key, l, first, second);
        *(int32_t *)(void *)((uint8_t *)&m->layers[l] + flag_offset) = is_first;
    }
    return COLIBRI_OK;
}

/* hparams.mlp_layers ("moe" or "dense" per layer; absent: all MoE), attention_layers
 * ("sliding", "full" or "chunked"; absent: all sliding when sliding_window is set) and
 * position_layers ("rope" or "nope"; absent: all rope). */
static colibri_status read_layer_kinds(loader *L, int32_t root, colibri_model *m)
{
    int32_t h = json_object_get(L->text, L->tok, root, "hparams"), l, dense = 0, a = 0, item;
    colibri_status st;
    for (l = 0; l < m->hp.n_layers; l++) {
        m->layers[l].moe = 1;
        m->layers[l].window = m->hp.sliding_window;
        m->layers[l].rope = 1;
    }
    st = read_layer_choices(L, h, "mlp_layers", "moe", "dense", m, offsetof(colibri_layer_weights, moe));
    if (st) return st;
    st = read_layer_choices(L, h, "position_layers", "rope", "nope", m, offsetof(colibri_layer_weights, rope));
    if (st) return st;
    st = read_layer_choices(L, h, "operator_layers", "conv", "attention", m, offsetof(colibri_layer_weights, conv));
    if (st) return st;
    for (l = 0; l < m->hp.n_layers; l++)
        if (m->layers[l].conv && !m->hp.conv_kernel)
            return colibri_fail(L->err, COLIBRI_E_MISSING, "hparams.conv_kernel is missing (layer %d is a convolution)", l);
    if (has_field(L, h, "attention_layers")) {
        st = get_field(L, h, "hparams", "attention_layers", JSON_ARRAY, &a);
        if (st) return st;
        if ((int32_t)L->tok[a].n_children != m->hp.n_layers)
            return colibri_fail(L->err, COLIBRI_E_VALUE, "hparams.attention_layers has %u entries for %d layers",
                                L->tok[a].n_children, m->hp.n_layers);
        for (l = 0, item = a + 1; l < m->hp.n_layers; l++, item += (int32_t)L->tok[item].subtree) {
            int32_t kind = find_name(L->text, &L->tok[item], CHOICES(attention_kinds));
            char list[64];
            if (kind < 0)
                return colibri_fail(L->err, COLIBRI_E_VALUE, "hparams.attention_layers[%d] must be %s", l,
                                    list_names(list, sizeof list, CHOICES(attention_kinds), 1));
            if (kind == ATTENTION_CHUNKED && !m->hp.attention_chunk)
                return colibri_fail(L->err, COLIBRI_E_MISSING, "hparams.attention_chunk is missing (layer %d is chunked)", l);
            m->layers[l].window = kind == ATTENTION_SLIDING ? m->hp.sliding_window : 0;
            m->layers[l].chunk = kind == ATTENTION_CHUNKED ? m->hp.attention_chunk : 0;
        }
    }
    for (l = 0; l < m->hp.n_layers; l++) dense += !m->layers[l].moe;
    if (dense && !m->hp.dense_intermediate_size)
        return colibri_fail(L->err, COLIBRI_E_MISSING, "hparams.dense_intermediate_size is missing (%d dense layers)", dense);
    return COLIBRI_OK;
}

static int is_hex_digit(char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
}

/* One entry of "tensors": fills t and returns its slot. */
static colibri_status read_tensor(loader *L, int32_t obj, uint32_t index, const colibri_model *m,
                                  colibri_tensor *t, int64_t *slot)
{
    const colibri_hparams *hp = &m->hp;
    static const char *const keys[] = { "name", "dtype", "shape", "file_offset", "file_size", "checksum", NULL };
    char where[64];
    int32_t i = 0, shape_tok = 0;
    int64_t expected[4], v;
    int n_expected, choice, overflow = 0;
    uint64_t elements = 1;
    uint32_t d;
    colibri_status st;

    colibri_format(where, sizeof where, "tensors[%u]", index);
    if (L->tok[obj].type != JSON_OBJECT)
        return colibri_fail(L->err, COLIBRI_E_TYPE, "%s must be an object", where);
    st = get_field(L, obj, where, "name", JSON_STRING, &i);
    if (st) return st;
    copy_token_text(t->name, sizeof t->name, L->text, &L->tok[i]);
    *slot = tensor_slot(L->text, &L->tok[i], hp->n_layers);
    if (*slot < 0 || !slot_used(*slot, m))
        return colibri_fail(L->err, COLIBRI_E_TENSOR, "tensor `%s` is not part of a %s model with %d layers%s",
                            t->name, m->architecture, hp->n_layers,
                            *slot == G_LM_HEAD ? " and tied embeddings"
                            : *slot >= T_GLOBAL ? " and these options (docs/FORMAT.md)" : "");
    colibri_format(where, sizeof where, "tensor `%s`", t->name);
    st = check_keys(L, obj, where, keys);
    if (st) return st;

    st = get_field(L, obj, where, "dtype", JSON_STRING, &i);
    if (st) return st;
    for (choice = 0; choice < COLIBRI_DTYPE_COUNT; choice++)
        if (json_string_equals(L->text, &L->tok[i], colibri_dtypes[choice].name)) break;
    if (choice == COLIBRI_DTYPE_COUNT) {
        char text[24], list[96];
        copy_token_text(text, sizeof text, L->text, &L->tok[i]);
        return colibri_fail(L->err, COLIBRI_E_DTYPE, "%s: unknown dtype \"%s\" (expected %s)",
                            where, text, list_dtypes(list, sizeof list, 0));
    }
    t->dtype = (colibri_dtype)choice;
    {
        colibri_dtype need = *slot == G_TOKEN_BYTES ? COLIBRI_DTYPE_U8 : COLIBRI_DTYPE_I32;
        char list[96];
        if (*slot == G_TOKEN_BYTES || *slot == G_TOKEN_OFFSETS ? t->dtype != need : !colibri_dtypes[t->dtype].holds_weights)
            return colibri_fail(L->err, COLIBRI_E_DTYPE, "%s: dtype %s, expected %s", where, colibri_dtype_name(t->dtype),
                                *slot == G_TOKEN_BYTES || *slot == G_TOKEN_OFFSETS ? colibri_dtype_name(need)
                                : list_dtypes(list, sizeof list, 1));
    }

    st = get_field(L, obj, where, "shape", JSON_ARRAY, &shape_tok);
    if (st) return st;
    n_expected = expected_shape(hp, *slot, expected);
    t->n_dims = (int32_t)L->tok[shape_tok].n_children;
    {
        int ok = t->n_dims == n_expected;
        char got[96], want[96];
        size_t gl = 0, wl = 0;
        int32_t dim_tok = shape_tok + 1;
        if (L->tok[shape_tok].n_children > 4)
            return colibri_fail(L->err, COLIBRI_E_SHAPE, "%s: shape has %u dimensions (at most 4)", where,
                                L->tok[shape_tok].n_children);
        for (d = 0; d < L->tok[shape_tok].n_children; d++, dim_tok += (int32_t)L->tok[dim_tok].subtree) {
            const json_token *dim = &L->tok[dim_tok];
            if (!json_as_int64(L->text, dim, &v) || v < 0)
                return colibri_fail(L->err, COLIBRI_E_TYPE, "%s: shape[%u] must be a non-negative integer", where, d);
            if (d < 4) t->shape[d] = v;
            if ((int)d >= n_expected || (v != expected[d] && expected[d] >= 0)) ok = 0;
            elements = colibri_mul_u64(elements, (uint64_t)v, &overflow);
            if (gl < sizeof got) gl += colibri_format(got + gl, sizeof got - gl, d ? ",%lld" : "%lld", (long long)v);
        }
        if (!ok) {
            int k;
            for (k = 0; k < n_expected; k++) {
                if (expected[k] < 0) wl += colibri_format(want + wl, sizeof want - wl, k ? ",n" : "n");
                else wl += colibri_format(want + wl, sizeof want - wl, k ? ",%lld" : "%lld", (long long)expected[k]);
            }
            if (L->tok[shape_tok].n_children == 0) got[0] = '\0';
            return colibri_fail(L->err, COLIBRI_E_SHAPE, "%s: shape [%s] != expected [%s]", where, got, want);
        }
    }

    st = get_field(L, obj, where, "file_offset", JSON_NUMBER, &i);
    if (st) return st;
    if (!json_as_int64(L->text, &L->tok[i], &v) || v < 0)
        return colibri_fail(L->err, COLIBRI_E_TYPE, "%s: file_offset must be a non-negative integer", where);
    t->file_offset = (uint64_t)v;
    st = get_field(L, obj, where, "file_size", JSON_NUMBER, &i);
    if (st) return st;
    if (!json_as_int64(L->text, &L->tok[i], &v) || v < 0)
        return colibri_fail(L->err, COLIBRI_E_TYPE, "%s: file_size must be a non-negative integer", where);
    t->file_size = (uint64_t)v;
    if (colibri_dtype_is_block(t->dtype) && (t->n_dims == 0 || t->shape[t->n_dims - 1] % colibri_dtypes[t->dtype].block != 0))
        return colibri_fail(L->err, COLIBRI_E_SHAPE, "%s: %s rows must be whole blocks: the last dimension (%lld) is not a multiple of %d",
                            where, colibri_dtype_name(t->dtype), t->n_dims ? (long long)t->shape[t->n_dims - 1] : 0LL,
                            (int)colibri_dtypes[t->dtype].block);
    {   /* elements / block blocks: exact, rows are whole blocks */
        uint64_t need = colibri_mul_u64(elements / (uint64_t)colibri_dtypes[t->dtype].block,
                                        (uint64_t)colibri_dtypes[t->dtype].block_bytes, &overflow);
        if (overflow || need != t->file_size)
            return colibri_fail(L->err, COLIBRI_E_SIZE, "%s: file_size %llu != %llu bytes of %s",
                                where, (unsigned long long)t->file_size, (unsigned long long)need,
                                colibri_dtype_name(t->dtype));
    }

    st = get_field(L, obj, where, "checksum", JSON_STRING, &i);
    if (st) return st;
    {
        const json_token *c = &L->tok[i];
        const char *s = L->text + c->start;
        uint32_t crc = 0, k;
        if (c->len != 14 || memcmp(s, "crc32:", 6) != 0)
            return colibri_fail(L->err, COLIBRI_E_VALUE, "%s: checksum must be \"crc32:\" and 8 hex digits", where);
        for (k = 6; k < 14; k++) {
            if (!is_hex_digit(s[k]))
                return colibri_fail(L->err, COLIBRI_E_VALUE, "%s: checksum must be \"crc32:\" and 8 hex digits", where);
            crc = crc << 4 | (uint32_t)(s[k] <= '9' ? s[k] - '0' : s[k] - 'a' + 10);
        }
        t->crc32 = crc;
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

static colibri_status check_overlaps(const colibri_model *m, int32_t *order, colibri_error *err)
{
    int32_t n = m->n_tensors, i;
    for (i = 0; i < n; i++) order[i] = i;
    for (i = n / 2; i-- > 0;) sift_down(m->tensors, order, i, n);
    for (i = n - 1; i > 0; i--) {
        int32_t tmp = order[0]; order[0] = order[i]; order[i] = tmp;
        sift_down(m->tensors, order, 0, i);
    }
    for (i = 1; i < n; i++) {
        const colibri_tensor *a = &m->tensors[order[i - 1]], *b = &m->tensors[order[i]];
        if (a->file_offset + a->file_size > b->file_offset && a->file_size && b->file_size)
            return colibri_fail(err, COLIBRI_E_OVERLAP, "tensor `%s` [%llu, %llu) overlaps tensor `%s` at %llu",
                                a->name, (unsigned long long)a->file_offset,
                                (unsigned long long)(a->file_offset + a->file_size), b->name,
                                (unsigned long long)b->file_offset);
    }
    return COLIBRI_OK;
}

/* Verify mode: the bytes match their CRC and hold no NaN or infinity. */
static colibri_status verify_tensor(const colibri_model *m, const colibri_tensor *t, colibri_error *err)
{
    const uint8_t *p = m->weights + t->file_offset;
    uint64_t i, n;
    uint32_t crc = colibri_crc32(0, p, (size_t)t->file_size);
    if (crc != t->crc32)
        return colibri_fail(err, COLIBRI_E_CHECKSUM, "tensor `%s`: crc32 %x != %x in colibri_model.json",
                            t->name, crc, t->crc32);
    if (colibri_dtype_is_block(t->dtype)) {   /* the quants are integers: only the scales can be inf or nan */
        size_t block = (size_t)colibri_dtypes[t->dtype].block_bytes;
        for (i = 0; i < t->file_size / block; i++) {
            uint16_t bits;
            memcpy(&bits, p + i * block, 2);
            if ((bits & 0x7c00u) == 0x7c00u)
                return colibri_fail(err, COLIBRI_E_VALUE, "tensor `%s`: the scale of block %llu is not finite",
                                    t->name, (unsigned long long)i);
        }
        return COLIBRI_OK;
    }
    if (t->dtype > COLIBRI_DTYPE_BF16) return COLIBRI_OK;   /* integers are always finite */
    n = t->file_size / (uint64_t)colibri_dtypes[t->dtype].block_bytes;
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
                                t->name, (unsigned long long)i);
    }
    return COLIBRI_OK;
}

/* The byte table is data: every offset is checked once here, so decoding can trust it. */
static colibri_status check_vocabulary(colibri_model *m, colibri_error *err)
{
    const colibri_tensor *bytes_t = NULL;
    int32_t i, V = m->hp.vocab_size;
    for (i = 0; i < m->n_tensors; i++)
        if (strcmp(m->tensors[i].name, global_tensor_names[G_TOKEN_BYTES]) == 0) bytes_t = &m->tensors[i];
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

colibri_status colibri_token_bytes(const colibri_model *model, int32_t token, const uint8_t **bytes, size_t *len)
{
    if (!model || !bytes || !len) return COLIBRI_E_ARG;
    if (!model->token_offsets) return COLIBRI_E_TENSOR;
    if (token < 0 || token >= model->hp.vocab_size) return COLIBRI_E_TOKEN;
    *bytes = model->token_bytes + model->token_offsets[token];
    *len = (size_t)(model->token_offsets[token + 1] - model->token_offsets[token]);
    return COLIBRI_OK;
}

/* ---- the metadata block: model struct, tensor table, layer table, JSON tokens ---- */

COLIBRI_SLOT_CHECK(colibri_model, COLIBRI_MODEL_SLOT);
COLIBRI_SLOT_CHECK(colibri_tensor, COLIBRI_TENSOR_SLOT);
COLIBRI_SLOT_CHECK(colibri_layer_weights, COLIBRI_LAYER_SLOT);

typedef struct meta_layout {
    size_t tensors, layers, order, tokens, total;   /* byte offsets */
    uint32_t max_tensors, max_layers;               /* table capacities */
} meta_layout;

static meta_layout layout_for(uint32_t n_tokens)
{
    /* Each tensor entry needs at least 14 tokens and each layer at least 9 tensors (norm,
     * attention, norm, a dense MLP), so n_tokens / 14 bounds both tables without reading the
     * JSON first. */
    uint32_t max_tensors = n_tokens / 14 + 1;
    meta_layout l;
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
    st = json_parse(json, json_len, NULL, 0, &n_tokens, err);
    if (st) return st;
    *meta_bytes = layout_for(n_tokens).total;
    return COLIBRI_OK;
}

colibri_status colibri_model_load(const char *json, size_t json_len, const void *weights, size_t weights_len,
                                  unsigned flags, void *meta, size_t meta_bytes, colibri_model **out,
                                  colibri_error *err)
{
    uint32_t n_tokens, k, n_tensors;
    meta_layout lay;
    colibri_model *m;
    json_token *tokens;
    int32_t *order;
    loader L;
    int32_t tensors_tok = 0, entry;
    colibri_hparams *hp;
    colibri_status st;
    int64_t n_slots;
    uint8_t *seen;

    if (!json || !meta || !out || (!weights && weights_len))
        return colibri_fail(err, COLIBRI_E_ARG, "colibri_model_load: NULL argument");
    *out = NULL;
    if ((uintptr_t)meta % 16 != 0)
        return colibri_fail(err, COLIBRI_E_ARG, "colibri_model_load: meta buffer must be 16-byte aligned");
    if ((uintptr_t)weights % COLIBRI_ALIGNMENT != 0)   /* tensor offsets are aligned relative to it */
        return colibri_fail(err, COLIBRI_E_ALIGN, "colibri_model_load: weights must start at a %d-byte boundary",
                            COLIBRI_ALIGNMENT);
    st = json_parse(json, json_len, NULL, 0, &n_tokens, err);
    if (st) return st;
    lay = layout_for(n_tokens);
    if (meta_bytes < lay.total)
        return colibri_fail(err, COLIBRI_E_NOMEM, "model metadata needs %zu bytes, %zu given", lay.total, meta_bytes);
    memset(meta, 0, lay.total);
    m = (colibri_model *)meta;
    tokens = (json_token *)((uint8_t *)meta + lay.tokens);
    order = (int32_t *)((uint8_t *)meta + lay.order);
    st = json_parse(json, json_len, tokens, n_tokens, &n_tokens, err);
    if (st) return st;

    L.text = json; L.tok = tokens; L.err = err;
    hp = &m->hp;
    st = read_header(&L, 0, m);
    if (st) return st;
    st = read_hparams(&L, 0, hp);
    if (st) return st;

    st = get_field(&L, 0, "model", "tensors", JSON_ARRAY, &tensors_tok);
    if (st) return st;
    n_tensors = tokens[tensors_tok].n_children;
    n_slots = T_GLOBAL + (int64_t)hp->n_layers * L_KINDS;
    /* A valid entry takes at least 14 tokens, so these hold only for a broken tensor table. */
    if (n_tensors > lay.max_tensors || (uint32_t)hp->n_layers > lay.max_layers)
        return colibri_fail(err, COLIBRI_E_TENSOR, "model.tensors lists %u entries for a %d-layer %s model, which has %lld tensors",
                            n_tensors, hp->n_layers, m->architecture, (long long)n_slots);
    m->tensors = (colibri_tensor *)((uint8_t *)meta + lay.tensors);
    m->layers = (colibri_layer_weights *)((uint8_t *)meta + lay.layers);
    m->n_tensors = (int32_t)n_tensors;
    m->weights = (const uint8_t *)weights;
    m->weights_len = weights_len;
    m->meta_bytes = lay.total;

    st = read_layer_kinds(&L, 0, m);
    if (st) return st;
    seen = (uint8_t *)order;   /* one byte per slot; the overlap sort reuses the room later */
    memset(seen, 0, (size_t)n_slots);

    for (k = 0, entry = tensors_tok + 1; k < n_tensors; k++, entry += (int32_t)tokens[entry].subtree) {
        colibri_tensor *t = &m->tensors[k];
        int64_t slot = 0;
        colibri_weight w;
        st = read_tensor(&L, entry, k, m, t, &slot);
        if (st) return st;
        if (seen[slot])
            return colibri_fail(err, COLIBRI_E_TENSOR, "tensor `%s` is listed twice", t->name);
        seen[slot] = 1;
        if (t->file_offset % COLIBRI_ALIGNMENT != 0)
            return colibri_fail(err, COLIBRI_E_ALIGN, "tensor `%s`: file_offset %llu is not a multiple of %d",
                                t->name, (unsigned long long)t->file_offset, COLIBRI_ALIGNMENT);
        if (t->file_offset > weights_len || t->file_size > weights_len - t->file_offset)
            return colibri_fail(err, COLIBRI_E_BOUNDS, "tensor `%s`: bytes [%llu, %llu) lie past the end of weights.bin (%zu bytes)",
                                t->name, (unsigned long long)t->file_offset,
                                (unsigned long long)(t->file_offset + t->file_size), weights_len);
        w.data = m->weights + t->file_offset;
        w.dtype = t->dtype;
        if (slot == G_TOK_EMBEDDINGS) m->tok_embeddings = w;
        else if (slot == G_NORM) m->norm = w;
        else if (slot == G_LM_HEAD) m->lm_head = w;
        else if (slot == G_NORM_BIAS) m->norm_bias = w;
        else if (slot == G_LM_HEAD_BIAS) m->lm_head_bias = w;
        else if (slot == G_ROPE_FACTORS) m->rope_factors = w;
        else if (slot == G_TOKEN_BYTES) m->token_bytes = m->weights + t->file_offset;
        else if (slot == G_TOKEN_OFFSETS) m->token_offsets = (const int32_t *)(const void *)(m->weights + t->file_offset);
        else m->layers[(slot - T_GLOBAL) / L_KINDS].w[(slot - T_GLOBAL) % L_KINDS] = w;
    }
    {
        int64_t s;
        for (s = 0; s < n_slots; s++) {
            if (seen[s] || slot_optional(s) || !slot_used(s, m)) continue;
            if (s < T_GLOBAL)
                return colibri_fail(err, COLIBRI_E_TENSOR, "tensor `%s` is missing", global_tensor_names[s]);
            return colibri_fail(err, COLIBRI_E_TENSOR, "tensor `layers.%lld.%s` is missing",
                                (long long)((s - T_GLOBAL) / L_KINDS),
                                layer_tensor_names[(s - T_GLOBAL) % L_KINDS]);
        }
    }
    if (hp->tie_word_embeddings) m->lm_head = m->tok_embeddings;
    if (seen[G_TOKEN_BYTES] != seen[G_TOKEN_OFFSETS])
        return colibri_fail(err, COLIBRI_E_TENSOR, "tensor `%s` is missing: the vocabulary needs both tokenizer tensors",
                            global_tensor_names[seen[G_TOKEN_BYTES] ? G_TOKEN_OFFSETS : G_TOKEN_BYTES]);
    if (m->token_offsets) {
        st = check_vocabulary(m, err);
        if (st) return st;
    }

    st = check_overlaps(m, order, err);
    if (st) return st;
    if (flags & COLIBRI_LOAD_VERIFY) {
        for (k = 0; k < n_tensors; k++) {
            st = verify_tensor(m, &m->tensors[k], err);
            if (st) return st;
        }
    }
    *out = m;
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
    return COLIBRI_OK;
}

void colibri_model_close(colibri_model *model)
{
    if (model && model->release) model->release(model);
}
