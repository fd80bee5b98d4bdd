/* SPDX-License-Identifier: MIT */
/* The memory report over an arena and the model its buffers serve (mem/memdump.c): the
 * session (colibri_memdump, colibri_memory) hands in its arena and model and says how it runs. */
#ifndef COLIBRI_MEMDUMP_H
#define COLIBRI_MEMDUMP_H

#include "arena.h"
#include "../model/model.h"

/* What the report's header says of the arena's owner. */
typedef struct colibri_memdump_header {
    int32_t n_ctx, n_batch, n_seq;
    size_t seq_kv_bytes;        /* one sequence slot's share of the KV cache (every layer's rows, its token ids) */
    const char *kernels;        /* the kernel variant's name */
    const char *kv_type;        /* what the attention layers' KV cache stores: "f32", "f16", "q8_0" */
    int mapped;                 /* the platform mapped the arena (else it is a caller's buffer) */
    int hugepages;              /* huge pages back the mapping */
    struct {                    /* expert streaming's slots (n_slots 0: resident) */
        int32_t n_slots, n_experts;
        uint64_t slot_bytes;
        const int32_t *owner, *flags, *state;   /* (n_slots) layer * n_experts + expert, flags, state */
    } slots;
} colibri_memdump_header;

/* The report into buf (cap bytes, NUL-terminated when cap > 0); *len (if any) gets its full length. */
void colibri_memdump_report(const colibri_arena *arena, const colibri_model *model, const colibri_memdump_header *header,
                            char *buf, size_t cap, size_t *len);

/* The totals: weights and metadata from the model, the arena's by group. */
void colibri_memory_totals_of(const colibri_arena *arena, const colibri_model *model, colibri_memory_totals *totals);

#endif
