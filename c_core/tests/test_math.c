/* SPDX-License-Identifier: MIT */
/* ops/math.c against the C library's libm: our exp, log, sin and cos must be as accurate as
 * a libm (a few double ulps) wherever the engine uses them; that they give the same bits on
 * every target is checked by comparing whole-model logits across targets.
 *
 *   test_math              every point of each grid (1.6 million)
 *   test_math --emulated   every 13th point: the same ranges at 1/13 of the cost, for a cross
 *                          build's tests, which run emulated (QEMU) */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../src/ops/ops.h"

static int failures;

static void check(const char *name, double x, double got, double want, double tolerance)
{
    double err = fabs(got - want) / (fabs(want) > 1e-300 ? fabs(want) : 1.0);
    if (err > tolerance && failures++ < 10)
        fprintf(stderr, "%s(%.17g) = %.17g, libm %.17g (relative error %.3g)\n", name, x, got, want, err);
}

int main(int argc, char **argv)
{
    int i, step = 1;
    if (argc == 2 && strcmp(argv[1], "--emulated") == 0) step = 13;   /* prime: on no period of a reduction */
    else if (argc != 1) { fprintf(stderr, "usage: test_math [--emulated]\n"); return 2; }
    for (i = -200000; i <= 200000; i += step) {
        double x = i * 0.0037;                                   /* [-740, 740] */
        check("exp", x, colibri_exp(x), exp(x), 1e-14);
    }
    for (i = 1; i <= 200000; i += step) {
        double x = exp((i - 100000) * 0.0069);                   /* 1e-300 .. 1e300 */
        check("log", x, colibri_log(x), log(x), 1e-14);
    }
    for (i = 0; i <= 400000; i += step) {
        double x = i * 2.9;                                      /* RoPE angles: 0 .. 1.16e6 rad */
        /* absolute error: near a zero of sin or cos the relative error means nothing */
        if (fabs(colibri_sin(x) - sin(x)) > 1e-12 && failures++ < 10) fprintf(stderr, "sin(%.17g)\n", x);
        if (fabs(colibri_cos(x) - cos(x)) > 1e-12 && failures++ < 10) fprintf(stderr, "cos(%.17g)\n", x);
        if (fabs(colibri_sin(-x * 1e-3) - sin(-x * 1e-3)) > 1e-15 && failures++ < 10) fprintf(stderr, "sin(%.17g)\n", -x * 1e-3);
    }
    for (i = -118300; i <= 100950; i += step) {   /* the float exp over [-104, 88.7] in steps of 0.9 * 2^-10: within 2 float ulps */
        float x = (float)i * 0x1p-10f * 0.9f, got = colibri_expf(x);
        double want = exp((double)x), ulp = ldexp(1.0, (int)floor(log2(want > 0x1p-126 ? want : 0x1p-126)) - 23);
        if (x < -104.0f || x > 88.7f) continue;
        if (fabs(got - want) > 2.0 * ulp && failures++ < 10)
            fprintf(stderr, "expf(%.9g) = %.9g, libm %.9g (%.2f ulp)\n", x, got, want, fabs(got - want) / ulp);
    }
    for (i = 0; i < 2 * 1030; i++) {   /* past 2^31 * pi/2, up to DBL_MAX: in [-1, 1], sin^2 + cos^2 = 1 */
        double x = (i % 2 ? -1.0 : 1.0) * ldexp(1.2345678901234567, 31 + i / 2 < 1023 ? 31 + i / 2 : 1023);
        double sx = colibri_sin(x), cx = colibri_cos(x);
        if (!(fabs(sx) <= 1.0 && fabs(cx) <= 1.0 && fabs(sx * sx + cx * cx - 1.0) < 1e-12) && failures++ < 10)
            fprintf(stderr, "sin(%.17g) = %.17g, cos = %.17g\n", x, sx, cx);
    }
    printf("exp, log, sin, cos, expf against libm on %s of the grids: %d outside tolerance\n",
           step == 1 ? "every point" : "every 13th point", failures);
    return failures ? 1 : 0;
}
