/* x86-64 feature probe, compiled without any -m flag so it runs on every x86-64 CPU. */
#include <cpuid.h>

#include "../../src/ops/ops.h"

int colibri_cpu_has_avx2(void)
{
    unsigned eax, ebx, ecx, edx;
    int f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C);   /* not a cpu_supports name in clang 14 */
    __builtin_cpu_init();
    return f16c && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
