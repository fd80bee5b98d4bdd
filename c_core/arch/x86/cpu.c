/* SPDX-License-Identifier: MIT */
/* x86-64 feature probes, compiled without any -m flag so they run on every x86-64 CPU.
 * __builtin_cpu_supports also checks that the OS saves the wider registers. */
#include <cpuid.h>

#include "../arch.h"

int colibri_cpu_has_avx2(void)
{
    unsigned eax, ebx, ecx, edx;
    int f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C);   /* not a cpu_supports name in clang 14 */
    __builtin_cpu_init();
    return f16c && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

int colibri_cpu_has_avx512_vnni(void)
{
    return colibri_cpu_has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")
           && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
}

int colibri_cpu_has_avx512_bf16(void) { return colibri_cpu_has_avx512_vnni() && __builtin_cpu_supports("avx512bf16"); }
