/*
 * exp2_ulp.c — the figures of simd_exp.h's note "The softmax's exp(s - m) in base 2":
 *
 *   1. the polynomial alone: 1 + C1 r + ... + C6 r^6 by Horner with fmaf (the kernel's
 *      steps), over every float r of [-1/2, 1/2] (every `stride`-th), against 2^r in
 *      double: the largest error in ulps of the result;
 *   2. the whole softmax exp through a kernel table's `softmax` entry: one row of scores
 *      s = m + t for every `stride`-th float t of [-88, 0] (rounded to float), for
 *      several m from 0 to 1e30, against exp(s - m) in double: the largest relative
 *      error in u = 2^-24, and the largest fraction of tests/kernel_checks.h's bound
 *      (4 + 3|x|) u, x = s - m.
 *
 *   usage: exp2_ulp [stride [ISA ...]]     (default: stride 1, avx512)
 *   make exp2-ulp EXP2_ULP_ARGS="1 avx512 avx2 scalar"
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "kernels/simd_exp.h"

static uint32_t bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* error of y against the exact e, in ulps of the float nearest e */
static double ulp_err(float y, double e)
{
    const float ef = (float)e;
    const double ulp = (double)nextafterf(ef, INFINITY) - (double)ef;
    return fabs((double)y - e) / ulp;
}

static void poly_sweep(uint32_t stride)
{
    double worst = 0.0;
    float wr = 0.0f;
    const uint32_t top = bits(0.5f);
    for (int sign = 0; sign < 2; sign++)
        for (uint32_t u = 0; u <= top; u += stride) {
            const float r = from_bits(u | (sign ? 0x80000000u : 0u));
            float p = FA_EXP2_C6;
            p = fmaf(p, r, FA_EXP2_C5);
            p = fmaf(p, r, FA_EXP2_C4);
            p = fmaf(p, r, FA_EXP2_C3);
            p = fmaf(p, r, FA_EXP2_C2);
            p = fmaf(p, r, FA_EXP2_C1);
            p = fmaf(p, r, 1.0f);
            const double e = ulp_err(p, exp2((double)r));
            if (e > worst) worst = e, wr = r;
        }
    printf("polynomial 2^r, every %u-th float of [-1/2, 1/2]: max %.4f ulp at r = %a\n", stride, worst, (double)wr);
}

static int softmax_sweep(const fa_kernels *k, uint32_t stride)
{
    static const float ms[] = {0.0f, 1.0f, -3.3f, 88.0f, 2500.0f, 1e4f, -1e4f, 3e7f, 1e30f};
    enum { N = 4096 };
    static float row[N], t0[N];
    double worst_u = 0.0, worst_frac = 0.0;
    float wm = 0.0f, ws = 0.0f;
    long long n_total = 0;
    for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++) {
        const float m = ms[mi];
        uint32_t u = 0;
        const uint32_t top = bits(88.0f);
        while (u <= top) {
            int n = 1; /* row[0] = m: the row's max stays m */
            t0[0] = m;
            for (; n < N && u <= top; u += stride) {
                const float s = m - from_bits(u);
                if (s > m) continue;
                t0[n++] = s;
            }
            memcpy(row, t0, sizeof(float) * (size_t)n);
            float mm = -INFINITY, l = 0.0f, alpha;
            k->softmax(1, n, row, N, &mm, &l, &alpha);
            if (mm != m) {
                printf("%s: row max %.9g, want %.9g\n", k->name, mm, m);
                return 1;
            }
            for (int j = 0; j < n; j++) {
                const double x = (double)t0[j] - (double)m, e = exp(x);
                if (e < FLT_MIN) continue; /* flushed or subnormal: the test's +FLT_MIN */
                const double rel = fabs((double)row[j] - e) / e / 0x1.0p-24;
                const double frac = rel / (4.0 + 3.0 * fabs(x));
                if (rel > worst_u) worst_u = rel;
                if (frac > worst_frac) worst_frac = frac, wm = m, ws = t0[j];
                n_total++;
            }
        }
    }
    printf("%s softmax, %lld scores (every %u-th float of s - m in [-88, 0], %zu values of m): max error %.2f u, "
           "max %.3f of the bound (4 + 3|x|) u (at m = %.9g, s = %.9g)\n",
           k->name, n_total, stride, sizeof ms / sizeof ms[0], worst_u, worst_frac, (double)wm, (double)ws);
    return worst_frac > 1.0;
}

int main(int argc, char **argv)
{
    const uint32_t stride = argc > 1 ? (uint32_t)strtoul(argv[1], NULL, 10) : 1u;
    if (stride == 0) {
        fprintf(stderr, "exp2_ulp: stride must be >= 1\n");
        return 2;
    }
    poly_sweep(stride);
    const char *def[] = {"avx512"};
    const char *const *isas = argc > 2 ? (const char *const *)argv + 2 : def;
    const int nisa = argc > 2 ? argc - 2 : 1;
    int bad = 0;
    for (int a = 0; a < nisa; a++) {
        const fa_kernels *k = fa_kernels_by_name(isas[a]);
        if (!k) printf("%s: not in this build or not on this CPU\n", isas[a]);
        else bad |= softmax_sweep(k, stride);
    }
    return bad;
}
