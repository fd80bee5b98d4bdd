/* SPDX-License-Identifier: MIT */
/* A chunk's device calls, for the MoE block (moe/block.c):
 *
 *   start    each kept expert's device picked (devices.c); each device's experts gathered into its
 *            rows of x (rows, dim), their gates beside them, and its call started
 *   collect  device i's call synced and recorded; a failed call's experts computed here from the
 *            rows it was given (the same inputs: the same bits)
 *   drain    after an error: every started call synced, its outputs dropped
 *
 * Strict: a bypassed device, a failed start or a failed call is the forward's status. */
#include <string.h>

#include "devices.h"
#include "../moe/moe.h"
#include "../util.h"

/* Strict: a driver's failure (its message in err) as the forward's status. */
static colibri_status device_failed(colibri_error *err, const colibri_device_state *s, int32_t layer, const char *what)
{
    char detail[COLIBRI_ERROR_MESSAGE_SIZE] = "";
    if (err) memcpy(detail, err->message, sizeof detail);
    detail[sizeof detail - 1] = '\0';
    return colibri_fail(err, COLIBRI_E_DEVICE, "device %s failed to %s layer %d (strict, no fallback): %s", s->driver->name,
                        what, layer, detail);
}

colibri_status colibri_devices_start_calls(const colibri_moe_context *c, const float *x, colibri_error *err)
{
    const colibri_moe_buffers *b = c->b;
    colibri_devices *dev = c->dev;
    int32_t E = c->hp->n_experts, d = c->hp->hidden_size, layer = c->layer, row = 0, e, i;
    uint64_t now = colibri_devices_now(dev);
    colibri_status st;
    memset(dev->run_on, 0, (size_t)E);
    for (e = 0; e < E; e++) {
        int32_t on;
        if (!colibri_moe_kept(b, e)) continue;
        st = colibri_device_pick(dev, layer, e, now, &on, err);
        if (st) return st;
        dev->run_on[e] = (uint8_t)on;
        if (!on) { dev->dev[0].stats.experts++; dev->dev[0].stats.rows += (uint64_t)colibri_moe_kept(b, e); }
    }
    for (i = 1; i < dev->n; i++) {
        colibri_device_state *s = &dev->dev[i];
        colibri_device_task *t = &s->task;
        int32_t n = 0, first = row;
        for (e = 0; e < E; e++) {
            int32_t m = colibri_moe_kept(b, e);
            if (!m || dev->run_on[e] != i) continue;
            colibri_moe_gather(c, x, b->expert_start[e], m, dev->x + (size_t)row * d);   /* (m, dim) */
            memcpy(dev->gates + row, b->pair_gate + b->expert_start[e], (size_t)m * sizeof(float));
            dev->first_row[e] = row;
            s->task_experts[n] = e;
            s->task_rows[n++] = row - first;
            row += m;
        }
        if (!n) continue;
        s->task_rows[n] = row - first;
        t->layer = layer; t->n_experts = n; t->experts = s->task_experts; t->rows = s->task_rows;
        t->gates = dev->gates + first; t->x = dev->x + (size_t)first * d; t->y = dev->y + (size_t)first * d;
        t->n_rows = row - first; t->hidden_size = d; t->latency_ns = 0;
        s->pending = 1;
        s->stats.calls++;
        s->started_ns = colibri_devices_now(dev);
        s->failed = s->driver->compute(s->driver->context, t, err) != COLIBRI_OK;
        if (s->failed && dev->strict) return device_failed(err, s, layer, "start");
    }
    return COLIBRI_OK;
}

colibri_status colibri_devices_collect(const colibri_moe_context *c, int32_t i, colibri_error *err)
{
    colibri_devices *dev = c->dev;
    colibri_device_state *s = &dev->dev[i];
    colibri_device_task *t = &s->task;
    colibri_status st = COLIBRI_E_DEVICE;
    uint64_t now;
    int32_t d = c->hp->hidden_size, j;
    if (!s->pending) return COLIBRI_OK;
    s->pending = 0;
    if (!s->failed) st = s->driver->sync(s->driver->context, t, err);
    now = colibri_devices_now(dev);
    colibri_device_record(dev, i, t->latency_ns ? t->latency_ns : now - s->started_ns, st != COLIBRI_OK, now);
    if (st == COLIBRI_OK) {
        s->stats.experts += (uint64_t)t->n_experts;
        s->stats.rows += (uint64_t)t->n_rows;
        return COLIBRI_OK;
    }
    if (dev->strict) return device_failed(err, s, t->layer, "compute");
    for (j = 0; j < t->n_experts; j++) {
        int32_t r = t->rows[j], m = t->rows[j + 1] - r;
        st = colibri_moe_expert_rows(c, t->experts[j], t->x + (size_t)r * d, m, t->y + (size_t)r * d, err);
        if (st) return st;
        s->stats.fallbacks++;
        dev->dev[0].stats.fallbacks++;
        dev->dev[0].stats.experts++;
        dev->dev[0].stats.rows += (uint64_t)m;
    }
    return COLIBRI_OK;
}

colibri_status colibri_devices_collect_all(const colibri_moe_context *c, colibri_error *err)
{
    int32_t i;
    for (i = 1; i < c->dev->n; i++) {
        colibri_status st = colibri_devices_collect(c, i, err);
        if (st) return st;
    }
    return COLIBRI_OK;
}

const float *colibri_devices_output(const colibri_moe_context *c, int32_t e)
{
    return c->dev->y + (size_t)c->dev->first_row[e] * c->hp->hidden_size;
}

void colibri_devices_drain(colibri_devices *dev)
{
    int32_t i;
    for (i = 1; i < dev->n; i++) {
        colibri_device_state *s = &dev->dev[i];
        if (s->pending && !s->failed) s->driver->sync(s->driver->context, &s->task, NULL);
        s->pending = 0;
    }
}
