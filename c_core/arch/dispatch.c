/* Picks the kernels a session uses: the best variant this CPU runs, or the reference when
 * asked (COLIBRI_KERNELS_REFERENCE, or COLIBRI_KERNELS=reference in the environment). */
#include "../src/ops/ops.h"

const colibri_kernels *colibri_kernels_best(void)
{
#if defined(COLIBRI_HAVE_AVX2)
    if (colibri_cpu_has_avx2()) return colibri_kernels_avx2();
#elif defined(COLIBRI_HAVE_NEON)
    return colibri_kernels_neon();
#endif
    return colibri_kernels_reference();
}
