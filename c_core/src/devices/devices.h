/* SPDX-License-Identifier: MIT */
/* A session's devices (colibri/device.h), their one room (c_core/src/devices/):
 *
 *   devices.c     the drivers, each device's latency ring and state; which device runs each hit
 *                 expert (colibri_device_pick) and each call's outcome (colibri_device_record),
 *                 which is where a device gets bypassed and comes back
 *   calls.c       a chunk's calls for the MoE block: start, collect, drain
 *   placement.c   the public entries: names, placement (by entry, table or file), statistics
 *   cpu_driver.c  the cpu as a driver, computing experts for others */
#ifndef COLIBRI_DEVICES_H
#define COLIBRI_DEVICES_H

#include "colibri/device.h"
#include "../mem/arena.h"
#include "../model/model.h"

typedef struct colibri_device_state {
    const colibri_device_driver *driver;    /* NULL: device 0, the cpu */
    uint8_t *holds;                 /* (n_layers, n_experts) what it can compute; NULL: everything */
    uint64_t ring[COLIBRI_LATENCY_RING];    /* the last calls' latencies, oldest overwritten */
    int32_t ring_next;
    int32_t bypassed;               /* its experts go to the fallback until retry_at */
    uint64_t retry_at;
    uint64_t backoff_ns;
    colibri_device_stats stats;
    /* its call for the layer being computed */
    colibri_device_task task;
    int32_t *task_experts;          /* (n_experts) */
    int32_t *task_rows;             /* (n_experts + 1) */
    int32_t pending;                /* compute() made, sync() not yet */
    int32_t failed;                 /* compute() failed: sync() is not called, the cpu computes its experts */
    int32_t probe;                  /* the call is a probe after a back-off */
    uint64_t started_ns;
} colibri_device_state;
#define COLIBRI_DEVICE_STATE_SLOT 640

typedef struct colibri_devices {
    int32_t n;                      /* devices, the cpu included */
    int32_t n_layers, n_experts;
    colibri_device_state *dev;      /* (n) */
    uint8_t *placement;             /* (n_layers, n_experts) */
    uint8_t *run_on;                /* (n_experts) the layer being computed: each hit expert's device */
    int32_t *first_row;             /* (n_experts) where an expert run on a device has its rows in x, y */
    float *x;                       /* (n_batch * top_k, dim) the devices' inputs, device by device */
    float *y;                       /* (n_batch * top_k, dim) their outputs */
    float *gates;                   /* (n_batch * top_k) */
    uint64_t threshold_ns, probe_ns;
    int32_t strict;
    uint64_t ticks;                 /* stands in for the clock where the platform has none */
} colibri_devices;
#define COLIBRI_DEVICES_SLOT 128

/* Carves the devices of a session with n_drivers drivers beyond the cpu (measuring when a->base is NULL). */
void colibri_devices_carve(colibri_devices **out, colibri_arena *a, const colibri_model *m, int32_t n_drivers,
                           int32_t n_batch);

/* Fills the carved devices from the options: the drivers (their init marks what they hold), the
 * thresholds, the placement (validated). */
colibri_status colibri_devices_start(colibri_devices *d, const colibri_model *m, const colibri_session_options *o,
                                     colibri_error *err);
void colibri_devices_stop(colibri_devices *d);

/* Checks that `device` may compute expert (layer, e): it holds it and computes its dtypes. */
colibri_status colibri_device_can_place(const colibri_devices *d, const colibri_model *m, int32_t layer, int32_t e,
                                        int32_t device, colibri_error *err);

/* The clock the devices use: the platform's, or a count of decisions where it has none. */
uint64_t colibri_devices_now(colibri_devices *d);

/* The device expert (layer, e) runs on in this chunk: its placement's, unless that one is bypassed
 * (then a probe when its back-off has passed, else the fallback).  Strict: a bypassed device is
 * COLIBRI_E_DEVICE. */
colibri_status colibri_device_pick(colibri_devices *d, int32_t layer, int32_t e, uint64_t now, int32_t *device,
                                   colibri_error *err);

/* A call of device `i` came back after latency_ns (failed: it errored or missed its deadline):
 * into its ring; bypasses the device or brings it back. */
void colibri_device_record(colibri_devices *d, int32_t i, uint64_t latency_ns, int failed, uint64_t now);

/* The 90th percentile of the ring's samples (the ceil(0.9 n)-th smallest); 0 when empty. */
uint64_t colibri_device_p90(const colibri_device_state *s);

/* 1 when expert (layer, e) is placed on a driver in use (not bypassed): the cpu need not read it. */
int colibri_device_takes(const colibri_devices *d, int32_t layer, int32_t e);

/* ---- a chunk's calls, for the MoE block (calls.c) ---- */
struct colibri_moe_context;

/* Picks each kept expert's device, then gathers each device's experts into its rows of d->x and
 * starts its call: before the local experts run, so the devices compute while they do. */
colibri_status colibri_devices_start_calls(const struct colibri_moe_context *c, const float *x, colibri_error *err);

/* The device that runs expert e in this chunk (after colibri_devices_start_calls): 0, the cpu. */
static inline int32_t colibri_device_of(const colibri_devices *d, int32_t e) { return d->run_on[e]; }

/* Device i's outputs for this chunk ready in d->y: its call synced and recorded, or, when it
 * failed, its experts computed here (colibri_moe_expert_rows).  _all: every device's. */
colibri_status colibri_devices_collect(const struct colibri_moe_context *c, int32_t i, colibri_error *err);
colibri_status colibri_devices_collect_all(const struct colibri_moe_context *c, colibri_error *err);

/* Expert e's outputs (m, dim), once its device is collected. */
const float *colibri_devices_output(const struct colibri_moe_context *c, int32_t e);

/* After an error: every started call synced, its outputs dropped, so none outlives the chunk. */
void colibri_devices_drain(colibri_devices *d);

#endif
