/* SPDX-License-Identifier: MIT */
/* The session arena: one block, carved front to back at session creation and never
 * grown.  Every carve is recorded (group, name, layer, offset, size) so the memory
 * report shows exactly what the arena holds.  With base == NULL the arena only
 * measures: running the same carving sequence twice, first measuring, then for
 * real, is what makes colibri_session_plan exact. */
#ifndef COLIBRI_ARENA_H
#define COLIBRI_ARENA_H

#include <stddef.h>
#include <stdint.h>

typedef enum colibri_arena_group {
    ARENA_SESSION, ARENA_ACTIVATIONS, ARENA_KV_CACHE, ARENA_ROPE, ARENA_ROUTER, ARENA_EXPERTS,
    ARENA_EXPERT_CACHE, ARENA_DEVICES, ARENA_OUTPUT, ARENA_SAMPLING, ARENA_GROUP_COUNT
} colibri_arena_group;

typedef struct colibri_arena_record {
    const char *name;       /* static string */
    int32_t group;          /* colibri_arena_group */
    int32_t layer;          /* -1: not per layer */
    size_t offset;
    size_t size;
    const char *shape;      /* static string, for the report, e.g. "(n_batch, dim) f32" */
} colibri_arena_record;
#define COLIBRI_RECORD_SLOT 40     /* bytes per record on every target (util.h) */

typedef struct colibri_arena {
    uint8_t *base;          /* NULL while measuring */
    size_t capacity;
    size_t used;            /* high-water mark: nothing is ever released */
    int overflow;           /* a requested size did not fit in size_t */
    colibri_arena_record *records;
    int32_t n_records;
    int32_t max_records;
} colibri_arena;

const char *colibri_arena_group_name(int32_t group);

/* Carves `size` bytes aligned to 64 and records them; NULL when measuring or out of room
 * (out of room is detected by the caller comparing used with capacity). */
/* Under ASan, marks the room after the last buffer unusable (for arenas the library owns:
 * a caller may use the rest of its own buffer). */
void colibri_arena_poison_tail(colibri_arena *arena);

/* Before the arena's memory is unmapped or handed back to its owner. */
void colibri_arena_release(colibri_arena *arena);

/* a * b * c bytes, or SIZE_MAX with arena->overflow set (32-bit targets, huge contexts). */
size_t colibri_arena_bytes(colibri_arena *arena, size_t a, size_t b, size_t c);

void *colibri_arena_carve(colibri_arena *arena, size_t size, int32_t group, const char *name,
                          int32_t layer, const char *shape);

#endif
