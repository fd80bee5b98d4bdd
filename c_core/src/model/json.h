/* SPDX-License-Identifier: MIT */
/* A strict RFC 8259 JSON reader that never allocates.
 *
 * The text is tokenised into a caller-provided array (or only counted when the array is
 * NULL).  Each token records its subtree size, so a reader can skip a value in O(1). */
#ifndef COLIBRI_JSON_H
#define COLIBRI_JSON_H

#include <stddef.h>
#include <stdint.h>

#include "colibri/status.h"

#define COLIBRI_JSON_MAX_BYTES  (16u << 20)
#define COLIBRI_JSON_MAX_DEPTH  32
#define COLIBRI_JSON_MAX_TOKENS (1u << 20)

typedef enum json_type {
    JSON_OBJECT, JSON_ARRAY, JSON_STRING, JSON_NUMBER, JSON_TRUE, JSON_FALSE, JSON_NULL
} json_type;

typedef struct json_token {
    uint8_t type;           /* json_type */
    uint32_t start;         /* byte offset of the value (strings: after the quote) */
    uint32_t len;           /* bytes (strings: without quotes, escapes left as written) */
    uint32_t n_children;    /* object: pairs; array: elements */
    uint32_t subtree;       /* tokens in this value, itself included */
} json_token;

/* Tokenises `text`; tokens may be NULL to count only.  On error, err names the line
 * and column. */
colibri_status colibri_json_parse(const char *text, size_t len, json_token *tokens, uint32_t cap,
                                  uint32_t *n_tokens, colibri_error *err);

/* The value of `key` in the object at tokens[obj], or -1. Keys are compared byte-wise. */
int32_t colibri_json_object_get(const char *text, const json_token *tokens, int32_t obj, const char *key);

int colibri_json_string_equals(const char *text, const json_token *t, const char *s);

/* Number conversions; return 0 when the token is not a number of that kind. */
int colibri_json_as_int64(const char *text, const json_token *t, int64_t *value);
int colibri_json_as_double(const char *text, const json_token *t, double *value);

#endif
