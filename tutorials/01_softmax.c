/*
 * 01_softmax.c — softmax three ways: naive, safe, online.
 *
 * Previous step: none; this is where attention's hard part starts. Attention
 *   is two matrix products with a softmax between them, and the softmax is what
 *   stops us from simply tiling the whole thing like a matmul.
 * What changes: we compute p = softmax(x) three ways.
 *   naive   p_j = e^{x_j} / sum_k e^{x_k}                 2 passes, overflows
 *   safe    m = max x; p_j = e^{x_j - m} / sum e^{x_k - m}  3 passes, never overflows
 *   online  one pass keeps a running max m and a running sum l, rescaling
 *           l by e^{m_old - m_new} whenever the max grows; then 1 pass to write p
 * What to look for:
 *   1. naive returns NaN once the largest input passes ln(FLT_MAX) ~ 88.72;
 *   2. the trace: l shrinks by e^{m_old - m_new} exactly when m jumps;
 *   3. two partial (m, l) pairs merge into the whole one: this is what lets
 *      FlashAttention (step 06) split the keys into blocks;
 *   4. on a vector larger than the cache, safe reads x three times and online
 *      twice: see the L2 misses [sim] column.
 */
#include "common.h"

#include <float.h>

/* ---- the three kernels, each written once (probe-able, see common.h) ------ */

/* x: [n], p: [n]. Two passes: sum of exponentials, then divide. */
TUT_BODY void softmax_naive_body(cachesim *cs, int n, const float *x, float *p)
{
    double sum = 0.0;   /* float64 sums: see "Try" at the end */
    for (int j = 0; j < n; j++) sum += expf(LD(cs, &x[j]));
    for (int j = 0; j < n; j++) ST(cs, &p[j], (float)(expf(LD(cs, &x[j])) / sum));
}

/* x: [n], p: [n]. Three passes: max, sum of e^{x - max}, divide. */
TUT_BODY void softmax_safe_body(cachesim *cs, int n, const float *x, float *p)
{
    float m = -INFINITY;
    for (int j = 0; j < n; j++) m = fmaxf(m, LD(cs, &x[j]));
    double l = 0.0;
    for (int j = 0; j < n; j++) l += expf(LD(cs, &x[j]) - m);
    for (int j = 0; j < n; j++) ST(cs, &p[j], (float)(expf(LD(cs, &x[j]) - m) / l));
}

/*
 * The online recurrence, for each new x_j:
 *     m_j = max(m_{j-1}, x_j)
 *     l_j = l_{j-1} * e^{m_{j-1} - m_j} + e^{x_j - m_j}
 * Invariant: l_j = sum_{k<=j} e^{x_k - m_j}. Written with a branch so that each
 * element costs one exp: either the max grows (rescale l, add e^0 = 1) or not.
 */
TUT_BODY void online_update(float xj, float *m, double *l)
{
    if (xj > *m) { *l = *l * expf(*m - xj) + 1.0; *m = xj; }
    else *l += expf(xj - *m);
}

/* x: [n], p: [n]. One pass for (m, l), one to write p. */
TUT_BODY void softmax_online_body(cachesim *cs, int n, const float *x, float *p)
{
    float m = -INFINITY;
    double l = 0.0;
    for (int j = 0; j < n; j++) online_update(LD(cs, &x[j]), &m, &l);
    for (int j = 0; j < n; j++) ST(cs, &p[j], (float)(expf(LD(cs, &x[j]) - m) / l));
}

TUT_NOINLINE void softmax_naive(int n, const float *x, float *p) { softmax_naive_body(NULL, n, x, p); }
TUT_NOINLINE void softmax_safe(int n, const float *x, float *p) { softmax_safe_body(NULL, n, x, p); }
TUT_NOINLINE void softmax_online(int n, const float *x, float *p) { softmax_online_body(NULL, n, x, p); }
TUT_NOINLINE void softmax_probed(cachesim *cs, int which, int n, const float *x, float *p)
{
    if (which == 0) softmax_naive_body(cs, n, x, p);
    else if (which == 1) softmax_safe_body(cs, n, x, p);
    else softmax_online_body(cs, n, x, p);
}

/* float64 safe softmax: the reference. x: [n], p: [n]. */
static void softmax_ref(int n, const float *x, double *p)
{
    double m = -INFINITY, l = 0;
    for (int j = 0; j < n; j++) m = fmax(m, x[j]);
    for (int j = 0; j < n; j++) l += exp((double)x[j] - m);
    for (int j = 0; j < n; j++) p[j] = exp((double)x[j] - m) / l;
}

/* max_j |p_j - ref_j| / max_j ref_j: error relative to the largest probability. */
static double rel_err(int n, const float *p, const double *ref)
{
    double e = 0, big = 0;
    for (int j = 0; j < n; j++) big = fmax(big, ref[j]);
    for (int j = 0; j < n; j++) {
        double d = fabs((double)p[j] - ref[j]);
        if (!(d <= e)) e = d;
    }
    return e / big;
}

#define TOL 1e-5   /* online vs reference, and online vs safe: relative to max p */

int main(int argc, char **argv)
{
    tut_args a = {.n = {65536, 1048576}, .n_count = 2, .d = 64, .reps = 3, .vg_kernel = "softmax_online"};
    tut_parse_args(argc, argv, &a, "01_softmax: softmax naive, safe and online");
    if (a.kernel_only || a.sim_kernel) {   /* the online kernel alone, on n[0] elements */
        float *x = tut_alloc((size_t)a.n[0] * 4), *p = tut_alloc((size_t)a.n[0] * 4);  /* [n] */
        tut_fill(x, (size_t)a.n[0], 1, -5, 5);
        if (a.kernel_only) {
            tut_flush_caches(&a);
            softmax_online(a.n[0], x, p);
        } else {
            cachesim *cs = cachesim_create(&a.geo);
            softmax_probed(cs, 2, a.n[0], x, p);
            tut_print_sim_counts(cs, "softmax_online");
            cachesim_free(cs);
        }
        return 0;
    }
    tut_hw hw;
    tut_hw_init(&hw);
    tut_banner("Step 01: softmax three ways (naive, safe, online)", &a, &hw);

    /* ---- 1. overflow: x = [v, v-1, ..., v-7] ---------------------------- */
    printf("1. Overflow. x = [v, v-1, ..., v-7]; p[0] should be 1/(1+e^-1+...+e^-7) = 0.6323\n");
    printf("   %8s | %12s | %12s | %12s\n", "v", "naive p[0]", "safe p[0]", "online p[0]");
    const float vs[] = {1, 10, 80, 88, 88.7f, 88.8f, 100, 1000};
    float x8[8], p8[3][8];   /* [8] input, [method][8] outputs */
    int naive_overflowed = 0;
    for (size_t t = 0; t < sizeof vs / sizeof vs[0]; t++) {
        for (int j = 0; j < 8; j++) x8[j] = vs[t] - (float)j;
        softmax_naive(8, x8, p8[0]);
        softmax_safe(8, x8, p8[1]);
        softmax_online(8, x8, p8[2]);
        printf("   %8.2f | %12.4f | %12.4f | %12.4f%s\n", vs[t], p8[0][0], p8[1][0], p8[2][0],
               isnan(p8[0][0]) ? "   <- e^v = inf, inf/inf" : p8[0][0] < 0.5f ? "   <- the sum overflowed first" : "");
        if (vs[t] > 88.73f && isnan(p8[0][0])) naive_overflowed = 1;
        tut_require(fabs(p8[2][0] - 0.6321) + fabs(p8[1][0] - 0.6321), 1e-3, "safe/online on large inputs");
    }
    printf("   ln(FLT_MAX) = %.4f: e^v is +inf above it, and inf/inf = NaN.%s\n\n", log(FLT_MAX),
           naive_overflowed ? "" : " (naive did not overflow?)");

    /* ---- 2. the online trace -------------------------------------------- */
    FILE *tr = tut_dat_open(&a, "01_trace", "j x_j m_j l_j");
    const float xt[10] = {0.5f, 2.0f, 1.0f, 3.5f, -1.0f, 3.0f, 6.0f, 0.0f, 5.5f, 2.5f};
    printf("2. The online recurrence, one element at a time (m = running max, l = sum e^{x-m}):\n");
    printf("   %3s | %6s | %6s | %10s | %s\n", "j", "x_j", "m_j", "l_j", "");
    float m = -INFINITY;
    double l = 0;
    for (int j = 0; j < 10; j++) {
        float m_old = m;
        online_update(xt[j], &m, &l);
        printf("   %3d | %6.2f | %6.2f | %10.6f | %s\n", j, xt[j], m, l,
               m > m_old && j > 0 ? "max grew: l rescaled by e^(m_old - m_new), then + 1" : "");
        fprintf(tr, "%d %g %g %g\n", j, xt[j], m, l);
    }
    fclose(tr);

    /* ---- 3. merging two partials ---------------------------------------- */
    float m1 = -INFINITY, m2 = -INFINITY;
    double l1 = 0, l2 = 0;
    for (int j = 0; j < 5; j++) online_update(xt[j], &m1, &l1);
    for (int j = 5; j < 10; j++) online_update(xt[j], &m2, &l2);
    float mm = fmaxf(m1, m2);
    double lm = l1 * expf(m1 - mm) + l2 * expf(m2 - mm);
    printf("\n3. Merge. First half: (m, l) = (%.2f, %.6f); second half: (%.2f, %.6f).\n", m1, l1, m2, l2);
    printf("   m = max(m1, m2) = %.2f;  l = l1 e^(m1-m) + l2 e^(m2-m) = %.6f  (one pass gave %.6f)\n",
           mm, lm, l);
    printf("   log-sum-exp = m + ln l = %.6f. Any split of the keys merges the same way.\n\n", mm + log(lm));
    tut_require(fabs(lm - l) / l, 1e-6, "merged partials vs one pass");

    /* ---- 4. memory passes on long vectors ------------------------------- */
    cachesim *cs = a.no_sim ? NULL : cachesim_create(&a.geo);
    FILE *dat = tut_dat_open(&a, "01", "n method time_ms GB_per_s l1_miss_sim l2_miss_sim hw_l1 hw_ll rel_err");
    const char *names[3] = {"naive", "safe", "online"};
    printf("4. Long vectors, x uniform in [-5, 5]. Passes over x: naive 2, safe 3, online 2.\n");
    printf("   %8s | %-6s | %8s | %7s | %12s | %12s | %10s | %9s\n", "n", "method", "time ms", "GB/s",
           "L1 miss[sim]", "L2 miss[sim]", "L1 miss[hw]", "rel err");
    for (int t = 0; t < a.n_count; t++) {
        int n = a.n[t];
        float *x = tut_alloc((size_t)n * 4), *p = tut_alloc((size_t)n * 4), *p_safe = tut_alloc((size_t)n * 4); /* [n] */
        double *ref = tut_alloc((size_t)n * 8);   /* [n] */
        tut_fill(x, (size_t)n, 1, -5, 5);
        softmax_ref(n, x, ref);
        softmax_safe(n, x, p_safe);
        for (int w = 0; w < 3; w++) {
            double sec;
            tut_hw_start(&hw);
            if (w == 0) TUT_TIME(a.reps, sec, softmax_naive(n, x, p));
            else if (w == 1) TUT_TIME(a.reps, sec, softmax_safe(n, x, p));
            else TUT_TIME(a.reps, sec, softmax_online(n, x, p));
            tut_hw_stop(&hw);
            uint64_t m1s = 0, m2s = 0;
            if (cs) {
                cachesim_reset(cs);
                softmax_probed(cs, w, n, x, p);
                m1s = cachesim_misses(cs, 1);
                m2s = cachesim_misses(cs, 2);
            }
            double err = rel_err(n, p, ref);
            double passes = w == 1 ? 4 : 3;   /* reads of x plus the write of p */
            printf("   %8d | %-6s | %8.3f | %7.2f | %12llu | %12llu | %10s | %9.2e\n", n, names[w], sec * 1e3,
                   passes * n * 4 / sec / 1e9, (unsigned long long)m1s, (unsigned long long)m2s,
                   tut_hw_text(hw.l1), err);
            fprintf(dat, "%d %s %g %g %llu %llu %lld %g\n", n, names[w], sec * 1e3, passes * n * 4 / sec / 1e9,
                    (unsigned long long)m1s, (unsigned long long)m2s, hw.l1, err);
            tut_require(err, TOL, names[w]);
            if (w == 2) {
                double e_os = 0, big = 0;
                for (int j = 0; j < n; j++) {
                    e_os = fmax(e_os, fabs((double)p[j] - p_safe[j]));
                    big = fmax(big, p_safe[j]);
                }
                tut_require(e_os / big, TOL, "online vs safe");
            }
        }
        free(x); free(p); free(p_safe); free(ref);
    }
    fclose(dat);
    cachesim_free(cs);
    printf("\n   Tolerance: every method within %.0e of the float64 reference, relative to max p.\n", TOL);
    printf("   When x outgrows L2, L2 misses [sim] are 3n/16 for online (2 reads of x, 1 write of p)\n"
           "   and 4n/16 for safe: one pass over memory saved. A 64-byte line holds 16 floats.\n");
    printf("   Try: --n 4096 (fits in L1: the passes are free) and --geometry teaching; and make the\n"
           "   sums float, not double: at n = 1M a float32 running sum loses ~3 digits (error ~1e-3).\n");
    printf("   Next: 02_naive_attention applies softmax to every row of S = QK^T.\n");
    return 0;
}
