/*
 * cmd_probe.c — `flashattn probe --out DIR [shape flags]`: input sets that
 * make the diagnosis classes of `check --diagnose` distinguishable.
 *
 * Each probe is a subdirectory DIR/<name>/ with q.npy, k.npy, v.npy (BSHD,
 * float32 or the --dtype) and DIR/README has one line per probe: its shape
 * and what a failure on it reveals. The engineer runs the kernel on each
 * probe with the mask flags of the contract being tested, then
 * `flashattn check ... --diagnose`. Inputs are seeded random numbers except
 * where the probe fixes them (V = 1, q = 0, rising scores). The rotary probe is a
 * KV-cache call: k.npy and v.npy are the caches, with k_new.npy, v_new.npy,
 * cache_seqlens.npy (int32) and rotary_cos.npy / rotary_sin.npy (float32 RoPE tables).
 */
#include "cli.h"

#include <errno.h>
#include <stdarg.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char probe_usage[] =
    "usage: flashattn probe --out DIR [--batch B] [--seqlen S] [--heads H] [--heads-k HK]\n"
    "                       [--d D] [--dtype f32|bf16] [--seed S]\n"
    "\n"
    "Writes input sets that separate the mistakes `flashattn check --diagnose` names\n"
    "(docs/validation.md, \"Why did my kernel fail\"): DIR/<probe>/{q,k,v}.npy and\n"
    "DIR/README, one line per probe saying what it reveals. Run the kernel on each\n"
    "probe with your mask flags, then check its output with --diagnose. The rotary probe\n"
    "(rotary-kvcache, a KV-cache call) also writes k_new, v_new, cache_seqlens and\n"
    "rotary_cos/rotary_sin .npy files (left out when --d is 1).\n"
    "\n"
    "  --out DIR       directory to create or fill (its probe files are replaced)\n"
    "  --batch B       batch (default 2)\n"
    "  --seqlen S      base sequence length (default 128; probes derive theirs from it)\n"
    "  --heads H       query heads (default 8)\n"
    "  --heads-k HK    kv heads (default 2; H must be a multiple)\n"
    "  --d D           head dim (default 64)\n"
    "  --dtype T       f32 (default) or bf16 (<u2 bit patterns)\n"
    "  --seed S        seed of the random inputs (default 0)\n"
    "\n"
    "Everything is written into a temporary directory DIR/.probe-XXXXXX first and moved into\n"
    "place at the end: a failed run leaves DIR as it was (and removes DIR if it created it).\n"
    "\n"
    "Exit status: 0 written; 2 bad usage or a file that could not be written (one line naming it).\n";

typedef struct probe_rng {
    uint64_t s;
} probe_rng;

static double uniform(probe_rng *r)
{
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (double)(z >> 11) * 0x1p-53;
}

static double gauss(probe_rng *r)
{
    const double u = uniform(r), v = uniform(r);
    return sqrt(-2.0 * log(u > 0 ? u : 0x1p-60)) * cos(6.283185307179586 * v);
}

typedef enum fill_kind { FILL_RANDOM, FILL_ONES, FILL_ZERO } fill_kind;

typedef struct probe_spec {
    const char *name;
    int64_t b, sq, sk, h, hk, d;
    fill_kind q, v;
    int rising;       /* keys whose scores rise with j along every query */
    double amp;       /* amplitude of q and k */
    int bhsd_copy;    /* also write {q,k,v}_bhsd.npy: the same data in BHSD order */
    const char *what; /* the README line */
    int rotary;       /* a KV cache (k, v of sk rows) with ROT_NEW new keys and RoPE tables */
} probe_spec;

/* Fill a [B][S][H][D] float32 array. */
static void fill(float *x, int64_t n, fill_kind kind, double amp, probe_rng *r)
{
    for (int64_t e = 0; e < n; e++)
        x[e] = kind == FILL_ONES ? 1.0f : kind == FILL_ZERO ? 0.0f : (float)(amp * gauss(r));
}

/* Round to the dtype and save into dir/file; bf16 is converted. `label` names the file's
 * final place in messages. Returns 0 or prints and returns 2. */
static int save(const char *dir, const char *label, const char *file, const float *x, int64_t n, fa_dtype dt,
                int rank, const int64_t *shape)
{
    char path[4096];
    if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, file) >= sizeof path)
        return cli_die("probe: path too long: %s/%s", dir, file);
    void *buf = (void *)x;
    uint16_t *h = NULL;
    if (dt != FA_F32) {
        h = malloc((size_t)n * sizeof *h);
        if (!h) return cli_die("probe: out of memory");
        for (int64_t e = 0; e < n; e++) {
            float f = x[e];
            uint32_t u;
            memcpy(&u, &f, 4);
            u += 0x7fffu + ((u >> 16) & 1u); /* bf16, nearest even (the inputs are finite) */
            h[e] = (uint16_t)(u >> 16);
        }
        buf = h;
    }
    fa_status st = fa_npy_save(path, buf, dt, rank, shape);
    free(h);
    if (st != FA_OK) {
        const char *msg = fa_npy_last_error();
        return cli_die("probe: cannot write %s/%s: %s", label, file, msg && *msg ? msg : fa_status_string(st));
    }
    return 0;
}

/* [B][S][H][D] -> [B][H][S][D] */
static float *to_bhsd(const float *x, const int64_t *s)
{
    float *y = malloc((size_t)(s[0] * s[1] * s[2] * s[3]) * sizeof *y);
    if (!y) return NULL;
    for (int64_t b = 0; b < s[0]; b++)
        for (int64_t i = 0; i < s[1]; i++)
            for (int64_t h = 0; h < s[2]; h++)
                memcpy(y + ((b * s[2] + h) * s[1] + i) * s[3], x + ((b * s[1] + i) * s[2] + h) * s[3],
                       (size_t)s[3] * sizeof *y);
    return y;
}

typedef struct text_buf {
    char data[16384];
    size_t len;
} text_buf;

static void append(text_buf *t, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (t->len < sizeof t->data) {
        const int n = vsnprintf(t->data + t->len, sizeof t->data - t->len, fmt, ap);
        if (n > 0) t->len += (size_t)n;
        if (t->len > sizeof t->data - 1) t->len = sizeof t->data - 1;
    }
    va_end(ap);
}

static const char *const probe_files[6] = {"q.npy", "k.npy", "v.npy", "q_bhsd.npy", "k_bhsd.npy", "v_bhsd.npy"};
static const char *const rotary_files[8] = {"q.npy",     "k.npy",     "v.npy",          "k_new.npy",
                                            "v_new.npy", "cache_seqlens.npy", "rotary_cos.npy", "rotary_sin.npy"};

static int n_files(const probe_spec *p) { return p->rotary ? 8 : p->bhsd_copy ? 6 : 3; }

static const char *file_name(const probe_spec *p, int f) { return p->rotary ? rotary_files[f] : probe_files[f]; }

#define ROT_NEW 3 /* new keys per sequence of the rotary probe */
#define ROT_SPARE 16 /* table rows past the largest position: offsets up to +16 can be fitted */

/* Cached keys of sequence b in the rotary probe (sk = base + 5 + ROT_NEW rows of cache):
 * at least 4 (offsets down to -4 can be fitted), different between neighbours. */
static int32_t rot_cached(int64_t b, int64_t base) { return (int32_t)(4 + (base / 2 + 5 * b) % (base + 1)); }

/* The rotary probe's extra files: k_new, v_new, cache_seqlens, the RoPE tables of
 * rotary_dim = d rounded down to even (base 10000), ROT_SPARE rows past the largest position. */
static int write_rotary(const char *dir, const char *label, const probe_spec *p, fa_dtype dt, probe_rng *r)
{
    const int64_t base = p->sk - 5 - ROT_NEW, rd = p->d & ~(int64_t)1, half = rd / 2;
    const int64_t ns[4] = {p->b, ROT_NEW, p->hk, p->d}, nn = p->b * ROT_NEW * p->hk * p->d;
    int32_t *cs = malloc((size_t)p->b * sizeof *cs);
    float *kn = malloc((size_t)nn * sizeof *kn), *vn = malloc((size_t)nn * sizeof *vn);
    int64_t ro = 0;
    for (int64_t b = 0; b < p->b && cs; b++) {
        cs[b] = rot_cached(b, base);
        const int64_t last = cs[b] + (p->sq > ROT_NEW ? p->sq : ROT_NEW) + ROT_SPARE;
        if (last > ro) ro = last;
    }
    const int64_t ts[2] = {ro, half};
    float *tc = malloc((size_t)(ro * half) * sizeof *tc), *tsn = malloc((size_t)(ro * half) * sizeof *tsn);
    int rc = CLI_EXIT_USAGE;
    if (!cs || !kn || !vn || !tc || !tsn) {
        rc = cli_die("probe: out of memory for %s", p->name);
        goto done;
    }
    fill(kn, nn, FILL_RANDOM, p->amp, r);
    fill(vn, nn, FILL_RANDOM, 1.0, r);
    for (int64_t pos = 0; pos < ro; pos++)
        for (int64_t x = 0; x < half; x++) {
            const double a = (double)pos * pow(10000.0, -2.0 * (double)x / (double)rd);
            tc[pos * half + x] = (float)cos(a);
            tsn[pos * half + x] = (float)sin(a);
        }
    if ((rc = save(dir, label, "k_new.npy", kn, nn, dt, 4, ns)) ||
        (rc = save(dir, label, "v_new.npy", vn, nn, dt, 4, ns)) ||
        (rc = save(dir, label, "rotary_cos.npy", tc, ro * half, FA_F32, 2, ts)) ||
        (rc = save(dir, label, "rotary_sin.npy", tsn, ro * half, FA_F32, 2, ts)))
        goto done;
    char path[4096];
    if ((size_t)snprintf(path, sizeof path, "%s/cache_seqlens.npy", dir) >= sizeof path) {
        rc = cli_die("probe: path too long: %s/cache_seqlens.npy", dir);
        goto done;
    }
    const int64_t bs[1] = {p->b};
    if (fa_npy_save_type(path, cs, FA_NPY_I32, 1, bs) != FA_OK) {
        const char *msg = fa_npy_last_error();
        rc = cli_die("probe: cannot write %s/cache_seqlens.npy: %s", label, msg && *msg ? msg : "I/O error");
        goto done;
    }
    rc = 0;
done:
    free(cs);
    free(kn);
    free(vn);
    free(tc);
    free(tsn);
    return rc;
}

/* Write probe p into tmp/<name>/; `out` names its final place in messages. */
static int write_probe(const char *tmp, const char *out, const probe_spec *p, fa_dtype dt, uint64_t seed,
                       text_buf *readme)
{
    char dir[4096], label[4096];
    if ((size_t)snprintf(label, sizeof label, "%s/%s", out, p->name) >= sizeof label)
        return cli_die("probe: path too long: %s/%s", out, p->name);
    if ((size_t)snprintf(dir, sizeof dir, "%s/%s", tmp, p->name) >= sizeof dir)
        return cli_die("probe: path too long: %s/%s", tmp, p->name);
    if (mkdir(dir, 0777) != 0) return cli_die("probe: cannot create directory %s: %s", dir, strerror(errno));
    probe_rng r = {seed ^ (uint64_t)(uintptr_t)0 ^ (0x2545f4914f6cdd1dull * (uint64_t)(strlen(p->name) + 7))};
    for (const char *c = p->name; *c; c++) r.s = r.s * 131 + (unsigned char)*c;
    const int64_t qs[4] = {p->b, p->sq, p->h, p->d}, ks[4] = {p->b, p->sk, p->hk, p->d};
    const int64_t nq = p->b * p->sq * p->h * p->d, nk = p->b * p->sk * p->hk * p->d;
    float *q = malloc((size_t)nq * sizeof *q), *k = malloc((size_t)nk * sizeof *k), *v = malloc((size_t)nk * sizeof *v);
    int rc = CLI_EXIT_USAGE;
    if (!q || !k || !v) {
        cli_die("probe: out of memory for %s", p->name);
        goto done;
    }
    fill(q, nq, p->q, p->amp, &r);
    fill(k, nk, FILL_RANDOM, p->amp, &r);
    fill(v, nk, p->v, 1.0, &r);
    if (p->rising) {
        /* every query points along +1/sqrt(d) (plus noise); key j along it with a
         * weight rising in j: the row max moves in every key tile */
        const double u = 1.0 / sqrt((double)p->d);
        for (int64_t e = 0; e < nq; e++) q[e] = (float)(3.0 * u + 0.1 * gauss(&r));
        for (int64_t b = 0; b < p->b; b++)
            for (int64_t j = 0; j < p->sk; j++)
                for (int64_t h = 0; h < p->hk; h++)
                    for (int64_t c = 0; c < p->d; c++)
                        k[((b * p->sk + j) * p->hk + h) * p->d + c] =
                            (float)(4.0 * u * (double)j / (double)p->sk + 0.1 * gauss(&r));
    }
    if ((rc = save(dir, label, "q.npy", q, nq, dt, 4, qs)) || (rc = save(dir, label, "k.npy", k, nk, dt, 4, ks)) ||
        (rc = save(dir, label, "v.npy", v, nk, dt, 4, ks)))
        goto done;
    if (p->rotary && (rc = write_rotary(dir, label, p, dt, &r)) != 0) goto done;
    if (p->bhsd_copy) {
        const int64_t qb[4] = {p->b, p->h, p->sq, p->d}, kb[4] = {p->b, p->hk, p->sk, p->d};
        float *x;
        if (!(x = to_bhsd(q, qs))) { rc = cli_die("probe: out of memory"); goto done; }
        rc = save(dir, label, "q_bhsd.npy", x, nq, dt, 4, qb);
        free(x);
        if (rc) goto done;
        if (!(x = to_bhsd(k, ks))) { rc = cli_die("probe: out of memory"); goto done; }
        rc = save(dir, label, "k_bhsd.npy", x, nk, dt, 4, kb);
        free(x);
        if (rc) goto done;
        if (!(x = to_bhsd(v, ks))) { rc = cli_die("probe: out of memory"); goto done; }
        rc = save(dir, label, "v_bhsd.npy", x, nk, dt, 4, kb);
        free(x);
        if (rc) goto done;
    }
    append(readme, "%-14s q [%lld, %lld, %lld, %lld]  k, v [%lld, %lld, %lld, %lld]: %s\n", p->name,
            (long long)p->b, (long long)p->sq, (long long)p->h, (long long)p->d, (long long)p->b,
            (long long)p->sk, (long long)p->hk, (long long)p->d, p->what);
    rc = 0;
done:
    free(q);
    free(k);
    free(v);
    return rc;
}

static int probe_main(int argc, char **argv)
{
    const char *out = NULL, *dtype_text = NULL, *val;
    long long B = 2, S = 128, H = 8, HK = 2, D = 64, n;
    uint64_t seed = 0;
    for (int i = 1; i < argc; i++) {
        int r;
        if (cli_is_help(argv[i])) {
            fputs(probe_usage, stdout);
            return CLI_EXIT_OK;
        }
        if ((r = cli_opt_value(argc, argv, &i, "--out", &out)) != 0 ||
            (r = cli_opt_value(argc, argv, &i, "--dtype", &dtype_text)) != 0) {
            if (r < 0) return CLI_EXIT_USAGE;
            continue;
        }
        struct { const char *name; long long lo, hi; long long *dst; } ints[] = {
            {"--batch", 1, 64, &B}, {"--seqlen", 2, 1 << 20, &S}, {"--heads", 1, 256, &H},
            {"--heads-k", 1, 256, &HK}, {"--d", 1, FA_HEAD_DIM_MAX, &D}};
        int hit = 0;
        for (size_t x = 0; x < sizeof ints / sizeof ints[0]; x++) {
            if ((r = cli_opt_value(argc, argv, &i, ints[x].name, &val)) == 0) continue;
            if (r < 0 || cli_parse_int(ints[x].name, val, ints[x].lo, ints[x].hi, ints[x].dst) != 0)
                return CLI_EXIT_USAGE;
            hit = 1;
            break;
        }
        if (hit) continue;
        if ((r = cli_opt_value(argc, argv, &i, "--seed", &val)) != 0) {
            if (r < 0 || cli_parse_int("--seed", val, 0, INT64_MAX, &n) != 0) return CLI_EXIT_USAGE;
            seed = (uint64_t)n;
            continue;
        }
        return cli_unknown_option("probe", argv[i]);
    }
    if (!out) return cli_die("probe: missing --out DIR (see flashattn probe --help)");
    if (H % HK != 0) return cli_die("probe: --heads %lld is not a multiple of --heads-k %lld", H, HK);
    fa_dtype dt = FA_F32;
    if (dtype_text) {
        if (cli_parse_dtype("--dtype", dtype_text, &dt) != 0) return CLI_EXIT_USAGE;
        if (dt != FA_F32 && dt != FA_BF16)
            return cli_die("--dtype: probe writes f32 or bf16, got '%s'", dtype_text);
    }
    /* uneven GQA: Hk not in {1, g, H} with g not a power of 2 */
    const long long gh = 6, ghk = 3;
    const long long tail = S - S % 64 + 37; /* seqlen_k not a multiple of 64 (nor 16, 32) */
    const probe_spec probes[] = {
        {"q-shorter", B, S / 2 + 1, S + 37, H, HK, D, FILL_RANDOM, FILL_RANDOM, 0, 1.0, 0,
         "seqlen_q < seqlen_k: with --causal or --window, a top-left aligned mask fails every row "
         "(causal-top-left); a window one key off fails rows past the window (window-shift)", 0},
        {"q-longer", B, S + 37, S / 2 + 1, H, HK, D, FILL_RANDOM, FILL_RANDOM, 0, 1.0, 0,
         "seqlen_q > seqlen_k: with --causal the first seqlen_q - seqlen_k rows have no visible key "
         "(O = 0, LSE = -inf): NaN or mean(V) there is empty-row, content there is causal-top-left", 0},
        {"v-ones", B, S, S, H, HK, D, FILL_RANDOM, FILL_ONES, 0, 2.0, 0,
         "V = 1: every correct row is exactly 1 (rows with no visible key 0); anything else means "
         "weights that do not sum to 1 (a rescale missing from l or O, tail keys, P/row-sum mismatch)", 0},
        {"q-zero", B, S, S, H, HK, D, FILL_ZERO, FILL_RANDOM, 0, 1.0, 0,
         "q = 0: all scores equal, O = mean of the visible V; scale and softcap cannot matter: "
         "a failure here is masking or indexing, a pass here with failures elsewhere points at scale/softcap", 0},
        {"gqa-uneven", B, S, S, gh, ghk, D, FILL_RANDOM, FILL_RANDOM, 0, 1.0, 0,
         "heads 6, heads_k 3 (group 2, heads_k not 1, the group or heads): h % heads_k and h / group "
         "differ on heads 1..4 (gqa-head-map; the map is fitted per head)", 0},
        {"tail-keys", B, S / 2, tail, H, HK, D, FILL_RANDOM, FILL_RANDOM, 0, 1.0, 0,
         "seqlen_k not a multiple of 16, 32, 64 or 128: keys past seqlen_k read as zero K and V get "
         "weight exp(0 - max) and dilute every row (tail-tile); run without --causal so the tail is visible", 0},
        {"rising-scores", B, S / 4, 4 * S + 5, H, HK, D, FILL_RANDOM, FILL_RANDOM, 1, 1.0, 0,
         "scores rise with the key index, so the row max rises in every key tile: an online softmax "
         "that skips the rescale fails every row (missing-rescale)", 0},
        {"strided", B, S / 2 + 5, S / 2 + 11, 3, 3, D / 2 + 4, FILL_RANDOM, FILL_RANDOM, 0, 1.0, 1,
         "distinct batch, seqlen, heads and d, plus {q,k,v}_bhsd.npy (the same data as [B, H, S, d]): "
         "pass q_bhsd.transpose(1, 2) etc. as non-contiguous views; a kernel ignoring strides or "
         "mixing up BSHD and BHSD fails (layout-transposed)", 0},
        {"large-logits", B, S, S, H, HK, D, FILL_RANDOM, FILL_RANDOM, 0, 3.0, 0,
         "|q.k| large: run with your --softcap; a cap skipped or applied in the wrong place "
         "(softcap-missing, softcap-order) or a wrong scale (scale) changes every row a lot", 0},
        {"rotary-kvcache", B, 4, S + 5 + ROT_NEW, H, HK, D, FILL_RANDOM, FILL_RANDOM, 0, 1.0, 0,
         "a KV cache (k, v) with 3 new keys (k_new, v_new), cache_seqlens >= 4 differing by sequence, "
         "RoPE tables rotary_cos/sin (rotary_dim = d rounded down to even, 16 rows past the largest "
         "position): run with --cache-seqlens, --k-new/--v-new, --rotary-cos/-sin [--rotary-interleaved], "
         "with and without --causal; the other pairing is rotary-pairing, positions off by -16..+16, the "
         "causal/non-causal query rule swapped, new keys rotated from 0 or rotary skipped are rotary-offset",
         1},
    };
    /* the rotary probe (last) needs rotary_dim >= 2 */
    const size_t np = sizeof probes / sizeof probes[0] - (D < 2 ? 1 : 0);
    /* Before any work: every place a file goes must be free or hold a regular file,
     * every probe directory free or a directory. */
    struct stat sb;
    int created_out = 0;
    if (stat(out, &sb) == 0) {
        if (!S_ISDIR(sb.st_mode)) return cli_die("probe: %s exists and is not a directory", out);
    } else if (errno != ENOENT) {
        return cli_die("probe: cannot use %s: %s", out, strerror(errno));
    }
    char path[8192], dst[8192]; /* room for tmp (< 4096) + "/<probe>/<file>" */
    for (size_t x = 0; x < np; x++) {
        if ((size_t)snprintf(path, sizeof path, "%s/%s", out, probes[x].name) >= sizeof path)
            return cli_die("probe: path too long: %s/%s", out, probes[x].name);
        if (stat(path, &sb) != 0) continue;
        if (!S_ISDIR(sb.st_mode)) return cli_die("probe: %s exists and is not a directory", path);
        for (int f = 0; f < n_files(&probes[x]); f++) {
            if ((size_t)snprintf(dst, sizeof dst, "%s/%s", path, file_name(&probes[x], f)) >= sizeof dst)
                return cli_die("probe: path too long: %s/%s", path, file_name(&probes[x], f));
            if (stat(dst, &sb) == 0 && !S_ISREG(sb.st_mode))
                return cli_die("probe: %s exists and is not a regular file", dst);
        }
    }
    if ((size_t)snprintf(path, sizeof path, "%s/README", out) >= sizeof path) return cli_die("probe: path too long");
    if (stat(path, &sb) == 0 && !S_ISREG(sb.st_mode)) return cli_die("probe: %s exists and is not a regular file", path);

    if (mkdir(out, 0777) == 0) created_out = 1;
    else if (errno != EEXIST) return cli_die("probe: cannot create %s: %s", out, strerror(errno));
    char tmp[4096];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s/.probe-XXXXXX", out) >= sizeof tmp) return cli_die("probe: path too long");
    if (!mkdtemp(tmp)) {
        const int e = errno;
        if (created_out) rmdir(out);
        return cli_die("probe: cannot write into %s: %s", out, strerror(e));
    }
    static text_buf mem;
    mem.len = 0;
    append(&mem, "flashattn probe: inputs that separate the diagnosis classes (seed %llu, dtype %s).\n"
                 "Run your kernel on DIR/<probe>/{q,k,v}.npy with the mask flags of its contract, save O\n"
                 "(and LSE), then: flashattn check -q q.npy -k k.npy -v v.npy --out O.npy [--lse LSE.npy]\n"
                 "[MASK OPTIONS] --diagnose. See docs/validation.md, \"Why did my kernel fail\".\n\n",
           (unsigned long long)seed, fa_dtype_name(dt));
    int rc = 0;
    for (size_t x = 0; x < np && !rc; x++) rc = write_probe(tmp, out, &probes[x], dt, seed, &mem);
    if (!rc) {
        snprintf(path, sizeof path, "%s/README", tmp);
        fa_outfile f;
        fa_status st = fa_outfile_open(&f, path);
        if (st == FA_OK && (st = fa_outfile_write(&f, mem.data, mem.len)) == FA_OK) st = fa_outfile_commit(&f);
        else if (st != FA_OK && f.fd >= 0) fa_outfile_abort(&f);
        fa_outfile_free(&f);
        if (st != FA_OK) {
            const char *msg = fa_last_error();
            rc = cli_die("probe: cannot write %s/README: %s", out, msg && *msg ? msg : fa_status_string(st));
        }
    }
    /* Move into place (same directory tree: renames), README last. */
    for (size_t x = 0; x < np && !rc; x++) {
        snprintf(dst, sizeof dst, "%s/%s", out, probes[x].name);
        if (mkdir(dst, 0777) != 0 && errno != EEXIST) {
            rc = cli_die("probe: cannot create directory %s: %s", dst, strerror(errno));
            break;
        }
        for (int f = 0; f < n_files(&probes[x]) && !rc; f++) {
            snprintf(path, sizeof path, "%s/%s/%s", tmp, probes[x].name, file_name(&probes[x], f));
            snprintf(dst, sizeof dst, "%s/%s/%s", out, probes[x].name, file_name(&probes[x], f));
            if (rename(path, dst) != 0) rc = cli_die("probe: cannot write %s: %s", dst, strerror(errno));
        }
    }
    if (!rc) {
        snprintf(path, sizeof path, "%s/README", tmp);
        snprintf(dst, sizeof dst, "%s/README", out);
        if (rename(path, dst) != 0) rc = cli_die("probe: cannot write %s: %s", dst, strerror(errno));
    }
    /* Remove the temporary tree (whatever is left of it). */
    for (size_t x = 0; x < np; x++) {
        for (int f = 0; f < n_files(&probes[x]); f++) {
            snprintf(path, sizeof path, "%s/%s/%s", tmp, probes[x].name, file_name(&probes[x], f));
            unlink(path);
        }
        snprintf(path, sizeof path, "%s/%s", tmp, probes[x].name);
        rmdir(path);
    }
    snprintf(path, sizeof path, "%s/README", tmp);
    unlink(path);
    rmdir(tmp);
    if (rc) {
        if (created_out) rmdir(out);
        return rc;
    }
    printf("flashattn probe: %zu probes and README written to %s\n", np, out);
    return 0;
}

int cmd_probe(int argc, char **argv)
{
    cli_guard_runtime_exit();
    return cli_finish(probe_main(argc, argv));
}
