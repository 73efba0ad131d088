/*
 * 10_register_blocking.c — where the library's ~25x over step 09 comes from:
 * register blocking, packing and vector width, on one tile product.
 *
 * Previous step: 09 vectorized FlashAttention-2 (`omp simd`, 4 x 1 score tile);
 *   the library still ran ~25x faster on one thread, with its blocks in cache
 *   too: the gap is arithmetic, mostly in S = Q_i K_j^T and O_i += P V_j.
 * What changes: nothing about attention. The tile S = Q_i K_j^T (Br x Bc,
 *   2 Br Bc d FLOPs) is computed five ways, each checked against a float64
 *   loop and timed as GFLOP/s and as a fraction of its ISA's multiply-add
 *   peak (measured here with the same register tile and no loads):
 *     1. naive: three loops; C forbids reordering a float sum: one dependent chain.
 *     2. simd 4x1 (step 09): `omp simd reduction` spreads the sum over lanes,
 *        4 Q rows share each K row; still 2 loads per FMA, a horizontal sum each.
 *     3. register tile MR x NR: an MR x NR block of S stays in MR NR / W vector
 *        registers for the whole c loop; per c: NR values of K_j^T, MR
 *        broadcasts of Q_i, MR NR multiply-adds. But K is [Bc][d]: the NR values
 *        K_{j..j+NR-1, c} lie d floats apart, so each vector load is NR loads.
 *     4. packed panels: copy K_j^T into [Bc/NR][d][NR] and Q_i into
 *        [Br/MR][d][MR] first (O((Br + Bc) d) copies for O(Br Bc d) FLOPs): the
 *        micro-kernel then reads both strictly in order. Timed with the packing
 *        and without it (the library reuses K_j^T for every Q block).
 *     5. the packed kernel for the CPU's wider vectors (AVX2+FMA, AVX-512): the
 *        same C under __attribute__((target)), no intrinsics (x86-64's baseline
 *        build has 4-lane SSE and no FMA).
 * What to look for:
 *   - the "vs 09" column: 2 -> 4 is register blocking and packing, 4 -> 5 is
 *     vector width and FMA; their product is most of the ~25x;
 *   - "of peak": what is left on the table at each rung;
 *   - err/bound <= 1: any summation order stays within (d+1) u / (1 - (d+1) u)
 *     times scale sum_c |Q_ic K_jc| (u = 2^-24) of the exact score.
 */
#include "common.h"

#define MR 6   /* rows of the register tile */

#if defined(__FMA__) || defined(__ARM_FEATURE_FMA)
#define MADD_BASE(a, b, c) fmaf((a), (b), (c))
#else
#define MADD_BASE(a, b, c) ((a) * (b) + (c))
#endif
#define MADD_FMA(a, b, c) fmaf((a), (b), (c))
#if defined(__AVX512F__)
#define W_BASE 16
#elif defined(__AVX__)
#define W_BASE 8
#else
#define W_BASE 4   /* SSE2 (x86-64 baseline) or NEON */
#endif

/*
 * The packed micro-kernel: s[MR][lds] (MR x NR) = qp [d][MR] times kp [d][NR].
 * `GCC unroll` makes r a constant in each copy of the x loop, which is what
 * lets the compiler keep acc (MR * NR floats) in registers instead of memory.
 * And the peak: the same register tile, acc = acc * m + b, no loads at all.
 */
#define DEFINE_MICRO(SUFFIX, TARGET, NR, MADD)                                              \
    TARGET static void micro_##SUFFIX(int d, const float *restrict qp, const float *restrict kp, \
                                      float *restrict s, int lds, float scale)             \
    {                                                                                       \
        float acc[MR][NR] = {{0}};                                                          \
        for (int c = 0; c < d; c++) {                                                       \
            const float *restrict kc = kp + (size_t)c * NR, *restrict qc = qp + (size_t)c * MR; \
            _Pragma("GCC unroll 16") for (int r = 0; r < MR; r++) {                         \
                _Pragma("omp simd") for (int x = 0; x < NR; x++)                            \
                    acc[r][x] = MADD(qc[r], kc[x], acc[r][x]);                              \
            }                                                                               \
        }                                                                                   \
        for (int r = 0; r < MR; r++)                                                        \
            for (int x = 0; x < NR; x++) s[(size_t)r * lds + x] = acc[r][x] * scale;        \
    }                                                                                       \
    TARGET static float peak_##SUFFIX(long iters)                                           \
    {                                                                                       \
        float acc[MR][NR], sum = 0.0f;                                                      \
        for (int e = 0; e < MR * NR; e++) acc[e / NR][e % NR] = (float)e;                   \
        for (long it = 0; it < iters; it++)                                                 \
            _Pragma("GCC unroll 16") for (int r = 0; r < MR; r++) {                         \
                _Pragma("omp simd") for (int x = 0; x < NR; x++)                            \
                    acc[r][x] = MADD(acc[r][x], 0.9999999f, 1e-7f);                         \
            }                                                                               \
        for (int e = 0; e < MR * NR; e++) sum += acc[e / NR][e % NR];                       \
        return sum;                                                                         \
    }

DEFINE_MICRO(base, , (2 * W_BASE), MADD_BASE)
#if defined(__x86_64__) && defined(__GNUC__)
#define HAVE_WIDE 1
#ifdef __clang__
#define T512 __attribute__((target("avx512f,fma")))
#else   /* GCC's generic tuning would otherwise split 512-bit vectors in two */
#define T512 __attribute__((target("avx512f,fma,prefer-vector-width=512")))
#endif
DEFINE_MICRO(avx2, __attribute__((target("avx2,fma"))), 16, MADD_FMA)
DEFINE_MICRO(avx512, T512, 32, MADD_FMA)
#endif

typedef struct isa {   /* NR = 2 W: MR x NR is 2 MR = 12 vector registers of accumulators */
    const char *name;
    int nr;
    void (*micro)(int, const float *, const float *, float *, int, float);
    float (*peak)(long);
    double peak_gflops;
} isa;

/* Q: [br][d], K: [bc][d] (row-major, as attention holds them); S: [br][lds]. */
static void s_naive(int br, int bc, int d, const float *Q, const float *K, float *S, int lds, float scale)
{
    for (int i = 0; i < br; i++)
        for (int j = 0; j < bc; j++) {
            float s = 0.0f;
            for (int c = 0; c < d; c++) s += Q[(size_t)i * d + c] * K[(size_t)j * d + c];
            S[(size_t)i * lds + j] = s * scale;
        }
}

/* Step 09's score loop: 4 query rows x 1 key row, dot products vectorized over c. */
static void s_simd4x1(int br, int bc, int d, const float *restrict Q, const float *restrict K,
                      float *restrict S, float scale)
{
    for (int i = 0; i < br; i += 4) {
        const int rows = br - i < 4 ? br - i : 4;   /* the last block may have fewer: repeat row 0 */
        const float *q0 = Q + (size_t)i * d, *q1 = q0 + (rows > 1) * d, *q2 = q0 + (rows > 2) * 2 * d,
                    *q3 = q0 + (rows > 3) * 3 * d;
        for (int j = 0; j < bc; j++) {
            const float *k = K + (size_t)j * d;
            float x0 = 0, x1 = 0, x2 = 0, x3 = 0;
#pragma omp simd reduction(+ : x0, x1, x2, x3)
            for (int c = 0; c < d; c++)
                x0 += q0[c] * k[c], x1 += q1[c] * k[c], x2 += q2[c] * k[c], x3 += q3[c] * k[c];
            const float xs[4] = {x0, x1, x2, x3};
            for (int r = 0; r < rows; r++) S[(size_t)(i + r) * bc + j] = xs[r] * scale;
        }
    }
}

/* Register tile MR x NB on K as it lies in memory (NB = the baseline NR); edge blocks the naive way. */
#define NB (2 * W_BASE)
static void s_regtile(int br, int bc, int d, const float *restrict Q, const float *restrict K,
                      float *restrict S, float scale)
{
    for (int i = 0; i < br; i += MR)
        for (int j = 0; j < bc; j += NB) {
            if (i + MR > br || j + NB > bc) {
                s_naive(br - i < MR ? br - i : MR, bc - j < NB ? bc - j : NB, d, Q + (size_t)i * d, K + (size_t)j * d,
                        S + (size_t)i * bc + j, bc, scale);
                continue;
            }
            float acc[MR][NB] = {{0}};
            for (int c = 0; c < d; c++) {
#pragma GCC unroll 16
                for (int r = 0; r < MR; r++) {
                    const float q = Q[(size_t)(i + r) * d + c];
#pragma omp simd
                    for (int x = 0; x < NB; x++) acc[r][x] = MADD_BASE(q, K[(size_t)(j + x) * d + c], acc[r][x]);
                }
            }
            for (int r = 0; r < MR; r++)
                for (int x = 0; x < NB; x++) S[(size_t)(i + r) * bc + j + x] = acc[r][x] * scale;
        }
}

/* Pack Q_i into [br/MR][d][MR] and K_j^T into [bc/nr][d][nr], zero-padding the last panel. */
static void pack(int br, int bc, int d, int nr, const float *Q, const float *K, float *qp, float *kp)
{
    for (int p = 0; p < (br + MR - 1) / MR; p++)
        for (int c = 0; c < d; c++)
            for (int r = 0; r < MR; r++)
                qp[((size_t)p * d + c) * MR + r] = p * MR + r < br ? Q[(size_t)(p * MR + r) * d + c] : 0.0f;
    for (int p = 0; p < (bc + nr - 1) / nr; p++)
        for (int c = 0; c < d; c++)
            for (int x = 0; x < nr; x++)
                kp[((size_t)p * d + c) * nr + x] = p * nr + x < bc ? K[(size_t)(p * nr + x) * d + c] : 0.0f;
}

/* Packed product: every MR x nr block by the micro-kernel into a padded tile sp, then copied out.
 * pack_too = 0 reuses panels packed earlier, as the library reuses K_j^T for every Q block. */
static void s_packed(const isa *is, int pack_too, int br, int bc, int d, const float *Q, const float *K, float *S,
                     float scale, float *qp, float *kp, float *sp /* [br up to MR][bc up to nr] */)
{
    const int nr = is->nr, ldp = (bc + nr - 1) / nr * nr;
    if (pack_too) pack(br, bc, d, nr, Q, K, qp, kp);
    for (int p = 0; p < (br + MR - 1) / MR; p++)
        for (int t = 0; t < ldp / nr; t++)
            is->micro(d, qp + (size_t)p * d * MR, kp + (size_t)t * d * nr, sp + (size_t)p * MR * ldp + t * nr, ldp,
                      scale);
    for (int i = 0; i < br; i++) memcpy(S + (size_t)i * bc, sp + (size_t)i * ldp, (size_t)bc * sizeof(float));
}

/* One core's multiply-add peak for an ISA: best of 3 runs of >= 0.1 s each. */
static double measure_peak(const isa *is)
{
    double best = 0, t;
    volatile float sink = 0;
    for (int k = 0; k < 3; k++) {
        long iters = 1 << 16;
        while (t = tut_now(), sink += is->peak(iters), (t = tut_now() - t) < 0.1) iters *= t < 0.01 ? 8 : 2;
        best = fmax(best, 2.0 * MR * is->nr * (double)iters / t / 1e9);
    }
    return best;
}

int main(int argc, char **argv)
{
    tut_args a = {.n = {512}, .n_count = 1, .d = 64, .br = 96, .bc = 96, .reps = 3};
    tut_parse_args(argc, argv, &a, "10_register_blocking: one tile S = Q_i K_j^T, from three loops to packed panels");
    if (a.kernel_only || a.sim_kernel) return fprintf(stderr, "10_register_blocking: no simulated kernel\n"), 2;
    const int br = a.br, bc = a.bc, d = a.d;
    const float scale = 1.0f / sqrtf((float)d);
    isa isas[3] = {{W_BASE == 16 ? "avx512 (build)" : W_BASE == 8 ? "avx2 (build)" : "baseline (build)",
                    2 * W_BASE, micro_base, peak_base, 0}};
    int n_isa = 1;
#ifdef HAVE_WIDE
    __builtin_cpu_init();
    if (W_BASE < 8 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        isas[n_isa++] = (isa){"avx2+fma", 16, micro_avx2, peak_avx2, 0};
    if (W_BASE < 16 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma"))
        isas[n_isa++] = (isa){"avx512", 32, micro_avx512, peak_avx512, 0};
#endif
    tut_banner("Step 10: register blocking and packing (one tile S = Q_i K_j^T)", &a, NULL);
    printf("   Tile Br x Bc = %d x %d, d = %d: Q_i, K_j and S take %s, in cache the whole time;\n"
           "   one thread; register tile MR x NR = %d x 2W (W = float lanes of the ISA).\n"
           "   Peak = this core's multiply-add rate for that ISA, measured now (best of 3 x 0.1 s).\n\n",
           br, bc, d, tut_bytes(4.0 * ((double)(br + bc) * d + (double)br * bc)), MR);
    size_t nq = (size_t)br * d, nk = (size_t)bc * d, ns = (size_t)br * bc;
    float *Q = tut_alloc(nq * 4), *K = tut_alloc(nk * 4), *S = tut_alloc(ns * 4);   /* [br][d], [bc][d], [br][bc] */
    double *ref = tut_alloc(ns * 8), *bound = tut_alloc(ns * 8);                   /* [br][bc] each */
    float *qp = tut_alloc(((size_t)br + MR) * d * 4), *kp = tut_alloc(((size_t)bc + 32) * d * 4);
    float *sp = tut_alloc(((size_t)br + MR) * ((size_t)bc + 32) * 4);
    tut_fill(Q, nq, 11, -2, 2);
    tut_fill(K, nk, 22, -2, 2);
    const double u = ldexp(1.0, -24), gamma = (d + 1) * u / (1 - (d + 1) * u);
    for (int i = 0; i < br; i++)
        for (int j = 0; j < bc; j++) {
            double s = 0, sa = 0, p;
            for (int c = 0; c < d; c++) p = (double)Q[(size_t)i * d + c] * K[(size_t)j * d + c], s += p, sa += fabs(p);
            ref[(size_t)i * bc + j] = s * scale;
            bound[(size_t)i * bc + j] = gamma * sa * scale + 1e-30;
        }
    for (int k = 0; k < n_isa; k++) isas[k].peak_gflops = measure_peak(&isas[k]);
    FILE *dat = tut_dat_open(&a, "10", "variant isa br bc d time_ms gflops peak_gflops peak_fraction err_over_bound");
    printf("   %-26s %-16s | %9s | %8s | %7s | %8s | %6s | %9s\n", "variant", "isa", "tile us", "GFLOP/s", "peak",
           "of peak", "vs 09", "err/bound");
    const double flops = 2.0 * br * bc * d;
    double g09 = 0, g_pk = 0, g_best = 0, pk_frac = 0, t_packing = 0;
    const int nv = 5 + (n_isa - 1);   /* naive, 4x1, register tile, packed + packing, packed per ISA */
    for (int v = 0; v < nv; v++) {
        const isa *is = &isas[v < 5 ? 0 : v - 4];
        static const char *const names[] = {"naive (3 loops)", "simd 4x1 (step 09)", "register tile, K as is",
                                            "packed, packing each time", "packed, panels reused"};
        const char *name = names[v < 4 ? v : 4];
        memset(S, 0, ns * 4);
        if (v >= 4) pack(br, bc, d, is->nr, Q, K, qp, kp);   /* reused panels: packed once, untimed */
        double t, tt[64];
        int inner = 1, reps = a.reps < 64 ? a.reps : 64;
        for (int rep = -1; rep < reps; rep++) {   /* rep -1: find how many products take >= 20 ms */
            double t0 = tut_now();
            for (int x = 0; x < inner; x++) {
                if (v == 0) s_naive(br, bc, d, Q, K, S, bc, scale);
                else if (v == 1) s_simd4x1(br, bc, d, Q, K, S, scale);
                else if (v == 2) s_regtile(br, bc, d, Q, K, S, scale);
                else s_packed(is, v == 3, br, bc, d, Q, K, S, scale, qp, kp, sp);
            }
            t = (tut_now() - t0) / inner;
            if (rep < 0) inner = (int)(0.02 / t) + 1;
            else tt[rep] = t;
        }
        qsort(tt, (size_t)reps, sizeof tt[0], tut_cmp_double);
        t = tt[reps / 2];
        double worst = 0, r;   /* max |S - ref| / bound; a NaN becomes the error */
        for (size_t e = 0; e < ns; e++) worst = (r = fabs((double)S[e] - ref[e]) / bound[e]) <= worst ? worst : r;
        tut_require(worst, 1.0, name);
        const double g = flops / t / 1e9;
        if (v == 1) g09 = g;
        if (v == 3) t_packing = t;
        if (v == 4) { g_pk = g; pk_frac = g / is->peak_gflops; t_packing -= t; }
        if (g > g_best) g_best = g;
        char ratio[16] = "-";
        if (v >= 1) snprintf(ratio, sizeof ratio, "%.1fx", g / g09);
        printf("   %-26s %-16s | %9.2f | %8.2f | %7.1f | %7.0f%% | %6s | %9.2f\n", name, is->name, t * 1e6, g,
               is->peak_gflops, 100.0 * g / is->peak_gflops, ratio, worst);
        fprintf(dat, "\"%s\" \"%s\" %d %d %d %g %g %g %g %g\n", name, is->name, br, bc, d, t * 1e3, g,
                is->peak_gflops, g / is->peak_gflops, worst);
    }
    fclose(dat);
    fa_cpu_info ci = {0};
    fa_get_cpu_info(&ci);
    printf("\n   Register tile + packed panels: %.1fx over step 09's loop at the same vector width\n"
           "   (%.0f%% of that ISA's peak); packing Q_i and K_j^T for this one product costs %.1f us\n"
           "   more. The widest ISA here: %.1fx over step 09. (Over 100%% of peak: the machine was\n"
           "   busier while the peak was measured; rerun.) The library (ISA %s) runs this product\n"
           "   as its qk micro-kernel, packs Q_i once per task and K_j^T once per kv head for every\n"
           "   Q block, and does P V_j and the exponentials the same way.\n"
           "   Try: --d 128, --br 24 --bc 24 (step 09's blocks: edges and packing weigh more),\n"
           "   `make tutorials TUT_CFLAGS=-march=native` (the build itself gets the wide ISA).\n"
           "   Next: 11 spreads the query blocks over threads.\n",
           g_pk / g09, 100.0 * pk_frac, t_packing * 1e6, g_best / g09, ci.isa);
    free(Q); free(K); free(S); free(ref); free(bound); free(qp); free(kp); free(sp);
    return 0;
}
