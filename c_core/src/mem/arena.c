/* SPDX-License-Identifier: MIT */
#include "arena.h"

#include "colibri/colibri.h"
#include "../util.h"

/* Under AddressSanitizer every gap between buffers is poisoned and widened by a red zone,
 * so a kernel that writes past its buffer is caught, not silently clobbering the next. */
#ifdef COLIBRI_ASAN
void __asan_poison_memory_region(void const volatile *addr, size_t size);
void __asan_unpoison_memory_region(void const volatile *addr, size_t size);
#define RED_ZONE COLIBRI_ALIGNMENT
#else
#define RED_ZONE 0
#endif

static const char *const group_names[] = {
    [ARENA_SESSION] = "session", [ARENA_ACTIVATIONS] = "activations", [ARENA_KV_CACHE] = "kv cache",
    [ARENA_ROPE] = "rope tables", [ARENA_ROUTER] = "router", [ARENA_EXPERTS] = "experts",
    [ARENA_EXPERT_CACHE] = "expert cache", [ARENA_DEVICES] = "devices", [ARENA_OUTPUT] = "output",
    [ARENA_SAMPLING] = "sampling",
};
COLIBRI_TABLE_CHECK(group_names, ARENA_GROUP_COUNT);

const char *colibri_arena_group_name(int32_t group)
{
    return group >= 0 && group < ARENA_GROUP_COUNT ? group_names[group] : "?";
}

void *colibri_arena_carve(colibri_arena *arena, size_t size, int32_t group, const char *name,
                          int32_t layer, const char *shape)
{
    size_t offset = colibri_align_up(arena->used + (arena->used ? RED_ZONE : 0), COLIBRI_ALIGNMENT);
    void *p = NULL;
    if (size > (size_t)-1 - offset) { arena->overflow = 1; arena->used = (size_t)-1; return NULL; }
    if (arena->base && offset + size <= arena->capacity) {
        p = arena->base + offset;
#ifdef COLIBRI_ASAN
        __asan_poison_memory_region(arena->base + arena->used, offset - arena->used);   /* the gap before */
#endif
    }
    arena->used = offset + size;
    if (arena->records && arena->n_records < arena->max_records) {
        colibri_arena_record *r = &arena->records[arena->n_records];
        r->name = name; r->group = group; r->layer = layer; r->offset = offset; r->size = size; r->shape = shape;
    }
    arena->n_records++;
    return p;
}

size_t colibri_arena_bytes(colibri_arena *arena, size_t a, size_t b, size_t c)
{
    if ((b && a > (size_t)-1 / b) || (c && a * b > (size_t)-1 / c)) {
        arena->overflow = 1;
        return (size_t)-1;
    }
    return a * b * c;
}

void colibri_arena_poison_tail(colibri_arena *arena)
{
#ifdef COLIBRI_ASAN
    if (arena->base && arena->used < arena->capacity)
        __asan_poison_memory_region(arena->base + arena->used, arena->capacity - arena->used);
#else
    (void)arena;
#endif
}

void colibri_arena_release(colibri_arena *arena)
{
#ifdef COLIBRI_ASAN
    if (arena->base) __asan_unpoison_memory_region(arena->base, arena->capacity);
#else
    (void)arena;
#endif
}
