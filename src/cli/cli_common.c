/*
 * cli_common.c — option parsing, input loading and error printing shared by
 * the subcommands (see cli.h for the contract).
 *
 * Input validation happens here, before the library sees anything, for one
 * reason: the library's messages name arguments ("k: head dim ..."), while a
 * user at a shell needs the FILE named ("k.npy: head dim 32 does not match
 * q.npy head dim 64"). The library re-validates everything anyway; these
 * checks only exist to word the error for a person.
 */
#include "cli.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------------------ */
/* Errors                                                                    */
/* ------------------------------------------------------------------------ */

int cli_die(const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    /* one line, always: fold any newline a message might carry */
    for (char *p = msg; *p; p++)
        if (*p == '\n' || *p == '\r') *p = ' ';
    fprintf(stderr, "flashattn: %s\n", msg);
    return CLI_EXIT_USAGE;
}

int cli_die_status(fa_status st)
{
    const char *msg = fa_last_error();
    return cli_die("%s", msg && *msg ? msg : fa_status_string(st));
}

int cli_unknown_option(const char *cmd, const char *arg)
{
    if (arg[0] == '-')
        return cli_die("%s: unknown option '%s' (see flashattn %s --help)", cmd, arg, cmd);
    return cli_die("%s: unexpected argument '%s' (see flashattn %s --help)", cmd, arg, cmd);
}

/* ------------------------------------------------------------------------ */
/* Option parsing                                                            */
/* ------------------------------------------------------------------------ */

int cli_is_help(const char *arg)
{
    return strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0;
}

int cli_opt_value(int argc, char **argv, int *i, const char *name, const char **value)
{
    const char *arg = argv[*i];
    size_t n = strlen(name);
    if (strncmp(arg, name, n) != 0) return 0;
    if (arg[n] == '=') {
        *value = arg + n + 1;
        return 1;
    }
    if (arg[n] != '\0') return 0;
    if (*i + 1 >= argc) {
        cli_die("%s needs a value", name);
        return -1;
    }
    *value = argv[++*i];
    return 1;
}

int cli_parse_int(const char *opt, const char *text, long long lo, long long hi, long long *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (end == text || *end != '\0' || errno == ERANGE || v < lo || v > hi) {
        cli_die("%s: expected an integer in %lld..%lld, got '%s'", opt, lo, hi, text);
        return -1;
    }
    *out = v;
    return 0;
}

int cli_parse_double(const char *opt, const char *text, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (end == text || *end != '\0' || errno == ERANGE || !isfinite(v)) {
        cli_die("%s: expected a finite number, got '%s'", opt, text);
        return -1;
    }
    *out = v;
    return 0;
}

int cli_parse_dtype(const char *opt, const char *text, fa_dtype *dtype)
{
    for (int t = 0; t < FA_DTYPE_COUNT; t++) {
        if (strcmp(text, fa_dtype_name((fa_dtype)t)) == 0) {
            *dtype = (fa_dtype)t;
            return 0;
        }
    }
    cli_die("%s: expected f32, f64, f16 or bf16, got '%s'", opt, text);
    return -1;
}

/* ------------------------------------------------------------------------ */
/* Attention options                                                         */
/* ------------------------------------------------------------------------ */

const char cli_mask_help[] =
    "MASK OPTIONS (FlashAttention semantics; masks aligned to the bottom-right corner):\n"
    "  --causal           key j visible to query i iff j <= i + seqlen_k - seqlen_q\n"
    "  --window L,R       sliding window: L keys left, R keys right of the diagonal;\n"
    "                     -1 = unbounded on that side (--causal sets R = 0)\n"
    "  --softcap C        s = C * tanh(s / C) after scaling (0 = off)\n"
    "  --scale S          softmax scale (default 1/sqrt(d))\n"
    "  --alibi FILE.npy   ALiBi slopes, f32/f64, shape [heads] or [batch, heads]:\n"
    "                     s -= slope * |i + seqlen_k - seqlen_q - j|\n";

const char cli_exec_help[] =
    "EXECUTION OPTIONS:\n"
    "  --impl NAME        flash (default), reference (float64 loops) or standard (materializes S)\n"
    "  --threads T        OpenMP threads (default: OMP_NUM_THREADS or all cores)\n"
    "  --block-q N        flash row block Br (default: derived from the caches, see `flashattn info`)\n"
    "  --block-k N        flash key block Bc\n";

void cli_attn_init(cli_attn *a)
{
    memset(a, 0, sizeof *a);
    a->opt = fa_options_default();
}

void cli_attn_free(cli_attn *a)
{
    fa_npy_free(&a->alibi);
    a->opt.alibi_slopes = NULL;
}

int cli_parse_mask_option(int argc, char **argv, int *i, cli_attn *a)
{
    const char *val;
    int r;
    if (strcmp(argv[*i], "--causal") == 0) {
        a->opt.causal = 1;
        return 1;
    }
    if ((r = cli_opt_value(argc, argv, i, "--window", &val)) != 0) {
        if (r < 0) return -1;
        long long w[2];
        char buf[64];
        const char *comma = strchr(val, ',');
        if (!comma || strlen(val) >= sizeof buf) {
            cli_die("--window: expected L,R (e.g. 128,0; -1 = unbounded), got '%s'", val);
            return -1;
        }
        memcpy(buf, val, (size_t)(comma - val));
        buf[comma - val] = '\0';
        if (cli_parse_int("--window (left)", buf, -1, INT64_MAX, &w[0]) != 0) return -1;
        if (cli_parse_int("--window (right)", comma + 1, -1, INT64_MAX, &w[1]) != 0) return -1;
        a->opt.window_left = w[0];
        a->opt.window_right = w[1];
        return 1;
    }
    if ((r = cli_opt_value(argc, argv, i, "--softcap", &val)) != 0) {
        if (r < 0 || cli_parse_double("--softcap", val, &a->opt.softcap) != 0) return -1;
        if (a->opt.softcap < 0) {
            cli_die("--softcap: must be >= 0 (0 = off), got '%s'", val);
            return -1;
        }
        return 1;
    }
    if ((r = cli_opt_value(argc, argv, i, "--scale", &val)) != 0) {
        if (r < 0 || cli_parse_double("--scale", val, &a->opt.scale) != 0) return -1;
        if (a->opt.scale == 0) {
            cli_die("--scale: must be non-zero (omit it for the default 1/sqrt(d))");
            return -1;
        }
        return 1;
    }
    if ((r = cli_opt_value(argc, argv, i, "--alibi", &val)) != 0) {
        if (r < 0) return -1;
        a->alibi_path = val;
        return 1;
    }
    return 0;
}

int cli_parse_exec_option(int argc, char **argv, int *i, cli_attn *a)
{
    const char *val;
    long long n;
    int r;
    if ((r = cli_opt_value(argc, argv, i, "--impl", &val)) != 0) {
        if (r < 0) return -1;
        if (fa_impl_from_name(val, &a->opt.impl) != FA_OK) {
            cli_die("--impl: unknown implementation '%s' (expected flash, reference or standard)", val);
            return -1;
        }
        return 1;
    }
    if ((r = cli_opt_value(argc, argv, i, "--threads", &val)) != 0) {
        if (r < 0 || cli_parse_int("--threads", val, 1, 4096, &n) != 0) return -1;
        a->opt.num_threads = (int)n;
        return 1;
    }
    if ((r = cli_opt_value(argc, argv, i, "--block-q", &val)) != 0) {
        if (r < 0 || cli_parse_int("--block-q", val, 1, 1024, &n) != 0) return -1;
        a->opt.block_q = (int)n;
        return 1;
    }
    if ((r = cli_opt_value(argc, argv, i, "--block-k", &val)) != 0) {
        if (r < 0 || cli_parse_int("--block-k", val, 1, 1024, &n) != 0) return -1;
        a->opt.block_k = (int)n;
        return 1;
    }
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Loading inputs                                                            */
/* ------------------------------------------------------------------------ */

const char *cli_shape(int rank, const int64_t *shape, char *buf, size_t size)
{
    size_t n = (size_t)snprintf(buf, size, "[");
    for (int r = 0; r < rank && n < size; r++)
        n += (size_t)snprintf(buf + n, size - n, r ? ", %lld" : "%lld", (long long)shape[r]);
    if (n < size) snprintf(buf + n, size - n, "]");
    return buf;
}

/* "(0, 3, 1, 7)": the multi-index of flat element `flat` of a C-order array. */
static const char *multi_index(const fa_npy *arr, int64_t flat, char *buf, size_t size)
{
    int64_t idx[FA_MAX_RANK] = {0};
    for (int r = arr->rank - 1; r >= 0; r--) {
        idx[r] = arr->shape[r] ? flat % arr->shape[r] : 0;
        flat = arr->shape[r] ? flat / arr->shape[r] : 0;
    }
    size_t n = (size_t)snprintf(buf, size, "(");
    for (int r = 0; r < arr->rank && n < size; r++)
        n += (size_t)snprintf(buf + n, size - n, r ? ", %lld" : "%lld", (long long)idx[r]);
    if (n < size) snprintf(buf + n, size - n, ")");
    return buf;
}

int cli_load_array(const char *path, int want_rank, int require_finite, const char *role,
                   fa_npy *arr, fa_tensor *t)
{
    fa_status st = fa_npy_load(path, arr);
    if (st != FA_OK) return cli_die_status(st);
    char sh[96], ix[96];
    if ((want_rank > 0 && arr->rank != want_rank) || arr->rank < 1) {
        cli_die("%s: expected rank %d for %s, got rank %d %s", path, want_rank > 0 ? want_rank : 1,
                role, arr->rank, cli_shape(arr->rank, arr->shape, sh, sizeof sh));
        fa_npy_free(arr);
        return CLI_EXIT_USAGE;
    }
    if (require_finite) {
        int64_t bad = fa_npy_find_nonfinite(arr);
        if (bad >= 0) {
            fa_tensor flat;
            int64_t n = arr->numel;
            fa_tensor_make(&flat, arr->data, arr->dtype, 1, &n, NULL);
            double x = fa_tensor_get(&flat, &bad);
            cli_die("%s: %s at index %s; inputs must be finite", path,
                    isnan(x) ? "NaN" : x > 0 ? "+Inf" : "-Inf", multi_index(arr, bad, ix, sizeof ix));
            fa_npy_free(arr);
            return CLI_EXIT_USAGE;
        }
    }
    if (t && (st = fa_npy_as_tensor(arr, t)) != FA_OK) {
        fa_npy_free(arr);
        return cli_die("%s: %s", path, fa_last_error());
    }
    return 0;
}

void cli_qkv_free(cli_qkv *in)
{
    fa_npy_free(&in->q);
    fa_npy_free(&in->k);
    fa_npy_free(&in->v);
}

int cli_load_qkv(cli_qkv *in, const char *q_path, const char *k_path, const char *v_path)
{
    memset(in, 0, sizeof *in);
    in->q_path = q_path;
    in->k_path = k_path;
    in->v_path = v_path;
    if (cli_load_array(q_path, 4, 1, "Q [batch, seqlen_q, heads, d]", &in->q, &in->q_t) ||
        cli_load_array(k_path, 4, 1, "K [batch, seqlen_k, heads_k, d]", &in->k, &in->k_t) ||
        cli_load_array(v_path, 4, 1, "V [batch, seqlen_k, heads_k, d_v]", &in->v, &in->v_t)) {
        cli_qkv_free(in);
        return CLI_EXIT_USAGE;
    }
    const int64_t *q = in->q.shape, *k = in->k.shape, *v = in->v.shape;
    in->batch = q[0];
    in->seqlen_q = q[1];
    in->heads = q[2];
    in->d = q[3];
    in->seqlen_k = k[1];
    in->heads_k = k[2];
    in->dv = v[3];

    /* the first inconsistency, worded with the files involved */
    int bad = 1;
    if (in->d < 1) cli_die("%s: head dim d must be >= 1, got %lld", q_path, (long long)in->d);
    else if (in->heads < 1) cli_die("%s: heads must be >= 1, got %lld", q_path, (long long)in->heads);
    else if (in->heads_k < 1) cli_die("%s: heads must be >= 1, got %lld", k_path, (long long)in->heads_k);
    else if (in->dv < 1) cli_die("%s: head dim d_v must be >= 1, got %lld", v_path, (long long)in->dv);
    else if (in->batch < 1) cli_die("%s: batch must be >= 1, got %lld", q_path, (long long)in->batch);
    else if (in->seqlen_q < 1) cli_die("%s: seqlen_q must be >= 1, got %lld", q_path, (long long)in->seqlen_q);
    else if (in->seqlen_k < 1) cli_die("%s: seqlen_k must be >= 1, got %lld", k_path, (long long)in->seqlen_k);
    else if (k[0] != q[0])
        cli_die("%s: batch %lld does not match %s batch %lld", k_path, (long long)k[0], q_path, (long long)q[0]);
    else if (v[0] != q[0])
        cli_die("%s: batch %lld does not match %s batch %lld", v_path, (long long)v[0], q_path, (long long)q[0]);
    else if (k[3] != q[3])
        cli_die("%s: head dim %lld does not match %s head dim %lld", k_path, (long long)k[3], q_path,
                (long long)q[3]);
    else if (v[1] != k[1])
        cli_die("%s: seqlen %lld does not match %s seqlen %lld", v_path, (long long)v[1], k_path,
                (long long)k[1]);
    else if (v[2] != k[2])
        cli_die("%s: heads %lld does not match %s heads %lld", v_path, (long long)v[2], k_path,
                (long long)k[2]);
    else if (in->heads % in->heads_k != 0)
        cli_die("%s: heads (%lld) is not a multiple of %s heads (%lld)", q_path, (long long)in->heads,
                k_path, (long long)in->heads_k);
    else
        bad = 0;
    if (bad) {
        cli_qkv_free(in);
        return CLI_EXIT_USAGE;
    }
    return 0;
}

int cli_attn_load_alibi(cli_attn *a, const cli_qkv *in)
{
    if (!a->alibi_path) return 0;
    const char *path = a->alibi_path;
    if (cli_load_array(path, 0, 1, "ALiBi slopes [heads] or [batch, heads]", &a->alibi, &a->alibi_t))
        return CLI_EXIT_USAGE;
    char sh[96];
    int ok_shape = (a->alibi.rank == 1 && a->alibi.shape[0] == in->heads) ||
                   (a->alibi.rank == 2 && a->alibi.shape[0] == in->batch && a->alibi.shape[1] == in->heads);
    if (!ok_shape) {
        cli_die("%s: ALiBi slopes of shape %s should be [heads] = [%lld] or [batch, heads] = [%lld, %lld]",
                path, cli_shape(a->alibi.rank, a->alibi.shape, sh, sizeof sh), (long long)in->heads,
                (long long)in->batch, (long long)in->heads);
        cli_attn_free(a);
        return CLI_EXIT_USAGE;
    }
    if (a->alibi.dtype != FA_F32 && a->alibi.dtype != FA_F64) {
        cli_die("%s: ALiBi slopes must be float32 or float64, got %s", path, fa_dtype_name(a->alibi.dtype));
        cli_attn_free(a);
        return CLI_EXIT_USAGE;
    }
    a->opt.alibi_slopes = &a->alibi_t;
    return 0;
}

/* Directory part of `path` into buf ("." if none). */
static const char *dir_of(const char *path, char *buf, size_t size)
{
    const char *slash = strrchr(path, '/');
    if (!slash) return ".";
    size_t n = slash == path ? 1 : (size_t)(slash - path);
    if (n >= size) n = size - 1;
    memcpy(buf, path, n);
    buf[n] = '\0';
    return buf;
}

int cli_check_writable(const char *path)
{
    char buf[4096];
    const char *dir = dir_of(path, buf, sizeof buf);
    if (access(dir, W_OK | X_OK) != 0)
        return cli_die("%s: cannot write there: directory '%s': %s", path, dir, strerror(errno));
    return 0;
}

int cli_save_outputs(const cli_output *outs, int n)
{
    for (int i = 0; i < n; i++) {
        if (!outs[i].path) continue;
        fa_status st = fa_npy_save(outs[i].path, outs[i].data, outs[i].dtype, outs[i].rank, outs[i].shape);
        if (st != FA_OK) {
            for (int j = 0; j < i; j++)
                if (outs[j].path) unlink(outs[j].path);
            return cli_die_status(st);
        }
    }
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Small utilities                                                           */
/* ------------------------------------------------------------------------ */

double cli_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

const char *cli_bytes(size_t bytes, char *buf, size_t size)
{
    static const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    double x = (double)bytes;
    while (x >= 1024.0 && u < 4) {
        x /= 1024.0;
        u++;
    }
    if (u == 0 || x == floor(x)) snprintf(buf, size, "%.0f %s", x, unit[u]);
    else snprintf(buf, size, "%.1f %s", x, unit[u]);
    return buf;
}
