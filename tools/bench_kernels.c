/*
 * bench_kernels.c — single-thread micro-benchmark of the flash micro-kernels.
 *
 * For every ISA compiled in and supported by this CPU: the FMA peak loop
 * (fma_peak.h; each run calibrated to >= 0.2 s of thread CPU time, so turbo
 * ramp-up and timer resolution cannot inflate or deflate it — a 30 ms loop
 * once reported qk at 143% "of peak" on a Zen 3), printed beside the
 * theoretical peak (lanes x 2 flops x FMA pipes x the CPU's maximum clock,
 * when the kernel exposes it), then qk (S = Q Kt), pv (O = aO + PV), pv_t (pv
 * reading P transposed) and softmax on tiles that fit in L2, the way src/flash.c
 * calls them. Each figure is the median of REPS timed runs (each run long
 * enough, ~20 ms, to swamp timer noise),
 * with the worst and best. On a shared machine the median drops whenever a
 * neighbour runs on the same core; the best run is the capability of the
 * kernel, and "best/pk" is its fraction of the best FMA-peak run.
 * Time is this thread's CPU time (CLOCK_THREAD_CPUTIME_ID), not wall time:
 * on a machine whose 2 cores are shared with other work, time spent
 * descheduled is not charged to the kernel (cache pollution still is).
 *
 * Any kernel figure above 100% of the measured peak is flagged: it means the
 * peak is wrong (clock changed between the runs, or the loop is not the
 * machine's ceiling), not that the kernel beat the hardware.
 *
 *   usage: bench_kernels [ISA ...]       (default: all available)
 *   FLOPs: qk 2*br*bc*d, pv 2*br*bc*dv (+ the br*dv rescale, not counted);
 *          softmax and the softcap line (cap 30, row by row: "cap") are reported as ns
 *          per score element.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/fma_peak.h" /* a tool of the kernel layer: it benchmarks the tables directly */
#include "kernels/kernels.h"

#define REPS 9

/* The CPU's maximum clock in GHz (cpufreq), else the clock /proc/cpuinfo reports
 * (*what says which), or 0 when unknown. */
static double max_ghz(const char **what)
{
    FILE *f = fopen("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq", "r");
    double khz = 0.0;
    if (f) {
        if (fscanf(f, "%lf", &khz) != 1) khz = 0.0;
        fclose(f);
    }
    *what = "max clock";
    if (khz > 0.0) return khz / 1e6;
    f = fopen("/proc/cpuinfo", "r");
    double mhz = 0.0;
    if (f) {
        char line[256];
        while (fgets(line, sizeof line, f))
            if (strncmp(line, "cpu MHz", 7) == 0 && sscanf(strchr(line, ':') + 1, "%lf", &mhz) == 1) break;
        fclose(f);
    }
    *what = "clock in /proc/cpuinfo; turbo may exceed it";
    return mhz / 1e3;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static float *alloc_fill(size_t n, unsigned *seed, float lo, float hi)
{
    float *p = aligned_alloc(64, ((n * sizeof(float) + 63) / 64) * 64);
    if (!p) { fprintf(stderr, "bench_kernels: out of memory\n"); exit(1); }
    for (size_t i = 0; i < n; i++) {
        *seed = *seed * 1664525u + 1013904223u;
        p[i] = lo + (hi - lo) * (float)(*seed >> 8) / 16777216.0f;
    }
    return p;
}

enum { QK, PV, PV_T, SOFTMAX, TRANSFORM };

/* Leading dimensions as src/flash.c sets them (fa_ld_spread, kernels.h); FA_BK_PLAIN=1
 * keeps plain round-up-to-16, the rule before. */
static int ld_of(int x)
{
    const char *plain = getenv("FA_BK_PLAIN");
    if (plain && *plain == '1') return (x + 15) / 16 * 16;
    return (int)fa_ld_spread((size_t)x);
}

/* Seconds per call: median (and min, max) over REPS runs of `inner` calls. */
static void time_kernel(const fa_kernels *k, int which, int br, int bc, int d, float *q,
                        float *kt, float *s, float *v, float *o, float *m, float *l, float *al,
                        double *med, double *mn, double *mx)
{
    const int ldk = ld_of(bc), lds = ldk, ldv = ld_of(d);
    double t[REPS];
    long inner = 1;
    for (int rep = -2; rep < REPS; rep++) { /* two warm-ups, which also size `inner` */
        double t0 = now();
        for (long it = 0; it < inner; it++) {
            switch (which) {
            case QK: k->qk(br, bc, d, q, (size_t)d, kt, (size_t)ldk, 0.125f, s, (size_t)lds); break;
            case PV: k->pv(br, bc, d, s, (size_t)lds, v, (size_t)ldv, al, o, (size_t)d); break;
            /* P transposed, [bc][ld_of(br)], as the backward's single pass reads its tiles */
            case PV_T: k->pv_t(br, bc, d, s, (size_t)ld_of(br), v, (size_t)ldv, al, o, (size_t)d); break;
            case SOFTMAX:
                for (int i = 0; i < br; i++) m[i] = 40.0f, l[i] = 1.0f;
                k->softmax(br, bc, s, (size_t)lds, m, l, al);
                break;
            default: /* the softcap line, cap 30, row by row as fa_transform_tile calls it */
                for (int i = 0; i < br; i++)
                    k->transform(bc, 0, bc, s + (size_t)i * lds, 30.0f, 1.0f / 30.0f, 0.0, 0, 1, NULL);
                break;
            }
        }
        double dt = now() - t0;
        if (rep < 0) {
            if (dt < 0.02) inner = (long)(inner * 0.02 / (dt > 1e-7 ? dt : 1e-7)) + 1;
            continue;
        }
        t[rep] = dt / (double)inner;
    }
    qsort(t, REPS, sizeof t[0], cmp_double);
    *med = t[REPS / 2];
    *mn = t[0];
    *mx = t[REPS - 1];
}

/*
 * In context: the driver's sequence for one query block against a stream of
 * key tiles — copy K_j^T and V_j into the packed buffers (as the driver's
 * packing does, from a source too big for L2), then qk, softmax, pv — with
 * each kernel's thread CPU time summed over the stream. Kernels that shine
 * on a warm isolated tile can lose here to cache misses on freshly packed
 * data; this is the figure the flash forward actually gets.
 */
static void bench_chain(const fa_kernels *k, int br, int bc, int d, int ntiles)
{
    const int ldk = ld_of(bc), ldv = ld_of(d);
    unsigned seed = 777;
    const size_t kt_n = (size_t)d * ldk, v_n = (size_t)bc * ldv;
    float *q = alloc_fill((size_t)br * d, &seed, -0.2f, 0.2f);
    float *kt_src = alloc_fill(kt_n * ntiles, &seed, -1, 1);
    float *v_src = alloc_fill(v_n * ntiles, &seed, -1, 1);
    float *kt = alloc_fill(kt_n, &seed, 0, 1), *v = alloc_fill(v_n, &seed, 0, 1);
    float *s = alloc_fill((size_t)br * ldk, &seed, 0, 1), *o = alloc_fill((size_t)br * d, &seed, 0, 0);
    float *m = alloc_fill((size_t)br, &seed, 0, 1), *l = alloc_fill((size_t)br, &seed, 0, 1);
    float *al = alloc_fill((size_t)br, &seed, 0, 1);
    double tq[REPS], ts[REPS], tp[REPS];
    for (int rep = -1; rep < REPS; rep++) {
        double sq = 0, ss = 0, sp = 0;
        for (int i = 0; i < br; i++) m[i] = -INFINITY, l[i] = 0.0f;
        for (int t = 0; t < ntiles; t++) {
            memcpy(kt, kt_src + kt_n * t, kt_n * sizeof(float));
            memcpy(v, v_src + v_n * t, v_n * sizeof(float));
            double t0 = now();
            k->qk(br, bc, d, q, (size_t)d, kt, (size_t)ldk, 0.125f, s, (size_t)ldk);
            double t1 = now();
            k->softmax(br, bc, s, (size_t)ldk, m, l, al);
            double t2 = now();
            k->pv(br, bc, d, s, (size_t)ldk, v, (size_t)ldv, al, o, (size_t)d);
            double t3 = now();
            sq += t1 - t0, ss += t2 - t1, sp += t3 - t2;
        }
        if (rep >= 0) tq[rep] = sq, ts[rep] = ss, tp[rep] = sp;
    }
    qsort(tq, REPS, sizeof(double), cmp_double);
    qsort(ts, REPS, sizeof(double), cmp_double);
    qsort(tp, REPS, sizeof(double), cmp_double);
    const double flops = 2.0 * br * bc * d * ntiles;
    const double qk = flops / tq[REPS / 2] / 1e9, pv = flops / tp[REPS / 2] / 1e9;
    const double tot = 2 * flops / (tq[REPS / 2] + ts[REPS / 2] + tp[REPS / 2]) / 1e9;
    printf("%-7s chain    %4d %4d %4d  qk %6.1f  pv %6.1f GFLOP/s  softmax %.3f ns/score  "
           "qk+sm+pv %6.1f GFLOP/s (median of %d, %d tiles)\n",
           k->name, br, bc, d, qk, pv, 1e9 * ts[REPS / 2] / ((double)br * bc * ntiles), tot, REPS, ntiles);
    free(q); free(kt_src); free(v_src); free(kt); free(v); free(s); free(o); free(m); free(l); free(al);
}

/* REPS runs of an FMA loop (fma_peak.h), each calibrated to >= 0.2 s of CPU time, into
 * gf[] as GFLOP/s; returns the rounds per run, or 0 when the loop does not exist here. */
static long loop_runs(double (*loop)(const char *, long, float *), const char *isa, double gf[REPS])
{
    float sink;
    long iters = 1L << 16;
    for (;;) {
        double t0 = now();
        if (loop(isa, iters, &sink) == 0.0) return 0;
        const double dt = now() - t0;
        if (dt >= 0.2 || iters > (1L << 40)) break;
        iters = dt > 0.01 ? (long)((double)iters * 0.22 / dt) + 1 : iters * 8;
    }
    for (int rep = 0; rep < REPS; rep++) {
        double t0 = now();
        double fl = loop(isa, iters, &sink);
        gf[rep] = fl / (now() - t0) / 1e9;
    }
    return iters;
}

/* One ISA this CPU and build run (main checks the names first). */
static void bench_isa(const char *isa)
{
    const fa_kernels *k = fa_kernels_by_name(isa);
    double pk[REPS], fed[REPS];
    const long iters = loop_runs(fa_fma_peak_loop, isa, pk);
    qsort(pk, REPS, sizeof pk[0], cmp_double);
    const double peak_best = pk[REPS - 1];
    printf("%-7s FMA peak loop: median %.1f GFLOP/s, worst %.1f, best %.1f (%d runs of %.2g FMA rounds); row_block=%d\n",
           isa, pk[REPS / 2], pk[0], peak_best, REPS, (double)iters, k->row_block);
    /* the same FMAs fed as qk's register block feeds them (fma_peak.h) */
    double fed_best = 0.0;
    if (loop_runs(fa_fma_fed_loop, isa, fed) > 0) {
        qsort(fed, REPS, sizeof fed[0], cmp_double);
        fed_best = fed[REPS - 1];
        printf("%-7s FMA fed loop (qk's register block, operands in L1, no addressing): median %.1f GFLOP/s, "
               "best %.1f = %.0f%% of the peak loop's best: what the kernels' instruction mix reaches here%s\n",
               isa, fed[REPS / 2], fed_best, 100.0 * fed_best / peak_best,
               fed_best > peak_best ? "  ** above the peak loop: one of the two was disturbed **" : "");
    }
    const char *clock_src;
    const double ghz = max_ghz(&clock_src);
    if (ghz > 0.0) {
        /* scalar: the compiler's SSE code, 4 lanes; 2 FMA pipes (Haswell+, Zen 2+; some
         * AVX-512 parts have one 512-bit FMA unit: then half of this) */
        const int lanes = strcmp(isa, "scalar") == 0 ? 4 : k->simd_width;
        const double theory = lanes * 2.0 * 2.0 * ghz;
        printf("%-7s theoretical peak: %d lanes x 2 flops x 2 FMA pipes x %.2f GHz (%s) = %.1f GFLOP/s;"
               " measured best = %.0f%% of it%s\n", isa, lanes, ghz, clock_src, theory, 100.0 * peak_best / theory,
               peak_best > theory ? "  ** above theory: clock above the one assumed **" : "");
    } else {
        printf("%-7s theoretical peak: unknown (no cpufreq maximum clock on this machine)\n", isa);
    }

    /* (br, bc, d): the paper's tiles for d = 64 and 128 on a 1 MiB L2
     * (Bc = M/4d = 512, Br = d), smaller ones, and the driver's square
     * tiles (256 at d = 64 and 128 on 1-2 MiB L2s since the rule's cap; the
     * 320 at d = 64 of a 1 MiB L2 before it), and the backward's 128 x 128
     * (no chain row); Br is rounded down to row_block as the driver does.
     * The last column: 1 = also time the qk -> softmax -> pv chain. */
    static const int shapes[][4] = {{64, 256, 64, 0},   {128, 256, 128, 0}, {64, 512, 64, 1},
                                    {128, 512, 128, 1}, {320, 320, 64, 1},  {256, 256, 128, 1},
                                    {256, 256, 64, 1},  {128, 128, 128, 0}};
    unsigned seed = 12345;
    printf("%-7s %-8s %4s %4s %4s %9s %9s %9s %7s %8s\n", isa, "kernel", "br", "bc", "d", "median",
           "worst", "best", "best/pk", "best/fed");
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int br = shapes[si][0] - shapes[si][0] % k->row_block, bc = shapes[si][1],
                  d = shapes[si][2], ldk = ld_of(bc);
        float *q = alloc_fill((size_t)br * d, &seed, -1, 1);
        float *kt = alloc_fill((size_t)d * ldk, &seed, -1, 1);
        const size_t sn = (size_t)br * ldk > (size_t)bc * ld_of(br) ? (size_t)br * ldk : (size_t)bc * ld_of(br);
        float *s = alloc_fill(sn, &seed, 0, 1); /* S, P, or P transposed for pv_t */
        float *v = alloc_fill((size_t)bc * (size_t)ld_of(d), &seed, -1, 1);
        float *o = alloc_fill((size_t)br * d, &seed, -1, 1);
        float *m = alloc_fill((size_t)br, &seed, 0, 1);
        float *l = alloc_fill((size_t)br, &seed, 0, 1);
        float *al = alloc_fill((size_t)br, &seed, 0.99f, 1.0f);
        double med, mn, mx;
        const double flops = 2.0 * br * bc * d;
        for (int which = QK; which <= PV_T; which++) {
            if (which == PV_T && !k->pv_t) continue;
            if (which != QK)
                for (size_t x = 0; x < sn; x++) s[x] = 0.001f * (float)(x % 997);
            time_kernel(k, which, br, bc, d, q, kt, s, v, o, m, l, al, &med, &mn, &mx);
            const double frac = 100 * flops / mn / 1e9 / peak_best;
            char fedcol[16] = "       -";
            const double ffrac = fed_best > 0.0 ? 100 * flops / mn / 1e9 / fed_best : 0.0;
            if (fed_best > 0.0) snprintf(fedcol, sizeof fedcol, "%7.0f%%", ffrac);
            printf("%-7s %-8s %4d %4d %4d %9.1f %9.1f %9.1f %6.0f%% %s%s%s\n", isa,
                   which == QK ? "qk" : which == PV ? "pv" : "pv_t",
                   br, bc, d, flops / med / 1e9, flops / mx / 1e9, flops / mn / 1e9, frac, fedcol,
                   frac > 100.0 ? "  ** above the measured peak: the peak figure is wrong **" : "",
                   ffrac > 100.0 ? "  (above the fed loop: that loop is a reference, not a bound)" : "");
        }
        time_kernel(k, SOFTMAX, br, bc, d, q, kt, s, v, o, m, l, al, &med, &mn, &mx);
        printf("%-7s %-8s %4d %4d %4s %9.3f %9.3f %9.3f  ns/score\n", isa, "softmax", br, bc, "-",
               1e9 * med / ((double)br * bc), 1e9 * mx / ((double)br * bc), 1e9 * mn / ((double)br * bc));
        time_kernel(k, TRANSFORM, br, bc, d, q, kt, s, v, o, m, l, al, &med, &mn, &mx);
        printf("%-7s %-8s %4d %4d %4s %9.3f %9.3f %9.3f  ns/score (softcap 30)\n", isa, "cap", br, bc, "-",
               1e9 * med / ((double)br * bc), 1e9 * mx / ((double)br * bc), 1e9 * mn / ((double)br * bc));
        free(q); free(kt); free(s); free(v); free(o); free(m); free(l); free(al);
    }
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        if (shapes[si][3]) /* the driver-sized tiles */
            bench_chain(k, shapes[si][0] - shapes[si][0] % k->row_block, shapes[si][1], shapes[si][2], 16);
}

int main(int argc, char **argv)
{
    static const char *const all[] = {"avx512", "avx2", "neon", "scalar"};
    for (int a = 1; a < argc; a++)
        if (!fa_kernels_by_name(argv[a])) {
            fprintf(stderr, "bench_kernels: %s: not an ISA this CPU and build run (usage: bench_kernels "
                            "[avx512|avx2|neon|scalar ...])\n", argv[a]);
            return 2;
        }
    printf("bench_kernels: single thread, tiles L2-resident, median of %d runs\n", REPS);
    if (argc > 1)
        for (int a = 1; a < argc; a++) bench_isa(argv[a]);
    else
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            if (fa_kernels_by_name(all[i])) bench_isa(all[i]);
    return 0;
}
