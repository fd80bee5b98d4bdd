/* Small helpers shared by the core: error reporting, formatting, checked arithmetic. */
#ifndef COLIBRI_UTIL_H
#define COLIBRI_UTIL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "colibri/status.h"

/* Fills err (if any) with status and a formatted message; returns status.
 * Formats: %s %c %d %u %ld %lu %lld %llu %zu %x %p %% (no width or precision). */
colibri_status colibri_fail(colibri_error *err, colibri_status status, const char *fmt, ...);

/* vsnprintf's contract with the formats above: writes at most cap bytes (NUL included),
 * returns the full length. */
size_t colibri_vformat(char *buf, size_t cap, const char *fmt, va_list ap);
size_t colibri_format(char *buf, size_t cap, const char *fmt, ...);

/* a * b, or 0 with *overflow set. */
static inline uint64_t colibri_mul_u64(uint64_t a, uint64_t b, int *overflow)
{
    if (a != 0 && b > UINT64_MAX / a) { *overflow = 1; return 0; }
    return a * b;
}

static inline size_t colibri_align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

#endif
