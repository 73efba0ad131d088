/*
 * cmd_bench.c — `flashattn bench`: one timing protocol for every figure.
 *
 * Protocol (STYLE.md rule 7): check first, warm up, repeat, report the median
 * and the spread, and print the machine, the ISA and the thread count with
 * every figure.
 *
 *   1. check: the last CHECK_ROWS query rows of every (batch, head) are
 *      recomputed with the float64 reference (slicing the LAST rows keeps the
 *      bottom-right mask alignment exact) and the max error is printed; a
 *      result that is wrong is never timed.
 *   2. warm-up runs (default 1), then `--repeats` timed runs (default 5,
 *      more for short ones until ~1 s has been spent); median/min/max.
 *   3. GFLOP/s with FLOPs = 4 * Sq * Sk * d per (batch, head), halved when
 *      causal; the fraction of the FMA peak that this command measures itself
 *      (an FMA-throughput loop on the ISA in use, on the same thread count).
 *   4. peak RSS: the process's high-water mark over the run, reset before each
 *      measurement through /proc/self/clear_refs (Linux), plus the bytes the
 *      library itself allocated (its counting allocator).
 *
 * `blas` is standard attention on CBLAS sgemm (OpenBLAS), built only when the
 * Makefile finds OpenBLAS: S = Q K^T and O = P V as two sgemm calls per head,
 * with the softmax in between.
 */
#include "cli.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "flashattn.h"
#include "internal.h"
#include "kernels/fma_peak.h"
#include "kernels/kernels.h"

#ifdef _OPENMP
#include <omp.h>
#endif

#ifdef FA_HAVE_BLAS
#include <cblas.h>
#endif

#define CHECK_ROWS 8
#define MAX_LIST 16

static const char *bench_usage =
    "usage: flashattn bench [--impl flash,standard,blas] [--n 1024,2048,4096,8192] [--d 64,128]\n"
    "                       [--batch B] [--heads H] [--heads-k HK] [--causal] [--threads T]\n"
    "                       [--repeats R] [--warmup W] [--csv FILE] [--no-check]\n"
    "Times attention implementations side by side on random float32 inputs and\n"
    "reports median/min/max time, GFLOP/s (4*Sq*Sk*d per head, half if causal),\n"
    "the fraction of a measured FMA peak, and peak memory.\n";

/* ---- small helpers --------------------------------------------------------- */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int parse_list(const char *s, long *out, int max)
{
    int n = 0;
    while (*s && n < max) {
        char *end;
        errno = 0;
        long v = strtol(s, &end, 10);
        if (end == s || errno || v <= 0) return -1;
        out[n++] = v;
        if (*end == ',') s = end + 1;
        else if (*end == '\0') break;
        else return -1;
    }
    return n;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Reset the kernel's RSS high-water mark (Linux >= 4.0); 0 on success. */
static int reset_peak_rss(void)
{
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (!f) return -1;
    int ok = fputs("5", f) >= 0;
    return (fclose(f) == 0 && ok) ? 0 : -1;
}

static double peak_rss_mib(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (f) {
        char line[256];
        while (fgets(line, sizeof line, f)) {
            long kb;
            if (sscanf(line, "VmHWM: %ld kB", &kb) == 1) {
                fclose(f);
                return (double)kb / 1024.0;
            }
        }
        fclose(f);
    }
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_maxrss / 1024.0;
}

static void cpu_model(char *buf, size_t n)
{
    snprintf(buf, n, "unknown CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) == 0 || strncmp(line, "Model", 5) == 0) {
            char *c = strchr(line, ':');
            if (c) {
                c++;
                while (*c == ' ') c++;
                c[strcspn(c, "\n")] = '\0';
                snprintf(buf, n, "%s", c);
                break;
            }
        }
    }
    fclose(f);
}

/* FMA peak in GFLOP/s for the ISA in use on `threads` threads (best of 5). */
static double measure_peak(const char *isa, int threads)
{
    double best = 0.0;
    for (int rep = 0; rep < 5; rep++) {
        double flops = 0.0;
        float sink = 0.0f;
        double t0 = now_s();
#ifdef _OPENMP
#pragma omp parallel num_threads(threads) reduction(+ : flops)
#endif
        {
            float local = 0.0f;
            flops += fa_fma_peak_loop(isa, 20000000L / (strcmp(isa, "scalar") ? 1 : 16), &local);
#ifdef _OPENMP
#pragma omp atomic
#endif
            sink += local;
        }
        double t = now_s() - t0;
        if (sink == 12345.0f) fprintf(stderr, " "); /* keep the work */
        if (t > 0 && flops / t / 1e9 > best) best = flops / t / 1e9;
    }
    return best;
}

/* ---- standard attention on BLAS ------------------------------------------- */

#ifdef FA_HAVE_BLAS
/* q, k, v, o float32 BSHD contiguous. Returns 0, or -1 if out of memory. */
static int blas_attention(const fa_tensor *q, const fa_tensor *k, const fa_tensor *v, fa_tensor *o,
                          int causal, int threads)
{
    const int64_t B = q->shape[0], Sq = q->shape[1], H = q->shape[2], d = q->shape[3];
    const int64_t Sk = k->shape[1], Hk = k->shape[2], dv = v->shape[3];
    const int64_t group = H / Hk;
    const float scale = 1.0f / sqrtf((float)d);
    float *S = malloc((size_t)Sq * (size_t)Sk * sizeof(float)); /* [Sq][Sk] */
    if (!S) return -1;
    for (int64_t b = 0; b < B; b++) {
        for (int64_t h = 0; h < H; h++) {
            const float *qh = (const float *)q->data + (b * Sq * H + h) * d;
            const float *kh = (const float *)k->data + (b * Sk * Hk + h / group) * d;
            const float *vh = (const float *)v->data + (b * Sk * Hk + h / group) * dv;
            float *oh = (float *)o->data + (b * Sq * H + h) * dv;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)Sq, (int)Sk, (int)d, scale, qh,
                        (int)(H * d), kh, (int)(Hk * d), 0.0f, S, (int)Sk);
#ifdef _OPENMP
#pragma omp parallel for num_threads(threads) schedule(static)
#endif
            for (int64_t i = 0; i < Sq; i++) {
                float *row = S + i * Sk;
                const int64_t hi = causal ? i + Sk - Sq + 1 : Sk;
                float m = -INFINITY, l = 0.0f;
                for (int64_t j = 0; j < hi && j < Sk; j++) m = row[j] > m ? row[j] : m;
                for (int64_t j = 0; j < Sk; j++) {
                    row[j] = (j < hi && m != -INFINITY) ? expf(row[j] - m) : 0.0f;
                    l += row[j];
                }
                const float inv = l > 0.0f ? 1.0f / l : 0.0f;
                for (int64_t j = 0; j < Sk; j++) row[j] *= inv;
            }
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)Sq, (int)dv, (int)Sk, 1.0f, S,
                        (int)Sk, vh, (int)(Hk * dv), 0.0f, oh, (int)(H * dv));
        }
    }
    free(S);
    return 0;
}
#endif

/* ---- one measurement -------------------------------------------------------- */

typedef struct bench_cfg {
    int64_t batch, heads, heads_k;
    int causal, threads, repeats, warmup, check;
    const char *isa;
    double peak;
    FILE *csv;
} bench_cfg;

/* Run impl once. Returns 0 on success; prints the error and returns 2 otherwise. */
static int run_once(const char *impl, const fa_tensor *q, const fa_tensor *k, const fa_tensor *v,
                    fa_tensor *o, const bench_cfg *cfg)
{
#ifdef FA_HAVE_BLAS
    if (strcmp(impl, "blas") == 0) {
        if (blas_attention(q, k, v, o, cfg->causal, cfg->threads) != 0) {
            fprintf(stderr, "flashattn bench: blas: out of memory\n");
            return 2;
        }
        return 0;
    }
#endif
    fa_options opt = fa_options_default();
    opt.causal = cfg->causal;
    opt.num_threads = cfg->threads;
    opt.standard_max_bytes = (size_t)8 << 30;
    fa_status st = fa_impl_from_name(impl, &opt.impl);
    if (st == FA_OK) st = fa_forward(q, k, v, o, NULL, &opt);
    if (st != FA_OK) {
        fprintf(stderr, "flashattn bench: %s: %s\n", impl, fa_last_error());
        return 2;
    }
    return 0;
}

/* Max |O - reference| over the last CHECK_ROWS rows of every (batch, head). */
static double check_rows(const fa_tensor *q, const fa_tensor *k, const fa_tensor *v, const fa_tensor *o,
                         const bench_cfg *cfg)
{
    const int64_t B = q->shape[0], Sq = q->shape[1], H = q->shape[2], dv = v->shape[3];
    const int64_t r = Sq < CHECK_ROWS ? Sq : CHECK_ROWS;
    fa_tensor qs = *q;
    qs.shape[1] = r;
    qs.data = (float *)q->data + (Sq - r) * q->stride[1];
    double *ref = malloc((size_t)(B * r * H * dv) * sizeof(double)); /* [B][r][H][dv] */
    if (!ref) return INFINITY;
    int64_t shape[4] = {B, r, H, dv};
    fa_tensor os;
    fa_tensor_make(&os, ref, FA_F64, 4, shape, NULL);
    fa_options opt = fa_options_default();
    opt.causal = cfg->causal;
    opt.impl = FA_IMPL_REFERENCE;
    opt.num_threads = cfg->threads;
    double err = INFINITY;
    if (fa_forward(&qs, k, v, &os, NULL, &opt) == FA_OK) {
        err = 0.0;
        for (int64_t b = 0; b < B; b++)
            for (int64_t i = 0; i < r; i++)
                for (int64_t h = 0; h < H; h++)
                    for (int64_t c = 0; c < dv; c++) {
                        double want = ref[((b * r + i) * H + h) * dv + c];
                        double got = ((const float *)o->data)[fa_off4(o, b, Sq - r + i, h, c)];
                        double e = fabs(got - want);
                        if (!(e <= err)) err = e; /* NaN propagates */
                    }
    }
    free(ref);
    return err;
}

static int bench_one(const char *impl, int64_t n, int64_t d, const bench_cfg *cfg, uint64_t *rng)
{
    const int64_t B = cfg->batch, H = cfg->heads, Hk = cfg->heads_k;
    int64_t qs[4] = {B, n, H, d}, ks[4] = {B, n, Hk, d};
    size_t nq = (size_t)(B * n * H * d), nk = (size_t)(B * n * Hk * d);
    float *qd = malloc(nq * sizeof(float)), *kd = malloc(nk * sizeof(float));
    float *vd = malloc(nk * sizeof(float)), *od = malloc(nq * sizeof(float));
    if (!qd || !kd || !vd || !od) {
        free(qd); free(kd); free(vd); free(od);
        fprintf(stderr, "flashattn bench: out of memory for N=%lld d=%lld\n", (long long)n, (long long)d);
        return 2;
    }
    for (size_t i = 0; i < nq; i++) {
        *rng = *rng * 6364136223846793005ull + 1442695040888963407ull;
        qd[i] = (float)((*rng >> 40) * 0x1.0p-24 * 2.0 - 1.0);
    }
    for (size_t i = 0; i < nk; i++) {
        *rng = *rng * 6364136223846793005ull + 1442695040888963407ull;
        kd[i] = (float)((*rng >> 40) * 0x1.0p-24 * 2.0 - 1.0);
        *rng = *rng * 6364136223846793005ull + 1442695040888963407ull;
        vd[i] = (float)((*rng >> 40) * 0x1.0p-24 * 2.0 - 1.0);
    }
    fa_tensor q, k, v, o;
    fa_tensor_make(&q, qd, FA_F32, 4, qs, NULL);
    fa_tensor_make(&k, kd, FA_F32, 4, ks, NULL);
    fa_tensor_make(&v, vd, FA_F32, 4, ks, NULL);
    fa_tensor_make(&o, od, FA_F32, 4, qs, NULL);

    int rc = 0;
    reset_peak_rss();
    fa_alloc_stats_reset();
    /* 1. check first */
    memset(od, 0xff, nq * sizeof(float));
    if ((rc = run_once(impl, &q, &k, &v, &o, cfg)) != 0) goto out;
    double err = cfg->check ? check_rows(&q, &k, &v, &o, cfg) : NAN;
    if (cfg->check && !(err <= 1e-4)) {
        fprintf(stderr, "flashattn bench: %s N=%lld d=%lld: max error %.3g against the reference; not timing a wrong result\n",
                impl, (long long)n, (long long)d, err);
        rc = 1;
        goto out;
    }
    /* 2. warm up, then repeat */
    for (int w = 1; w < cfg->warmup; w++) run_once(impl, &q, &k, &v, &o, cfg);
    double times[256];
    int reps = 0;
    double spent = 0.0;
    while (reps < 256 && (reps < cfg->repeats || (spent < 1.0 && reps < 3 * cfg->repeats))) {
        double t0 = now_s();
        run_once(impl, &q, &k, &v, &o, cfg);
        times[reps] = now_s() - t0;
        spent += times[reps++];
        if (isatty(2)) fprintf(stderr, "\r  %s N=%lld d=%lld: run %d", impl, (long long)n, (long long)d, reps);
    }
    if (isatty(2)) fprintf(stderr, "\r%60s\r", "");
    qsort(times, (size_t)reps, sizeof(double), cmp_double);
    double med = reps % 2 ? times[reps / 2] : 0.5 * (times[reps / 2 - 1] + times[reps / 2]);
    double flops = 4.0 * (double)n * (double)n * (double)d * (double)(B * H);
    if (cfg->causal) flops *= 0.5;
    double gflops = flops / med / 1e9;
    double frac = cfg->peak > 0 ? gflops / cfg->peak : 0.0;
    fa_alloc_stats as;
    fa_alloc_stats_get(&as);
    double rss = peak_rss_mib();
    const char *isa = strcmp(impl, "blas") == 0 ? "openblas" : cfg->isa;
    printf("%-9s %-8s %6lld %4lld %9.2f %9.2f %9.2f %8.1f %6.1f%% %9.1f %9.1f %9.1e\n", impl, isa,
           (long long)n, (long long)d, med * 1e3, times[0] * 1e3, times[reps - 1] * 1e3, gflops,
           100.0 * frac, rss, (double)as.peak_bytes / 1048576.0, err);
    fflush(stdout);
    if (cfg->csv)
        fprintf(cfg->csv, "%s,fwd,%s,%d,%lld,%lld,%lld,%lld,%lld,%lld,%d,%.4f,%.4f,%.4f,%.2f,%.4f,%.1f\n", impl,
                isa, cfg->threads, (long long)B, (long long)H, (long long)Hk, (long long)n, (long long)n,
                (long long)d, cfg->causal, med * 1e3, times[0] * 1e3, times[reps - 1] * 1e3, gflops, frac,
                rss);
out:
    free(qd); free(kd); free(vd); free(od);
    return rc;
}

static int bench_main(int argc, char **argv)
{
    const char *impls = NULL, *csv_path = NULL;
    long ns[MAX_LIST] = {1024, 2048, 4096, 8192}, ds[MAX_LIST] = {64, 128};
    int nn = 4, nd = 2;
    bench_cfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.batch = 1;
    cfg.heads = 8;
    cfg.heads_k = 0;
    cfg.repeats = 5;
    cfg.warmup = 1;
    cfg.check = 1;
    cfg.threads = fa_default_threads();

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *val = (i + 1 < argc) ? argv[i + 1] : NULL;
#define NEED_VAL()                                                                      \
    do {                                                                                \
        if (!val) {                                                                     \
            fprintf(stderr, "flashattn bench: %s needs a value\n", a);                  \
            return 2;                                                                   \
        }                                                                               \
        i++;                                                                            \
    } while (0)
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(bench_usage, stdout);
            return 0;
        } else if (!strcmp(a, "--impl")) {
            NEED_VAL(); impls = val;
        } else if (!strcmp(a, "--n")) {
            NEED_VAL();
            if ((nn = parse_list(val, ns, MAX_LIST)) <= 0) {
                fprintf(stderr, "flashattn bench: --n: expected a comma-separated list of positive integers, got '%s'\n", val);
                return 2;
            }
        } else if (!strcmp(a, "--d")) {
            NEED_VAL();
            if ((nd = parse_list(val, ds, MAX_LIST)) <= 0) {
                fprintf(stderr, "flashattn bench: --d: expected a comma-separated list of positive integers, got '%s'\n", val);
                return 2;
            }
        } else if (!strcmp(a, "--batch") || !strcmp(a, "--heads") || !strcmp(a, "--heads-k") ||
                   !strcmp(a, "--threads") || !strcmp(a, "--repeats") || !strcmp(a, "--warmup")) {
            NEED_VAL();
            char *end;
            long x = strtol(val, &end, 10);
            if (*end || x < (strcmp(a, "--warmup") ? 1 : 0) || x > 1000000) {
                fprintf(stderr, "flashattn bench: %s: invalid value '%s'\n", a, val);
                return 2;
            }
            if (!strcmp(a, "--batch")) cfg.batch = x;
            else if (!strcmp(a, "--heads")) cfg.heads = x;
            else if (!strcmp(a, "--heads-k")) cfg.heads_k = x;
            else if (!strcmp(a, "--threads")) cfg.threads = (int)x;
            else if (!strcmp(a, "--repeats")) cfg.repeats = (int)(x > 200 ? 200 : x);
            else cfg.warmup = (int)x;
        } else if (!strcmp(a, "--causal")) {
            cfg.causal = 1;
        } else if (!strcmp(a, "--no-check")) {
            cfg.check = 0;
        } else if (!strcmp(a, "--csv")) {
            NEED_VAL(); csv_path = val;
        } else {
            fprintf(stderr, "flashattn bench: unknown option '%s' (see flashattn bench --help)\n", a);
            return 2;
        }
#undef NEED_VAL
    }
    if (!cfg.heads_k) cfg.heads_k = cfg.heads;
    if (cfg.heads % cfg.heads_k) {
        fprintf(stderr, "flashattn bench: --heads %lld is not a multiple of --heads-k %lld\n",
                (long long)cfg.heads, (long long)cfg.heads_k);
        return 2;
    }
    if (!impls) {
#ifdef FA_HAVE_BLAS
        impls = "flash,standard,blas";
#else
        impls = "flash,standard";
#endif
    }
    /* validate the impl list before doing any work */
    char list[256];
    snprintf(list, sizeof list, "%s", impls);
    const char *names[8];
    int nimpl = 0;
    for (char *tok = strtok(list, ","); tok && nimpl < 8; tok = strtok(NULL, ",")) {
        fa_impl dummy;
        if (strcmp(tok, "blas") == 0) {
#ifndef FA_HAVE_BLAS
            fprintf(stderr, "flashattn bench: impl 'blas' is not built (install libopenblas-dev and rebuild)\n");
            return 2;
#endif
        } else if (fa_impl_from_name(tok, &dummy) != FA_OK) {
            fprintf(stderr, "flashattn bench: %s\n", fa_last_error());
            return 2;
        }
        names[nimpl++] = tok;
    }

    fa_cpu_info info;
    if (fa_get_cpu_info(&info) != FA_OK) {
        fprintf(stderr, "flashattn bench: %s\n", fa_last_error());
        return 2;
    }
    cfg.isa = info.isa;
#ifdef FA_HAVE_BLAS
    openblas_set_num_threads(cfg.threads);
#endif
    char model[256];
    cpu_model(model, sizeof model);
    cfg.peak = measure_peak(info.isa, cfg.threads);
    printf("flashattn bench — %s, %ld logical CPUs\n", model, sysconf(_SC_NPROCESSORS_ONLN));
    printf("ISA %s (%d float32 lanes), %d thread%s, measured FMA peak %.1f GFLOP/s\n", info.isa,
           info.simd_width, cfg.threads, cfg.threads == 1 ? "" : "s", cfg.peak);
    printf("float32, batch %lld, heads %lld (kv heads %lld), %s; FLOPs = 4*N^2*d per head%s\n",
           (long long)cfg.batch, (long long)cfg.heads, (long long)cfg.heads_k,
           cfg.causal ? "causal" : "non-causal", cfg.causal ? " / 2" : "");
    printf("times are median (min, max) of >= %d runs after %d warm-up; check = max |err| of the last %d rows vs float64\n\n",
           cfg.repeats, cfg.warmup, CHECK_ROWS);
    printf("%-9s %-8s %6s %4s %9s %9s %9s %8s %7s %9s %9s %9s\n", "impl", "isa", "N", "d", "med_ms",
           "min_ms", "max_ms", "GFLOP/s", "peak", "rss_MiB", "lib_MiB", "check");

    if (csv_path) {
        cfg.csv = fopen(csv_path, "w");
        if (!cfg.csv) {
            fprintf(stderr, "flashattn bench: %s: %s\n", csv_path, strerror(errno));
            return 2;
        }
        fprintf(cfg.csv, "impl,pass,isa,threads,batch,heads,heads_k,seqlen_q,seqlen_k,d,causal,median_ms,min_ms,max_ms,gflops,peak_fraction,peak_rss_mib\n");
    }
    uint64_t rng = 0x5eed1234abcdull;
    int rc = 0;
    for (int a = 0; a < nd; a++)
        for (int b = 0; b < nn; b++)
            for (int c = 0; c < nimpl; c++) {
                int r = bench_one(names[c], ns[b], ds[a], &cfg, &rng);
                if (r > rc) rc = r;
            }
    if (cfg.csv && fclose(cfg.csv) != 0) {
        fprintf(stderr, "flashattn bench: %s: write failed\n", csv_path);
        rc = 2;
    }
    return rc;
}

int cmd_bench(int argc, char **argv)
{
    cli_guard_runtime_exit();
    return cli_finish(bench_main(argc, argv));
}
