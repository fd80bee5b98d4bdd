/* colibri on bare metal: loads a model through semihosting into static memory, runs a greedy
 * generation in a caller-owned arena, prints the text.  No heap is touched.
 *
 *   qemu-system-arm -M mps2-an386 ... -semihosting-config enable=on,target=native,arg=fw,arg=MODEL_DIR,arg=IDS,arg=N \
 *       -kernel colibri-firmware.elf
 * MODEL_DIR defaults to the bundled model's place in the source tree, IDS ("1:591:47", any
 * separator) to "1" (BOS), N to 32. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "colibri/colibri.h"

#ifndef COLIBRI_FIRMWARE_MODEL
#define COLIBRI_FIRMWARE_MODEL "colibri/demo/shakespeare"
#endif

/* Sizes for the bundled model at ctx 256; the board's 16 MiB RAM region holds them. */
static char json[64u << 10];
static unsigned char weights[4u << 20] __attribute__((aligned(64)));
static unsigned char meta[64u << 10] __attribute__((aligned(16)));
static unsigned char arena[2u << 20] __attribute__((aligned(64)));

static size_t read_file(const char *dir, const char *name, void *buf, size_t cap)
{
    char path[512];
    FILE *f;
    size_t n;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    f = fopen(path, "rb");
    if (!f) { printf("cannot open %s\n", path); return 0; }
    n = fread(buf, 1, cap, f);
    if (n == cap && fgetc(f) != EOF) { printf("%s does not fit in %u bytes\n", path, (unsigned)cap); n = 0; }
    fclose(f);
    return n;
}

int main(int argc, char **argv)
{
    /* QEMU's semihosting puts the image's own path first, after argv[0]: skip it */
    int a = 1;
    while (a < argc && strstr(argv[a], ".elf")) a++;
    const char *dir = argc > a ? argv[a] : COLIBRI_FIRMWARE_MODEL;
    const char *ids = argc > a + 1 ? argv[a + 1] : "1";
    int max_tokens = argc > a + 2 ? atoi(argv[a + 2]) : 32, i;
    int32_t prompt[256], token;
    size_t n_prompt = 0, json_len, weights_len;
    colibri_model *model;
    colibri_session *session;
    colibri_session_options so;
    colibri_sampling greedy = { 0.0f, 0, 1.0f };
    colibri_error err;
    uint64_t rng = 0;
    const uint8_t *bytes;
    size_t len;

    while (*ids && n_prompt < 256) {   /* ids separated by any non-digit (QEMU's options take ':' well) */
        char *end;
        if (*ids < '0' || *ids > '9') { ids++; continue; }
        prompt[n_prompt++] = (int32_t)strtol(ids, &end, 10);
        ids = end;
    }
    json_len = read_file(dir, "colibri_model.json", json, sizeof json);
    weights_len = read_file(dir, "weights.bin", weights, sizeof weights);
    if (!json_len || !weights_len) return 1;
    if (colibri_model_load(json, json_len, weights, weights_len, 0, meta, sizeof meta, &model, &err)) {
        printf("load: %s (%s)\n", err.message, colibri_status_name(err.status));
        return 1;
    }
    memset(&so, 0, sizeof so);
    so.n_ctx = 256;
    so.n_batch = 16;
    so.arena = arena;
    so.arena_size = sizeof arena;
    if (colibri_session_create(model, &so, &session, &err)) {
        printf("session: %s (%s)\n", err.message, colibri_status_name(err.status));
        return 1;
    }
    for (i = 0; i < (int)n_prompt; i++)
        if (colibri_token_bytes(model, prompt[i], &bytes, &len) == COLIBRI_OK) fwrite(bytes, 1, len, stdout);
    if (colibri_forward(session, prompt, n_prompt, NULL, &err)) { printf("forward: %s\n", err.message); return 1; }
    for (i = 0; i < max_tokens; i++) {
        if (colibri_sample(session, &greedy, &rng, &token, &err)) { printf("sample: %s\n", err.message); return 1; }
        if (colibri_token_bytes(model, token, &bytes, &len) == COLIBRI_OK) fwrite(bytes, 1, len, stdout);
        if (i + 1 < max_tokens && colibri_forward(session, &token, 1, NULL, &err)) { printf("decode: %s\n", err.message); return 1; }
    }
    printf("\n");
    return 0;
}
