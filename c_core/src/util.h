/* SPDX-License-Identifier: MIT */
/* Small helpers shared by the core: error reporting, formatting, checked arithmetic, the profiler's
 * clock. */
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

/* Structs that hold pointers are 1.5-2x smaller on 32-bit targets than on 64-bit hosts.  The
 * arena and the metadata block reserve each one's 64-bit size (its "slot") on every target,
 * so a memory plan made on a 64-bit host is exact, byte for byte, for a microcontroller;
 * 32-bit targets leave the difference unused.  This fails to compile when a struct outgrows
 * its slot: raise the slot to the struct's new 64-bit size. */
#define COLIBRI_SLOT_CHECK(type, slot) typedef char colibri_slot_check_##type[sizeof(type) <= (slot) ? 1 : -1]
#define COLIBRI_POINTER_SLOT 8

/* A table keyed by an enum, written with designated initializers ([COLIBRI_ROPE_YARN] = "yarn"):
 * this fails to compile when the enum has a value past the table's last entry. */
#define COLIBRI_COUNT_OF(table) (sizeof(table) / sizeof((table)[0]))
#define COLIBRI_TABLE_CHECK(table, count) \
    typedef char colibri_table_check_##table[COLIBRI_COUNT_OF(table) == (size_t)(count) ? 1 : -1]

/* The profiler's clock: phase times accumulate in `profile` (COLIBRI_PHASE_COUNT sums), NULL when
 * off, and then no clock is read.  start returns the time; add charges the time since `since` to
 * `phase` and moves `since` on. */
uint64_t colibri_profile_start(const uint64_t *profile);
void colibri_profile_add(uint64_t *profile, int32_t phase, uint64_t *since);

#endif
