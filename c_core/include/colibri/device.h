/* SPDX-License-Identifier: MIT */
/* Devices: where a session's routed experts are computed.
 *
 * Device 0 of every session is the built-in `cpu` driver: the session's own kernels and threads,
 * with the experts where the model keeps them (mapped, or streamed through the expert cache).  A
 * host program adds its own drivers (an accelerator, another machine) in the session options;
 * each (layer, expert) is bound to one device by the placement, all `cpu` unless set.
 *
 *   per MoE layer and forward chunk, for every device with hit experts bound to it:
 *     compute(task)   started before the local experts run: the device's experts, their tokens
 *                     gathered in rows of task->x, ascending expert ids
 *     sync(task)      after the local experts: waits until task->y holds every row's output
 *   the outputs then add in expert-id order, the device's as the local ones would: with the same
 *   kernels a device gives the same bits as the CPU.
 *
 * Latency-aware fallback: each device keeps the latencies of its last COLIBRI_LATENCY_RING calls.
 * When their 90th percentile (once it has 10) passes the device's threshold, or a call fails, the device is
 * bypassed: its experts run on the fallback (the lowest-P90 device under its threshold that holds
 * them, else the cpu) and the device is tried again after a back-off that doubles while it stays
 * slow.  A call answered under the threshold after the back-off brings it back (its ring starts
 * over).  With `device_strict` nothing falls back: a failed call fails the forward, and so does a
 * bypassed device's expert until its back-off has passed and a probe is made.
 *
 * Everything lives in the session arena; no call allocates.  With no drivers registered the
 * forward pass never looks at any of it. */
#ifndef COLIBRI_DEVICE_H
#define COLIBRI_DEVICE_H

#include "colibri/colibri.h"

#ifdef __cplusplus
extern "C" {
#endif

#define COLIBRI_MAX_DEVICES 8           /* the cpu and up to 7 drivers */
#define COLIBRI_LATENCY_RING 32         /* latencies each device keeps for its P90 */
#define COLIBRI_DEVICE_THRESHOLD_NS 5000000ull   /* the default threshold: 5 ms */
#define COLIBRI_DEVICE_PROBE_NS 250000000ull     /* the first back-off: 250 ms, doubling up to 64x */

/* One device call: some experts of one layer over the tokens routed to them. */
typedef struct colibri_device_task {
    int32_t layer;
    int32_t n_experts;
    const int32_t *experts;     /* (n_experts) ascending ids */
    const int32_t *rows;        /* (n_experts + 1) expert i's tokens are rows [rows[i], rows[i + 1]) */
    const float *gates;         /* (n_rows) each row's router weight, applied by the caller afterwards
                                   (already applied to x for models that gate the input) */
    const float *x;             /* (n_rows, hidden_size) the experts' inputs */
    float *y;                   /* (n_rows, hidden_size) the experts' outputs, filled by sync */
    int32_t n_rows;
    int32_t hidden_size;
    uint64_t latency_ns;        /* the driver may set it in sync: the call's own duration (a network
                                   round trip); 0: the core times compute() to sync's return */
} colibri_device_task;

struct colibri_device_driver {   /* typedef'd in colibri.h */
    const char *name;           /* unique in the session, 1 to 15 characters */
    void *context;
    uint32_t dtypes;            /* bit 1u << dtype for each weight dtype it computes; 0: every dtype
                                   but the row-interleaved ones (q4_0x8, q8_0x8), which it must name */
    uint64_t threshold_ns;      /* its P90 over this bypasses it; 0: the session's device_threshold_ns */
    /* At session creation (optional): holds (n_layers, n_experts) is all 1 on entry; clear the
     * experts it cannot compute.  An error fails the session's creation. */
    colibri_status (*init)(void *context, const colibri_model *model, uint8_t *holds, colibri_error *err);
    /* Starts the task; may return before it is done.  An error counts as a failed call. */
    colibri_status (*compute)(void *context, const colibri_device_task *task, colibri_error *err);
    /* Waits for the task compute() started and fills task->y (and task->latency_ns). */
    colibri_status (*sync)(void *context, colibri_device_task *task, colibri_error *err);
    /* At session destruction (optional). */
    void (*release)(void *context);
};

/* The driver of device 0: `cpu`, computing with `session`'s kernels and threads, synchronously
 * (context is `session`).  To register it in another session give it another name first: `cpu`
 * is always device 0's. */
void colibri_cpu_driver(colibri_session *session, colibri_device_driver *driver);

/* The cpu driver's computation, synchronous: task->y (n_rows, hidden) = each expert's FFN of its
 * rows of task->x, with the session's kernels (as a forward pass computes them: the same bits).
 * COLIBRI_E_ARG names an out-of-range layer, a dense layer, an expert id out of range or not
 * ascending, rows that do not partition [0, n_rows), a wrong hidden_size. */
colibri_status colibri_experts_compute(colibri_session *session, colibri_device_task *task, colibri_error *err);

/* colibri_experts_compute's checks of a task without computing it (x and y are not read): a caller
 * that merges tasks checks each one first, so that a malformed task never fails the others'. */
colibri_status colibri_experts_check(const colibri_session *session, const colibri_device_task *task,
                                     colibri_error *err);

/* ---- placement: (n_layers, n_experts) device indices -------------------- */

int32_t colibri_device_count(const colibri_session *session);                 /* 1 + drivers */
const char *colibri_device_name(const colibri_session *session, int32_t device);   /* NULL past the end */
/* -1 when no device has that name. */
int32_t colibri_device_find(const colibri_session *session, const char *name);

/* Binds expert (layer, expert) to `device`; layer -1: every MoE layer, expert -1: every expert.
 * COLIBRI_E_ARG for an index out of range or a device that does not hold the expert or compute its
 * dtype.  Takes effect at the next forward: call it between tokens. */
colibri_status colibri_place(colibri_session *session, int32_t layer, int32_t expert, int32_t device,
                             colibri_error *err);
/* The whole table at once, checked as colibri_place checks each entry (nothing changes on error). */
colibri_status colibri_placement_set(colibri_session *session, const uint8_t *placement, colibri_error *err);
void colibri_placement_get(const colibri_session *session, uint8_t *placement);
/* A placement file (docs/DEVICES.md) applied to the session:
 *   {"format": "colibri-placement", "version": 1, "default": "cpu",
 *    "experts": [{"device": "remote", "layer": 3, "experts": [0, 5, 7]}, ...]}
 * "layer" may be "all"; "experts" may be "all"; later entries override earlier ones.  Devices are
 * named; a name the session lacks, an index out of range, an unknown field is COLIBRI_E_VALUE (or
 * _TYPE, _MISSING, _JSON) naming its place, and nothing changes.  The parse works in `scratch`
 * (4-byte aligned, placement_scratch_bytes long): no allocation. */
colibri_status colibri_placement_scratch_bytes(const colibri_session *session, const char *json, size_t len,
                                               size_t *scratch_bytes, colibri_error *err);
colibri_status colibri_placement_parse(colibri_session *session, const char *json, size_t len, void *scratch,
                                       size_t scratch_bytes, colibri_error *err);

/* ---- what the devices did ---------------------------------------------- */

typedef struct colibri_device_stats {
    uint64_t calls;             /* compute calls made (probes included) */
    uint64_t experts;           /* expert computations it made for the forward pass */
    uint64_t rows;              /* token rows it computed */
    uint64_t errors;            /* calls that failed (a deadline missed is one) */
    uint64_t slow;              /* calls over its threshold */
    uint64_t fallbacks;         /* expert computations bound to it that ran elsewhere */
    uint64_t probes;            /* calls made after a back-off to see whether it recovered */
    uint64_t bypassed;          /* times it went from used to bypassed */
    uint64_t p90_ns;            /* of its ring; 0 before its first call */
    uint64_t last_ns;           /* the last call's latency */
    uint64_t threshold_ns;
    int32_t samples;            /* latencies in the ring (at most COLIBRI_LATENCY_RING) */
    int32_t bypassed_now;       /* 1 while its experts go to the fallback */
} colibri_device_stats;

/* Device 0 (cpu) counts the experts and rows it computed, and the fallbacks it took in. */
colibri_status colibri_device_stats_get(const colibri_session *session, int32_t device, colibri_device_stats *stats);
void colibri_device_stats_clear(colibri_session *session);

#ifdef __cplusplus
}
#endif
#endif
