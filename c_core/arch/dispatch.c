/* SPDX-License-Identifier: MIT */
/* The kernel variants this build has, which of them this CPU runs, and the pick: the best one
 * it runs, or one by name (COLIBRI_KERNELS=<name> in the environment, or the session option). */
#include <string.h>

#include "../src/platform.h"
#include "arch.h"

typedef struct variant {
    const colibri_kernels *(*kernels)(void);   /* the slots it has; NULL ones come from base */
    const colibri_kernels *(*base)(void);      /* NULL: kernels has every slot (the references) */
    int (*runs_here)(void);                    /* NULL: every CPU this build targets */
    uint32_t interleaved;                      /* the interleaved formats its matmul_q8 has kernels for */
    int named_only;                            /* a numerics choice: only when named, never the best */
} variant;

#define X8_Q4_0 (1u << COLIBRI_DTYPE_Q4_0X8 | 1u << COLIBRI_DTYPE_Q8_0X8)
#define X8_X86 (X8_Q4_0 | 1u << COLIBRI_DTYPE_Q4_KX8 | 1u << COLIBRI_DTYPE_Q5_KX8 | 1u << COLIBRI_DTYPE_Q6_KX8 | \
                1u << COLIBRI_DTYPE_IQ4_XSX8 | 1u << COLIBRI_DTYPE_MXFP4X8)

/* The two references first, then in order of preference; a base comes before the variants it
 * fills.  A variant based on the reference that leaves quantize_q8 and matmul_q8 empty has no
 * int8 path (its matmul takes q8_0 and q4_0), as the reference has none. */
static const variant variants[] = {
    { colibri_kernels_reference, NULL, NULL, 0, 0 },
    { colibri_kernels_reference_int8, NULL, NULL, 0, 0 },
#if defined(COLIBRI_HAVE_AVX2)
    { colibri_kernels_avx2, colibri_kernels_reference, colibri_cpu_has_avx2, X8_X86, 0 },
#endif
#if defined(COLIBRI_HAVE_AVX512)
    { colibri_kernels_avx512, colibri_kernels_reference, colibri_cpu_has_avx512_vnni, X8_X86, 0 },
#endif
#if defined(COLIBRI_HAVE_AVX512_BF16)
    { colibri_kernels_avx512_bf16, colibri_kernels_avx512, colibri_cpu_has_avx512_bf16, X8_X86, 1 },   /* bf16 activations */
#endif
#if defined(COLIBRI_HAVE_NEON)
    { colibri_kernels_neon, colibri_kernels_reference, NULL, X8_Q4_0, 0 },
#endif
#if defined(COLIBRI_HAVE_DOTPROD)
    { colibri_kernels_neon_dotprod, colibri_kernels_neon, colibri_cpu_has_dotprod, X8_Q4_0, 0 },   /* NEON's float path */
#endif
#if defined(COLIBRI_HAVE_MVE)
    { colibri_kernels_mve_int8, colibri_kernels_reference, NULL, X8_Q4_0, 0 },   /* for tests: before mve, never the best */
    { colibri_kernels_mve, colibri_kernels_reference, NULL, X8_Q4_0, 0 },   /* bare metal: built only for a CPU that has it */
#endif
#if defined(COLIBRI_HAVE_RVV)
    { colibri_kernels_rvv_int8, colibri_kernels_reference, colibri_cpu_has_rvv, X8_Q4_0, 0 },   /* for tests: before rvv, never the best */
    { colibri_kernels_rvv, colibri_kernels_reference, colibri_cpu_has_rvv, X8_Q4_0, 0 },
#endif
};
#define VARIANTS ((int32_t)(sizeof variants / sizeof variants[0]))

/* COLIBRI_KERNEL_SLOTS names every function slot: the name and that many pointers make the table. */
#define MIRROR_SLOT(slot) void (*slot)(void);
typedef struct slots_mirror { const char *name; COLIBRI_KERNEL_SLOTS(MIRROR_SLOT) } slots_mirror;
typedef char kernel_slots_all_listed[sizeof(slots_mirror) == sizeof(colibri_kernels) ? 1 : -1];

/* Each variant's table with every slot filled, built once, by the first lookup (a session's
 * creation, from any thread: colibri_platform_once makes the others wait for it).  The references
 * are their own. */
static colibri_kernels filled[VARIANTS];
static const colibri_kernels *tables[VARIANTS];
static int32_t tables_built;

static void build_tables(void)
{
    int32_t i, j;
    for (i = 0; i < VARIANTS; i++) {
        const colibri_kernels *from = colibri_kernels_reference();
        colibri_kernels *t = &filled[i];
        if (!variants[i].base) { tables[i] = variants[i].kernels(); continue; }
        for (j = 0; j < i; j++)
            if (variants[j].kernels == variants[i].base) from = tables[j];
        *t = *variants[i].kernels();
#define FILL_SLOT(slot) if (!t->slot) t->slot = from->slot;
        COLIBRI_KERNEL_SLOTS(FILL_SLOT)
#undef FILL_SLOT
        tables[i] = t;
    }
}

static const colibri_kernels *table(int32_t i)
{
    colibri_platform_once(&tables_built, build_tables);
    return tables[i];
}

static int runs_here(int32_t i) { return !variants[i].runs_here || variants[i].runs_here(); }

const colibri_kernels *colibri_kernels_variant(int32_t i)
{
    return i >= 0 && i < VARIANTS ? table(i) : NULL;
}

int colibri_kernels_runnable(const colibri_kernels *kernels)
{
    int32_t i;
    for (i = 0; i < VARIANTS; i++)
        if (table(i) == kernels) return runs_here(i);
    return 0;
}

int colibri_kernels_interleave(const colibri_kernels *kernels, colibri_dtype x8)
{
    int32_t i;
    for (i = 0; i < VARIANTS; i++)
        if (table(i) == kernels) return (unsigned)x8 < 32 && (variants[i].interleaved >> x8 & 1u);
    return 0;
}

const colibri_kernels *colibri_kernels_best(void)
{
    int32_t i;
    for (i = VARIANTS - 1; i > 1; i--)
        if (runs_here(i) && !variants[i].named_only) return table(i);
    return colibri_kernels_reference();
}

const colibri_kernels *colibri_kernels_named(const char *name)
{
    int32_t i;
    for (i = 0; i < VARIANTS; i++)
        if (strcmp(table(i)->name, name) == 0) return runs_here(i) ? table(i) : NULL;
    return NULL;
}
