/* SPDX-License-Identifier: MIT */
/* What every firmware image runs: one generation with the model linked into the image.
 *
 * The image is the core + this app + one generated assembly file (firmware/plan) that holds
 * everything model-specific: the model (weights.bin and colibri_model.json, in flash), the
 * static RAM block (metadata + session arena, in .bss), the stack budget and the session
 * shape.  An image built with an expert budget streams its routed experts: flash holds only
 * weights.bin's resident prefix, the arena holds the cache slots, and the experts are read
 * from storage (here a semihosted host file standing in for an SD card) as tokens need them.  The C code never changes with the model, so its size, measured once per board,
 * plus the generated sizes is exactly what an image needs (colibri firmware plan). */
#ifndef COLIBRI_FIRMWARE_H
#define COLIBRI_FIRMWARE_H

#include <stddef.h>
#include <stdint.h>

#include "colibri/colibri.h"

/* Prompt ids: 1 KiB of .bss, as many as the default context holds (a longer prompt could not run).
 * A text prompt that encodes to more is refused with its count.  Its bytes come through the
 * semihosting command line, at most 1,022 characters in all (picolibc's start-up buffer), which
 * words encode to far fewer tokens; growing this costs 4 bytes of RAM a token. */
#define FW_MAX_PROMPT 256

/* From the generated model_image.S. */
typedef struct fw_image {
    uint32_t n_ctx, n_batch;        /* the session the RAM block was planned for */
    uint32_t meta_bytes;            /* colibri_model_meta_bytes, rounded up to 64 */
    uint32_t arena_bytes;           /* colibri_session_plan */
    uint32_t weights_bytes, json_bytes;   /* in flash: weights.bin, or its resident prefix */
    uint32_t stack_bytes;           /* the stack budget (__stack_size) */
    uint32_t expert_budget;         /* bytes of expert cache slots in the arena; 0: experts in flash */
    uint32_t kv_type;               /* the KV cache's colibri_dtype: f32, f16 or q8_0 */
} fw_image;
extern const fw_image colibri_fw_image;
extern const unsigned char colibri_fw_weights[];    /* 64-byte aligned, then the JSON */
extern const char colibri_fw_json[];
extern unsigned char colibri_fw_ram[];               /* (meta_bytes + arena_bytes), 64-byte aligned */

typedef struct fw_request {
    int32_t prompt[FW_MAX_PROMPT];  /* ids=, or what fw_generate encodes text into */
    size_t n_prompt;
    const char *text;               /* text=, decoded in place in argv; NULL: the prompt is ids */
    size_t text_len;
    int32_t max_tokens;
    int stop_at_eos;
    colibri_sampling sampling;
    uint64_t seed;
    const char *logits_path;        /* host file for every position's logits, (positions, vocab) f32 */
    const char *report_path;        /* host file for the report (memory, timing), key: value lines */
    const char *experts_path;       /* streaming image: the model's weights.bin, read at extents' offsets */
    const char *kernels;            /* a kernel variant by name ("reference": the strict mode); NULL: the best */
} fw_request;

/* Called after each generated token: FreeRTOS uses it to show the rest of the system ran. */
typedef void (*fw_token_hook)(int32_t index, void *context);

/* Reads "text=ROMEO%3A max_tokens=64 temperature=0 top_k=0 top_p=1 seed=0 ignore_eos
 * logits=FILE report=FILE experts=FILE kernels=NAME" (any order; arguments naming the image itself
 * are skipped; kernels=reference is the strict mode, an unknown name fails the session's creation).
 * text= is the prompt's UTF-8 bytes with any byte as %XX (QEMU splits the command line at spaces),
 * encoded on the board by the model's encoder; ids=1:591:47 gives ids instead, for a model that
 * carries no encoder.  Neither: the model's BOS.  Returns 0, or prints what is wrong and returns 1. */
int fw_parse_args(int argc, char **argv, fw_request *request);

/* Loads the linked model, encodes a text prompt into request->prompt, runs the request, prints
 * the prompt and the generated text as colibri-infer does (streamed, a UTF-8 character never
 * split; the generated ids, comma-separated, for a model without a vocabulary), writes the report
 * (stack_used: the caller's high-water mark, may be NULL).  Returns 0, or prints the failing step
 * with the core's message and returns 1. */
int fw_generate(fw_request *request, fw_token_hook hook, void *context, size_t (*stack_used)(void));

/* The board's clock (firmware/boards/, or the FreeRTOS tick count). */
uint64_t fw_ticks(void);
uint32_t fw_ticks_per_second(void);

/* Stack high-water mark: fw_stack_paint at the start of main, fw_stack_used at the end (bytes
 * below `top` down to the lowest one written; `bottom` below the budget paints a guard, so a
 * stack that outgrew the budget shows as more than the budget). */
void fw_stack_paint(unsigned char *bottom, unsigned char *top);
size_t fw_stack_used(const unsigned char *bottom, const unsigned char *top);

#endif
