/* SPDX-License-Identifier: MIT */
/* See model_files.h. */
#include <stdint.h>

#include "model_files.h"

unsigned char *read_model_file(const char *dir, const char *name, size_t *len, size_t slack)
{
    char path[4096];
    FILE *f;
    unsigned char *data;
    long size;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    f = fopen(path, "rb");
    if (!f || fseek(f, 0, SEEK_END) != 0 || (size = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) return NULL;
    data = malloc((size_t)size + slack);
    if (!data || fread(data + slack, 1, (size_t)size, f) != (size_t)size) return NULL;
    fclose(f);
    *len = (size_t)size;
    return data;
}

static unsigned char *json, *raw, *meta_block;   /* the loaded model's buffers */

void free_model_files(void)
{
    free(json);
    free(raw);
    free(meta_block);
    json = raw = meta_block = NULL;
}

colibri_status load_model_files(const char *dir, unsigned flags, colibri_model **model, colibri_error *err)
{
    size_t json_len, weights_len, meta_bytes, shift;
    unsigned char *meta;
    colibri_status st;
    json = read_model_file(dir, "colibri_model.json", &json_len, 0);
    raw = read_model_file(dir, "weights.bin", &weights_len, 64);
    if (!json || !raw) {
        fprintf(stderr, "cannot read the model files in %s\n", dir);
        return COLIBRI_E_IO;
    }
    shift = (64 - (size_t)((uintptr_t)raw % 64)) % 64;
    memmove(raw + shift, raw + 64, weights_len);
    st = colibri_model_meta_bytes((const char *)json, json_len, &meta_bytes, err);
    if (st) return st;
    if (!(meta_block = malloc(meta_bytes + 16))) return COLIBRI_E_NOMEM;
    meta = meta_block + (16 - (uintptr_t)meta_block % 16) % 16;   /* picolibc's malloc aligns to 8 only */
    return colibri_model_load((const char *)json, json_len, raw + shift, weights_len, flags, meta, meta_bytes, model, err);
}

colibri_status create_session(colibri_model *model, const colibri_session_options *options, colibri_session **s,
                              void **buffer, colibri_error *err)
{
    colibri_session_options so = *options;
    *buffer = NULL;
#ifdef COLIBRI_BARE_METAL
    {
        size_t need;
        colibri_status st = colibri_session_plan(model, &so, &need, err);
        if (st) return st;
        *buffer = malloc(need + 64);
        if (!*buffer) return COLIBRI_E_NOMEM;
        so.arena = (char *)*buffer + (64 - (uintptr_t)*buffer % 64) % 64;
        so.arena_size = need;
    }
#endif
    return colibri_session_create(model, &so, s, err);
}
