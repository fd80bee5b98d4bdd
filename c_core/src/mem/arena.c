#include "arena.h"

#include "colibri/colibri.h"
#include "../util.h"

static const char *const group_names[ARENA_GROUP_COUNT] = {
    "session", "activations", "kv cache", "rope tables", "router", "experts", "output", "sampling",
};

const char *colibri_arena_group_name(int32_t group)
{
    return group >= 0 && group < ARENA_GROUP_COUNT ? group_names[group] : "?";
}

void *colibri_arena_carve(colibri_arena *arena, size_t size, int32_t group, const char *name,
                          int32_t layer, const char *shape)
{
    size_t offset = colibri_align_up(arena->used, COLIBRI_ALIGNMENT);
    void *p = NULL;
    if (size > (size_t)-1 - offset) { arena->used = (size_t)-1; return NULL; }
    arena->used = offset + size;
    if (arena->base && arena->used <= arena->capacity) p = arena->base + offset;
    if (arena->records && arena->n_records < arena->max_records) {
        colibri_arena_record *r = &arena->records[arena->n_records];
        r->name = name; r->group = group; r->layer = layer; r->offset = offset; r->size = size; r->shape = shape;
    }
    arena->n_records++;
    return p;
}
