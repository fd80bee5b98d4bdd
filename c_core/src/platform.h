/* What the core asks of a platform (c_core/platform/<name>/): the only code that
 * touches the operating system. */
#ifndef COLIBRI_PLATFORM_H
#define COLIBRI_PLATFORM_H

#include <stddef.h>
#include <stdint.h>

#include "colibri/status.h"

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
 * allocated per token.  Platforms without threads report 1 and never make a pool. */
typedef struct colibri_pool colibri_pool;
int32_t colibri_platform_default_threads(void);   /* COLIBRI_THREADS, else the online cores */
colibri_status colibri_platform_pool_create(int32_t threads, colibri_pool **pool, colibri_error *err);
/* fn(context, part, parts) for every part in [0, parts), each run by whichever thread claims it first
 * (the caller too); returns when all are done. */
void colibri_platform_pool_run(colibri_pool *pool, void (*fn)(void *context, int32_t part, int32_t parts), void *context,
                               int32_t parts);
void colibri_platform_pool_destroy(colibri_pool *pool);

/* A monotonic clock in nanoseconds, for the profiler; 0 where the platform has none. */
uint64_t colibri_platform_now_ns(void);

/* fn() once per flag (static, zero to begin with): the first caller runs it, and callers on other
 * threads meanwhile wait until it has returned, then see everything it wrote. */
void colibri_platform_once(int32_t *done, void (*fn)(void));

/* Whether the OS reports the AArch64 dot-product extension (Linux: HWCAP_ASIMDDP); 0 where it
 * does not, cannot tell, or runs on another CPU. */
int colibri_platform_arm_dotprod(void);

#endif
