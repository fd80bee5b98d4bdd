/* SPDX-License-Identifier: MIT */
/* colibri-infer: run a colibri model from the command line, no Python.
 *
 *   colibri-infer --model DIR --tokens 1,415,2936 --max_tokens 16 [--temperature 0] [--verbose]
 *   colibri-infer --model DIR --prompt "ROMEO:" --max_tokens 32      (echo text | ... --prompt -)
 *   colibri-infer --model DIR --validate-model
 *   colibri-infer --model DIR --memdump [--ctx 2048]
 *   colibri-infer --model DIR --tokens 1,415 --expert_budget 512M --verbose   (experts streamed)
 *   colibri-infer --model DIR --tokens 1,415 --max_tokens 100000 --reset_every 0 --latency lat.bin --ids   (a soak)
 *
 * Prints the text as it is produced when the model carries its vocabulary (the prompt first),
 * else (or with --ids) the generated token ids, comma-separated. */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>

#include "colibri/colibri.h"
#include "colibri/device.h"

#define MAX_PROMPT 65536

typedef struct options {
    const char *model;
    const char *tokens;
    const char *prompt;             /* text, encoded by the model's encoder; "-": standard input */
    const char *logits_path;
    const char *load_path;
    const char *profile_path;
    const char *kernels;            /* a kernel variant by name, NULL: the best */
    const char *latency_path;       /* each decode step's nanoseconds, uint64 */
    long max_tokens;
    long reset_every;               /* -1: stop at a full context; 0: reset there; K: also after K tokens */
    long ctx;
    long batch;
    double temperature;
    long top_k;
    double top_p;
    unsigned long long seed;
    int verbose, validate, memdump, stop_at_eos, ids, reference_kernels;
    int routing;                    /* COLIBRI_ROUTING_* */
    long threads;                   /* 0: COLIBRI_THREADS, else the machine's cores */
    double routing_noise, capacity_factor;
    unsigned long long routing_seed;
    unsigned long long expert_budget;   /* 0: resident */
    int expert_cache;               /* COLIBRI_CACHE_* */
    int direct_io, no_prefetch, verify_experts;
    const char *device;             /* where the routed experts compute: a built-in driver's name */
    const char *placement_path;     /* a placement file (docs/DEVICES.md) */
} options;

static void usage(FILE *f)
{
    fprintf(f,
        "usage: colibri-infer --model DIR [--prompt TEXT | --tokens ID,ID,...] [--max_tokens N]\n"
        "                     [--temperature T] [--top_k K] [--top_p P] [--seed S]\n"
        "                     [--ctx N] [--batch N] [--ignore_eos] [--ids] [--verbose]\n"
        "       colibri-infer --model DIR --validate-model\n"
        "       colibri-infer --model DIR --memdump [--ctx N] [--batch N]\n"
        "       colibri-infer --version\n"
        "\n"
        "  --model DIR        a colibri model directory (colibri_model.json + weights.bin)\n"
        "  --prompt TEXT      the prompt as text, encoded by the model's tokenizer in the core; - reads standard input\n"
        "  --tokens LIST      prompt token ids, comma-separated (default: the model's BOS)\n"
        "  --max_tokens N     tokens to generate (default 16)\n"
        "  --temperature T    0 means greedy (default 0.8)\n"
        "  --top_k K          keep the K most likely tokens, 0 = all (default 40)\n"
        "  --top_p P          nucleus sampling, 1 = off (default 0.95)\n"
        "  --seed S           sampling seed (default 0)\n"
        "  --ctx N            context length to reserve (default: the model's, at most 4096)\n"
        "  --batch N          tokens per prefill chunk (default 64)\n"
        "  --ignore_eos       do not stop at the end-of-sequence token\n"
        "  --reset_every K    after K generated tokens, at a full context (K = 0: there only) or at the\n"
        "                     end-of-sequence token, empty the KV cache, prefill the prompt again and go on;\n"
        "                     --max_tokens counts the tokens of every round (a soak)\n"
        "  --latency FILE     write each decode step's time (a token's forward plus sampling the next, by\n"
        "                     the monotonic clock) as uint64 nanoseconds in this machine's byte order to FILE\n"
        "  --ids              print token ids even when the model has a vocabulary\n"
        "  --logits FILE      write the prompt's logits, float32 [n_prompt, vocab], to FILE\n"
        "  --reference        compute with the plain C reference kernels (as COLIBRI_KERNELS=reference)\n"
        "  --kernels NAME     compute with one kernel variant: reference, avx2, avx512, neon, neon-dotprod, rvv\n"
        "                     (as COLIBRI_KERNELS=NAME; default: the best this CPU runs)\n"
        "  --expert_load FILE write the tokens routed to each expert, uint64 [n_layers, n_experts], to FILE\n"
        "  --threads N        threads sharing the big matmuls (default: COLIBRI_THREADS, else the cores)\n"
        "  --profile [FILE]   time each phase of the forward pass; write them to FILE, default profile.json\n"
        "                     (JSON; colibri profile show FILE)\n"
        "  --routing R        research routing, which changes the model's output: noisy, hash or capacity\n"
        "                     (default: model, the model's own router)\n"
        "  --routing_noise X  noisy: standard deviation of the noise on the router logits (default 1)\n"
        "  --routing_seed S   noisy: the noise's seed (default 0)\n"
        "  --capacity_factor F  capacity: an expert takes at most ceil(F * n * top_k / n_experts) of n tokens\n"
        "                     (default: the model's routing.capacity_factor, else 1)\n"
        "  --expert_budget B  stream the routed experts from weights.bin into a cache of B bytes of slots\n"
        "                     (K, M, G: binary units, e.g. 512M; at least one layer's top_k experts; default 0: resident)\n"
        "  --expert_cache C   global (one pool, default) or per_layer (the slots split evenly among the MoE layers)\n"
        "  --direct_io        read experts with O_DIRECT, past the page cache\n"
        "  --no_prefetch      read only demanded experts (no guess of the next layer's)\n"
        "  --verify_experts   check each expert's extent against its CRC-32 when first read\n"
        "  --device NAME      compute the routed experts on this driver (this build's: cpu)\n"
        "  --placement FILE   bind each expert to a device by a placement file (docs/DEVICES.md)\n"
        "  --validate-model   run every load check plus checksums, then exit\n"
        "  --memdump          print the memory report after creating the session, then exit\n"
        "  --verbose          model summary, timings and the expert cache's counters on stderr\n");
}

/* "--max-tokens" and "--max_tokens" are the same option. */
static int option_is(const char *arg, const char *name)
{
    if (arg[0] != '-' || arg[1] != '-') return 0;
    arg += 2;
    for (; *arg && *name; arg++, name++) {
        char a = *arg == '-' ? '_' : *arg, b = *name == '-' ? '_' : *name;
        if (a != b) return 0;
    }
    return *arg == '\0' && *name == '\0';
}

static int parse_long(const char *flag, const char *s, long lo, long hi, long *out)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (*s == '\0' || *end != '\0' || v < lo || v > hi) {
        fprintf(stderr, "colibri-infer: %s expects an integer in [%ld, %ld], got '%s'\n", flag, lo, hi, s);
        return 0;
    }
    *out = v;
    return 1;
}

static int parse_double(const char *flag, const char *s, double lo, double hi, double *out)
{
    char *end;
    double v = strtod(s, &end);
    if (*s == '\0' || *end != '\0' || !(v >= lo && v <= hi)) {
        fprintf(stderr, "colibri-infer: %s expects a number in [%g, %g], got '%s'\n", flag, lo, hi, s);
        return 0;
    }
    *out = v;
    return 1;
}

/* Bytes, with an optional K, M, G or T suffix (1024-based): "512M", "2G". */
static int parse_size(const char *flag, const char *s, unsigned long long *out)
{
    char *end;
    unsigned long long v;
    int shift = 0, k;
    if (*s < '0' || *s > '9') goto bad;
    errno = 0;
    v = strtoull(s, &end, 10);
    if (errno) goto bad;
    for (k = 0; k < 4 && *end && end[1] == '\0'; k++)
        if (*end == "KMGT"[k] || *end == "kmgt"[k]) { shift = 10 * (k + 1); end++; }
    if (*end != '\0' || (shift && v > (~0ull >> shift))) goto bad;
    *out = v << shift;
    return 1;
bad:
    fprintf(stderr, "colibri-infer: %s expects bytes, optionally with K, M or G (512M, 2G), got '%s'\n", flag, s);
    return 0;
}

/* The options that take a value: a trailing one lacks it, any other trailing word is unknown. */
static int takes_a_value(const char *arg)
{
    static const char *const names[] = { "model", "tokens", "prompt", "logits", "expert_load", "profile", "kernels",
                                         "device", "placement", "threads", "max_tokens", "ctx", "batch", "top_k",
                                         "reset_every", "latency",
                                         "temperature", "top_p", "seed", "routing", "routing_noise", "routing_seed",
                                         "capacity_factor", "expert_budget", "expert_cache" };
    size_t k;
    for (k = 0; k < sizeof names / sizeof names[0]; k++)
        if (option_is(arg, names[k])) return 1;
    return 0;
}

static int parse_args(int argc, char **argv, options *o)
{
    int i;
    memset(o, 0, sizeof *o);
    o->max_tokens = 16; o->temperature = 0.8; o->top_k = 40; o->top_p = 0.95; o->stop_at_eos = 1;
    o->routing_noise = 1.0;
    o->reset_every = -1;
    for (i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int takes_value = 1;
        if (option_is(a, "help") || strcmp(a, "-h") == 0) { usage(stdout); exit(0); }
        if (option_is(a, "version")) { printf("colibri-infer %s\n", COLIBRI_VERSION); exit(0); }
        else if (option_is(a, "verbose")) { o->verbose = 1; takes_value = 0; }
        else if (option_is(a, "validate_model")) { o->validate = 1; takes_value = 0; }
        else if (option_is(a, "memdump")) { o->memdump = 1; takes_value = 0; }
        else if (option_is(a, "ignore_eos")) { o->stop_at_eos = 0; takes_value = 0; }
        else if (option_is(a, "ids")) { o->ids = 1; takes_value = 0; }
        else if (option_is(a, "reference")) { o->reference_kernels = 1; takes_value = 0; }
        else if (option_is(a, "direct_io")) { o->direct_io = 1; takes_value = 0; }
        else if (option_is(a, "no_prefetch")) { o->no_prefetch = 1; takes_value = 0; }
        else if (option_is(a, "verify_experts")) { o->verify_experts = 1; takes_value = 0; }
        else if (option_is(a, "profile") && (!v || (v[0] == '-' && v[1] == '-'))) {
            o->profile_path = "profile.json";   /* the file is optional: --profile alone writes profile.json */
            takes_value = 0;
        }
        else if (!takes_a_value(a)) { fprintf(stderr, "colibri-infer: unknown option %s (see --help)\n", a); return 0; }
        else if (!v) { fprintf(stderr, "colibri-infer: %s needs a value (see --help)\n", a); return 0; }
        else if (option_is(a, "model")) o->model = v;
        else if (option_is(a, "tokens")) o->tokens = v;
        else if (option_is(a, "prompt")) o->prompt = v;
        else if (option_is(a, "logits")) o->logits_path = v;
        else if (option_is(a, "expert_load")) o->load_path = v;
        else if (option_is(a, "profile")) o->profile_path = v;
        else if (option_is(a, "kernels")) o->kernels = v;
        else if (option_is(a, "latency")) o->latency_path = v;
        else if (option_is(a, "reset_every")) { if (!parse_long(a, v, 0, 1 << 24, &o->reset_every)) return 0; }
        else if (option_is(a, "device")) o->device = v;
        else if (option_is(a, "placement")) o->placement_path = v;
        else if (option_is(a, "threads")) { if (!parse_long(a, v, 0, 256, &o->threads)) return 0; }
        else if (option_is(a, "max_tokens")) { if (!parse_long(a, v, 0, 1 << 24, &o->max_tokens)) return 0; }
        else if (option_is(a, "ctx")) { if (!parse_long(a, v, 1, 1 << 24, &o->ctx)) return 0; }
        else if (option_is(a, "batch")) { if (!parse_long(a, v, 1, 4096, &o->batch)) return 0; }
        else if (option_is(a, "top_k")) { if (!parse_long(a, v, 0, 1 << 24, &o->top_k)) return 0; }
        else if (option_is(a, "temperature")) { if (!parse_double(a, v, 0.0, 100.0, &o->temperature)) return 0; }
        else if (option_is(a, "top_p")) { if (!parse_double(a, v, 0.0, 1.0, &o->top_p)) return 0; }
        else if (option_is(a, "seed")) { long s; if (!parse_long(a, v, 0, 2147483647L, &s)) return 0; o->seed = (unsigned long long)s; }
        else if (option_is(a, "routing")) {
            static const char *const modes[] = { [COLIBRI_ROUTING_MODEL] = "model", [COLIBRI_ROUTING_NOISY] = "noisy",
                                                 [COLIBRI_ROUTING_HASH] = "hash", [COLIBRI_ROUTING_CAPACITY] = "capacity" };
            int n_modes = (int)(sizeof modes / sizeof modes[0]);
            for (o->routing = 0; o->routing < n_modes && strcmp(v, modes[o->routing]) != 0; o->routing++) continue;
            if (o->routing == n_modes) {
                fprintf(stderr, "colibri-infer: --routing is one of");
                for (o->routing = 0; o->routing < n_modes; o->routing++) fprintf(stderr, " %s", modes[o->routing]);
                fprintf(stderr, "\n");
                return 0;
            }
        }
        else if (option_is(a, "routing_noise")) { if (!parse_double(a, v, 0.0, 1e6, &o->routing_noise)) return 0; }
        else if (option_is(a, "routing_seed")) { long s; if (!parse_long(a, v, 0, 2147483647L, &s)) return 0; o->routing_seed = (unsigned long long)s; }
        else if (option_is(a, "capacity_factor")) { if (!parse_double(a, v, 1e-6, 1e6, &o->capacity_factor)) return 0; }
        else if (option_is(a, "expert_budget")) { if (!parse_size(a, v, &o->expert_budget)) return 0; }
        else if (option_is(a, "expert_cache")) {
            if (strcmp(v, "global") == 0) o->expert_cache = COLIBRI_CACHE_GLOBAL;
            else if (strcmp(v, "per_layer") == 0) o->expert_cache = COLIBRI_CACHE_PER_LAYER;
            else { fprintf(stderr, "colibri-infer: --expert_cache is global or per_layer, not '%s'\n", v); return 0; }
        }
        else { fprintf(stderr, "colibri-infer: unknown option %s (see --help)\n", a); return 0; }
        if (takes_value) i++;
    }
    if (!o->model) { fprintf(stderr, "colibri-infer: --model is required (see --help)\n"); return 0; }
    return 1;
}

static int parse_tokens(const char *s, int32_t *out, size_t cap, size_t *n)
{
    *n = 0;
    while (*s) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 0 || v > 2147483647L || *n >= cap) {
            fprintf(stderr, "colibri-infer: --tokens expects comma-separated non-negative ids\n");
            return 0;
        }
        out[(*n)++] = (int32_t)v;
        s = end;
        if (*s == ',') s++;
        else if (*s) { fprintf(stderr, "colibri-infer: unexpected '%c' in --tokens\n", *s); return 0; }
    }
    return 1;
}

/* Bytes written so far hold back an unfinished UTF-8 character (at most 3 bytes) until it completes,
 * so a character is never split across two writes. */
static uint8_t held[4];
static size_t n_held;

static void put_text(const uint8_t *bytes, size_t len)
{
    while (len > 0) {
        size_t take = len < sizeof held - n_held ? len : sizeof held - n_held, whole;
        memcpy(held + n_held, bytes, take);
        n_held += take; bytes += take; len -= take;
        whole = colibri_utf8_whole(held, n_held);
        fwrite(held, 1, whole, stdout);
        memmove(held, held + whole, n_held - whole);
        n_held -= whole;
    }
}

static void flush_text(void)
{
    fwrite(held, 1, n_held, stdout);
    n_held = 0;
}

/* Writes a token's bytes; 0 when the model has no vocabulary. */
static int put_token_text(const colibri_model *model, int32_t token)
{
    const uint8_t *bytes;
    size_t len;
    if (colibri_token_bytes(model, token, &bytes, &len) != COLIBRI_OK) return 0;
    put_text(bytes, len);
    return 1;
}

/* The --prompt text: the argument, or standard input for "-" (malloc'd, *len bytes). */
static char *read_prompt(const char *arg, size_t *len)
{
    size_t cap = 1 << 16, n = 0;
    char *text;
    if (strcmp(arg, "-") != 0) {
        *len = strlen(arg);
        text = malloc(*len + 1);
        if (text) memcpy(text, arg, *len + 1);
        return text;
    }
    text = malloc(cap);
    while (text) {
        size_t got = fread(text + n, 1, cap - n, stdin);
        n += got;
        if (got == 0) break;
        if (n == cap) {
            char *more = cap < (64u << 20) ? realloc(text, cap * 2) : NULL;
            if (!more) { free(text); return NULL; }
            text = more;
            cap *= 2;
        }
    }
    *len = n;
    return text;
}

/* 1 when f is a regular file: one this program failed to write may be removed, a device (/dev/full) never. */
static int is_regular(FILE *f)
{
    struct stat st;
    return fstat(fileno(f), &st) == 0 && S_ISREG(st.st_mode);
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int fail(const char *what, const colibri_error *err)
{
    fprintf(stderr, "colibri-infer: %s: %s (%s)\n", what, err->message, colibri_status_name(err->status));
    return 1;
}

/* The drivers this program has: the cpu (an accelerator's driver joins it where one is built). */
static int colibri_device_find_builtin(const char *name) { return strcmp(name, "cpu") == 0 ? 0 : -1; }

/* Reads a placement file and applies it; 1 (after saying why) when it cannot be. */
static int apply_placement(colibri_session *session, const char *path)
{
    FILE *f = fopen(path, "rb");
    char *text = NULL;
    void *scratch = NULL;
    long len = -1;
    size_t need;
    colibri_error err;
    int rc = 1;
    if (!f) { fprintf(stderr, "colibri-infer: --placement %s: %s\n", path, strerror(errno)); return 1; }
    if (fseek(f, 0, SEEK_END) == 0) len = ftell(f);
    if (len < 0 || len > (16L << 20) || fseek(f, 0, SEEK_SET) != 0) {
        fprintf(stderr, "colibri-infer: --placement %s: not a readable file of at most 16 MiB\n", path);
        fclose(f);
        return 1;
    }
    text = malloc((size_t)len + 1);
    if (text && fread(text, 1, (size_t)len, f) == (size_t)len) {
        if (colibri_placement_scratch_bytes(session, text, (size_t)len, &need, &err) == COLIBRI_OK &&
            (scratch = malloc(need + 1)) != NULL &&
            colibri_placement_parse(session, text, (size_t)len, scratch, need, &err) == COLIBRI_OK)
            rc = 0;
        else if (!scratch && err.status == COLIBRI_OK) fprintf(stderr, "colibri-infer: out of memory\n");
        if (rc) fprintf(stderr, "colibri-infer: --placement %s: %s (%s)\n", path, err.message, colibri_status_name(err.status));
    } else {
        fprintf(stderr, "colibri-infer: --placement %s: cannot read it\n", path);
    }
    free(scratch);
    free(text);
    fclose(f);
    return rc;
}

int main(int argc, char **argv)
{
    options o;
    colibri_model *model = NULL;
    colibri_session *session = NULL;
    colibri_session_options so;
    colibri_sampling sp;
    colibri_error err;
    const colibri_hparams *hp;
    static int32_t prompt[MAX_PROMPT];
    size_t n_prompt = 0;
    uint64_t rng;
    double t0, t1, t2;
    long generated = 0, round_tokens = 0, resets = 0;
    uint64_t *latency = NULL, step_start = 0;   /* (max_tokens) ns, allocated before decoding */
    size_t n_latency = 0;
    int timing = 0;
    int32_t token;
    int rc = 0;
    char *prompt_text = NULL;
    size_t prompt_len = 0;

    if (!parse_args(argc, argv, &o)) return 2;
    if (o.tokens && !parse_tokens(o.tokens, prompt, MAX_PROMPT, &n_prompt)) return 2;
    if (o.tokens && o.prompt) { fprintf(stderr, "colibri-infer: --prompt and --tokens exclude each other\n"); return 2; }
    if (o.prompt && !(prompt_text = read_prompt(o.prompt, &prompt_len))) {
        fprintf(stderr, "colibri-infer: --prompt %s: cannot read it (at most 64 MiB)\n", o.prompt);
        return 2;
    }

    t0 = now_seconds();
    if (colibri_model_open(o.model, o.validate ? COLIBRI_LOAD_VERIFY : 0, &model, &err))
        return fail(o.validate ? "validation failed" : "cannot load model", &err);
    hp = colibri_model_hparams(model);
    if (o.validate) {
        printf("%s: valid %s model, %d tensors, %llu weight bytes, checksums match\n", o.model,
               colibri_model_architecture(model), colibri_model_tensor_count(model),
               (unsigned long long)colibri_model_weight_bytes(model));
        goto done;
    }
    if (o.verbose)
        fprintf(stderr, "model: %s, %d layers, dim %d, %d experts (top-%d), vocab %d, %.1f MB of weights, loaded in %.1f ms\n",
                colibri_model_architecture(model), hp->n_layers, hp->hidden_size, hp->n_experts, hp->top_k,
                hp->vocab_size, (double)colibri_model_weight_bytes(model) / 1e6, 1e3 * (now_seconds() - t0));

    memset(&so, 0, sizeof so);
    so.n_ctx = (int32_t)o.ctx;   /* 0: the model's, at most 4096 */
    so.n_batch = (int32_t)o.batch;
    so.kernels = o.reference_kernels ? COLIBRI_KERNELS_REFERENCE : COLIBRI_KERNELS_AUTO;
    so.kernel_variant = o.kernels;
    so.routing = o.routing;
    so.profile = o.profile_path != NULL;
    so.threads = (int32_t)o.threads;
    so.routing_noise = (float)o.routing_noise;
    so.routing_seed = o.routing_seed;
    /* not given: the model's routing.capacity_factor (the session takes it for 0), else 1 */
    so.capacity_factor = o.capacity_factor > 0 ? (float)o.capacity_factor : hp->capacity_factor > 0 ? 0.0f : 1.0f;
    so.expert_budget = o.expert_budget;
    so.expert_cache = o.expert_cache;
    so.expert_io = (o.direct_io ? COLIBRI_EXPERT_IO_DIRECT : 0u) | (o.no_prefetch ? COLIBRI_EXPERT_IO_NO_PREFETCH : 0u) |
                   (o.verify_experts ? COLIBRI_EXPERT_IO_VERIFY : 0u);
    if (o.device && colibri_device_find_builtin(o.device) < 0) {
        fprintf(stderr, "colibri-infer: --device %s: no such driver in this build (it has: cpu); remote experts run "
                "from `colibri generate --remote`\n", o.device);
        rc = 2;
        goto done;
    }
    if (colibri_session_create(model, &so, &session, &err)) { rc = fail("cannot create session", &err); goto done; }
    if (o.placement_path && apply_placement(session, o.placement_path)) { rc = 2; goto done; }
    if (o.memdump) {
        size_t len;
        char *report;
        colibri_memdump(session, NULL, 0, &len);
        report = malloc(len + 1);
        if (!report) { fprintf(stderr, "colibri-infer: out of memory\n"); rc = 1; goto done; }
        colibri_memdump(session, report, len + 1, NULL);
        fputs(report, stdout);
        free(report);
        goto done;
    }
    if (o.verbose) {
        colibri_memory_totals mt;
        colibri_memory(session, &mt);
        fprintf(stderr, "session: ctx %d, %s kernels, arena %.2f MB (KV cache %.2f MB, activations %.2f MB), weights mapped %.2f MB\n",
                colibri_session_n_ctx(session), colibri_session_kernels(session), (double)mt.arena_used / 1e6, (double)mt.kv_cache / 1e6,
                (double)mt.activations / 1e6, (double)mt.weights / 1e6);
    }

    if (prompt_text && colibri_tokenize(model, prompt_text, prompt_len, prompt, MAX_PROMPT, &n_prompt, &err)) {
        rc = fail("cannot encode the prompt", &err);
        goto done;
    }
    if (n_prompt == 0) {
        if (hp->bos_token_id < 0) {
            fprintf(stderr, "colibri-infer: the model has no BOS token: give a prompt with --tokens\n");
            rc = 2;
            goto done;
        }
        prompt[n_prompt++] = hp->bos_token_id;
    }
    sp.temperature = (float)o.temperature;
    sp.top_k = (int32_t)o.top_k;
    sp.top_p = (float)o.top_p;
    rng = o.seed;
    if (!o.ids) {
        size_t i;
        const uint8_t *unused;
        size_t unused_len;
        o.ids = colibri_token_bytes(model, 0, &unused, &unused_len) != COLIBRI_OK;   /* no vocabulary */
        if (prompt_text && !o.ids) put_text((const uint8_t *)prompt_text, prompt_len);   /* as given, as colibri generate */
        else for (i = 0; i < n_prompt && !o.ids; i++) put_token_text(model, prompt[i]);
    }

    t1 = now_seconds();
    if (o.logits_path) {
        /* every prompt position's logits, for comparing targets and implementations */
        size_t count = n_prompt * (size_t)hp->vocab_size;
        float *all = malloc(count * sizeof(float));
        FILE *f;
        int regular;
        if (!all) { fprintf(stderr, "colibri-infer: out of memory for the logits\n"); rc = 1; goto done; }
        if (colibri_forward(session, prompt, n_prompt, all, &err)) { rc = fail("prefill failed", &err); free(all); goto done; }
        f = fopen(o.logits_path, "wb");   /* only now: a failed prefill leaves no file */
        if (!f || fwrite(all, sizeof(float), count, f) != count) rc = 1;
        regular = f && is_regular(f);
        if (f && fclose(f) != 0) rc = 1;
        free(all);
        if (rc) {
            fprintf(stderr, "colibri-infer: --logits %s: cannot write it: %s\n", o.logits_path, strerror(errno));
            if (regular) remove(o.logits_path);
            goto done;
        }
    } else if (colibri_forward(session, prompt, n_prompt, NULL, &err)) {
        rc = fail("prefill failed", &err);
        goto done;
    }
    if (o.latency_path && !(latency = malloc((size_t)(o.max_tokens > 0 ? o.max_tokens : 1) * sizeof *latency))) {
        fprintf(stderr, "colibri-infer: out of memory for --latency\n");
        rc = 1;
        goto done;
    }
    if (latency) memset(latency, 0, (size_t)o.max_tokens * sizeof *latency);   /* resident now: RSS stays flat while decoding */
    t2 = now_seconds();
    if (o.verbose)
        fprintf(stderr, "prefill: %zu tokens in %.1f ms (%.1f tok/s)\n", n_prompt, 1e3 * (t2 - t1),
                (double)n_prompt / (t2 - t1));
    while (generated < o.max_tokens) {
        int full, eos;
        if (colibri_sample(session, &sp, &rng, &token, &err)) { rc = fail("sampling failed", &err); break; }
        if (timing) { latency[n_latency++] = now_ns() - step_start; timing = 0; }
        if (o.ids) printf(generated ? ",%d" : "%d", token);
        else put_token_text(model, token);
        fflush(stdout);
        generated++;
        round_tokens++;
        eos = o.stop_at_eos && token == hp->eos_token_id;
        if (generated == o.max_tokens || (eos && o.reset_every < 0)) break;
        full = colibri_session_position(session) >= colibri_session_n_ctx(session);
        if (o.reset_every >= 0 && (full || eos || round_tokens == o.reset_every)) {
            colibri_session_reset(session);   /* the next round: the prompt again, its first token untimed */
            if (colibri_forward(session, prompt, n_prompt, NULL, &err)) { rc = fail("prefill failed", &err); break; }
            round_tokens = 0;
            resets++;
            continue;
        }
        if (full) {
            fprintf(stderr, "\ncolibri-infer: context of %d tokens is full\n", colibri_session_n_ctx(session));
            break;
        }
        if (latency) { step_start = now_ns(); timing = 1; }
        if (colibri_forward(session, &token, 1, NULL, &err)) { rc = fail("decode failed", &err); break; }
    }
    flush_text();
    printf("\n");
    if (latency && rc == 0) {
        FILE *f = fopen(o.latency_path, "wb");
        int regular;
        if (!f || fwrite(latency, sizeof *latency, n_latency, f) != n_latency) rc = 1;
        regular = f && is_regular(f);
        if (f && fclose(f) != 0) rc = 1;
        if (rc) {
            fprintf(stderr, "colibri-infer: --latency %s: cannot write it: %s\n", o.latency_path, strerror(errno));
            if (regular) remove(o.latency_path);
        }
    }
    if (o.load_path && rc == 0) {
        size_t count = (size_t)hp->n_layers * (size_t)hp->n_experts;
        uint64_t *load = malloc(count * sizeof(uint64_t));
        FILE *f = fopen(o.load_path, "wb");
        if (!load || !f || colibri_expert_load(session, load) != COLIBRI_OK ||
            fwrite(load, sizeof(uint64_t), count, f) != count) {
            fprintf(stderr, "colibri-infer: cannot write %s\n", o.load_path);
            rc = 1;
        }
        if (f && fclose(f) != 0) rc = 1;
        free(load);
    }
    if (o.profile_path && rc == 0) {   /* nanoseconds per phase, summed over the prompt and the generation */
        uint64_t ns[COLIBRI_PHASE_COUNT];
        FILE *f = fopen(o.profile_path, "w");
        int p;
        colibri_profile(session, ns);
        if (!f) { fprintf(stderr, "colibri-infer: --profile %s: %s\n", o.profile_path, strerror(errno)); rc = 1; }
        else {
            fprintf(f, "{\"model\": \"%s\", \"kernels\": \"%s\", \"prompt_tokens\": %zu, \"generated_tokens\": %ld, "
                       "\"wall_ns\": %.0f, \"phases_ns\": {", colibri_model_architecture(model), colibri_session_kernels(session),
                    n_prompt, generated, 1e9 * (now_seconds() - t1));
            for (p = 0; p < COLIBRI_PHASE_COUNT; p++)
                fprintf(f, "%s\"%s\": %llu", p ? ", " : "", colibri_phase_name(p), (unsigned long long)ns[p]);
            fprintf(f, "}}\n");
            if (ferror(f) | fclose(f)) {
                fprintf(stderr, "colibri-infer: --profile %s: cannot write it: %s\n", o.profile_path, strerror(errno));
                rc = 1;
            }
        }
    }
    if (o.verbose && generated > 0)
        fprintf(stderr, "decode: %ld tokens in %.1f ms (%.1f tok/s), %ld resets\n", generated, 1e3 * (now_seconds() - t2),
                (double)generated / (now_seconds() - t2), resets);
    if (o.verbose && o.expert_budget) {
        colibri_expert_cache_stats cs;
        if (colibri_expert_cache_stats_get(session, &cs) == COLIBRI_OK) {
            unsigned long long demanded = (unsigned long long)(cs.hits + cs.misses);
            fprintf(stderr, "expert cache: %d slots of %llu B, %d pinned; %llu hits, %llu misses (%.1f%% hit rate), "
                            "%llu prefetches, %llu prefetch hits; %.2f MB read in %llu reads, %.1f ms I/O wait\n",
                    cs.slots, (unsigned long long)cs.slot_bytes, cs.pinned, (unsigned long long)cs.hits,
                    (unsigned long long)cs.misses, demanded ? 100.0 * (double)cs.hits / (double)demanded : 0.0,
                    (unsigned long long)cs.prefetches, (unsigned long long)cs.prefetch_hits,
                    (double)cs.bytes_read / 1e6, (unsigned long long)cs.reads, (double)cs.io_wait_ns / 1e6);
        }
    }
done:
    colibri_session_destroy(session);
    colibri_model_close(model);
    free(prompt_text);
    free(latency);
    if (ferror(stdout) | fclose(stdout)) {   /* every write to it, checked once: a full disk is an error */
        fprintf(stderr, "colibri-infer: cannot write standard output: %s\n", strerror(errno));
        return 1;
    }
    return rc;
}
