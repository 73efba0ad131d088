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
 *      measurement through /proc/self/clear_refs (Linux), plus the peak bytes
 *      the library itself allocated during the measured runs (its counting
 *      allocator, fa_alloc_stats).
 *
 * Flash rows run through an fa_context made per row (row_context), as a
 * caller's loop keeps one: the timed runs reuse the scratch the check sized.
 *
 * `--pass bwd` times fa_backward (flash or reference) given O and LSE from one
 * forward run, with FLOPs = 2.5 x the forward's (FlashAttention-2's count:
 * five N^2 d matrix products instead of two), halved when causal. Its check is
 * dQ of the last CHECK_ROWS query rows against the float64 reference backward
 * of those rows alone (dQ of a row depends only on that row of Q and dO, and
 * slicing the last rows keeps the mask alignment), under bench's own rule
 * max|err| <= 1e-6 + 1e-4 max|ref| (check-grad's explicit --atol/--rtol form at its f32 defaults).
 *
 * Sanity first: every option is range-checked (threads as for run/check),
 * lists are at most MAX_LIST long and never cut, and before any work the
 * memory each configuration needs is estimated (the arrays, the N x N scores
 * of standard and blas, the reference's check buffers) and refused if it
 * exceeds MemAvailable (/proc/meminfo), and the total time is bounded below
 * by its FLOPs at the measured FMA peak and refused above --max-seconds;
 * both messages carry the estimate. The CSV is written to a temporary beside
 * it, row by row as they finish, and renamed over it at the end: an
 * interrupted bench (SIGINT/SIGTERM) leaves the previous CSV intact.
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

#ifdef _OPENMP
#include <omp.h>
#endif

#ifdef FA_HAVE_BLAS
#include <dlfcn.h>
#endif

#define CHECK_ROWS 8
#define MAX_LIST 16

/* The CSV header (docs/cli.md): columns are only ever appended. gbps and
 * bw_fraction are filled by decode rows and empty for attention rows;
 * kv_dtype, num_splits, page_size and kv_cache (cold or warm) likewise. */
static const char csv_header[] =
    "impl,pass,isa,threads,batch,heads,heads_k,seqlen_q,seqlen_k,d,causal,median_ms,min_ms,max_ms,gflops,"
    "peak_fraction,peak_rss_mib,gbps,bw_fraction,lib_peak_mib,softcap,window_left,window_right,kv_dtype,num_splits,page_size,"
    "dtype,kv_cache\n";

static const char *bench_usage =
    "usage: flashattn bench [--impl flash,standard,blas] [--pass fwd,bwd] [--n 1024,2048,4096,8192]\n"
    "                       [--d 64,128] [--batch B] [--heads H] [--heads-k HK] [--causal]\n"
    "                       [--window L,R] [--softcap C] [--dtype f32|f16|bf16]\n"
    "                       [--threads T,...] [--repeats R] [--warmup W] [--csv FILE] [--no-check]\n"
    "                       [--max-seconds S]\n"
    "       flashattn bench --seqlen-q S [--kv-dtype f32,f16,bf16] [--num-splits N,...] [--page-size P,...]\n"
    "                       [--n KEYS,...] [--d ...] [--batch B] [--heads H] [--heads-k HK] ...  (decode rows)\n"
    "Times attention implementations side by side on random float32 inputs and\n"
    "reports median/min/max time, GFLOP/s (4*Sq*Sk*d per head, half if causal,\n"
    "4*d per visible (query, key) pair with --window; x2.5 for --pass bwd), the\n"
    "fraction of a measured FMA peak, and peak memory.\n"
    "\n"
    "  --impl LIST     flash, standard, reference, blas (if built); bwd: flash, reference\n"
    "  --pass LIST     fwd (default) and/or bwd (fa_backward given O and LSE)\n"
    "  --causal, --window L,R, --softcap C   the mask options of run (each one's cost is measured)\n"
    "  --dtype T       dtype of Q, K, V (and dO): f32 (default), f16 or bf16; O and gradients f32\n"
    "  --n, --d LIST   up to 16 comma-separated values each\n"
    "  --batch B, --heads H, --heads-k HK   1..1000000 (HK divides H; default HK = H)\n"
    "  --threads LIST  1..4096 each (default: OMP_NUM_THREADS or all cores); with several, every\n"
    "                  row runs at each count back to back, a peak is measured per count, and\n"
    "                  scaling lines follow the table (decode rows take one value)\n"
    "  --repeats R     1..200 timed runs (more, up to 3R, while under 1 s in all)\n"
    "  --warmup W      0..100 warm-up runs (the checked run counts as the first)\n"
    "  --max-seconds S refuse a bench whose time at the measured FMA peak exceeds S (default 3600)\n"
    "  --csv FILE      also write the rows as CSV (replaced atomically at the end)\n"
    "Decode rows (--seqlen-q S, 1..65536): S query rows per head against a KV cache of --n keys\n"
    "(default 32768), reporting GB/s of K/V read and its fraction of a read bandwidth bench measures:\n"
    "  --kv-dtype LIST   cache dtypes f32, f16, bf16 (default f32)\n"
    "  --num-splits LIST split-KV: 0 heuristic (default), 1 none, N splits (0..128)\n"
    "  --page-size LIST  0 contiguous (default), else a paged cache of pages of P rows (1..65536)\n"
    "  --warm-cache      time with the cache left in the CPU caches by the previous run (default: cold,\n"
    "                    a read of twice the last-level cache before every run, not timed)\n"
    "Options take their value as the next argument or after '=' (--n=64).\n"
    "Memory is estimated before any work and checked against MemAvailable.\n";

/* ---- small helpers --------------------------------------------------------- */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/*
 * A comma-separated list of integers in [lo, hi], at most MAX_LIST of them.
 * Returns the count, or -1 after printing what is wrong (an empty entry, a
 * value out of range, or too many values: never cut silently).
 */
static int parse_list(const char *opt, const char *s, long long lo, long long hi, long long *out)
{
    int n = 0;
    const char *p = s;
    for (;;) {
        char item[64];
        size_t len = strcspn(p, ",");
        if (len == 0 || len >= sizeof item) {
            cli_die("bench: %s: expected a comma-separated list of integers in %lld..%lld, got '%s'", opt, lo, hi, s);
            return -1;
        }
        if (n == MAX_LIST) {
            cli_die("bench: %s: at most %d values, got more in '%s'", opt, MAX_LIST, s);
            return -1;
        }
        memcpy(item, p, len);
        item[len] = '\0';
        char *end;
        errno = 0;
        long long v = strtoll(item, &end, 10);
        /* a digit or '-' first: strtoll also skips blanks and takes '+' */
        const int lead = (item[0] >= '0' && item[0] <= '9') || item[0] == '-';
        if (*end || errno == ERANGE || !lead || v < lo || v > hi) {
            cli_die("bench: %s: expected integers in %lld..%lld, got '%s'", opt, lo, hi, item);
            return -1;
        }
        out[n++] = v;
        if (p[len] == '\0') return n;
        p += len + 1;
    }
}

/* Split a comma-separated list of names into names[max] (pointing into buf). */
static int split_names(const char *opt, const char *s, char *buf, size_t cap, const char **names, int max)
{
    if (strlen(s) >= cap) {
        cli_die("bench: %s: list too long: '%s'", opt, s);
        return -1;
    }
    strcpy(buf, s);
    int n = 0;
    char *p = buf;
    for (;;) {
        size_t len = strcspn(p, ",");
        if (len == 0) {
            cli_die("bench: %s: empty name in '%s'", opt, s);
            return -1;
        }
        if (n == max) {
            cli_die("bench: %s: at most %d names, got more in '%s'", opt, max, s);
            return -1;
        }
        names[n++] = p;
        if (p[len] == '\0') return n;
        p[len] = '\0';
        p += len + 1;
    }
}

/* MemAvailable from /proc/meminfo in bytes, or -1 if unknown. */
static double mem_available(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return -1;
    char line[256];
    double bytes = -1;
    while (fgets(line, sizeof line, f)) {
        long long kb;
        if (sscanf(line, "MemAvailable: %lld kB", &kb) == 1) {
            bytes = (double)kb * 1024.0;
            break;
        }
    }
    fclose(f);
    return bytes;
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

/* With FA_AMX=1 the bf16 rows' products run on AMX tiles: say so, and that the peak is not theirs. */
static void amx_note(const char *isa)
{
    const char *e = getenv("FA_AMX");
    if (!e || strcmp(e, "1") != 0) return;
    if (fa_amx_available() && strcmp(isa, "avx512") != 0)
        printf("FA_AMX=1: off with the %s kernel table (FA_ISA): AMX runs beside the AVX-512 table only; every\n"
               "row runs the float32 path\n", isa);
    else if (fa_amx_available())
        printf("FA_AMX=1: bf16 rows compute their products on AMX tiles (isa column `amx` where every timed run\n"
               "did; float32 rows as always); their \"peak\" column is still the float32 FMA peak above, not the\n"
               "tiles' (over 100%% is possible)\n");
    else
        printf("FA_AMX=1: AMX is not available here (%s); every row runs the float32 path\n", fa_amx_why_not());
}

/* FMA peak in GFLOP/s for the ISA in use on `threads` threads (the library's
 * timed loop: calibrated to run ~0.3 s, best of 3). */
static double measure_peak(const char *isa, int threads)
{
    double gflops = 0.0;
    if (fa_measure_fma_peak(isa, threads, 0.3, &gflops) != FA_OK) return 0.0;
    return gflops;
}

typedef struct bench_cfg {
    int64_t batch, heads, heads_k;
    int causal, threads, repeats, warmup, check;
    int64_t window_left, window_right; /* --window; -1 = unbounded */
    double softcap;                    /* --softcap; 0 = off */
    fa_dtype dtype;                    /* --dtype of Q, K, V, dO */
    const char *isa;
    double peak;
    fa_outfile *csv;
    int *csv_rows; /* rows written to it: with none and an error, the old file stays as it was */
    int show_threads; /* a thread list was given: rows print their thread count */
    fa_context *ctx; /* flash rows: one context per row (bench_one, decode_one), as a caller's loop keeps one */
    int most_threads; /* the largest of the --threads list (blas's S buffers) */
} bench_cfg;

static double run_flops(int bwd, double n, double d, const struct bench_cfg *cfg);

/* ---- standard attention on BLAS ------------------------------------------- */

#ifdef FA_HAVE_BLAS
/*
 * OpenBLAS, opened by its soname (FA_BLAS_SONAME, from the build's -lopenblas) when a
 * bench row asks for it, not linked: a linked OpenBLAS runs its constructor in every
 * command, starting a thread pool whose threads each allocate a 128 MiB buffer, and
 * under an address-space limit (ulimit -v 150000) those threads retry the allocation
 * forever, so that even `flashattn --version` never exited. Only cblas_sgemm and
 * openblas_set_num_threads are used; the CBLAS enums are ints of fixed value.
 */
enum { ROW_MAJOR = 101, NO_TRANS = 111, TRANS = 112 }; /* CblasRowMajor, CblasNoTrans, CblasTrans */
typedef void (*sgemm_fn)(int, int, int, int, int, int, float, const float *, int, const float *, int, float,
                         float *, int);
static sgemm_fn blas_sgemm;
static void (*blas_threads)(int);
static int blas_parallel; /* openblas_get_parallel(): 0 a serial build (no concurrent calls), 1 pthreads, 2 OpenMP */

/* A /proc/self/statm field (1: the address space in use, 6: data and stack), in bytes. */
static size_t statm_bytes(int field)
{
    unsigned long v[7];
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f) return 0;
    const int got = fscanf(f, "%lu %lu %lu %lu %lu %lu %lu", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6]);
    fclose(f);
    return got == 7 ? (size_t)v[field - 1] * (size_t)sysconf(_SC_PAGESIZE) : 0;
}

/*
 * Whether OpenBLAS and the largest blas row fit what `ulimit -v` (RLIMIT_AS) and `ulimit -d`
 * (RLIMIT_DATA, which counts private mappings since Linux 4.7) leave. OpenBLAS takes 128 MiB
 * (its x86-64 BUFFER_SIZE) for each thread of its pool (CPUs - 1 when it is opened, up to
 * `threads` - 1 when a row sets more) and for each thread that calls sgemm (up to `threads`
 * in blas_attention), and where the limit leaves less it retries the allocation forever (a
 * loop in its blas_memory_alloc), so bench would hang instead of failing. row_bytes: the
 * largest blas row's own memory (estimate_bytes). 1 when all fit or there is no limit.
 */
static int blas_fits(int threads, double row_bytes, size_t *need_mib, size_t *room_mib)
{
    const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    const size_t pool = (size_t)(threads > cpus ? threads : cpus), buffers = pool - 1 + (size_t)threads + 1;
    *need_mib = buffers * 128 + (size_t)(row_bytes / 1048576.0);
    *room_mib = SIZE_MAX;
    static const int res[2] = {RLIMIT_AS, RLIMIT_DATA}, field[2] = {1, 6};
    for (int k = 0; k < 2; k++) {
        struct rlimit rl;
        if (getrlimit(res[k], &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) continue;
        const size_t used = statm_bytes(field[k]);
        const size_t room = rl.rlim_cur > used ? (size_t)((rl.rlim_cur - used) >> 20) : 0;
        if (room < *room_mib) *room_mib = room;
    }
    return *room_mib >= *need_mib;
}

/* Whether blas rows of up to `threads` threads can run here (blas_fits). Returns 0, or 2
 * (with `report`, after printing why not). */
static int blas_room(int report, int threads, double row_bytes)
{
    size_t need, room;
    if (blas_fits(threads, row_bytes, &need, &room)) return 0;
    return report ? cli_die("bench: impl 'blas': OpenBLAS takes 128 MiB of address space for each of its threads "
                            "and callers (~%zu MiB here with the largest row) and the limits (ulimit -v / -d) "
                            "leave %zu MiB; raise them or leave blas out",
                            need, room)
                  : 2;
}

/* Open OpenBLAS once, for rows of up to `threads` threads: only once a blas row is sure to
 * run (its thread pool starts here, and under a tight limit would hold the exit). Returns 0,
 * or 2 (with `report`, after printing why it cannot be). */
static int blas_open(int report, int threads, double row_bytes)
{
    if (blas_sgemm) return 0;
    if (blas_room(report, threads, row_bytes) != 0) return 2;
    void *lib = dlopen(FA_BLAS_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (!lib) return report ? cli_die("bench: impl 'blas': cannot load %s (%s)", FA_BLAS_SONAME, dlerror()) : 2;
    void *f = dlsym(lib, "cblas_sgemm"), *t = dlsym(lib, "openblas_set_num_threads");
    void *par = dlsym(lib, "openblas_get_parallel"), *conf = dlsym(lib, "openblas_get_config");
    const char *why = !f ? "has no cblas_sgemm" : NULL;
    if (!why && conf) { /* the prototype above takes int: a 64-bit-integer build would misread it */
        char *(*config)(void);
        memcpy(&config, &conf, sizeof conf);
        const char *c = config();
        if (c && strstr(c, "USE64BITINT")) why = "is built with 64-bit integers (INTERFACE64); bench calls it with int";
    }
    if (why) {
        dlclose(lib);
        return report ? cli_die("bench: impl 'blas': %s %s", FA_BLAS_SONAME, why) : 2;
    }
    /* object to function pointer through memcpy: POSIX dlsym's own idiom, no ISO C cast */
    memcpy(&blas_sgemm, &f, sizeof f);
    if (t) memcpy(&blas_threads, &t, sizeof t);
    if (par) {
        int (*get_parallel)(void);
        memcpy(&get_parallel, &par, sizeof par);
        blas_parallel = get_parallel();
    }
    return 0;
}

/* Rows [i0, i1) of one head's scores S [Sq][Sk] into P in place: softcap, the mask
 * (bottom-right, as the library), softmax with 1/l applied to P (standard attention). */
static void blas_softmax_rows(float *S, int64_t i0, int64_t i1, int64_t Sq, int64_t Sk, int64_t wl, int64_t wr,
                              float cap)
{
    for (int64_t i = i0; i < i1; i++) {
        float *row = S + i * Sk;
        const int64_t diag = i + Sk - Sq;
        const int64_t lo = wl >= 0 && diag - wl > 0 ? diag - wl : 0;
        const int64_t hi = wr >= 0 && diag + wr + 1 < Sk ? diag + wr + 1 : Sk;
        float m = -INFINITY, l = 0.0f;
        if (cap > 0.0f)
            for (int64_t j = lo; j < hi; j++) row[j] = cap * tanhf(row[j] / cap);
        for (int64_t j = lo; j < hi; j++) m = row[j] > m ? row[j] : m;
        for (int64_t j = 0; j < Sk; j++) {
            row[j] = (j >= lo && j < hi && m != -INFINITY) ? expf(row[j] - m) : 0.0f;
            l += row[j];
        }
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
        for (int64_t j = 0; j < Sk; j++) row[j] *= inv;
    }
}

/* One head of standard attention: S = scale Q K^T, P = softmax(S) in place (its rows split over
 * `rows_threads` OpenMP threads when > 1), O = P V. */
static void blas_head(const fa_tensor *q, const fa_tensor *k, const fa_tensor *v, fa_tensor *o, const bench_cfg *cfg,
                      int64_t bh, float *S, int rows_threads)
{
    const int64_t wl = cfg->window_left, wr = cfg->causal ? 0 : cfg->window_right;
    const float cap = (float)cfg->softcap;
    const int64_t Sq = q->shape[1], H = q->shape[2], d = q->shape[3];
    const int64_t Sk = k->shape[1], Hk = k->shape[2], dv = v->shape[3];
    const int64_t b = bh / H, h = bh % H, group = H / Hk;
    const float *qh = (const float *)q->data + (b * Sq * H + h) * d;
    const float *kh = (const float *)k->data + (b * Sk * Hk + h / group) * d;
    const float *vh = (const float *)v->data + (b * Sk * Hk + h / group) * dv;
    float *oh = (float *)o->data + (b * Sq * H + h) * dv;
    blas_sgemm(ROW_MAJOR, NO_TRANS, TRANS, (int)Sq, (int)Sk, (int)d, 1.0f / sqrtf((float)d), qh, (int)(H * d), kh,
               (int)(Hk * d), 0.0f, S, (int)Sk);
    if (rows_threads > 1) {
#ifdef _OPENMP
#pragma omp parallel for num_threads(rows_threads) schedule(static)
#endif
        for (int64_t i = 0; i < Sq; i++) blas_softmax_rows(S, i, i + 1, Sq, Sk, wl, wr, cap);
    } else {
        blas_softmax_rows(S, 0, Sq, Sq, Sk, wl, wr, cap);
    }
    blas_sgemm(ROW_MAJOR, NO_TRANS, NO_TRANS, (int)Sq, (int)dv, (int)Sk, 1.0f, S, (int)Sk, vh, (int)(Hk * dv), 0.0f,
               oh, (int)(H * dv));
}

/* Whether blas_attention gives each OpenMP thread whole heads (sgemm on one thread): OpenBLAS
 * must take concurrent calls (a threaded build) and let its threads be set, and the heads must
 * split evenly enough (a multiple of the threads, or at least 4 a thread). */
static int blas_by_head(int64_t heads, int threads)
{
#ifdef _OPENMP
    return threads > 1 && blas_threads && blas_parallel != 0 && heads >= threads &&
           (heads % threads == 0 || heads >= 4 * (int64_t)threads);
#else
    (void)heads, (void)threads;
    return 0;
#endif
}

/*
 * Standard attention on OpenBLAS, per head: S = scale Q K^T (sgemm), P = softmax(S) in place,
 * O = P V (sgemm); q, k, v, o float32 BSHD contiguous. Where blas_by_head, each OpenMP thread
 * takes whole heads with OpenBLAS on one thread — one thread pool in play. Otherwise sgemm is
 * OpenBLAS's threaded one and the softmax rows are split with OpenMP, one head after another:
 * those two pools alternate, each one's threads spinning while the other's work, which on 2
 * cores made this baseline 1.1-2.1x slower when it was the only scheme (docs/performance.md,
 * "Twentieth session"). The softmax is scalar libm (expf, tanhf), not the library's SIMD
 * kernel: the figures are an upper bound on flash's lead. Returns 0, or -1 if out of memory.
 */
static int blas_attention(const fa_tensor *q, const fa_tensor *k, const fa_tensor *v, fa_tensor *o,
                          const bench_cfg *cfg)
{
    const int threads = cfg->threads;
    const int64_t heads = q->shape[0] * q->shape[2], Sq = q->shape[1], Sk = k->shape[1];
    const int by_head = blas_by_head(heads, threads), team = by_head ? threads : 1;
    float *S = malloc((size_t)team * (size_t)Sq * (size_t)Sk * sizeof(float)); /* [team][Sq][Sk] */
    if (!S) return -1;
#ifdef _OPENMP
    const int omp_default = omp_get_max_threads(); /* an OpenMP build of OpenBLAS sets it with its own */
#endif
    if (blas_threads) blas_threads(by_head ? 1 : threads);
    if (by_head) {
#ifdef _OPENMP
#pragma omp parallel for num_threads(team) schedule(dynamic, 1)
#endif
        for (int64_t bh = 0; bh < heads; bh++) {
#ifdef _OPENMP
            float *St = S + (size_t)omp_get_thread_num() * (size_t)Sq * (size_t)Sk;
#else
            float *St = S;
#endif
            blas_head(q, k, v, o, cfg, bh, St, 1);
        }
    } else {
        for (int64_t bh = 0; bh < heads; bh++) blas_head(q, k, v, o, cfg, bh, S, threads);
    }
#ifdef _OPENMP
    omp_set_num_threads(omp_default);
#endif
    free(S);
    return 0;
}
#endif

/* ---- one measurement -------------------------------------------------------- */

/* The mask options of the bench into opt. */
static void bench_mask(fa_options *opt, const bench_cfg *cfg)
{
    opt->causal = cfg->causal;
    opt->window_left = cfg->window_left;
    if (!cfg->causal) opt->window_right = cfg->window_right;
    opt->softcap = cfg->softcap;
}

/* Run impl's forward once. Returns 0 on success; prints the error and returns 2 otherwise. */
static int run_once(const char *impl, const fa_tensor *q, const fa_tensor *k, const fa_tensor *v,
                    fa_tensor *o, fa_tensor *lse, const bench_cfg *cfg)
{
#ifdef FA_HAVE_BLAS
    if (strcmp(impl, "blas") == 0) {
        if (blas_attention(q, k, v, o, cfg) != 0) {
            fprintf(stderr, "flashattn bench: blas: out of memory\n");
            return 2;
        }
        return 0;
    }
#endif
    fa_options opt = fa_options_default();
    bench_mask(&opt, cfg);
    opt.num_threads = cfg->threads;
    opt.standard_max_bytes = (size_t)8 << 30;
    opt.context = cfg->ctx;
    fa_status st = fa_impl_from_name(impl, &opt.impl);
    if (st == FA_OK) st = fa_forward(q, k, v, o, lse, &opt);
    if (st != FA_OK) {
        fprintf(stderr, "flashattn bench: %s: %s\n", impl, fa_last_error());
        return 2;
    }
    return 0;
}

/* The tensors of one backward measurement. */
typedef struct bwd_io {
    fa_tensor o, lse, dout, dq, dk, dv;
} bwd_io;

/* Run impl's backward once (O and LSE given). Returns 0, or prints and returns 2. */
static int run_bwd_once(const char *impl, const fa_tensor *q, const fa_tensor *k, const fa_tensor *v,
                        bwd_io *io, const bench_cfg *cfg)
{
    fa_options opt = fa_options_default();
    bench_mask(&opt, cfg);
    opt.num_threads = cfg->threads;
    opt.context = cfg->ctx;
    fa_status st = fa_impl_from_name(impl, &opt.impl);
    if (st == FA_OK)
        st = fa_backward(q, k, v, &io->o, &io->lse, &io->dout, &io->dq, &io->dk, &io->dv, &opt);
    if (st != FA_OK) {
        fprintf(stderr, "flashattn bench: %s backward: %s\n", impl, fa_last_error());
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
    qs.data = (char *)q->data + (Sq - r) * q->stride[1] * (int64_t)fa_dtype_size(q->dtype);
    double *ref = malloc((size_t)(B * r * H * dv) * sizeof(double)); /* [B][r][H][dv] */
    if (!ref) return INFINITY;
    int64_t shape[4] = {B, r, H, dv};
    fa_tensor os;
    fa_tensor_make(&os, ref, FA_F64, 4, shape, NULL);
    fa_options opt = fa_options_default();
    bench_mask(&opt, cfg);
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
                        const int64_t at[4] = {b, Sq - r + i, h, c};
                        double got = fa_tensor_get(o, at);
                        double e = fabs(got - want);
                        if (!(e <= err)) err = e; /* NaN propagates */
                    }
    }
    free(ref);
    return err;
}

/*
 * dQ of the last CHECK_ROWS rows of every (batch, head) against the float64
 * reference backward of those rows alone (Q and dO sliced; K, V whole).
 * Returns max|err| / (1e-6 + 1e-4 max|ref|): <= 1 passes (bench's rule; see the top of this file).
 */
static double check_bwd_rows(const fa_tensor *q, const fa_tensor *k, const fa_tensor *v, const bwd_io *io,
                             const bench_cfg *cfg)
{
    const int64_t B = q->shape[0], Sq = q->shape[1], H = q->shape[2], d = q->shape[3];
    const int64_t Sk = k->shape[1], Hk = k->shape[2], dv = v->shape[3];
    const int64_t r = Sq < CHECK_ROWS ? Sq : CHECK_ROWS;
    fa_tensor qs = *q, dos = io->dout;
    qs.shape[1] = r;
    qs.data = (char *)q->data + (Sq - r) * q->stride[1] * (int64_t)fa_dtype_size(q->dtype);
    dos.shape[1] = r;
    dos.data = (char *)io->dout.data + (Sq - r) * io->dout.stride[1] * (int64_t)fa_dtype_size(io->dout.dtype);
    int64_t sq[4] = {B, r, H, d}, sk[4] = {B, Sk, Hk, d}, sv[4] = {B, Sk, Hk, dv};
    double *dq = malloc((size_t)(B * r * H * d) * sizeof(double));
    double *dk = malloc((size_t)(B * Sk * Hk * d) * sizeof(double));
    double *dvv = malloc((size_t)(B * Sk * Hk * dv) * sizeof(double));
    double ratio = INFINITY;
    fa_tensor tq, tk, tv;
    if (dq && dk && dvv && fa_tensor_make(&tq, dq, FA_F64, 4, sq, NULL) == FA_OK &&
        fa_tensor_make(&tk, dk, FA_F64, 4, sk, NULL) == FA_OK && fa_tensor_make(&tv, dvv, FA_F64, 4, sv, NULL) == FA_OK) {
        fa_options opt = fa_options_default();
        bench_mask(&opt, cfg);
        opt.impl = FA_IMPL_REFERENCE;
        opt.num_threads = cfg->threads;
        if (fa_backward(&qs, k, v, NULL, NULL, &dos, &tq, &tk, &tv, &opt) == FA_OK) {
            double err = 0.0, max_ref = 0.0;
            const float *got = io->dq.data;
            for (int64_t b = 0; b < B; b++)
                for (int64_t i = 0; i < r; i++)
                    for (int64_t h = 0; h < H; h++)
                        for (int64_t c = 0; c < d; c++) {
                            double want = dq[((b * r + i) * H + h) * d + c];
                            double x = got[b * io->dq.stride[0] + (Sq - r + i) * io->dq.stride[1] +
                                           h * io->dq.stride[2] + c * io->dq.stride[3]];
                            double e = fabs(x - want);
                            if (!(e <= err)) err = e; /* NaN propagates */
                            if (fabs(want) > max_ref) max_ref = fabs(want);
                        }
            ratio = err / (1e-6 + 1e-4 * max_ref);
        }
    }
    free(dq);
    free(dk);
    free(dvv);
    return ratio;
}

/* Fill n floats with uniform values in [-1, 1) from a 64-bit LCG. */
static void fill_random(float *x, size_t n, uint64_t *rng)
{
    for (size_t i = 0; i < n; i++) {
        *rng = *rng * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((*rng >> 40) * 0x1.0p-24 * 2.0 - 1.0);
    }
}

/* x (finite, |x| < 65504) as IEEE binary16 bits, rounded to nearest even. */
static uint16_t round_f16(float x)
{
    const uint16_t sign = signbit(x) ? 0x8000u : 0u;
    const double a = fabs((double)x);
    if (a < 0x1p-14) return (uint16_t)(sign | (uint16_t)nearbyint(a * 0x1p24)); /* subnormal (or the
                                                                                  * smallest normal) */
    int e;
    double mant = nearbyint(frexp(a, &e) * 2048.0); /* a = mant * 2^(e - 11), mant in [1024, 2048] */
    if (mant == 2048.0) mant = 1024.0, e++;
    return (uint16_t)(sign | (uint16_t)((e + 14) << 10) | (uint16_t)((int)mant - 1024));
}

/* x (finite) as bfloat16 bits, rounded to nearest even. */
static uint16_t round_bf16(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* Convert n floats in place into n elements of dtype (f32: nothing to do);
 * element i is written at or below where float i was read. */
static void to_dtype(float *x, size_t n, fa_dtype dt)
{
    if (dt == FA_F32) return;
    uint16_t *h = (uint16_t *)(void *)x;
    for (size_t i = 0; i < n; i++) h[i] = dt == FA_BF16 ? round_bf16(x[i]) : round_f16(x[i]);
}

/* A context for a flash row (NULL for other impls, or when it cannot be made:
 * the row then runs without one). Its arena is sized by the row's first call,
 * the check, so the timed runs reuse that scratch as a caller's loop would,
 * instead of paying the allocator and fresh pages every call; the arena stays
 * in the library's live bytes, so lib_MiB still counts it. */
static fa_context *row_context(const char *impl, int threads)
{
    fa_context *ctx = NULL;
    if (strcmp(impl, "flash") == 0 && fa_context_create(&ctx, NULL, threads) != FA_OK) ctx = NULL;
    return ctx;
}

static int bench_one(const char *impl, int bwd, int64_t n, int64_t d, const bench_cfg *cfg_in, uint64_t *rng,
                     double *gflops_out)
{
    *gflops_out = NAN;
    bench_cfg row_cfg = *cfg_in;
    row_cfg.ctx = row_context(impl, cfg_in->threads);
    const bench_cfg *cfg = &row_cfg;
    const int64_t B = cfg->batch, H = cfg->heads, Hk = cfg->heads_k;
    int64_t qs[4] = {B, n, H, d}, ks[4] = {B, n, Hk, d}, ls[3] = {B, H, n};
    size_t nq = (size_t)(B * n * H * d), nk = (size_t)(B * n * Hk * d), nl = (size_t)(B * H * n);
    float *buf[10] = {NULL};
    /* q k v o | lse dout dq dk dv (backward only) */
    const size_t count[10] = {nq, nk, nk, nq, nl, nq, nq, nk, nk, 0};
    const int nbuf = bwd ? 9 : 4;
    for (int x = 0; x < nbuf; x++) {
        buf[x] = malloc((count[x] ? count[x] : 1) * sizeof(float));
        if (!buf[x]) {
            for (int y = 0; y < x; y++) free(buf[y]);
            fprintf(stderr, "flashattn bench: out of memory for N=%lld d=%lld\n", (long long)n, (long long)d);
            return 2;
        }
    }
    fill_random(buf[0], nq, rng);
    fill_random(buf[1], nk, rng);
    fill_random(buf[2], nk, rng);
    to_dtype(buf[0], nq, cfg->dtype);
    to_dtype(buf[1], nk, cfg->dtype);
    to_dtype(buf[2], nk, cfg->dtype);
    fa_tensor q, k, v, o;
    bwd_io io;
    fa_tensor_make(&q, buf[0], cfg->dtype, 4, qs, NULL);
    fa_tensor_make(&k, buf[1], cfg->dtype, 4, ks, NULL);
    fa_tensor_make(&v, buf[2], cfg->dtype, 4, ks, NULL);
    fa_tensor_make(&o, buf[3], FA_F32, 4, qs, NULL);
    if (bwd) {
        fill_random(buf[5], nq, rng);
        to_dtype(buf[5], nq, cfg->dtype);
        io.o = o;
        fa_tensor_make(&io.lse, buf[4], FA_F32, 3, ls, NULL);
        fa_tensor_make(&io.dout, buf[5], cfg->dtype, 4, qs, NULL);
        fa_tensor_make(&io.dq, buf[6], FA_F32, 4, qs, NULL);
        fa_tensor_make(&io.dk, buf[7], FA_F32, 4, ks, NULL);
        fa_tensor_make(&io.dv, buf[8], FA_F32, 4, ks, NULL);
    }

    int rc = 0;
    double err = NAN;
    reset_peak_rss();
    /* 1. check first (the backward needs O and LSE from one forward run anyway) */
    memset(buf[3], 0xff, nq * sizeof(float));
    if ((rc = run_once(impl, &q, &k, &v, &o, bwd ? &io.lse : NULL, cfg)) != 0) goto out;
    if (bwd) {
        memset(buf[6], 0xff, nq * sizeof(float));
        if ((rc = run_bwd_once(impl, &q, &k, &v, &io, cfg)) != 0) goto out;
        err = cfg->check ? check_bwd_rows(&q, &k, &v, &io, cfg) : NAN;
        if (cfg->check && !(err <= 1.0)) {
            fprintf(stderr, "flashattn bench: %s bwd N=%lld d=%lld: dQ error %.3g times the bound "
                    "1e-6 + 1e-4 max|ref| against the reference; not timing a wrong result\n",
                    impl, (long long)n, (long long)d, err);
            rc = 1;
            goto out;
        }
    } else {
        err = cfg->check ? check_rows(&q, &k, &v, &o, cfg) : NAN;
        if (cfg->check && !(err <= 1e-4)) {
            fprintf(stderr, "flashattn bench: %s N=%lld d=%lld: max error %.3g against the reference; not timing a wrong result\n",
                    impl, (long long)n, (long long)d, err);
            rc = 1;
            goto out;
        }
    }
    /* 2. warm up, then repeat; the library's allocations are counted over these runs */
    fa_alloc_stats_reset();
    for (int w = 1; w < cfg->warmup && rc == 0; w++)
        rc = bwd ? run_bwd_once(impl, &q, &k, &v, &io, cfg) : run_once(impl, &q, &k, &v, &o, NULL, cfg);
    double times[3 * 200];
    int reps = 0;
    double spent = 0.0;
    const long amx0 = fa_amx_calls();
    while (rc == 0 && reps < (int)(sizeof times / sizeof times[0]) &&
           (reps < cfg->repeats || (spent < 1.0 && reps < 3 * cfg->repeats))) {
        double t0 = now_s();
        rc = bwd ? run_bwd_once(impl, &q, &k, &v, &io, cfg) : run_once(impl, &q, &k, &v, &o, NULL, cfg);
        times[reps] = now_s() - t0;
        spent += times[reps++];
        if (isatty(2)) fprintf(stderr, "\r  %s %s N=%lld d=%lld: run %d", impl, bwd ? "bwd" : "fwd", (long long)n,
                               (long long)d, reps);
    }
    if (isatty(2)) fprintf(stderr, "\r%60s\r", "");
    if (rc != 0) goto out;
    qsort(times, (size_t)reps, sizeof(double), cmp_double);
    double med = reps % 2 ? times[reps / 2] : 0.5 * (times[reps / 2 - 1] + times[reps / 2]);
    const double flops = run_flops(bwd, (double)n, (double)d, cfg);
    double gflops = flops / med / 1e9;
    double frac = cfg->peak > 0 ? gflops / cfg->peak : 0.0;
    fa_alloc_stats as;
    fa_alloc_stats_get(&as);
    double lib_mib = (double)as.peak_bytes / 1048576.0;
    double rss = peak_rss_mib();
    /* FA_AMX=1: a row whose every timed forward ran on the tiles says so */
    const char *isa = strcmp(impl, "blas") == 0 ? "openblas" : !bwd && fa_amx_calls() - amx0 == reps ? "amx" : cfg->isa;
    *gflops_out = gflops;
    if (cfg->show_threads) printf("%4d ", cfg->threads);
    printf("%-9s %-4s %-8s %6lld %4lld %9.2f %9.2f %9.2f %8.1f %6.1f%% %9.1f %9.1f %9.1e\n", impl,
           bwd ? "bwd" : "fwd", isa, (long long)n, (long long)d, med * 1e3, times[0] * 1e3, times[reps - 1] * 1e3,
           gflops, 100.0 * frac, rss, lib_mib, err);
    fflush(stdout);
    if (cfg->csv) {
        char row[512];
        int len = snprintf(row, sizeof row,
                           "%s,%s,%s,%d,%lld,%lld,%lld,%lld,%lld,%lld,%d,%.4f,%.4f,%.4f,%.2f,%.4f,%.1f,,,%.2f,%g,%lld,%lld,,,,%s,\n", impl,
                           bwd ? "bwd" : "fwd", isa, cfg->threads, (long long)B, (long long)H, (long long)Hk,
                           (long long)n, (long long)n, (long long)d, cfg->causal, med * 1e3, times[0] * 1e3,
                           times[reps - 1] * 1e3, gflops, frac, rss, lib_mib, cfg->softcap,
                           (long long)cfg->window_left, (long long)(cfg->causal ? 0 : cfg->window_right),
                           fa_dtype_name(cfg->dtype));
        if (fa_outfile_write(cfg->csv, row, (size_t)len) != FA_OK) {
            cli_die_npy(FA_ERR_IO);
            rc = 2;
        } else {
            (*cfg->csv_rows)++;
        }
    }
out:
    for (int x = 0; x < nbuf; x++) free(buf[x]);
    fa_context_destroy(row_cfg.ctx);
    return rc;
}

/* ---- decode rows (--seqlen-q): memory-bound, GB/s of K/V ---------------------- */

/*
 * With --seqlen-q S every row is a decode measurement: S query rows per head
 * against a KV cache of N keys (--n) through fa_options.kvcache, the cache in
 * --kv-dtype (f32, f16, bf16), contiguous or paged (--page-size P: pages of P
 * rows in a shuffled order, as a paged allocator leaves them), with
 * --num-splits. Such a pass reads every K/V byte once and does 2 FLOPs per
 * byte pair at most: it is bound by the memory, so the rows report GB/s of
 * K/V read (2 x batch x N x heads_k x d x element size, each byte counted
 * once) and its fraction of a read bandwidth bench measures itself
 * (measure_read_gbps) on the same thread count, beside GFLOP/s
 * (4 x S x N x d per query head).
 */

#define DEC_MAX_DTYPES 3

typedef struct decode_cfg {
    int on;                        /* --seqlen-q given */
    int64_t seqlen_q;
    int nkv;
    fa_dtype kv[DEC_MAX_DTYPES];   /* --kv-dtype list */
    int nsplit, npage;
    long long splits[MAX_LIST];    /* --num-splits list */
    long long pages[MAX_LIST];     /* --page-size list (0: contiguous) */
    double bw_gbps;                /* measured read bandwidth: the faster of the two patterns */
    double bw_plain, bw_streams;   /* each pattern's best (measure_read_gbps) */
    double bw1_gbps;               /* the same on one thread (the ceiling of a one-task decode) */
    int bw_threads;                /* threads it was measured on (at most the CPUs) */
    size_t bw_bytes;               /* its buffer */
    int warm;                      /* --warm-cache: no eviction between runs */
    uint64_t *evict;               /* [evict_words]: read before every timed run (cold) */
    size_t evict_words;
} decode_cfg;

/* --kv-dtype: a comma-separated list of f32, f16, bf16. -1 after printing what is wrong. */
static int parse_kv_dtypes(const char *s, decode_cfg *dc)
{
    char buf[64];
    const char *names[DEC_MAX_DTYPES];
    int n = split_names("--kv-dtype", s, buf, sizeof buf, names, DEC_MAX_DTYPES);
    if (n < 0) return -1;
    for (int i = 0; i < n; i++) {
        if (strcmp(names[i], "f32") == 0) dc->kv[i] = FA_F32;
        else if (strcmp(names[i], "f16") == 0) dc->kv[i] = FA_F16;
        else if (strcmp(names[i], "bf16") == 0) dc->kv[i] = FA_BF16;
        else {
            cli_die("bench: --kv-dtype: expected f32, f16 or bf16, got '%s'", names[i]);
            return -1;
        }
    }
    dc->nkv = n;
    return 0;
}

/*
 * One thread's share [a, b) of the probe buffer read as four streams in
 * lockstep, a line of each in turn, each asking for its line 2 KiB ahead
 * (prefetcht0 on x86) while that line is inside the stream.
 */
static uint64_t xor_four_streams(const uint64_t *buf, size_t a, size_t b)
{
    const size_t len = (b - a) / 4 / 8 * 8; /* words per stream, whole 64-byte lines */
    uint64_t acc = 0;
    for (size_t i = 0; i < len; i += 8)
        for (size_t st = 0; st < 4; st++) {
            const uint64_t *p = buf + a + st * len + i;
            if (i + 256 < len) __builtin_prefetch(p + 256, 0, 3);
#ifdef _OPENMP
#pragma omp simd reduction(^ : acc)
#endif
            for (int k = 0; k < 8; k++) acc ^= p[k];
        }
    for (size_t i = a + 4 * len; i < b; i++) acc ^= buf[i];
    return acc;
}

/*
 * Read bandwidth in GB/s on `threads` threads over a buffer of `bytes`
 * (several times the last-level cache), each thread its static share (first
 * touched by the thread that reads it): the best of 5 passes after one warm
 * pass, each pass timing two patterns, a plain XOR (one stream a thread,
 * vectorized: XOR's one-cycle latency leaves the loop waiting on memory) and
 * four prefetched streams a thread (xor_four_streams). On an Intel Xeon guest
 * (2 cores) the plain stream read 22 GB/s on 2 threads where four prefetched
 * streams read 31, and a decoder with its own prefetches read 25 — 110% of
 * the plain figure: a ceiling the decoder could beat was no ceiling. Returns
 * the faster pattern's figure and sets each pattern's; 0 if the buffer
 * cannot be had.
 */
static double measure_read_gbps(int threads, size_t bytes, double *plain, double *streams)
{
    const size_t n = bytes / sizeof(uint64_t);
    uint64_t *buf = malloc(n * sizeof(uint64_t));
    if (!buf) return 0.0;
#ifdef _OPENMP
#pragma omp parallel for num_threads(threads) schedule(static)
#endif
    for (size_t i = 0; i < n; i++) buf[i] = (uint64_t)i * 0x9e3779b97f4a7c15ull;
    double best[2] = {0.0, 0.0};
    volatile uint64_t sink = 0;
    for (int pass = 0; pass < 6; pass++)
        for (int pattern = 0; pattern < 2; pattern++) {
            uint64_t x = 0;
            const double t0 = now_s();
            if (pattern == 0) {
#ifdef _OPENMP
#pragma omp parallel for simd num_threads(threads) schedule(static) reduction(^ : x)
#endif
                for (size_t i = 0; i < n; i++) x ^= buf[i];
            } else {
#ifdef _OPENMP
#pragma omp parallel num_threads(threads) reduction(^ : x)
                {
                    const size_t t = (size_t)omp_get_thread_num(), nt = (size_t)omp_get_num_threads();
                    x ^= xor_four_streams(buf, n / nt * t + (t < n % nt ? t : n % nt),
                                          n / nt * (t + 1) + (t + 1 < n % nt ? t + 1 : n % nt));
                }
#else
                x ^= xor_four_streams(buf, 0, n);
#endif
            }
            const double t = now_s() - t0;
            sink ^= x;
            if (pass > 0 && t > 0 && (double)(n * sizeof(uint64_t)) / t / 1e9 > best[pattern])
                best[pattern] = (double)(n * sizeof(uint64_t)) / t / 1e9;
        }
    (void)sink;
    free(buf);
    *plain = best[0];
    *streams = best[1];
    return best[0] > best[1] ? best[0] : best[1];
}

/*
 * Cold runs. A decode step reads each layer's cache once per token, and the
 * caches of all layers are far larger than any last-level cache, so a serving
 * decoder reads K/V from DRAM. A bench that times the same cache again and
 * again measures something else on a machine whose L3 holds it (the 16-core
 * host's guest reports 300 MiB: a 268 MB float32 cache fits, and bf16 then
 * "exceeded" the DRAM bandwidth). Before every timed run (and warm-up) the
 * threads read a buffer of twice the last-level cache, which evicts K/V from
 * L2 and L3; that read is not timed. --warm-cache keeps the old behaviour.
 */
static void evict_llc(const decode_cfg *dc, int threads)
{
    if (!dc->evict) return;
    uint64_t x = 0;
    const uint64_t *buf = dc->evict;
    const size_t n = dc->evict_words;
#ifdef _OPENMP
#pragma omp parallel for simd num_threads(threads) schedule(static) reduction(^ : x)
#endif
    for (size_t i = 0; i < n; i++) x ^= buf[i];
    volatile uint64_t sink = x;
    (void)sink;
}

/* A sysfs file's first line into buf (empty on failure). */
static void sysfs_line(const char *path, char *buf, size_t size)
{
    buf[0] = '\0';
    FILE *f = fopen(path, "r");
    if (!f) return;
    if (!fgets(buf, (int)size, f)) buf[0] = '\0';
    fclose(f);
    buf[strcspn(buf, "\n")] = '\0';
}

/*
 * Bytes of every L2 and L3 in the machine: each cache instance of level 2 or 3
 * counted once (instances told apart by their shared_cpu_list), over the CPUs
 * sysfs lists; 0 when sysfs has no cache directories. fa_cpu_info's l3_bytes is
 * ONE instance: a 12-CCD EPYC has twelve 32 MiB L3s, each filled only from its
 * own cores, and bench's threads spread over all of them, so twice one
 * instance would leave most of a large cache resident ("cold" would read L3).
 */
static size_t all_caches_bytes(void)
{
    enum { MAX_INST = 1024 };
    static char seen[MAX_INST][272];
    int nseen = 0;
    size_t total = 0;
    const long ncpu = sysconf(_SC_NPROCESSORS_CONF);
    for (long c = 0; c < (ncpu > 0 ? ncpu : 1) && c < 65536; c++)
        for (int idx = 0; idx < 16; idx++) {
            char path[160], level[16], list[256], size[32];
            snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%ld/cache/index%d/level", c, idx);
            sysfs_line(path, level, sizeof level);
            if (!level[0]) break;
            if (strcmp(level, "2") != 0 && strcmp(level, "3") != 0) continue;
            snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%ld/cache/index%d/shared_cpu_list", c, idx);
            sysfs_line(path, list, sizeof list);
            char key[272];
            snprintf(key, sizeof key, "%.8s:%s", level, list[0] ? list : "?");
            int dup = 0;
            for (int x = 0; x < nseen && !dup; x++) dup = strcmp(seen[x], key) == 0;
            if (dup) continue;
            if (nseen < MAX_INST) snprintf(seen[nseen++], sizeof seen[0], "%s", key);
            snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%ld/cache/index%d/size", c, idx);
            sysfs_line(path, size, sizeof size);
            char *end = NULL;
            const unsigned long long v = strtoull(size, &end, 10);
            if (!end || end == size) continue;
            const unsigned long long mult = *end == 'K' ? 1ull << 10 : *end == 'M' ? 1ull << 20 : *end == 'G' ? 1ull << 30 : 1;
            if (v < (1ull << 40) / mult) total += (size_t)(v * mult);
        }
    return total;
}

/* What the cold read must outgrow: every L2 and L3 (all_caches_bytes), else the
 * one L3 fa_cpu_info reports (0 when unknown). Read from sysfs once a process. */
static size_t caches_to_evict(void)
{
    static int known = 0;
    static size_t bytes = 0;
    if (!known) {
        bytes = all_caches_bytes();
        fa_cpu_info ci;
        if (!bytes && fa_get_cpu_info(&ci) == FA_OK) bytes = ci.l3_bytes;
        known = 1;
    }
    return bytes;
}

/* The eviction buffer: twice every cache (caches_to_evict), at least 64 MiB (a
 * cache size this machine does not report), at most 2 GiB, within an eighth of
 * MemAvailable; 0 for --warm-cache. */
static size_t evict_buffer_bytes(double avail)
{
    double b = 2.0 * (double)caches_to_evict();
    if (b < 64.0 * 1048576) b = 64.0 * 1048576;
    if (b > 2048.0 * 1048576) b = 2048.0 * 1048576;
    if (avail > 0 && b > avail / 8) b = avail / 8;
    return (size_t)b & ~(size_t)4095;
}

/* The bandwidth buffer: 4x every cache (256 MiB when unknown or smaller), at
 * most 2 GiB and a quarter of MemAvailable. */
static size_t bw_buffer_bytes(double avail)
{
    double b = 4.0 * (double)caches_to_evict();
    if (b < 256.0 * 1048576) b = 256.0 * 1048576;
    if (b > 2048.0 * 1048576) b = 2048.0 * 1048576;
    if (avail > 0 && b > avail / 4) b = avail / 4;
    return (size_t)b & ~(size_t)4095;
}

/* n random 16-bit floats of dtype dt with magnitudes in [2^-6, 1) (never 0,
 * never subnormal): sign, exponent and mantissa bits drawn directly. */
static void fill_random16(uint16_t *x, size_t n, fa_dtype dt, uint64_t *rng)
{
    for (size_t i = 0; i < n; i++) {
        *rng = *rng * 6364136223846793005ull + 1442695040888963407ull;
        const unsigned r = (unsigned)(*rng >> 33);
        if (dt == FA_BF16) /* exponent 121..126 (bias 127), 7 mantissa bits */
            x[i] = (uint16_t)(((r & 1u) << 15) | ((121u + (r >> 1) % 6u) << 7) | ((r >> 4) & 0x7fu));
        else /* f16: exponent 9..14 (bias 15), 10 mantissa bits */
            x[i] = (uint16_t)(((r & 1u) << 15) | ((9u + (r >> 1) % 6u) << 10) | ((r >> 4) & 0x3ffu));
    }
}

/* Bytes one decode configuration needs. */
static double decode_estimate_bytes(double n, double d, double esz, double page, const bench_cfg *cfg,
                                    const decode_cfg *dc)
{
    const double B = (double)cfg->batch, H = (double)cfg->heads, Hk = (double)cfg->heads_k;
    const double keys = page > 0 ? ceil(n / page) * page : n;
    return esz * 2 * B * keys * Hk * d + 4.0 * 2 * B * (double)dc->seqlen_q * H * d +
           (cfg->check ? 8.0 * B * (double)dc->seqlen_q * H * d : 0) + (double)cfg->threads * (2 << 20);
}

/* One decode row: impl, N keys, head dim d, cache dtype kvdt, page size (0: contiguous), num_splits. */
static int decode_bench_one(const char *impl, int64_t n, int64_t d, fa_dtype kvdt, int64_t page, int splits,
                            const bench_cfg *cfg, const decode_cfg *dc, uint64_t *rng)
{
    const int64_t B = cfg->batch, H = cfg->heads, Hk = cfg->heads_k, Sq = dc->seqlen_q;
    const int64_t maxp = page > 0 ? (n + page - 1) / page : 0, npages = B * maxp;
    const int64_t rows = page > 0 ? npages * page : B * n; /* cache rows stored */
    const size_t esz = fa_dtype_size(kvdt), nq = (size_t)(B * Sq * H * d), nkv = (size_t)(rows * Hk * d);
    float *qb = malloc(nq * sizeof(float)), *ob = malloc(nq * sizeof(float));
    void *kb = malloc(nkv * esz), *vb = malloc(nkv * esz);
    int32_t *seqlens = malloc((size_t)B * sizeof(int32_t));
    int32_t *table = malloc((size_t)(npages > 0 ? npages : 1) * sizeof(int32_t));
    double *ref = cfg->check ? malloc(nq * sizeof(double)) : NULL;
    fa_context *ctx = row_context(impl, cfg->threads);
    int rc = 0;
    if (!qb || !ob || !kb || !vb || !seqlens || !table || (cfg->check && !ref)) {
        fprintf(stderr, "flashattn bench: out of memory for the decode row N=%lld d=%lld\n", (long long)n, (long long)d);
        rc = 2;
        goto out;
    }
    fill_random(qb, nq, rng);
    if (kvdt == FA_F32) {
        fill_random(kb, nkv, rng);
        fill_random(vb, nkv, rng);
    } else {
        fill_random16(kb, nkv, kvdt, rng);
        fill_random16(vb, nkv, kvdt, rng);
    }
    for (int64_t b = 0; b < B; b++) seqlens[b] = (int32_t)n;
    /* pages in a shuffled order (Fisher-Yates) */
    for (int64_t x = 0; x < npages; x++) table[x] = (int32_t)x;
    for (int64_t x = npages - 1; x > 0; x--) {
        *rng = *rng * 6364136223846793005ull + 1442695040888963407ull;
        const int64_t y = (int64_t)((*rng >> 33) % (uint64_t)(x + 1));
        const int32_t t = table[x];
        table[x] = table[y];
        table[y] = t;
    }
    int64_t qs[4] = {B, Sq, H, d}, ks[4] = {page > 0 ? npages : B, page > 0 ? page : n, Hk, d};
    fa_tensor q, k, v, o, os;
    fa_tensor_make(&q, qb, FA_F32, 4, qs, NULL);
    fa_tensor_make(&o, ob, FA_F32, 4, qs, NULL);
    fa_tensor_make(&k, kb, kvdt, 4, ks, NULL);
    fa_tensor_make(&v, vb, kvdt, 4, ks, NULL);
    fa_kvcache kv = fa_kvcache_default();
    kv.cache_seqlens = seqlens;
    if (page > 0) {
        kv.block_table = table;
        kv.max_pages = maxp;
    }
    fa_options opt = fa_options_default();
    bench_mask(&opt, cfg);
    opt.num_threads = cfg->threads;
    opt.kvcache = &kv;
    opt.num_splits = splits;
    opt.context = ctx;
    fa_status st = fa_impl_from_name(impl, &opt.impl);

    /* 1. check: every output row against the float64 reference of the same cache */
    double err = NAN;
    reset_peak_rss();
    memset(ob, 0xff, nq * sizeof(float));
    if (st == FA_OK) st = fa_forward(&q, &k, &v, &o, NULL, &opt);
    if (st == FA_OK && cfg->check) {
        fa_options ro = opt;
        ro.impl = FA_IMPL_REFERENCE;
        ro.context = NULL;
        fa_tensor_make(&os, ref, FA_F64, 4, qs, NULL);
        st = fa_forward(&q, &k, &v, &os, NULL, &ro);
        err = 0.0;
        for (size_t i = 0; st == FA_OK && i < nq; i++) {
            const double e = fabs((double)ob[i] - ref[i]);
            if (!(e <= err)) err = e; /* NaN propagates */
        }
    }
    if (st != FA_OK) {
        fprintf(stderr, "flashattn bench: %s decode: %s\n", impl, fa_last_error());
        rc = 2;
        goto out;
    }
    if (cfg->check && !(err <= 1e-4)) {
        fprintf(stderr, "flashattn bench: %s decode N=%lld d=%lld kv %s: max error %.3g against the reference; "
                "not timing a wrong result\n", impl, (long long)n, (long long)d, fa_dtype_name(kvdt), err);
        rc = 1;
        goto out;
    }
    /* 2. warm up, then repeat */
    fa_alloc_stats_reset();
    for (int w = 1; w < cfg->warmup && st == FA_OK; w++) {
        evict_llc(dc, cfg->threads);
        st = fa_forward(&q, &k, &v, &o, NULL, &opt);
    }
    double times[3 * 200];
    int reps = 0;
    double spent = 0.0;
    while (st == FA_OK && reps < (int)(sizeof times / sizeof times[0]) &&
           (reps < cfg->repeats || (spent < 1.0 && reps < 3 * cfg->repeats))) {
        evict_llc(dc, cfg->threads);
        const double t0 = now_s();
        st = fa_forward(&q, &k, &v, &o, NULL, &opt);
        times[reps] = now_s() - t0;
        spent += times[reps++];
    }
    if (st != FA_OK) {
        fprintf(stderr, "flashattn bench: %s decode: %s\n", impl, fa_last_error());
        rc = 2;
        goto out;
    }
    qsort(times, (size_t)reps, sizeof(double), cmp_double);
    const double med = reps % 2 ? times[reps / 2] : 0.5 * (times[reps / 2 - 1] + times[reps / 2]);
    const double bytes = 2.0 * (double)B * (double)n * (double)Hk * (double)d * (double)esz;
    const double gbps = bytes / med / 1e9, bwf = dc->bw_gbps > 0 ? gbps / dc->bw_gbps : 0.0;
    const double gflops = 4.0 * (double)(B * H) * (double)Sq * (double)n * (double)d / med / 1e9;
    const double frac = cfg->peak > 0 ? gflops / cfg->peak : 0.0;
    fa_alloc_stats as;
    fa_alloc_stats_get(&as);
    const double lib_mib = (double)as.peak_bytes / 1048576.0, rss = peak_rss_mib();
    char split_name[16];
    if (splits == 0) snprintf(split_name, sizeof split_name, "auto");
    else snprintf(split_name, sizeof split_name, "%d", splits);
    printf("%-9s %-4s %5lld %6s %7lld %4lld %9.3f %9.3f %9.3f %8.1f %6.1f%% %8.1f %9.1f %9.1e\n", impl,
           fa_dtype_name(kvdt), (long long)page, split_name, (long long)n, (long long)d, med * 1e3, times[0] * 1e3,
           times[reps - 1] * 1e3, gbps, 100.0 * bwf, gflops, lib_mib, err);
    fflush(stdout);
    if (cfg->csv) {
        char row[640];
        const int len = snprintf(row, sizeof row,
                                 "%s,fwd,%s,%d,%lld,%lld,%lld,%lld,%lld,%lld,%d,%.4f,%.4f,%.4f,%.2f,%.4f,%.1f,%.3f,%.4g,%.2f,"
                                 "%g,%lld,%lld,%s,%d,%lld,f32,%s\n",
                                 impl, cfg->isa, cfg->threads, (long long)B, (long long)H, (long long)Hk, (long long)Sq,
                                 (long long)n, (long long)d, cfg->causal, med * 1e3, times[0] * 1e3,
                                 times[reps - 1] * 1e3, gflops, frac, rss, gbps, bwf, lib_mib, cfg->softcap,
                                 (long long)cfg->window_left, (long long)(cfg->causal ? 0 : cfg->window_right),
                                 fa_dtype_name(kvdt),
                                 splits, (long long)page, dc->warm ? "warm" : "cold");
        if (fa_outfile_write(cfg->csv, row, (size_t)len) != FA_OK) {
            cli_die_npy(FA_ERR_IO);
            rc = 2;
        } else {
            (*cfg->csv_rows)++;
        }
    }
out:
    free(qb); free(ob); free(kb); free(vb); free(seqlens); free(table); free(ref);
    fa_context_destroy(ctx);
    return rc;
}

/* The decode rows' header lines (after the machine line). */
static void decode_print_header(const bench_cfg *cfg, const decode_cfg *dc)
{
    printf("decode: %lld query row%s per head against a KV cache of N keys (fa_options.kvcache); batch %lld, heads %lld "
           "(kv heads %lld), %s\n",
           (long long)dc->seqlen_q, dc->seqlen_q == 1 ? "" : "s", (long long)cfg->batch, (long long)cfg->heads,
           (long long)cfg->heads_k, cfg->causal ? "causal" : "non-causal");
    printf("measured read bandwidth %.1f GB/s (%d thread%s%s; over a %zu MiB buffer the faster of a plain XOR, "
           "%.1f, and four prefetched streams a thread, %.1f)", dc->bw_gbps,
           dc->bw_threads, dc->bw_threads == 1 ? "" : "s", dc->bw_threads < cfg->threads ? ": as many as CPUs" : "",
           dc->bw_bytes >> 20, dc->bw_plain, dc->bw_streams);
    if (dc->bw_threads > 1) printf(", %.1f GB/s on 1 thread", dc->bw1_gbps);
    printf("; GB/s = K/V bytes (2*batch*N*heads_k*d*size, once) / median time\n");
    if (dc->warm)
        printf("warm cache (--warm-cache): each run reads K/V left in L2/L3 by the previous one\n");
    else {
        const size_t llc = caches_to_evict();
        const size_t eb = dc->evict_words * sizeof(uint64_t);
        printf("cold cache: before every run (not timed) a %zu MiB read evicts K/V from L2/L3, as a decoder "
               "meets it\n", eb >> 20);
        if (!llc)
            printf("  (the cache sizes are unknown here: %zu MiB may not evict all of them)\n", eb >> 20);
        else if (eb < 2 * llc)
            printf("  (less than twice the %zu MiB of L2 and L3 caches, for lack of memory: K/V may stay partly "
                   "cached)\n", llc >> 20);
    }
    printf("times are median (min, max) of >= %d runs after %d warm-up; check = max |err| of every row vs float64\n",
           cfg->repeats, cfg->warmup);
    printf("\n%-9s %-4s %5s %6s %7s %4s %9s %9s %9s %8s %7s %8s %9s %9s\n", "impl", "kv", "page", "splits", "N", "d",
           "med_ms", "min_ms", "max_ms", "GB/s", "of_bw", "GFLOP/s", "lib_MiB", "check");
    fflush(stdout);
}

/* ---- estimates ---------------------------------------------------------------- */

/* Bytes one configuration needs, in double (no overflow for any accepted option). */
static double estimate_bytes(const char *impl, int bwd, double n, double d, const bench_cfg *cfg)
{
    const double B = (double)cfg->batch, H = (double)cfg->heads, Hk = (double)cfg->heads_k;
    const double nq = B * n * H * d, nk = B * n * Hk * d, r = n < CHECK_ROWS ? n : CHECK_ROWS;
    double bytes = 4.0 * (2 * nq + 2 * nk);                  /* Q, K, V, O float32 */
    if (bwd) {
        bytes += 4.0 * (2 * nq + 2 * nk + B * H * n);        /* dO, dQ, dK, dV, LSE */
        bytes += 4.0 * B * H * n + (16 << 20);               /* the backward's D and packed panels */
        if (cfg->check) bytes += 8.0 * (B * r * H * d + 2 * nk); /* reference dQ rows, dK, dV */
    } else if (cfg->check) {
        bytes += 8.0 * B * r * H * d;                        /* reference rows */
    }
    if (strcmp(impl, "standard") == 0)
        bytes += 4.0 * n * (n + 16);                          /* the N x N scores S (and P in place) */
    if (strcmp(impl, "blas") == 0)                           /* one S a thread when the heads are split */
        bytes += 4.0 * n * (n + 16) * (cfg->most_threads > 1 ? cfg->most_threads : 1);
    bytes += (double)cfg->threads * (2 << 20);               /* per-thread scratch allowance */
    return bytes;
}

/*
 * (query, key) pairs one head computes: N^2, N^2 / 2 when causal (the
 * convention of every figure so far), else with --window the exact count of
 * visible pairs (Sq = Sk = n: row i sees [max(0, i - L), min(n - 1, i + R)]).
 */
static double visible_pairs(double n, const bench_cfg *cfg)
{
    const int64_t wl = cfg->window_left, wr = cfg->causal ? 0 : cfg->window_right;
    if (wl < 0 && wr < 0) return n * n;
    if (cfg->causal && wl < 0) return 0.5 * n * n;
    double pairs = 0.0;
    for (int64_t i = 0; i < (int64_t)n; i++) {
        const int64_t lo = wl >= 0 && i - wl > 0 ? i - wl : 0;
        const int64_t hi = wr >= 0 && wr < (int64_t)n - 1 - i ? i + wr : (int64_t)n - 1;
        pairs += (double)(hi - lo + 1);
    }
    return pairs;
}

/* FLOPs of one run: 4 d per visible pair and head (x2.5 backward). */
static double run_flops(int bwd, double n, double d, const bench_cfg *cfg)
{
    return 4.0 * visible_pairs(n, cfg) * d * (double)cfg->batch * (double)cfg->heads * (bwd ? 2.5 : 1.0);
}

/* The reference's float64 loops run far below the FMA peak, so a time bound
 * at the peak would let `--impl reference` ask for hours. Measure its rate on
 * a small problem (B=1, H=1, N=256, d=64: 17 MFLOP, a few ms) with the
 * threads asked for; 0 if it cannot be measured. */
static double measure_reference_gflops(int threads)
{
    enum { N = 256, D = 64 };
    float *buf = malloc(sizeof(float) * 4 * N * D);
    if (!buf) return 0;
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < 4 * N * D; i++) {           /* never zeros: a small LCG in [-1, 1) */
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        buf[i] = (float)((double)(x >> 11) / 9007199254740992.0 * 2.0 - 1.0);
    }
    int64_t shape[4] = {1, N, 1, D};
    fa_tensor q, k, v, o;
    fa_tensor_make(&q, buf, FA_F32, 4, shape, NULL);
    fa_tensor_make(&k, buf + N * D, FA_F32, 4, shape, NULL);
    fa_tensor_make(&v, buf + 2 * N * D, FA_F32, 4, shape, NULL);
    fa_tensor_make(&o, buf + 3 * N * D, FA_F32, 4, shape, NULL);
    fa_options opt = fa_options_default();
    opt.impl = FA_IMPL_REFERENCE;
    opt.num_threads = threads;
    double best = 0;
    for (int r = 0; r < 3; r++) {
        double t0 = now_s();
        if (fa_forward(&q, &k, &v, &o, NULL, &opt) != FA_OK) break;
        double dt = now_s() - t0;
        double rate = 4.0 * N * N * D / (dt > 1e-9 ? dt : 1e-9) / 1e9;
        if (rate > best) best = rate;
    }
    free(buf);
    return best;
}

static int has_backward(const char *impl)
{
    return strcmp(impl, "flash") == 0 || strcmp(impl, "reference") == 0;
}

/*
 * `bench --seqlen-q S`: the decode rows. The same protocol as bench_main's
 * (limits before any work, check first, median of repeats, an atomic CSV),
 * over N (--n, default 32768 keys) x d x --kv-dtype x --page-size x
 * --num-splits x --impl, with the read bandwidth measured once up front.
 */
static int decode_main(const char *const *names, int nimpl, const int *do_pass, const long long *ns_in, int nn,
                       const long long *ds, int nd, bench_cfg *cfg, decode_cfg *dc, const char *csv_path,
                       double max_seconds)
{
    static const long long default_n[1] = {32768};
    const long long *ns = ns_in ? ns_in : default_n;
    if (!ns_in) nn = 1;
    if (do_pass[1]) return cli_die("bench: --pass bwd: decode rows (--seqlen-q) are forward only");
    for (int c = 0; c < nimpl; c++)
        if (strcmp(names[c], "blas") == 0)
            return cli_die("bench: --impl blas has no KV cache: decode rows (--seqlen-q) run flash, standard or reference");
    if (csv_path && cli_check_output("--csv", csv_path)) return 2;

    const double avail = mem_available();
    double flops_total = 0.0;
    char b1[32], b2[32];
    for (int a = 0; a < nd; a++)
        for (int b = 0; b < nn; b++)
            for (int t = 0; t < dc->nkv; t++)
                for (int pg = 0; pg < dc->npage; pg++) {
                    /* + the eviction buffer, allocated for the whole run before any row */
                    const double need = decode_estimate_bytes((double)ns[b], (double)ds[a],
                                                              (double)fa_dtype_size(dc->kv[t]), (double)dc->pages[pg],
                                                              cfg, dc) +
                                        (dc->warm ? 0.0 : (double)evict_buffer_bytes(avail));
                    if (avail > 0 && need > avail)
                        return cli_die("bench: decode N=%lld d=%lld kv %s needs about %s (the KV cache, Q, O, the cache-eviction buffer), more "
                                       "than the %s available (MemAvailable); use smaller --n, --d, --batch or --heads-k",
                                       ns[b], ds[a], fa_dtype_name(dc->kv[t]),
                                       cli_bytes(need >= 1.8e19 ? SIZE_MAX : (size_t)need, b1, sizeof b1),
                                       cli_bytes((size_t)avail, b2, sizeof b2));
                    const int runs = 1 + (cfg->warmup > 1 ? cfg->warmup - 1 : 0) + cfg->repeats;
                    flops_total += (double)(runs * nimpl * dc->nsplit) * 4.0 * (double)(cfg->batch * cfg->heads) *
                                   (double)dc->seqlen_q * (double)ns[b] * (double)ds[a];
                }

    fa_cpu_info info;
    if (fa_get_cpu_info(&info) != FA_OK) return cli_die("bench: %s", fa_last_error());
    cfg->isa = info.isa;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int probe_threads = cpus > 0 && cfg->threads > cpus ? (int)cpus : cfg->threads;
    cfg->peak = measure_peak(info.isa, probe_threads);
    if (cfg->peak > 0 && flops_total / (cfg->peak * 1e9) > max_seconds)
        return cli_die("bench: the runs asked for need at least %.3g s (%.3g FLOP at the measured FMA peak of "
                       "%.1f GFLOP/s), more than --max-seconds %.3g; use smaller sizes or raise --max-seconds",
                       flops_total / (cfg->peak * 1e9), flops_total, cfg->peak, max_seconds);
    dc->bw_bytes = bw_buffer_bytes(avail);
    dc->bw_threads = probe_threads;
    dc->bw_gbps = measure_read_gbps(probe_threads, dc->bw_bytes, &dc->bw_plain, &dc->bw_streams);
    double plain1, streams1;
    dc->bw1_gbps = probe_threads > 1 ? measure_read_gbps(1, dc->bw_bytes, &plain1, &streams1) : dc->bw_gbps;
    if (!(dc->bw_gbps > 0) || !(dc->bw1_gbps > 0)) /* its buffer could not be allocated */
        return cli_die("bench: out of memory for the %zu MiB read-bandwidth buffer that decode rows are "
                       "measured against", dc->bw_bytes >> 20);
    if (!dc->warm) {
        const size_t eb = evict_buffer_bytes(avail);
        dc->evict_words = eb / sizeof(uint64_t);
        dc->evict = malloc(eb);
        if (!dc->evict) return cli_die("bench: out of memory for the %zu MiB cache-eviction buffer (use --warm-cache)",
                                       eb >> 20);
        /* written, so every page is its own (an untouched page reads as the shared zero page) */
#ifdef _OPENMP
#pragma omp parallel for num_threads(probe_threads) schedule(static)
#endif
        for (size_t i = 0; i < dc->evict_words; i++) dc->evict[i] = (uint64_t)i * 0x9e3779b97f4a7c15ull;
    }

    fa_outfile csv;
    int csv_rows = 0;
    if (csv_path) {
        cli_cleanup_on_signals();
        if (fa_outfile_open(&csv, csv_path) != FA_OK) {
            free(dc->evict);
            return cli_die_npy(FA_ERR_IO);
        }
        cfg->csv = &csv;
        cfg->csv_rows = &csv_rows;
        if (fa_outfile_write(&csv, csv_header, sizeof csv_header - 1) != FA_OK) {
            fa_outfile_abort(&csv);
            free(dc->evict);
            return cli_die_npy(FA_ERR_IO);
        }
    }
    char model[256];
    cpu_model(model, sizeof model);
    printf("flashattn bench — %s, %ld logical CPUs\n", model, cpus);
    printf("ISA %s (%d float32 lanes), %d thread%s, measured FMA peak %.1f GFLOP/s%s\n", info.isa, info.simd_width,
           cfg->threads, cfg->threads == 1 ? "" : "s", cfg->peak,
           probe_threads < cfg->threads ? " (probed on as many threads as CPUs)" : "");
    decode_print_header(cfg, dc);

    uint64_t rng = 0x5eed1234abcdull;
    int rc = 0;
    for (int a = 0; a < nd; a++)
        for (int b = 0; b < nn; b++)
            for (int t = 0; t < dc->nkv; t++)
                for (int pg = 0; pg < dc->npage; pg++)
                    for (int sp = 0; sp < dc->nsplit; sp++)
                        for (int c = 0; c < nimpl; c++) {
                            int r = decode_bench_one(names[c], ns[b], ds[a], dc->kv[t], dc->pages[pg],
                                                     (int)dc->splits[sp], cfg, dc, &rng);
                            if (r > rc) rc = r;
                        }
    if (cfg->csv) { /* rows measured are kept even if another configuration failed; none and a failure:
                     * the old file stays */
        if (rc != 0 && csv_rows == 0) fa_outfile_abort(&csv);
        else if (fa_outfile_commit(&csv) != FA_OK) rc = cli_die_npy(FA_ERR_IO);
        fa_outfile_free(&csv);
    }
    free(dc->evict);
    dc->evict = NULL;
    return rc;
}

static int bench_main(int argc, char **argv)
{
    const char *impls = NULL, *passes = "fwd", *csv_path = NULL;
    long long ns[MAX_LIST] = {1024, 2048, 4096, 8192}, ds[MAX_LIST] = {64, 128}, ts[MAX_LIST];
    int nt = 1;
    int nn = 4, nd = 2;
    double max_seconds = 3600.0;
    double reference_flops = 0;   /* the reference's share, timed at its own measured rate */
    int n_given = 0, decode_opts = 0;
    decode_cfg dc;
    memset(&dc, 0, sizeof dc);
    dc.nkv = dc.nsplit = dc.npage = 1; /* f32, heuristic splits, contiguous */
    dc.kv[0] = FA_F32;
    bench_cfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.batch = 1;
    cfg.heads = 8;
    cfg.heads_k = 0;
    cfg.repeats = 5;
    cfg.warmup = 1;
    cfg.check = 1;
    cfg.window_left = cfg.window_right = -1;
    cli_attn mask;
    cli_attn_init(&mask);
    {
        fa_cpu_info ci;
        cfg.threads = fa_get_cpu_info(&ci) == FA_OK ? ci.max_threads : 1;
        ts[0] = cfg.threads;
    }

    for (int i = 1; i < argc; i++) {
        const char *val;
        long long x;
        int r;
        if (cli_is_help(argv[i])) {
            fputs(bench_usage, stdout);
            return 0;
        }
        if ((r = cli_opt_flag(argv, i, "--causal")) != 0) {
            if (r < 0) return 2;
            cfg.causal = 1;
        } else if ((r = cli_opt_flag(argv, i, "--no-check")) != 0) {
            if (r < 0) return 2;
            cfg.check = 0;
        } else if ((r = cli_opt_flag(argv, i, "--warm-cache")) != 0) {
            if (r < 0) return 2;
            dc.warm = 1;
            decode_opts = 1;
        } else if (strncmp(argv[i], "--window", 8) == 0 || strncmp(argv[i], "--softcap", 9) == 0) {
            /* the run command's parser, so the values mean the same */
            if ((r = cli_parse_mask_option(argc, argv, &i, &mask)) < 0) return 2;
            if (r == 0) return cli_unknown_option("bench", argv[i]);
            cfg.window_left = mask.opt.window_left;
            cfg.window_right = mask.opt.window_right;
            cfg.softcap = mask.opt.softcap;
        } else if ((r = cli_opt_value(argc, argv, &i, "--dtype", &val)) != 0) {
            if (r < 0) return 2;
            if (strcmp(val, "f32") && strcmp(val, "f16") && strcmp(val, "bf16")) /* no f64 flash path to time */
                return cli_die("bench: --dtype: expected f32, f16 or bf16, got '%s'", val);
            if (cli_parse_dtype("--dtype", val, &cfg.dtype)) return 2;
        } else if ((r = cli_opt_value(argc, argv, &i, "--impl", &val)) != 0) {
            if (r < 0) return 2;
            impls = val;
        } else if ((r = cli_opt_value(argc, argv, &i, "--pass", &val)) != 0) {
            if (r < 0) return 2;
            passes = val;
        } else if ((r = cli_opt_value(argc, argv, &i, "--n", &val)) != 0) {
            if (r < 0 || (nn = parse_list("--n", val, 1, INT32_MAX, ns)) < 0) return 2;
            n_given = 1;
        } else if ((r = cli_opt_value(argc, argv, &i, "--seqlen-q", &val)) != 0) {
            if (r < 0 || cli_parse_int("--seqlen-q", val, 1, 65536, &x)) return 2;
            dc.on = 1;
            dc.seqlen_q = x;
        } else if ((r = cli_opt_value(argc, argv, &i, "--kv-dtype", &val)) != 0) {
            if (r < 0 || parse_kv_dtypes(val, &dc) < 0) return 2;
            decode_opts = 1;
        } else if ((r = cli_opt_value(argc, argv, &i, "--num-splits", &val)) != 0) {
            if (r < 0 || (dc.nsplit = parse_list("--num-splits", val, 0, 128, dc.splits)) < 0) return 2;
            decode_opts = 1;
        } else if ((r = cli_opt_value(argc, argv, &i, "--page-size", &val)) != 0) {
            if (r < 0 || (dc.npage = parse_list("--page-size", val, 0, 65536, dc.pages)) < 0) return 2;
            decode_opts = 1;
        } else if ((r = cli_opt_value(argc, argv, &i, "--d", &val)) != 0) {
            if (r < 0 || (nd = parse_list("--d", val, 1, 1 << 16, ds)) < 0) return 2;
        } else if ((r = cli_opt_value(argc, argv, &i, "--batch", &val)) != 0) {
            if (r < 0 || cli_parse_int("--batch", val, 1, 1000000, &x)) return 2;
            cfg.batch = x;
        } else if ((r = cli_opt_value(argc, argv, &i, "--heads", &val)) != 0) {
            if (r < 0 || cli_parse_int("--heads", val, 1, 1000000, &x)) return 2;
            cfg.heads = x;
        } else if ((r = cli_opt_value(argc, argv, &i, "--heads-k", &val)) != 0) {
            if (r < 0 || cli_parse_int("--heads-k", val, 1, 1000000, &x)) return 2;
            cfg.heads_k = x;
        } else if ((r = cli_opt_value(argc, argv, &i, "--threads", &val)) != 0) {
            if (r < 0 || (nt = parse_list("--threads", val, 1, FA_MAX_THREADS, ts)) < 0) return 2;
            for (int a = 0; a < nt; a++)
                for (int b2 = a + 1; b2 < nt; b2++)
                    if (ts[a] == ts[b2]) {
                        cli_die("bench: --threads: %lld is listed twice in '%s' (each count runs once; the scaling "
                                "lines compare the counts)", ts[a], val);
                        return 2;
                    }
            cfg.threads = (int)ts[0];
        } else if ((r = cli_opt_value(argc, argv, &i, "--repeats", &val)) != 0) {
            if (r < 0 || cli_parse_int("--repeats", val, 1, 200, &x)) return 2;
            cfg.repeats = (int)x;
        } else if ((r = cli_opt_value(argc, argv, &i, "--warmup", &val)) != 0) {
            if (r < 0 || cli_parse_int("--warmup", val, 0, 100, &x)) return 2;
            cfg.warmup = (int)x;
        } else if ((r = cli_opt_value(argc, argv, &i, "--max-seconds", &val)) != 0) {
            if (r < 0 || cli_parse_double("--max-seconds", val, &max_seconds)) return 2;
            if (max_seconds <= 0) return cli_die("--max-seconds: must be > 0, got '%s'", val);
        } else if ((r = cli_opt_value(argc, argv, &i, "--csv", &val)) != 0) {
            if (r < 0) return 2;
            csv_path = val;
        } else {
            return cli_unknown_option("bench", argv[i]);
        }
    }
    if (!cfg.heads_k) cfg.heads_k = cfg.heads;
    if (cfg.heads % cfg.heads_k)
        return cli_die("bench: --heads %lld is not a multiple of --heads-k %lld", (long long)cfg.heads,
                       (long long)cfg.heads_k);
    if (!impls && dc.on) impls = "flash";
#ifdef FA_HAVE_BLAS
    int most_threads = 1;
    for (int t = 0; t < nt; t++)
        if (ts[t] > most_threads) most_threads = (int)ts[t];
#endif
    const int impls_given = impls != NULL;
    if (!impls) {
#ifdef FA_HAVE_BLAS
        impls = "flash,standard,blas"; /* left out below where it cannot run (limits, a removed library) */
#else
        impls = "flash,standard";
#endif
    }
    /* validate the impl and pass lists before doing any work */
    char list[256], plist[64];
    const char *names[8], *pass_names[2];
    int nimpl = split_names("--impl", impls, list, sizeof list, names, 8);
    if (nimpl < 0) return 2;
    for (int c = 0; c < nimpl; c++) {
        fa_impl dummy;
        if (strcmp(names[c], "blas") == 0) {
#ifndef FA_HAVE_BLAS
            return cli_die("bench: impl 'blas' is not built (install libopenblas-dev and rebuild)");
#endif
        } else if (fa_impl_from_name(names[c], &dummy) != FA_OK) {
            return cli_die("bench: --impl: unknown implementation '%s' (expected flash, reference, standard or "
                           "blas)", names[c]);
        }
    }
    int npass = split_names("--pass", passes, plist, sizeof plist, pass_names, 2);
    if (npass < 0) return 2;
    int do_pass[2] = {0, 0}; /* fwd, bwd */
    for (int p = 0; p < npass; p++) {
        if (strcmp(pass_names[p], "fwd") == 0) do_pass[0] = 1;
        else if (strcmp(pass_names[p], "bwd") == 0) do_pass[1] = 1;
        else return cli_die("bench: --pass: expected fwd and/or bwd, got '%s'", pass_names[p]);
    }
    int runs_bwd = 0;
    for (int c = 0; c < nimpl; c++) runs_bwd |= has_backward(names[c]);
    if (do_pass[1] && !runs_bwd && !do_pass[0])
        return cli_die("bench: --pass bwd: none of --impl %s has a backward pass (flash and reference do)", impls);

    if (decode_opts && !dc.on)
        return cli_die("bench: --kv-dtype, --num-splits, --page-size and --warm-cache apply to decode rows: give --seqlen-q");
    if (dc.on && nt > 1) return cli_die("bench: decode rows (--seqlen-q) take one --threads value, got %d", nt);
    if (dc.on)
        return decode_main(names, nimpl, do_pass, n_given ? ns : NULL, nn, ds, nd, &cfg, &dc, csv_path, max_seconds);
    if (csv_path && cli_check_output("--csv", csv_path)) return 2;

    /* memory: every configuration must fit in what the system has available */
    const double avail = mem_available();
    double seconds_at_peak_flops = 0.0, blas_row_bytes = 0.0;
#ifdef FA_HAVE_BLAS
    cfg.most_threads = most_threads;
#endif
    char b1[32], b2[32];
    for (int a = 0; a < nd; a++)
        for (int b = 0; b < nn; b++)
            for (int c = 0; c < nimpl; c++)
                for (int p = 0; p < 2; p++) {
                    if (!do_pass[p] || (p == 1 && !has_backward(names[c]))) continue;
                    double need = estimate_bytes(names[c], p, (double)ns[b], (double)ds[a], &cfg);
                    if (strcmp(names[c], "blas") == 0 && p == 0 && cfg.dtype == FA_F32 && need > blas_row_bytes)
                        blas_row_bytes = need;
                    if (avail > 0 && need > avail)
                        return cli_die("bench: %s %s N=%lld d=%lld needs about %s (Q, K, V, O%s%s), more than the "
                                       "%s available (MemAvailable); use smaller --n, --d, --batch or --heads",
                                       names[c], p ? "bwd" : "fwd", ns[b], ds[a],
                                       cli_bytes(need >= 1.8e19 ? SIZE_MAX : (size_t)need, b1, sizeof b1),
                                       p ? ", the gradients" : "",
                                       strcmp(names[c], "standard") == 0 || strcmp(names[c], "blas") == 0
                                           ? ", the N x N scores" : "",
                                       cli_bytes((size_t)avail, b2, sizeof b2));
                    const int runs = 1 + (cfg.warmup > 1 ? cfg.warmup - 1 : 0) + cfg.repeats + (p ? 1 : 0);
                    double f = runs * run_flops(p, (double)ns[b], (double)ds[a], &cfg);
                    if (strcmp(names[c], "reference") == 0) reference_flops += f;
                    else seconds_at_peak_flops += f;
                }

    fa_cpu_info info;
    if (fa_get_cpu_info(&info) != FA_OK) return cli_die("bench: %s", fa_last_error());
    cfg.isa = info.isa;
    /* the FMA peak of each thread count: more threads than CPUs add no FMA
     * throughput, only time */
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    double peaks[MAX_LIST];
    int probed_fewer = 0, max_threads = 0;
    for (int t = 0; t < nt; t++) {
        const int probe_threads = cpus > 0 && ts[t] > cpus ? (int)cpus : (int)ts[t];
        probed_fewer |= probe_threads < ts[t];
        peaks[t] = measure_peak(info.isa, probe_threads);
        if (ts[t] > max_threads) max_threads = (int)ts[t];
    }
    cfg.peak = peaks[0];
    /* time: bounded below by the FLOPs at the measured peak of each thread count */
    double peak_seconds_per_flop = 0.0; /* sum over the thread counts of 1 / peak */
    for (int t = 0; t < nt; t++) peak_seconds_per_flop += peaks[t] > 0 ? 1.0 / (peaks[t] * 1e9) : 0.0;
    if (reference_flops > 0) {
        /* at the most threads: the fastest the reference runs, so still a lower bound */
        double ref_rate = measure_reference_gflops(max_threads);
        if (ref_rate > 0 && reference_flops / (ref_rate * 1e9) > max_seconds)
            return cli_die("bench: the reference runs asked for need about %.3g s (%.3g FLOP at the "
                           "reference's measured %.2f GFLOP/s), more than --max-seconds %.3g; use smaller "
                           "sizes or raise --max-seconds",
                           reference_flops / (ref_rate * 1e9), reference_flops, ref_rate, max_seconds);
        /* in the FLOPs at the peak that take the same time; unmeasured: at the peak (a lower bound) */
        const double ref_secs = ref_rate > 0 ? reference_flops / (ref_rate * 1e9) : 0.0;
        seconds_at_peak_flops += peak_seconds_per_flop > 0 && ref_secs > 0 ? ref_secs * nt / peak_seconds_per_flop
                                                                           : reference_flops;
    }
    if (peak_seconds_per_flop > 0) {
        double secs = seconds_at_peak_flops * peak_seconds_per_flop;
        if (secs > max_seconds)
            return cli_die("bench: the runs asked for need at least %.3g s (%.3g FLOP at the measured FMA peak of "
                           "%.1f GFLOP/s%s), more than --max-seconds %.3g; use smaller sizes or raise --max-seconds",
                           secs, seconds_at_peak_flops, cfg.peak, nt > 1 ? " and the other thread counts'" : "",
                           max_seconds);
    }

#ifdef FA_HAVE_BLAS
    /* OpenBLAS opened now that every refusal is behind, and only when a blas row will run
     * (float32 forward rows); a library removed since the build drops blas from the default list */
    for (int c = 0; c < nimpl; c++) {
        if (strcmp(names[c], "blas") != 0 || cfg.dtype != FA_F32 || !do_pass[0]) continue;
        if (blas_open(impls_given, most_threads, blas_row_bytes) == 0) continue;
        if (impls_given) return 2;
        for (int x = c; x + 1 < nimpl; x++) names[x] = names[x + 1];
        nimpl--, c--;
    }
#else
    (void)impls_given;
#endif

    fa_outfile csv;
    int csv_rows = 0;
    if (csv_path) {
        cli_cleanup_on_signals();
        if (fa_outfile_open(&csv, csv_path) != FA_OK) return cli_die_npy(FA_ERR_IO);
        cfg.csv = &csv;
        cfg.csv_rows = &csv_rows;
        if (fa_outfile_write(&csv, csv_header, sizeof csv_header - 1) != FA_OK) {
            fa_outfile_abort(&csv);
            return cli_die_npy(FA_ERR_IO);
        }
    }

    char model[256];
    cpu_model(model, sizeof model);
    printf("flashattn bench — %s, %ld logical CPUs\n", model, cpus);
    if (nt == 1) {
        printf("ISA %s (%d float32 lanes), %d thread%s, measured FMA peak %.1f GFLOP/s%s\n", info.isa,
               info.simd_width, cfg.threads, cfg.threads == 1 ? "" : "s", cfg.peak,
               probed_fewer ? " (probed on as many threads as CPUs)" : "");
    } else {
        printf("ISA %s (%d float32 lanes), measured FMA peak", info.isa, info.simd_width);
        for (int t = 0; t < nt; t++)
            printf("%s %.1f GFLOP/s on %lld thread%s", t ? "," : "", peaks[t], ts[t], ts[t] == 1 ? "" : "s");
        printf("%s; each row runs the thread counts back to back\n",
               probed_fewer ? " (probed on at most as many threads as CPUs)" : "");
    }
    amx_note(info.isa);
    char maskdesc[160];
    int ml = snprintf(maskdesc, sizeof maskdesc, "%s", cfg.causal ? "causal" : "non-causal");
    if (cfg.window_left >= 0 || (!cfg.causal && cfg.window_right >= 0))
        ml += snprintf(maskdesc + ml, sizeof maskdesc - (size_t)ml, ", window (%lld, %lld)",
                       (long long)cfg.window_left, (long long)(cfg.causal ? 0 : cfg.window_right));
    if (cfg.softcap > 0) snprintf(maskdesc + ml, sizeof maskdesc - (size_t)ml, ", softcap %g", cfg.softcap);
    const int windowed = cfg.window_left >= 0 || (!cfg.causal && cfg.window_right >= 0);
    printf("%s inputs, batch %lld, heads %lld (kv heads %lld), %s; FLOPs = %s per head%s\n",
           cfg.dtype == FA_F32 ? "float32" : cfg.dtype == FA_F16 ? "float16" : "bfloat16", (long long)cfg.batch, (long long)cfg.heads, (long long)cfg.heads_k, maskdesc,
           windowed ? "4*d per visible (query, key) pair" : cfg.causal ? "4*N^2*d / 2" : "4*N^2*d",
           do_pass[1] ? ", x2.5 for bwd" : "");
    printf("times are median (min, max) of >= %d runs after %d warm-up; check = max |err| of the last %d rows vs float64%s\n",
           cfg.repeats, cfg.warmup, CHECK_ROWS,
           do_pass[1] ? " (bwd: dQ error / (1e-6 + 1e-4 max|ref|), <= 1 passes)" : "");
    if (do_pass[1])
        for (int c = 0; c < nimpl; c++)
            if (!has_backward(names[c])) printf("(%s has no backward pass: no bwd rows for it)\n", names[c]);
    for (int c = 0; c < nimpl; c++)
        if (cfg.dtype != FA_F32 && strcmp(names[c], "blas") == 0)
            printf("(blas is sgemm on float32 inputs: no rows for it with --dtype %s)\n", fa_dtype_name(cfg.dtype));
    cfg.show_threads = nt > 1;
    printf("\n%s%-9s %-4s %-8s %6s %4s %9s %9s %9s %8s %7s %9s %9s %9s\n", cfg.show_threads ? " thr " : "", "impl", "pass", "isa", "N", "d", "med_ms",
           "min_ms", "max_ms", "GFLOP/s", "peak", "rss_MiB", "lib_MiB", "check");
    fflush(stdout);
    /* GFLOP/s of every row and thread count, for the scaling lines */
    static double rate[MAX_LIST][MAX_LIST][2][8][MAX_LIST];

    uint64_t rng = 0x5eed1234abcdull;
    int rc = 0;
    for (int a = 0; a < nd; a++)
        for (int b = 0; b < nn; b++)
            for (int p = 0; p < 2; p++)
                for (int c = 0; c < nimpl; c++) {
                    if (!do_pass[p] || (p == 1 && !has_backward(names[c]))) continue;
                    if (cfg.dtype != FA_F32 && strcmp(names[c], "blas") == 0) continue; /* float32 only */
                    const uint64_t row_rng = rng; /* every thread count gets the same inputs */
                    for (int t = 0; t < nt; t++) {
                        cfg.threads = (int)ts[t];
                        cfg.peak = peaks[t];
                        rng = row_rng;
                        int r = bench_one(names[c], p, ns[b], ds[a], &cfg, &rng, &rate[a][b][p][c][t]);
                        if (r > rc) rc = r;
                    }
                }
    if (nt > 1) { /* scaling, from the rows above (same run, thread counts back to back) */
        printf("\nscaling: GFLOP/s over the %lld-thread row's, and fraction of each thread count's peak\n", ts[0]);
        for (int a = 0; a < nd; a++)
            for (int b = 0; b < nn; b++)
                for (int p = 0; p < 2; p++)
                    for (int c = 0; c < nimpl; c++) {
                        const double *g = rate[a][b][p][c];
                        if (!do_pass[p] || !(g[0] > 0)) continue;
                        printf("%-9s %-4s N=%-6lld d=%-4lld", names[c], p ? "bwd" : "fwd", ns[b], ds[a]);
                        for (int t = 1; t < nt; t++)
                            if (g[t] > 0) printf("  %lld thr %.2fx", ts[t], g[t] / g[0]);
                        printf("   of peak:");
                        for (int t = 0; t < nt; t++)
                            if (g[t] > 0 && peaks[t] > 0) printf(" %.1f%%", 100.0 * g[t] / peaks[t]);
                        printf("\n");
                    }
    }
    /* the rows measured are facts even if another configuration failed: keep them (none and a
     * failure: the old file stays as it was) */
    if (cfg.csv) {
        if (rc != 0 && csv_rows == 0) fa_outfile_abort(&csv);
        else if (fa_outfile_commit(&csv) != FA_OK) rc = cli_die_npy(FA_ERR_IO);
        fa_outfile_free(&csv);
    }
    return rc;
}

int cmd_bench(int argc, char **argv)
{
    cli_guard_runtime_exit();
    return cli_finish(bench_main(argc, argv));
}
