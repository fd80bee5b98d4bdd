/* SPDX-License-Identifier: MIT */
/* A session's devices: carving, the drivers' start, the choice of device per expert, and the
 * latency ring that bypasses a slow or failing device and brings it back. */
#include <string.h>

#include "devices.h"
#include "../ops/ops.h"
#include "../platform.h"
#include "../util.h"

COLIBRI_SLOT_CHECK(colibri_device_state, COLIBRI_DEVICE_STATE_SLOT);
COLIBRI_SLOT_CHECK(colibri_devices, COLIBRI_DEVICES_SLOT);

#define MAX_BACKOFF 64      /* the back-off doubles up to 64 times the first */
#define MIN_SAMPLES 10      /* a P90 of fewer latencies is their maximum: one slow start is not a slow device */

void colibri_devices_carve(colibri_devices **out, colibri_arena *a, const colibri_model *m, int32_t n_drivers,
                           int32_t n_batch)
{
    const colibri_hparams *hp = &m->hp;
    size_t E = (size_t)hp->n_experts, L = (size_t)hp->n_layers, D = (size_t)hp->hidden_size;
    size_t rows = (size_t)n_batch * (size_t)hp->top_k, n = (size_t)n_drivers + 1, i;
    colibri_devices *d = colibri_arena_carve(a, COLIBRI_DEVICES_SLOT, ARENA_DEVICES, "devices", -1, "struct");
    colibri_device_state *dev = colibri_arena_carve(a, n * COLIBRI_DEVICE_STATE_SLOT, ARENA_DEVICES, "device_states", -1,
                                                    "(devices) struct");
    uint8_t *placement = colibri_arena_carve(a, L * E, ARENA_DEVICES, "placement", -1, "(n_layers, n_experts) u8");
    uint8_t *run_on = colibri_arena_carve(a, E, ARENA_DEVICES, "run_on", -1, "(n_experts) u8");
    int32_t *first_row = colibri_arena_carve(a, E * sizeof(int32_t), ARENA_DEVICES, "first_row", -1, "(n_experts) i32");
    float *x = colibri_arena_carve(a, colibri_arena_bytes(a, rows, D, sizeof(float)), ARENA_DEVICES, "device_in", -1,
                                   "(n_batch * top_k, dim) f32");
    float *y = colibri_arena_carve(a, colibri_arena_bytes(a, rows, D, sizeof(float)), ARENA_DEVICES, "device_out", -1,
                                   "(n_batch * top_k, dim) f32");
    float *gates = colibri_arena_carve(a, rows * sizeof(float), ARENA_DEVICES, "device_gates", -1, "(n_batch * top_k) f32");
    if (d) {
        memset(d, 0, sizeof *d);
        d->n = (int32_t)n;
        d->n_layers = hp->n_layers;
        d->n_experts = hp->n_experts;
        d->dev = dev;
        d->placement = placement;
        d->run_on = run_on;
        d->first_row = first_row;
        d->x = x;
        d->y = y;
        d->gates = gates;
    }
    for (i = 0; i < n; i++) {   /* each driver: what it holds, its task's tables */
        uint8_t *holds = i ? colibri_arena_carve(a, L * E, ARENA_DEVICES, "holds", -1, "(n_layers, n_experts) u8") : NULL;
        int32_t *experts = colibri_arena_carve(a, E * sizeof(int32_t), ARENA_DEVICES, "task_experts", -1, "(n_experts) i32");
        int32_t *task_rows = colibri_arena_carve(a, (E + 1) * sizeof(int32_t), ARENA_DEVICES, "task_rows", -1, "(n_experts + 1) i32");
        if (d && dev) {
            memset(&dev[i], 0, sizeof dev[i]);
            dev[i].holds = holds;
            dev[i].task_experts = experts;
            dev[i].task_rows = task_rows;
        }
    }
    *out = d;
}

colibri_status colibri_device_can_place(const colibri_devices *d, const colibri_model *m, int32_t layer, int32_t e,
                                        int32_t device, colibri_error *err)
{
    const colibri_device_state *s;
    int32_t k;
    if (device < 0 || device >= d->n)
        return colibri_fail(err, COLIBRI_E_ARG, "device %d: the session has %d (cpu and %d drivers)", device, d->n, d->n - 1);
    s = &d->dev[device];
    if (!s->driver) return COLIBRI_OK;
    if (!m->layers[layer].moe)
        return colibri_fail(err, COLIBRI_E_ARG, "layer %d is dense: it has no routed experts to place", layer);
    if (s->holds && !s->holds[(size_t)layer * d->n_experts + e])
        return colibri_fail(err, COLIBRI_E_ARG, "device %s does not hold layer %d expert %d", s->driver->name, layer, e);
    for (k = L_EXPERT_FIRST; k < L_EXPERT_FIRST + L_EXPERT_KINDS; k++) {
        const colibri_weight *w = &m->layers[layer].w[k];
        if (w->data && (s->driver->dtypes || colibri_dtypes[w->dtype].rows > 1) && !(s->driver->dtypes & (1u << w->dtype)))
            return colibri_fail(err, COLIBRI_E_ARG, "device %s does not compute %s weights (layer %d experts)",
                                s->driver->name, colibri_dtype_name(w->dtype), layer);
    }
    return COLIBRI_OK;
}

colibri_status colibri_devices_start(colibri_devices *d, const colibri_model *m, const colibri_session_options *o,
                                     colibri_error *err)
{
    int32_t i, j, l, e;
    d->threshold_ns = o->device_threshold_ns ? o->device_threshold_ns : COLIBRI_DEVICE_THRESHOLD_NS;
    d->probe_ns = o->device_probe_ns ? o->device_probe_ns : COLIBRI_DEVICE_PROBE_NS;
    d->strict = o->device_strict != 0;
    d->dev[0].stats.threshold_ns = d->threshold_ns;
    for (i = 1; i < d->n; i++) {
        const colibri_device_driver *drv = o->devices[i - 1];
        colibri_device_state *s = &d->dev[i];
        size_t len;
        if (!drv || !drv->name || !drv->compute || !drv->sync)
            return colibri_fail(err, COLIBRI_E_ARG, "device %d: a driver needs a name, compute and sync", i);
        len = strlen(drv->name);
        if (len < 1 || len > 15 || !strcmp(drv->name, "cpu"))
            return colibri_fail(err, COLIBRI_E_ARG, "device %d: a driver's name is 1 to 15 characters, not \"cpu\"", i);
        for (j = 1; j < i; j++)
            if (!strcmp(d->dev[j].driver->name, drv->name))
                return colibri_fail(err, COLIBRI_E_ARG, "devices %d and %d are both named \"%s\"", j, i, drv->name);
        s->driver = drv;
        s->stats.threshold_ns = drv->threshold_ns ? drv->threshold_ns : d->threshold_ns;
        s->backoff_ns = d->probe_ns;
        memset(s->holds, 1, (size_t)d->n_layers * d->n_experts);
        if (drv->init) {
            colibri_status st = drv->init(drv->context, m, s->holds, err);
            if (st) return st;
        }
    }
    memset(d->placement, 0, (size_t)d->n_layers * d->n_experts);
    if (!o->placement) return COLIBRI_OK;
    for (l = 0; l < d->n_layers; l++)
        for (e = 0; e < d->n_experts; e++) {
            int32_t dev = o->placement[(size_t)l * d->n_experts + e];
            if (!m->layers[l].moe) continue;
            if (colibri_device_can_place(d, m, l, e, dev, err)) return err ? err->status : COLIBRI_E_ARG;
            d->placement[(size_t)l * d->n_experts + e] = (uint8_t)dev;
        }
    return COLIBRI_OK;
}

void colibri_devices_stop(colibri_devices *d)
{
    int32_t i;
    for (i = 1; i < d->n; i++)
        if (d->dev[i].driver && d->dev[i].driver->release) d->dev[i].driver->release(d->dev[i].driver->context);
}

uint64_t colibri_devices_now(colibri_devices *d)
{
    uint64_t now = colibri_platform_now_ns();
    return now ? now : ++d->ticks * 1000000u;   /* no clock: each decision counts as a millisecond */
}

uint64_t colibri_device_p90(const colibri_device_state *s)
{
    uint64_t sorted[COLIBRI_LATENCY_RING], v;
    int32_t n = s->stats.samples, i, j;
    if (!n) return 0;
    for (i = 0; i < n; i++) {   /* insertion sort of at most 32 */
        v = s->ring[i];
        for (j = i; j > 0 && sorted[j - 1] > v; j--) sorted[j] = sorted[j - 1];
        sorted[j] = v;
    }
    return sorted[(9 * n + 9) / 10 - 1];   /* the ceil(0.9 n)-th smallest */
}

int colibri_device_takes(const colibri_devices *d, int32_t layer, int32_t e)
{
    int32_t on = d->placement[(size_t)layer * d->n_experts + e];
    return on && !d->dev[on].bypassed;
}

/* The lowest-P90 device other than `avoid`, in use and holding (layer, e); 0 (the cpu) if none. */
static int32_t fallback_for(const colibri_devices *d, int32_t layer, int32_t e, int32_t avoid)
{
    int32_t best = 0, i;
    uint64_t best_p90 = 0;
    for (i = 1; i < d->n; i++) {
        const colibri_device_state *s = &d->dev[i];
        if (i == avoid || s->bypassed || !s->holds[(size_t)layer * d->n_experts + e]) continue;
        if (!best || s->stats.p90_ns < best_p90) { best = i; best_p90 = s->stats.p90_ns; }
    }
    return best;
}

colibri_status colibri_device_pick(colibri_devices *d, int32_t layer, int32_t e, uint64_t now, int32_t *device,
                                   colibri_error *err)
{
    int32_t placed = d->placement[(size_t)layer * d->n_experts + e];
    colibri_device_state *s = &d->dev[placed];
    *device = placed;
    if (!placed || !s->bypassed) return COLIBRI_OK;
    if (s->probe || now >= s->retry_at) {   /* its back-off passed: this chunk's call on it is a probe */
        if (!s->probe) s->stats.probes++;
        s->probe = 1;
        return COLIBRI_OK;
    }
    if (d->strict)
        return colibri_fail(err, COLIBRI_E_DEVICE, "device %s is bypassed (%llu errors, %llu slow calls; P90 %llu us, "
                            "threshold %llu us) and the session is strict: layer %d expert %d is not computed elsewhere "
                            "until the device's back-off passes", s->driver->name, (unsigned long long)s->stats.errors,
                            (unsigned long long)s->stats.slow, (unsigned long long)(s->stats.p90_ns / 1000),
                            (unsigned long long)(s->stats.threshold_ns / 1000), layer, e);
    *device = fallback_for(d, layer, e, placed);
    s->stats.fallbacks++;
    d->dev[*device].stats.fallbacks += *device == 0;
    return COLIBRI_OK;
}

void colibri_device_record(colibri_devices *d, int32_t i, uint64_t latency_ns, int failed, uint64_t now)
{
    colibri_device_state *s = &d->dev[i];
    uint64_t threshold = s->stats.threshold_ns;
    int slow = failed || latency_ns > threshold;
    s->stats.last_ns = latency_ns;
    s->stats.errors += failed != 0;
    s->stats.slow += slow;
    if (s->probe) {
        s->probe = 0;
        if (!slow) {   /* back: its ring starts over from this call */
            s->bypassed = 0;
            s->stats.samples = 0;
            s->ring_next = 0;
            s->backoff_ns = d->probe_ns;
        } else if (s->backoff_ns < d->probe_ns * MAX_BACKOFF) {
            s->backoff_ns *= 2;
        }
    }
    s->ring[s->ring_next] = failed && latency_ns <= threshold ? threshold + 1 : latency_ns;   /* a failure counts as over */
    s->ring_next = (s->ring_next + 1) % COLIBRI_LATENCY_RING;
    if (s->stats.samples < COLIBRI_LATENCY_RING) s->stats.samples++;
    s->stats.p90_ns = colibri_device_p90(s);
    if (failed || (s->stats.samples >= MIN_SAMPLES && s->stats.p90_ns > threshold)) {
        if (!s->bypassed) s->stats.bypassed++;
        s->bypassed = 1;
        s->retry_at = now + s->backoff_ns;
    }
    s->stats.bypassed_now = s->bypassed;
}
