/* SPDX-License-Identifier: MIT */
/* colibri-model-image: writes the one model-specific file of a firmware image, an assembly
 * file holding the model (into flash), the static RAM block (into .bss) sized by the core's
 * own plan, the stack budget and the session shape.  It runs on the build machine; the
 * arena and metadata layouts are the same on every target (c_core/src/util.h, slots), so
 * the sizes it computes here are exact for the board.
 *
 *   colibri-model-image MODEL_DIR N_CTX N_BATCH STACK_BYTES EXPERT_BUDGET KV_TYPE OUT.S [SECTION]
 *   colibri-model-image --plan MODEL_DIR N_CTX N_BATCH STACK_BYTES EXPERT_BUDGET KV_TYPE
 *
 * KV_TYPE: what the session's KV cache stores, f32, f16 or q8_0 (colibri_session_options.kv_type).
 *
 * SECTION: the model's section, .rodata.colibri_fw_model (with the code's constants) unless the
 * board keeps its model in a flash of its own (a cross file's colibri_model_flash names the
 * section its linker places there).
 *
 * EXPERT_BUDGET 0: the whole weights.bin goes into flash.  Otherwise the image streams its
 * routed experts: flash holds weights.bin's resident prefix only (interleaved layout,
 * docs/FORMAT.md), the arena holds EXPERT_BUDGET bytes of cache slots, and the image reads the
 * extents from storage at run time.  --plan prints the sizes (key: value lines) instead of
 * writing the file: what `colibri firmware plan` reports is what the image gets. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "colibri/colibri.h"

static size_t align64(size_t n) { return (n + 63) / 64 * 64; }

static int fail(const char *what, const colibri_error *err)
{
    fprintf(stderr, "colibri-model-image: %s: %s\n", what, err->message);
    return 1;
}

/* A KV cache type by name; -1: none. */
static int kv_type_named(const char *name)
{
    if (strcmp(name, "f32") == 0) return COLIBRI_DTYPE_F32;
    if (strcmp(name, "f16") == 0) return COLIBRI_DTYPE_F16;
    if (strcmp(name, "q8_0") == 0) return COLIBRI_DTYPE_Q8_0;
    return -1;
}

static long file_size(const char *path)
{
    FILE *f = fopen(path, "rb");
    long n;
    if (!f || fseek(f, 0, SEEK_END) != 0) { if (f) fclose(f); return -1; }
    n = ftell(f);
    fclose(f);
    return n;
}

/* Where the first routed-expert extent begins, after which weights.bin holds only extents:
 * the bytes a streaming image links; and how many layers have routed experts.  0 and a
 * message when the model has no such prefix. */
static uint64_t resident_prefix(const colibri_model *model, const char *dir, uint64_t *moe_layers)
{
    colibri_tensor_info t;
    uint64_t first = UINT64_MAX, resident_end = 0;
    const char *last = "";
    size_t n;
    int32_t i;
    *moe_layers = 0;
    if (colibri_model_hparams(model)->expert_layout != COLIBRI_LAYOUT_INTERLEAVED) {
        fprintf(stderr, "colibri-model-image: %s: streaming experts needs the interleaved layout "
                        "(colibri convert --layout interleaved)\n", dir);
        return 0;
    }
    for (i = 0; i < colibri_model_tensor_count(model); i++) {
        if (colibri_model_tensor(model, i, &t) != COLIBRI_OK) return 0;
        if (t.expert_stride) {
            n = strlen(t.name);
            *moe_layers += n > 11 && strcmp(t.name + n - 11, ".experts.w1") == 0;
            if (t.file_offset < first) first = t.file_offset;
        } else if (t.file_offset + t.file_size > resident_end) {
            resident_end = t.file_offset + t.file_size;
            last = t.name;
        }
    }
    if (first == UINT64_MAX || resident_end > first) {
        fprintf(stderr, "colibri-model-image: %s: tensor `%s` lies after the first expert extent, so weights.bin "
                        "has no resident prefix: convert it again\n", dir, last);
        return 0;
    }
    return first;
}

int main(int argc, char **argv)
{
    char json_path[4096], weights_path[4096], *json;
    const char *dir;
    long json_len, weights_len, n_ctx, n_batch, stack;
    int kv_type;
    unsigned long long budget;
    uint64_t slot_bytes = 0, min_budget = 0, flash_weights, moe_layers = 0, slots = 0;
    size_t meta, arena, ram;
    colibri_model *model;
    colibri_session_options so;
    colibri_error err;
    FILE *f, *out;
    int plan_only = argc == 8 && strcmp(argv[1], "--plan") == 0;
    const char *section = argc == 9 ? argv[8] : ".rodata.colibri_fw_model";

    if (plan_only) argv++;
    else if ((argc != 8 && argc != 9) || strpbrk(section, "\" \\\n,")) {
        fprintf(stderr, "usage: colibri-model-image MODEL_DIR N_CTX N_BATCH STACK_BYTES EXPERT_BUDGET KV_TYPE OUT.S [SECTION]\n"
                        "       colibri-model-image --plan MODEL_DIR N_CTX N_BATCH STACK_BYTES EXPERT_BUDGET KV_TYPE\n");
        return 2;
    }
    dir = argv[1];
    if (strpbrk(dir, "\"\\\n")) {
        fprintf(stderr, "colibri-model-image: %s: the path may not hold quotes, backslashes or newlines\n", dir);
        return 2;
    }
    n_ctx = atol(argv[2]); n_batch = atol(argv[3]); stack = atol(argv[4]); budget = strtoull(argv[5], NULL, 10);
    if ((kv_type = kv_type_named(argv[6])) < 0) {
        fprintf(stderr, "colibri-model-image: KV_TYPE %s: f32, f16 or q8_0\n", argv[6]);
        return 2;
    }
    if (stack < 1024 || stack % 8) {
        fprintf(stderr, "colibri-model-image: stack of %ld bytes: at least 1024, a multiple of 8\n", stack);
        return 2;
    }
    snprintf(json_path, sizeof json_path, "%s/colibri_model.json", dir);
    snprintf(weights_path, sizeof weights_path, "%s/weights.bin", dir);
    weights_len = file_size(weights_path);

    /* the core validates the model and plans its metadata and session as the board will: as stored,
     * since an image runs its model's bytes as the file has them (no repack at open) */
    if (colibri_model_open(dir, COLIBRI_LOAD_AS_STORED | (plan_only ? 0u : COLIBRI_LOAD_VERIFY), &model, &err))
        return fail(dir, &err);
    memset(&so, 0, sizeof so);
    so.n_ctx = (int32_t)n_ctx;
    so.n_batch = (int32_t)n_batch;
    so.kv_type = (colibri_dtype)kv_type;
    if (colibri_expert_slots(model, &so, &slot_bytes, &min_budget, &err) != COLIBRI_OK) slot_bytes = min_budget = 0;
    flash_weights = (uint64_t)weights_len;
    if (budget) {
        if (!slot_bytes) return fail("--expert-budget", &err);   /* no routed experts */
        if (budget < min_budget) {
            fprintf(stderr, "colibri-model-image: an expert budget of %llu bytes is below the minimum of %llu "
                            "(top_k slots of %llu bytes)\n", budget, (unsigned long long)min_budget,
                    (unsigned long long)slot_bytes);
            return 1;
        }
        if (!(flash_weights = resident_prefix(model, dir, &moe_layers))) return 1;
        so.expert_budget = budget;
        slots = budget / slot_bytes;   /* the pool as the core sizes it: whole slots, at most one per expert */
        if (slots > moe_layers * (uint64_t)colibri_model_hparams(model)->n_experts)
            slots = moe_layers * (uint64_t)colibri_model_hparams(model)->n_experts;
    }
    if (colibri_session_plan(model, &so, &arena, &err)) return fail("session", &err);
    colibri_model_close(model);

    json_len = file_size(json_path);
    if (json_len <= 0 || weights_len < 0 || !(json = malloc((size_t)json_len)) || !(f = fopen(json_path, "rb"))) {
        fprintf(stderr, "colibri-model-image: cannot read %s\n", json_path);
        return 1;
    }
    if (fread(json, 1, (size_t)json_len, f) != (size_t)json_len) { fprintf(stderr, "short read: %s\n", json_path); return 1; }
    fclose(f);
    if (colibri_model_meta_bytes(json, (size_t)json_len, &meta, &err)) return fail(json_path, &err);
    free(json);
    meta = align64(meta);
    arena = align64(arena);
    ram = meta + arena;
    if (ram > 0xFFFFFFFFu || flash_weights + (unsigned long)json_len > 0xFFFFFFFFu) {
        fprintf(stderr, "colibri-model-image: %s needs more than 4 GiB\n", dir);
        return 1;
    }

    if (plan_only) {
        printf("metadata: %zu\narena: %zu\nmodel_flash: %zu\nweights_flash: %llu\nstreamed: %llu\n"
               "expert_budget: %llu\nexpert_slot_bytes: %llu\nexpert_min_budget: %llu\nexpert_slots: %llu\n",
               meta, arena, align64((size_t)flash_weights + (size_t)json_len), (unsigned long long)flash_weights,
               (unsigned long long)((uint64_t)weights_len - flash_weights), budget, (unsigned long long)slot_bytes,
               (unsigned long long)min_budget, (unsigned long long)slots);
        return 0;
    }
    if (!(out = fopen(argv[7], "w"))) { fprintf(stderr, "colibri-model-image: cannot write %s\n", argv[7]); return 1; }
    fprintf(out,
            "/* Generated by colibri-model-image from %s, n_ctx %ld, n_batch %ld, expert budget %llu, kv cache %s. */\n"
            "    .section .rodata.colibri_fw_image, \"a\"\n"
            "    .balign 4\n"
            "    .global colibri_fw_image\n"
            "colibri_fw_image:   /* fw_image: n_ctx, n_batch, meta, arena, weights, json, stack, expert budget, kv type */\n"
            "    .4byte %ld, %ld, %zu, %zu, %llu, %ld, %ld, %llu, %d\n"
            "    .size colibri_fw_image, 36\n\n"
            "    .section %s, \"a\"   /* flash: weights (64-aligned), then the JSON */\n"
            "    .balign 64\n"
            "    .global colibri_fw_model, colibri_fw_weights, colibri_fw_json\n"
            "colibri_fw_model:\n"
            "colibri_fw_weights:   /* weights.bin, or its resident prefix when the experts are streamed */\n"
            "    .incbin \"%s\", 0, %llu\n"
            "colibri_fw_json:\n"
            "    .incbin \"%s\"\n"
            "    .balign 64\n"
            "    .size colibri_fw_model, . - colibri_fw_model\n\n"
            "    .section .bss.colibri_fw_ram, \"aw\", %%nobits   /* RAM: metadata, then the session arena */\n"
            "    .balign 64\n"
            "    .global colibri_fw_ram\n"
            "colibri_fw_ram:\n"
            "    .space %zu\n"
            "    .size colibri_fw_ram, %zu\n\n"
            "    .global __stack_size   /* read by picolibc's linker script */\n"
            "    .set __stack_size, %ld\n",
            dir, n_ctx, n_batch, budget, argv[6], n_ctx, n_batch, meta, arena, (unsigned long long)flash_weights, json_len,
            stack, budget, kv_type, section, weights_path, (unsigned long long)flash_weights, json_path, ram, ram, stack);
    return fclose(out) != 0;
}
