/*
 * dispatch.c — the one place that chooses a kernel table.
 *
 * Order of preference: avx512 > avx2 > scalar on x86-64 (CPUID, including the
 * OS's XSAVE support, via the compiler's __builtin_cpu_supports), neon >
 * scalar on AArch64 (every AArch64 CPU has Advanced SIMD; HWCAP confirms).
 * FA_ISA=scalar|avx2|avx512|neon forces a choice; forcing one this build or
 * this CPU lacks is an error (FA_ERR_ISA), never a silent fallback.
 * The choice is made once and cached. Nothing here prints: errors are
 * values with a message (fa_fail), for the caller to report.
 *
 * Also here, because it is the one file that knows every ISA's name: the
 * FMA peak loop by ISA name (fma_peak.h) and fa_measure_fma_peak(), the
 * public, timed version of it that benchmarks report their fraction of.
 */
#include "kernels.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "fma_peak.h"
#include "status.h"

#ifdef _OPENMP
#include <omp.h>
#endif
#include <time.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMD
#define HWCAP_ASIMD (1 << 1)
#endif
#endif

static int cpu_has(const char *isa)
{
    if (strcmp(isa, "scalar") == 0) return 1;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (strcmp(isa, "avx2") == 0) {
        /* the avx2 table's widen uses F16C: every AVX2+FMA CPU shipped has it, but a
         * virtual machine may hide it (CPUID leaf 1, ECX bit 29; clang 14's
         * __builtin_cpu_supports does not know "f16c") */
        unsigned a, b, c, d;
        const int f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
        return f16c && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    }
    if (strcmp(isa, "avx512") == 0)
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
               __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq");
#endif
#if defined(__aarch64__)
    if (strcmp(isa, "neon") == 0) {
#if defined(__linux__)
        return (getauxval(AT_HWCAP) & HWCAP_ASIMD) != 0;
#else
        return 1;
#endif
    }
#endif
    return 0;
}

static const fa_kernels *compiled(const char *name)
{
    if (strcmp(name, "scalar") == 0) return &fa_kernels_scalar;
#if defined(FA_HAVE_AVX2)
    if (strcmp(name, "avx2") == 0) return &fa_kernels_avx2;
#endif
#if defined(FA_HAVE_AVX512)
    if (strcmp(name, "avx512") == 0) return &fa_kernels_avx512;
#endif
#if defined(FA_HAVE_NEON)
    if (strcmp(name, "neon") == 0) return &fa_kernels_neon;
#endif
    return NULL;
}

const fa_kernels *fa_kernels_by_name(const char *name)
{
    const fa_kernels *k = compiled(name);
    return (k && cpu_has(name)) ? k : NULL;
}

const fa_kernels *fa_kernels_get(fa_status *status)
{
    /* Every thread that races here computes the same answer; the atomic makes
     * the race well-defined in C11. */
    static _Atomic(const fa_kernels *) chosen;
    *status = FA_OK;
    const fa_kernels *done = atomic_load_explicit(&chosen, memory_order_acquire);
    if (done) return done;
    const char *forced = getenv("FA_ISA");
    if (forced && *forced) {
        if (strcmp(forced, "scalar") && strcmp(forced, "avx2") && strcmp(forced, "avx512") &&
            strcmp(forced, "neon")) {
            *status = fa_fail(FA_ERR_ISA, "FA_ISA=%s: unknown ISA (expected scalar, avx2, avx512 or neon)", forced);
            return NULL;
        }
        if (!compiled(forced)) {
            *status = fa_fail(FA_ERR_ISA, "FA_ISA=%s: this build has no %s kernels", forced, forced);
            return NULL;
        }
        if (!cpu_has(forced)) {
            *status = fa_fail(FA_ERR_ISA, "FA_ISA=%s: this CPU does not support %s", forced, forced);
            return NULL;
        }
        atomic_store_explicit(&chosen, compiled(forced), memory_order_release);
        return compiled(forced);
    }
    static const char *const order[] = {"avx512", "avx2", "neon", "scalar"};
    for (size_t i = 0; i < sizeof order / sizeof order[0]; i++) {
        const fa_kernels *k = fa_kernels_by_name(order[i]);
        if (k) {
            atomic_store_explicit(&chosen, k, memory_order_release);
            return k;
        }
    }
    atomic_store_explicit(&chosen, &fa_kernels_scalar, memory_order_release);
    return &fa_kernels_scalar;
}

/* 16 independent scalar chains: what the compiler makes of plain C (SSE2). */
double fa_fma_loop_scalar(long iters, float *sink)
{
    float acc[16];
    for (int k = 0; k < 16; k++) acc[k] = (float)k;
    for (long it = 0; it < iters; it++)
        for (int k = 0; k < 16; k++) acc[k] = acc[k] * 0.999999f + 1e-7f;
    float t = 0.0f;
    for (int k = 0; k < 16; k++) t += acc[k];
    *sink = t;
    return (double)iters * 16 * 2;
}

/* Whether a benchmark loop (fma_peak.h) may run: an ISA this CPU and build run, iters >= 0. */
static int loop_may_run(const char *isa, long iters) { return isa && fa_kernels_by_name(isa) && iters >= 0; }

double fa_fma_peak_loop(const char *isa, long iters, float *sink)
{
    if (!loop_may_run(isa, iters)) return 0.0;
    if (strcmp(isa, "scalar") == 0) return fa_fma_loop_scalar(iters, sink);
#if defined(FA_HAVE_AVX2)
    if (strcmp(isa, "avx2") == 0) return fa_fma_loop_avx2(iters, sink);
#endif
#if defined(FA_HAVE_AVX512)
    if (strcmp(isa, "avx512") == 0) return fa_fma_loop_avx512(iters, sink);
#endif
#if defined(FA_HAVE_NEON)
    if (strcmp(isa, "neon") == 0) return fa_fma_loop_neon(iters, sink);
#endif
    return 0.0;
}

double fa_fma_fed_loop(const char *isa, long iters, float *sink)
{
    if (!loop_may_run(isa, iters)) return 0.0;
#if defined(FA_HAVE_AVX2)
    if (strcmp(isa, "avx2") == 0) return fa_fma_fed_loop_avx2(iters, sink);
#endif
#if defined(FA_HAVE_AVX512)
    if (strcmp(isa, "avx512") == 0) return fa_fma_fed_loop_avx512(iters, sink);
#endif
    (void)iters;
    (void)sink;
    return 0.0;
}

int fa_isa_supported(const char *isa) { return isa && fa_kernels_by_name(isa) != NULL; }

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

fa_status fa_measure_fma_peak(const char *isa, int threads, double seconds, double *gflops)
{
    if (!isa || !gflops) return fa_fail(FA_ERR_NULL_ARG, "fa_measure_fma_peak: null argument");
    *gflops = 0.0;
    if (!fa_kernels_by_name(isa))
        return fa_fail(FA_ERR_ISA, "fa_measure_fma_peak: ISA '%s' is unknown, not built, or not supported by this CPU", isa);
    if (threads < 0 || threads > FA_MAX_THREADS || !(seconds >= 0.0) || seconds > 60.0)
        return fa_fail(FA_ERR_OPTION, "fa_measure_fma_peak: threads must be in [0, %d] and seconds in 0..60",
                       FA_MAX_THREADS);
#ifdef _OPENMP
    if (threads == 0) threads = omp_get_max_threads() > FA_MAX_THREADS ? FA_MAX_THREADS : omp_get_max_threads();
#else
    threads = 1;
#endif
    if (seconds < 0.05) seconds = 0.05;
    /* Calibrate: grow the iteration count until one run takes >= 1/8 of the
     * budget, so a run is long against timer resolution, frequency ramp-up and
     * thread start-up; then keep the best of 3 full-length runs. */
    long iters = 1L << 16;
    float sink = 0.0f;
    for (;;) {
        const double t0 = now_seconds();
        fa_fma_peak_loop(isa, iters, &sink);
        const double t = now_seconds() - t0;
        if (t >= seconds / 8 || iters > (1L << 40)) {
            if (t > 0) iters = (long)((double)iters * (seconds / 3) / t) + 1;
            break;
        }
        iters *= 2;
    }
    double best = 0.0;
    for (int rep = 0; rep < 3; rep++) {
        double flops = 0.0;
        const double t0 = now_seconds();
#ifdef _OPENMP
#pragma omp parallel num_threads(threads) reduction(+ : flops)
#endif
        {
            float local = 0.0f;
            flops += fa_fma_peak_loop(isa, iters, &local);
            if (local == 12345.0f) flops += 0.0; /* keeps the work (the loop also writes it) */
        }
        const double t = now_seconds() - t0;
        if (t > 0 && flops / t / 1e9 > best) best = flops / t / 1e9;
    }
    *gflops = best;
    (void)sink;
    return FA_OK;
}
