/*
 * common.h — what every tutorial step shares, so each step's .c file can be
 * only its kernel and its narration.
 *
 *   1. Arguments: the same flags in every step (--n, --d, --br, --bc, ...).
 *   2. Buffers: page-aligned, zeroed, counted (the "memory" column).
 *   3. The probe: LD/ST, through which every array access of a kernel goes,
 *      so that the cache simulator sees exactly the stream the code performs.
 *   4. The reference: fa_forward(FA_IMPL_REFERENCE), float64 accumulation.
 *   5. Hardware counters through perf events, where the machine has them.
 *   6. Timing (median of repeats) and the data file each step writes for gnuplot.
 *
 * Why page-aligned buffers: the L1 set of an address depends on its low 12
 * bits (64 sets x 64-byte lines = 4 KiB). Aligning every buffer to 4 KiB makes
 * the simulator's run and valgrind's run of the same step put every array
 * element in the same set, although malloc returns different addresses in the
 * two processes; conflict misses then agree too.
 *
 * Everything here is `static` so a step is one translation unit plus
 * cachesim.c and libflashattn.
 */
#ifndef TUT_COMMON_H
#define TUT_COMMON_H

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#ifdef __linux__
#include <linux/perf_event.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#endif

#include "flashattn.h"
#include "cachesim.h"

/* ======================================================================== */
/* 1. The probe                                                              */
/* ======================================================================== */

/*
 * Each kernel is written once, as an always-inline body taking `cachesim *cs`,
 * and instantiated twice by two small wrappers:
 *
 *   kernel(...)        calls the body with cs = NULL: the compiler deletes
 *                      every probe, so this is the code we time (and the
 *                      function `make cachegrind` measures);
 *   kernel_probed(...) calls it with a simulator: every LD/ST first tells the
 *                      simulator which bytes it touches, then does the access.
 *
 * So the simulated stream is the kernel's own stream, not a model of it.
 */
#define TUT_BODY static inline __attribute__((always_inline))
#if defined(__clang__)
/* The probed copy of a `#pragma omp simd` loop calls the simulator, so it cannot
 * vectorize; clang would warn about each. Expected: only the plain copy is timed. */
#pragma clang diagnostic ignored "-Wpass-failed"
#endif
#define TUT_NOINLINE __attribute__((noinline))

/* Load *p, telling the simulator first. */
#define LD(cs, p) (((cs) ? cachesim_access((cs), (p), sizeof *(p), 0) : (void)0), *(p))
/* Store v to *p, then tell the simulator (after v's own loads, in program order).
 * Write-allocate: a store that misses loads the line, like a load does. */
#define ST(cs, p, v) ((void)(*(p) = (v)), (cs) ? cachesim_access((cs), (p), sizeof *(p), 1) : (void)0)

/* ======================================================================== */
/* 2. Arguments                                                              */
/* ======================================================================== */

#define TUT_MAX_LIST 16

typedef struct tut_args {
    int n[TUT_MAX_LIST];      /* --n 128,256,512: sequence lengths (seqlen_q = seqlen_k = N) */
    int n_count;
    int d;                    /* --d: head dimension */
    int br, bc;               /* --br, --bc: row / column block sizes (0 = step's choice) */
    size_t m[TUT_MAX_LIST];   /* --M 16K,32K: fast-memory sizes to sweep (step 12) */
    int m_count;
    int causal;               /* --causal */
    int threads;              /* --threads: 0 = OpenMP default */
    int reps;                 /* --reps: timed repetitions (median reported) */
    const char *geometry;     /* --geometry detected|teaching|L1SIZE,WAYS,LINE:L2SIZE,WAYS,LINE */
    cachesim_config geo;      /* the parsed geometry */
    const char *out;          /* --out DIR: where data files go (default build/tutorials) */
    int kernel_only;          /* --kernel-only: run the unprobed kernel once at n[0] (for valgrind) */
    int sim_kernel;           /* --sim-kernel: run the probed kernel once at n[0], print sim counts */
    const char *vg_kernel;    /* the function `make cachegrind` measures (set by the step) */
    int print_vg;             /* --valgrind-geometry: print --D1=.. --LL=.. and exit */
    int no_sim;               /* --no-sim: skip the simulator (faster) */
    int n_given;              /* 1 if --n was on the command line */
    int big;                  /* --big N: one extra run at N (steps 05-07); -1 = not given */
} tut_args;

static inline int tut_parse_list(const char *s, size_t *vals, int max)
{
    int count = 0;
    while (*s && count < max) {
        char *end;
        double v = strtod(s, &end);
        if (end == s) return -1;
        if (*end == 'K' || *end == 'k') { v *= 1024; end++; }
        else if (*end == 'M' || *end == 'm') { v *= 1024 * 1024; end++; }
        /* whole numbers from 1 to 2^30 once K / M are applied (1.25M is 1310720): 0.5, 3e9 or
         * 1e300 are refused, not rounded or wrapped */
        if (!(v >= 1.0) || v != floor(v) || v > (double)(1 << 30)) return -1;
        vals[count++] = (size_t)v;
        if (*end == ',') end++;
        else if (*end) return -1;
        s = end;
    }
    return count;
}

/* Detected geometry: sizes from fa_get_cpu_info(), ways from sysconf when it knows. */
static inline cachesim_config tut_detected_geometry(void)
{
    fa_cpu_info ci;
    cachesim_config c = cachesim_config_teaching();
    if (fa_get_cpu_info(&ci) != FA_OK || !ci.l1d_bytes) return c;   /* teaching fallback */
    int line = ci.line_bytes ? (int)ci.line_bytes : 64;
    long w1 = 8, w2 = 16;
#ifdef _SC_LEVEL1_DCACHE_ASSOC
    if (sysconf(_SC_LEVEL1_DCACHE_ASSOC) > 0) w1 = sysconf(_SC_LEVEL1_DCACHE_ASSOC);
    if (sysconf(_SC_LEVEL2_CACHE_ASSOC) > 0) w2 = sysconf(_SC_LEVEL2_CACHE_ASSOC);
#endif
    c.l1 = (cachesim_level){ci.l1d_bytes, (int)w1, line};
    c.l2 = (cachesim_level){ci.l2_bytes, (int)w2, line};
    /* Sets must be a power of two (for us and for cachegrind): lower the ways until they are. */
    cachesim_level *lv[2] = {&c.l1, &c.l2};
    for (int i = 0; i < 2; i++) {
        cachesim_level *g = lv[i];
        for (;;) {
            size_t per_set = (size_t)g->ways * (size_t)g->line_bytes, sets = g->size_bytes / per_set;
            if (g->ways == 1 || (g->size_bytes % per_set == 0 && (sets & (sets - 1)) == 0)) break;
            g->ways--;
        }
    }
    const char *err;
    if (cachesim_config_check(&c, &err)) return cachesim_config_teaching();
    snprintf(c.name, sizeof c.name, "detected");
    return c;
}

static inline void tut_usage(const char *prog, const char *about)
{
    fprintf(stderr,
            "%s\nusage: %s [--n N1,N2,..] [--d D] [--br BR] [--bc BC] [--M M1,M2,..] [--causal]\n"
            "          [--threads T] [--reps R] [--geometry detected|teaching|L1SIZE,WAYS,LINE:L2SIZE,WAYS,LINE]\n"
            "          [--out DIR] [--no-sim] [--big N] [--kernel-only] [--sim-kernel] [--valgrind-geometry]\n"
            "  --big N            steps 05-07: one more run at N, timed, rows sampled against the reference\n"
            "                     (default without --n: the smallest N whose K and V fill twice the L2; 0 = none)\n"
            "  --kernel-only      run the plain kernel once at the first N (what valgrind measures)\n"
            "  --sim-kernel       run the probed kernel once at the first N on a cold simulator\n"
            "  --valgrind-geometry  print the cachegrind flags for --geometry and the kernel's name\n",
            about, prog);
}

/* An integer flag value in lo..hi, the whole string (atoi read "12abc" as 12 and wrapped
 * 4294967360 to 64); exits 2 naming the flag otherwise. */
static inline int tut_int(const char *flag, const char *v, long lo, long hi)
{
    char *end;
    errno = 0;
    const long x = strtol(v, &end, 10);
    if (end == v || *end || errno == ERANGE || x < lo || x > hi) {
        fprintf(stderr, "%s: expected an integer in %ld..%ld, got '%s'\n", flag, lo, hi, v);
        exit(2);
    }
    return (int)x;
}

/* Parse the shared flags; the step sets its defaults in *a first. Exits 2 on bad usage. */
static inline void tut_parse_args(int argc, char **argv, tut_args *a, const char *about)
{
    a->geometry = a->geometry ? a->geometry : "detected";
    a->big = -1;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        size_t tmp[TUT_MAX_LIST];
        int used = 1;
        if (!strcmp(f, "--causal")) { a->causal = 1; used = 0; }
        else if (!strcmp(f, "--kernel-only")) { a->kernel_only = 1; used = 0; }
        else if (!strcmp(f, "--valgrind-geometry")) { a->print_vg = 1; used = 0; }
        else if (!strcmp(f, "--no-sim")) { a->no_sim = 1; used = 0; }
        else if (!strcmp(f, "--sim-kernel")) { a->sim_kernel = 1; used = 0; }
        else if (!strcmp(f, "-h") || !strcmp(f, "--help")) { tut_usage(argv[0], about); exit(0); }
        else if (!v) { tut_usage(argv[0], about); exit(2); }
        else if (!strcmp(f, "--n")) {
            int c = tut_parse_list(v, tmp, TUT_MAX_LIST);
            if (c <= 0) { fprintf(stderr, "--n: expected a list like 128,256\n"); exit(2); }
            for (int k = 0; k < c; k++) a->n[k] = (int)tmp[k];
            a->n_count = c;
            a->n_given = 1;
        } else if (!strcmp(f, "--M")) {
            int c = tut_parse_list(v, a->m, TUT_MAX_LIST);
            if (c <= 0) { fprintf(stderr, "--M: expected a list like 16K,32K\n"); exit(2); }
            a->m_count = c;
        }
        else if (!strcmp(f, "--big")) {
            char *end;
            long b = strtol(v, &end, 10);
            if (*end || b < 0 || b > 1 << 20) { fprintf(stderr, "--big: expected N in 0..%d, got '%s'\n", 1 << 20, v); exit(2); }
            a->big = (int)b;
        }
        else if (!strcmp(f, "--d")) a->d = tut_int(f, v, 1, 1 << 16);
        else if (!strcmp(f, "--br")) a->br = tut_int(f, v, 0, 1 << 16);
        else if (!strcmp(f, "--bc")) a->bc = tut_int(f, v, 0, 1 << 16);
        else if (!strcmp(f, "--threads")) a->threads = tut_int(f, v, 0, 1 << 12);
        else if (!strcmp(f, "--reps")) a->reps = tut_int(f, v, 1, 1 << 20);
        else if (!strcmp(f, "--geometry")) a->geometry = v;
        else if (!strcmp(f, "--out")) a->out = v;
        else { fprintf(stderr, "%s: unknown flag %s\n", argv[0], f); tut_usage(argv[0], about); exit(2); }
        i += used;
    }
    if (a->d <= 0 || a->reps <= 0 || a->br < 0 || a->bc < 0 || a->threads < 0) {
        fprintf(stderr, "%s: --d and --reps must be positive, block sizes and threads >= 0\n", argv[0]);
        exit(2);
    }
    const char *err = NULL;
    if (!strcmp(a->geometry, "detected")) a->geo = tut_detected_geometry();
    else if (cachesim_config_parse(a->geometry, &a->geo, &err)) {
        fprintf(stderr, "--geometry: %s\n", err);
        exit(2);
    }
    if (a->print_vg) {
        /* What `make cachegrind` hands to valgrind, so both simulate the same caches. */
        printf("--D1=%zu,%d,%d --LL=%zu,%d,%d %s\n", a->geo.l1.size_bytes, a->geo.l1.ways,
               a->geo.l1.line_bytes, a->geo.l2.size_bytes, a->geo.l2.ways, a->geo.l2.line_bytes,
               a->vg_kernel ? a->vg_kernel : "-");
        exit(0);
    }
}

/* ======================================================================== */
/* 3. Buffers and data                                                       */
/* ======================================================================== */

static size_t tut_ws_now, tut_ws_peak;   /* bytes of kernel workspace live now / at peak */

/* A zeroed, 4 KiB-aligned buffer. Exits on failure: a tutorial has nothing better to do. */
static inline void *tut_alloc(size_t bytes)
{
    size_t rounded = (bytes + 4095) & ~(size_t)4095;
    void *p = aligned_alloc(4096, rounded ? rounded : 4096);
    if (!p) { fprintf(stderr, "out of memory allocating %zu bytes\n", bytes); exit(1); }
    memset(p, 0, rounded ? rounded : 4096);
    return p;
}

/* Workspace: the kernel's own scratch (S, P, tiles), counted for the memory column. */
static inline void *tut_ws_alloc(size_t bytes)
{
    tut_ws_now += bytes;
    if (tut_ws_now > tut_ws_peak) tut_ws_peak = tut_ws_now;
    return tut_alloc(bytes);
}
static inline void tut_ws_free(void *p, size_t bytes) { free(p); tut_ws_now -= bytes; }

/* Deterministic uniform values in [lo, hi): splitmix64. */
static inline void tut_fill(float *x, size_t n, uint64_t seed, float lo, float hi)
{
    uint64_t s = seed;
    for (size_t i = 0; i < n; i++) {
        uint64_t z = (s += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        z ^= z >> 31;
        x[i] = lo + (hi - lo) * (float)((double)(z >> 11) / 9007199254740992.0);
    }
}

/* ======================================================================== */
/* 4. The reference and the error                                            */
/* ======================================================================== */

/*
 * O_ref = attention(Q, K, V) for one head, by the library's float64 reference.
 * Q: [n][d], K: [n][d], V: [n][d] (float32, contiguous); O_ref: [n][d] float64.
 */
static inline void tut_reference(int n, int d, const float *Q, const float *K, const float *V,
                          int causal, double *O_ref, double *lse_ref /* [n] or NULL */)
{
    fa_tensor q, k, v, o, lse;
    int64_t lshape[3] = {1, 1, n};
    if (lse_ref) fa_tensor_make(&lse, lse_ref, FA_F64, 3, lshape, NULL);
    int64_t shape[4] = {1, n, 1, d};
    fa_tensor_make(&q, (void *)Q, FA_F32, 4, shape, NULL);
    fa_tensor_make(&k, (void *)K, FA_F32, 4, shape, NULL);
    fa_tensor_make(&v, (void *)V, FA_F32, 4, shape, NULL);
    fa_tensor_make(&o, O_ref, FA_F64, 4, shape, NULL);
    fa_options opt = fa_options_default();
    opt.impl = FA_IMPL_REFERENCE;
    opt.causal = causal;
    fa_status st = fa_forward(&q, &k, &v, &o, lse_ref ? &lse : NULL, &opt);
    if (st != FA_OK) {
        fprintf(stderr, "reference failed: %s: %s\n", fa_status_string(st), fa_last_error());
        exit(1);
    }
}

/* max |O - O_ref| over n elements. */
static inline double tut_max_err(const float *O, const double *O_ref, size_t n)
{
    double e = 0;
    for (size_t i = 0; i < n; i++) {
        double diff = fabs((double)O[i] - O_ref[i]);
        if (!(diff <= e)) e = diff;   /* a NaN becomes the error */
    }
    return e;
}

/* Every step states its tolerance and refuses to teach from a wrong answer. */
static inline void tut_require(double err, double tol, const char *what)
{
    if (!(err <= tol)) {
        fprintf(stderr, "FAILED: %s: max error %.3g exceeds the tolerance %.3g\n", what, err, tol);
        exit(1);
    }
}

/* ======================================================================== */
/* 5. Hardware counters                                                      */
/* ======================================================================== */

/* L1d read misses and last-level-cache read misses of this thread, from perf events. */
typedef struct tut_hw {
    int fd_l1, fd_ll;      /* -1 when not open */
    long long l1, ll;      /* counts of the last tut_hw_stop() */
} tut_hw;

#ifdef __linux__
static inline int tut_perf_open(uint64_t config)
{
    struct perf_event_attr pe;
    memset(&pe, 0, sizeof pe);
    pe.type = PERF_TYPE_HW_CACHE;
    pe.size = sizeof pe;
    pe.config = config;
    pe.disabled = 1;
    pe.exclude_kernel = 1;
    pe.exclude_hv = 1;
    return (int)syscall(SYS_perf_event_open, &pe, 0, -1, -1, 0);
}
#endif

#define TUT_HW_NA "hardware counters not available on this machine"

/* Returns 1 if both counters opened; otherwise they read as -1. */
static inline int tut_hw_init(tut_hw *h)
{
    h->fd_l1 = h->fd_ll = -1;
    h->l1 = h->ll = -1;
#ifdef __linux__
    h->fd_l1 = tut_perf_open(PERF_COUNT_HW_CACHE_L1D | (PERF_COUNT_HW_CACHE_OP_READ << 8) |
                             (PERF_COUNT_HW_CACHE_RESULT_MISS << 16));
    h->fd_ll = tut_perf_open(PERF_COUNT_HW_CACHE_LL | (PERF_COUNT_HW_CACHE_OP_READ << 8) |
                             (PERF_COUNT_HW_CACHE_RESULT_MISS << 16));
    if (h->fd_l1 < 0 || h->fd_ll < 0) {
        if (h->fd_l1 >= 0) close(h->fd_l1);
        if (h->fd_ll >= 0) close(h->fd_ll);
        h->fd_l1 = h->fd_ll = -1;
    }
#endif
    return h->fd_l1 >= 0;
}

static inline void tut_hw_start(tut_hw *h)
{
#ifdef __linux__
    if (h->fd_l1 < 0) return;
    ioctl(h->fd_l1, PERF_EVENT_IOC_RESET, 0); ioctl(h->fd_ll, PERF_EVENT_IOC_RESET, 0);
    ioctl(h->fd_l1, PERF_EVENT_IOC_ENABLE, 0); ioctl(h->fd_ll, PERF_EVENT_IOC_ENABLE, 0);
#endif
}

static inline void tut_hw_stop(tut_hw *h)
{
#ifdef __linux__
    if (h->fd_l1 < 0) return;
    ioctl(h->fd_l1, PERF_EVENT_IOC_DISABLE, 0); ioctl(h->fd_ll, PERF_EVENT_IOC_DISABLE, 0);
    if (read(h->fd_l1, &h->l1, sizeof h->l1) != sizeof h->l1) h->l1 = -1;
    if (read(h->fd_ll, &h->ll, sizeof h->ll) != sizeof h->ll) h->ll = -1;
#endif
}

/* ======================================================================== */
/* 6. Timing, headers, data files                                            */
/* ======================================================================== */

static inline double tut_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline int tut_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median of `reps` timings of STMT (one untimed warm-up first), in seconds. */
#define TUT_TIME(reps, median_out, STMT)                                   \
    do {                                                                   \
        double t_[64];                                                     \
        int r_n_ = (reps) < 64 ? (reps) : 64;                              \
        STMT;                                                              \
        for (int r_ = 0; r_ < r_n_; r_++) {                                \
            double t0_ = tut_now();                                        \
            STMT;                                                          \
            t_[r_] = tut_now() - t0_;                                      \
        }                                                                  \
        qsort(t_, (size_t)r_n_, sizeof t_[0], tut_cmp_double);             \
        (median_out) = t_[r_n_ / 2];                                       \
    } while (0)

/*
 * Evict everything a previous phase left in the caches, by reading a buffer
 * four times the L2 size. The simulator starts cold anyway; this makes the
 * real run (and valgrind's) start cold too, so the numbers mean the same.
 */
static inline void tut_flush_caches(const tut_args *a)
{
    size_t n = 4 * (a->geo.l2.size_bytes ? a->geo.l2.size_bytes : a->geo.l1.size_bytes) / sizeof(float);
    float *junk = tut_alloc(n * sizeof(float));   /* [n] */
    volatile float sink = 0;
    for (size_t i = 0; i < n; i += 16) sink += junk[i];
    (void)sink;
    free(junk);
}

/* The banner every step prints: which machine, ISA, threads, and where miss counts come from. */
static inline void tut_banner(const char *title, const tut_args *a, const tut_hw *hw)
{
    fa_cpu_info ci;
    char g[96];
    memset(&ci, 0, sizeof ci);
    fa_get_cpu_info(&ci);
    cachesim_config_format(&a->geo, g, sizeof g);
    printf("== %s\n", title);
    printf("   machine: L1d %zu KiB, L2 %zu KiB, line %zu B; library ISA %s, %d threads\n",
           ci.l1d_bytes >> 10, ci.l2_bytes >> 10, ci.line_bytes, ci.isa ? ci.isa : "?",
           ci.max_threads);
    printf("   cache misses [sim]: deterministic simulator, %s geometry %s (L1 size,ways,line:L2 ...)\n",
           a->geo.name, g);
    if (!hw) printf("   cache misses [hw]:  not measured in this step\n");
    else if (hw->fd_l1 >= 0) printf("   cache misses [hw]:  perf events (L1d read misses, LLC read misses)\n");
    else printf("   cache misses [hw]:  %s\n", TUT_HW_NA);
    printf("   cache misses [vg]:  run `make cachegrind STEP=NN` for valgrind's count of the kernel alone\n\n");
}

/* Open <dir>/<name>.dat (dir: --out, default build/tutorials) with a '#' header line. */
static inline FILE *tut_dat_open(const tut_args *a, const char *name, const char *columns)
{
    char path[512];
    const char *dir = a->out ? a->out : "build/tutorials";
    if (!a->out) mkdir("build", 0777);
    mkdir(dir, 0777);
    snprintf(path, sizeof path, "%s/%s.dat", dir, name);
    const char *p = path;
    FILE *f = fopen(p, "w");
    if (!f) { fprintf(stderr, "cannot write %s: %s\n", p, strerror(errno)); exit(1); }
    fprintf(f, "# %s\n", columns);
    return f;
}

/* Human-readable bytes: "12.0 KiB". Uses one of four rotating static buffers. */
static inline const char *tut_bytes(double b)
{
    static char buf[4][32];
    static int k;
    char *s = buf[k++ & 3];
    if (b >= 1024.0 * 1024 * 1024) snprintf(s, 32, "%.1f GiB", b / (1024.0 * 1024 * 1024));
    else if (b >= 1024.0 * 1024) snprintf(s, 32, "%.1f MiB", b / (1024.0 * 1024));
    else if (b >= 1024.0) snprintf(s, 32, "%.1f KiB", b / 1024.0);
    else snprintf(s, 32, "%.0f B", b);
    return s;
}

/* Text for a hardware count: the number, or "n/a". */
static inline const char *tut_hw_text(long long v)
{
    static char buf[4][24];
    static int k;
    char *s = buf[k++ & 3];
    if (v < 0) snprintf(s, 24, "n/a");
    else snprintf(s, 24, "%lld", v);
    return s;
}


/* ======================================================================== */
/* 7. The attention-step driver                                              */
/* ======================================================================== */

/*
 * One head of attention, as every kernel in steps 02-08 sees it.
 * Sizes are in elements; all arrays are row-major and contiguous.
 */
typedef struct tut_problem {
    int n, d;              /* sequence length (queries = keys = n), head dim */
    int br, bc;            /* row block Br (queries), column block Bc (keys); 0 if unused */
    int causal;            /* key j visible to query i iff j <= i */
    const float *Q;        /* [n][d] */
    const float *K;        /* [n][d] */
    const float *V;        /* [n][d] */
    float *O;              /* [n][d] output */
    float *lse;            /* [n] log-sum-exp output, or NULL if the kernel has none */
    float *ws;             /* workspace the kernel carves its scratch from (size: ws_floats) */
} tut_problem;

/* A step's kernel: the plain version, the probed version, and its workspace need. */
typedef struct tut_kernel {
    const char *name;                              /* printed and used by make cachegrind */
    void (*run)(const tut_problem *pb);            /* probes compiled out */
    void (*probed)(cachesim *cs, const tut_problem *pb);
    size_t (*ws_floats)(const tut_problem *pb);    /* floats of scratch it needs */
    int writes_lse;                                /* 1: the kernel also writes pb->lse */
} tut_kernel;

/* One measured row of a step's table and data file. */
typedef struct tut_result {
    int n, d, br, bc;
    double sec, gflops;
    size_t ws_bytes;
    uint64_t l1_miss, l2_miss;        /* [sim], 0 with --no-sim */
    uint64_t l1_bytes, l2_bytes;      /* [sim] traffic below L1 / below L2 (fills + write-backs) */
    long long hw_l1, hw_ll;           /* [hw], -1 when unavailable */
    double err;                       /* max |O - O_ref| */
    double lse_err;                   /* max |LSE - LSE_ref| when the kernel writes LSE, else 0 */
} tut_result;

#define TUT_DAT_COLUMNS \
    "n d br bc time_ms gflops ws_bytes l1_miss_sim l2_miss_sim l1_traffic_bytes l2_traffic_bytes hw_l1 hw_ll max_err"

static inline void tut_table_head(void)
{
    printf("   %6s %4s %4s | %9s | %8s | %10s | %12s | %11s | %10s | %11s | %8s\n", "N", "Br", "Bc",
           "time ms", "GFLOP/s", "workspace", "L1 miss[sim]", "L2 miss[sim]", "L1miss[hw]",
           "L1miss/N^2", "max err");
}

static tut_result tut_last_row;   /* the last row printed, for tut_io_summary() */

static inline void tut_table_row(FILE *dat, const tut_result *r)
{
    tut_last_row = *r;
    printf("   %6d %4d %4d | %9.3f | %8.2f | %10s | %12llu | %11llu | %10s | %11.3f | %8.1e\n", r->n, r->br,
           r->bc, r->sec * 1e3, r->gflops, tut_bytes((double)r->ws_bytes), (unsigned long long)r->l1_miss,
           (unsigned long long)r->l2_miss, tut_hw_text(r->hw_l1), (double)r->l1_miss / ((double)r->n * r->n),
           r->err);
    if (dat)
        fprintf(dat, "%d %d %d %d %g %g %zu %llu %llu %llu %llu %lld %lld %g\n", r->n, r->d, r->br, r->bc,
                r->sec * 1e3, r->gflops, r->ws_bytes, (unsigned long long)r->l1_miss,
                (unsigned long long)r->l2_miss, (unsigned long long)r->l1_bytes,
                (unsigned long long)r->l2_bytes, r->hw_l1, r->hw_ll, r->err);
}

/*
 * IO accounting for the last row: bytes between L1 (the fast tier, M floats)
 * and everything below it, beside the two bounds of docs/io_complexity.md:
 * standard attention 4(N d + N^2) bytes, FlashAttention 4 N^2 d^2 / M bytes.
 * Step 12 sweeps N and M; this line puts every step on the same scale.
 */
static inline void tut_io_summary(const tut_args *a)
{
    const tut_result *r = &tut_last_row;
    if (a->no_sim || !r->n) return;
    double n = r->n, d = r->d, M = (double)a->geo.l1.size_bytes / 4;
    double std_bound = 4 * (n * d + n * n), flash_bound = 4 * n * n * d * d / M;
    printf("\n   IO at N = %d [sim]: %s moved between L1 (M = %.0f floats) and below; bounds: standard\n"
           "   4(Nd + N^2) = %s (ratio %.2f), flash 4 N^2 d^2 / M = %s (ratio %.2f).\n",
           r->n, tut_bytes((double)r->l1_bytes), M, tut_bytes(std_bound), r->l1_bytes / std_bound,
           tut_bytes(flash_bound), r->l1_bytes / flash_bound);
}

/* Inputs for one problem size: Q, K uniform in [-2, 2] (a peaked softmax), V in [-1, 1]. */
static inline void tut_problem_alloc(tut_problem *pb, const tut_kernel *k)
{
    size_t nd = (size_t)pb->n * (size_t)pb->d;
    float *q = tut_alloc(nd * 4), *kk = tut_alloc(nd * 4), *v = tut_alloc(nd * 4);
    tut_fill(q, nd, 11, -2, 2);
    tut_fill(kk, nd, 22, -2, 2);
    tut_fill(v, nd, 33, -1, 1);
    pb->Q = q; pb->K = kk; pb->V = v;
    pb->O = tut_alloc(nd * 4);
    pb->lse = tut_alloc((size_t)pb->n * 4);
    pb->ws = tut_alloc(k->ws_floats(pb) * 4 + 4);
}

static inline void tut_problem_free(tut_problem *pb)
{
    free((void *)pb->Q); free((void *)pb->K); free((void *)pb->V);
    free(pb->O); free(pb->lse); free(pb->ws);
}

/*
 * The paper's block sizes for a fast memory of M floats: Bc = ceil(M / 4d),
 * Br = min(Bc, d). In the tutorials the fast memory is the simulated L1, so
 * M = L1 bytes / 4. (The library plans for L2 instead; `flashattn info`.)
 */
static inline void tut_paper_blocks(const tut_args *a, int *br, int *bc)
{
    long M = (long)(a->geo.l1.size_bytes / sizeof(float));
    long c = (M + 4L * a->d - 1) / (4L * a->d);
    if (c < 1) c = 1;
    if (!*bc) *bc = (int)c;
    if (!*br) *br = (int)(c < a->d ? c : a->d);
}

/*
 * Blocks that FIT: the largest Br = Bc = b (a multiple of 8) with
 * (2 b + 4 b) d + b^2 <= M floats: Q_i and O_i, the tile, and TWO key/value
 * blocks, because an LRU cache still holds K_j, V_j while K_{j+1}, V_{j+1}
 * come in, and it evicts the oldest lines first, not the dead ones.
 * Steps 07+ use it; step 06 keeps the paper's rule and shows what overflowing costs.
 */
static inline void tut_fit_blocks(const tut_args *a, int *br, int *bc)
{
    long M = (long)(a->geo.l1.size_bytes / sizeof(float)), b = 8;
    while (6 * (b + 8) * a->d + (b + 8) * (b + 8) <= M) b += 8;
    if (!*bc) *bc = (int)b;
    if (!*br) *br = (int)b;
}

/* Print the simulator's counts for one cold run in the form tutorials/cachegrind.sh reads. */
static inline void tut_print_sim_counts(const cachesim *cs, const char *kernel)
{
    cachesim_stats s1, s2;
    cachesim_get_stats(cs, 1, &s1);
    cachesim_get_stats(cs, 2, &s2);
    printf("sim %s: D1 reads %llu read_misses %llu writes %llu write_misses %llu misses %llu"
           " LL_misses %llu\n", kernel, (unsigned long long)s1.reads, (unsigned long long)s1.read_misses,
           (unsigned long long)s1.writes, (unsigned long long)s1.write_misses,
           (unsigned long long)(s1.read_misses + s1.write_misses),
           (unsigned long long)(s2.read_misses + s2.write_misses));
}

/*
 * --kernel-only / --sim-kernel: one run of the kernel at n[0], nothing else.
 * Returns 1 if it handled one of those modes (the step then exits).
 */
static inline int tut_kernel_mode(const tut_args *a, const tut_kernel *k, int br, int bc)
{
    if (!a->kernel_only && !a->sim_kernel) return 0;
    tut_problem pb = {.n = a->n[0], .d = a->d, .br = br, .bc = bc, .causal = a->causal};
    tut_problem_alloc(&pb, k);
    if (a->kernel_only) {
        tut_flush_caches(a);
        k->run(&pb);
    } else {
        cachesim *cs = cachesim_create(&a->geo);
        k->probed(cs, &pb);
        tut_print_sim_counts(cs, k->name);
        cachesim_free(cs);
    }
    tut_problem_free(&pb);
    return 1;
}

/*
 * Measure one problem size: check against the reference, time the plain
 * kernel (median of reps, hardware counters around it), then replay the
 * probed kernel on a cold simulator. Exits if the answer is wrong.
 */
static inline tut_result tut_measure(const tut_args *a, const tut_kernel *k, int n, int br, int bc,
                                     cachesim *cs, tut_hw *hw, double tol)
{
    tut_result r;
    memset(&r, 0, sizeof r);
    tut_problem pb = {.n = n, .d = a->d, .br = br, .bc = bc, .causal = a->causal};
    tut_problem_alloc(&pb, k);
    size_t nd = (size_t)n * (size_t)a->d;
    double *O_ref = tut_alloc(nd * 8);           /* [n][d] */
    double *lse_ref = tut_alloc((size_t)n * 8);  /* [n] */
    tut_reference(n, a->d, pb.Q, pb.K, pb.V, a->causal, O_ref, lse_ref);
    k->run(&pb);
    r.err = tut_max_err(pb.O, O_ref, nd);
    tut_require(r.err, tol, k->name);
    if (k->writes_lse) {
        r.lse_err = tut_max_err(pb.lse, lse_ref, (size_t)n);
        tut_require(r.lse_err, tol, "log-sum-exp");
    }
    tut_flush_caches(a);
    tut_hw_start(hw);
    TUT_TIME(a->reps, r.sec, k->run(&pb));
    tut_hw_stop(hw);
    r.hw_l1 = hw->l1 < 0 ? -1 : hw->l1 / (a->reps + 1);   /* per run (reps + the warm-up) */
    r.hw_ll = hw->ll < 0 ? -1 : hw->ll / (a->reps + 1);
    if (cs) {
        cachesim_reset(cs);
        k->probed(cs, &pb);
        r.l1_miss = cachesim_misses(cs, 1);
        r.l2_miss = cachesim_misses(cs, 2);
        r.l1_bytes = cachesim_traffic_bytes(cs, 1);
        r.l2_bytes = cachesim_traffic_bytes(cs, 2);
        double err2 = tut_max_err(pb.O, O_ref, nd);
        tut_require(err2, tol, "the probed kernel");
    }
    double flops = 4.0 * n * (double)n * a->d * (a->causal ? 0.5 : 1.0);
    r.gflops = flops / r.sec / 1e9;
    r.n = n; r.d = a->d; r.br = br; r.bc = bc;
    r.ws_bytes = k->ws_floats(&pb) * 4;
    free(O_ref);
    free(lse_ref);
    tut_problem_free(&pb);
    return r;
}

/*
 * Time the library itself on the same problem: fa_forward with `impl` and
 * `threads` (0 = OpenMP default), checked against the reference first.
 * No [sim] counts: the simulator sees only the tutorials' own kernels.
 */
static inline tut_result tut_measure_library(const tut_args *a, fa_impl impl, int n, int threads, double tol)
{
    tut_result r;
    memset(&r, 0, sizeof r);
    size_t nd = (size_t)n * (size_t)a->d;
    float *q = tut_alloc(nd * 4), *k = tut_alloc(nd * 4), *v = tut_alloc(nd * 4), *o = tut_alloc(nd * 4);
    double *O_ref = tut_alloc(nd * 8);          /* [n][d] */
    tut_fill(q, nd, 11, -2, 2);
    tut_fill(k, nd, 22, -2, 2);
    tut_fill(v, nd, 33, -1, 1);
    tut_reference(n, a->d, q, k, v, a->causal, O_ref, NULL);
    fa_tensor tq, tk, tv, to;
    int64_t shape[4] = {1, n, 1, a->d};         /* BSHD, one batch, one head */
    fa_tensor_make(&tq, q, FA_F32, 4, shape, NULL);
    fa_tensor_make(&tk, k, FA_F32, 4, shape, NULL);
    fa_tensor_make(&tv, v, FA_F32, 4, shape, NULL);
    fa_tensor_make(&to, o, FA_F32, 4, shape, NULL);
    fa_options opt = fa_options_default();
    opt.impl = impl;
    opt.causal = a->causal;
    opt.num_threads = threads;
    fa_status st = fa_forward(&tq, &tk, &tv, &to, NULL, &opt);
    if (st != FA_OK) {
        fprintf(stderr, "fa_forward(%s): %s: %s\n", fa_impl_name(impl), fa_status_string(st), fa_last_error());
        exit(1);
    }
    r.err = tut_max_err(o, O_ref, nd);
    tut_require(r.err, tol, fa_impl_name(impl));
    fa_alloc_stats_reset();
    TUT_TIME(a->reps, r.sec, fa_forward(&tq, &tk, &tv, &to, NULL, &opt));
    fa_alloc_stats stats;
    fa_alloc_stats_get(&stats);
    r.ws_bytes = stats.peak_bytes;
    r.n = n; r.d = a->d;
    fa_block_sizes(a->d, a->d, &opt, &r.br, &r.bc);
    r.gflops = 4.0 * n * (double)n * a->d * (a->causal ? 0.5 : 1.0) / r.sec / 1e9;
    r.hw_l1 = r.hw_ll = -1;
    free(q); free(k); free(v); free(o); free(O_ref);
    return r;
}

/* ======================================================================== */
/* 8. Beyond L2 (steps 05-07)                                                */
/* ======================================================================== */

/*
 * At the default sizes K and V fit in the L2 (2 N d floats: 256 KiB at N = 512,
 * d = 64), so an L1 miss costs an L2 hit, a few ns, and the time column need
 * not follow the miss column. These helpers add one run at an N whose K and V
 * do not fit, sized from the L2 the library detects (fa_get_cpu_info), and
 * measure how fast this core streams from beyond L2, to say which of the two —
 * arithmetic or memory — sets a step's pace.
 */

static inline size_t tut_l2_bytes(void)
{
    fa_cpu_info ci;
    if (fa_get_cpu_info(&ci) != FA_OK || !ci.l2_bytes) return (size_t)1 << 20;
    return ci.l2_bytes;
}

/* The N of the extra run: --big, else (no --n given) the smallest multiple of
 * 256 whose K and V (8 N d bytes) take at least twice the L2; 0 = no extra run. */
static inline int tut_big_n(const tut_args *a)
{
    if (a->big >= 0) return a->big;
    if (a->n_given) return 0;
    size_t per256 = (size_t)256 * 8 * (size_t)a->d, want = 2 * tut_l2_bytes();
    return (int)(256 * ((want + per256 - 1) / per256));
}

/* Read bandwidth from beyond L2 in GB/s: best of 5 passes over 4x the L2. (An
 * XOR of 32-bit words: one-cycle latency, so the loop waits on memory, not on
 * a chain of float adds.) */
static inline double tut_stream_gbps(void)
{
    size_t n = 4 * tut_l2_bytes() / sizeof(uint32_t);
    uint32_t *buf = tut_alloc(n * sizeof(uint32_t));   /* [n] */
    for (size_t i = 0; i < n; i++) buf[i] = (uint32_t)i;
    double best = 0;
    volatile uint32_t sink = 0;
    for (int pass = 0; pass < 6; pass++) {
        uint32_t x = 0;
        double t0 = tut_now();
#pragma omp simd reduction(^ : x)
        for (size_t i = 0; i < n; i++) x ^= buf[i];
        double t = tut_now() - t0;
        sink ^= x;
        if (pass > 0 && n * sizeof(uint32_t) / t / 1e9 > best) best = n * sizeof(uint32_t) / t / 1e9;
    }
    (void)sink;
    free(buf);
    return best;
}

/* One row of the float64 reference for query i: fa_forward on a one-row view of
 * Q and the keys row i may see (causal: 0..i, so bottom-right = top-left here). */
static inline void tut_reference_row(const tut_problem *pb, int i, double *o /* [d] */, double *lse)
{
    fa_tensor q, k, v, to, tl;
    const int64_t nk = pb->causal ? i + 1 : pb->n;
    int64_t qs[4] = {1, 1, 1, pb->d}, ks[4] = {1, nk, 1, pb->d}, ls[3] = {1, 1, 1};
    fa_tensor_make(&q, (void *)(pb->Q + (size_t)i * pb->d), FA_F32, 4, qs, NULL);
    fa_tensor_make(&k, (void *)pb->K, FA_F32, 4, ks, NULL);
    fa_tensor_make(&v, (void *)pb->V, FA_F32, 4, ks, NULL);
    fa_tensor_make(&to, o, FA_F64, 4, qs, NULL);
    fa_tensor_make(&tl, lse, FA_F64, 3, ls, NULL);
    fa_options opt = fa_options_default();
    opt.impl = FA_IMPL_REFERENCE;
    fa_status st = fa_forward(&q, &k, &v, &to, &tl, &opt);
    if (st != FA_OK) {
        fprintf(stderr, "reference failed: %s: %s\n", fa_status_string(st), fa_last_error());
        exit(1);
    }
}

/*
 * The extra run at n: one timed run from cold caches (at this size one run is
 * long enough), no simulator (it would take minutes), and 16 rows spread over
 * [0, n) checked against the reference. Prints the row like tut_table_row,
 * with "-" where nothing was measured, and appends it to <out>/<step>_l2.dat.
 */
static inline tut_result tut_measure_big(const tut_args *a, const tut_kernel *k, const char *step, int n,
                                         int br, int bc, double tol)
{
    tut_result r;
    memset(&r, 0, sizeof r);
    tut_problem pb = {.n = n, .d = a->d, .br = br, .bc = bc, .causal = a->causal};
    tut_problem_alloc(&pb, k);
    tut_flush_caches(a);
    double t0 = tut_now();
    k->run(&pb);
    r.sec = tut_now() - t0;
    double *o = tut_alloc((size_t)a->d * 8), lse;   /* [d] */
    for (int s = 0; s < 16; s++) {
        int i = (int)((int64_t)s * (n - 1) / 15);
        tut_reference_row(&pb, i, o, &lse);
        for (int c = 0; c < a->d; c++) {
            double e = fabs((double)pb.O[(size_t)i * a->d + c] - o[c]);
            if (!(e <= r.err)) r.err = e;
        }
        if (k->writes_lse) {
            double e = fabs((double)pb.lse[i] - lse);
            if (!(e <= r.lse_err)) r.lse_err = e;
        }
    }
    tut_require(r.err, tol, k->name);
    tut_require(r.lse_err, tol, "log-sum-exp");
    r.n = n; r.d = a->d; r.br = br; r.bc = bc;
    r.gflops = 4.0 * n * (double)n * a->d * (a->causal ? 0.5 : 1.0) / r.sec / 1e9;
    r.ws_bytes = k->ws_floats(&pb) * 4;
    r.hw_l1 = r.hw_ll = -1;
    printf("   %6d %4d %4d | %9.3f | %8.2f | %10s | %12s | %11s | %10s | %11s | %8.1e  (16 rows checked)\n", n, br, bc,
           r.sec * 1e3, r.gflops, tut_bytes((double)r.ws_bytes), "-", "-", "-", "-", r.err);
    char name[32];
    snprintf(name, sizeof name, "%s_l2", step);
    FILE *dat = tut_dat_open(a, name, "n d br bc time_ms gflops ws_bytes max_err_sampled kv_bytes l2_bytes");
    fprintf(dat, "%d %d %d %d %g %g %zu %g %zu %zu\n", n, a->d, br, bc, r.sec * 1e3, r.gflops, r.ws_bytes, r.err,
            (size_t)8 * n * a->d, tut_l2_bytes());
    fclose(dat);
    free(o);
    tut_problem_free(&pb);
    return r;
}

/*
 * The narration of steps 05-07 about L2. `last` is the last in-L2 row (or NULL),
 * `big` the extra run (or NULL); bytes_per_flop is the step's loop order's
 * traffic from beyond L2 per FLOP once K and V no longer fit (float32):
 * 05: every row re-reads K and V, 8 N d bytes per 4 N d FLOPs = 2;
 * 06: Q and O (read and written) per key block, 12 N d per 4 N Bc d = 3 / Bc;
 * 07: K and V per query block, 8 N d per 4 Br N d = 2 / Br.
 */
static inline void tut_l2_story(const tut_args *a, const tut_result *last, const tut_result *big,
                                double bytes_per_flop, const char *order)
{
    const double l2 = (double)tut_l2_bytes();
    if (last && last->n) {
        double kv = 8.0 * last->n * a->d;
        printf("\n   L2: at N = %d, K and V take %s; the L2 holds %s.\n", last->n, tut_bytes(kv), tut_bytes(l2));
        if (kv <= l2)
            printf("   They fit: every L1 miss above is an L2 hit (a few ns), so the time column need not\n"
                   "   follow the miss column. At these sizes the steps differ in arithmetic more than in\n"
                   "   memory: on a Zen 3, step 06 ran slower than step 05 at N = 512 (it rescales and\n"
                   "   rewrites O after every key block).\n");
        else
            printf("   They do not fit: the misses above reach L3 or DRAM.\n");
    }
    if (!big || !big->n) {
        printf("   (--big N adds a run at an N whose K and V do not fit in L2.)\n");
        return;
    }
    const double kv = 8.0 * big->n * a->d;
    printf("\n   Beyond L2: at N = %d, K and V take %s, %.1fx the L2. GFLOP/s %.2f (N = %d) -> %.2f.\n",
           big->n, tut_bytes(kv), kv / l2, last && last->n ? last->gflops : 0.0, last && last->n ? last->n : 0,
           big->gflops);
    if (kv <= l2) {
        printf("   They still fit in L2: pick a larger --big to see the memory below it.\n");
        return;
    }
    const double gbps = tut_stream_gbps(), need = big->gflops * bytes_per_flop;
    printf("   Loop order: %s.\n"
           "   It needs %.3g bytes per FLOP from beyond L2, %.2f GB/s at this speed; this core\n"
           "   streams %.1f GB/s from beyond L2 (measured just now, one thread).\n",
           order, bytes_per_flop, need, gbps);
    const double kept = last && last->n ? big->gflops / last->gflops : 1.0;
    if (kept >= 0.75)
        printf("   It kept %.0f%% of its in-L2 speed, using %.0f%% of that bandwidth: the scalar arithmetic,\n"
               "   not the memory, sets the pace, so the misses cost little time here.\n",
               100 * kept, 100 * need / gbps);
    else
        printf("   It kept only %.0f%% of its in-L2 speed, using %.0f%% of that bandwidth:\n   %s\n", 100 * kept,
               100 * need / gbps, need > 0.5 * gbps ? "the memory sets the pace here."
                                                    : "misses cost time below the bandwidth limit too (latency;\n"
                                                      "   or a busy machine: rerun).");
    printf("   At 100 GFLOP/s (step 10's packed kernels) this order would need %.0f GB/s:\n   %s\n",
           100 * bytes_per_flop, 100 * bytes_per_flop > gbps
                                     ? "more than the memory delivers. Once the arithmetic is fast, the loop\n"
                                       "   order and the block sizes decide the time."
                                     : "within what the memory delivers.");
}

#endif /* TUT_COMMON_H */
