/* SPDX-License-Identifier: MIT */
/* colibri-infer: run a colibri model from the command line, no Python.
 *
 *   colibri-infer --model DIR --tokens 1,415,936 --max_tokens 16 [--temperature 0] [--verbose]
 *   colibri-infer --model DIR --prompt "ROMEO:" --max_tokens 32      (echo text | ... --prompt -)
 *   colibri-infer --model DIR --validate-model
 *   colibri-infer --model DIR --memdump [--ctx 2048]
 *   colibri-infer --model DIR --tokens 1,415 --expert_budget 512M --verbose   (experts streamed)
 *   colibri-infer --model DIR --tokens 1,415 --max_tokens 100000 --reset_every 0 --latency lat.bin --ids   (a soak)
 *
 * Prints the text as it is produced when the model carries its vocabulary (the prompt first),
 * else (or with --ids) the generated token ids, comma-separated.  The flags and their defaults are
 * the ones `colibri generate` has where both have a flag (tests/test_cli_flags.py). */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>

#include "colibri/colibri.h"
#include "colibri/device.h"

#define MAX_PROMPT 65536
#define MAX_LOGIT_BIAS 1024

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
    colibri_dtype kv_type;          /* what the KV cache stores: f32 (0), f16, q8_0 */
    double temperature;
    long top_k;
    double top_p;
    double min_p, repeat_penalty, presence_penalty, frequency_penalty;
    long repeat_last_n;
    colibri_logit_bias logit_bias[MAX_LOGIT_BIAS];
    int n_logit_bias;
    long long seed;                 /* -1: a random one, drawn at the start */
    int verbose, validate, memdump, stop_at_eos, ids, reference_kernels;
    int routing;                    /* COLIBRI_ROUTING_* */
    long threads;                   /* 0: COLIBRI_THREADS, else the machine's cores */
    double routing_noise, capacity_factor;
    unsigned long long routing_seed;
    unsigned long long expert_budget;   /* 0: resident */
    int expert_cache;               /* COLIBRI_CACHE_* */
    int direct_io, no_prefetch, verify_experts;
    int as_stored;                      /* run the file's layout as it is (no repack at open) */
    const char *device;             /* where the routed experts compute: a built-in driver's name */
    const char *placement_path;     /* a placement file (docs/DEVICES.md) */
    const char *stops[COLIBRI_MAX_STOPS];   /* --stop strings */
    int n_stops;
} options;

enum flag_id {
    F_MODEL, F_PROMPT, F_TOKENS, F_MAX_TOKENS, F_TEMPERATURE, F_TOP_K, F_TOP_P, F_MIN_P, F_REPEAT_PENALTY,
    F_REPEAT_LAST_N, F_PRESENCE_PENALTY, F_FREQUENCY_PENALTY, F_LOGIT_BIAS, F_SEED, F_CTX, F_BATCH,
    F_KV_TYPE, F_IGNORE_EOS, F_STOP, F_RESET_EVERY, F_LATENCY, F_IDS, F_LOGITS, F_REFERENCE, F_KERNELS, F_EXPERT_LOAD, F_THREADS,
    F_PROFILE, F_ROUTING, F_ROUTING_NOISE, F_ROUTING_SEED, F_CAPACITY_FACTOR, F_EXPERT_BUDGET, F_EXPERT_CACHE,
    F_DIRECT_IO, F_NO_PREFETCH, F_VERIFY_EXPERTS, F_AS_STORED, F_DEVICE, F_PLACEMENT, F_VALIDATE_MODEL, F_MEMDUMP, F_VERBOSE,
    F_VERSION, F_HELP, F_COUNT
};

/* Every flag once: getopt_long's table, --help and the defaults parse_args sets come from it.
 * A '-' in a name typed on the command line is the same as '_' (--max-tokens, --max_tokens). */
#define STRINGIFY_(x) #x
#define STRINGIFY(x) STRINGIFY_(x)

static const struct flag {
    const char *name;
    int has_arg;                    /* no_argument, required_argument, optional_argument */
    const char *value;              /* the value's name in --help */
    const char *fallback;           /* the default, as typed; NULL: none (the help says what then) */
    const char *help;
} flags[F_COUNT] = {
    [F_MODEL] = { "model", required_argument, "PATH", NULL, "a colibri model directory (colibri_model.json + weights.bin) or a GGUF file" },
    [F_PROMPT] = { "prompt", required_argument, "TEXT", NULL,
                   "the prompt as text, encoded by the model's tokenizer in the core; - reads standard input" },
    [F_TOKENS] = { "tokens", required_argument, "LIST", NULL, "prompt token ids, comma-separated (neither: the model's BOS)" },
    [F_MAX_TOKENS] = { "max_tokens", required_argument, "N", "64", "tokens to generate" },
    [F_TEMPERATURE] = { "temperature", required_argument, "T", "0.8", "0 means greedy" },
    [F_TOP_K] = { "top_k", required_argument, "K", "40", "keep the K most likely tokens, 0 = all" },
    [F_TOP_P] = { "top_p", required_argument, "P", "0.95", "nucleus sampling, 1 = off" },
    [F_MIN_P] = { "min_p", required_argument, "P", "0", "keep tokens at least P times the most likely's probability, 0 = off" },
    [F_REPEAT_PENALTY] = { "repeat_penalty", required_argument, "R", "1",
                           "a token among the last --repeat_last_n: its logit divided by R (multiplied when\n"
                           "negative), 1 = off" },
    [F_REPEAT_LAST_N] = { "repeat_last_n", required_argument, "N", STRINGIFY(COLIBRI_PENALTY_LAST_N_DEFAULT),
                          "the tokens the penalties count, the prompt's included; 0 = off, -1 = the last "
                          STRINGIFY(COLIBRI_PENALTY_WINDOW) },
    [F_PRESENCE_PENALTY] = { "presence_penalty", required_argument, "A", "0", "subtracted from the logit of a token among them" },
    [F_FREQUENCY_PENALTY] = { "frequency_penalty", required_argument, "F", "0",
                              "subtracted from a token's logit, times its count among them" },
    [F_LOGIT_BIAS] = { "logit_bias", required_argument, "ID=B,...", NULL,
                       "add B to token ID's logit (-inf bans it), before the penalties" },
    [F_SEED] = { "seed", required_argument, "S", "0", "sampling seed, -1 = a random one (printed with --verbose)" },
    [F_CTX] = { "ctx", required_argument, "N", "0", "context length to reserve, 0: the model's, at most 4096" },
    [F_BATCH] = { "batch", required_argument, "N", "0", "tokens per prefill chunk, 0: 64" },
    [F_KV_TYPE] = { "kv_type", required_argument, "TYPE", "f32",
                    "what the KV cache stores: f32, f16 (half the bytes) or q8_0 (8-bit blocks of 32 along\n"
                    "each head; head_dim a multiple of 32)" },
    [F_IGNORE_EOS] = { "ignore_eos", no_argument, NULL, NULL, "do not stop at the end-of-sequence token" },
    [F_STOP] = { "stop", required_argument, "STR", NULL,
                 "end the generation when its text completes STR, which is not printed (repeatable)" },
    [F_RESET_EVERY] = { "reset_every", required_argument, "K", NULL,
                        "after K generated tokens, at a full context (K = 0: there only) or at the end-of-sequence\n"
                        "token, empty the KV cache, prefill the prompt again and go on; --max_tokens counts the\n"
                        "tokens of every round (a soak)" },
    [F_LATENCY] = { "latency", required_argument, "FILE",  NULL,
                    "write each decode step's time (a token's forward plus sampling the next, by the monotonic\n"
                    "clock) as uint64 nanoseconds in this machine's byte order to FILE" },
    [F_IDS] = { "ids", no_argument, NULL, NULL, "print token ids even when the model has a vocabulary" },
    [F_LOGITS] = { "logits", required_argument, "FILE", NULL, "write the prompt's logits, float32 [n_prompt, vocab], to FILE" },
    [F_REFERENCE] = { "reference", no_argument, NULL, NULL,
                      "compute with the plain C reference kernels (as COLIBRI_KERNELS=reference)" },
    [F_KERNELS] = { "kernels", required_argument, "NAME", NULL,
                    "compute with one kernel variant: reference, avx2, avx512, neon, neon-dotprod, rvv\n"
                    "(as COLIBRI_KERNELS=NAME; default: the best this CPU runs)" },
    [F_EXPERT_LOAD] = { "expert_load", required_argument, "FILE", NULL,
                        "write the tokens routed to each expert, uint64 [n_layers, n_experts], to FILE" },
    [F_THREADS] = { "threads", required_argument, "N", "0", "threads sharing the big matmuls, 0: COLIBRI_THREADS, else the cores" },
    [F_PROFILE] = { "profile", optional_argument, "[FILE]", NULL,
                    "time each phase of the forward pass; write them to FILE, default profile.json\n"
                    "(JSON; colibri profile show FILE)" },
    [F_ROUTING] = { "routing", required_argument, "R", "model",
                    "research routing, which changes the model's output: noisy, hash or capacity\n"
                    "(model: the model's own router)" },
    [F_ROUTING_NOISE] = { "routing_noise", required_argument, "X", "1",
                          "noisy: standard deviation of the noise on the router logits" },
    [F_ROUTING_SEED] = { "routing_seed", required_argument, "S", "0", "noisy: the noise's seed" },
    [F_CAPACITY_FACTOR] = { "capacity_factor", required_argument, "F", NULL,
                            "capacity: an expert takes at most ceil(F * n * top_k / n_experts) of n tokens\n"
                            "(default: the model's routing.capacity_factor, else 1)" },
    [F_EXPERT_BUDGET] = { "expert_budget", required_argument, "B", NULL,
                          "stream the routed experts from weights.bin into a cache of B bytes of slots\n"
                          "(K, M, G: binary units, e.g. 512M; at least one layer's top_k experts; default: resident)" },
    [F_EXPERT_CACHE] = { "expert_cache", required_argument, "C", "global",
                         "global (one pool) or per_layer (the slots split evenly among the MoE layers)" },
    [F_DIRECT_IO] = { "direct_io", no_argument, NULL, NULL, "read experts with O_DIRECT, past the page cache" },
    [F_NO_PREFETCH] = { "no_prefetch", no_argument, NULL, NULL, "read only demanded experts (no guess of the next layer's)" },
    [F_VERIFY_EXPERTS] = { "verify_experts", no_argument, NULL, NULL,
                           "check each expert's extent against its CRC-32 when first read" },
    [F_AS_STORED] = { "as_stored", no_argument, NULL, NULL,
                      "run every tensor as the file stores it (default: each matrix in the row-interleaved form\n"
                      "this CPU's kernels multiply faster, rewritten at open in the mapping's own pages)" },
    [F_DEVICE] = { "device", required_argument, "NAME", NULL, "compute the routed experts on this driver (this build's: cpu)" },
    [F_PLACEMENT] = { "placement", required_argument, "FILE", NULL,
                      "bind each expert to a device by a placement file (docs/DEVICES.md)" },
    [F_VALIDATE_MODEL] = { "validate_model", no_argument, NULL, NULL, "run every load check plus checksums, then exit" },
    [F_MEMDUMP] = { "memdump", no_argument, NULL, NULL, "print the memory report after creating the session, then exit" },
    [F_VERBOSE] = { "verbose", no_argument, NULL, NULL, "model summary, timings and the expert cache's counters on stderr" },
    [F_VERSION] = { "version", no_argument, NULL, NULL, "print the version, then exit" },
    [F_HELP] = { "help", no_argument, NULL, NULL, "this text (also -h)" },
};

static void usage(FILE *f)
{
    int k;
    fprintf(f,
        "usage: colibri-infer --model DIR [--prompt TEXT | --tokens ID,ID,...] [--max_tokens N]\n"
        "                     [--temperature T] [--top_k K] [--top_p P] [--seed S]\n"
        "                     [--ctx N] [--batch N] [--kv_type TYPE] [--ignore_eos] [--ids] [--verbose]\n"
        "       colibri-infer --model DIR --validate-model\n"
        "       colibri-infer --model DIR --memdump [--ctx N] [--batch N] [--kv_type TYPE]\n"
        "       colibri-infer --version\n\n");
    for (k = 0; k < F_COUNT; k++) {
        const struct flag *fl = &flags[k];
        const char *line = fl->help, *end;
        int width = fprintf(f, "  --%s%s%s", fl->name, fl->value ? " " : "", fl->value ? fl->value : "");
        for (; (end = strchr(line, '\n')) != NULL; line = end + 1, width = 0)   /* continuation lines align */
            fprintf(f, "%*s%.*s\n", width < 21 ? 21 - width : 1, "", (int)(end - line), line);
        fprintf(f, "%*s%s", width < 21 ? 21 - width : 1, "", line);
        if (fl->fallback) fprintf(f, " (default %s)", fl->fallback);
        fprintf(f, "\n");
    }
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

static int parse_seed(const char *flag, const char *s, unsigned long long *out)
{
    long v;
    if (!parse_long(flag, s, 0, 2147483647L, &v)) return 0;
    *out = (unsigned long long)v;
    return 1;
}

/* ID=BIAS,ID=BIAS: the ids' range is the core's to check (it names the pair and the vocabulary) */
static int parse_logit_bias(const char *flag, const char *s, options *o)
{
    o->n_logit_bias = 0;
    while (*s) {
        char *end;
        long id;
        double bias;
        errno = 0;
        id = strtol(s, &end, 10);
        if (end == s || *end != '=' || errno || id < INT32_MIN || id > INT32_MAX) goto bad;
        s = end + 1;
        bias = strtod(s, &end);
        if (end == s || (*end != ',' && *end != '\0') || bias != bias) goto bad;
        if (o->n_logit_bias == MAX_LOGIT_BIAS) {
            fprintf(stderr, "colibri-infer: %s takes at most %d pairs\n", flag, MAX_LOGIT_BIAS);
            return 0;
        }
        o->logit_bias[o->n_logit_bias].token = (int32_t)id;
        o->logit_bias[o->n_logit_bias++].bias = (float)bias;
        s = *end ? end + 1 : end;
    }
    return 1;
bad:
    fprintf(stderr, "colibri-infer: %s expects ID=BIAS pairs, comma-separated (5=-inf,17=2.5), got '%s'\n", flag, s);
    return 0;
}

static int parse_kv_type(const char *s, colibri_dtype *kv_type)
{
    if (strcmp(s, "f32") == 0) *kv_type = COLIBRI_DTYPE_F32;
    else if (strcmp(s, "f16") == 0) *kv_type = COLIBRI_DTYPE_F16;
    else if (strcmp(s, "q8_0") == 0) *kv_type = COLIBRI_DTYPE_Q8_0;
    else {
        fprintf(stderr, "colibri-infer: --kv_type is one of f32 f16 q8_0, not %s\n", s);
        return 0;
    }
    return 1;
}

static int parse_routing(const char *s, int *routing)
{
    static const char *const modes[] = { [COLIBRI_ROUTING_MODEL] = "model", [COLIBRI_ROUTING_NOISY] = "noisy",
                                         [COLIBRI_ROUTING_HASH] = "hash", [COLIBRI_ROUTING_CAPACITY] = "capacity" };
    int n_modes = (int)(sizeof modes / sizeof modes[0]), k;
    for (k = 0; k < n_modes; k++)
        if (strcmp(s, modes[k]) == 0) { *routing = k; return 1; }
    fprintf(stderr, "colibri-infer: --routing is one of");
    for (k = 0; k < n_modes; k++) fprintf(stderr, " %s", modes[k]);
    fprintf(stderr, "\n");
    return 0;
}

static int parse_cache(const char *s, int *cache)
{
    if (strcmp(s, "global") == 0) *cache = COLIBRI_CACHE_GLOBAL;
    else if (strcmp(s, "per_layer") == 0) *cache = COLIBRI_CACHE_PER_LAYER;
    else { fprintf(stderr, "colibri-infer: --expert_cache is global or per_layer, not '%s'\n", s); return 0; }
    return 1;
}

/* One flag's value into the options; 0 (after saying why) when it is no value of that flag. */
static int set_option(options *o, int id, const char *v)
{
    char flag[32];
    snprintf(flag, sizeof flag, "--%s", flags[id].name);
    switch (id) {
    case F_MODEL: o->model = v; return 1;
    case F_PROMPT: o->prompt = v; return 1;
    case F_TOKENS: o->tokens = v; return 1;
    case F_MAX_TOKENS: return parse_long(flag, v, 0, 1 << 24, &o->max_tokens);
    case F_TEMPERATURE: return parse_double(flag, v, 0.0, 100.0, &o->temperature);
    case F_TOP_K: return parse_long(flag, v, 0, 1 << 24, &o->top_k);
    case F_TOP_P: return parse_double(flag, v, 0.0, 1.0, &o->top_p);
    case F_MIN_P: return parse_double(flag, v, 0.0, 1.0, &o->min_p);
    case F_REPEAT_PENALTY: return parse_double(flag, v, 0.0, 1e6, &o->repeat_penalty);
    case F_REPEAT_LAST_N: return parse_long(flag, v, -1, COLIBRI_PENALTY_WINDOW, &o->repeat_last_n);
    case F_PRESENCE_PENALTY: return parse_double(flag, v, -1e6, 1e6, &o->presence_penalty);
    case F_FREQUENCY_PENALTY: return parse_double(flag, v, -1e6, 1e6, &o->frequency_penalty);
    case F_LOGIT_BIAS: return parse_logit_bias(flag, v, o);
    case F_SEED: {
        long seed;
        if (!parse_long(flag, v, -1, 2147483647L, &seed)) return 0;
        o->seed = seed;
        return 1;
    }
    case F_CTX: return parse_long(flag, v, 0, 1 << 24, &o->ctx);
    case F_BATCH: return parse_long(flag, v, 0, 4096, &o->batch);
    case F_KV_TYPE: return parse_kv_type(v, &o->kv_type);
    case F_IGNORE_EOS: o->stop_at_eos = 0; return 1;
    case F_STOP:
        if (o->n_stops == COLIBRI_MAX_STOPS) {
            fprintf(stderr, "colibri-infer: --stop: at most %d stop strings\n", COLIBRI_MAX_STOPS);
            return 0;
        }
        o->stops[o->n_stops++] = v;
        return 1;
    case F_RESET_EVERY: return parse_long(flag, v, 0, 1 << 24, &o->reset_every);
    case F_LATENCY: o->latency_path = v; return 1;
    case F_IDS: o->ids = 1; return 1;
    case F_LOGITS: o->logits_path = v; return 1;
    case F_REFERENCE: o->reference_kernels = 1; return 1;
    case F_KERNELS: o->kernels = v; return 1;
    case F_EXPERT_LOAD: o->load_path = v; return 1;
    case F_THREADS: return parse_long(flag, v, 0, 256, &o->threads);
    case F_PROFILE: o->profile_path = v ? v : "profile.json"; return 1;
    case F_ROUTING: return parse_routing(v, &o->routing);
    case F_ROUTING_NOISE: return parse_double(flag, v, 0.0, 1e6, &o->routing_noise);
    case F_ROUTING_SEED: return parse_seed(flag, v, &o->routing_seed);
    case F_CAPACITY_FACTOR: return parse_double(flag, v, 1e-6, 1e6, &o->capacity_factor);
    case F_EXPERT_BUDGET: return parse_size(flag, v, &o->expert_budget);
    case F_EXPERT_CACHE: return parse_cache(v, &o->expert_cache);
    case F_DIRECT_IO: o->direct_io = 1; return 1;
    case F_AS_STORED: o->as_stored = 1; return 1;
    case F_NO_PREFETCH: o->no_prefetch = 1; return 1;
    case F_VERIFY_EXPERTS: o->verify_experts = 1; return 1;
    case F_DEVICE: o->device = v; return 1;
    case F_PLACEMENT: o->placement_path = v; return 1;
    case F_VALIDATE_MODEL: o->validate = 1; return 1;
    case F_MEMDUMP: o->memdump = 1; return 1;
    case F_VERBOSE: o->verbose = 1; return 1;
    default: return 0;
    }
}

typedef enum { PARSED, PARSED_EXIT, PARSE_FAILED } parse_result;

/* getopt_long's table: each flag by its name and, where it has a '_', by the name with '-'. */
static void long_options(struct option *table)
{
    static char dashed[F_COUNT][32];
    int k, n = 0;
    char *c;
    for (k = 0; k < F_COUNT; k++) {
        table[n++] = (struct option){ flags[k].name, flags[k].has_arg, NULL, k };
        if (!strchr(flags[k].name, '_')) continue;
        snprintf(dashed[k], sizeof dashed[k], "%s", flags[k].name);
        for (c = dashed[k]; *c; c++) if (*c == '_') *c = '-';
        table[n++] = (struct option){ dashed[k], flags[k].has_arg, NULL, k };
    }
    table[n] = (struct option){ NULL, 0, NULL, 0 };
}

static parse_result parse_args(int argc, char **argv, options *o)
{
    struct option table[2 * F_COUNT + 1];
    int id, k;
    memset(o, 0, sizeof *o);
    o->stop_at_eos = 1;
    o->reset_every = -1;
    for (k = 0; k < F_COUNT; k++)   /* the table's defaults, through the same parsing as a typed value */
        if (flags[k].fallback && !set_option(o, k, flags[k].fallback)) return PARSE_FAILED;
    long_options(table);
    opterr = 0;   /* the messages are ours */
    /* '+': stop at the first word that is no flag (an error below); ':': a missing value is ':' */
    while ((id = getopt_long(argc, argv, "+:h", table, NULL)) != -1) {
        const char *v = optarg;
        if (id == 'h' || id == F_HELP) { usage(stdout); return PARSED_EXIT; }
        if (id == F_VERSION) { printf("colibri-infer %s\n", COLIBRI_VERSION); return PARSED_EXIT; }
        if (id == ':') { fprintf(stderr, "colibri-infer: %s needs a value (see --help)\n", argv[optind - 1]); return PARSE_FAILED; }
        if (id == '?') {
            if (optopt) fprintf(stderr, "colibri-infer: unknown option -%c (see --help)\n", optopt);
            else fprintf(stderr, "colibri-infer: unknown option %s (see --help)\n", argv[optind - 1]);
            return PARSE_FAILED;
        }
        /* --profile FILE as well as --profile=FILE: a next word that is no flag is the file */
        if (id == F_PROFILE && !v && optind < argc && !(argv[optind][0] == '-' && argv[optind][1] == '-'))
            v = argv[optind++];
        if (!set_option(o, id, v)) return PARSE_FAILED;
    }
    if (optind < argc) { fprintf(stderr, "colibri-infer: unknown option %s (see --help)\n", argv[optind]); return PARSE_FAILED; }
    if (!o->model) { fprintf(stderr, "colibri-infer: --model is required (see --help)\n"); return PARSE_FAILED; }
    return PARSED;
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

/* --seed -1: a seed in [0, 2^31) from the system's entropy (the clock's where there is none),
 * so that --seed repeats the run and a --target run takes it. */
static long long random_seed(void)
{
    unsigned char b[4] = { 0, 0, 0, 0 };
    FILE *f = fopen("/dev/urandom", "rb");
    uint64_t mixed;
    if (!f || fread(b, 1, sizeof b, f) != sizeof b) {
        mixed = now_ns() * UINT64_C(0x9e3779b97f4a7c15);
        memcpy(b, &mixed, sizeof b);
    }
    if (f) fclose(f);
    return (long long)(((uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | b[3]) & 0x7fffffffu);
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


static void write_stdout(void *context, const char *bytes, size_t len)
{
    (void)context;
    fwrite(bytes, 1, len, stdout);
}

/* --ids with --stop: the text is matched, not printed */
static void write_nothing(void *context, const char *bytes, size_t len)
{
    (void)context; (void)bytes; (void)len;
}

/* --validate-model: every load check and the checksums passed (the model is open). */
static int run_validate(const options *o, const colibri_model *model)
{
    printf("%s: valid %s model, %d tensors, %llu weight bytes, checksums match\n", o->model,
           colibri_model_architecture(model), colibri_model_tensor_count(model),
           (unsigned long long)colibri_model_weight_bytes(model));
    return 0;
}

/* --memdump: the session's memory report. */
static int run_memdump(const colibri_session *session)
{
    size_t len;
    char *report;
    colibri_memdump(session, NULL, 0, &len);
    report = malloc(len + 1);
    if (!report) { fprintf(stderr, "colibri-infer: out of memory\n"); return 1; }
    colibri_memdump(session, report, len + 1, NULL);
    fputs(report, stdout);
    free(report);
    return 0;
}

static colibri_session_options session_options(const options *o, const colibri_hparams *hp)
{
    colibri_session_options so;
    memset(&so, 0, sizeof so);
    so.n_ctx = (int32_t)o->ctx;   /* 0: the model's, at most 4096 */
    so.n_batch = (int32_t)o->batch;
    so.kv_type = o->kv_type;
    so.kernels = o->reference_kernels ? COLIBRI_KERNELS_REFERENCE : COLIBRI_KERNELS_AUTO;
    so.kernel_variant = o->kernels;
    so.routing = o->routing;
    so.profile = o->profile_path != NULL;
    so.threads = (int32_t)o->threads;
    so.routing_noise = (float)o->routing_noise;
    so.routing_seed = o->routing_seed;
    /* not given: the model's routing.capacity_factor (the session takes it for 0), else 1 */
    so.capacity_factor = o->capacity_factor > 0 ? (float)o->capacity_factor : hp->capacity_factor > 0 ? 0.0f : 1.0f;
    so.expert_budget = o->expert_budget;
    so.expert_cache = o->expert_cache;
    so.expert_io = (o->direct_io ? COLIBRI_EXPERT_IO_DIRECT : 0u) | (o->no_prefetch ? COLIBRI_EXPERT_IO_NO_PREFETCH : 0u) |
                   (o->verify_experts ? COLIBRI_EXPERT_IO_VERIFY : 0u);
    return so;
}

/* The session the options ask for, its placement applied; NULL after saying why (*rc: the exit code). */
static colibri_session *open_session(const options *o, const colibri_model *model, int *rc)
{
    colibri_session_options so = session_options(o, colibri_model_hparams(model));
    colibri_session *session = NULL;
    colibri_error err;
    if (o->device && colibri_device_find_builtin(o->device) < 0) {
        fprintf(stderr, "colibri-infer: --device %s: no such driver in this build (it has: cpu); remote experts run "
                "from `colibri generate --remote`\n", o->device);
        *rc = 2;
        return NULL;
    }
    if (colibri_session_create(model, &so, &session, &err)) { *rc = fail("cannot create session", &err); return NULL; }
    if (o->placement_path && apply_placement(session, o->placement_path)) {
        colibri_session_destroy(session);
        *rc = 2;
        return NULL;
    }
    return session;
}

/* The prompt's ids: --tokens, the --prompt text encoded, or the model's BOS; 0, or the exit code. */
static int prompt_ids(const colibri_model *model, const char *text, size_t len, int32_t *prompt, size_t *n)
{
    colibri_error err;
    int32_t bos = colibri_model_hparams(model)->bos_token_id;
    if (text && colibri_tokenize(model, text, len, prompt, MAX_PROMPT, n, &err))
        return fail("cannot encode the prompt", &err);
    if (*n > 0) return 0;
    if (bos < 0) {
        fprintf(stderr, "colibri-infer: the model has no BOS token: give a prompt with --tokens\n");
        return 2;
    }
    prompt[(*n)++] = bos;
    return 0;
}

/* Writes `n` items of `size` bytes to `path`, removing a regular file it failed to write. */
static int write_file(const char *flag, const char *path, const void *data, size_t size, size_t n)
{
    FILE *f = fopen(path, "wb");
    int regular, rc = 0;
    if (!f || fwrite(data, size, n, f) != n) rc = 1;
    regular = f && is_regular(f);
    if (f && fclose(f) != 0) rc = 1;
    if (rc) {
        fprintf(stderr, "colibri-infer: %s %s: cannot write it: %s\n", flag, path, strerror(errno));
        if (regular) remove(path);
    }
    return rc;
}

/* The prompt's logits, every position's, to --logits FILE (only once computed: a failed prefill
 * leaves no file); the session then holds the prompt.  0, or the exit code. */
static int prefill_with_logits(const options *o, const colibri_model *model, colibri_session *session,
                               const int32_t *prompt, size_t n_prompt)
{
    size_t count = n_prompt * (size_t)colibri_model_hparams(model)->vocab_size;
    float *all = malloc(count * sizeof(float));   /* (n_prompt, vocab) */
    colibri_error err;
    int rc;
    if (!all) { fprintf(stderr, "colibri-infer: out of memory for the logits\n"); return 1; }
    if (colibri_forward(session, prompt, n_prompt, all, &err)) { free(all); return fail("prefill failed", &err); }
    rc = write_file("--logits", o->logits_path, all, sizeof(float), count);
    free(all);
    return rc;
}

/* What one run generated: the tokens, the soak's resets and each decode step's nanoseconds. */
typedef struct run_stats {
    long generated, resets;
    uint64_t *latency;              /* (max_tokens), allocated before decoding; NULL: not timed */
    size_t n_latency;
} run_stats;

/* Starts (again) a generation of what is left of --max_tokens, the sampler going on from `rng`. */
static int start_round(const options *o, colibri_generation *g, colibri_session *session, const int32_t *prompt,
                       size_t n_prompt, uint64_t rng, long generated)
{
    colibri_generate_options go;
    colibri_error err;
    memset(&go, 0, sizeof go);
    go.max_tokens = (int32_t)(o->max_tokens - generated);
    go.sampling.temperature = (float)o->temperature;
    go.sampling.top_k = (int32_t)o->top_k;
    go.sampling.top_p = (float)o->top_p;
    go.sampling.min_p = (float)o->min_p;
    go.sampling.repeat_penalty = (float)o->repeat_penalty;
    go.sampling.presence_penalty = (float)o->presence_penalty;
    go.sampling.frequency_penalty = (float)o->frequency_penalty;
    go.sampling.penalty_last_n = (int32_t)o->repeat_last_n;
    go.sampling.logit_bias = o->logit_bias;
    go.sampling.n_logit_bias = o->n_logit_bias;
    go.seed = rng;
    go.stop_at_eos = o->stop_at_eos;
    if (colibri_generate_start(g, session, &go, prompt, n_prompt, &err)) return fail("prefill failed", &err);
    return 0;
}

/* The generation loop: each token printed as it comes (text, or ids).  A soak (--reset_every)
 * empties the KV cache and prefills the prompt again at a full context, at the end-of-sequence
 * token and after K tokens, until --max_tokens in all; a round's first token is untimed. */
static int generate(const options *o, colibri_generation *g, int print_ids,
                    colibri_text_stream *text /* attached to g (it prints the text), or NULL */, const int32_t *prompt,
                    size_t n_prompt, run_stats *run)
{
    colibri_error err;
    int32_t token;
    long round_tokens = 0;
    for (;;) {
        uint64_t step_start = now_ns();
        int timed = run->latency && g->generated > 0;
        if (colibri_generate_next(g, &token, &err)) return fail(g->generated ? "decode failed" : "sampling failed", &err);
        if (token < 0) break;
        if (timed) run->latency[run->n_latency++] = now_ns() - step_start;
        if (print_ids) printf(run->generated ? ",%d" : "%d", token);
        fflush(stdout);
        run->generated++;
        round_tokens++;
        if (o->reset_every >= 0 && run->generated < o->max_tokens &&
            (g->stop == COLIBRI_STOP_EOS || g->stop == COLIBRI_STOP_CONTEXT_FULL || round_tokens == o->reset_every)) {
            colibri_session_reset(g->session);
            if (start_round(o, g, g->session, prompt, n_prompt, g->rng, run->generated)) return 1;
            if (text && colibri_generate_text(g, text, &err)) return fail("--stop", &err);
            round_tokens = 0;
            run->resets++;
        }
    }
    return 0;
}

/* --expert_load FILE: the tokens routed to each expert, uint64 (n_layers, n_experts). */
static int write_expert_load(const options *o, const colibri_model *model, const colibri_session *session)
{
    const colibri_hparams *hp = colibri_model_hparams(model);
    size_t count = (size_t)hp->n_layers * (size_t)hp->n_experts;
    uint64_t *load = malloc(count * sizeof(uint64_t));
    FILE *f = fopen(o->load_path, "wb");
    int rc = 0;
    if (!load || !f || colibri_expert_load(session, load) != COLIBRI_OK ||
        fwrite(load, sizeof(uint64_t), count, f) != count) {
        fprintf(stderr, "colibri-infer: cannot write %s\n", o->load_path);
        rc = 1;
    }
    if (f && fclose(f) != 0) rc = 1;
    free(load);
    return rc;
}

/* --profile FILE: nanoseconds per phase, summed over the prompt and the generation (JSON). */
static int write_profile(const options *o, const colibri_model *model, const colibri_session *session,
                         size_t n_prompt, long generated, double wall_seconds)
{
    uint64_t ns[COLIBRI_PHASE_COUNT];
    FILE *f = fopen(o->profile_path, "w");
    int p;
    colibri_profile(session, ns);
    if (!f) { fprintf(stderr, "colibri-infer: --profile %s: %s\n", o->profile_path, strerror(errno)); return 1; }
    fprintf(f, "{\"model\": \"%s\", \"kernels\": \"%s\", \"prompt_tokens\": %zu, \"generated_tokens\": %ld, "
               "\"wall_ns\": %.0f, \"phases_ns\": {", colibri_model_architecture(model), colibri_session_kernels(session),
            n_prompt, generated, 1e9 * wall_seconds);
    for (p = 0; p < COLIBRI_PHASE_COUNT; p++)
        fprintf(f, "%s\"%s\": %llu", p ? ", " : "", colibri_phase_name(p), (unsigned long long)ns[p]);
    fprintf(f, "}}\n");
    if (ferror(f) | fclose(f)) {
        fprintf(stderr, "colibri-infer: --profile %s: cannot write it: %s\n", o->profile_path, strerror(errno));
        return 1;
    }
    return 0;
}

static void print_cache_counters(const colibri_session *session)
{
    colibri_expert_cache_stats cs;
    unsigned long long demanded;
    if (colibri_expert_cache_stats_get(session, &cs) != COLIBRI_OK) return;
    demanded = (unsigned long long)(cs.hits + cs.misses);
    fprintf(stderr, "expert cache: %d slots of %llu B, %d pinned; %llu hits, %llu misses (%.1f%% hit rate), "
                    "%llu prefetches, %llu prefetch hits; %.2f MB read in %llu reads, %.1f ms I/O wait\n",
            cs.slots, (unsigned long long)cs.slot_bytes, cs.pinned, (unsigned long long)cs.hits,
            (unsigned long long)cs.misses, demanded ? 100.0 * (double)cs.hits / (double)demanded : 0.0,
            (unsigned long long)cs.prefetches, (unsigned long long)cs.prefetch_hits,
            (double)cs.bytes_read / 1e6, (unsigned long long)cs.reads, (double)cs.io_wait_ns / 1e6);
}

static void print_session_summary(const colibri_session *session)
{
    colibri_memory_totals mt;
    colibri_memory(session, &mt);
    fprintf(stderr, "session: ctx %d, %s kernels, arena %.2f MB (KV cache %.2f MB, activations %.2f MB), weights mapped %.2f MB\n",
            colibri_session_n_ctx(session), colibri_session_kernels(session), (double)mt.arena_used / 1e6,
            (double)mt.kv_cache / 1e6, (double)mt.activations / 1e6, (double)mt.weights / 1e6);
}

/* The default mode: the prompt printed, prefilled, then tokens until a stop, then the files the
 * flags ask for.  0, or the exit code. */
static int run_generation(const options *o, const colibri_model *model, colibri_session *session,
                          const char *prompt_text, size_t prompt_len, int32_t *prompt /* (MAX_PROMPT) */,
                          size_t n_prompt)
{
    size_t i;
    int ids = o->ids, rc;
    colibri_generation g;
    colibri_text_sink text;
    colibri_text_stream out;
    colibri_error err;
    run_stats run = { 0, 0, NULL, 0 };
    const uint8_t *unused;
    size_t unused_len;
    double t1, t2;

    if ((rc = prompt_ids(model, prompt_text, prompt_len, prompt, &n_prompt)) != 0) return rc;
    colibri_text_sink_init(&text, write_stdout, NULL);
    if (!ids) {
        ids = colibri_token_bytes(model, 0, &unused, &unused_len) != COLIBRI_OK;   /* no vocabulary */
        if (prompt_text && !ids) colibri_text_put(&text, (const uint8_t *)prompt_text, prompt_len);   /* as given, as colibri generate */
        else for (i = 0; i < n_prompt && !ids; i++) colibri_text_put_token(&text, model, prompt[i]);
    }

    t1 = now_seconds();
    if (o->logits_path && (rc = prefill_with_logits(o, model, session, prompt, n_prompt)) != 0) return rc;
    if (start_round(o, &g, session, o->logits_path ? NULL : prompt, o->logits_path ? 0 : n_prompt,
                    (uint64_t)o->seed, 0))
        return 1;
    colibri_text_flush(&text);   /* the prompt's; the generation's text goes through `out` */
    if ((!ids || o->n_stops) && (colibri_text_stream_init(&out, o->stops, o->n_stops, ids ? write_nothing : write_stdout,
                                                           NULL, &err) || colibri_generate_text(&g, &out, &err)))
        return fail("--stop", &err);
    if (o->latency_path && !(run.latency = malloc((size_t)(o->max_tokens > 0 ? o->max_tokens : 1) * sizeof *run.latency))) {
        fprintf(stderr, "colibri-infer: out of memory for --latency\n");
        return 1;
    }
    if (run.latency) memset(run.latency, 0, (size_t)o->max_tokens * sizeof *run.latency);   /* resident now: RSS stays flat while decoding */
    t2 = now_seconds();
    if (o->verbose)
        fprintf(stderr, "prefill: %zu tokens in %.1f ms (%.1f tok/s)\n", n_prompt, 1e3 * (t2 - t1), (double)n_prompt / (t2 - t1));
    rc = generate(o, &g, ids, !ids || o->n_stops ? &out : NULL, prompt, n_prompt, &run);
    printf("\n");
    if (rc == 0 && g.stop == COLIBRI_STOP_CONTEXT_FULL) {   /* before --max_tokens: not what was asked, say so */
        fflush(stdout);
        fprintf(stderr, "colibri-infer: the context of %d tokens is full after %ld of --max_tokens %ld tokens "
                        "(a larger --ctx holds more)\n", colibri_session_n_ctx(session), run.generated, o->max_tokens);
        rc = 1;
    }
    if (run.latency && rc == 0) rc = write_file("--latency", o->latency_path, run.latency, sizeof *run.latency, run.n_latency);
    if (o->load_path && rc == 0) rc = write_expert_load(o, model, session);
    if (o->profile_path && rc == 0) rc = write_profile(o, model, session, n_prompt, run.generated, now_seconds() - t1);
    if (o->verbose && run.generated > 0)
        fprintf(stderr, "decode: %ld tokens in %.1f ms (%.1f tok/s), %ld resets\n", run.generated,
                1e3 * (now_seconds() - t2), (double)run.generated / (now_seconds() - t2), run.resets);
    if (o->verbose && o->expert_budget) print_cache_counters(session);
    free(run.latency);
    return rc;
}

int main(int argc, char **argv)
{
    options o;
    colibri_model *model = NULL;
    colibri_session *session = NULL;
    colibri_error err;
    const colibri_hparams *hp;
    static int32_t prompt[MAX_PROMPT];
    size_t n_prompt = 0, prompt_len = 0;
    char *prompt_text = NULL;
    double t0;
    int rc = 0;

    switch (parse_args(argc, argv, &o)) {
    case PARSED_EXIT: return 0;
    case PARSE_FAILED: return 2;
    case PARSED: break;
    }
    if (o.tokens && !parse_tokens(o.tokens, prompt, MAX_PROMPT, &n_prompt)) return 2;
    if (o.tokens && o.prompt) { fprintf(stderr, "colibri-infer: --prompt and --tokens exclude each other\n"); return 2; }
    if (o.prompt && !(prompt_text = read_prompt(o.prompt, &prompt_len))) {
        fprintf(stderr, "colibri-infer: --prompt %s: cannot read it (at most 64 MiB)\n", o.prompt);
        return 2;
    }

    if (o.seed < 0) {
        o.seed = random_seed();
        if (o.verbose) fprintf(stderr, "seed: %lld (--seed %lld repeats this run)\n", o.seed, o.seed);
    }
    t0 = now_seconds();
    if (colibri_model_open(o.model, (o.validate ? COLIBRI_LOAD_VERIFY : 0u) | (o.as_stored ? COLIBRI_LOAD_AS_STORED : 0u) |
                                    (o.expert_budget ? COLIBRI_LOAD_STREAM_EXPERTS : 0u), &model, &err)) {
        free(prompt_text);
        return fail(o.validate ? "validation failed" : "cannot load model", &err);
    }
    hp = colibri_model_hparams(model);
    if (o.validate) rc = run_validate(&o, model);
    else {
        if (o.verbose)
            fprintf(stderr, "model: %s, %d layers, dim %d, %d experts (top-%d), vocab %d, %.1f MB of weights, loaded in %.1f ms\n",
                    colibri_model_architecture(model), hp->n_layers, hp->hidden_size, hp->n_experts, hp->top_k,
                    hp->vocab_size, (double)colibri_model_weight_bytes(model) / 1e6, 1e3 * (now_seconds() - t0));
        session = open_session(&o, model, &rc);
        if (session && o.memdump) rc = run_memdump(session);
        else if (session) {
            if (o.verbose) print_session_summary(session);
            rc = run_generation(&o, model, session, prompt_text, prompt_len, prompt, n_prompt);
        }
    }
    colibri_session_destroy(session);
    colibri_model_close(model);
    free(prompt_text);
    if (ferror(stdout) | fclose(stdout)) {   /* every write to it, checked once: a full disk is an error */
        fprintf(stderr, "colibri-infer: cannot write standard output: %s\n", strerror(errno));
        return 1;
    }
    return rc;
}
