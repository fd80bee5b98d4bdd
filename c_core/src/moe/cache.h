/* SPDX-License-Identifier: MIT */
/* The expert cache of expert streaming: routed experts read from storage into a pool of slots in
 * the session arena, so a model runs in less memory than its experts take.
 *
 *   demand    the MoE block asks for the experts its tokens routed to (request), waits for their
 *             reads (wait), computes from the slots (weights), then lets them go (release)
 *   guess     before the block computes, the next MoE layer's likely experts are read speculatively
 *             (guess): into slots nothing demands, never more than leaves one layer's top_k free
 *   keep      a slot's expert stays until a read needs its slot: the victim is the one whose next
 *             demand is estimated farthest off (its layer's distance in the layer cycle, and how often
 *             a token demands it: counts halved every 64 tokens, so the past fades), the least recent
 *             on ties; pinned experts are read once at creation and never leave
 *
 * One slot holds one expert of one layer: its tensors' parts (w1, w3, w2 and any biases) side by
 * side, one read for the interleaved layout, one per tensor for the stacked one.  With direct I/O
 * each read covers whole 4 KiB blocks and lands 4 KiB-aligned; the data starts `shift` bytes in.
 * The bytes are those of weights.bin, rewritten in the slot in the form the resident run computes
 * (colibri_fast_forms: a GGUF's Q4_K experts as q4_kx8 on x86), so what the kernels compute is bit for
 * bit the resident run. */
#ifndef COLIBRI_CACHE_H
#define COLIBRI_CACHE_H

#include "../mem/arena.h"
#include "../model/model.h"
#include "../platform.h"

/* Where expert e's tensors lie: w[kind - L_EXPERT_FIRST] (data NULL: the layer has no such tensor). */
typedef struct colibri_expert_weights {
    colibri_weight w[L_EXPERT_KINDS];
} colibri_expert_weights;

/* One read that fills a slot: expert e's bytes are [offset + e * stride, + bytes) of weights.bin,
 * landing `at` bytes into the slot. */
typedef struct colibri_cache_read {
    uint64_t offset;
    uint64_t stride;
    uint64_t bytes;
    uint64_t at;
} colibri_cache_read;

/* How a layer's experts are read, and its share of the pool. */
typedef struct colibri_cache_layer {
    colibri_cache_read read[L_EXPERT_KINDS];
    int32_t n_reads;                        /* 0: the layer has no routed experts */
    int32_t part_read[L_EXPERT_KINDS];      /* which read brings each tensor's part; -1: none */
    uint64_t part_at[L_EXPERT_KINDS];       /* and where in that read's bytes it starts */
    uint8_t stored[L_EXPERT_KINDS];         /* each part's dtype as read (the file's) */
    uint8_t runs[L_EXPERT_KINDS];           /*   and as computed: its fast form, rewritten in the slot once read */
    int32_t first_slot, n_slots;            /* the slots the layer's experts may take */
} colibri_cache_layer;
#define COLIBRI_CACHE_LAYER_SLOT 320

typedef struct colibri_expert_cache {
    const colibri_model *model;
    int32_t n_slots;
    int32_t n_layers, n_experts, top_k;
    uint64_t slot_bytes;
    int32_t scope;                  /* COLIBRI_CACHE_GLOBAL or _PER_LAYER */
    int32_t guessing;               /* speculative reads on: the platform reads beside the forward pass */
    int32_t direct;
    int32_t verify;                 /* each extent checked against its CRC-32 when first read */
    colibri_cache_layer *layers;    /* (n_layers) */
    uint8_t *pool;                  /* (n_slots, slot_bytes) */
    int32_t *slot_owner;            /* (n_slots) layer * n_experts + expert; -1: empty */
    int32_t *slot_state;            /* (n_slots) CACHE_EMPTY, CACHE_LOADING, CACHE_READY */
    int32_t *slot_flags;            /* (n_slots) CACHE_PINNED | CACHE_BUSY | CACHE_GUESSED */
    uint64_t *slot_used;            /* (n_slots) when it was last demanded */
    uint32_t *slot_shift;           /* (n_slots, L_EXPERT_KINDS) where each read's data starts in its bytes */
    int32_t *where;                 /* (n_layers * n_experts) the slot holding the expert; -1: none */
    uint32_t *uses;                 /* (n_layers * n_experts) demands, halved every aging period */
    uint8_t *verified;              /* (n_layers * n_experts) its extent matched its CRC once */
    colibri_io_read *reads;         /* (n_slots, L_EXPERT_KINDS) */
    uint8_t *slot_prepared;         /* (n_slots) its bytes checked and rewritten in their fast forms, by
                                       whichever thread first needs them; NULL: the model has none */
    uint64_t repack_scratch;        /* bytes at each slot's end for rewriting 8 rows of its widest part */
    void *io_state;                 /* COLIBRI_IO_STATE_SLOT bytes for the platform's reader */
    colibri_io *io;
    uint64_t clock;                 /* demands so far */
    uint64_t aging_period;
    float recent_demands;           /* demands, halved with the counts: the window `uses` counts over */
    float demands_per_token;        /* MoE layers * top_k */
    colibri_expert_cache_stats stats;
    uint64_t *profile;              /* the session's phase sums, or NULL */
} colibri_expert_cache;
#define COLIBRI_CACHE_SLOT 272

enum { CACHE_EMPTY = 0, CACHE_LOADING = 1, CACHE_READY = 2 };
enum { CACHE_PINNED = 1, CACHE_BUSY = 2, CACHE_GUESSED = 4 };

/* The slot size and smallest budget for a model (colibri_expert_slots), and how many slots `budget`
 * buys (never more than there are routed experts). */
colibri_status colibri_cache_geometry(const colibri_model *model, int32_t scope, int direct, uint64_t budget,
                                      uint64_t *slot_bytes, uint64_t *min_budget, int32_t *n_slots, colibri_error *err);

/* Carves the cache and its pool from `a` (measuring when a->base is NULL: *out is then NULL). */
void colibri_cache_carve(colibri_expert_cache **out, colibri_arena *a, const colibri_model *model, int32_t scope,
                         int direct, int32_t n_slots, uint64_t slot_bytes);

/* Starts the reader and reads the pinned experts; `read` NULL: the platform's file, or a copy from
 * the model's weights when it was loaded from memory.  io: COLIBRI_EXPERT_IO_* (guesses, checks). */
colibri_status colibri_cache_start(colibri_expert_cache *c, colibri_read_fn read, void *context, uint32_t io,
                                   const int32_t *pins, int32_t n_pins, colibri_error *err);
void colibri_cache_stop(colibri_expert_cache *c);

/* Claims a slot for expert e of `layer` and queues its reads unless it is there or on its way; the
 * expert is then busy (never evicted) until released.  Returns 0 when no slot is free for it now
 * (a later expert of the layer may wait); with `must`, waits for a speculative read to free one. */
int colibri_cache_request(colibri_expert_cache *c, int32_t layer, int32_t e, int must);
/* Waits for a requested expert's reads; a short or failed read, or (verifying) an extent whose CRC is
 * not the file's, frees the slot and is reported with the tensor, expert and bytes. */
colibri_status colibri_cache_wait(colibri_expert_cache *c, int32_t layer, int32_t e, colibri_error *err);
/* From any thread: waits for the reads of a requested expert without judging them (wait does that
 * afterwards, on the forward pass's thread), returning the ns it waited; whether it is there already. */
uint64_t colibri_cache_await(colibri_expert_cache *c, int32_t layer, int32_t e);
int colibri_cache_ready(const colibri_expert_cache *c, int32_t layer, int32_t e);
void colibri_cache_weights(const colibri_expert_cache *c, int32_t layer, int32_t e, colibri_expert_weights *w);
void colibri_cache_release(colibri_expert_cache *c, int32_t layer, int32_t e);
/* After a failed forward: every expert released. */
void colibri_cache_release_all(colibri_expert_cache *c);

/* Speculative reads of the experts `ids` (n) of `layer`, as slots allow. */
void colibri_cache_guess(colibri_expert_cache *c, int32_t layer, const int32_t *ids, int32_t n);

#endif
