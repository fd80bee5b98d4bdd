/* SPDX-License-Identifier: MIT */
/* The memory report: weights by tensor, the arena by group and buffer, the model's
 * tables, and the totals — available as soon as a session exists, before any token. */
#include <string.h>

#include "memdump.h"
#include "../model/loader.h"
#include "../util.h"

typedef struct report { char *buf; size_t cap; size_t len; } report;

static void emit(report *r, const char *fmt, ...)
{
    va_list ap;
    char *at = r->len < r->cap ? r->buf + r->len : NULL;
    size_t room = r->len < r->cap ? r->cap - r->len : 0;
    va_start(ap, fmt);
    r->len += colibri_vformat(at, room, fmt, ap);
    va_end(ap);
}

/* 1234567 -> "1,234,567" */
static const char *grouped(char out[32], size_t v)
{
    char digits[24];
    int n = 0, o = 0;
    do { digits[n++] = (char)('0' + v % 10); v /= 10; } while (v);
    while (n) {
        out[o++] = digits[--n];
        if (n && n % 3 == 0) out[o++] = ',';
    }
    out[o] = '\0';
    return out;
}

/* Appends spaces to `text` until it spans `width` columns (UTF-8 characters, not bytes), and at
 * least two: a long name or shape pushes the next column right instead of running into it. */
static size_t pad_to(char *text, size_t len, size_t cap, size_t width)
{
    size_t cols = 0, i, added = 0;
    for (i = 0; i < len; i++)
        if (((unsigned char)text[i] & 0xc0u) != 0x80u) cols++;
    for (; (cols < width || added < 2) && len + 1 < cap; cols++, added++) text[len++] = ' ';
    text[len] = '\0';
    return len;
}

/* One buffer: name, shape, bytes and address in aligned columns. */
static void line(report *r, const char *branch, const char *name, int32_t layer, const char *shape,
                 size_t bytes, const void *addr)
{
    char text[256], num[32];
    size_t n = colibri_format(text, sizeof text, "%s", branch);
    if (layer >= 0) n += colibri_format(text + n, sizeof text - n, "layers.%d.%s", layer, name);
    else n += colibri_format(text + n, sizeof text - n, "%s", name);
    n = pad_to(text, n, sizeof text, 36);
    n += colibri_format(text + n, sizeof text - n, "%s", shape ? shape : "");
    n = pad_to(text, n, sizeof text, 78);
    n += colibri_format(text + n, sizeof text - n, "%s B", grouped(num, bytes));
    pad_to(text, n, sizeof text, 94);
    emit(r, "%s@%p\n", text, addr);
}

/* A stacked expert tensor's parts, one line each ("expert_e  bytes  @address"), under its line.  Up
 * to MAX_EXPERT_LINES experts each has its line; beyond, the first and the last few, and one line
 * counting those between (all parts of a tensor have one size, at a fixed stride). */
#define MAX_EXPERT_LINES 64
#define FOLDED_EXPERT_LINES 4
static void expert_lines(report *r, const colibri_model *m, const colibri_tensor *t, const char *stem)
{
    int32_t layer = (int32_t)((t->slot - T_GLOBAL) / L_KINDS), kind = (int32_t)((t->slot - T_GLOBAL) % L_KINDS);
    int32_t E = m->hp.n_experts, e;
    uint64_t offset = 0, bytes = 0;
    char branch[32], name[32], text[96], num[32];
    for (e = 0; e < E; e++) {
        if (E > MAX_EXPERT_LINES && e == FOLDED_EXPERT_LINES) {   /* the middle, folded */
            colibri_format(text, sizeof text, "(experts %d .. %d: %d more of %s B each)", e, E - FOLDED_EXPERT_LINES - 1,
                           E - 2 * FOLDED_EXPERT_LINES, grouped(num, (size_t)bytes));
            emit(r, "%s├── %s\n", stem, text);
            e = E - FOLDED_EXPERT_LINES - 1;
            continue;
        }
        if (colibri_expert_part(m, layer, kind, e, &offset, &bytes) != COLIBRI_OK) return;
        colibri_format(branch, sizeof branch, "%s%s", stem, e + 1 < E ? "├── " : "└── ");
        colibri_format(name, sizeof name, "expert_%d", e);
        line(r, branch, name, -1, NULL, (size_t)bytes, m->weights + offset);
    }
}

static size_t group_bytes(const colibri_arena *a, int32_t g)
{
    size_t total = 0;
    int32_t i;
    for (i = 0; i < a->n_records; i++)
        if (a->records[i].group == g) total += a->records[i].size;
    return total;
}

void colibri_memory_totals_of(const colibri_arena *a, const colibri_model *m, colibri_memory_totals *t)
{
    t->weights = (size_t)colibri_model_weight_bytes(m);
    t->metadata = m->meta_bytes;
    t->arena_reserved = a->capacity;
    t->arena_used = a->used;
    t->kv_cache = group_bytes(a, ARENA_KV_CACHE);
    t->activations = group_bytes(a, ARENA_ACTIVATIONS);
    t->expert_cache = group_bytes(a, ARENA_EXPERT_CACHE);
}

/* Which expert each slot holds, layer by layer ("*": pinned, "~": still reading). */
static void slot_holdings(report *r, const colibri_memdump_header *h, int32_t n_layers)
{
    char n1[32], n2[32];
    int32_t l, i, held = 0;
    emit(r, "\nexpert cache: %d slots of %s B = %s B", h->slots.n_slots, grouped(n1, (size_t)h->slots.slot_bytes),
         grouped(n2, (size_t)h->slots.slot_bytes * (size_t)h->slots.n_slots));
    for (i = 0; i < h->slots.n_slots; i++) held += h->slots.state[i] != 0;
    emit(r, ", %d holding an expert (* pinned, ~ reading)\n", held);
    for (l = 0; l < n_layers; l++) {
        int32_t first = 1;
        for (i = 0; i < h->slots.n_slots; i++) {
            int32_t owner = h->slots.owner[i];
            if (h->slots.state[i] == 0 || owner / h->slots.n_experts != l) continue;
            if (first) emit(r, "    layers.%d: experts", l);
            emit(r, "%s %d%s%s", first ? "" : ",", owner % h->slots.n_experts, (h->slots.flags[i] & 1) ? "*" : "",
                 h->slots.state[i] == 1 ? "~" : "");
            first = 0;
        }
        if (!first) emit(r, "\n");
    }
}

void colibri_memdump_report(const colibri_arena *a, const colibri_model *m, const colibri_memdump_header *h,
                            char *buf, size_t cap, size_t *len)
{
    const colibri_hparams *hp = &m->hp;
    report r;
    char n1[32], n2[32], n3[32], n4[32];
    int32_t i, g;
    size_t weights, padding = 0;

    r.buf = buf; r.cap = cap; r.len = 0;
    weights = (size_t)colibri_model_weight_bytes(m);

    emit(&r, "colibri memory report: %s, %d layers, %d experts (top-%d), dim %d, vocab %d\n",
         m->architecture, hp->n_layers, hp->n_experts, hp->top_k, hp->hidden_size, hp->vocab_size);
    emit(&r, "session: n_ctx %d, n_batch %d, n_seq %d, kernels %s, kv cache %s\n\n", h->n_ctx, h->n_batch, h->n_seq,
         h->kernels, h->kv_type);

    emit(&r, "weights (weights.bin, mapped read-only, %s)  %s B  @%p\n",
         h->slots.n_slots ? "the routed experts read into the expert cache, the rest used in place" : "used in place",
         grouped(n1, weights), (const void *)m->weights);
    for (i = 0; i < m->n_tensors; i++) {
        const colibri_tensor *t = &m->tensors[i];
        char shape[64];
        size_t sl = colibri_format(shape, sizeof shape, "%s [", colibri_dtype_name(t->dtype));
        int32_t d;
        for (d = 0; d < t->n_dims && sl < sizeof shape; d++)
            sl += colibri_format(shape + sl, sizeof shape - sl, d ? ", %lld" : "%lld", (long long)t->shape[d]);
        if (sl < sizeof shape) colibri_format(shape + sl, sizeof shape - sl, "]");
        line(&r, i + 1 < m->n_tensors ? "├── " : "└── ", t->name, -1, shape, (size_t)t->file_size,
             m->weights + t->file_offset);
        if (colibri_slot_is_routed_expert(t->slot)) expert_lines(&r, m, t, i + 1 < m->n_tensors ? "│   " : "    ");
    }

    for (i = 0; i < a->n_records; i++) padding += a->records[i].size;
    padding = a->used - padding;
    emit(&r, "\narena (%s%s)  reserved %s B  @%p  high-water %s B\n",
         h->mapped ? "mmap" : "caller buffer", h->mapped ? (h->hugepages ? ", huge pages" : ", normal pages") : "",
         grouped(n1, a->capacity), (void *)a->base, grouped(n2, a->used));
    for (g = 0; g < ARENA_GROUP_COUNT; g++) {
        int32_t last = -1;
        const char *stem = g + 1 < ARENA_GROUP_COUNT ? "│   " : "    ";
        for (i = 0; i < a->n_records; i++) if (a->records[i].group == g) last = i;
        if ((g == ARENA_EXPERT_CACHE || g == ARENA_DEVICES) && last < 0) continue;   /* resident experts, no drivers */
        emit(&r, "%s%s", g + 1 < ARENA_GROUP_COUNT ? "├── " : "└── ", colibri_arena_group_name(g));
        emit(&r, "  %s B\n", grouped(n1, group_bytes(a, g)));
        for (i = 0; i < a->n_records; i++) {
            const colibri_arena_record *rec = &a->records[i];
            char branch[32];
            if (rec->group != g) continue;
            colibri_format(branch, sizeof branch, "%s%s", stem, i == last ? "└── " : "├── ");
            line(&r, branch, rec->name, rec->layer, rec->shape, rec->size, a->base + rec->offset);
        }
    }
    emit(&r, "    (alignment padding %s B)\n", grouped(n1, padding));
    emit(&r, "\nsequence slots: %d, each a KV cache of %d positions in every layer's rows\n", h->n_seq, h->n_ctx);
    for (i = 0; i < h->n_seq; i++)
        emit(&r, "    seq %d: KV cache rows [%s, %s)  %s B\n", i, grouped(n1, (size_t)i * h->n_ctx),
             grouped(n2, (size_t)(i + 1) * h->n_ctx), grouped(n3, h->seq_kv_bytes));
    if (h->slots.n_slots) slot_holdings(&r, h, hp->n_layers);
    emit(&r, "\nmetadata (model tables, JSON tokens)  %s B  @%p\n", grouped(n1, m->meta_bytes), (const void *)m);
    emit(&r, "\ntotal: weights %s B + arena %s B + metadata %s B = %s B\n",
         grouped(n1, weights), grouped(n2, a->used), grouped(n3, m->meta_bytes),
         grouped(n4, weights + a->used + m->meta_bytes));
    if (cap) buf[r.len < cap ? r.len : cap - 1] = '\0';
    if (len) *len = r.len;
}
