/* The kernel variants this build has, which of them this CPU runs, and the pick: the best one
 * it runs, or one by name (COLIBRI_KERNELS=<name> in the environment, or the session option). */
#include <string.h>

#include "../src/ops/ops.h"

typedef struct variant {
    const colibri_kernels *(*kernels)(void);
    int (*runs_here)(void);     /* NULL: every CPU this build targets */
} variant;

/* The two references first, then in order of preference. */
static const variant variants[] = {
    { colibri_kernels_reference, NULL },
    { colibri_kernels_reference_int8, NULL },
#if defined(COLIBRI_HAVE_AVX2)
    { colibri_kernels_avx2, colibri_cpu_has_avx2 },
#endif
#if defined(COLIBRI_HAVE_AVX512)
    { colibri_kernels_avx512, colibri_cpu_has_avx512_vnni },
#endif
#if defined(COLIBRI_HAVE_NEON)
    { colibri_kernels_neon, NULL },
#endif
#if defined(COLIBRI_HAVE_DOTPROD)
    { colibri_kernels_neon_dotprod, colibri_cpu_has_dotprod },
#endif
};
#define VARIANTS ((int32_t)(sizeof variants / sizeof variants[0]))

const colibri_kernels *colibri_kernels_variant(int32_t i)
{
    return i >= 0 && i < VARIANTS ? variants[i].kernels() : NULL;
}

int colibri_kernels_runnable(const colibri_kernels *kernels)
{
    int32_t i;
    for (i = 0; i < VARIANTS; i++)
        if (variants[i].kernels() == kernels) return !variants[i].runs_here || variants[i].runs_here();
    return 0;
}

const colibri_kernels *colibri_kernels_best(void)
{
    int32_t i;
    for (i = VARIANTS - 1; i > 1; i--)
        if (!variants[i].runs_here || variants[i].runs_here()) return variants[i].kernels();
    return colibri_kernels_reference();
}

const colibri_kernels *colibri_kernels_named(const char *name)
{
    int32_t i;
    for (i = 0; i < VARIANTS; i++)
        if (strcmp(variants[i].kernels()->name, name) == 0)
            return !variants[i].runs_here || variants[i].runs_here() ? variants[i].kernels() : NULL;
    return NULL;
}
