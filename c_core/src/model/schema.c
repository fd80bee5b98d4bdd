/* SPDX-License-Identifier: MIT */
/* colibri_model.json's fields: the typed readers, the choices of the string fields, and the
 * sections that fill colibri_hparams and each layer's kinds.
 *
 * Every field is checked once here, its type and range; a message names the field and what it
 * must be. */
#include <math.h>
#include <string.h>

#include "loader.h"
#include "../util.h"
#include "../ops/ops.h"
#include "../moe/registry.h"

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

/* experts.weight_layout: "contiguous" is the spec's name for stacked (each tensor holds its experts one
 * after another); the converter writes "stacked". */
static const char *const layout_names[] = { "stacked", "interleaved", "contiguous" };
static const int32_t layout_of[] = { COLIBRI_LAYOUT_STACKED, COLIBRI_LAYOUT_INTERLEAVED, COLIBRI_LAYOUT_STACKED };
COLIBRI_TABLE_CHECK(layout_of, COLIBRI_COUNT_OF(layout_names));

/* Fields with a single choice. */
static const char *const formats[] = { "colibri" };
static const char *const quantizations[] = { "none" };   /* experts.quantization as a string: no claim */

/* A table and its length, as the lookups take them. */
#define CHOICES(table) table, (int32_t)COLIBRI_COUNT_OF(table)

/* Index of the string token `t` in names, or -1. */
static int32_t find_name(const char *text, const json_token *t, const char *const *names, int32_t count)
{
    int32_t c;
    for (c = 0; c < count; c++)
        if (colibri_json_string_equals(text, t, names[c])) return c;
    return -1;
}

/* names into buf as `"a", "b" or "c"` (quoted) or `a, b or c`; cut short at cap bytes. */
const char *colibri_list_names(char *buf, size_t cap, const char *const *names, int32_t count, int quoted)
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

/* ---- reading fields ---- */

void colibri_copy_token_text(char *dst, size_t cap, const char *text, const json_token *t)
{
    size_t n = t->len < cap - 1 ? t->len : cap - 1;
    memcpy(dst, text + t->start, n);
    dst[n] = '\0';
}

/* Every key of the object must be in `allowed` (NULL-terminated) and appear once. */
colibri_status colibri_check_keys(loader *L, int32_t obj, const char *where, const char *const *allowed)
{
    uint32_t k, j;
    int32_t key_tok = obj + 1;
    for (k = 0; k < L->tok[obj].n_children; k++, key_tok += 1 + (int32_t)L->tok[key_tok + 1].subtree) {
        const json_token *key = &L->tok[key_tok];
        const char *const *a;
        int32_t earlier = obj + 1;
        for (a = allowed; *a; a++)
            if (colibri_json_string_equals(L->text, key, *a)) break;
        if (!*a) {
            char name[40];
            colibri_copy_token_text(name, sizeof name, L->text, key);
            return colibri_fail(L->err, COLIBRI_E_VALUE, "%s: unknown field \"%s\"", where, name);
        }
        /* only allowed keys get here, so this loop runs over at most a dozen keys before it finds a twin */
        for (j = 0; j < k; j++, earlier += 1 + (int32_t)L->tok[earlier + 1].subtree) {
            if (colibri_json_string_equals(L->text, &L->tok[earlier], *a))
                return colibri_fail(L->err, COLIBRI_E_JSON, "%s: field \"%s\" appears twice", where, *a);
        }
    }
    return COLIBRI_OK;
}

colibri_status colibri_get_field(loader *L, int32_t obj, const char *where, const char *key,
                                 json_type type, int32_t *index)
{
    static const char *const type_names[] = { "an object", "an array", "a string", "a number",
                                              "a boolean", "a boolean", "null" };
    int32_t i = colibri_json_object_get(L->text, L->tok, obj, key);
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
    colibri_status st = colibri_get_field(L, obj, where, key, JSON_NUMBER, &i);
    if (st) return st;
    if (!colibri_json_as_int64(L->text, &L->tok[i], &v)) {
        char text[32];
        colibri_copy_token_text(text, sizeof text, L->text, &L->tok[i]);
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
    colibri_status st = colibri_get_field(L, obj, where, key, JSON_NUMBER, &i);
    if (st) return st;
    colibri_json_as_double(L->text, &L->tok[i], &v);
    /* checked after the conversion to float: 1e-50 is positive but would be stored as 0 */
    if (!(v > lo && v <= hi) || !((float)v >= 1.17549435e-38f)) {
        char text[32];
        colibri_copy_token_text(text, sizeof text, L->text, &L->tok[i]);
        return colibri_fail(L->err, COLIBRI_E_VALUE, "%s.%s = %s is out of range", where, key, text);
    }
    *value = (float)v;
    return COLIBRI_OK;
}

static colibri_status get_bool(loader *L, int32_t obj, const char *where, const char *key, int32_t *value)
{
    int32_t i = 0;
    colibri_status st = colibri_get_field(L, obj, where, key, JSON_TRUE, &i);
    if (st) return st;
    *value = L->tok[i].type == JSON_TRUE;
    return COLIBRI_OK;
}

/* A string field that must be one of names (CHOICES(table)): *choice is its index. */
static colibri_status get_choice(loader *L, int32_t obj, const char *where, const char *key,
                                 const char *const *names, int32_t count, int32_t *choice)
{
    int32_t i = 0;
    char text[40], list[COLIBRI_ERROR_MESSAGE_SIZE];
    colibri_status st = colibri_get_field(L, obj, where, key, JSON_STRING, &i);
    if (st) return st;
    *choice = find_name(L->text, &L->tok[i], names, count);
    if (*choice >= 0) return COLIBRI_OK;
    colibri_copy_token_text(text, sizeof text, L->text, &L->tok[i]);
    return colibri_fail(L->err, COLIBRI_E_VALUE, "%s.%s: unsupported value \"%s\" (expected %s)", where, key, text,
                        colibri_list_names(list, sizeof list, names, count, 1));
}

/* A field naming a registered component (colibri/moe.h) of one kind, the registry's `entry_name`
 * (index) giving each name: *index its index. */
static colibri_status get_component(loader *L, int32_t obj, const char *where, const char *key,
                                    const char *(*entry_name)(int32_t index), int32_t *index)
{
    const char *names[COLIBRI_MOE_REGISTRY_SIZE];
    int32_t count = 0;
    while (count < COLIBRI_MOE_REGISTRY_SIZE && entry_name(count)) {
        names[count] = entry_name(count);
        count++;
    }
    return get_choice(L, obj, where, key, names, count, index);
}

static const char *router_name(int32_t i) { return colibri_moe_router_at(i) ? colibri_moe_router_at(i)->name : NULL; }
static const char *expert_name(int32_t i) { return colibri_moe_expert_at(i) ? colibri_moe_expert_at(i)->name : NULL; }
static const char *aggregator_name(int32_t i)
{
    return colibri_moe_aggregator_at(i) ? colibri_moe_aggregator_at(i)->name : NULL;
}

/* Optional fields: absent means `fallback`; present, the field is checked as a required one. */
static int has_field(loader *L, int32_t obj, const char *key) { return colibri_json_object_get(L->text, L->tok, obj, key) >= 0; }

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

/* Absent: 0, with any range. */
static colibri_status opt_int_any(loader *L, int32_t obj, const char *where, const char *key, int64_t lo, int64_t hi,
                                  int32_t *value)
{
    return opt_int(L, obj, where, key, lo, hi, 0, value);
}

/* Absent: the table's first value, each enum's default. */
static colibri_status opt_choice(loader *L, int32_t obj, const char *where, const char *key,
                                 const char *const *names, int32_t count, int32_t *value)
{
    *value = 0;
    return has_field(L, obj, key) ? get_choice(L, obj, where, key, names, count, value) : COLIBRI_OK;
}

/* ---- sections ---- */

/* Whether number token t's value is exactly 1, however written ("1.0", as the spec's example writes
 * its version, "1.00", "10e-1"): digits (before any exponent) that are zeros and one 1 make a power
 * of ten, and the conversion to double tells 10^0 from every other. */
static int number_is_one(const char *text, const json_token *t)
{
    const char *s = text + t->start;
    uint32_t k, ones = 0, others = 0;
    double v = 0.0;
    for (k = 0; k < t->len && s[k] != 'e' && s[k] != 'E'; k++) {
        ones += s[k] == '1';
        others += s[k] >= '2' && s[k] <= '9';
    }
    return ones == 1 && others == 0 && colibri_json_as_double(text, t, &v) && v == 1.0;
}

colibri_status colibri_read_header(loader *L, int32_t root, colibri_model *m)
{
    static const char *const top_keys[] = { "format", "version", "architecture", "hparams", "routing",
                                            "experts", "tokenizer", "encoder", "metadata", "tensors", NULL };
    int32_t i = 0, choice;
    uint32_t k;
    colibri_status st;

    if (L->tok[root].type != JSON_OBJECT)
        return colibri_fail(L->err, COLIBRI_E_TYPE, "colibri_model.json must hold a JSON object");
    st = get_choice(L, root, "model", "format", CHOICES(formats), &choice);
    if (st == COLIBRI_E_VALUE)
        return colibri_fail(L->err, COLIBRI_E_VERSION, "model.format must be \"colibri\"");
    if (st) return st;
    st = colibri_get_field(L, root, "model", "version", JSON_NUMBER, &i);
    if (st) return st;
    {
        int64_t v = 0;
        if (!colibri_json_as_int64(L->text, &L->tok[i], &v) && number_is_one(L->text, &L->tok[i])) v = 1;
        if (v != COLIBRI_FORMAT_VERSION) {
            char text[32];
            colibri_copy_token_text(text, sizeof text, L->text, &L->tok[i]);
            return colibri_fail(L->err, COLIBRI_E_VERSION,
                                "model.version %s is not supported (this build reads version %d)",
                                text, COLIBRI_FORMAT_VERSION);
        }
    }
    st = colibri_check_keys(L, root, "model", top_keys);
    if (st) return st;
    /* The family's name, for messages and reports: the hyper-parameters alone decide what the
     * forward pass computes.  Reports print it as is, hence printable and without escapes. */
    st = colibri_get_field(L, root, "model", "architecture", JSON_STRING, &i);
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
    colibri_copy_token_text(m->architecture, sizeof m->architecture, L->text, &L->tok[i]);
    i = colibri_json_object_get(L->text, L->tok, root, "tokenizer");
    if (i >= 0 && L->tok[i].type != JSON_STRING)
        return colibri_fail(L->err, COLIBRI_E_TYPE, "model.tokenizer must be a string");
    if (i >= 0) {   /* a file in the model directory: nothing outside it is read as the tokenizer */
        const char *t = L->text + L->tok[i].start;
        uint32_t n = L->tok[i].len, start = 0;
        if (n == 0 || t[0] == '/')
            return colibri_fail(L->err, COLIBRI_E_VALUE, "model.tokenizer must be a relative path in the model directory");
        for (k = 0; k <= n; k++) {
            if (k < n && t[k] == '\\')
                return colibri_fail(L->err, COLIBRI_E_VALUE, "model.tokenizer must be a path without backslashes");
            if (k == n || t[k] == '/') {
                if (k - start == 2 && t[start] == '.' && t[start + 1] == '.')
                    return colibri_fail(L->err, COLIBRI_E_VALUE, "model.tokenizer must not leave the model directory (..)");
                start = k + 1;
            }
        }
    }
    i = colibri_json_object_get(L->text, L->tok, root, "metadata");
    if (i >= 0 && L->tok[i].type != JSON_OBJECT)
        return colibri_fail(L->err, COLIBRI_E_TYPE, "model.metadata must be an object");
    return COLIBRI_OK;
}

colibri_status colibri_read_hparams(loader *L, int32_t root, colibri_hparams *hp)
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
                                                "normalize_eps", "scale", "jitter_eps", "gate_on_input",
                                                "capacity_factor", "aggregator", NULL };
    static const char *const expert_keys[] = { "count", "weight_layout", "quantization", "activation", "shared",
                                               "bias", "swiglu_limit", "swiglu_alpha", "type", NULL };
    static const char *const shared_keys[] = { "intermediate_size", "gate", NULL };
    const char *w = "hparams";
    int32_t h = 0, r = 0, e = 0, sh = 0, rs = 0, la = 0, choice = 0;
    colibri_status st;

#define TRY(call) do { st = (call); if (st) return st; } while (0)
    TRY(colibri_get_field(L, root, "model", "hparams", JSON_OBJECT, &h));
    TRY(colibri_check_keys(L, h, w, keys));
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
        TRY(colibri_get_field(L, h, w, "nope_temperature", JSON_OBJECT, &nt));
        TRY(colibri_check_keys(L, nt, "hparams.nope_temperature", temperature_keys));
        TRY(get_float(L, nt, "hparams.nope_temperature", "floor_scale", 0.0, 1e12, &hp->nope_temperature_floor));
        TRY(get_float(L, nt, "hparams.nope_temperature", "attn_scale", 0.0, 1e6, &hp->nope_temperature_scale));
    }
    TRY(opt_bool(L, h, w, "lm_head_bias", &hp->lm_head_bias));
    if (has_field(L, h, "latent_attention")) {   /* MLA: head_dim = nope + rope dimensions, every head its own key */
        const char *where = "hparams.latent_attention";
        TRY(colibri_get_field(L, h, w, "latent_attention", JSON_OBJECT, &la));
        TRY(colibri_check_keys(L, la, where, latent_keys));
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
        TRY(colibri_get_field(L, h, w, "rope_scaling", JSON_OBJECT, &rs));
        TRY(colibri_check_keys(L, rs, where, rope_keys));
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
    {   /* the largest RoPE angle, max_position_embeddings * the fastest inv_freq (1/theta^(2j/d), divided
         * by YaRN's or Llama 3's factor), stays within 2^31, the range ops/math.c reduces as it always did */
        double limit = 2147483648.0, angle = hp->max_position_embeddings;
        int32_t scaled = hp->rope_type == COLIBRI_ROPE_YARN || hp->rope_type == COLIBRI_ROPE_LLAMA3;
        const char *name = NULL;
        int32_t at = -1;
        if (hp->rope_theta < 1.0f) angle /= hp->rope_theta;
        if (angle > limit) {
            name = "rope_theta";
            at = colibri_json_object_get(L->text, L->tok, h, "rope_theta");
        } else if (scaled && hp->rope_factor < 1.0f && angle / hp->rope_factor > limit) {
            name = "rope_scaling.factor";
            at = colibri_json_object_get(L->text, L->tok, rs, "factor");
        }
        if (name) {
            char text[32];
            colibri_copy_token_text(text, sizeof text, L->text, &L->tok[at]);
            return colibri_fail(L->err, COLIBRI_E_VALUE, "hparams.%s = %s turns RoPE angles past 2^31 within "
                                "max_position_embeddings = %d (needs max_position_embeddings * max(1, 1/rope_theta) "
                                "* max(1, 1/factor) <= 2^31)", name, text, hp->max_position_embeddings);
        }
    }

    TRY(colibri_get_field(L, root, "model", "routing", JSON_OBJECT, &r));
    TRY(colibri_check_keys(L, r, "routing", routing_keys));
    TRY(get_component(L, r, "routing", "type", router_name, &hp->router_kind));
    TRY(colibri_get_field(L, root, "model", "experts", JSON_OBJECT, &e));
    TRY(colibri_check_keys(L, e, "experts", expert_keys));
    TRY(get_int(L, e, "experts", "count", 1, MAX_EXPERTS, &hp->n_experts));
    TRY(get_choice(L, e, "experts", "weight_layout", CHOICES(layout_names), &choice));
    hp->expert_layout = layout_of[choice];
    choice = colibri_json_object_get(L->text, L->tok, e, "quantization");
    if (choice >= 0 && L->tok[choice].type != JSON_OBJECT && L->tok[choice].type != JSON_STRING)
        return colibri_fail(L->err, COLIBRI_E_TYPE, "experts.quantization must be \"none\" or an object "
                            "{\"enabled\", \"bits\", \"group_size\"}");
    if (choice < 0 || L->tok[choice].type == JSON_STRING)   /* absent: get_choice says it is missing */
        TRY(get_choice(L, e, "experts", "quantization", CHOICES(quantizations), &choice));
    /* the object form is checked against the tensors' dtypes once they are read (colibri_check_quantization) */
    TRY(get_choice(L, e, "experts", "activation", CHOICES(gate_names), &choice));
    hp->expert_kind = gates[choice].expert_kind;
    hp->activation = gates[choice].activation;
    if (has_field(L, e, "type")) TRY(get_component(L, e, "experts", "type", expert_name, &hp->expert_kind));
    if (colibri_moe_expert_at(hp->expert_kind) == &colibri_expert_linear && hp->intermediate_size != hp->hidden_size)
        return colibri_fail(L->err, COLIBRI_E_VALUE, "experts.type \"linear\" multiplies by experts.w1 alone: it needs "
                            "intermediate_size = hidden_size (%d != %d)", hp->intermediate_size, hp->hidden_size);
    TRY(opt_bool(L, e, "experts", "bias", &hp->expert_bias));
    TRY(opt_float(L, e, "experts", "swiglu_limit", 0.0, 1e6, 7.0f, &hp->swiglu_limit));
    TRY(opt_float(L, e, "experts", "swiglu_alpha", 0.0, 1e6, 1.702f, &hp->swiglu_alpha));
    if (has_field(L, e, "shared")) {
        TRY(colibri_get_field(L, e, "experts", "shared", JSON_OBJECT, &sh));
        TRY(colibri_check_keys(L, sh, "experts.shared", shared_keys));
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
    TRY(opt_float(L, r, "routing", "capacity_factor", 0.0, 1e6, 0.0f, &hp->capacity_factor));
    hp->aggregator_kind = 0;   /* weighted_sum */
    if (has_field(L, r, "aggregator")) TRY(get_component(L, r, "routing", "aggregator", aggregator_name, &hp->aggregator_kind));
    if (colibri_moe_router_at(hp->router_kind) == &colibri_router_sparsemixer && hp->top_k != 2)
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
    st = colibri_get_field(L, h, "hparams", key, JSON_ARRAY, &a);
    if (st) return st;
    if ((int32_t)L->tok[a].n_children != m->hp.n_layers)
        return colibri_fail(L->err, COLIBRI_E_VALUE, "hparams.%s has %u entries for %d layers", key,
                            L->tok[a].n_children, m->hp.n_layers);
    for (l = 0, item = a + 1; l < m->hp.n_layers; l++, item += (int32_t)L->tok[item].subtree) {
        int is_first = L->tok[item].type == JSON_STRING && colibri_json_string_equals(L->text, &L->tok[item], first);
        if (!is_first && !(L->tok[item].type == JSON_STRING && colibri_json_string_equals(L->text, &L->tok[item], second)))
            return colibri_fail(L->err, COLIBRI_E_VALUE, "hparams.%s[%d] must be \"%s\" or \"%s\"", key, l, first, second);
        *(int32_t *)(void *)((uint8_t *)&m->layers[l] + flag_offset) = is_first;
    }
    return COLIBRI_OK;
}

/* hparams.mlp_layers ("moe" or "dense" per layer; absent: all MoE), attention_layers
 * ("sliding", "full" or "chunked"; absent: all sliding when sliding_window is set) and
 * position_layers ("rope" or "nope"; absent: all rope). */
colibri_status colibri_read_layer_kinds(loader *L, int32_t root, colibri_model *m)
{
    int32_t h = colibri_json_object_get(L->text, L->tok, root, "hparams"), l, dense = 0, a = 0, item;
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
        st = colibri_get_field(L, h, "hparams", "attention_layers", JSON_ARRAY, &a);
        if (st) return st;
        if ((int32_t)L->tok[a].n_children != m->hp.n_layers)
            return colibri_fail(L->err, COLIBRI_E_VALUE, "hparams.attention_layers has %u entries for %d layers",
                                L->tok[a].n_children, m->hp.n_layers);
        for (l = 0, item = a + 1; l < m->hp.n_layers; l++, item += (int32_t)L->tok[item].subtree) {
            int32_t kind = find_name(L->text, &L->tok[item], CHOICES(attention_kinds));
            char list[64];
            if (kind < 0)
                return colibri_fail(L->err, COLIBRI_E_VALUE, "hparams.attention_layers[%d] must be %s", l,
                                    colibri_list_names(list, sizeof list, CHOICES(attention_kinds), 1));
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

/* experts.quantization as an object {enabled, bits, group_size}: what the routed experts' matrices
 * (experts.w1, w3, w2 of every MoE layer) are stored as; their dtypes must agree.  Each (bits,
 * group_size) names one block format; disabled, the matrices are floats (f32, f16 or bf16). */
static const struct { int32_t bits, group_size; colibri_dtype dtype; } block_formats[] = {
    { 8, 32, COLIBRI_DTYPE_Q8_0 }, { 4, 32, COLIBRI_DTYPE_Q4_0 }, { 4, 128, COLIBRI_DTYPE_W4G128 },
};   /* q8_0 and q4_0 with their rows interleaved (q8_0x8, q4_0x8) agree too */

colibri_status colibri_check_quantization(loader *L, int32_t root, const colibri_model *m)
{
    static const char *const keys[] = { "enabled", "bits", "group_size", NULL };
    static const int kinds[] = { L_W1, L_W3, L_W2 };
    const char *where = "experts.quantization";
    int32_t e = colibri_json_object_get(L->text, L->tok, root, "experts"), q, enabled = 0, bits = 0, group = 0, l;
    colibri_dtype want = COLIBRI_DTYPE_F32;
    colibri_status st;
    size_t f, k;
    q = e < 0 ? -1 : colibri_json_object_get(L->text, L->tok, e, "quantization");
    if (q < 0 || L->tok[q].type != JSON_OBJECT) return COLIBRI_OK;   /* "none": no claim */
#define TRY(call) do { st = (call); if (st) return st; } while (0)
    TRY(colibri_check_keys(L, q, where, keys));
    TRY(get_bool(L, q, where, "enabled", &enabled));
    TRY((enabled ? get_int : opt_int_any)(L, q, where, "bits", 1, 64, &bits));
    TRY((enabled ? get_int : opt_int_any)(L, q, where, "group_size", 1, 1 << 20, &group));
#undef TRY
    if (enabled) {
        for (f = 0; f < COLIBRI_COUNT_OF(block_formats); f++)
            if (block_formats[f].bits == bits && block_formats[f].group_size == group) break;
        if (f == COLIBRI_COUNT_OF(block_formats))
            return colibri_fail(L->err, COLIBRI_E_VALUE, "%s: no block format has bits = %d and group_size = %d "
                                "(q8_0: 8 and 32, q4_0: 4 and 32, w4g128: 4 and 128)", where, bits, group);
        want = block_formats[f].dtype;
    }
    for (l = 0; l < m->hp.n_layers; l++)
        for (k = 0; k < COLIBRI_COUNT_OF(kinds); k++) {
            const colibri_weight *w = &m->layers[l].w[kinds[k]];
            if (!w->data || (enabled ? colibri_dtype_plain(w->dtype) == want : !colibri_dtype_is_block(w->dtype))) continue;
            if (enabled)
                return colibri_fail(L->err, COLIBRI_E_VALUE, "%s says %d-bit groups of %d (%s) but tensor `layers.%d.%s` is %s",
                                    where, bits, group, colibri_dtype_name(want), l, colibri_layer_tensor_name(kinds[k]),
                                    colibri_dtype_name(w->dtype));
            return colibri_fail(L->err, COLIBRI_E_VALUE, "%s.enabled is false but tensor `layers.%d.%s` is %s",
                                where, l, colibri_layer_tensor_name(kinds[k]), colibri_dtype_name(w->dtype));
        }
    return COLIBRI_OK;
}
