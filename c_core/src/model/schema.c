/* SPDX-License-Identifier: MIT */
/* colibri_model.json's fields: the typed readers, the choices of the string fields, the schema
 * table that fills colibri_hparams (and that colibri_schema_field hands to the converter), and
 * each layer's kinds.
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
static const int32_t expert_kind_of_gate[] = {
    [GATE_SILU] = COLIBRI_EXPERT_SWIGLU, [GATE_SWIGLU_CLAMPED] = COLIBRI_EXPERT_SWIGLU_CLAMPED,
    [GATE_GELU] = COLIBRI_EXPERT_SWIGLU, [GATE_GELU_TANH] = COLIBRI_EXPERT_SWIGLU, [GATE_RELU] = COLIBRI_EXPERT_SWIGLU,
};
static const int32_t activation_of_gate[] = {
    [GATE_SILU] = COLIBRI_ACT_SILU, [GATE_SWIGLU_CLAMPED] = COLIBRI_ACT_SILU, [GATE_GELU] = COLIBRI_ACT_GELU,
    [GATE_GELU_TANH] = COLIBRI_ACT_GELU_TANH, [GATE_RELU] = COLIBRI_ACT_RELU,
};
COLIBRI_TABLE_CHECK(gate_names, GATE_KINDS);
COLIBRI_TABLE_CHECK(expert_kind_of_gate, GATE_KINDS);
COLIBRI_TABLE_CHECK(activation_of_gate, GATE_KINDS);

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

static int has_field(loader *L, int32_t obj, const char *key) { return colibri_json_object_get(L->text, L->tok, obj, key) >= 0; }

/* Optional, absent: 0, with any range. */
static colibri_status opt_int_any(loader *L, int32_t obj, const char *where, const char *key, int64_t lo, int64_t hi,
                                  int32_t *value)
{
    *value = 0;
    return has_field(L, obj, key) ? get_int(L, obj, where, key, lo, hi, value) : COLIBRI_OK;
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
                                            "experts", "tokenizer", "encoder", "metadata", "tensors", "weights", NULL };
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

/* ---- the schema of hparams, routing and experts: one row per field ----
 *
 * colibri_read_hparams walks the rows in order.  A section (OBJECT) is looked up and its keys
 * checked against the rows under its path; each field is read, its type and range checked, into
 * colibri_hparams at `dest`.  An absent optional field takes its fallback; the fields of an absent
 * section take theirs, or stay 0 if required.  A rule over several fields is the `then` of the row
 * after which the loader has always checked it, so that of two faults the same one is named.
 * colibri_schema_field hands the rows to the converter. */

typedef struct schema_row {
    colibri_field_info info;
    size_t dest;                     /* offsetof(colibri_hparams, ...): an int32_t, a float for NUMBER */
    const int32_t *map;              /* CHOICE: the value stored for each choice; NULL: the choice's index */
    const int32_t *also_map;         /* CHOICE: non-NULL, a second field set from the choice, at `also` */
    size_t also;
    uint32_t rope_types;             /* bit t: read when hparams.rope_scaling.type is t; 0: always */
    /* CHOICE of a registered component (colibri/moe.h): the registry's names, the index stored;
     * absent, the field is left as it is (0: the first registered, or what an earlier row set) */
    const char *(*component)(int32_t index);
    /* OTHER: its code, given the section it sits in; NULL: read elsewhere (the per-layer lists) */
    colibri_status (*read)(loader *L, int32_t obj, const char *where, const char *key);
    /* a rule over several fields, checked once this row is passed (read, fallen back on or skipped) */
    colibri_status (*then)(loader *L, int32_t root, colibri_hparams *hp);
} schema_row;

/* experts.quantization: "none", or an object checked against the tensors' dtypes once they are read
 * (colibri_check_quantization). */
static colibri_status read_quantization_claim(loader *L, int32_t obj, const char *where, const char *key)
{
    int32_t q = colibri_json_object_get(L->text, L->tok, obj, key), choice = 0;
    if (q >= 0 && L->tok[q].type != JSON_OBJECT && L->tok[q].type != JSON_STRING)
        return colibri_fail(L->err, COLIBRI_E_TYPE, "%s.%s must be \"none\" or an object "
                            "{\"enabled\", \"bits\", \"group_size\"}", where, key);
    if (q < 0 || L->tok[q].type == JSON_STRING)   /* absent: get_choice says it is missing */
        return get_choice(L, obj, where, key, CHOICES(quantizations), &choice);
    return COLIBRI_OK;
}

/* ---- the rules over several fields, each checked where the walk has read what it needs ---- */

static colibri_status check_heads(loader *L, int32_t root, colibri_hparams *hp)
{
    (void)root;
    if (hp->n_heads % hp->n_kv_heads != 0)
        return colibri_fail(L->err, COLIBRI_E_VALUE, "hparams.num_heads = %d is not a multiple of num_kv_heads = %d",
                            hp->n_heads, hp->n_kv_heads);
    if (hp->head_dim % 2 != 0)
        return colibri_fail(L->err, COLIBRI_E_VALUE, "hparams.head_dim = %d must be even for RoPE", hp->head_dim);
    if ((int64_t)hp->n_heads * hp->head_dim > MAX_FFN)
        return colibri_fail(L->err, COLIBRI_E_VALUE, "hparams.num_heads * head_dim exceeds %d", MAX_FFN);
    return COLIBRI_OK;
}

static colibri_status check_rope_dim(loader *L, int32_t root, colibri_hparams *hp)
{
    (void)root;
    if (hp->rope_dim % 2 != 0)
        return colibri_fail(L->err, COLIBRI_E_VALUE, "hparams.rope_dim = %d must be even", hp->rope_dim);
    return COLIBRI_OK;
}

/* Absent, attention_scale is 1/sqrt(head_dim) (present, it is positive). */
static colibri_status default_attention_scale(loader *L, int32_t root, colibri_hparams *hp)
{
    (void)L; (void)root;
    if (hp->attention_scale == 0.0f) hp->attention_scale = (float)(1.0 / sqrt((double)hp->head_dim));
    return COLIBRI_OK;
}

/* MLA: head_dim = nope + rope dimensions, every head its own key. */
static colibri_status check_latent_attention(loader *L, int32_t root, colibri_hparams *hp)
{
    int32_t h = colibri_json_object_get(L->text, L->tok, root, "hparams");
    if (!hp->kv_lora_rank) return COLIBRI_OK;   /* no latent_attention (present, kv_lora_rank >= 1) */
    if (!has_field(L, h, "rope_dim") || hp->rope_dim >= hp->head_dim || hp->n_kv_heads != hp->n_heads)
        return colibri_fail(L->err, COLIBRI_E_VALUE,
                            "hparams.latent_attention needs rope_dim < head_dim and num_kv_heads = num_heads");
    hp->nope_dim = hp->head_dim - hp->rope_dim;
    return COLIBRI_OK;
}

static colibri_status check_rope(loader *L, int32_t root, colibri_hparams *hp)
{
    int32_t h = colibri_json_object_get(L->text, L->tok, root, "hparams");
    int32_t rs = colibri_json_object_get(L->text, L->tok, h, "rope_scaling");
    /* the largest RoPE angle, max_position_embeddings * the fastest inv_freq (1/theta^(2j/d), divided
     * by YaRN's or Llama 3's factor), stays within 2^31, the range ops/math.c reduces as it always did */
    double limit = 2147483648.0, angle = hp->max_position_embeddings;
    int32_t scaled = hp->rope_type == COLIBRI_ROPE_YARN || hp->rope_type == COLIBRI_ROPE_LLAMA3;
    const char *name = NULL;
    int32_t at = -1;
    if (hp->rope_type == COLIBRI_ROPE_LLAMA3 && !(hp->rope_high_freq_factor > hp->rope_low_freq_factor))
        return colibri_fail(L->err, COLIBRI_E_VALUE,
                            "hparams.rope_scaling: high_freq_factor must exceed low_freq_factor");
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
    return COLIBRI_OK;
}

static colibri_status check_top_k(loader *L, int32_t root, colibri_hparams *hp)
{
    (void)root;
    if (hp->top_k > hp->n_experts)
        return colibri_fail(L->err, COLIBRI_E_VALUE, "routing.top_k = %d exceeds experts.count = %d",
                            hp->top_k, hp->n_experts);
    return COLIBRI_OK;
}

static colibri_status check_routing(loader *L, int32_t root, colibri_hparams *hp)
{
    (void)root;
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
    return COLIBRI_OK;
}

/* experts.type "linear" multiplies by w1 alone, (dim, dim). */
static colibri_status check_expert_type(loader *L, int32_t root, colibri_hparams *hp)
{
    (void)root;
    if (colibri_moe_expert_at(hp->expert_kind) == &colibri_expert_linear && hp->intermediate_size != hp->hidden_size)
        return colibri_fail(L->err, COLIBRI_E_VALUE, "experts.type \"linear\" multiplies by experts.w1 alone: it needs "
                            "intermediate_size = hidden_size (%d != %d)", hp->intermediate_size, hp->hidden_size);
    return COLIBRI_OK;
}

/* hparams.eos_token_ids: every id that ends a generation (eos, end of turn, ...), at most
 * COLIBRI_MAX_EOS_TOKENS, each in the vocabulary; absent, eos_token_id alone (none for -1). */
static colibri_status read_eos_token_ids(loader *L, int32_t root, colibri_hparams *hp)
{
    int32_t h = colibri_json_object_get(L->text, L->tok, root, "hparams"), a = 0, item, k, n;
    colibri_status st;
    if (!has_field(L, h, "eos_token_ids")) {
        hp->n_eos_token_ids = hp->eos_token_id >= 0;
        hp->eos_token_ids[0] = hp->eos_token_id;
        return COLIBRI_OK;
    }
    if ((st = colibri_get_field(L, h, "hparams", "eos_token_ids", JSON_ARRAY, &a)) != COLIBRI_OK) return st;
    n = (int32_t)L->tok[a].n_children;
    if (n > COLIBRI_MAX_EOS_TOKENS)
        return colibri_fail(L->err, COLIBRI_E_LIMIT, "hparams.eos_token_ids has %d ids, more than %d", n,
                            COLIBRI_MAX_EOS_TOKENS);
    for (k = 0, item = a + 1; k < n; k++, item += (int32_t)L->tok[item].subtree) {
        int64_t v;
        if (L->tok[item].type != JSON_NUMBER || !colibri_json_as_int64(L->text, &L->tok[item], &v) ||
            v < 0 || v >= hp->vocab_size)
            return colibri_fail(L->err, COLIBRI_E_VALUE, "hparams.eos_token_ids[%d] must be a token id in [0, %d)",
                                k, hp->vocab_size);
        hp->eos_token_ids[k] = (int32_t)v;
    }
    hp->n_eos_token_ids = n;
    return COLIBRI_OK;
}

#define HP(member) offsetof(colibri_hparams, member)
/* .info = { path, type, min, max, max_of, required, fallback, fallback_of, choices, n_choices } */
#define INFO(p, type, lo, hi, required, fallback) \
    .info = { p, COLIBRI_FIELD_##type, lo, hi, NULL, required, fallback, NULL, NULL, 0 }
#define INT(p, lo, hi, m)               INFO(p, INTEGER, lo, hi, 1, 0), .dest = HP(m)
#define INT_OR(p, lo, hi, fallback, m)  INFO(p, INTEGER, lo, hi, 0, fallback), .dest = HP(m)
#define NUM(p, lo, hi, m)               INFO(p, NUMBER, lo, hi, 1, 0), .dest = HP(m)
#define NUM_OR(p, lo, hi, fallback, m)  INFO(p, NUMBER, lo, hi, 0, fallback), .dest = HP(m)
#define BOOL(p, m)                      INFO(p, BOOLEAN, 0, 0, 1, 0), .dest = HP(m)
#define BOOL_OR(p, fallback, m)         INFO(p, BOOLEAN, 0, 0, 0, fallback), .dest = HP(m)
/* an optional choice falls back on its first */
#define CHOICE_ROW(p, names, required, m) .dest = HP(m), \
    .info = { p, COLIBRI_FIELD_CHOICE, 0, 0, NULL, required, 0, NULL, names, (int32_t)COLIBRI_COUNT_OF(names) }
#define CHOICE(p, names, m)             CHOICE_ROW(p, names, 1, m)
#define CHOICE_OR(p, names, m)          CHOICE_ROW(p, names, 0, m)
/* a registered component's name (names: the registry's at load) */
#define COMPONENT_ROW(p, names_of, required, fallback_of, m) .dest = HP(m), .component = names_of, \
    .info = { p, COLIBRI_FIELD_CHOICE, 0, 0, NULL, required, 0, fallback_of, NULL, 0 }
/* lo <= value <= the field `of` + plus */
#define INT_UPTO(p, lo, plus, of, m) .dest = HP(m), \
    .info = { p, COLIBRI_FIELD_INTEGER, lo, plus, of, 1, 0, NULL, NULL, 0 }
/* the same, optional: absent, the field `of` */
#define INT_UPTO_OR_THAT(p, lo, plus, of, m) .dest = HP(m), \
    .info = { p, COLIBRI_FIELD_INTEGER, lo, plus, of, 0, 0, of, NULL, 0 }
#define SECTION(p)     INFO(p, OBJECT, 0, 0, 1, 0)
#define SECTION_OR(p)  INFO(p, OBJECT, 0, 0, 0, 0)
#define LAYER_LIST(p)  INFO(p, OTHER, 0, 0, 0, 0)   /* per layer: colibri_read_layer_kinds */
#define ROPE(type) (1u << COLIBRI_ROPE_##type)

/* In the order the loader reads them, which decides which of two faults a message names. */
static const schema_row fields[] = {
    { SECTION("hparams") },
    { INT("hparams.vocab_size", 1, MAX_VOCAB, vocab_size) },
    { INT("hparams.hidden_size", 1, MAX_HIDDEN, hidden_size) },
    { INT("hparams.intermediate_size", 1, MAX_FFN, intermediate_size) },
    { INT("hparams.num_layers", 1, MAX_LAYERS, n_layers) },
    { INT("hparams.num_heads", 1, MAX_HEADS, n_heads) },
    { INT("hparams.num_kv_heads", 1, MAX_HEADS, n_kv_heads) },
    { INT("hparams.head_dim", 2, MAX_HEAD_DIM, head_dim) },
    { INT("hparams.max_position_embeddings", 1, MAX_POSITIONS, max_position_embeddings) },
    { NUM("hparams.rope_theta", 0.0, 1e12, rope_theta) },
    { NUM("hparams.rms_norm_eps", 0.0, 1.0, rms_norm_eps) },
    { INT("hparams.sliding_window", 0, MAX_POSITIONS, sliding_window) },
    { BOOL("hparams.tie_word_embeddings", tie_word_embeddings) },
    { INT_UPTO("hparams.bos_token_id", -1, -1, "hparams.vocab_size", bos_token_id) },   /* -1: none */
    { INT_UPTO("hparams.eos_token_id", -1, -1, "hparams.vocab_size", eos_token_id), .then = check_heads },
    { INFO("hparams.eos_token_ids", OTHER, 0, 0, 0, 0), .then = read_eos_token_ids },
    { INT_OR("hparams.dense_intermediate_size", 1, MAX_FFN, 0, dense_intermediate_size) },
    { BOOL_OR("hparams.attention_bias", 0, attention_bias) },
    { BOOL_OR("hparams.attention_out_bias", 0, attention_out_bias) },
    { CHOICE_OR("hparams.qk_norm", qk_norms, qk_norm) },
    { INT_UPTO_OR_THAT("hparams.rope_dim", 2, 0, "hparams.head_dim", rope_dim), .then = check_rope_dim },
    { BOOL_OR("hparams.rope_interleaved", 0, rope_interleaved) },
    { NUM_OR("hparams.clip_qkv", 0.0, 1e30, 0, clip_qkv) },
    { NUM_OR("hparams.attention_scale", 0.0, 1e6, 0, attention_scale), .then = default_attention_scale },
    { NUM_OR("hparams.embedding_multiplier", 0.0, 1e6, 1, embedding_multiplier) },
    { NUM_OR("hparams.residual_multiplier", 0.0, 1e6, 1, residual_multiplier) },
    { NUM_OR("hparams.logits_divisor", 0.0, 1e6, 1, logits_divisor) },
    { BOOL_OR("hparams.attention_sinks", 0, attention_sinks) },
    { CHOICE_OR("hparams.norm", norm_kinds, norm_kind) },
    { INT_OR("hparams.attention_chunk", 1, MAX_POSITIONS, 0, attention_chunk) },
    { INT_OR("hparams.conv_kernel", 1, 64, 0, conv_kernel) },
    { BOOL_OR("hparams.conv_bias", 0, conv_bias) },
    { LAYER_LIST("hparams.mlp_layers") },
    { LAYER_LIST("hparams.attention_layers") },
    { LAYER_LIST("hparams.position_layers") },
    { LAYER_LIST("hparams.operator_layers") },
    { SECTION_OR("hparams.nope_temperature") },
    { NUM("hparams.nope_temperature.floor_scale", 0.0, 1e12, nope_temperature_floor) },
    { NUM("hparams.nope_temperature.attn_scale", 0.0, 1e6, nope_temperature_scale) },
    { BOOL_OR("hparams.lm_head_bias", 0, lm_head_bias) },
    { SECTION_OR("hparams.latent_attention") },
    { INT("hparams.latent_attention.q_lora_rank", 0, MAX_FFN, q_lora_rank) },
    { INT("hparams.latent_attention.kv_lora_rank", 1, MAX_FFN, kv_lora_rank) },
    { INT("hparams.latent_attention.v_head_dim", 1, MAX_HEAD_DIM, v_head_dim) },
    { NUM("hparams.latent_attention.norm_eps", 0.0, 1.0, latent_norm_eps), .then = check_latent_attention },
    /* the per-frequency factors of longrope are tensor rope.factors */
    { SECTION_OR("hparams.rope_scaling") },
    { CHOICE("hparams.rope_scaling.type", rope_types, rope_type) },
    { NUM_OR("hparams.rope_scaling.attention_factor", 0.0, 1e6, 1, rope_attention_factor) },
    { NUM("hparams.rope_scaling.factor", 0.0, 1e6, rope_factor), .rope_types = ROPE(YARN) | ROPE(LLAMA3) },
    { INT("hparams.rope_scaling.original_max_position_embeddings", 1, MAX_POSITIONS, rope_original_max),
      .rope_types = ROPE(YARN) | ROPE(LLAMA3) | ROPE(LONGROPE) },
    { NUM_OR("hparams.rope_scaling.beta_fast", 0.0, 1e6, 32, rope_beta_fast), .rope_types = ROPE(YARN) },
    { NUM_OR("hparams.rope_scaling.beta_slow", 0.0, 1e6, 1, rope_beta_slow), .rope_types = ROPE(YARN) },
    { BOOL_OR("hparams.rope_scaling.truncate", 1, rope_truncate), .rope_types = ROPE(YARN) },
    { NUM("hparams.rope_scaling.low_freq_factor", 0.0, 1e6, rope_low_freq_factor), .rope_types = ROPE(LLAMA3) },
    { NUM("hparams.rope_scaling.high_freq_factor", 0.0, 1e6, rope_high_freq_factor), .rope_types = ROPE(LLAMA3) },
    { NUM("hparams.rope_scaling.short_mscale", 0.0, 1e6, rope_short_mscale), .rope_types = ROPE(LONGROPE) },
    { NUM("hparams.rope_scaling.long_mscale", 0.0, 1e6, rope_long_mscale), .rope_types = ROPE(LONGROPE),
      .then = check_rope },

    { SECTION("routing") },
    { COMPONENT_ROW("routing.type", router_name, 1, NULL, router_kind) },
    { SECTION("experts") },
    { INT("experts.count", 1, MAX_EXPERTS, n_experts) },
    { CHOICE("experts.weight_layout", layout_names, expert_layout), .map = layout_of },
    { INFO("experts.quantization", OTHER, 0, 0, 1, 0), .read = read_quantization_claim },
    { CHOICE("experts.activation", gate_names, expert_kind), .map = expert_kind_of_gate,
      .also_map = activation_of_gate, .also = HP(activation) },
    /* absent: the expert experts.activation implies */
    { COMPONENT_ROW("experts.type", expert_name, 0, "experts.activation", expert_kind),
      .then = check_expert_type },
    { BOOL_OR("experts.bias", 0, expert_bias) },
    { NUM_OR("experts.swiglu_limit", 0.0, 1e6, 7, swiglu_limit) },
    { NUM_OR("experts.swiglu_alpha", 0.0, 1e6, 1.702, swiglu_alpha) },
    { SECTION_OR("experts.shared") },
    { INT("experts.shared.intermediate_size", 1, MAX_FFN, shared_intermediate_size) },
    { CHOICE_OR("experts.shared.gate", shared_gates, shared_gate) },
    { INT("routing.top_k", 1, MAX_TOP_K, top_k), .then = check_top_k },
    { BOOL_OR("routing.normalize", 1, normalize_topk) },
    { CHOICE_OR("routing.score", router_scores, router_score) },
    { CHOICE_OR("routing.weights", router_weightings, router_weights) },
    { BOOL_OR("routing.logit_bias", 0, router_logit_bias) },
    { BOOL_OR("routing.selection_bias", 0, router_selection_bias) },
    { INT_OR("routing.groups", 1, MAX_EXPERTS, 1, n_groups) },
    { INT_UPTO_OR_THAT("routing.topk_groups", 1, 0, "routing.groups", topk_groups) },
    { CHOICE_OR("routing.group_score", group_scores, group_score) },
    { NUM_OR("routing.normalize_eps", -1.0, 1.0, 0, normalize_eps) },
    { NUM_OR("routing.scale", 0.0, 1e6, 1, routed_scale) },
    { NUM_OR("routing.jitter_eps", 0.0, 1e6, 0.01, jitter_eps) },
    { BOOL_OR("routing.gate_on_input", 0, gate_on_input) },
    { NUM_OR("routing.capacity_factor", 0.0, 1e6, 0, capacity_factor) },
    { COMPONENT_ROW("routing.aggregator", aggregator_name, 0, NULL, aggregator_kind), .then = check_routing },
};

#undef HP
#undef INFO
#undef INT
#undef INT_OR
#undef NUM
#undef NUM_OR
#undef BOOL
#undef BOOL_OR
#undef CHOICE_ROW
#undef CHOICE
#undef CHOICE_OR
#undef COMPONENT_ROW
#undef INT_UPTO
#undef INT_UPTO_OR_THAT
#undef SECTION
#undef SECTION_OR
#undef LAYER_LIST
#undef ROPE

#define MAX_SECTION_KEYS 48   /* hparams has the most fields: 38 */
#define MAX_SECTIONS 8

int32_t colibri_schema_count(void) { return (int32_t)COLIBRI_COUNT_OF(fields); }

colibri_status colibri_schema_field(int32_t index, colibri_field_info *info)
{
    /* a component row's choices: the names registered when asked (a program may register more) */
    static const char *registered[3][COLIBRI_MOE_REGISTRY_SIZE];
    const char *(*const kinds[3])(int32_t) = { router_name, expert_name, aggregator_name };
    const schema_row *row;
    int32_t k, n = 0;
    if (!info || index < 0 || index >= colibri_schema_count()) return COLIBRI_E_ARG;
    row = &fields[index];
    *info = row->info;
    for (k = 0; k < 3 && row->component; k++) {
        if (row->component != kinds[k]) continue;
        while (n < COLIBRI_MOE_REGISTRY_SIZE && row->component(n)) {
            registered[k][n] = row->component(n);
            n++;
        }
        info->choices = registered[k];
        info->n_choices = n;
    }
    return COLIBRI_OK;
}

static const schema_row *row_at(const char *path)
{
    size_t r;
    for (r = 0; r < COLIBRI_COUNT_OF(fields); r++)
        if (strcmp(fields[r].info.path, path) == 0) return &fields[r];
    return NULL;
}

static int32_t *int_at(colibri_hparams *hp, size_t offset) { return (int32_t *)(void *)((uint8_t *)hp + offset); }

/* The value of the integer field at `path`, read earlier in the walk. */
static int32_t int_field(colibri_hparams *hp, const char *path) { return *int_at(hp, row_at(path)->dest); }

static void store_choice(const schema_row *row, int32_t choice, colibri_hparams *hp)
{
    *int_at(hp, row->dest) = row->map ? row->map[choice] : choice;
    if (row->also_map) *int_at(hp, row->also) = row->also_map[choice];
}

/* The section's keys must be the paths of the rows right under it, each once. */
static colibri_status check_section_keys(loader *L, int32_t obj, const char *section)
{
    const char *keys[MAX_SECTION_KEYS + 1];
    size_t len = strlen(section), r, n = 0;
    for (r = 0; r < COLIBRI_COUNT_OF(fields); r++) {
        const char *path = fields[r].info.path;
        if (strncmp(path, section, len) != 0 || path[len] != '.' || strchr(path + len + 1, '.')) continue;
        if (n == MAX_SECTION_KEYS)
            return colibri_fail(L->err, COLIBRI_E_LIMIT, "%s has more than %d fields", section, MAX_SECTION_KEYS);
        keys[n++] = path + len + 1;
    }
    keys[n] = NULL;
    return colibri_check_keys(L, obj, section, keys);
}

/* One field that is present in section obj (or required there, and missing: get_* says so). */
static colibri_status read_field(loader *L, int32_t obj, const char *where, const char *key, const schema_row *row,
                                 colibri_hparams *hp)
{
    const colibri_field_info *f = &row->info;
    int32_t *value = int_at(hp, row->dest), choice = 0;
    colibri_status st;
    switch (f->type) {
    case COLIBRI_FIELD_INTEGER:
        return get_int(L, obj, where, key, (int64_t)f->min,
                       f->max_of ? (int64_t)f->max + int_field(hp, f->max_of) : (int64_t)f->max, value);
    case COLIBRI_FIELD_NUMBER: return get_float(L, obj, where, key, f->min, f->max, (float *)(void *)value);
    case COLIBRI_FIELD_BOOLEAN: return get_bool(L, obj, where, key, value);
    case COLIBRI_FIELD_CHOICE:
        if (row->component) return get_component(L, obj, where, key, row->component, value);
        st = get_choice(L, obj, where, key, f->choices, f->n_choices, &choice);
        if (!st) store_choice(row, choice, hp);
        return st;
    default: return row->read ? row->read(L, obj, where, key) : COLIBRI_OK;
    }
}

static void take_fallback(const schema_row *row, colibri_hparams *hp)
{
    const colibri_field_info *f = &row->info;
    int32_t *value = int_at(hp, row->dest);
    if (f->type == COLIBRI_FIELD_INTEGER) *value = f->fallback_of ? int_field(hp, f->fallback_of) : (int32_t)f->fallback;
    else if (f->type == COLIBRI_FIELD_NUMBER) *(float *)(void *)value = (float)f->fallback;
    else if (f->type == COLIBRI_FIELD_BOOLEAN) *value = (int32_t)f->fallback;
    else if (f->type == COLIBRI_FIELD_CHOICE && !row->component) store_choice(row, (int32_t)f->fallback, hp);
}

colibri_status colibri_read_hparams(loader *L, int32_t root, colibri_hparams *hp)
{
    struct { const char *path; int32_t tok; } sections[MAX_SECTIONS];   /* tok -1: absent */
    int32_t n_sections = 0, s;
    size_t r;
    colibri_status st;
    for (r = 0; r < COLIBRI_COUNT_OF(fields); r++) {
        const schema_row *row = &fields[r];
        const char *path = row->info.path, *dot = strrchr(path, '.'), *key = dot ? dot + 1 : path;
        const char *where = "model";
        int32_t obj = root, present;
        if (dot) {   /* its section, met earlier in the table */
            size_t len = (size_t)(dot - path);
            for (s = 0; s < n_sections; s++)
                if (strlen(sections[s].path) == len && strncmp(sections[s].path, path, len) == 0) break;
            if (s == n_sections) return colibri_fail(L->err, COLIBRI_E_LIMIT, "schema: %s comes before its section", path);
            where = sections[s].path;
            obj = sections[s].tok;
        }
        present = obj >= 0 && has_field(L, obj, key);
        if (row->rope_types && !(row->rope_types & (1u << hp->rope_type))) {
            /* not this rope type's: left as it is */
        } else if (row->info.type == COLIBRI_FIELD_OBJECT) {
            int32_t tok = -1;
            if (n_sections == MAX_SECTIONS)
                return colibri_fail(L->err, COLIBRI_E_LIMIT, "schema: more than %d sections", MAX_SECTIONS);
            if (present || (obj >= 0 && row->info.required)) {
                st = colibri_get_field(L, obj, where, key, JSON_OBJECT, &tok);
                if (!st) st = check_section_keys(L, tok, path);
                if (st) return st;
            }
            sections[n_sections].path = path;
            sections[n_sections++].tok = tok;
        } else if (present || (obj >= 0 && row->info.required)) {
            st = read_field(L, obj, where, key, row, hp);
            if (st) return st;
        } else if (!row->info.required) {
            take_fallback(row, hp);
        }
        if (row->then) {
            st = row->then(L, root, hp);
            if (st) return st;
        }
    }
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
