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

/* Whether the environment asks for the reference kernels (COLIBRI_KERNELS=reference on POSIX),
 * so tests and users can force that path without changing code. */
int colibri_platform_wants_reference_kernels(void);

/* A monotonic clock in nanoseconds, for the profiler; 0 where the platform has none. */
uint64_t colibri_platform_now_ns(void);

#endif
