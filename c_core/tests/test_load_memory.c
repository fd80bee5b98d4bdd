/* SPDX-License-Identifier: MIT */
/* Loading from memory, the bare-metal way (colibri_model_load): the same model as from the
 * directory, and a clear COLIBRI_E_ALIGN for weights that do not start at a 32-byte boundary.
 *
 *   test_load_memory MODEL_DIR */
#include <string.h>

#include "model_files.h"

int main(int argc, char **argv)
{
    size_t json_len, weights_len, meta_bytes;
    char *json;
    unsigned char *raw;
    const unsigned char *weights;
    unsigned char *meta_block, *meta;
    colibri_model *from_dir, *from_memory;
    colibri_error err;
    colibri_status st;

    if (argc != 2) { fprintf(stderr, "usage: test_load_memory MODEL_DIR\n"); return 2; }
    json = (char *)read_model_file(argv[1], "colibri_model.json", &json_len, 0);
    raw = read_model_file(argv[1], "weights.bin", &weights_len, 128);   /* room to shift the start */
    if (!json || !raw) { fprintf(stderr, "cannot read the model files\n"); return 1; }
    memmove(raw + (64 - (size_t)((unsigned long)(size_t)raw % 64)), raw + 128, weights_len);
    weights = raw + (64 - (size_t)((unsigned long)(size_t)raw % 64));

    if (colibri_model_meta_bytes(json, json_len, &meta_bytes, &err)) { fprintf(stderr, "%s\n", err.message); return 1; }
    meta_block = malloc(meta_bytes + 16);   /* picolibc's malloc aligns to 8 only */
    meta = meta_block + (16 - (uintptr_t)meta_block % 16) % 16;
    st = colibri_model_load(json, json_len, weights, weights_len, COLIBRI_LOAD_VERIFY, meta, meta_bytes, &from_memory, &err);
    if (st) { fprintf(stderr, "aligned load: %s\n", err.message); return 1; }
#ifdef COLIBRI_BARE_METAL
    /* no file system: opening a directory is refused with a message that says what to do */
    st = colibri_model_open(argv[1], 0, &from_dir, &err);
    if (st != COLIBRI_E_IO || !strstr(err.message, "colibri_model_load")) {
        fprintf(stderr, "colibri_model_open on bare metal gave %s: %s\n", colibri_status_name(st), err.message);
        return 1;
    }
#else
    if (colibri_model_open(argv[1], 0, &from_dir, &err)) { fprintf(stderr, "%s\n", err.message); return 1; }
    if (colibri_model_tensor_count(from_dir) != colibri_model_tensor_count(from_memory) ||
        colibri_model_weight_bytes(from_dir) != colibri_model_weight_bytes(from_memory)) {
        fprintf(stderr, "the model loaded from memory differs from the directory's\n");
        return 1;
    }
    colibri_model_close(from_dir);
#endif
    st = colibri_model_load(json, json_len, weights + 2, weights_len, 0, meta, meta_bytes, &from_memory, &err);
    if (st != COLIBRI_E_ALIGN || !strstr(err.message, "32-byte boundary")) {
        fprintf(stderr, "misaligned weights gave %s: %s\n", colibri_status_name(st), err.message);
        return 1;
    }
    printf("loaded from memory with checksums; misaligned weights refused: %s\n", err.message);
    free(meta_block);
    free(json);
    free(raw);
    return 0;
}
