/* SPDX-License-Identifier: MIT */
/* What the core asks of a platform (c_core/platform/<name>/): the only code that
 * touches the operating system. */
#ifndef COLIBRI_PLATFORM_H
#define COLIBRI_PLATFORM_H

#include <stddef.h>
#include <stdint.h>

#include "colibri/colibri.h"

/* Maps at least `size` zeroed bytes for a session arena; *mapped gets the size really
 * mapped, *hugepages whether huge pages back it. */
colibri_status colibri_platform_map_arena(size_t size, void **base, size_t *mapped, int *hugepages,
                                          colibri_error *err);
void colibri_platform_unmap_arena(void *base, size_t mapped);

/* The kernel variant the environment asks for by name (COLIBRI_KERNELS=reference, avx2, ... on
 * POSIX; NULL when unset or "auto"), so tests and users can force a path without changing code. */
const char *colibri_platform_kernels_request(void);

/* Threads for the forward pass, made with the session: `threads` - 1 workers that sleep until
 * colibri_platform_pool_run offers them the parts of a job, so no thread is made and nothing is
 * allocated per token.  Platforms without threads report 1 and never make a pool; their builds define
 * COLIBRI_ONE_THREAD, which leaves the paths that only a pool takes out of the image. */
typedef struct colibri_pool colibri_pool;
int32_t colibri_platform_default_threads(void);   /* COLIBRI_THREADS, else the online cores */
colibri_status colibri_platform_pool_create(int32_t threads, colibri_pool **pool, colibri_error *err);
/* fn(context, part, parts) for every part in [0, parts), each run by whichever thread claims it first
 * (the caller too); returns when all are done. */
void colibri_platform_pool_run(colibri_pool *pool, void (*fn)(void *context, int32_t part, int32_t parts), void *context,
                               int32_t parts);
void colibri_platform_pool_destroy(colibri_pool *pool);

/* Expert streaming's reads.  Each read lives in the session arena and the reader knows the table by
 * its address: the forward pass queues read i, and later waits for it when it needs the bytes.  Where
 * the platform has threads one I/O thread made with the reader performs the queued reads, urgent ones
 * (an expert the forward pass waits for) before speculative ones, each kind in the order queued;
 * elsewhere a read is performed when it is queued.  No allocation after colibri_platform_io_create. */
typedef struct colibri_io_read {
    uint64_t offset;        /* in weights.bin */
    size_t len;             /* bytes asked of the reader */
    size_t need;            /* the first `need` of them must arrive (O_DIRECT asks for whole blocks,
                               which may run past the end of the file) */
    void *dst;
    int64_t result;         /* what the reader returned, once done */
    int32_t state;          /* COLIBRI_IO_*: changed under the reader's lock only */
    int32_t urgent;
    int32_t next;           /* the reader's queue: the read queued after this one at its urgency; -1 none */
} colibri_io_read;
#define COLIBRI_IO_READ_SLOT 56     /* bytes per read on every target (util.h) */
enum { COLIBRI_IO_IDLE = 0, COLIBRI_IO_QUEUED, COLIBRI_IO_BUSY, COLIBRI_IO_DONE };

typedef struct colibri_io colibri_io;
/* `read` performs the reads; NULL: the platform reads the file it opened the model from (POSIX:
 * weights.bin, pread, with O_DIRECT when `direct`), COLIBRI_E_ARG where it opened no file.  `state`
 * (COLIBRI_IO_STATE_SLOT bytes, 64-byte aligned, in the arena) is the platform's to keep its reader
 * in when it has no heap. */
#define COLIBRI_IO_STATE_SLOT 64
colibri_status colibri_platform_io_create(const colibri_model *model, colibri_read_fn read, void *context,
                                          int direct, colibri_io_read *reads, int32_t n_reads, void *state,
                                          colibri_io **io, colibri_error *err);
int colibri_platform_io_async(const colibri_io *io);    /* reads run beside the forward pass */
void colibri_platform_io_submit(colibri_io *io, int32_t read, int urgent);
/* Blocks until read `read` is done (first moving it ahead of the speculative reads); its result. */
int64_t colibri_platform_io_wait(colibri_io *io, int32_t read);
/* Whether read `read` is done or was never queued (no wait). */
int colibri_platform_io_idle(colibri_io *io, int32_t read);
/* Drops a queued read that has not started; returns whether it did (else it runs or ran). */
int colibri_platform_io_cancel(colibri_io *io, int32_t read);
/* Finishes the read in progress, drops the queued ones, stops the thread. */
void colibri_platform_io_destroy(colibri_io *io);

/* Whether the file the platform opened the model from is still the one it opened (POSIX: weights.bin's
 * device, inode, size and modification time as at load); COLIBRI_E_IO naming the file and what changed if not.
 * Called as each session is made; a model loaded from memory always passes. */
colibri_status colibri_platform_model_check(const colibri_model *model, colibri_error *err);

/* A monotonic clock in nanoseconds, for the profiler; 0 where the platform has none. */
uint64_t colibri_platform_now_ns(void);

/* fn() once per flag (static, zero to begin with): the first caller runs it, and callers on other
 * threads meanwhile wait until it has returned, then see everything it wrote. */
void colibri_platform_once(int32_t *done, void (*fn)(void));

/* Whether the OS reports the AArch64 dot-product extension (Linux: HWCAP_ASIMDDP); 0 where it
 * does not, cannot tell, or runs on another CPU. */
int colibri_platform_arm_dotprod(void);

/* Whether the OS reports the RISC-V Vector extension (Linux: bit 'V' - 'A' of AT_HWCAP, which it
 * sets only where it also saves the vector registers); 0 where it does not, cannot tell, or runs
 * on another CPU. */
int colibri_platform_riscv_vector(void);

#endif
