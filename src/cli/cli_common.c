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

#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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
    const char *text = msg && *msg ? msg : fa_status_string(st);
    /* the standard path's cap (its message ends with the API's field): the CLI's option instead;
     * other FA_ERR_TOO_LARGE refusals (SIZE_MAX, INT_MAX) are not the cap's */
    static const char field[] = " (standard_max_bytes)";
    const size_t n = strlen(text), f = sizeof field - 1;
    if (st == FA_ERR_TOO_LARGE && n >= f && strcmp(text + n - f, field) == 0)
        return cli_die("%.*s (--standard-max-bytes N)", (int)(n - f), text);
    return cli_die("%s", text);
}

int cli_die_npy(fa_status st)
{
    const char *msg = fa_npy_last_error();
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

int cli_opt_value_alias(int argc, char **argv, int *i, const char *name, const char *alias, const char **value)
{
    const char *was = *value;
    const int r = cli_opt_value(argc, argv, i, name, value);
    if (r == 1 && was) {
        cli_die("%s given twice (as %s and %s); give it once", name, alias, name);
        return -1;
    }
    return r;
}

int cli_is_help(const char *arg)
{
    return strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0;
}

/* Whether arg is the option `name`, as "name" or "name=value". */
static int is_opt(const char *arg, const char *name, size_t n)
{
    return strncmp(arg, name, n) == 0 && (arg[n] == '\0' || arg[n] == '=');
}

/* The names of the options seen taking a value (`name value` or `name=value`), so that the
 * repeat scan below can walk the earlier arguments as the parse did and not read the value
 * "-k" of `-q -k` as an earlier -k. Names, not positions: nothing here depends on which
 * command line was parsed before (the fuzzer reuses one argv array). */
static char value_names[256][40]; /* copies: a caller's name need not outlive the call */
static int value_names_n;

static void note_value_name(const char *name)
{
    for (int x = 0; x < value_names_n; x++)
        if (strcmp(value_names[x], name) == 0) return;
    if (value_names_n < (int)(sizeof value_names / sizeof value_names[0]) && strlen(name) < sizeof value_names[0])
        strcpy(value_names[value_names_n++], name);
}

/* Whether arg is one of those options with its value in the next argument. */
static int takes_next_as_value(const char *arg)
{
    for (int x = 0; x < value_names_n; x++)
        if (strcmp(value_names[x], arg) == 0) return 1;
    return 0;
}

int cli_opt_value(int argc, char **argv, int *i, const char *name, const char **value)
{
    const char *arg = argv[*i];
    size_t n = strlen(name);
    if (!is_opt(arg, name, n)) return 0;
    note_value_name(name);
    /* the same option earlier: refused, not silently replaced (`-o a.npy -o b.npy` wrote only
     * b.npy; `-q q.npy -q k.npy` read k.npy as Q); an argument that an option before it took
     * as its value is skipped, as the parse did */
    for (int j = 1; j < *i; j++) {
        if (is_opt(argv[j], name, n)) {
            cli_die("%s given twice (arguments %d and %d); give each option once", name, j, *i);
            return -1;
        }
        if (takes_next_as_value(argv[j])) j++;
    }
    if (arg[n] == '=') {
        *value = arg + n + 1;
        return 1;
    }
    if (*i + 1 >= argc) {
        cli_die("%s needs a value", name);
        return -1;
    }
    /* `-o --causal` took the flag as the output's file name */
    if (strncmp(argv[*i + 1], "--", 2) == 0) {
        cli_die("%s needs a value, got the option '%s' (a file whose name starts with -- can be given as ./%s)",
                name, argv[*i + 1], argv[*i + 1]);
        return -1;
    }
    *value = argv[++*i];
    return 1;
}

int cli_opt_flag(char **argv, int i, const char *name)
{
    if (strcmp(argv[i], name) != 0) return 0;
    for (int j = 1; j < i; j++) { /* as cli_opt_value: an option's value is not an option */
        if (strcmp(argv[j], name) == 0) {
            cli_die("%s given twice (arguments %d and %d); give each option once", name, j, i);
            return -1;
        }
        if (takes_next_as_value(argv[j])) j++;
    }
    return 1;
}

int cli_is_decimal(const char *text)
{
    const char *digits = text[0] == '-' ? text + 1 : text;
    return digits[0] >= '0' && digits[0] <= '9' && !strpbrk(text, "xX");
}

int cli_parse_int(const char *opt, const char *text, long long lo, long long hi, long long *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    /* strtoll also skips blanks and takes '+' */
    if (end == text || *end != '\0' || errno == ERANGE || !cli_is_decimal(text) || v < lo || v > hi) {
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
    /* strtod also takes a blank, '+', ".5" and hexadecimal "0x1p-2" */
    if (!cli_is_decimal(text)) {
        cli_die("%s: expected a decimal number (a digit or '-' first; no '+', '.5' or hex), got '%s'", opt, text);
        return -1;
    }
    if (end == text || *end != '\0' || isnan(v) || (isinf(v) && errno != ERANGE)) {
        cli_die("%s: expected a finite number, got '%s'", opt, text);
        return -1;
    }
    if (errno == ERANGE && fabs(v) >= DBL_MAX) {
        cli_die("%s: '%s' is too large (beyond the double range, about 1.8e308)", opt, text);
        return -1;
    }
    if (errno == ERANGE && v == 0) {
        cli_die("%s: '%s' is too small: it underflows to 0 (the smallest double is about 4.9e-324)", opt, text);
        return -1;
    }
    *out = v; /* a subnormal (ERANGE with v != 0) is a finite number: accepted */
    return 0;
}

int cli_parse_bytes(const char *opt, const char *text, size_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    unsigned shift = 0;
    if (end != text && *end && !end[1]) {
        switch (*end) {
        case 'K': case 'k': shift = 10; end++; break;
        case 'M': case 'm': shift = 20; end++; break;
        case 'G': case 'g': shift = 30; end++; break;
        case 'T': case 't': shift = 40; end++; break;
        default: break;
        }
    }
    /* a digit first: strtoull skips blanks and takes a sign, so ' -5' read as 2^64 - 5 */
    if (end == text || *end != '\0' || errno == ERANGE || !(text[0] >= '0' && text[0] <= '9') || v == 0 ||
        v > (unsigned long long)(SIZE_MAX >> shift)) {
        cli_die("%s: expected a positive byte count (optionally with K, M, G or T, powers of 1024), got '%s'",
                opt, text);
        return -1;
    }
    *out = (size_t)(v << shift);
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
    "  --align A          bottom-right (default, FlashAttention's) or top-left (PyTorch\n"
    "                     SDPA's is_causal: drop the seqlen_k - seqlen_q term everywhere)\n"
    "  --window L,R       sliding window: L keys left, R keys right of the diagonal;\n"
    "                     -1 = unbounded on that side (--causal sets R = 0)\n"
    "  --softcap C        s = C * tanh(s / C) after scaling (0 = off)\n"
    "  --scale S          softmax scale (default 1/sqrt(d))\n"
    "  --alibi FILE.npy   ALiBi slopes, f32/f64, shape [heads] or [batch, heads]:\n"
    "                     s -= slope * |i + seqlen_k - seqlen_q - j|\n"
    "  --sinks FILE.npy   attention sinks, f32/f64 [heads]: one logit per head (final-score\n"
    "                     domain) added to the softmax denominator only:\n"
    "                     LSE = ln(sum_j e^s_ij + e^sink_h); a row with no visible key: O = 0, LSE = sink\n"
    "  --dropout-p P --dropout-mask FILE.npy\n"
    "                     dropout with the given keep-mask, uint8 (|u1) 0/1 [batch, heads, seqlen_q,\n"
    "                     seqlen_k] (varlen: [batch, heads, max q_len, max k_len]): O = (P*Z/(1-p)) V,\n"
    "                     LSE undropped; 0 <= p < 1; both options go together\n";

const char cli_exec_help[] =
    "EXECUTION OPTIONS:\n"
    "  --impl NAME        flash (default), reference (float64 loops) or standard (materializes S)\n"
    "  --threads T        OpenMP threads (default: OMP_NUM_THREADS or all cores)\n"
    "  --block-q N        flash row block Br (default: derived from the caches, see `flashattn info`)\n"
    "  --block-k N        flash key block Bc\n"
    "  --num-splits N     split-KV of flash for seqlen_q <= 16 (decoding): 0 heuristic (default),\n"
    "                     1 none, N key ranges merged in a fixed order (0..65536)\n"
    "  --standard-max-bytes N  cap on the standard path's S/P scratch (default 1G; K, M, G, T suffixes)\n";

void cli_attn_init(cli_attn *a)
{
    memset(a, 0, sizeof *a);
    a->opt = fa_options_default();
}

void cli_attn_free(cli_attn *a)
{
    fa_npy_free(&a->alibi);
    a->opt.alibi_slopes = NULL;
    fa_npy_free(&a->sinks);
    a->opt.sinks = NULL;
    fa_npy_free(&a->keep);
    a->opt.dropout = NULL;
    fa_npy_free(&a->rot_cos);
    fa_npy_free(&a->rot_sin);
    a->opt.rotary = NULL;
    free(a->cu_q);
    free(a->cu_k);
    free(a->seqused);
    a->cu_q = a->cu_k = a->seqused = NULL;
    a->opt.varlen = NULL;
    free(a->cache_seqlens);
    free(a->cache_idx);
    free(a->leftpad);
    free(a->block_table);
    a->cache_seqlens = a->cache_idx = a->leftpad = a->block_table = NULL;
    fa_npy_free(&a->k_new);
    fa_npy_free(&a->v_new);
    a->opt.kvcache = NULL;
}

const char cli_kvcache_help[] =
    "KV CACHE (FlashAttention's flash_attn_with_kvcache; forward only; int32 <i4 index files):\n"
    "  --cache-seqlens F  [batch] current cache lengths; -k/-v are then caches\n"
    "                     [batch_cache, seqlen_cache, heads_k, x] (any rows past the lengths are ignored)\n"
    "  --k-new F --v-new F  [batch, seqlen_new, heads_k, x] keys/values appended at cache_seqlens[b]\n"
    "                     (the caches' dtypes); attention over cache_seqlens[b] + seqlen_new keys\n"
    "  --cache-batch-idx F  [batch]: the cache row of sequence b\n"
    "  --cache-leftpad F  [batch]: the first valid cache row of sequence b\n"
    "  --block-table F    [batch, max_pages]: paged KV, -k/-v are pages [num_pages, page_size, heads_k, x]\n"
    "  --rotary-cos F --rotary-sin F  [seqlen_ro, rotary_dim/2] f32/f64: rotary embedding of q and --k-new\n"
    "                     (the rotated keys are appended); new key t at cache_seqlens[b] + t, queries at\n"
    "                     cache_seqlens[b] + i when causal or windowed, else at cache_seqlens[b];\n"
    "                     pairs (i, i + rotary_dim/2) (GPT-NeoX), dims past rotary_dim untouched\n"
    "  --rotary-interleaved  pairs (2i, 2i+1) instead (GPT-J)\n";

int cli_parse_kvcache_option(int argc, char **argv, int *i, cli_attn *a)
{
    int r;
    if ((r = cli_opt_value(argc, argv, i, "--cache-seqlens", &a->cache_seqlens_path)) != 0 ||
        (r = cli_opt_value(argc, argv, i, "--k-new", &a->k_new_path)) != 0 ||
        (r = cli_opt_value(argc, argv, i, "--v-new", &a->v_new_path)) != 0 ||
        (r = cli_opt_value(argc, argv, i, "--cache-batch-idx", &a->cache_idx_path)) != 0 ||
        (r = cli_opt_value(argc, argv, i, "--cache-leftpad", &a->leftpad_path)) != 0 ||
        (r = cli_opt_value(argc, argv, i, "--block-table", &a->block_table_path)) != 0 ||
        (r = cli_opt_value(argc, argv, i, "--rotary-cos", &a->rotary_cos_path)) != 0 ||
        (r = cli_opt_value(argc, argv, i, "--rotary-sin", &a->rotary_sin_path)) != 0)
        return r < 0 ? -1 : 1;
    if ((r = cli_opt_flag(argv, *i, "--rotary-interleaved")) != 0) {
        a->rotary_interleaved = 1;
        return r;
    }
    return 0;
}

int cli_attn_is_kvcache(const cli_attn *a)
{
    return a->cache_seqlens_path != NULL;
}

const char cli_varlen_help[] =
    "VARIABLE-LENGTH BATCHES (FlashAttention's varlen layout; int32 <i4 .npy index files):\n"
    "  --cu-seqlens-q F   [batch+1] prefix sums of the query lengths, from 0; Q, O, dO, dQ are then\n"
    "                     [total_q, heads, x] and LSE [heads, total_q]\n"
    "  --cu-seqlens-k F   [batch+1] prefix sums of the key lengths; K, V, dK, dV [total_k, heads_k, x]\n"
    "  --seqused-k F      [batch]: sequence b uses only its first seqused_k[b] keys\n"
    "                     (masks are aligned per sequence; rows no sequence owns get O = 0, LSE = -inf)\n";

int cli_parse_varlen_option(int argc, char **argv, int *i, cli_attn *a)
{
    int r;
    if ((r = cli_opt_value(argc, argv, i, "--cu-seqlens-q", &a->cu_q_path)) != 0 ||
        (r = cli_opt_value(argc, argv, i, "--cu-seqlens-k", &a->cu_k_path)) != 0 ||
        (r = cli_opt_value(argc, argv, i, "--seqused-k", &a->seqused_path)) != 0)
        return r < 0 ? -1 : 1;
    return 0;
}

int cli_attn_is_varlen(const cli_attn *a)
{
    return a->cu_q_path || a->cu_k_path;
}

/*
 * An int32 index array ('<i4', rank 1..max_rank) through the .npy module.
 * Returns 0 with *out (malloc'ed, numel entries) and its shape, or prints one
 * line naming the file and returns CLI_EXIT_USAGE.
 */
static int load_i32(const char *path, const char *role, int max_rank, int32_t **out, int *rank, int64_t shape[2])
{
    *out = NULL;
    fa_npy arr;
    fa_status st = fa_npy_load(path, &arr);
    if (st != FA_OK) return cli_die_npy(st);
    char sh[96];
    int rc = CLI_EXIT_USAGE;
    if (arr.type != FA_NPY_I32) {
        cli_die("%s: %s must be int32 ('<i4'), got '%s'", path, role, fa_npy_type_descr(arr.type));
    } else if (arr.rank < 1 || arr.rank > max_rank) {
        cli_die("%s: %s must have rank %s%d, got rank %d %s", path, role, max_rank > 1 ? "1 to " : "", max_rank,
                arr.rank, cli_shape(arr.rank, arr.shape, sh, sizeof sh));
    } else if (!(*out = malloc((size_t)(arr.numel > 0 ? arr.numel : 1) * sizeof(int32_t)))) {
        cli_die("%s: out of memory", path);
    } else {
        memcpy(*out, arr.data, (size_t)arr.numel * sizeof(int32_t));
        *rank = arr.rank;
        for (int r = 0; r < arr.rank; r++) shape[r] = arr.shape[r];
        rc = 0;
    }
    fa_npy_free(&arr);
    return rc;
}

int cli_attn_load_kvcache(cli_attn *a, const cli_qkv *in)
{
    if (!cli_attn_is_kvcache(a)) {
        const char *stray = a->k_new_path ? "--k-new" : a->v_new_path ? "--v-new" : a->cache_idx_path ? "--cache-batch-idx"
                            : a->leftpad_path ? "--cache-leftpad" : a->block_table_path ? "--block-table" : NULL;
        if (stray) return cli_die("%s needs --cache-seqlens", stray);
        return 0;
    }
    if (cli_attn_is_varlen(a)) return cli_die("--cache-seqlens cannot be combined with --cu-seqlens-q/-k");
    if (!a->k_new_path != !a->v_new_path)
        return cli_die("%s needs %s too", a->k_new_path ? "--k-new" : "--v-new", a->k_new_path ? "--v-new" : "--k-new");
    int rank;
    int64_t n[2], nb[2];
    const char *const paths[3] = {a->cache_seqlens_path, a->cache_idx_path, a->leftpad_path};
    const char *const roles[3] = {"cache_seqlens", "cache_batch_idx", "cache_leftpad"};
    int32_t **dst[3] = {&a->cache_seqlens, &a->cache_idx, &a->leftpad};
    for (int x = 0; x < 3; x++) {
        if (!paths[x]) continue;
        if (load_i32(paths[x], roles[x], 1, dst[x], &rank, n)) goto fail;
        if (n[0] != in->batch) {
            cli_die("%s: %s has %lld entries, should be batch = %lld (from %s)", paths[x], roles[x], (long long)n[0],
                    (long long)in->batch, in->q_path);
            goto fail;
        }
    }
    if (a->block_table_path) {
        if (load_i32(a->block_table_path, "block_table", 2, &a->block_table, &rank, nb)) goto fail;
        if (rank != 2 || nb[0] != in->batch || nb[1] < 1) {
            cli_die("%s: block_table should be [batch, max_pages] = [%lld, >= 1] (from %s)", a->block_table_path,
                    (long long)in->batch, in->q_path);
            goto fail;
        }
    }
    a->kvcache = fa_kvcache_default();
    if (a->k_new_path) {
        if (cli_load_array(a->k_new_path, 4, 1, "k_new [batch, seqlen_new, heads_k, d]", &a->k_new, &a->k_new_t) ||
            cli_load_array(a->v_new_path, 4, 1, "v_new [batch, seqlen_new, heads_k, d_v]", &a->v_new, &a->v_new_t))
            goto fail;
        a->kvcache.k_new = &a->k_new_t;
        a->kvcache.v_new = &a->v_new_t;
    }
    a->kvcache.cache_seqlens = a->cache_seqlens;
    a->kvcache.cache_batch_idx = a->cache_idx;
    a->kvcache.cache_leftpad = a->leftpad;
    a->kvcache.block_table = a->block_table;
    a->kvcache.max_pages = a->block_table ? nb[1] : 0;
    a->kvcache.cache_seqlens_name = a->cache_seqlens_path;
    a->kvcache.cache_batch_idx_name = a->cache_idx_path;
    a->kvcache.cache_leftpad_name = a->leftpad_path;
    a->kvcache.block_table_name = a->block_table_path;
    a->kvcache.k_new_name = a->k_new_path;
    a->kvcache.v_new_name = a->v_new_path;
    a->opt.kvcache = &a->kvcache;
    return 0;
fail:
    cli_attn_free(a);
    return CLI_EXIT_USAGE;
}

int cli_attn_load_varlen(cli_attn *a, const cli_qkv *in)
{
    (void)in;
    if (!cli_attn_is_varlen(a)) {
        if (a->seqused_path) return cli_die("--seqused-k needs --cu-seqlens-q and --cu-seqlens-k");
        return 0;
    }
    if (!a->cu_q_path || !a->cu_k_path)
        return cli_die("varlen: %s needs %s too", a->cu_q_path ? "--cu-seqlens-q" : "--cu-seqlens-k",
                       a->cu_q_path ? "--cu-seqlens-k" : "--cu-seqlens-q");
    int rank;
    int64_t nq[2], nk[2], nu[2];
    if (load_i32(a->cu_q_path, "cu_seqlens_q", 1, &a->cu_q, &rank, nq) ||
        load_i32(a->cu_k_path, "cu_seqlens_k", 1, &a->cu_k, &rank, nk) ||
        (a->seqused_path && load_i32(a->seqused_path, "seqused_k", 1, &a->seqused, &rank, nu))) {
        cli_attn_free(a);
        return CLI_EXIT_USAGE;
    }
    if (nq[0] < 1) {
        cli_die("%s: cu_seqlens_q needs batch + 1 >= 1 entries, got 0", a->cu_q_path);
    } else if (nk[0] != nq[0]) {
        cli_die("%s: cu_seqlens_k has %lld entries, %s has %lld (both are [batch + 1])", a->cu_k_path,
                (long long)nk[0], a->cu_q_path, (long long)nq[0]);
    } else if (a->seqused_path && nu[0] != nq[0] - 1) {
        cli_die("%s: seqused_k has %lld entries, should be batch = %lld (from %s)", a->seqused_path,
                (long long)nu[0], (long long)(nq[0] - 1), a->cu_q_path);
    } else {
        a->varlen = fa_varlen_default();
        a->varlen.batch = nq[0] - 1;
        a->varlen.cu_seqlens_q = a->cu_q;
        a->varlen.cu_seqlens_k = a->cu_k;
        a->varlen.seqused_k = a->seqused;
        a->varlen.cu_seqlens_q_name = a->cu_q_path;
        a->varlen.cu_seqlens_k_name = a->cu_k_path;
        a->varlen.seqused_k_name = a->seqused_path;
        a->opt.varlen = &a->varlen;
        return 0;
    }
    cli_attn_free(a);
    return CLI_EXIT_USAGE;
}

int cli_parse_mask_option(int argc, char **argv, int *i, cli_attn *a)
{
    const char *val;
    int r;
    if ((r = cli_opt_flag(argv, *i, "--causal")) != 0) {
        a->opt.causal = 1;
        return r;
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
    if ((r = cli_opt_value(argc, argv, i, "--align", &val)) != 0) {
        if (r < 0) return -1;
        if (strcmp(val, "bottom-right") == 0) a->opt.align = FA_ALIGN_BOTTOM_RIGHT;
        else if (strcmp(val, "top-left") == 0) a->opt.align = FA_ALIGN_TOP_LEFT;
        else {
            cli_die("--align: expected bottom-right or top-left, got '%s'", val);
            return -1;
        }
        return 1;
    }
    if ((r = cli_opt_value(argc, argv, i, "--alibi", &val)) != 0) {
        if (r < 0) return -1;
        a->alibi_path = val;
        return 1;
    }
    if ((r = cli_opt_value(argc, argv, i, "--sinks", &val)) != 0) {
        if (r < 0) return -1;
        a->sinks_path = val;
        return 1;
    }
    if ((r = cli_opt_value(argc, argv, i, "--dropout-p", &val)) != 0) {
        if (r < 0) return -1;
        fa_dropout_init(&a->dropout, sizeof a->dropout);
        if (cli_parse_double("--dropout-p", val, &a->dropout.p) != 0) return -1;
        if (!(a->dropout.p >= 0.0 && a->dropout.p < 1.0)) {
            cli_die("--dropout-p: must be in [0, 1), got '%s'", val);
            return -1;
        }
        a->dropout_p_text = val;
        return 1;
    }
    if ((r = cli_opt_value(argc, argv, i, "--dropout-mask", &val)) != 0) {
        if (r < 0) return -1;
        a->dropout_mask_path = val;
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
        if (r < 0 || cli_parse_int("--threads", val, 1, FA_MAX_THREADS, &n) != 0) return -1;
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
    if ((r = cli_opt_value(argc, argv, i, "--num-splits", &val)) != 0) {
        if (r < 0 || cli_parse_int("--num-splits", val, 0, 65536, &n) != 0) return -1;
        a->opt.num_splits = (int)n;
        return 1;
    }
    if ((r = cli_opt_value(argc, argv, i, "--standard-max-bytes", &val)) != 0) {
        if (r < 0 || cli_parse_bytes("--standard-max-bytes", val, &a->opt.standard_max_bytes) != 0) return -1;
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

const char *cli_multi_index(const fa_npy *arr, int64_t flat, char *buf, size_t size)
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

double cli_element(const void *data, fa_dtype t, int64_t x)
{
    switch (t) {
    case FA_F32: return ((const float *)data)[x];
    case FA_F64: return ((const double *)data)[x];
    case FA_BF16: {
        uint32_t bits = (uint32_t)((const uint16_t *)data)[x] << 16;
        float f;
        memcpy(&f, &bits, 4);
        return f;
    }
    case FA_F16: {
        const uint16_t h = ((const uint16_t *)data)[x];
        const int e = (h >> 10) & 31, m = h & 1023;
        const double a = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(m + 1024, e - 25);
        return h >> 15 ? -a : a;
    }
    default: return NAN;
    }
}

int64_t cli_warn_nonfinite(const char *path, const void *data, fa_dtype t, int64_t n, int allow_neg_inf)
{
    int64_t bad = 0, first = -1;
    for (int64_t x = 0; x < n; x++) {
        const double e = cli_element(data, t, x);
        if (isfinite(e) || (allow_neg_inf && e == -INFINITY)) continue;
        if (first < 0) first = x;
        bad++;
    }
    if (bad)
        fprintf(stderr, "flashattn: warning: %s: %lld of %lld values are not finite (the first at flat index %lld)%s\n",
                path, (long long)bad, (long long)n, (long long)first,
                t == FA_F16 ? "; float16 holds at most 65504, --dtype-out f32 does not overflow" : "");
    return bad;
}

int cli_varlen_rows_finite(const char *path, const fa_npy *arr, const fa_varlen *vl)
{
    if (!vl || !vl->cu_seqlens_q || arr->rank != 3) return 0;
    const int64_t h = arr->shape[1], w = arr->shape[2];
    for (int64_t b = 0; b < vl->batch; b++)
        for (int64_t r = vl->cu_seqlens_q[b]; r < vl->cu_seqlens_q[b + 1] && r < arr->shape[0]; r++)
            for (int64_t x = r * h * w; x < (r + 1) * h * w; x++) {
                const double e = cli_element(arr->data, arr->dtype, x);
                if (isfinite(e)) continue;
                const int64_t c = x % w, hh = x / w % h;
                return cli_die("%s: element [%lld,%lld,%lld] (sequence %lld) is %s; inputs must be finite", path,
                               (long long)r, (long long)hh, (long long)c, (long long)b, isnan(e) ? "NaN" : "Inf");
            }
    return 0;
}

int cli_load_array(const char *path, int want_rank, int require_finite, const char *role,
                   fa_npy *arr, fa_tensor *t)
{
    fa_status st = fa_npy_load(path, arr);
    if (st != FA_OK) return cli_die_npy(st);
    char sh[96], ix[96];
    if (arr->dtype == FA_DTYPE_COUNT) { /* an int32 or uint8 file where a float array belongs */
        cli_die("%s: unsupported dtype '%s' for %s: %s files are index or code files, not float arrays "
                "('<f4', '<f8', '<f2', or '<u2' as bfloat16)",
                path, fa_npy_type_descr(arr->type), role, fa_npy_type_name(arr->type));
        fa_npy_free(arr);
        return CLI_EXIT_USAGE;
    }
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
                    isnan(x) ? "NaN" : x > 0 ? "+Inf" : "-Inf", cli_multi_index(arr, bad, ix, sizeof ix));
            fa_npy_free(arr);
            return CLI_EXIT_USAGE;
        }
    }
    if (t && (st = fa_npy_as_tensor(arr, t)) != FA_OK) {
        fa_npy_free(arr);
        return cli_die("%s: %s", path, fa_npy_last_error());
    }
    return 0;
}

/* "[3, *]": an expected shape, * for an extent that may be anything (< 0). */
static const char *want_shape_str(int rank, const int64_t *shape, char *buf, size_t size)
{
    size_t n = (size_t)snprintf(buf, size, "[");
    for (int r = 0; r < rank && n < size; r++) {
        if (shape && shape[r] >= 0) n += (size_t)snprintf(buf + n, size - n, r ? ", %lld" : "%lld", (long long)shape[r]);
        else n += (size_t)snprintf(buf + n, size - n, r ? ", *" : "*");
    }
    if (n < size) snprintf(buf + n, size - n, "]");
    return buf;
}

/* An integer file of one type, rank and shape (see cli_load_index). */
static int load_ints(const char *path, fa_npy_type want, const char *role, int want_rank,
                     const int64_t *want_shape, fa_npy *arr)
{
    fa_status st = fa_npy_load(path, arr);
    if (st != FA_OK) return cli_die_npy(st);
    char want_sh[96], sh[96];
    int shape_ok = want_rank < 0 || arr->rank == want_rank;
    for (int r = 0; shape_ok && want_shape && r < want_rank; r++)
        if (want_shape[r] >= 0 && arr->shape[r] != want_shape[r]) shape_ok = 0;
    if (arr->type != want || !shape_ok) {
        if (want_rank >= 0)
            want_shape_str(want_rank, want_shape, want_sh, sizeof want_sh);
        cli_die("%s: %s must be %s ('%s') of %s%s, found %s ('%s') of shape %s", path, role,
                fa_npy_type_name(want), fa_npy_type_descr(want), want_rank >= 0 ? "shape " : "any shape",
                want_rank >= 0 ? want_sh : "", fa_npy_type_name(arr->type),
                fa_npy_type_descr(arr->type), cli_shape(arr->rank, arr->shape, sh, sizeof sh));
        fa_npy_free(arr);
        return CLI_EXIT_USAGE;
    }
    return 0;
}

int cli_load_index(const char *path, const char *role, int want_rank, const int64_t *want_shape, fa_npy *arr)
{
    return load_ints(path, FA_NPY_I32, role, want_rank, want_shape, arr);
}

int cli_load_codes(const char *path, const char *role, int want_rank, const int64_t *want_shape, fa_npy *arr)
{
    return load_ints(path, FA_NPY_U8, role, want_rank, want_shape, arr);
}

void cli_qkv_free(cli_qkv *in)
{
    fa_npy_free(&in->q);
    fa_npy_free(&in->k);
    fa_npy_free(&in->v);
}

/* mode: 0 uniform, 1 packed (varlen: rows no sequence reads may hold anything), 2 KV cache
 * (k, v are caches or pages: any batch, and rows the sequences do not use may hold anything).
 * Where rows may hold anything the caller tests the rows in use (fa_check_inputs, or fa_check
 * itself). */
static int load_qkv(cli_qkv *in, const char *q_path, const char *k_path, const char *v_path, int mode)
{
    const int packed = mode == 1, cache = mode == 2;
    memset(in, 0, sizeof *in);
    in->q_path = q_path;
    in->k_path = k_path;
    in->v_path = v_path;
    in->packed = packed;
    if (packed ? (cli_load_array(q_path, 3, 0, "Q [total_q, heads, d] (varlen)", &in->q, &in->q_t) ||
                  cli_load_array(k_path, 3, 0, "K [total_k, heads_k, d] (varlen)", &in->k, &in->k_t) ||
                  cli_load_array(v_path, 3, 0, "V [total_k, heads_k, d_v] (varlen)", &in->v, &in->v_t))
               : (cli_load_array(q_path, 4, 1, "Q [batch, seqlen_q, heads, d]", &in->q, &in->q_t) ||
                  cli_load_array(k_path, 4, !cache, cache ? "K cache [batch_cache, seqlen_cache, heads_k, d]"
                                 : "K [batch, seqlen_k, heads_k, d]", &in->k, &in->k_t) ||
                  cli_load_array(v_path, 4, !cache, cache ? "V cache [batch_cache, seqlen_cache, heads_k, d_v]"
                                 : "V [batch, seqlen_k, heads_k, d_v]", &in->v, &in->v_t))) {
        cli_qkv_free(in);
        return CLI_EXIT_USAGE;
    }
    /* a packed array reads as [1, total, heads, x] below */
    int64_t q4[4] = {1, 0, 0, 0}, k4[4] = {1, 0, 0, 0}, v4[4] = {1, 0, 0, 0};
    for (int r = packed; r < 4; r++) {
        q4[r] = in->q.shape[r - packed];
        k4[r] = in->k.shape[r - packed];
        v4[r] = in->v.shape[r - packed];
    }
    const int64_t *q = q4, *k = k4, *v = v4;
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
    /* (the library takes an empty varlen batch; the CLI, which reads and writes files of rows, does not) */
    else if (in->seqlen_q < 1)
        cli_die("%s: %s must be >= 1, got %lld", q_path, packed ? "total_q (rows)" : "seqlen_q",
                (long long)in->seqlen_q);
    else if (in->seqlen_k < 1)
        cli_die("%s: %s must be >= 1, got %lld", k_path, packed ? "total_k (rows)" : "seqlen_k",
                (long long)in->seqlen_k);
    else if (k[0] != q[0] && !cache)
        cli_die("%s: batch %lld does not match %s batch %lld", k_path, (long long)k[0], q_path, (long long)q[0]);
    else if (v[0] != (cache ? k[0] : q[0]))
        cli_die("%s: batch %lld does not match %s batch %lld", v_path, (long long)v[0], cache ? k_path : q_path,
                (long long)(cache ? k[0] : q[0]));
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

int cli_load_qkv(cli_qkv *in, const char *q_path, const char *k_path, const char *v_path)
{
    return load_qkv(in, q_path, k_path, v_path, 0);
}

int cli_load_qkv_packed(cli_qkv *in, const char *q_path, const char *k_path, const char *v_path)
{
    return load_qkv(in, q_path, k_path, v_path, 1);
}

int cli_inputs_in_use_finite(const cli_qkv *in, const cli_attn *a)
{
    if (!in->packed && !a->cache_seqlens_path) return 0; /* loaded with the whole-file test */
    const fa_status st = fa_check_inputs(&in->q_t, &in->k_t, &in->v_t, &a->opt, in->q_path, in->k_path, in->v_path);
    return st == FA_OK ? 0 : cli_die_status(st);
}

int cli_load_inputs(cli_qkv *in, const cli_attn *a, const char *q_path, const char *k_path, const char *v_path)
{
    memset(in, 0, sizeof *in);
    if (!cli_attn_is_kvcache(a)) { /* a cache option alone: say so before -k/-v fail as ordinary K/V */
        const char *stray = a->k_new_path ? "--k-new" : a->v_new_path ? "--v-new" : a->cache_idx_path ? "--cache-batch-idx"
                            : a->leftpad_path ? "--cache-leftpad" : a->block_table_path ? "--block-table" : NULL;
        if (stray) return cli_die("%s needs --cache-seqlens", stray);
    }
    return load_qkv(in, q_path, k_path, v_path, cli_attn_is_varlen(a) ? 1 : cli_attn_is_kvcache(a) ? 2 : 0);
}

/* --sinks: f32/f64 [heads], finite (the library checks the range). */
static int load_sinks(cli_attn *a, const cli_qkv *in)
{
    if (!a->sinks_path) return 0;
    const char *path = a->sinks_path;
    if (cli_load_array(path, 0, 1, "sinks [heads]", &a->sinks, &a->sinks_t)) {
        cli_attn_free(a);
        return CLI_EXIT_USAGE;
    }
    char sh[96];
    if (a->sinks.rank != 1 || a->sinks.shape[0] != in->heads) {
        cli_die("%s: sinks of shape %s should be [heads] = [%lld]", path,
                cli_shape(a->sinks.rank, a->sinks.shape, sh, sizeof sh), (long long)in->heads);
        cli_attn_free(a);
        return CLI_EXIT_USAGE;
    }
    if (a->sinks.dtype != FA_F32 && a->sinks.dtype != FA_F64) {
        cli_die("%s: sinks must be float32 or float64, got %s", path, fa_dtype_name(a->sinks.dtype));
        cli_attn_free(a);
        return CLI_EXIT_USAGE;
    }
    a->opt.sinks = &a->sinks_t;
    return 0;
}

/* --dropout-p and --dropout-mask: the keep-mask as uint8 bytes (the library checks shape and values). */
static int load_dropout(cli_attn *a)
{
    if (!a->dropout_p_text && !a->dropout_mask_path) return 0;
    if (!a->dropout_p_text || !a->dropout_mask_path) {
        cli_die("%s needs %s (dropout takes the keep-mask as an input)",
                a->dropout_p_text ? "--dropout-p" : "--dropout-mask", a->dropout_p_text ? "--dropout-mask" : "--dropout-p");
        cli_attn_free(a);
        return CLI_EXIT_USAGE;
    }
    if (cli_load_codes(a->dropout_mask_path, "--dropout-mask [batch, heads, seqlen_q, seqlen_k]", 4, NULL, &a->keep)) {
        cli_attn_free(a);
        return CLI_EXIT_USAGE;
    }
    a->dropout.keep_mask = (const uint8_t *)a->keep.data;
    memcpy(a->dropout.keep_shape, a->keep.shape, sizeof a->dropout.keep_shape);
    a->dropout.keep_mask_name = a->dropout_mask_path;
    a->opt.dropout = &a->dropout;
    return 0;
}

/* --rotary-cos/--rotary-sin: f32/f64 rank 2, finite (the library checks shapes and positions). */
static int load_rotary(cli_attn *a)
{
    if (!a->rotary_cos_path && !a->rotary_sin_path) {
        if (a->rotary_interleaved) {
            cli_die("--rotary-interleaved needs --rotary-cos and --rotary-sin");
            cli_attn_free(a);
            return CLI_EXIT_USAGE;
        }
        return 0;
    }
    if (!a->rotary_cos_path || !a->rotary_sin_path || !a->cache_seqlens_path || !a->k_new_path) {
        cli_die("%s needs %s", a->rotary_cos_path ? "--rotary-cos" : "--rotary-sin",
                !a->rotary_cos_path ? "--rotary-cos" : !a->rotary_sin_path ? "--rotary-sin"
                : "a KV cache with new keys (--cache-seqlens, --k-new, --v-new), as flash_attn_with_kvcache");
        cli_attn_free(a);
        return CLI_EXIT_USAGE;
    }
    if (cli_load_array(a->rotary_cos_path, 2, 1, "rotary cos [seqlen_ro, rotary_dim / 2]", &a->rot_cos, &a->rot_cos_t) ||
        cli_load_array(a->rotary_sin_path, 2, 1, "rotary sin [seqlen_ro, rotary_dim / 2]", &a->rot_sin, &a->rot_sin_t)) {
        cli_attn_free(a);
        return CLI_EXIT_USAGE;
    }
    const char *bad = a->rot_cos.dtype != FA_F32 && a->rot_cos.dtype != FA_F64 ? a->rotary_cos_path
                      : a->rot_sin.dtype != FA_F32 && a->rot_sin.dtype != FA_F64 ? a->rotary_sin_path : NULL;
    if (bad) {
        cli_die("%s: rotary tables must be float32 or float64", bad);
        cli_attn_free(a);
        return CLI_EXIT_USAGE;
    }
    fa_rotary_init(&a->rotary, sizeof a->rotary);
    a->rotary.cos = &a->rot_cos_t;
    a->rotary.sin = &a->rot_sin_t;
    a->rotary.interleaved = a->rotary_interleaved;
    a->rotary.cos_name = a->rotary_cos_path;
    a->rotary.sin_name = a->rotary_sin_path;
    a->opt.rotary = &a->rotary;
    return 0;
}

int cli_attn_load_alibi(cli_attn *a, const cli_qkv *in)
{
    if (load_sinks(a, in) || load_dropout(a) || load_rotary(a)) return CLI_EXIT_USAGE;
    if (!a->alibi_path) return 0;
    const char *path = a->alibi_path;
    if (cli_load_array(path, 0, 1, "ALiBi slopes [heads] or [batch, heads]", &a->alibi, &a->alibi_t))
        return CLI_EXIT_USAGE;
    char sh[96];
    const int64_t batch = a->opt.varlen ? a->varlen.batch : in->batch; /* varlen: per sequence */
    int ok_shape = (a->alibi.rank == 1 && a->alibi.shape[0] == in->heads) ||
                   (a->alibi.rank == 2 && a->alibi.shape[0] == batch && a->alibi.shape[1] == in->heads);
    if (!ok_shape) {
        cli_die("%s: ALiBi slopes of shape %s should be [heads] = [%lld] or [batch, heads] = [%lld, %lld]",
                path, cli_shape(a->alibi.rank, a->alibi.shape, sh, sizeof sh), (long long)in->heads,
                (long long)batch, (long long)in->heads);
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

int cli_check_output(const char *opt, const char *path)
{
    if (!*path) return cli_die("%s: empty file name", opt);
    fa_status st = fa_outfile_check(path);
    return st == FA_OK ? 0 : cli_die_npy(st);
}

/* Identity of a file: device and inode if it exists, else the device and
 * inode of its directory (symlinks resolved) and its name there. */
typedef struct file_id {
    int known, exists, chr;
    dev_t dev;
    ino_t ino;
    char *name;                 /* last component, when !exists */
} file_id;

static void get_file_id(const char *path, file_id *id)
{
    memset(id, 0, sizeof *id);
    struct stat sb;
    if (stat(path, &sb) == 0) {
        id->known = id->exists = 1;
        id->chr = S_ISCHR(sb.st_mode);
        id->dev = sb.st_dev;
        id->ino = sb.st_ino;
        return;
    }
    char *t = fa_path_resolve_links(path);
    if (!t) return;
    char *slash = strrchr(t, '/');
    const char *dir = ".";
    if (slash) {
        *slash = '\0';
        dir = slash == t ? "/" : t;
    }
    if (stat(dir, &sb) == 0) {
        id->known = 1;
        id->dev = sb.st_dev;
        id->ino = sb.st_ino;
        id->name = strdup(slash ? slash + 1 : t);
        if (!id->name) id->known = 0;
    }
    free(t);
}

static int same_id(const file_id *a, const file_id *b)
{
    if (!a->known || !b->known || a->exists != b->exists || a->dev != b->dev || a->ino != b->ino) return 0;
    return a->exists || strcmp(a->name, b->name) == 0;
}

int cli_check_files(const char *cmd, const cli_named *outs, int nout, const cli_named *ins, int nin)
{
    enum { MAX_FILES = 32 };
    if (nout > MAX_FILES || nin > MAX_FILES) return cli_die("%s: too many files", cmd);
    for (int i = 0; i < nout; i++)
        if (outs[i].path && cli_check_output(outs[i].opt, outs[i].path)) return CLI_EXIT_USAGE;
    file_id out_id[MAX_FILES], in_id[MAX_FILES];
    for (int i = 0; i < nout; i++) {
        memset(&out_id[i], 0, sizeof out_id[i]);
        if (outs[i].path) get_file_id(outs[i].path, &out_id[i]);
    }
    for (int i = 0; i < nin; i++) {
        memset(&in_id[i], 0, sizeof in_id[i]);
        if (ins[i].path) get_file_id(ins[i].path, &in_id[i]);
    }
    int rc = 0;
    for (int i = 0; i < nout && !rc; i++) {
        /* two outputs into one character device (/dev/null twice) is harmless */
        for (int j = i + 1; j < nout && !rc; j++)
            if (same_id(&out_id[i], &out_id[j]) && !out_id[i].chr)
                rc = cli_die("%s: %s %s and %s %s are the same file; give each output its own file", cmd,
                             outs[i].opt, outs[i].path, outs[j].opt, outs[j].path);
        for (int j = 0; j < nin && !rc; j++)
            if (same_id(&out_id[i], &in_id[j]) && !out_id[i].chr)
                rc = cli_die("%s: output %s %s is the input %s %s; write the output to another file", cmd,
                             outs[i].opt, outs[i].path, ins[j].opt, ins[j].path);
    }
    for (int i = 0; i < nout; i++) free(out_id[i].name);
    for (int i = 0; i < nin; i++) free(in_id[i].name);
    return rc;
}

/* SIGINT/SIGTERM/SIGHUP/SIGPIPE: remove the temporaries, then die of the signal. */
static void on_fatal_signal(int sig)
{
    fa_outfile_cleanup_signal();
    signal(sig, SIG_DFL);
    raise(sig);
}

void cli_cleanup_on_signals(void)
{
    static const int sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGPIPE};
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_fatal_signal;
    sa.sa_flags = SA_RESETHAND | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) {
        struct sigaction old;
        /* a signal the caller ignores (nohup, trap '' INT) stays ignored */
        if (sigaction(sigs[i], NULL, &old) == 0 && old.sa_handler == SIG_IGN) continue;
        sigaction(sigs[i], &sa, NULL);
    }
}

int cli_save_outputs(const cli_output *outs, int n)
{
    enum { MAX_OUT = 8 };
    if (n > MAX_OUT) return cli_die("internal: too many outputs");
    cli_cleanup_on_signals();
    fa_outfile f[MAX_OUT];
    int used[MAX_OUT] = {0};
    fa_status st = FA_OK;
    /* 1. every output into its temporary (or through to its device/FIFO) */
    for (int i = 0; i < n && st == FA_OK; i++) {
        if (!outs[i].path) continue;
        if ((st = fa_outfile_open(&f[i], outs[i].path)) != FA_OK) break;
        used[i] = 1;
        st = fa_npy_write(&f[i], outs[i].data, outs[i].dtype, outs[i].rank, outs[i].shape);
    }
    if (st != FA_OK) {
        for (int i = 0; i < n; i++)
            if (used[i]) fa_outfile_abort(&f[i]);
        return cli_die_npy(st);
    }
    /* 2. rename them all into place; if one fails, remove those already renamed */
    int failed = -1;
    for (int i = 0; i < n && failed < 0; i++)
        if (used[i] && (st = fa_outfile_commit(&f[i])) != FA_OK) failed = i;
    if (failed >= 0) {
        for (int i = 0; i < n; i++) {
            if (!used[i]) continue;
            if (i < failed && !f[i].through && f[i].target) unlink(f[i].target);
            if (i > failed) fa_outfile_abort(&f[i]);
        }
    }
    for (int i = 0; i < n; i++)
        if (used[i]) fa_outfile_free(&f[i]);
    return failed >= 0 ? cli_die_npy(st) : 0;
}

/* An exit() that is not a return from a subcommand: the OpenMP runtime's. */
static volatile int cli_finished;

static void exit_guard(void)
{
    if (cli_finished) return;
    fflush(stdout);
    fputs("flashattn: the OpenMP runtime stopped the program (see its message above; e.g. threads "
          "could not be created: try fewer --threads)\n", stderr);
    _exit(CLI_EXIT_USAGE);
}

void cli_guard_runtime_exit(void)
{
    static int registered;
    cli_finished = 0; /* a process calling several subcommands (the fuzzer) re-arms it */
    if (!registered && atexit(exit_guard) == 0) registered = 1;
}

int cli_finish(int rc)
{
    cli_finished = 1;
    return rc;
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
