/* SPDX-License-Identifier: MIT */
/* Text to token ids with the encoder a model carries (colibri_model.json's "encoder" and the
 * tokenizer.* tensors beside the byte table, docs/FORMAT.md): the tables as text/ reads them, the
 * check that lets encoding trust every index in them, and the encoding.  model/encoder.c reads
 * them from the model and checks them at load; text/ knows nothing of the model or its JSON. */
#ifndef COLIBRI_TOKENIZE_H
#define COLIBRI_TOKENIZE_H

#include <stddef.h>
#include <stdint.h>

#include "colibri/status.h"

enum { COLIBRI_ENCODER_NONE = 0, COLIBRI_ENCODER_BYTE_LEVEL_BPE = 1, COLIBRI_ENCODER_SENTENCEPIECE_BPE = 2 };
/* METASPACE: SentencePiece's words, each from a U+2581 on (sentencepiece_bpe) */
enum { COLIBRI_PRE_GPT2 = 0, COLIBRI_PRE_LLAMA3 = 1, COLIBRI_PRE_DEEPSEEK = 2, COLIBRI_PRE_METASPACE = 3, COLIBRI_PRE_QWEN2 = 4,
       COLIBRI_PRE_COUNT };
enum { COLIBRI_NORM_NONE = 0, COLIBRI_NORM_NFC = 1 };
/* sentencepiece_bpe's U+2581 before a stretch of text: NORMALIZER always (a Prepend normalizer);
 * Metaspace's prepend_scheme: ALWAYS unless it starts with a space, FIRST the same for the text's
 * first stretch only, NEVER */
enum { COLIBRI_PREPEND_NORMALIZER = 0, COLIBRI_PREPEND_ALWAYS = 1, COLIBRI_PREPEND_FIRST = 2, COLIBRI_PREPEND_NEVER = 3 };
/* an added token's flags, tokenizer.added's third column above COLIBRI_ADDED_LENGTH_BITS:
 * LSTRIP / RSTRIP take the whitespace before / after it, NORMALIZED: matched in what the other
 * added tokens leave (the second pass of `tokenizers`), SINGLE_WORD: only with no word character
 * (\w) next to it */
enum { COLIBRI_ADDED_LSTRIP = 1, COLIBRI_ADDED_RSTRIP = 2, COLIBRI_ADDED_NORMALIZED = 4, COLIBRI_ADDED_SINGLE_WORD = 8 };
#define COLIBRI_ADDED_LENGTH_BITS 24

typedef struct colibri_encoder {
    int32_t kind;                   /* COLIBRI_ENCODER_*; NONE: the model runs on ids only */
    int32_t pre_tokenizer;          /* COLIBRI_PRE_*: how text splits into words before BPE */
    int32_t bos;                    /* the id put before every encoding (the tokenizer's template); -1: none */
    int32_t ignore_merges;          /* a word that is a token is that token, merges or not (Llama 3) */
    int32_t normalizer;             /* COLIBRI_NORM_*: byte_level_bpe's text normalized before the pre-tokenizer */
    int32_t prefix_space;           /* byte_level_bpe: a " " before each stretch that does not start with one */
    int32_t prepend;                /* sentencepiece_bpe: COLIBRI_PREPEND_* */
    int32_t split_spaces;           /* sentencepiece_bpe: each U+2581 starts a word (Metaspace's split) */
    int32_t n_vocab_order;
    const int32_t *vocab_order;     /* (n_vocab_order) ignore_merges, sentencepiece_bpe: token ids by their bytes */
    int32_t n_merges, n_added;
    const int32_t *merges;          /* (n_merges, 3) left, right, merged token; row = rank */
    const int32_t *merge_order;     /* (n_merges) the ranks sorted by (left, right) */
    const int32_t *byte_ids;        /* (256) each byte's own token; -1: none (the byte is dropped) */
    const int32_t *added;           /* (n_added, 3) id, offset, length | flags << 24 in added_bytes; longest first */
    const uint8_t *added_bytes;     /* the added tokens' text, matched before BPE */
} colibri_encoder;

/* The vocabulary the ids index (colibri_model's tokenizer.token_bytes and token_offsets, borrowed):
 * token t is bytes [offsets[t], offsets[t + 1]) of `bytes`. */
typedef struct colibri_vocabulary {
    int32_t size;
    const uint8_t *bytes;           /* (offsets[size]) */
    const int32_t *offsets;         /* (size + 1), non-decreasing from 0 */
} colibri_vocabulary;

/* What encoding trusts, checked once (the loader calls it with the encoder's tensors in place and
 * enc->kind set): every id below vocab->size, the sort orders, merged bytes equal to their parts',
 * added tokens inside added_bytes, longest first, and for sentencepiece_bpe every byte's token. */
colibri_status colibri_encoder_check(const colibri_encoder *enc, const colibri_vocabulary *vocab, size_t added_bytes,
                                     colibri_error *err);

/* text[0, len) encoded by enc (checked, kind not NONE): returns the number of ids, of which the
 * first `cap` are written to ids.  No allocation; a few KiB of stack. */
size_t colibri_encode(const colibri_encoder *enc, const colibri_vocabulary *vocab, const uint8_t *text, size_t len,
                      int32_t *ids, size_t cap);

#endif
