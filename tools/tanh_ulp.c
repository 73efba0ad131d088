/*
 * tanh_ulp.c — the error of each kernel table's SIMD tanh (simd_exp.h), over
 * every float of |x| < 10 (or every `stride`-th), through the table's
 * `transform` entry with softcap c = 1 (u = 1 * tanh(u * 1): tanh itself).
 * Reports the largest error in ulps against double-precision tanh rounded to
 * float (the correctly rounded result, to within double's own rounding) and
 * against libm's tanhf, and where each occurs; above |x| = 10 both are 1.
 *
 *   usage: tanh_ulp [stride [ISA ...]]     (stride 1 = every float; default 1)
 *   make tanh-ulp TANH_ULP_ARGS="1 avx2 avx512"
 */
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

/* ulps between two finite floats of the same sign */
static double ulps(float a, float b) { return fabs((double)bits(a) - (double)bits(b)); }

static int sweep(const fa_kernels *k, uint32_t stride)
{
    enum { CHUNK = 4096 };
    static float x[CHUNK], y[CHUNK];
    const uint32_t top = bits(10.0f);
    double worst_cr = 0.0, worst_libm = 0.0;
    float wx_cr = 0.0f, wx_libm = 0.0f;
    long long n_total = 0, n_off_cr = 0;
    for (int sign = 0; sign < 2; sign++) {
        uint32_t u = 0;
        while (u <= top) {
            int n = 0;
            for (; n < CHUNK && u <= top; n++, u += stride) x[n] = from_bits(u | (sign ? 0x80000000u : 0u));
            memcpy(y, x, sizeof(float) * (size_t)n);
            k->transform(n, 0, n, y, 1.0f, 1.0f, 0.0, 0, 1, NULL);
            for (int i = 0; i < n; i++) {
                const float cr = (float)tanh((double)x[i]), lm = tanhf(x[i]);
                if (signbit(y[i]) != signbit(cr) && y[i] != 0.0f) {
                    printf("%s: tanh(%.9g) = %.9g has the wrong sign\n", k->name, x[i], y[i]);
                    return 1;
                }
                const double e1 = ulps(y[i], cr), e2 = ulps(y[i], lm);
                if (e1 > worst_cr) worst_cr = e1, wx_cr = x[i];
                if (e2 > worst_libm) worst_libm = e2, wx_libm = x[i];
                n_off_cr += e1 != 0.0;
            }
            n_total += n;
            if (u < stride) break; /* wrapped */
        }
    }
    printf("%-7s %lld floats (|x| < 10, stride %u): max %.0f ulp vs tanh rounded to float (at x = %.9g), "
           "%.1f%% not correctly rounded; max %.0f ulp vs libm tanhf (at x = %.9g); stated bound %.1f\n",
           k->name, n_total, stride, worst_cr, wx_cr, 100.0 * (double)n_off_cr / (double)n_total, worst_libm,
           wx_libm, FA_TANH_MAX_ULP);
    return worst_libm > FA_TANH_MAX_ULP;
}

int main(int argc, char **argv)
{
    const uint32_t stride = argc > 1 ? (uint32_t)strtoul(argv[1], NULL, 10) : 1;
    if (stride < 1) {
        fprintf(stderr, "tanh_ulp: stride must be a positive integer\n");
        return 2;
    }
    const char *all[] = {"scalar", "avx2", "avx512", "neon"};
    const char **isas = argc > 2 ? (const char **)argv + 2 : all;
    const int nisa = argc > 2 ? argc - 2 : 4;
    int bad = 0;
    for (int i = 0; i < nisa; i++) {
        const fa_kernels *k = fa_kernels_by_name(isas[i]);
        if (!k) {
            if (argc > 2) printf("%s: not built or not supported by this CPU\n", isas[i]);
            continue;
        }
        bad |= sweep(k, stride);
    }
    return bad;
}
