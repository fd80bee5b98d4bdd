/* SPDX-License-Identifier: MIT */
/* Devices: experts computed by a registered driver give bit for bit the all-cpu run, with one call
 * per MoE layer and chunk; a failed call falls back to the cpu for the same bits; a device whose P90
 * passes its threshold (after exactly 4 slow calls of 32) is bypassed, probed after its back-off and
 * brought back when fast; strict mode fails instead; placement files are checked.
 *
 * The test's driver computes with a second session's cpu driver (colibri_cpu_driver) and can fail a
 * call or report a latency it chooses (task->latency_ns): no sleeping, no clock needed.
 *
 *   test_devices MODEL_DIR */
#include "model_files.h"
#include "colibri/device.h"

#define N_PROMPT 12
#define N_STEPS 10

static int failures;
#define EXPECT(cond, ...) do { if (!(cond)) { fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
    fprintf(stderr, __VA_ARGS__); fprintf(stderr, "\n"); failures++; } } while (0)

static int check(colibri_status st, const colibri_error *err, const char *what)
{
    if (st == COLIBRI_OK) return 0;
    fprintf(stderr, "%s: %s (%s)\n", what, err->message, colibri_status_name(st));
    return 1;
}


static colibri_status injected(colibri_error *err, const char *what)
{
    if (err) {
        err->status = COLIBRI_E_IO;
        snprintf(err->message, sizeof err->message, "injected failure in %s", what);
    }
    return COLIBRI_E_IO;
}

/* The test's device: another session's cpu driver, with faults on request. */
typedef struct test_device {
    colibri_device_driver cpu;      /* the computing session's */
    int64_t calls;
    int64_t fail_at;                /* this call (1-based) fails in sync; 0: none */
    int64_t fail_start_at;          /* this call fails in compute */
    uint64_t latency_ns;            /* reported for every call (0: let the core time it) */
    int64_t max_rows;
} test_device;

static colibri_status dev_compute(void *context, const colibri_device_task *t, colibri_error *err)
{
    test_device *d = context;
    d->calls++;
    if (t->n_rows > d->max_rows) d->max_rows = t->n_rows;
    if (d->calls == d->fail_start_at) return injected(err, "compute");
    return COLIBRI_OK;
}

static colibri_status dev_sync(void *context, colibri_device_task *t, colibri_error *err)
{
    test_device *d = context;
    colibri_status st;
    if (d->calls == d->fail_at) return injected(err, "sync");
    st = d->cpu.sync(d->cpu.context, t, err);
    t->latency_ns = d->latency_ns;
    return st;
}

static test_device device;

/* A fresh device behind `computer`, reporting 1 us a call: emulated targets are too slow for the
 * core's own timing to stay under a threshold. */
static void reset_device(colibri_session *computer)
{
    memset(&device, 0, sizeof device);
    colibri_cpu_driver(computer, &device.cpu);
    device.latency_ns = 1000;
}
static const colibri_device_driver *drivers[1];
static colibri_device_driver driver = { "test", &device, 0, 0, NULL, dev_compute, dev_sync, NULL };

static int moe_layers(const colibri_model *model)
{
    const colibri_hparams *hp = colibri_model_hparams(model);
    return (int)(hp->n_layers - (hp->dense_intermediate_size ? 1 : 0));   /* the fixtures: at most the first layer dense */
}

/* The prompt's logits, then each greedy step's, into out ((1 + N_STEPS), vocab), and the cpu's and
 * the device's statistics into stats[0], stats[1] (when given).  Returns the forward's status. */
static colibri_status run(colibri_model *model, const colibri_session_options *so, float *out,
                          colibri_device_stats *stats, colibri_error *err)
{
    static const int32_t prompt[N_PROMPT] = { 1, 5, 9, 200, 17, 3, 3, 88, 140, 7, 61, 2 };
    colibri_sampling greedy = { .temperature = 0.0f, .top_k = 0, .top_p = 1.0f };
    size_t vocab = (size_t)colibri_model_hparams(model)->vocab_size;
    colibri_session *s;
    colibri_status st;
    uint64_t rng = 1;
    int32_t token, step;
    void *buffer;
    if ((st = create_session(model, so, &s, &buffer, err)) != COLIBRI_OK) return st;
    st = colibri_forward(s, prompt, N_PROMPT, NULL, err);
    if (!st) memcpy(out, colibri_session_logits(s), vocab * sizeof(float));
    for (step = 1; step <= N_STEPS && !st; step++) {
        st = colibri_sample(s, &greedy, &rng, &token, err);
        if (!st) st = colibri_forward(s, &token, 1, NULL, err);
        if (!st) memcpy(out + (size_t)step * vocab, colibri_session_logits(s), vocab * sizeof(float));
    }
    if (stats) {
        colibri_device_stats_get(s, 0, &stats[0]);
        colibri_device_stats_get(s, 1, &stats[1]);
    }
    colibri_session_destroy(s);
    free(buffer);
    return st;
}

static colibri_device_stats stats_of(colibri_session *s, int32_t device)
{
    colibri_device_stats st;
    memset(&st, 0, sizeof st);
    colibri_device_stats_get(s, device, &st);
    return st;
}

int main(int argc, char **argv)
{
    colibri_model *model;
    colibri_session *computer, *s = NULL;
    colibri_session_options so, device_so;
    colibri_error err;
    const colibri_hparams *hp;
    float *want, *got;
    uint8_t *placement;
    size_t vocab, n_logits;
    int threads, l, e, layers;
    void *buffer;
    if (argc < 2) { fprintf(stderr, "usage: test_devices MODEL_DIR\n"); return 2; }
    if (check(load_model_files(argv[1], 0, &model, &err), &err, "load")) return 1;
    hp = colibri_model_hparams(model);
    vocab = (size_t)hp->vocab_size;
    n_logits = (size_t)(N_STEPS + 1) * vocab;
    layers = moe_layers(model);
    want = malloc(n_logits * sizeof(float));
    got = malloc(n_logits * sizeof(float));
    placement = malloc((size_t)hp->n_layers * hp->n_experts);
    if (!want || !got || !placement) return 1;

    /* the computing session behind the test device: one thread, its own arena */
    memset(&device_so, 0, sizeof device_so);
    device_so.n_ctx = 16;
    device_so.threads = 1;
    if (check(create_session(model, &device_so, &computer, &buffer, &err), &err, "computer")) return 1;
    colibri_cpu_driver(computer, &device.cpu);
    drivers[0] = &driver;

#ifdef COLIBRI_BARE_METAL
    for (threads = 1; threads <= 1; threads++) {   /* bare metal runs on one thread */
#else
    for (threads = 1; threads <= 2; threads++) {
#endif
        int placements;
        memset(&so, 0, sizeof so);
        so.n_ctx = 64;
        so.threads = threads;
        if (check(run(model, &so, want, NULL, &err), &err, "all-cpu run")) return 1;
        so.devices = drivers;
        so.n_devices = 1;
        so.placement = placement;
        for (placements = 0; placements < 3; placements++) {   /* every expert, the even ones, layer 1's only */
            colibri_device_stats stats[2], dev, cpu;
            for (l = 0; l < hp->n_layers; l++)
                for (e = 0; e < hp->n_experts; e++)
                    placement[(size_t)l * hp->n_experts + e] = placements == 0 ? 1 : placements == 1 ? (e % 2 == 0) : l == 1;
            reset_device(computer);
            if (check(run(model, &so, got, stats, &err), &err, "device run")) return 1;
            cpu = stats[0];
            dev = stats[1];
            EXPECT(!memcmp(want, got, n_logits * sizeof(float)), "threads %d placement %d: logits differ from the all-cpu run",
                   threads, placements);
            /* at most one call per MoE layer and chunk: 1 prompt chunk and N_STEPS steps */
            EXPECT(dev.calls == (uint64_t)device.calls && dev.calls <= (uint64_t)(layers * (1 + N_STEPS)) && dev.calls > 0,
                   "placement %d: %llu calls for %d MoE layers x %d chunks", placements, (unsigned long long)dev.calls, layers,
                   1 + N_STEPS);
            if (placements == 0)
                EXPECT(dev.calls == (uint64_t)(layers * (1 + N_STEPS)) && cpu.experts == 0,
                       "all on the device: %llu calls, the cpu computed %llu experts", (unsigned long long)dev.calls,
                       (unsigned long long)cpu.experts);
            if (placements == 2)
                EXPECT(dev.calls <= 1 + N_STEPS, "layer 1 only: %llu calls", (unsigned long long)dev.calls);
            EXPECT(dev.errors == 0 && dev.fallbacks == 0 && dev.samples > 0, "no faults: %llu errors %llu fallbacks",
                   (unsigned long long)dev.errors, (unsigned long long)dev.fallbacks);
        }
        if (threads == 1) printf("devices: %d runs (placements all / even experts / one layer) equal the all-cpu run\n", 3);
    }

    /* A failed call (sync on the 3rd, then compute on the 20th): the cpu computes its experts, the
     * same bits; the device is bypassed, probed after its back-off (1 ns here) and used again. */
    memset(&so, 0, sizeof so);
    so.n_ctx = 64;
    so.threads = 1;
    so.devices = drivers;
    so.n_devices = 1;
    so.device_probe_ns = 1;
    memset(placement, 1, (size_t)hp->n_layers * hp->n_experts);
    so.placement = placement;
    {
        colibri_device_stats stats[2], dev;
        reset_device(computer);
        device.fail_at = 3;
        device.fail_start_at = 20;
        if (check(run(model, &so, got, stats, &err), &err, "run with failed calls")) return 1;
        dev = stats[1];
        EXPECT(!memcmp(want, got, n_logits * sizeof(float)), "failed calls: logits differ from the all-cpu run");
        EXPECT(dev.errors == 2 && dev.fallbacks > 0 && dev.probes >= 2 && dev.bypassed == 2 && !dev.bypassed_now,
               "failed calls: %llu errors, %llu fallbacks, %llu probes, bypassed %llu times, now %d",
               (unsigned long long)dev.errors, (unsigned long long)dev.fallbacks, (unsigned long long)dev.probes,
               (unsigned long long)dev.bypassed, (int)dev.bypassed_now);
        EXPECT(stats[0].fallbacks == dev.fallbacks, "the cpu took in %llu of %llu fallbacks",
               (unsigned long long)stats[0].fallbacks, (unsigned long long)dev.fallbacks);
        printf("failed calls: %llu errors, %llu expert computations fell back to the cpu, %llu probes; logits equal\n",
               (unsigned long long)dev.errors, (unsigned long long)dev.fallbacks, (unsigned long long)dev.probes);
    }

    /* Slow calls: 8 ms against the 5 ms threshold.  A full ring of fast calls, then slow ones: the
     * 4th slow call takes the P90 (the 29th smallest of 32) over and bypasses the device. */
    {
        colibri_device_stats dev;
        int i, slow_calls = 0;
        so.device_probe_ns = 1000000000000ull;   /* no probe in this test */
        reset_device(computer);
        if (check(create_session(model, &so, &s, &buffer, &err), &err, "slow session")) return 1;
        for (i = 0; i < 48 && stats_of(s, 1).samples < COLIBRI_LATENCY_RING; i++) {
            int32_t token = 3 + i;
            if (check(colibri_forward(s, &token, 1, NULL, &err), &err, "warm")) return 1;
        }
        EXPECT(stats_of(s, 1).samples == COLIBRI_LATENCY_RING, "ring not full after %d tokens", i);
        device.latency_ns = 8000000;
        while (!stats_of(s, 1).bypassed_now && slow_calls < 40) {
            int32_t token = 5;
            uint64_t before = stats_of(s, 1).calls;
            if (check(colibri_forward(s, &token, 1, NULL, &err), &err, "slow")) return 1;
            slow_calls += (int32_t)(stats_of(s, 1).calls - before);
            if (!stats_of(s, 1).bypassed_now) EXPECT(stats_of(s, 1).slow == (uint64_t)slow_calls, "slow count");
        }
        dev = stats_of(s, 1);
        /* the bypass shows at the 4th slow call, within that token */
        EXPECT(dev.slow == 4 && dev.bypassed_now && dev.p90_ns == 8000000, "bypassed after %llu slow calls, P90 %llu ns",
               (unsigned long long)dev.slow, (unsigned long long)dev.p90_ns);
        printf("slow device: bypassed at slow call %llu of a %d-entry ring (P90 %llu us > 5000 us)\n",
               (unsigned long long)dev.slow, (int)COLIBRI_LATENCY_RING, (unsigned long long)(dev.p90_ns / 1000));
        {   /* bypassed: the next tokens' experts all run on the cpu, none on the device */
            int32_t token = 6;
            uint64_t calls = dev.calls;
            if (check(colibri_forward(s, &token, 1, NULL, &err), &err, "bypassed")) return 1;
            EXPECT(stats_of(s, 1).calls == calls && stats_of(s, 1).fallbacks > dev.fallbacks, "bypassed device still called");
        }
        colibri_session_destroy(s);
        free(buffer);
        s = NULL;
    }

    /* Strict: the failed call is the forward's status, and the position stays. */
    {
        colibri_status st;
        so.device_strict = 1;
        reset_device(computer);
        device.fail_at = 2;
        st = run(model, &so, got, NULL, &err);
        EXPECT(st == COLIBRI_E_DEVICE && strstr(err.message, "device test failed to compute layer") && strstr(err.message, "injected"),
               "strict: %s (%s)", err.message, colibri_status_name(st));
        printf("strict: %s\n", err.message);
        so.device_strict = 0;
    }

    /* Placement files and entries: checked, named, nothing changed on error. */
    {
        static const char *bad[] = {
            "{\"format\": \"colibri-placement\", \"version\": 1, \"experts\": [{\"device\": \"gpu\", \"layer\": 0, \"experts\": [0]}]}",
            "{\"format\": \"colibri-placement\", \"version\": 1, \"experts\": [{\"device\": \"test\", \"layer\": 99, \"experts\": [0]}]}",
            "{\"format\": \"colibri-placement\", \"version\": 1, \"experts\": [{\"device\": \"test\", \"layer\": 0, \"experts\": [999]}]}",
            "{\"format\": \"colibri-placement\", \"version\": 1, \"oops\": 1}",
            "{\"format\": \"colibri-placement\", \"version\": 2}",
            "{\"format\": \"colibri-placement\", \"version\": 1, \"experts\": [{\"device\": \"test\", \"layer\": 0}]}",
            "[1, 2",
        };
        const char *good = "{\"format\": \"colibri-placement\", \"version\": 1, \"default\": \"cpu\", \"experts\": ["
                           "{\"device\": \"test\", \"layer\": \"all\", \"experts\": [1]},"
                           "{\"device\": \"test\", \"layer\": 1, \"experts\": \"all\"}]}";
        static char scratch[65536];
        size_t need, i;
        uint8_t *now = malloc((size_t)hp->n_layers * hp->n_experts);
        so.placement = NULL;
        if (!now || check(create_session(model, &so, &s, &buffer, &err), &err, "placement session")) return 1;
        if (check(colibri_placement_scratch_bytes(s, good, strlen(good), &need, &err), &err, "scratch") ||
            check(colibri_placement_parse(s, good, strlen(good), scratch, sizeof scratch, &err), &err, "parse"))
            return 1;
        colibri_placement_get(s, now);
        for (l = 0; l < hp->n_layers; l++)
            for (e = 0; e < hp->n_experts; e++)
                EXPECT(now[(size_t)l * hp->n_experts + e] == (l == 1 || e == 1), "placement file: layer %d expert %d on %d", l, e,
                       now[(size_t)l * hp->n_experts + e]);
        for (i = 0; i < sizeof bad / sizeof bad[0]; i++) {
            colibri_status st = colibri_placement_parse(s, bad[i], strlen(bad[i]), scratch, sizeof scratch, &err);
            EXPECT(st != COLIBRI_OK, "bad placement %zu accepted", i);
            printf("bad placement %zu: %s\n", i, err.message);
        }
        colibri_placement_get(s, placement);
        EXPECT(!memcmp(now, placement, (size_t)hp->n_layers * hp->n_experts), "a bad file changed the placement");
        EXPECT(colibri_place(s, 0, hp->n_experts, 1, &err) == COLIBRI_E_ARG, "expert out of range placed");
        EXPECT(colibri_place(s, 0, 0, 2, &err) == COLIBRI_E_ARG, "device out of range placed");
        EXPECT(colibri_place(s, -1, -1, 0, &err) == COLIBRI_OK && colibri_device_find(s, "test") == 1
               && colibri_device_find(s, "cpu") == 0 && colibri_device_count(s) == 2, "place all on the cpu");
        colibri_session_destroy(s);
        free(buffer);
        free(now);
        s = NULL;
    }

    /* colibri_experts_compute refuses what it cannot compute, by name */
    {
        int32_t experts[2] = { 1, 0 }, rows[3] = { 0, 1, 2 };
        float *x = calloc((size_t)2 * hp->hidden_size, sizeof(float)), *y = calloc((size_t)2 * hp->hidden_size, sizeof(float));
        colibri_device_task t;
        memset(&t, 0, sizeof t);
        t.layer = 1; t.n_experts = 2; t.experts = experts; t.rows = rows; t.x = x; t.y = y; t.n_rows = 2;
        t.hidden_size = hp->hidden_size;
        EXPECT(colibri_experts_compute(computer, &t, &err) == COLIBRI_E_ARG && strstr(err.message, "ascending"), "unsorted: %s", err.message);
        experts[0] = 0; experts[1] = 1;
        t.layer = hp->n_layers;
        EXPECT(colibri_experts_compute(computer, &t, &err) == COLIBRI_E_ARG && strstr(err.message, "layer"), "layer: %s", err.message);
        t.layer = 1; t.hidden_size = 3;
        EXPECT(colibri_experts_compute(computer, &t, &err) == COLIBRI_E_ARG && strstr(err.message, "hidden_size"), "hidden: %s", err.message);
        t.hidden_size = hp->hidden_size; rows[1] = 0;
        EXPECT(colibri_experts_compute(computer, &t, &err) == COLIBRI_E_ARG && strstr(err.message, "rows"), "rows: %s", err.message);
        rows[1] = 1;
        EXPECT(colibri_experts_compute(computer, &t, &err) == COLIBRI_OK, "valid task: %s", err.message);
        free(x);
        free(y);
    }

    colibri_session_destroy(computer);
    free(want);
    free(got);
    free(placement);
    colibri_model_close(model);
    free_model_files();
    if (failures) { fprintf(stderr, "%d failures\n", failures); return 1; }
    printf("devices: all checks passed\n");
    return 0;
}
