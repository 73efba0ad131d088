/*
 * flashattn_cuda.cu — the harness of the CUDA ladder: build/cuda/flashattn-cuda.
 *
 *   flashattn-cuda --kernel 01|02|03|03b|04|04b|04bd|05|05ws|05pp [--batch B] [--heads H] [--heads-k HK]
 *                  [--seqlen-q N] [--seqlen-k N] [--seqlen N] [--d 64|128]
 *                  [--causal] [--window L,R] [--softcap C] [--scale S] [--dtype bf16|fp16]
 *                  [--repeats R] [--max-seconds S] [--sample-rows K] [--grad-ref auto|reference|flash|none]
 *                  [--no-time] [--seed S] [--threads T] [--save DIR] [--csv FILE]
 *   flashattn-cuda --self-test      (no GPU needed: parsing, mask rule, validation path)
 *
 * What one run does, in the order of llm.c's dev/cuda and STYLE.md point 7:
 *   1. random inputs (normal, seeded; never zeros) in the dtype, on the host;
 *   2. the rung runs once on outputs poisoned with NaN, so an element it never
 *      writes fails the check;
 *   3. the result is copied back and validated by libflashattn itself:
 *      forward rungs with fa_check() — FlashAttention's rule (max error at most
 *      2x a plain attention in the same precision, plus a small atol), the same
 *      verdict `flashattn check` gives — for O and the LSE; the backward rung
 *      with the normwise part of `flashattn check-grad`'s rule (src/cli/cmd_check_grad.c:
 *      max|G - G_ref| <= 1e-6 + rtol max|G_ref|, rtol 5e-2 bf16, 1e-2 fp16; its 2 e32
 *      term, for gradients small by cancellation, is not needed on these random inputs)
 *      for dQ, dK and dV against fa_backward(). A failure prints the report (worst
 *      element as (batch, row, head, col)) and exits 1;
 *   4. timing: CUDA events around the rung alone, one warm-up, then the median of
 *      R repeats, L2 flushed before each (a 2 x L2 buffer is overwritten), and
 *      TFLOP/s with FlashAttention's count: forward 4 Sq Sk d per (batch, head),
 *      halved when causal (windows: the visible pairs, counted), backward 2.5x;
 *   5. the FP32 FMA ceiling of the same card, measured in the same process
 *      (fma_probe.cu), and the rung's fraction of it.
 * Exit status: 0 validated (and timed), 1 validation failed, 2 bad usage or a CUDA error,
 * 3 timed but not validated (a backward run beyond the CPU reference's budget, --grad-ref).
 *
 * Validation cost: the float64 reference is O(Sq Sk d) per head on the CPU. By
 * default (--sample-rows -1) a forward check covers all rows while
 * batch x heads x Sq x Sk x d <= 2^31, else 32 random rows per (batch, head),
 * exactly (fa_check's sampling); the backward reference is float64
 * (FA_IMPL_REFERENCE) up to 2^31, libflashattn's float32 flash backward (tested
 * against the float64 one in tests/) up to 2^40 (N = 16384, 16 heads, d = 128 is
 * 2^39: ~40 s on 16 cores), and skipped above — the output says which, and so
 * does the CSV's `check` column (pass, pass-sampled, pass-f32ref, skipped).
 */
#include "ladder.h"

#include "flashattn.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <vector>

/* ============================================================================
 * Options and their parsing (no CUDA here: the self-test runs it on any machine)
 * ========================================================================== */

enum rung {
    RUNG_NAIVE = 0, RUNG_FLASH1, RUNG_FLASH2, RUNG_FLASH2_BWD, RUNG_MMA, RUNG_MMA_BWD, RUNG_MMA_BWD_DET, RUNG_HOPPER,
    RUNG_HOPPER_WS, RUNG_HOPPER_PP, RUNG_COUNT
};
static const char *const rung_ids[RUNG_COUNT] = {"01", "02", "03", "03b", "04", "04b", "04bd", "05", "05ws", "05pp"};
static const char *const rung_names[RUNG_COUNT] = {"01_naive", "02_flash1", "03_flash2", "03b_flash2_bwd", "04_mma",
                                                   "04b_mma_bwd", "04bd_mma_bwd_det", "05_hopper",
                                                   "05ws_hopper_tma", "05pp_hopper_pingpong"};

/* A backward rung, and the forward rung whose O and LSE it consumes. */
static bool is_bwd(int kernel) { return kernel == RUNG_FLASH2_BWD || kernel == RUNG_MMA_BWD || kernel == RUNG_MMA_BWD_DET; }
static int fwd_of(int kernel) { return kernel == RUNG_MMA_BWD || kernel == RUNG_MMA_BWD_DET ? RUNG_MMA : RUNG_FLASH2; }

enum grad_ref { GREF_AUTO = 0, GREF_REFERENCE, GREF_FLASH, GREF_NONE };

struct harness_opts {
    int kernel;           /* rung; -1 until given */
    int batch, heads, heads_k, seqlen_q, seqlen_k, d;
    int causal;
    long long window_left, window_right; /* as given; -1 unbounded */
    double softcap, scale;               /* scale 0: 1/sqrt(d) */
    cuda_dtype dtype;
    int repeats;
    double max_seconds;   /* timing budget per run */
    long long sample_rows; /* -1 auto, 0 all, K */
    int grad_ref;
    int no_time;
    unsigned long long seed;
    int threads;
    const char *save_dir, *csv;
    int self_test, help;
};

static const char usage_text[] =
    "usage: flashattn-cuda --kernel 01|02|03|03b|04|04b|04bd|05|05ws|05pp [shape] [mask] [--dtype bf16|fp16] [run options]\n"
    "       flashattn-cuda --self-test\n"
    "\n"
    "Runs one rung of the CUDA ladder on random inputs, validates its output with libflashattn\n"
    "(fa_check: FlashAttention's rule, as `flashattn check`; the backward rung as `flashattn\n"
    "check-grad`), then times it (CUDA events, median, L2 flushed) against the card's FP32 FMA ceiling.\n"
    "\n"
    "  --kernel NN        01 naive (S, P in global memory), 02 FlashAttention-1 loop order,\n"
    "                     03 FlashAttention-2 forward, 03b FlashAttention-2 backward (CUDA cores),\n"
    "                     04 forward, 04b backward on tensor cores (mma.sync; 04b: FlashAttention-2's\n"
    "                     single pass, dQ by float atomics; 04bd: the deterministic split, dQ by its own kernel),\n"
    "                     05 forward on Hopper's wgmma (sm_90a only; 05ws: fed by TMA, producer warpgroup;\n"
    "                     05pp: 05ws with FlashAttention-3's ping-pong of the two consumer warpgroups)\n"
    "shape:  --batch B (1) --heads H (16) --heads-k HK (= H) --seqlen-q N --seqlen-k N (1024)\n"
    "        --seqlen N (both) --d 64|128 (128)\n"
    "mask:   --causal  --window L,R (-1 = unbounded)  --softcap C  --scale S (default 1/sqrt(d))\n"
    "run:    --dtype bf16|fp16 (bf16)  --repeats R (20)  --max-seconds S (timing budget, 3)\n"
    "        --no-time (validate only)  --sample-rows K (-1 auto, 0 all rows)\n"
    "        --grad-ref auto|reference|flash|none  --seed S (1)  --threads T (CPU check threads)\n"
    "        --save DIR (q, k, v, o, lse[, do, dq, dk, dv] as .npy for `flashattn check`)\n"
    "        --csv FILE (append one row)  --self-test\n"
    "\n"
    "Exit status: 0 validated, 1 validation failed, 2 bad usage or CUDA error.\n";

static void opts_default(harness_opts *o)
{
    memset(o, 0, sizeof *o);
    o->kernel = -1;
    o->batch = 1;
    o->heads = 16;
    o->heads_k = 0; /* = heads */
    o->seqlen_q = o->seqlen_k = 1024;
    o->d = 128;
    o->window_left = o->window_right = -1;
    o->dtype = DT_BF16;
    o->repeats = 20;
    o->max_seconds = 3.0;
    o->sample_rows = -1;
    o->grad_ref = GREF_AUTO;
    o->seed = 1;
}

static int fail_msg(char *err, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, n, fmt, ap);
    va_end(ap);
    return -1;
}

static int parse_ll(const char *flag, const char *s, long long lo, long long hi, long long *out, char *err, size_t n)
{
    char *end;
    errno = 0;
    long long x = strtoll(s, &end, 10);
    if (!*s || *end || errno || x < lo || x > hi)
        return fail_msg(err, n, "%s: expected an integer in [%lld, %lld], got '%s'", flag, lo, hi, s);
    *out = x;
    return 0;
}

static int parse_dbl(const char *flag, const char *s, double *out, char *err, size_t n)
{
    char *end;
    errno = 0;
    double x = strtod(s, &end);
    if (!*s || *end || errno || !isfinite(x)) return fail_msg(err, n, "%s: expected a finite number, got '%s'", flag, s);
    *out = x;
    return 0;
}

/* Parse argv into o. 0 on success; -1 with a one-line message in err. */
static int parse_args(int argc, char **argv, harness_opts *o, char *err, size_t n)
{
    opts_default(o);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        long long x;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { o->help = 1; continue; }
        if (!strcmp(a, "--self-test")) { o->self_test = 1; continue; }
        if (!strcmp(a, "--causal")) { o->causal = 1; continue; }
        if (!strcmp(a, "--no-time")) { o->no_time = 1; continue; }
        /* every other option takes a value */
        static const char *const valued[] = {"--kernel", "--batch", "--heads", "--heads-k", "--seqlen-q",
                                             "--seqlen-k", "--seqlen", "--d", "--window", "--softcap", "--scale",
                                             "--dtype", "--repeats", "--max-seconds", "--sample-rows",
                                             "--grad-ref", "--seed", "--threads", "--save", "--csv"};
        int known = 0;
        for (size_t v = 0; v < sizeof valued / sizeof *valued; v++) known |= !strcmp(a, valued[v]);
        if (!known) return fail_msg(err, n, "unknown option '%s' (see --help)", a);
        if (i + 1 >= argc) return fail_msg(err, n, "%s: missing value", a);
        const char *val = argv[++i];
        if (!strcmp(a, "--kernel")) {
            o->kernel = -1;
            for (int r = 0; r < RUNG_COUNT; r++)
                if (!strcmp(val, rung_ids[r]) || !strcmp(val, rung_names[r])) o->kernel = r;
            if (o->kernel < 0) return fail_msg(err, n, "--kernel: unknown rung '%s' (expected 01, 02, 03, 03b, 04, 04b, 04bd, 05, 05ws or 05pp)", val);
        } else if (!strcmp(a, "--batch")) {
            if (parse_ll(a, val, 1, 65535, &x, err, n)) return -1;
            o->batch = (int)x;
        } else if (!strcmp(a, "--heads")) {
            if (parse_ll(a, val, 1, 65535, &x, err, n)) return -1;
            o->heads = (int)x;
        } else if (!strcmp(a, "--heads-k")) {
            if (parse_ll(a, val, 1, 65535, &x, err, n)) return -1;
            o->heads_k = (int)x;
        } else if (!strcmp(a, "--seqlen-q") || !strcmp(a, "--seqlen-k") || !strcmp(a, "--seqlen")) {
            if (parse_ll(a, val, 1, 1 << 20, &x, err, n)) return -1;
            if (strcmp(a, "--seqlen-k")) o->seqlen_q = (int)x;
            if (strcmp(a, "--seqlen-q")) o->seqlen_k = (int)x;
        } else if (!strcmp(a, "--d")) {
            if (parse_ll(a, val, 1, 4096, &x, err, n)) return -1;
            if (x != 64 && x != 128) return fail_msg(err, n, "--d: this ladder has kernels for d = 64 and 128, got %lld", x);
            o->d = (int)x;
        } else if (!strcmp(a, "--window")) {
            const char *comma = strchr(val, ',');
            char left[64];
            if (!comma || (size_t)(comma - val) >= sizeof left)
                return fail_msg(err, n, "--window: expected L,R (e.g. 128,0; -1 = unbounded), got '%s'", val);
            memcpy(left, val, (size_t)(comma - val));
            left[comma - val] = '\0';
            if (parse_ll("--window (left)", left, -1, 1LL << 40, &o->window_left, err, n)) return -1;
            if (parse_ll("--window (right)", comma + 1, -1, 1LL << 40, &o->window_right, err, n)) return -1;
        } else if (!strcmp(a, "--softcap")) {
            if (parse_dbl(a, val, &o->softcap, err, n)) return -1;
            if (o->softcap < 0) return fail_msg(err, n, "--softcap: must be >= 0 (0 = off), got '%s'", val);
        } else if (!strcmp(a, "--scale")) {
            if (parse_dbl(a, val, &o->scale, err, n)) return -1;
            if (o->scale == 0) return fail_msg(err, n, "--scale: must be non-zero (omit it for the default 1/sqrt(d))");
        } else if (!strcmp(a, "--dtype")) {
            if (!strcmp(val, "bf16")) o->dtype = DT_BF16;
            else if (!strcmp(val, "fp16") || !strcmp(val, "f16")) o->dtype = DT_FP16;
            else return fail_msg(err, n, "--dtype: expected bf16 or fp16, got '%s'", val);
        } else if (!strcmp(a, "--repeats")) {
            if (parse_ll(a, val, 1, 100000, &x, err, n)) return -1;
            o->repeats = (int)x;
        } else if (!strcmp(a, "--max-seconds")) {
            if (parse_dbl(a, val, &o->max_seconds, err, n)) return -1;
            if (o->max_seconds <= 0) return fail_msg(err, n, "--max-seconds: must be > 0, got '%s'", val);
        } else if (!strcmp(a, "--sample-rows")) {
            if (parse_ll(a, val, -1, 1LL << 40, &o->sample_rows, err, n)) return -1;
        } else if (!strcmp(a, "--grad-ref")) {
            if (!strcmp(val, "auto")) o->grad_ref = GREF_AUTO;
            else if (!strcmp(val, "reference")) o->grad_ref = GREF_REFERENCE;
            else if (!strcmp(val, "flash")) o->grad_ref = GREF_FLASH;
            else if (!strcmp(val, "none")) o->grad_ref = GREF_NONE;
            else return fail_msg(err, n, "--grad-ref: expected auto, reference, flash or none, got '%s'", val);
        } else if (!strcmp(a, "--seed")) {
            if (parse_ll(a, val, 0, (long long)(~0ULL >> 1), &x, err, n)) return -1;
            o->seed = (unsigned long long)x;
        } else if (!strcmp(a, "--threads")) {
            if (parse_ll(a, val, 1, 4096, &x, err, n)) return -1;
            o->threads = (int)x;
        } else if (!strcmp(a, "--save")) {
            o->save_dir = val;
        } else if (!strcmp(a, "--csv")) {
            o->csv = val;
        }
    }
    if (o->help || o->self_test) return 0;
    if (o->kernel < 0) return fail_msg(err, n, "missing --kernel NN (01, 02, 03, 03b, 04, 04b, 04bd, 05, 05ws or 05pp; see --help)");
    if (o->heads_k == 0) o->heads_k = o->heads;
    if (o->heads % o->heads_k != 0)
        return fail_msg(err, n, "--heads (%d) is not a multiple of --heads-k (%d)", o->heads, o->heads_k);
    /* rung 01 launches one block row per query row (grid.y) and one per (batch, head) (grid.z):
     * CUDA caps both at 65535 */
    if (o->kernel == RUNG_NAIVE && (o->seqlen_q > 65535 || (long long)o->batch * o->heads > 65535))
        return fail_msg(err, n, "--kernel 01: seqlen_q (%d) and batch x heads (%lld) must be at most 65535 "
                        "(its grid's y and z limits)", o->seqlen_q, (long long)o->batch * o->heads);
    if (is_bwd(o->kernel) && o->no_time && o->grad_ref == GREF_NONE)
        return fail_msg(err, n, "--grad-ref none with --no-time leaves nothing to do");
    return 0;
}

/* The problem the kernels see. */
static attn_shape make_shape(const harness_opts *o)
{
    attn_shape s;
    s.batch = o->batch;
    s.seqlen_q = o->seqlen_q;
    s.seqlen_k = o->seqlen_k;
    s.heads = o->heads;
    s.heads_k = o->heads_k;
    s.d = o->d;
    s.scale = (float)(o->scale != 0 ? o->scale : 1.0 / sqrt((double)o->d));
    s.softcap = (float)o->softcap;
    s.window_left = o->window_left;
    s.window_right = o->causal ? 0 : o->window_right;
    return s;
}

/* The same problem as libflashattn options (always through fa_options_default()). */
static fa_options make_fa_options(const harness_opts *o, const attn_shape &s)
{
    fa_options opt = fa_options_default();
    opt.scale = s.scale;
    opt.causal = o->causal;
    opt.window_left = o->window_left;
    opt.window_right = o->window_right;
    opt.softcap = o->softcap;
    return opt;
}

/* Visible (query, key) pairs: Sq Sk without a mask, Sq Sk / 2 when causal with Sq = Sk
 * (FlashAttention's convention), counted exactly otherwise (bottom-right causal with Sq != Sk
 * is not half: Sq = 1 sees all Sk keys). */
static double visible_pairs(const harness_opts *o, const attn_shape &s)
{
    if (o->window_left < 0 && s.window_right < 0) return (double)s.seqlen_q * s.seqlen_k;
    if (o->causal && o->window_left < 0 && s.seqlen_q == s.seqlen_k) return 0.5 * s.seqlen_q * s.seqlen_k;
    double n = 0;
    for (long long i = 0; i < s.seqlen_q; i++) {
        long long lo, hi;
        mask_key_range(s, i, i + 1, &lo, &hi);
        if (hi > lo) n += (double)(hi - lo);
    }
    return n;
}

/* FlashAttention's FLOP count: forward 4 d per visible pair per (batch, head); backward 2.5x. */
static double flop_count(const harness_opts *o, const attn_shape &s)
{
    const double fwd = 4.0 * s.d * visible_pairs(o, s) * s.batch * s.heads;
    return is_bwd(o->kernel) ? 2.5 * fwd : fwd;
}

/* ============================================================================
 * Host data: random inputs, dtype conversion, .npy output
 * ========================================================================== */

typedef uint16_t h16; /* a bf16 or fp16 bit pattern on the host */

static float h16_to_float(h16 x, cuda_dtype t)
{
    if (t == DT_BF16) {
        uint32_t u = (uint32_t)x << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    __half h;
    memcpy(&h, &x, 2);
    return __half2float(h);
}

static h16 float_to_h16(float f, cuda_dtype t)
{
    h16 out;
    if (t == DT_BF16) {
        __nv_bfloat16 b = __float2bfloat16_rn(f);
        memcpy(&out, &b, 2);
    } else {
        __half h = __float2half_rn(f);
        memcpy(&out, &h, 2);
    }
    return out;
}

/* splitmix64 -> normal(0, 1) by Box-Muller. */
struct rng {
    uint64_t s;
    uint64_t next()
    {
        uint64_t z = (s += 0x9e3779b97f4a7c15ULL);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        return z ^ (z >> 31);
    }
    double uniform() { return ((next() >> 11) + 0.5) * (1.0 / 9007199254740992.0); }
    double normal() { return sqrt(-2.0 * log(uniform())) * cos(6.283185307179586 * uniform()); }
};

/* x[i] ~ normal(0, 1) rounded to t. Chunks of 2^16 elements draw from their own
 * stream (seed, chunk), so the values do not depend on the thread count. */
static void fill_normal(std::vector<h16> &x, size_t n, uint64_t seed, cuda_dtype t)
{
    x.resize(n);
    const long long chunks = (long long)((n + 65535) / 65536);
#pragma omp parallel for schedule(static)
    for (long long c = 0; c < chunks; c++) {
        rng r{seed * 0x9e3779b97f4a7c15ULL + (uint64_t)c * 0xd1b54a32d192ed03ULL};
        const size_t end = std::min(n, (size_t)(c + 1) * 65536);
        for (size_t i = (size_t)c * 65536; i < end; i++) x[i] = float_to_h16((float)r.normal(), t);
    }
}

/* numpy .npy, version 1.0, C order. descr: "<u2" (bf16 bit patterns), "<f2", "<f4". */
static int write_npy(const char *dir, const char *name, const char *descr, const void *data, size_t elsize,
                     int rank, const long long *shape)
{
    char path[4096], hdr[256], shp[128] = "";
    snprintf(path, sizeof path, "%s/%s", dir, name);
    size_t n = 1;
    for (int r = 0; r < rank; r++) {
        char piece[32];
        snprintf(piece, sizeof piece, "%lld%s", shape[r], rank == 1 ? "," : r + 1 < rank ? ", " : "");
        strcat(shp, piece);
        n *= (size_t)shape[r];
    }
    int len = snprintf(hdr, sizeof hdr, "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }", descr, shp);
    const int total = ((10 + len + 1 + 63) / 64) * 64; /* magic(6) ver(2) len(2) + header + '\n', 64-aligned */
    while (10 + len + 1 < total) hdr[len++] = ' ';
    hdr[len++] = '\n';
    FILE *f = fopen(path, "wb");
    if (!f) {
        fprintf(stderr, "flashattn-cuda: --save: cannot write %s: %s\n", path, strerror(errno));
        return -1;
    }
    const unsigned char magic[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(len & 0xff),
                                     (unsigned char)(len >> 8)};
    int ok = fwrite(magic, 1, 10, f) == 10 && fwrite(hdr, 1, (size_t)len, f) == (size_t)len &&
             fwrite(data, elsize, n, f) == n;
    if (fclose(f) != 0) ok = 0;
    if (!ok) {
        fprintf(stderr, "flashattn-cuda: --save: short write to %s\n", path);
        remove(path);
        return -1;
    }
    return 0;
}

/* ============================================================================
 * Validation through libflashattn
 * ========================================================================== */

/* Host tensors of one problem (BSHD, as the kernels use them). */
struct host_problem {
    attn_shape s;
    cuda_dtype dtype;
    std::vector<h16> q, k, v, o, dout, dq, dk, dv;
    std::vector<float> lse;
};

static fa_dtype fa_dt(cuda_dtype t) { return t == DT_BF16 ? FA_BF16 : FA_F16; }

static void tensor4(fa_tensor *t, void *data, fa_dtype dt, long long a, long long b, long long c, long long d)
{
    const int64_t shape[4] = {a, b, c, d};
    fa_tensor_make(t, data, dt, 4, shape, NULL);
}

/* fa_check on O and LSE. Prints the report; returns 1 pass, 0 fail, -1 error. */
/* print: 0 never, 1 on failure, 2 always. */
static int check_forward(host_problem &hp, const harness_opts *o, long long sample_rows, const char *label,
                         int print, char *summary, size_t summary_n)
{
    const attn_shape &s = hp.s;
    const fa_dtype dt = fa_dt(hp.dtype);
    fa_tensor q, k, v, out, lse;
    tensor4(&q, hp.q.data(), dt, s.batch, s.seqlen_q, s.heads, s.d);
    tensor4(&k, hp.k.data(), dt, s.batch, s.seqlen_k, s.heads_k, s.d);
    tensor4(&v, hp.v.data(), dt, s.batch, s.seqlen_k, s.heads_k, s.d);
    tensor4(&out, hp.o.data(), dt, s.batch, s.seqlen_q, s.heads, s.d);
    const int64_t lshape[3] = {s.batch, s.heads, s.seqlen_q};
    fa_tensor_make(&lse, hp.lse.data(), FA_F32, 3, lshape, NULL);
    fa_options attn = make_fa_options(o, s);
    fa_check_options co = fa_check_options_default();
    co.dtype = dt;
    co.sample_rows = sample_rows;
    co.seed = o->seed;
    co.num_threads = o->threads;
    co.out_name = label;
    co.lse_name = "lse";
    fa_check_report rep = fa_check_report_init();
    fa_status st = fa_check(&q, &k, &v, &out, &lse, &attn, &co, &rep);
    if (st != FA_OK) {
        fprintf(stderr, "flashattn-cuda: fa_check: %s\n", fa_last_error());
        return -1;
    }
    const int pass = rep.pass;
    if (print == 2 || (print == 1 && !pass)) {
        const size_t need = fa_check_report_format(&rep, NULL, 0);
        std::vector<char> buf(need + 1);
        fa_check_report_format(&rep, buf.data(), buf.size());
        fputs(buf.data(), stdout);
    }
    if (summary)
        snprintf(summary, summary_n, "ratio %.3g row %.3g%s lse_err %.2g", rep.ratio, rep.row_ratio,
                 rep.sample_rows ? " sampled" : " all-rows", rep.lse_max_abs_err);
    fa_check_report_free(&rep);
    return pass;
}

/* One gradient under `flashattn check-grad`'s rule. */
struct grad_result {
    double max_err, max_ref, bound;
    long long n_fail, worst;
};

static grad_result compare_grad(const std::vector<h16> &test, cuda_dtype t, const std::vector<double> &ref,
                                double atol, double rtol)
{
    grad_result g = {0.0, 0.0, 0.0, 0, -1};
    for (size_t x = 0; x < ref.size(); x++) g.max_ref = std::max(g.max_ref, fabs(ref[x]));
    g.bound = atol + rtol * g.max_ref;
    for (size_t x = 0; x < ref.size(); x++) {
        const double tv = h16_to_float(test[x], t);
        const double err = isfinite(tv) ? fabs(tv - ref[x]) : INFINITY;
        if (err > g.bound) g.n_fail++;
        if (g.worst < 0 || err > g.max_err) {
            g.max_err = err;
            g.worst = (long long)x;
        }
    }
    return g;
}

/* dQ, dK, dV against fa_backward (impl: reference float64 or flash float32). 1 pass, 0 fail, -1 error. */
static int check_backward(host_problem &hp, const harness_opts *o, fa_impl impl, int print, char *summary,
                          size_t summary_n)
{
    const attn_shape &s = hp.s;
    const fa_dtype dt = fa_dt(hp.dtype);
    fa_tensor q, k, v, dout, ref[3];
    tensor4(&q, hp.q.data(), dt, s.batch, s.seqlen_q, s.heads, s.d);
    tensor4(&k, hp.k.data(), dt, s.batch, s.seqlen_k, s.heads_k, s.d);
    tensor4(&v, hp.v.data(), dt, s.batch, s.seqlen_k, s.heads_k, s.d);
    tensor4(&dout, hp.dout.data(), dt, s.batch, s.seqlen_q, s.heads, s.d);
    const long long shapes[3][4] = {{s.batch, s.seqlen_q, s.heads, s.d},
                                    {s.batch, s.seqlen_k, s.heads_k, s.d},
                                    {s.batch, s.seqlen_k, s.heads_k, s.d}};
    std::vector<double> refmem[3];
    for (int x = 0; x < 3; x++) {
        refmem[x].assign((size_t)(shapes[x][0] * shapes[x][1] * shapes[x][2] * shapes[x][3]), 0.0);
        tensor4(&ref[x], refmem[x].data(), FA_F64, shapes[x][0], shapes[x][1], shapes[x][2], shapes[x][3]);
    }
    fa_options opt = make_fa_options(o, s);
    opt.impl = impl;
    opt.num_threads = o->threads;
    fa_status st = fa_backward(&q, &k, &v, NULL, NULL, &dout, &ref[0], &ref[1], &ref[2], &opt);
    if (st != FA_OK) {
        fprintf(stderr, "flashattn-cuda: fa_backward: %s\n", fa_last_error());
        return -1;
    }
    /* check-grad's defaults (src/cli/cmd_check_grad.c) */
    const double atol = 1e-6, rtol = hp.dtype == DT_BF16 ? 5e-2 : 1e-2;
    static const char *const names[3] = {"dQ", "dK", "dV"};
    const std::vector<h16> *tests[3] = {&hp.dq, &hp.dk, &hp.dv};
    if (print) printf("rule (flashattn check-grad): max|G_test - G_ref| <= atol + rtol * max|G_ref|, atol %.3g, rtol %.3g (%s);"
           " G_ref: fa_backward %s\n",
           atol, rtol, hp.dtype == DT_BF16 ? "bf16" : "f16", impl == FA_IMPL_REFERENCE ? "reference (float64)" : "flash (float32)");
    int all = 1;
    double worst_frac = 0;
    for (int x = 0; x < 3; x++) {
        grad_result g = compare_grad(*tests[x], hp.dtype, refmem[x], atol, rtol);
        const int pass = g.n_fail == 0 && g.max_err <= g.bound;
        all &= pass;
        worst_frac = std::max(worst_frac, g.max_ref > 0 ? g.max_err / g.max_ref : g.max_err);
        if (!print) continue;
        printf("%s %-4s max abs err %.3e  bound %.3e  max|ref| %.3e  failing %lld of %zu", names[x], pass ? "ok" : "FAIL",
               g.max_err, g.bound, g.max_ref, g.n_fail, refmem[x].size());
        if (!pass && g.worst >= 0) {
            long long idx[4], rem = g.worst;
            for (int r = 3; r >= 0; r--) {
                idx[r] = rem % shapes[x][r];
                rem /= shapes[x][r];
            }
            printf("; worst at (%lld, %lld, %lld, %lld): test %.6g, ref %.6g", idx[0], idx[1], idx[2], idx[3],
                   h16_to_float((*tests[x])[g.worst], hp.dtype), refmem[x][g.worst]);
        }
        printf("\n");
    }
    if (summary)
        snprintf(summary, summary_n, "max err/max|ref| %.3g vs %s", worst_frac,
                 impl == FA_IMPL_REFERENCE ? "f64 ref" : "f32 flash ref");
    return all;
}

/* ============================================================================
 * The self-test: everything but the GPU
 * ========================================================================== */

/* A plain float32 attention on the host with the kernels' own mask/logit/head
 * helpers (common.cuh), O rounded to the dtype. `shift` moves the mask's
 * diagonal (a deliberately wrong alignment when non-zero). */
static void host_attention(host_problem &hp, long long shift)
{
    const attn_shape &s = hp.s;
    hp.o.assign((size_t)s.batch * s.seqlen_q * s.heads * s.d, 0);
    hp.lse.assign((size_t)s.batch * s.heads * s.seqlen_q, 0.0f);
    std::vector<float> sc(s.seqlen_k), acc(s.d);
    for (int b = 0; b < s.batch; b++)
        for (int h = 0; h < s.heads; h++)
            for (int i = 0; i < s.seqlen_q; i++) {
                const h16 *qi = &hp.q[bshd(b, i, h, s.seqlen_q, s.heads, s.d)];
                float mx = -INFINITY;
                for (int j = 0; j < s.seqlen_k; j++) {
                    const h16 *kj = &hp.k[bshd(b, j, kv_head(s, h), s.seqlen_k, s.heads_k, s.d)];
                    float dot = 0;
                    for (int c = 0; c < s.d; c++) dot += h16_to_float(qi[c], hp.dtype) * h16_to_float(kj[c], hp.dtype);
                    sc[j] = mask_visible(s, i + shift, j) ? logit(s, dot * s.scale) : -INFINITY;
                    mx = std::max(mx, sc[j]);
                }
                float sum = 0;
                std::fill(acc.begin(), acc.end(), 0.0f);
                for (int j = 0; j < s.seqlen_k; j++) {
                    if (sc[j] == -INFINITY) continue;
                    const float pj = expf(sc[j] - mx);
                    sum += pj;
                    const h16 *vj = &hp.v[bshd(b, j, kv_head(s, h), s.seqlen_k, s.heads_k, s.d)];
                    for (int c = 0; c < s.d; c++) acc[c] += pj * h16_to_float(vj[c], hp.dtype);
                }
                h16 *oi = &hp.o[bshd(b, i, h, s.seqlen_q, s.heads, s.d)];
                for (int c = 0; c < s.d; c++) oi[c] = float_to_h16(sum > 0 ? acc[c] / sum : 0.0f, hp.dtype);
                hp.lse[((size_t)b * s.heads + h) * s.seqlen_q + i] = sum > 0 ? mx + logf(sum) : -INFINITY;
            }
}

static int st_failures = 0;
static void st_expect(int cond, const char *what)
{
    printf("  %-4s %s\n", cond ? "ok" : "FAIL", what);
    if (!cond) st_failures++;
}

static int self_test(void)
{
    char err[256];
    harness_opts o;
    printf("flashattn-cuda self-test (CPU only: parsing, mask rule, validation through libflashattn)\n");

    /* 1. parsing */
    {
        const char *good[] = {"x", "--kernel", "03", "--batch", "2", "--heads", "32", "--heads-k", "8",
                              "--seqlen-q", "100", "--seqlen-k", "300", "--d", "64", "--causal", "--window", "-1,4",
                              "--softcap", "30", "--dtype", "fp16", "--repeats", "7", "--save", "/tmp/x"};
        int rc = parse_args((int)(sizeof good / sizeof *good), (char **)good, &o, err, sizeof err);
        st_expect(rc == 0 && o.kernel == RUNG_FLASH2 && o.batch == 2 && o.heads == 32 && o.heads_k == 8 &&
                      o.seqlen_q == 100 && o.seqlen_k == 300 && o.d == 64 && o.causal && o.window_left == -1 &&
                      o.window_right == 4 && o.softcap == 30 && o.dtype == DT_FP16 && o.repeats == 7 &&
                      !strcmp(o.save_dir, "/tmp/x"),
                  "a full command line parses into the right fields");
        attn_shape s = make_shape(&o);
        st_expect(s.window_right == 0 && s.window_left == -1 && fabsf(s.scale - 0.125f) < 1e-7f,
                  "--causal sets window_right = 0; default scale is 1/sqrt(d)");
        const char *seq[] = {"x", "--kernel", "03b", "--seqlen", "4096"};
        rc = parse_args(5, (char **)seq, &o, err, sizeof err);
        st_expect(rc == 0 && o.seqlen_q == 4096 && o.seqlen_k == 4096 && o.heads_k == o.heads &&
                      o.kernel == RUNG_FLASH2_BWD,
                  "--seqlen sets both lengths; heads_k defaults to heads");
        const char *tc[] = {"x", "--kernel", "04b"}, *tc_name[] = {"x", "--kernel", "04_mma"};
        rc = parse_args(3, (char **)tc, &o, err, sizeof err);
        st_expect(rc == 0 && o.kernel == RUNG_MMA_BWD && is_bwd(o.kernel) && fwd_of(o.kernel) == RUNG_MMA,
                  "--kernel 04b is the tensor-core backward, fed by rung 04's forward");
        rc = parse_args(3, (char **)tc_name, &o, err, sizeof err);
        st_expect(rc == 0 && o.kernel == RUNG_MMA && !is_bwd(o.kernel), "--kernel 04_mma (by name) is the tensor-core forward");
        const char *det[] = {"x", "--kernel", "04bd"};
        rc = parse_args(3, (char **)det, &o, err, sizeof err);
        st_expect(rc == 0 && o.kernel == RUNG_MMA_BWD_DET && is_bwd(o.kernel) && fwd_of(o.kernel) == RUNG_MMA,
                  "--kernel 04bd is the deterministic tensor-core backward, fed by rung 04's forward");
        const char *hop[] = {"x", "--kernel", "05"};
        rc = parse_args(3, (char **)hop, &o, err, sizeof err);
        st_expect(rc == 0 && o.kernel == RUNG_HOPPER && !is_bwd(o.kernel), "--kernel 05 is the Hopper (wgmma) forward");
        const char *hws[] = {"x", "--kernel", "05ws"};
        rc = parse_args(3, (char **)hws, &o, err, sizeof err);
        st_expect(rc == 0 && o.kernel == RUNG_HOPPER_WS && !is_bwd(o.kernel), "--kernel 05ws is the TMA-fed Hopper forward");
        const char *hpp[] = {"x", "--kernel", "05pp"};
        rc = parse_args(3, (char **)hpp, &o, err, sizeof err);
        st_expect(rc == 0 && o.kernel == RUNG_HOPPER_PP && !is_bwd(o.kernel), "--kernel 05pp is the ping-pong Hopper forward");
        struct bad_case {
            const char *argv[4];
            int argc;
            const char *needle;
        } bad[] = {
            {{"x", "--kernel", "06"}, 3, "unknown rung"},
            {{"x", "--kernel", "03", "--d"}, 4, "missing value"},
            {{"x", "--kernel", "03", "--bogus"}, 4, "unknown option"},
            {{"x", "--seqlen", "64"}, 3, "missing --kernel"},
            {{"x", "--kernel", "03", "--dtype"}, 4, "missing value"},
        };
        for (auto &c : bad) {
            rc = parse_args(c.argc, (char **)c.argv, &o, err, sizeof err);
            char what[200];
            snprintf(what, sizeof what, "rejected with a message naming the problem: %s", err);
            st_expect(rc != 0 && strstr(err, c.needle) != NULL, what);
        }
        const char *badval[][3] = {{"--d", "96", "d = 64 and 128"},
                                   {"--dtype", "fp8", "expected bf16 or fp16"},
                                   {"--window", "3", "expected L,R"},
                                   {"--window", "a,0", "--window (left)"},
                                   {"--softcap", "-1", "must be >= 0"},
                                   {"--heads-k", "5", "not a multiple"},
                                   {"--seqlen", "0", "--seqlen"},
                                   {"--scale", "nan", "finite number"}};
        for (auto &c : badval) {
            const char *argv[] = {"x", "--kernel", "03", c[0], c[1]};
            rc = parse_args(5, (char **)argv, &o, err, sizeof err);
            char what[200];
            snprintf(what, sizeof what, "%s %s rejected: %s", c[0], c[1], err);
            st_expect(rc != 0 && strstr(err, c[2]) != NULL, what);
        }
    }

    /* 2. the mask helpers the kernels use agree with mask_visible, on every tile */
    {
        const long long wins[][2] = {{-1, -1}, {-1, 0}, {5, 3}, {0, 0}, {17, -1}};
        const int lens[][2] = {{70, 130}, {130, 70}, {64, 64}, {1, 200}};
        int ok = 1;
        for (auto &w : wins)
            for (auto &L : lens) {
                attn_shape s = {1, L[0], L[1], 1, 1, 64, 1.0f, 0.0f, w[0], w[1]};
                for (long long i0 = 0; i0 < s.seqlen_q; i0 += 16) {
                    const long long i1 = std::min<long long>(i0 + 16, s.seqlen_q);
                    long long lo, hi;
                    mask_key_range(s, i0, i1, &lo, &hi);
                    for (long long j0 = 0; j0 < s.seqlen_k; j0 += 16) {
                        int any = 0, all = 1;
                        for (long long i = i0; i < i1; i++)
                            for (long long j = j0; j < j0 + 16; j++) {
                                const bool vis = j < s.seqlen_k && mask_visible(s, i, j);
                                any |= vis;
                                all &= vis;
                                if (vis && (j < lo || j >= hi)) ok = 0; /* key range must hold every visible key */
                            }
                        if (mask_tile_full(s, i0, i1, j0, j0 + 16) != (bool)all) ok = 0;
                        (void)any;
                    }
                }
                for (long long j0 = 0; j0 < s.seqlen_k; j0 += 16) {
                    const long long j1 = std::min<long long>(j0 + 16, s.seqlen_k);
                    long long lo, hi;
                    mask_query_range(s, j0, j1, &lo, &hi);
                    for (long long i = 0; i < s.seqlen_q; i++)
                        for (long long j = j0; j < j1; j++)
                            if (mask_visible(s, i, j) && (i < lo || i >= hi)) ok = 0;
                }
            }
        st_expect(ok, "mask_key_range / mask_query_range hold every visible pair; mask_tile_full is exact");
    }

    /* 3. forward validation path: a host attention built on the kernels' helpers passes
     *    fa_check; a corrupted element, a corrupted LSE and a shifted mask fail */
    {
        struct fcase {
            int b, sq, sk, h, hk, d, causal;
            long long wl, wr;
            double softcap;
            cuda_dtype dt;
        } cases[] = {
            {2, 77, 100, 4, 2, 64, 1, -1, -1, 0.0, DT_BF16},  /* causal, GQA, tails */
            {1, 130, 64, 2, 1, 128, 1, -1, -1, 0.0, DT_FP16}, /* rows with no visible key */
            {1, 96, 96, 2, 2, 64, 0, 24, 8, 5.0, DT_BF16},    /* window + softcap */
        };
        for (auto &c : cases) {
            harness_opts ho;
            opts_default(&ho);
            ho.kernel = RUNG_FLASH2;
            ho.batch = c.b;
            ho.seqlen_q = c.sq;
            ho.seqlen_k = c.sk;
            ho.heads = c.h;
            ho.heads_k = c.hk;
            ho.d = c.d;
            ho.causal = c.causal;
            ho.window_left = c.wl;
            ho.window_right = c.wr;
            ho.softcap = c.softcap;
            ho.dtype = c.dt;
            ho.threads = 0;
            host_problem hp;
            hp.s = make_shape(&ho);
            hp.dtype = c.dt;
            const attn_shape &s = hp.s;
            fill_normal(hp.q, (size_t)s.batch * s.seqlen_q * s.heads * s.d, 11, c.dt);
            fill_normal(hp.k, (size_t)s.batch * s.seqlen_k * s.heads_k * s.d, 12, c.dt);
            fill_normal(hp.v, (size_t)s.batch * s.seqlen_k * s.heads_k * s.d, 13, c.dt);
            char what[200], sum[128];
            snprintf(what, sizeof what, "host attention (B%d Sq%d Sk%d H%d:%d d%d%s%s) passes fa_check", c.b, c.sq,
                     c.sk, c.h, c.hk, c.d, c.causal ? " causal" : "", c.softcap > 0 ? " softcap window" : "");
            host_attention(hp, 0);
            int r = check_forward(hp, &ho, 0, "O", 1, sum, sizeof sum);
            st_expect(r == 1, what);
            /* one element off by 0.25: must fail, and the report must point at it */
            const size_t at = bshd(c.b - 1, c.sq - 1, c.h - 1, c.sq, c.h, c.d) + 3;
            const h16 keep = hp.o[at];
            hp.o[at] = float_to_h16(h16_to_float(keep, c.dt) + 0.25f, c.dt);
            {
                const attn_shape &ss = hp.s;
                fa_tensor q, k, v, out;
                const fa_dtype dt = fa_dt(c.dt);
                tensor4(&q, hp.q.data(), dt, ss.batch, ss.seqlen_q, ss.heads, ss.d);
                tensor4(&k, hp.k.data(), dt, ss.batch, ss.seqlen_k, ss.heads_k, ss.d);
                tensor4(&v, hp.v.data(), dt, ss.batch, ss.seqlen_k, ss.heads_k, ss.d);
                tensor4(&out, hp.o.data(), dt, ss.batch, ss.seqlen_q, ss.heads, ss.d);
                fa_options attn = make_fa_options(&ho, ss);
                fa_check_options co = fa_check_options_default();
                co.dtype = dt;
                fa_check_report rep = fa_check_report_init();
                fa_status st = fa_check(&q, &k, &v, &out, NULL, &attn, &co, &rep);
                st_expect(st == FA_OK && !rep.pass && rep.worst_batch == c.b - 1 && rep.worst_row == c.sq - 1 &&
                              rep.worst_head == c.h - 1 && rep.worst_col == 3,
                          "  ... and fails with the worst element where one value was corrupted");
                fa_check_report_free(&rep);
            }
            hp.o[at] = keep;
            const size_t lrow = hp.lse.size() - 1;
            const float lkeep = hp.lse[lrow];
            hp.lse[lrow] = isfinite(lkeep) ? lkeep + 0.05f : 1.0f;
            st_expect(check_forward(hp, &ho, 0, "O", 0, NULL, 0) == 0, "  ... and fails when one LSE is off");
            hp.lse[lrow] = lkeep;
            if (c.causal || c.wl >= 0) {
                host_attention(hp, 1); /* mask diagonal off by one */
                st_expect(check_forward(hp, &ho, 0, "O", 0, NULL, 0) == 0,
                          "  ... and fails when the mask is shifted by one key");
            }
        }
    }

    /* 4. backward validation path: float32 flash grads, rounded to the dtype, pass the
     *    float64 reference under check-grad's rule; a corrupted dK element fails */
    {
        harness_opts ho;
        opts_default(&ho);
        ho.kernel = RUNG_FLASH2_BWD;
        ho.batch = 1;
        ho.seqlen_q = 50;
        ho.seqlen_k = 70;
        ho.heads = 4;
        ho.heads_k = 2;
        ho.d = 64;
        ho.causal = 1;
        ho.softcap = 8;
        host_problem hp;
        hp.s = make_shape(&ho);
        hp.dtype = DT_BF16;
        const attn_shape &s = hp.s;
        fill_normal(hp.q, (size_t)s.batch * s.seqlen_q * s.heads * s.d, 21, hp.dtype);
        fill_normal(hp.k, (size_t)s.batch * s.seqlen_k * s.heads_k * s.d, 22, hp.dtype);
        fill_normal(hp.v, (size_t)s.batch * s.seqlen_k * s.heads_k * s.d, 23, hp.dtype);
        fill_normal(hp.dout, (size_t)s.batch * s.seqlen_q * s.heads * s.d, 24, hp.dtype);
        const fa_dtype dt = fa_dt(hp.dtype);
        fa_tensor q, k, v, dout, g[3];
        tensor4(&q, hp.q.data(), dt, s.batch, s.seqlen_q, s.heads, s.d);
        tensor4(&k, hp.k.data(), dt, s.batch, s.seqlen_k, s.heads_k, s.d);
        tensor4(&v, hp.v.data(), dt, s.batch, s.seqlen_k, s.heads_k, s.d);
        tensor4(&dout, hp.dout.data(), dt, s.batch, s.seqlen_q, s.heads, s.d);
        hp.dq.assign(hp.q.size(), 0);
        hp.dk.assign(hp.k.size(), 0);
        hp.dv.assign(hp.v.size(), 0);
        tensor4(&g[0], hp.dq.data(), dt, s.batch, s.seqlen_q, s.heads, s.d);
        tensor4(&g[1], hp.dk.data(), dt, s.batch, s.seqlen_k, s.heads_k, s.d);
        tensor4(&g[2], hp.dv.data(), dt, s.batch, s.seqlen_k, s.heads_k, s.d);
        fa_options opt = make_fa_options(&ho, s);
        opt.impl = FA_IMPL_FLASH;
        fa_status st = fa_backward(&q, &k, &v, NULL, NULL, &dout, &g[0], &g[1], &g[2], &opt);
        st_expect(st == FA_OK, "fa_backward (flash) computes bf16 gradients on the host");
        st_expect(check_backward(hp, &ho, FA_IMPL_REFERENCE, 1, NULL, 0) == 1,
                  "they pass check-grad's rule against the float64 reference");
        hp.dk[5] = float_to_h16(h16_to_float(hp.dk[5], hp.dtype) + 1.0f, hp.dtype);
        st_expect(check_backward(hp, &ho, FA_IMPL_REFERENCE, 0, NULL, 0) == 0, "a corrupted dK element fails");
    }

    /* 5. --save's .npy writer: a 64-byte-aligned v1.0 header, then the data */
    {
        char dir[] = "/tmp/flashattn-cuda-selftest-XXXXXX";
        int ok = mkdtemp(dir) != NULL;
        const float data[6] = {1, 2, 3, 4, 5, 6};
        const long long shape[2] = {2, 3};
        ok = ok && write_npy(dir, "x.npy", "<f4", data, 4, 2, shape) == 0;
        char path[128], buf[256];
        snprintf(path, sizeof path, "%s/x.npy", dir);
        FILE *f = ok ? fopen(path, "rb") : NULL;
        size_t n = f ? fread(buf, 1, sizeof buf, f) : 0;
        if (f) fclose(f);
        const size_t hl = n >= 10 ? (size_t)(unsigned char)buf[8] | (size_t)(unsigned char)buf[9] << 8 : 0;
        ok = ok && n == 10 + hl + sizeof data && (10 + hl) % 64 == 0 && !memcmp(buf, "\x93NUMPY\x01\x00", 8) &&
             strstr(buf + 10, "'shape': (2, 3)") != NULL && !memcmp(buf + 10 + hl, data, sizeof data);
        remove(path);
        rmdir(dir);
        st_expect(ok, "--save writes numpy .npy v1.0 (aligned header, shape, C-order data)");
    }

    /* 6. FLOP count */
    {
        harness_opts ho;
        opts_default(&ho);
        ho.kernel = RUNG_FLASH2;
        ho.seqlen_q = ho.seqlen_k = 1024;
        attn_shape s = make_shape(&ho);
        const double full = flop_count(&ho, s);
        ho.causal = 1;
        s = make_shape(&ho);
        const double causal = flop_count(&ho, s);
        ho.kernel = RUNG_FLASH2_BWD;
        const double bwd = flop_count(&ho, s);
        ho.kernel = RUNG_MMA_BWD;
        const double bwd_mma = flop_count(&ho, s);
        ho.kernel = RUNG_MMA_BWD_DET;
        const double bwd_det = flop_count(&ho, s);
        st_expect(full == 4.0 * 1024 * 1024 * 128 * 16 && causal == full / 2 && bwd == 2.5 * causal && bwd_mma == bwd &&
                      bwd_det == bwd,
                  "FLOPs: 4 Sq Sk d per head, halved when causal, backward (03b, 04b, 04bd) 2.5x");
        /* bottom-right causal with one query row sees every key: not half of Sq Sk */
        ho.kernel = RUNG_FLASH2;
        ho.seqlen_q = 1;
        ho.seqlen_k = 4096;
        s = make_shape(&ho);
        st_expect(flop_count(&ho, s) == 4.0 * 4096 * 128 * 16,
                  "FLOPs: causal with seqlen_q = 1 counts all 4096 visible keys (exact when Sq != Sk)");
    }
    printf("self-test: %s (%d failure%s)\n", st_failures ? "FAIL" : "PASS", st_failures, st_failures == 1 ? "" : "s");
    return st_failures ? 1 : 0;
}

/* ============================================================================
 * The GPU run
 * ========================================================================== */

#define CUDA_TRY(call)                                                                                     \
    do {                                                                                                   \
        cudaError_t e_ = (call);                                                                           \
        if (e_ != cudaSuccess) {                                                                           \
            fprintf(stderr, "flashattn-cuda: %s failed: %s (%s:%d)\n", #call, cudaGetErrorString(e_), __FILE__, \
                    __LINE__);                                                                             \
            exit(2);                                                                                       \
        }                                                                                                  \
    } while (0)

struct device_buffers {
    void *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr, *dout = nullptr, *dq = nullptr, *dk = nullptr,
         *dv = nullptr, *work = nullptr, *work_fwd = nullptr;
    float *lse = nullptr;
};

static double median(std::vector<double> x)
{
    std::sort(x.begin(), x.end());
    const size_t n = x.size();
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

/* One launch of the chosen rung (forward or backward) on the device buffers. */
static cudaError_t launch_rung(int kernel, const attn_shape &s, cuda_dtype dt, const device_buffers &db)
{
    if (is_bwd(kernel)) {
        bwd_args a;
        a.sh = s;
        a.dtype = dt;
        a.q = db.q;
        a.k = db.k;
        a.v = db.v;
        a.o = db.o;
        a.dout = db.dout;
        a.lse = db.lse;
        a.dq = db.dq;
        a.dk = db.dk;
        a.dv = db.dv;
        a.work = db.work;
        a.stream = 0;
        return kernel == RUNG_MMA_BWD ? mma_backward(a) : kernel == RUNG_MMA_BWD_DET ? mma_backward_det(a) : flash2_backward(a);
    }
    fwd_args a;
    a.sh = s;
    a.dtype = dt;
    a.q = db.q;
    a.k = db.k;
    a.v = db.v;
    a.o = db.o;
    a.lse = db.lse;
    a.work = db.work;
    a.stream = 0;
    return kernel == RUNG_NAIVE    ? naive_forward(a)
           : kernel == RUNG_FLASH1 ? flash1_forward(a)
           : kernel == RUNG_MMA    ? mma_forward(a)
           : kernel == RUNG_HOPPER ? hopper_forward(a)
           : kernel == RUNG_HOPPER_WS ? hopper_ws_forward(a)
           : kernel == RUNG_HOPPER_PP ? hopper_pp_forward(a)
                                   : flash2_forward(a);
}

/* The FP32 FMA ceiling of this card now: median of 5 probe launches, TFLOP/s. */
static double measure_fma_ceiling(int sms)
{
    float *sink;
    const int blocks = sms * 8, iters = 16384; /* 16 chains: ~1.4e13 FLOP, ~0.2 s a launch */
    CUDA_TRY(cudaMalloc(&sink, (size_t)blocks * 256 * sizeof(float)));
    cudaEvent_t e0, e1;
    CUDA_TRY(cudaEventCreate(&e0));
    CUDA_TRY(cudaEventCreate(&e1));
    fma_probe_launch(sink, blocks, iters, 0); /* warm-up */
    CUDA_TRY(cudaGetLastError());
    std::vector<double> t;
    double flops = 0;
    for (int r = 0; r < 5; r++) {
        CUDA_TRY(cudaEventRecord(e0));
        flops = fma_probe_launch(sink, blocks, iters, 0);
        CUDA_TRY(cudaEventRecord(e1));
        CUDA_TRY(cudaEventSynchronize(e1));
        float ms;
        CUDA_TRY(cudaEventElapsedTime(&ms, e0, e1));
        t.push_back(ms);
    }
    CUDA_TRY(cudaGetLastError());
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaFree(sink);
    return flops / (median(t) * 1e-3) / 1e12;
}

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static int run(const harness_opts *o)
{
    const attn_shape s = make_shape(o);
    const cuda_dtype dt = o->dtype;
    const bool bwd = is_bwd(o->kernel);
    cudaDeviceProp prop;
    CUDA_TRY(cudaGetDeviceProperties(&prop, 0));
    printf("flashattn-cuda: kernel %s on %s (%d SMs, L2 %d MiB, CUDA runtime %d)\n", rung_names[o->kernel], prop.name,
           prop.multiProcessorCount, prop.l2CacheSize >> 20, CUDART_VERSION);
    printf("problem: batch=%d seqlen_q=%d seqlen_k=%d heads=%d heads_k=%d d=%d dtype=%s causal=%d window=%lld,%lld "
           "softcap=%g scale=%g\n",
           s.batch, s.seqlen_q, s.seqlen_k, s.heads, s.heads_k, s.d, dt == DT_BF16 ? "bf16" : "fp16", o->causal,
           o->window_left, s.window_right, o->softcap, s.scale);

    /* 1. inputs */
    host_problem hp;
    hp.s = s;
    hp.dtype = dt;
    const size_t nq = (size_t)s.batch * s.seqlen_q * s.heads * s.d, nk = (size_t)s.batch * s.seqlen_k * s.heads_k * s.d;
    const size_t nlse = (size_t)s.batch * s.heads * s.seqlen_q;
    fill_normal(hp.q, nq, o->seed * 4 + 0, dt);
    fill_normal(hp.k, nk, o->seed * 4 + 1, dt);
    fill_normal(hp.v, nk, o->seed * 4 + 2, dt);
    if (bwd) fill_normal(hp.dout, nq, o->seed * 4 + 3, dt);

    device_buffers db;
    CUDA_TRY(cudaMalloc(&db.q, nq * 2));
    CUDA_TRY(cudaMalloc(&db.k, nk * 2));
    CUDA_TRY(cudaMalloc(&db.v, nk * 2));
    CUDA_TRY(cudaMalloc(&db.o, nq * 2));
    CUDA_TRY(cudaMalloc(&db.lse, nlse * sizeof(float)));
    CUDA_TRY(cudaMemcpy(db.q, hp.q.data(), nq * 2, cudaMemcpyHostToDevice));
    CUDA_TRY(cudaMemcpy(db.k, hp.k.data(), nk * 2, cudaMemcpyHostToDevice));
    CUDA_TRY(cudaMemcpy(db.v, hp.v.data(), nk * 2, cudaMemcpyHostToDevice));
    const size_t ws = o->kernel == RUNG_NAIVE ? naive_workspace_bytes(s)
                      : o->kernel == RUNG_FLASH1 ? flash1_workspace_bytes(s)
                      : o->kernel == RUNG_FLASH2 ? flash2_workspace_bytes(s)
                      : o->kernel == RUNG_MMA    ? mma_workspace_bytes(s)
                      : o->kernel == RUNG_HOPPER || o->kernel == RUNG_HOPPER_WS || o->kernel == RUNG_HOPPER_PP ? hopper_workspace_bytes(s)
                      : o->kernel == RUNG_MMA_BWD ? mma_bwd_workspace_bytes(s)
                      : o->kernel == RUNG_MMA_BWD_DET ? mma_bwd_det_workspace_bytes(s)
                                                 : flash2_bwd_workspace_bytes(s);
    if (ws) CUDA_TRY(cudaMalloc(&db.work, ws));
    /* poison: 0xFFFF is NaN in bf16 and fp16, 0xFF.. NaN in float */
    CUDA_TRY(cudaMemset(db.o, 0xff, nq * 2));
    CUDA_TRY(cudaMemset(db.lse, 0xff, nlse * sizeof(float)));
    if (bwd) {
        CUDA_TRY(cudaMalloc(&db.dout, nq * 2));
        CUDA_TRY(cudaMalloc(&db.dq, nq * 2));
        CUDA_TRY(cudaMalloc(&db.dk, nk * 2));
        CUDA_TRY(cudaMalloc(&db.dv, nk * 2));
        CUDA_TRY(cudaMemcpy(db.dout, hp.dout.data(), nq * 2, cudaMemcpyHostToDevice));
        CUDA_TRY(cudaMemset(db.dq, 0xff, nq * 2));
        CUDA_TRY(cudaMemset(db.dk, 0xff, nk * 2));
        CUDA_TRY(cudaMemset(db.dv, 0xff, nk * 2));
        /* the forward the backward needs: rung 03's O and LSE for 03b, rung 04's for 04b */
        CUDA_TRY(launch_rung(fwd_of(o->kernel), s, dt, db));
    }

    /* 2. one run on poisoned outputs */
    CUDA_TRY(launch_rung(o->kernel, s, dt, db));
    CUDA_TRY(cudaDeviceSynchronize());
    hp.o.resize(nq);
    hp.lse.resize(nlse);
    CUDA_TRY(cudaMemcpy(hp.o.data(), db.o, nq * 2, cudaMemcpyDeviceToHost));
    CUDA_TRY(cudaMemcpy(hp.lse.data(), db.lse, nlse * sizeof(float), cudaMemcpyDeviceToHost));
    if (bwd) {
        hp.dq.resize(nq);
        hp.dk.resize(nk);
        hp.dv.resize(nk);
        CUDA_TRY(cudaMemcpy(hp.dq.data(), db.dq, nq * 2, cudaMemcpyDeviceToHost));
        CUDA_TRY(cudaMemcpy(hp.dk.data(), db.dk, nk * 2, cudaMemcpyDeviceToHost));
        CUDA_TRY(cudaMemcpy(hp.dv.data(), db.dv, nk * 2, cudaMemcpyDeviceToHost));
    }

    /* --save before the verdict, so a failing output can be inspected by hand */
    if (o->save_dir) {
        mkdir(o->save_dir, 0777);
        const char *descr = dt == DT_BF16 ? "<u2" : "<f2";
        const long long qs[4] = {s.batch, s.seqlen_q, s.heads, s.d}, ks[4] = {s.batch, s.seqlen_k, s.heads_k, s.d};
        const long long ls[3] = {s.batch, s.heads, s.seqlen_q};
        int bad = write_npy(o->save_dir, "q.npy", descr, hp.q.data(), 2, 4, qs) ||
                  write_npy(o->save_dir, "k.npy", descr, hp.k.data(), 2, 4, ks) ||
                  write_npy(o->save_dir, "v.npy", descr, hp.v.data(), 2, 4, ks) ||
                  write_npy(o->save_dir, "o.npy", descr, hp.o.data(), 2, 4, qs) ||
                  write_npy(o->save_dir, "lse.npy", "<f4", hp.lse.data(), 4, 3, ls);
        if (!bad && bwd)
            bad = write_npy(o->save_dir, "do.npy", descr, hp.dout.data(), 2, 4, qs) ||
                  write_npy(o->save_dir, "dq.npy", descr, hp.dq.data(), 2, 4, qs) ||
                  write_npy(o->save_dir, "dk.npy", descr, hp.dk.data(), 2, 4, ks) ||
                  write_npy(o->save_dir, "dv.npy", descr, hp.dv.data(), 2, 4, ks);
        if (bad) return 2;
        char mask[160] = "";
        if (o->causal) strcat(mask, " --causal");
        if (o->window_left >= 0 || o->window_right >= 0)
            snprintf(mask + strlen(mask), sizeof mask - strlen(mask), " --window %lld,%lld", o->window_left,
                     o->window_right);
        if (o->softcap > 0) snprintf(mask + strlen(mask), sizeof mask - strlen(mask), " --softcap %.17g", o->softcap);
        if (o->scale != 0) snprintf(mask + strlen(mask), sizeof mask - strlen(mask), " --scale %.17g", o->scale);
        printf("saved to %s/: flashattn %s -q q.npy -k k.npy -v v.npy %s --dtype %s%s\n", o->save_dir,
               bwd ? "check-grad" : "check", bwd ? "--dout do.npy --dq dq.npy --dk dk.npy --dv dv.npy" : "--out o.npy --lse lse.npy",
               dt == DT_BF16 ? "bf16" : "f16", mask);
    }

    /* 3. validation by libflashattn */
    const double work = (double)s.batch * s.heads * s.seqlen_q * s.seqlen_k * s.d;
    char check[32] = "skipped", note[160] = "";
    int verdict = 1, validated = 1;
    const double t_check = now_seconds();
    if (!bwd) {
        long long sample = o->sample_rows;
        if (sample < 0) sample = work <= 2147483648.0 ? 0 : 32;
        verdict = check_forward(hp, o, sample, rung_names[o->kernel], 2, note, sizeof note);
        snprintf(check, sizeof check, "%s%s", verdict == 1 ? "pass" : "FAIL", sample ? "-sampled" : "");
    } else {
        int gref = o->grad_ref;
        if (gref == GREF_AUTO) gref = work <= 2147483648.0 ? GREF_REFERENCE : work <= 1099511627776.0 ? GREF_FLASH : GREF_NONE;
        if (gref == GREF_NONE) {
            validated = 0;
            printf("validation: skipped (--grad-ref: batch x heads x Sq x Sk x d = %.3g is beyond the CPU reference's "
                   "budget; the same kernel is validated at smaller N)\n", work);
            snprintf(note, sizeof note, "not validated at this size");
        } else {
            verdict = check_backward(hp, o, gref == GREF_REFERENCE ? FA_IMPL_REFERENCE : FA_IMPL_FLASH, 1, note, sizeof note);
            snprintf(check, sizeof check, "%s%s", verdict == 1 ? "pass" : "FAIL", gref == GREF_FLASH ? "-f32ref" : "");
        }
    }
    printf("validation: %s (%s; %.1f s on the CPU)\n", check, note, now_seconds() - t_check);
    if (verdict < 0) return 2;
    if (verdict == 0) {
        printf("verdict: FAIL (kernel %s)\n", rung_names[o->kernel]);
        return 1;
    }

    /* 4. timing */
    double ms_med = NAN, ms_min = NAN, ms_max = NAN, tflops = NAN, probe = NAN;
    int reps = 0;
    const double flops = flop_count(o, s);
    if (!o->no_time) {
        probe = measure_fma_ceiling(prop.multiProcessorCount);
        void *flush;
        const size_t flush_bytes = 2 * (size_t)prop.l2CacheSize;
        CUDA_TRY(cudaMalloc(&flush, flush_bytes));
        cudaEvent_t e0, e1;
        CUDA_TRY(cudaEventCreate(&e0));
        CUDA_TRY(cudaEventCreate(&e1));
        auto timed = [&](int rep) {
            CUDA_TRY(cudaMemsetAsync(flush, rep & 0xff, flush_bytes));
            CUDA_TRY(cudaEventRecord(e0));
            CUDA_TRY(launch_rung(o->kernel, s, dt, db));
            CUDA_TRY(cudaEventRecord(e1));
            CUDA_TRY(cudaEventSynchronize(e1));
            float ms;
            CUDA_TRY(cudaEventElapsedTime(&ms, e0, e1));
            return (double)ms;
        };
        const double warm = timed(0); /* warm-up; also sizes the repeats to the time budget */
        reps = (int)std::min<double>(o->repeats, std::max(3.0, floor(o->max_seconds * 1e3 / std::max(warm, 1e-3))));
        std::vector<double> t;
        for (int r = 1; r <= reps; r++) t.push_back(timed(r));
        CUDA_TRY(cudaGetLastError());
        ms_med = median(t);
        ms_min = *std::min_element(t.begin(), t.end());
        ms_max = *std::max_element(t.begin(), t.end());
        tflops = flops / (ms_med * 1e-3) / 1e12;
        cudaEventDestroy(e0);
        cudaEventDestroy(e1);
        cudaFree(flush);
        printf("time: median %.3f ms (min %.3f, max %.3f, %d repeats after 1 warm-up, L2 flushed)\n", ms_med, ms_min,
               ms_max, reps);
        printf("throughput: %.2f TFLOP/s (%.4g GFLOP, FlashAttention's count%s) = %.1f%% of the FP32 FMA ceiling "
               "measured now (%.1f TFLOP/s)\n",
               tflops, flops / 1e9, bwd ? ", backward 2.5x forward" : "", 100.0 * tflops / probe, probe);
    }
    if (validated) printf("verdict: PASS (kernel %s)\n", rung_names[o->kernel]);
    else printf("verdict: UNVALIDATED (kernel %s: timed only, the output was not checked at this size)\n",
                rung_names[o->kernel]);

    if (o->csv) {
        FILE *f = fopen(o->csv, "a");
        if (!f) {
            fprintf(stderr, "flashattn-cuda: --csv: cannot open %s: %s\n", o->csv, strerror(errno));
            return 2;
        }
        fseek(f, 0, SEEK_END);
        if (ftell(f) == 0)
            fprintf(f, "kernel,dtype,batch,heads,heads_k,seqlen_q,seqlen_k,d,causal,window_left,window_right,softcap,"
                       "repeats,ms_median,ms_min,ms_max,tflops,probe_tflops,frac_probe,check,note\n");
        fprintf(f, "%s,%s,%d,%d,%d,%d,%d,%d,%d,%lld,%lld,%g,%d,%.4f,%.4f,%.4f,%.3f,%.2f,%.4f,%s,%s\n",
                rung_names[o->kernel], dt == DT_BF16 ? "bf16" : "fp16", s.batch, s.heads, s.heads_k, s.seqlen_q,
                s.seqlen_k, s.d, o->causal, o->window_left, s.window_right, o->softcap, reps, ms_med, ms_min, ms_max,
                tflops, probe, tflops / probe, check, note);
        fclose(f);
    }
    cudaFree(db.q);
    cudaFree(db.k);
    cudaFree(db.v);
    cudaFree(db.o);
    cudaFree(db.lse);
    cudaFree(db.work);
    cudaFree(db.dout);
    cudaFree(db.dq);
    cudaFree(db.dk);
    cudaFree(db.dv);
    return validated ? 0 : 3;
}

int main(int argc, char **argv)
{
    harness_opts o;
    char err[256];
    if (parse_args(argc, argv, &o, err, sizeof err) != 0) {
        fprintf(stderr, "flashattn-cuda: %s\n", err);
        return 2;
    }
    if (o.help) {
        fputs(usage_text, stdout);
        return 0;
    }
    if (o.self_test) return self_test();
    return run(&o);
}
