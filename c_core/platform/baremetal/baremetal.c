/* SPDX-License-Identifier: MIT */
/* The bare-metal platform: no heap, no file system, no environment.  Sessions live in an
 * arena the firmware passes in (colibri_session_options.arena); models are loaded from
 * memory with colibri_model_load. */
#include "../../src/model/model.h"
#include "../../src/platform.h"
#include "../../src/util.h"

colibri_status colibri_platform_map_arena(size_t size, void **base, size_t *mapped, int *hugepages,
                                          colibri_error *err)
{
    (void)base; (void)mapped; (void)hugepages;
    return colibri_fail(err, COLIBRI_E_NOMEM, "no heap on bare metal: pass an arena of %zu bytes in the session options",
                        size);
}

void colibri_platform_unmap_arena(void *base, size_t mapped) { (void)base; (void)mapped; }

const char *colibri_platform_kernels_request(void) { return NULL; }

colibri_status colibri_model_open(const char *dir, unsigned flags, colibri_model **model, colibri_error *err)
{
    (void)flags;
    if (model) *model = NULL;
    return colibri_fail(err, COLIBRI_E_IO, "%s: no file system on bare metal; load the model with colibri_model_load",
                        dir ? dir : "(null)");
}

colibri_status colibri_gguf_sidecar(const char *gguf_path, char *dir, size_t cap, colibri_error *err)
{
    (void)dir; (void)cap;
    return colibri_fail(err, COLIBRI_E_IO, "%s: no file system on bare metal", gguf_path ? gguf_path : "(null)");
}

/* Models live in memory the firmware owns: nothing to recheck. */
colibri_status colibri_platform_model_check(const colibri_model *model, colibri_error *err)
{
    (void)model; (void)err;
    return COLIBRI_OK;
}

/* No clock the core could know of on bare metal: the firmware times with its board's. */
uint64_t colibri_platform_now_ns(void) { return 0; }

/* No threads on bare metal: sessions compute on the caller's. */
int32_t colibri_platform_default_threads(void) { return 1; }

void colibri_platform_once(int32_t *done, void (*fn)(void))
{
    if (!*done) { fn(); *done = 1; }
}

/* No OS to report CPU extensions (and no AArch64 board yet). */
int colibri_platform_arm_dotprod(void) { return 0; }
int colibri_platform_riscv_vector(void) { return 0; }

colibri_status colibri_platform_pool_create(int32_t threads, colibri_pool **pool, colibri_error *err)
{
    *pool = NULL;
    return colibri_fail(err, COLIBRI_E_ARG, "threads = %d: bare metal runs on one thread", threads);
}

void colibri_platform_pool_run(colibri_pool *pool, void (*fn)(void *context, int32_t part, int32_t parts), void *context,
                               int32_t parts)
{
    int32_t part;
    (void)pool;
    for (part = 0; part < parts; part++) fn(context, part, parts);
}

void colibri_platform_pool_destroy(colibri_pool *pool) { (void)pool; }

/* Expert streaming without threads: a read is performed when it is queued, by the image's read
 * function (external flash, an SD card, a semihosted file), and the reader lives in the arena. */
struct colibri_io {
    colibri_read_fn read;
    void *context;
    colibri_io_read *reads;
};
COLIBRI_SLOT_CHECK(colibri_io, COLIBRI_IO_STATE_SLOT);

colibri_status colibri_platform_io_create(const colibri_model *model, colibri_read_fn read, void *context, int direct,
                                          colibri_io_read *reads, int32_t n_reads, void *state, colibri_io **out,
                                          colibri_error *err)
{
    colibri_io *io = state;
    (void)model; (void)direct; (void)n_reads;
    *out = NULL;
    if (!read)
        return colibri_fail(err, COLIBRI_E_ARG, "expert streaming on bare metal: pass expert_read in the session options");
    io->read = read;
    io->context = context;
    io->reads = reads;
    *out = io;
    return COLIBRI_OK;
}

int colibri_platform_io_async(const colibri_io *io) { (void)io; return 0; }

void colibri_platform_io_submit(colibri_io *io, int32_t i, int urgent)
{
    colibri_io_read *r = &io->reads[i];
    (void)urgent;
    r->result = io->read(io->context, r->offset, r->dst, r->len);
    r->state = COLIBRI_IO_DONE;
}

int64_t colibri_platform_io_wait(colibri_io *io, int32_t i) { return io->reads[i].result; }
int colibri_platform_io_idle(colibri_io *io, int32_t i) { (void)io; (void)i; return 1; }
int colibri_platform_io_cancel(colibri_io *io, int32_t i) { (void)io; (void)i; return 0; }
void colibri_platform_io_destroy(colibri_io *io) { (void)io; }
