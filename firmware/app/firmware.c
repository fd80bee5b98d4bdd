/* SPDX-License-Identifier: MIT */
/* One generation with the linked model: the same steps, output and stopping rules as
 * colibri-infer, with every byte of RAM in the static block the build planned. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "firmware.h"

#define STACK_PAINT 0xA5

static int option(const char *arg, const char *key, const char **value)
{
    size_t n = strlen(key);
    if (strncmp(arg, key, n) != 0 || (arg[n] != '=' && arg[n] != '\0')) return 0;
    *value = arg[n] == '=' ? arg + n + 1 : "";
    return 1;
}

static int parse_ids(const char *text, fw_request *r)
{
    while (*text) {   /* ids separated by any non-digit: QEMU's option parser takes ':' well */
        char *end;
        long v;
        if (*text < '0' || *text > '9') { text++; continue; }
        v = strtol(text, &end, 10);
        if (r->n_prompt == FW_MAX_PROMPT || v > 2147483647L) {
            printf("ids: at most %d ids, each below 2^31\n", FW_MAX_PROMPT);
            return 1;
        }
        r->prompt[r->n_prompt++] = (int32_t)v;
        text = end;
    }
    return 0;
}

static int hex_digit(int c)
{
    if (c >= '0' && c <= '9') return c - '0';
    c |= 0x20;
    return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* %XX to its byte, in place: the decoded text is never longer than the argument. */
static int parse_text(char *text, fw_request *r)
{
    char *out = text;
    const char *p = text;
    while (*p) {
        int hi, lo;
        if (*p != '%') { *out++ = *p++; continue; }
        if ((hi = hex_digit(p[1])) < 0 || (lo = hex_digit(p[2])) < 0) {
            printf("text: '%%' must start %%XX, two hex digits of a byte (at byte %ld)\n", (long)(p - text));
            return 1;
        }
        *out++ = (char)(hi * 16 + lo);
        p += 3;
    }
    r->text = text;
    r->text_len = (size_t)(out - text);
    return 0;
}

int fw_parse_args(int argc, char **argv, fw_request *r)
{
    int i;
    memset(r, 0, sizeof *r);
    r->max_tokens = 32;
    r->stop_at_eos = 1;
    r->sampling.top_p = 1.0f;
    for (i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (strstr(a, ".elf")) continue;   /* QEMU passes the image's own path first */
        if (option(a, "ids", &v)) { if (parse_ids(v, r)) return 1; }
        else if (option(a, "text", &v)) { if (parse_text(argv[i] + (v - a), r)) return 1; }
        else if (option(a, "max_tokens", &v)) r->max_tokens = atoi(v);
        else if (option(a, "temperature", &v)) r->sampling.temperature = (float)strtod(v, NULL);
        else if (option(a, "top_k", &v)) r->sampling.top_k = atoi(v);
        else if (option(a, "top_p", &v)) r->sampling.top_p = (float)strtod(v, NULL);
        else if (option(a, "seed", &v)) r->seed = strtoull(v, NULL, 10);
        else if (option(a, "ignore_eos", &v)) r->stop_at_eos = 0;
        else if (option(a, "logits", &v)) r->logits_path = v;
        else if (option(a, "report", &v)) r->report_path = v;
        else if (option(a, "experts", &v)) r->experts_path = v;
        else if (option(a, "kernels", &v)) r->kernels = v;
        else {
            printf("unknown argument '%s': text=PROMPT%%20IN%%20UTF-8 (or ids=1:591:47) max_tokens=N temperature=T "
                   "top_k=K top_p=P seed=S ignore_eos logits=FILE report=FILE experts=FILE kernels=NAME\n", a);
            return 1;
        }
    }
    if (r->text && r->n_prompt) {
        printf("give the prompt once: text= or ids=\n");
        return 1;
    }
    return 0;
}

static int failed(const char *step, const colibri_error *err)
{
    printf("\ncolibri firmware: %s failed: %s (%s)\n", step, err->message, colibri_status_name(err->status));
    return 1;
}

/* Text goes out as it comes (colibri_text_sink holds back an unfinished UTF-8 character). */
static void write_stdout(void *context, const char *bytes, size_t len)
{
    (void)context;
    fwrite(bytes, 1, len, stdout);
    fflush(stdout);
}

/* The text prompt to ids in r->prompt, with the encoder the model carries. */
static int encode_prompt(const colibri_model *model, fw_request *r)
{
    colibri_error err;
    colibri_status st = colibri_tokenize(model, r->text, r->text_len, r->prompt, FW_MAX_PROMPT, &r->n_prompt, &err);
    if (st == COLIBRI_E_TENSOR) {
        printf("colibri firmware: the model carries no encoder (%s): give the prompt as ids=\n", err.message);
        return 1;
    }
    if (st == COLIBRI_E_ARG && r->n_prompt > FW_MAX_PROMPT) {
        printf("colibri firmware: the prompt is %lu tokens, the image holds at most %d\n",
               (unsigned long)r->n_prompt, FW_MAX_PROMPT);
        return 1;
    }
    return st ? failed("encoding the prompt", &err) : 0;
}

/* Semihosting files through picolibc's open/write: no FILE, so no allocation. */
static int write_all(int fd, const void *data, size_t len)
{
    const unsigned char *p = data;
    while (len) {
        ssize_t n = write(fd, p, len);
        if (n <= 0) return 1;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

/* Where a streaming image's experts come from: the model's weights.bin on the host, through
 * semihosting, standing in for an SD card (its driver would go here).  Brings
 * [offset, offset + len) whole, or up to the end of the file: the core reports a short read
 * with the tensor, expert and offset.  Semihosting seeks to 32-bit positions. */
typedef struct fw_storage {
    int fd;
} fw_storage;

static int64_t read_experts(void *context, uint64_t offset, void *dst, size_t len)
{
    const fw_storage *storage = context;
    unsigned char *p = dst;
    size_t done = 0;
    errno = 0;
    if (offset > 0x7FFFFFFFu || lseek(storage->fd, (off_t)offset, SEEK_SET) != (off_t)offset)
        return -(int64_t)(errno ? errno : EINVAL);
    while (done < len) {
        ssize_t n = read(storage->fd, p + done, len - done);
        if (n < 0) return -(int64_t)(errno ? errno : EIO);
        if (n == 0) break;
        done += (size_t)n;
    }
    return (int64_t)done;
}

static void report_line(int fd, const char *key, uint64_t value)
{
    char line[96];
    int n = snprintf(line, sizeof line, "%s: %llu\n", key, (unsigned long long)value);
    if (fd >= 0 && n > 0) write_all(fd, line, (size_t)n);
}

/* The stack outgrew its budget, over what lies below it: the high-water mark is above the budget,
 * or (where nothing below is painted) the paint is gone to the budget's very bottom. */
static int stack_exhausted(size_t (*stack_used)(void), const char *step)
{
    size_t used = stack_used ? stack_used() : 0;
    if (used < colibri_fw_image.stack_bytes) return 0;
    printf("\ncolibri firmware: the stack outgrew its budget of %lu bytes %s (%lu bytes or more): build with a "
           "larger stack\n", (unsigned long)colibri_fw_image.stack_bytes, step, (unsigned long)used);
    return 1;
}

int fw_generate(fw_request *r, fw_token_hook hook, void *context, size_t (*stack_used)(void))
{
    const fw_image *img = &colibri_fw_image;
    unsigned char *meta = colibri_fw_ram, *arena = colibri_fw_ram + img->meta_bytes;
    colibri_model *model;
    colibri_session *session;
    colibri_session_options so;
    colibri_expert_cache_stats cache;
    colibri_error err;
    colibri_generation g;
    colibri_generate_options go;
    colibri_text_sink text;
    fw_storage storage;
    const uint8_t *unused;
    size_t meta_needed, arena_needed, unused_len, i;
    uint64_t t0, t1, t2;
    int32_t token, vocab;
    int logits_fd = -1, report_fd = -1, rc = 0, ids;

    /* a streaming image reads its experts from storage, which must be there before anything runs */
    storage.fd = -1;
    if (img->expert_budget && !r->experts_path) {
        printf("this image streams its experts: give experts=FILE, the model's weights.bin\n");
        return 1;
    }
    if (img->expert_budget && (storage.fd = open(r->experts_path, O_RDONLY)) < 0) {
        printf("cannot read %s\n", r->experts_path);
        return 1;
    }

    /* the model in flash, its tables and the session in the planned block */
    if (colibri_model_meta_bytes(colibri_fw_json, img->json_bytes, &meta_needed, &err)) return failed("metadata", &err);
    if (colibri_model_load(colibri_fw_json, img->json_bytes, colibri_fw_weights, img->weights_bytes,
                           img->expert_budget ? COLIBRI_LOAD_EXPERTS_ELSEWHERE : 0, meta, img->meta_bytes, &model,
                           &err))
        return failed("load", &err);
    memset(&so, 0, sizeof so);
    so.n_ctx = (int32_t)img->n_ctx;
    so.n_batch = (int32_t)img->n_batch;
    so.kv_type = (colibri_dtype)img->kv_type;
    so.arena = arena;
    so.arena_size = img->arena_bytes;
    so.kernel_variant = r->kernels;   /* NULL: the best this image has */
    if (img->expert_budget) {
        so.expert_budget = img->expert_budget;
        so.expert_read = read_experts;
        so.expert_read_context = &storage;
    }
    if (colibri_session_plan(model, &so, &arena_needed, &err)) return failed("plan", &err);
    if (colibri_session_create(model, &so, &session, &err)) return failed("session", &err);
    vocab = colibri_model_hparams(model)->vocab_size;
    ids = colibri_token_bytes(model, 0, &unused, &unused_len) != COLIBRI_OK;   /* no vocabulary: print ids */
    if (r->text && (encode_prompt(model, r) || stack_exhausted(stack_used, "encoding the prompt"))) return 1;
    if (r->n_prompt == 0) {   /* no prompt, or text that encodes to nothing: the BOS, as colibri-infer */
        if (colibri_model_hparams(model)->bos_token_id < 0) {
            printf("colibri firmware: the prompt is empty and the model has no BOS token\n");
            return 1;
        }
        r->prompt[r->n_prompt++] = colibri_model_hparams(model)->bos_token_id;
    }

    if (r->logits_path && (logits_fd = open(r->logits_path, O_WRONLY | O_CREAT | O_TRUNC, 0644)) < 0) {
        printf("cannot write %s\n", r->logits_path);
        return 1;
    }
    colibri_text_sink_init(&text, write_stdout, NULL);
    if (r->text && !ids) colibri_text_put(&text, (const uint8_t *)r->text, r->text_len);   /* as given, as colibri generate */
    else for (i = 0; i < r->n_prompt && !ids; i++) colibri_text_put_token(&text, model, r->prompt[i]);

    /* prefill: one chunked forward, or position by position when every row's logits are wanted */
    t0 = fw_ticks();
    for (i = 0; logits_fd >= 0 && i < r->n_prompt; i++) {
        if (colibri_forward(session, &r->prompt[i], 1, NULL, &err)) return failed("prefill", &err);
        if (write_all(logits_fd, colibri_session_logits(session), (size_t)vocab * sizeof(float))) rc = 1;
    }
    go.max_tokens = r->max_tokens;
    go.sampling = r->sampling;
    go.seed = r->seed;
    go.stop_at_eos = r->stop_at_eos;
    if (colibri_generate_start(&g, session, &go, r->prompt, logits_fd < 0 ? r->n_prompt : 0, &err))
        return failed("prefill", &err);
    t1 = fw_ticks();
    for (;;) {   /* each token after the first fed back the one before: its logits are that position's */
        if (colibri_generate_next(&g, &token, &err)) return failed(g.generated ? "decode" : "sampling", &err);
        if (token < 0) break;
        if (logits_fd >= 0 && g.generated > 1 &&
            write_all(logits_fd, colibri_session_logits(session), (size_t)vocab * sizeof(float)))
            rc = 1;
        if (ids) printf(g.generated > 1 ? ",%ld" : "%ld", (long)token);
        else if (g.stop != COLIBRI_STOP_EOS) colibri_text_put_token(&text, model, token);   /* an end id: no text */
        if (hook) hook(g.generated - 1, context);
    }
    t2 = fw_ticks();
    colibri_text_flush(&text);
    printf("\n");
    if (logits_fd >= 0 && close(logits_fd) != 0) rc = 1;
    if (rc) printf("colibri firmware: short write to %s\n", r->logits_path);

    if (r->report_path && (report_fd = open(r->report_path, O_WRONLY | O_CREAT | O_TRUNC, 0644)) < 0) {
        printf("cannot write %s\n", r->report_path);
        return 1;
    }
    if (report_fd >= 0) {   /* the kernel variant the session ran, by name: the one line that is no count */
        char line[64];
        int n = snprintf(line, sizeof line, "kernels: %s\n", colibri_session_kernels(session));
        if (n > 0 && n < (int)sizeof line) write_all(report_fd, line, (size_t)n);
    }
    report_line(report_fd, "ticks_per_second", fw_ticks_per_second());
    report_line(report_fd, "stack_reserved", img->stack_bytes);
    report_line(report_fd, "stack_used", stack_used ? stack_used() : 0);
    report_line(report_fd, "prompt_tokens", r->n_prompt);
    report_line(report_fd, "prefill_ticks", t1 - t0);
    report_line(report_fd, "generated_tokens", (uint64_t)g.generated);
    report_line(report_fd, "decode_ticks", t2 - t1);   /* generated - 1 forwards and generated samples */
    report_line(report_fd, "meta_reserved", img->meta_bytes);
    report_line(report_fd, "meta_needed", meta_needed);
    report_line(report_fd, "arena_reserved", img->arena_bytes);
    report_line(report_fd, "arena_needed", arena_needed);
    report_line(report_fd, "weights_flash", img->weights_bytes);
    if (img->expert_budget && colibri_expert_cache_stats_get(session, &cache) == COLIBRI_OK) {
        report_line(report_fd, "expert_budget", img->expert_budget);
        report_line(report_fd, "expert_slots", (uint64_t)cache.slots);
        report_line(report_fd, "expert_slot_bytes", cache.slot_bytes);
        report_line(report_fd, "expert_hits", cache.hits);
        report_line(report_fd, "expert_misses", cache.misses);
        report_line(report_fd, "expert_bytes_read", cache.bytes_read);
        report_line(report_fd, "expert_reads", cache.reads);
    }
    if (report_fd >= 0) close(report_fd);
    if (storage.fd >= 0) close(storage.fd);
    if (stack_exhausted(stack_used, "generating")) rc = 1;
    colibri_session_destroy(session);
    colibri_model_close(model);
    return rc;
}

void fw_stack_paint(unsigned char *bottom, unsigned char *top)
{
    while (bottom < top) *bottom++ = STACK_PAINT;
}

size_t fw_stack_used(const unsigned char *bottom, const unsigned char *top)
{
    const unsigned char *p = bottom;
    while (p < top && *p == STACK_PAINT) p++;
    return (size_t)(top - p);
}
