/* SPDX-License-Identifier: MIT */
/* The model's encoder: colibri_model.json's "encoder" object read into the tables text/ encodes
 * with (the loader set their pointers from the tensor table), checked there once, and
 * colibri_tokenize, which encodes with them. */
#include <string.h>

#include "loader.h"
#include "../text/tokenize.h"
#include "../util.h"

/* The model's vocabulary as text/ reads it. */
static colibri_vocabulary vocabulary_of(const colibri_model *m)
{
    colibri_vocabulary v;
    v.size = m->hp.vocab_size;
    v.bytes = m->token_bytes;
    v.offsets = m->token_offsets;
    return v;
}

/* ---- loading: the "encoder" object ---- */

static const char *const pre_names[] = { [COLIBRI_PRE_GPT2] = "gpt2", [COLIBRI_PRE_LLAMA3] = "llama3",
                                         [COLIBRI_PRE_DEEPSEEK] = "deepseek", [COLIBRI_PRE_METASPACE] = "metaspace",
                                         [COLIBRI_PRE_QWEN2] = "qwen2" };
COLIBRI_TABLE_CHECK(pre_names, COLIBRI_PRE_COUNT);

static colibri_status read_flag(loader *L, int32_t obj, const char *key, int32_t *flag)
{
    int32_t i = colibri_json_object_get(L->text, L->tok, obj, key);
    if (i >= 0 && L->tok[i].type != JSON_TRUE && L->tok[i].type != JSON_FALSE)
        return colibri_fail(L->err, COLIBRI_E_TYPE, "model.encoder.%s must be a boolean", key);
    *flag = i >= 0 && L->tok[i].type == JSON_TRUE;
    return COLIBRI_OK;
}

/* byte_level_bpe's "normalizer" and "prefix_space", sentencepiece_bpe's "prepend_scheme" and "split". */
static colibri_status read_options(loader *L, int32_t obj, int32_t kind, colibri_encoder *enc, const char *const *schemes)
{
    int spm = kind == COLIBRI_ENCODER_SENTENCEPIECE_BPE;
    int32_t i = colibri_json_object_get(L->text, L->tok, obj, "normalizer"), k;
    colibri_status st;
    enc->normalizer = COLIBRI_NORM_NONE;
    if (i >= 0) {
        if (spm || L->tok[i].type != JSON_STRING || !colibri_json_string_equals(L->text, &L->tok[i], "nfc"))
            return colibri_fail(L->err, COLIBRI_E_VALUE, "model.encoder.normalizer must be \"nfc\" (byte_level_bpe only)");
        enc->normalizer = COLIBRI_NORM_NFC;
    }
    enc->prepend = COLIBRI_PREPEND_NORMALIZER;
    i = colibri_json_object_get(L->text, L->tok, obj, "prepend_scheme");
    if (i >= 0) {
        for (k = 0; schemes[k] && (L->tok[i].type != JSON_STRING || !colibri_json_string_equals(L->text, &L->tok[i], schemes[k])); k++) {}
        if (!spm || !schemes[k])
            return colibri_fail(L->err, COLIBRI_E_VALUE, "model.encoder.prepend_scheme must be \"always\", \"first\" or "
                                "\"never\" (sentencepiece_bpe only)");
        enc->prepend = COLIBRI_PREPEND_ALWAYS + k;
    }
    if ((st = read_flag(L, obj, "prefix_space", &enc->prefix_space)) || (st = read_flag(L, obj, "split", &enc->split_spaces)))
        return st;
    if ((enc->prefix_space && spm) || (enc->split_spaces && !spm))
        return colibri_fail(L->err, COLIBRI_E_VALUE, "model.encoder: prefix_space goes with byte_level_bpe, split with "
                            "sentencepiece_bpe");
    return COLIBRI_OK;
}

colibri_status colibri_read_encoder(loader *L, int32_t root, colibri_model *m)
{
    static const char *const keys[] = { "kind", "pre_tokenizer", "bos", "ignore_merges", "normalizer", "prefix_space",
                                        "prepend_scheme", "split", NULL };
    static const char *const schemes[] = { "always", "first", "never", NULL };
    colibri_encoder *enc = &m->enc;
    int32_t obj = colibri_json_object_get(L->text, L->tok, root, "encoder"), i, k, kind = COLIBRI_ENCODER_BYTE_LEVEL_BPE;
    size_t added_bytes = 0, n_merge_order = 0;
    colibri_vocabulary vocab = vocabulary_of(m);
    int64_t v;
    colibri_status st;
    for (k = 0; k < m->n_tensors; k++) {
        if (m->tensors[k].slot == G_ADDED_BYTES) added_bytes = (size_t)m->tensors[k].shape[0];
        if (m->tensors[k].slot == G_MERGE_ORDER) n_merge_order = (size_t)m->tensors[k].shape[0];
    }
    if (obj < 0) {
        if (enc->merges || enc->merge_order || enc->byte_ids || enc->added || enc->added_bytes || enc->vocab_order)
            return colibri_fail(L->err, COLIBRI_E_TENSOR, "the model carries encoder tensors (tokenizer.merges, ...) but no \"encoder\"");
        enc->kind = COLIBRI_ENCODER_NONE;
        return COLIBRI_OK;
    }
    if (L->tok[obj].type != JSON_OBJECT) return colibri_fail(L->err, COLIBRI_E_TYPE, "model.encoder must be an object");
    st = colibri_check_keys(L, obj, "model.encoder", keys);
    if (st) return st;
    st = colibri_get_field(L, obj, "model.encoder", "kind", JSON_STRING, &i);
    if (st) return st;
    if (colibri_json_string_equals(L->text, &L->tok[i], "sentencepiece_bpe")) kind = COLIBRI_ENCODER_SENTENCEPIECE_BPE;
    else if (!colibri_json_string_equals(L->text, &L->tok[i], "byte_level_bpe"))
        return colibri_fail(L->err, COLIBRI_E_VALUE, "model.encoder.kind must be \"byte_level_bpe\" or \"sentencepiece_bpe\"");
    st = colibri_get_field(L, obj, "model.encoder", "pre_tokenizer", JSON_STRING, &i);
    if (st) return st;
    for (k = 0; k < COLIBRI_PRE_COUNT; k++)
        if (colibri_json_string_equals(L->text, &L->tok[i], pre_names[k])) break;
    if (k == COLIBRI_PRE_COUNT)
        return colibri_fail(L->err, COLIBRI_E_VALUE, "model.encoder.pre_tokenizer must be \"gpt2\", \"llama3\", \"deepseek\", "
                            "\"qwen2\" or \"metaspace\"");
    enc->pre_tokenizer = k;
    if ((kind == COLIBRI_ENCODER_SENTENCEPIECE_BPE) != (k == COLIBRI_PRE_METASPACE))
        return colibri_fail(L->err, COLIBRI_E_VALUE, "model.encoder: pre_tokenizer \"metaspace\" goes with kind "
                            "\"sentencepiece_bpe\", and only with it");
    st = colibri_get_field(L, obj, "model.encoder", "bos", JSON_NUMBER, &i);
    if (st) return st;
    if (!colibri_json_as_int64(L->text, &L->tok[i], &v) || v < -1 || v >= m->hp.vocab_size)
        return colibri_fail(L->err, COLIBRI_E_VALUE, "model.encoder.bos must be -1 or a token id below %d",
                            m->hp.vocab_size);
    enc->bos = (int32_t)v;
    st = read_flag(L, obj, "ignore_merges", &enc->ignore_merges);
    if (!st) st = read_options(L, obj, kind, enc, schemes);
    if (st) return st;
    if ((enc->ignore_merges || kind == COLIBRI_ENCODER_SENTENCEPIECE_BPE) != (enc->vocab_order != NULL))
        return colibri_fail(L->err, COLIBRI_E_TENSOR, "tensor `tokenizer.vocab_order` goes with model.encoder.ignore_merges "
                            "or kind \"sentencepiece_bpe\", and only with them");
    if (!m->token_offsets || !enc->merges || !enc->merge_order || !enc->byte_ids)
        return colibri_fail(L->err, COLIBRI_E_TENSOR, "model.encoder needs tensors tokenizer.token_bytes, token_offsets, "
                            "merges, merge_order and byte_ids");
    if (!enc->added != !enc->added_bytes)
        return colibri_fail(L->err, COLIBRI_E_TENSOR, "tensors tokenizer.added and tokenizer.added_bytes go together");
    if (n_merge_order != (size_t)enc->n_merges)
        return colibri_fail(L->err, COLIBRI_E_SHAPE, "tensor `tokenizer.merge_order`: %zu entries for %d merges",
                            n_merge_order, enc->n_merges);
    enc->kind = kind;   /* what the check checks against; a model that fails it is not loaded */
    return colibri_encoder_check(enc, &vocab, added_bytes, L->err);
}

/* ---- encoding ---- */

colibri_status colibri_tokenize_bos(const colibri_model *model, const char *text, size_t len, int32_t bos,
                                    int32_t *ids, size_t cap, size_t *n, colibri_error *err)
{
    colibri_vocabulary vocab;
    colibri_encoder enc;
    if (!model || !n || (!text && len) || (!ids && cap))
        return colibri_fail(err, COLIBRI_E_ARG, "colibri_tokenize: NULL argument");
    if (model->enc.kind == COLIBRI_ENCODER_NONE)
        return colibri_fail(err, COLIBRI_E_TENSOR, "this model carries no encoder: reconvert it with colibri convert");
    enc = model->enc;
    if (bos == COLIBRI_BOS_NONE) enc.bos = -1;
    else if (bos == COLIBRI_BOS_ADD) {
        if (enc.bos < 0) enc.bos = model->hp.bos_token_id;   /* the model's, where its template puts none */
        if (enc.bos < 0) return colibri_fail(err, COLIBRI_E_ARG, "colibri_tokenize: the model has no BOS token to add");
    } else if (bos != COLIBRI_BOS_DEFAULT)
        return colibri_fail(err, COLIBRI_E_ARG, "colibri_tokenize: bos = %d is none of COLIBRI_BOS_*", bos);
    vocab = vocabulary_of(model);
    *n = colibri_encode(&enc, &vocab, (const uint8_t *)text, len, ids, cap);
    if (*n > cap)
        return colibri_fail(err, COLIBRI_E_ARG, "colibri_tokenize: the text is %zu tokens, ids holds %zu", *n, cap);
    return COLIBRI_OK;
}

colibri_status colibri_tokenize(const colibri_model *model, const char *text, size_t len, int32_t *ids, size_t cap,
                                size_t *n, colibri_error *err)
{
    return colibri_tokenize_bos(model, text, len, COLIBRI_BOS_DEFAULT, ids, cap, n, err);
}
