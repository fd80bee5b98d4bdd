/* SPDX-License-Identifier: MIT */
/* exp, log, sin and cos of our own, in plain IEEE double arithmetic (+ - * / and exact
 * scaling by powers of two), and a float exp in float arithmetic, so every platform computes
 * the same bits: C libraries round their libm results differently, and the deterministic mode
 * promises identical logits on x86-64, AArch64 and RISC-V.  Accurate to a few double ulps (the
 * float exp: float ulps), far below the float results they feed.  -ffp-contract=off keeps
 * compilers from fusing the polynomial steps. */
#include <string.h>

#include "ops.h"

#define LN2_HI 0.6931471806019545           /* ln 2 in 32 bits: k * LN2_HI is exact for |k| < 2^21 */
#define LN2_LO (-4.2009150726810846e-11)    /* ln 2 - LN2_HI */
#define PIO2_1 1.5707963267341256           /* pi/2 in three 33-bit parts: k * part exact for k < 2^20 */
#define PIO2_2 6.077100506303966e-11
#define PIO2_3 2.0222662487959506e-21
#define TWO_OVER_PI 0.6366197723675814

/* x * 2^k for integer k, by building the power of two from its bits (no ldexp: libm). */
static double scale2(double x, int k)
{
    uint64_t bits;
    double p;
    while (k > 1000) { x *= 0x1p1000; k -= 1000; }
    while (k < -1000) { x *= 0x1p-1000; k += 1000; }
    bits = (uint64_t)(k + 1023) << 52;
    memcpy(&p, &bits, 8);
    return x * p;
}

/* Nearest integer, ties away from zero, for every x: past 2^52 every double is already an integer
 * (and NaN stays NaN), below it the cast to long long is in range. */
static double nearest(double x)
{
    if (!(x > -0x1p52 && x < 0x1p52)) return x;
    return (double)(long long)(x < 0 ? x - 0.5 : x + 0.5);
}

double colibri_exp(double x)
{
    double r, sum, term;
    int k, i;
    if (x != x) return x;
    if (x > 709.782712893384) return 0x1p1023 * 2.0;   /* beyond ln(DBL_MAX): +inf */
    if (x < -745.2) return 0.0;
    k = (int)nearest(x / LN2_HI);                /* |k| <= 1075: x is bounded above */
    r = (x - k * LN2_HI) - k * LN2_LO;          /* |r| <= ln2 / 2 */
    sum = 1.0;
    term = 1.0;
    for (i = 1; i <= 17; i++) {                   /* Taylor: (ln2/2)^18 / 18! < 1e-19 */
        term = term * r / i;
        sum += term;
    }
    return scale2(sum, k);
}

double colibri_log(double x)
{
    uint64_t bits;
    double m, s, s2, sum, power;
    int k, i;
    if (!(x > 0.0)) return x == 0.0 ? -0x1p1023 * 2.0 : (x - x) / (x - x);   /* -inf, or NaN */
    if (x > 0x1p1023 * 1.9999) return x;                                   /* +inf stays */
    k = 0;
    if (x < 0x1p-1000) { x *= 0x1p100; k = -100; }   /* subnormals */
    memcpy(&bits, &x, 8);
    k += (int)((bits >> 52) & 0x7ff) - 1023;
    bits = (bits & 0x000fffffffffffffull) | 0x3ff0000000000000ull;
    memcpy(&m, &bits, 8);                          /* m in [1, 2) */
    if (m > 1.4142135623730951) { m *= 0.5; k++; }
    s = (m - 1.0) / (m + 1.0);                     /* |s| <= 0.1716: log m = 2 atanh s */
    s2 = s * s;
    sum = 0.0;
    power = s;
    for (i = 1; i <= 25; i += 2) {                 /* s^27 / 27 < 1e-22 */
        sum += power / i;
        power *= s2;
    }
    return (k * LN2_HI + (2.0 * sum + k * LN2_LO));
}

/* sin and cos of r in [-pi/4, pi/4], Taylor to well below a double ulp. */
static double sin_small(double r)
{
    double r2 = r * r, term = r, sum = r;
    int i;
    for (i = 1; i <= 8; i++) {
        term = -term * r2 / ((2 * i) * (2 * i + 1));
        sum += term;
    }
    return sum;
}

static double cos_small(double r)
{
    double r2 = r * r, term = 1.0, sum = 1.0;
    int i;
    for (i = 1; i <= 9; i++) {
        term = -term * r2 / ((2 * i - 1) * (2 * i));
        sum += term;
    }
    return sum;
}

/* k mod 4 of an integer k: past 2^62 k is a multiple of 2^10, below it the cast is in range. */
static int mod4(double k) { return k > -0x1p62 && k < 0x1p62 ? (int)((long long)k & 3) : 0; }

/* x = k * pi/2 + r; returns r, k in *quadrant (mod 4).  Exact reduction for |x| < 2^20 * pi/2;
 * beyond, still the same bits everywhere, with less accuracy.  From |k| = 2^31 on, r keeps the
 * rounding of k * pi/2 (up to |x| 2^-50), so it is reduced again until it is small: every finite x
 * gets a result in [-1, 1], and below 2^31 nothing changes. */
static double reduce(double x, int *quadrant)
{
    double k = nearest(x * TWO_OVER_PI), r = ((x - k * PIO2_1) - k * PIO2_2) - k * PIO2_3;
    int q = mod4(k), pass;
    for (pass = 0; pass < 32 && !(k >= -0x1p31 && k < 0x1p31); pass++) {   /* 2^1024 in steps of 2^-50 */
        k = nearest(r * TWO_OVER_PI);
        r = ((r - k * PIO2_1) - k * PIO2_2) - k * PIO2_3;
        q += mod4(k);
    }
    *quadrant = q & 3;
    return r;
}

double colibri_sin(double x)
{
    int q;
    double r;
    if (!(x - x == 0.0)) return (x - x) / (x - x);   /* NaN, inf */
    r = reduce(x, &q);
    switch (q) {
    case 0: return sin_small(r);
    case 1: return cos_small(r);
    case 2: return -sin_small(r);
    default: return -cos_small(r);
    }
}

double colibri_cos(double x)
{
    int q;
    double r;
    if (!(x - x == 0.0)) return (x - x) / (x - x);
    r = reduce(x, &q);
    switch (q) {
    case 0: return cos_small(r);
    case 1: return -sin_small(r);
    case 2: return -cos_small(r);
    default: return sin_small(r);
    }
}

/* A float's exp in float arithmetic, which every target has in hardware (a Cortex-M4F has no
 * double unit): x = k ln2 + r with |r| <= ln2 / 2 (ln2 in two parts: k * 0.693359375 is exact),
 * Cephes' degree-7 polynomial for exp(r), times 2^k built in the exponent bits; within 2 float
 * ulps of exp (c_core/tests/test_math.c).  Plain + and * in a fixed order (no fused steps), so
 * every target rounds alike; the attention softmax, SiLU, the router and sampling call it. */
float colibri_expf(float x)
{
    float n, r, p, scale;
    uint32_t bits;
    int k;
    if (x != x) return x;
    if (x > 88.72283f) return (float)(0x1p1023 * 2.0);   /* beyond FLT_MAX: +inf */
    if (x < -103.97208f) return 0.0f;
    k = (int)nearest((double)(x * 1.44269504f));   /* |k| <= 150: x is bounded above */
    n = (float)k;
    r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    if (k > 127) { p *= 2.0f; k--; }            /* near FLT_MAX: 2^128 is no float */
    if (k < -125) { p *= 0x1p-64f; k += 64; }   /* a subnormal result: scale in two steps */
    bits = (uint32_t)(k + 127) << 23;
    memcpy(&scale, &bits, 4);
    return p * scale;
}
