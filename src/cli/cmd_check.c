/*
 * cmd_check.c — `flashattn check`: is a tested attention output (say, from a
 * GPU kernel) right, against the float64 reference?
 *
 *   Q.npy [B][Sq][H][d], K.npy [B][Sk][Hk][d], V.npy [B][Sk][Hk][dv],
 *   O_TEST.npy [B][Sq][H][dv], optionally LSE_TEST.npy [B][H][Sq]
 *     -> a report on stdout; exit 0 within tolerance, 1 mismatch, 2 bad input.
 *
 * All the judging is the library's (fa_check in src/validate.c: one tolerance
 * model for the CLI, Python, tests and the CUDA harness). This file only
 * loads the files, words shape errors with the file names, and prints
 * fa_check_report_format()'s text.
 */
#include "cli.h"
#include "cli_lowprec.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char check_usage[] =
    "usage: flashattn check -q Q.npy -k K.npy -v V.npy --out O_TEST.npy [--lse LSE_TEST.npy]\n"
    "                       [MASK OPTIONS] [--dtype f32|f16|bf16] [--atol A --rtol R]\n"
    "                       [--sample-rows K] [--seed S] [--threads T] [--num-splits N] [--diagnose]\n"
    "                       [--qkv-format e4m3|e5m2|e2m1|int8 [SCALES] [--kernel-model fa3|sage]]\n"
    "\n"
    "Compares a tested attention output against the float64 reference computed from the\n"
    "same Q, K, V and mask options (FlashAttention semantics, masks aligned bottom-right).\n"
    "\n"
    "  -q Q.npy           queries [batch, seqlen_q, heads, d]\n"
    "  -k K.npy           keys    [batch, seqlen_k, heads_k, d]\n"
    "  -v V.npy           values  [batch, seqlen_k, heads_k, d_v]\n"
    "  --out O_TEST.npy   the output to check [batch, seqlen_q, heads, d_v] (-o is a synonym)\n"
    "  --lse LSE.npy      also check a log-sum-exp [batch, heads, seqlen_q] (f32/f64, natural\n"
    "                     log); rows with no visible key may be -inf or +inf; FlashAttention-2's\n"
    "                     causal-ALiBi LSE offset is recognized and accepted\n"
    "  --dtype T          precision the tested kernel ran in: bf16, f16 or f32 (default: the\n"
    "                     lowest precision among the four files; bf16 files are <u2 bit patterns,\n"
    "                     or pass float32 values with --dtype bf16)\n"
    "  --atol A --rtol R  replace the default rule by |test - ref| <= A + R*|ref| (either one\n"
    "                     given; the other defaults to 0)\n"
    "  --sample-rows K    check K random query rows per (batch, head) exactly: O(K * seqlen_k * d)\n"
    "  --seed S           seed of the row sampler (default 0)\n"
    "  --threads T        OpenMP threads (default: all cores)\n"
    "  --num-splits N     the tested kernel's split-KV count (0..65536), so run's options can\n"
    "                     be given as they are: checked, not used — the reference is the\n"
    "                     exact, unsplit attention whatever the kernel's splits (a wrong merge\n"
    "                     of splits is what --diagnose names split-combine)\n"
    "  --kernel-model M   with --qkv-format: also emulate kernel M's data path (fa3: P scaled by\n"
    "                     256 and rounded, row sums unrounded, key blocks last to first; sage:\n"
    "                     SageAttention's P*448 in e4m3, or for e2m1 P*2688 in e2m1 under e4m3\n"
    "                     scales per 16 keys) and hold the output to 2x that model's error\n"
    "  --diagnose         also name the known mistake that explains the error, best first:\n"
    "                     'diagnosis: <id> (explains X%% of the error; <fitted parameter>)' or\n"
    "                     'diagnosis: none', with per-head and per-sequence error tables; it\n"
    "                     samples --sample-rows K rows per (batch, head) (default 32); see\n"
    "                     docs/validation.md, \"Why did my kernel fail\"\n"
    "\n"
    "Default rule (FlashAttention's own test rule, on the CPU): a plain attention is computed\n"
    "the way a low-precision kernel would (inputs rounded to the dtype, scores in float32,\n"
    "P rounded to the dtype before P.V, output rounded); the tested max error must be at most\n"
    "2x that emulation's max error, plus atol = a * max|ref| (a = 2^-9 bf16, 2^-12 f16,\n"
    "2^-18 f32). NaN or Inf in the tested output always fails. See docs/validation.md.\n"
    "\n"
    "Low-precision rule (--qkv-format): the reference is exact attention on the dequantized\n"
    "inputs; the baseline is FlashAttention-3's FP8 one (a plain attention with the normalized P\n"
    "rounded to the format before P.V, bf16 output); the tested max error must be at most 2x the\n"
    "baseline's plus atol = 2^-9 * max|ref|. Every report also gives cosine similarity,\n"
    "relative L1, RMSE and SQNR.\n"
    "\n"
    "%s\n%s\n%s\n%s\n"
    "Exit status: 0 within tolerance; 1 mismatch; 2 bad usage or bad input (one line on\n"
    "stderr naming the file).\n";

/* Parse an unsigned 64-bit seed. */
static int parse_seed(const char *text, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    /* decimal digits only: strtoull skips blanks and takes a sign (' -1' read as 2^64 - 1) */
    if (end == text || *end != '\0' || errno == ERANGE || !(text[0] >= '0' && text[0] <= '9')) {
        cli_die("--seed: expected a non-negative decimal integer, got '%s'", text);
        return -1;
    }
    *out = (uint64_t)v;
    return 0;
}

/*
 * The default rule rounds Q, K and V to the tested precision; a value that
 * rounds to infinity there (|x| >= 65520 for f16, the largest finite being
 * 65504; >= 0x1.ffp127 for bf16) makes the emulation's error NaN and its bound
 * meaningless, so any output would "pass". Refuse it by name instead.
 * Returns 0, or prints and returns 2.
 */
static int check_emulation_range(const fa_check_options *co, const cli_qkv *in, const fa_npy *out)
{
    static const int bits[FA_DTYPE_COUNT] = {[FA_F32] = 24, [FA_F64] = 53, [FA_F16] = 11, [FA_BF16] = 8};
    fa_dtype dt = co->dtype;
    if (dt == FA_CHECK_DTYPE_AUTO) {
        const fa_dtype all[4] = {in->q.dtype, in->k.dtype, in->v.dtype, out->dtype};
        dt = all[0];
        for (int x = 1; x < 4; x++)
            if (bits[all[x]] < bits[dt]) dt = all[x];
    }
    double limit = dt == FA_F16 ? 65520.0 : dt == FA_BF16 ? 0x1.ffp127 : 0.0;
    if (limit == 0.0) return 0;
    const fa_npy *arrs[3] = {&in->q, &in->k, &in->v};
    const char *paths[3] = {in->q_path, in->k_path, in->v_path};
    for (int a = 0; a < 3; a++)
        for (int64_t x = 0; x < arrs[a]->numel; x++) {
            double value = cli_element(arrs[a]->data, arrs[a]->dtype, x);
            if (fabs(value) >= limit) {
                char ix[96];
                return cli_die("%s: %g at index %s overflows %s (largest finite %s): the %s emulation of the "
                               "default rule would be inf/NaN; check with --atol/--rtol, or a wider --dtype",
                               paths[a], value, cli_multi_index(arrs[a], x, ix, sizeof ix), fa_dtype_name(dt),
                               dt == FA_F16 ? "65504" : "3.39e38", fa_dtype_name(dt));
            }
        }
    return 0;
}

/*
 * The narrowest of bf16 and f16 that holds every value of the tested output exactly, or
 * FA_F32 when neither does (or fewer than 64 values are nonzero: too few to tell). A bf16 or
 * f16 kernel's output saved as float32 (numpy has no bfloat16: `.float().numpy()`) makes the
 * default rule float32's, which fails a correct kernel by orders of magnitude.
 */
static fa_dtype narrow_output_dtype(const fa_npy *o)
{
    int64_t nonzero = 0;
    int bf16 = 1, f16 = 1;
    for (int64_t x = 0; x < o->numel && (bf16 || f16); x++) {
        const double v = cli_element(o->data, o->dtype, x);
        if (v == 0.0 || !isfinite(v)) continue;
        nonzero++;
        int e;
        const double m = frexp(fabs(v), &e); /* |v| = m 2^e, m in [0.5, 1) */
        /* bf16: 8 significant bits, float32's exponent range */
        if (bf16 && (ldexp(m, 8) != floor(ldexp(m, 8)) || fabs(v) > 0x1.fep127 || e < -125)) bf16 = 0;
        /* f16: 11 significant bits down to 2^-14, then multiples of 2^-24; at most 65504 */
        if (f16 && (fabs(v) > 65504.0 || (e - 1 >= -14 ? ldexp(m, 11) != floor(ldexp(m, 11))
                                                      : ldexp(fabs(v), 24) != floor(ldexp(fabs(v), 24)))))
            f16 = 0;
    }
    if (nonzero < 64) return FA_F32;
    return bf16 ? FA_BF16 : f16 ? FA_F16 : FA_F32;
}

/* `--diagnose`: fa_diagnose on the same rows budget (per head of each sequence),
 * printed after the check report (attention sinks and dropout included: sink-missing,
 * dropout-mask; rotary: rotary-pairing, rotary-offset). Returns 0, or prints one line and
 * returns 2. */
static int print_diagnosis(const cli_qkv *in, const fa_tensor *o_t, const fa_tensor *lse_t, const cli_attn *attn,
                           const fa_check_options *co)
{
    fa_diagnose_options dopt;
    fa_diagnose_options_init(&dopt, sizeof dopt);
    dopt.dtype = co->dtype;
    dopt.sample_rows = co->sample_rows > 0 ? co->sample_rows : 32;
    dopt.seed = co->seed;
    dopt.num_threads = co->num_threads;
    dopt.qkv_format = co->qkv_format; /* low precision: P's rounding floor, descale and p-saturation */
    fa_diagnose_report rep = fa_diagnose_report_init();
    const double t0 = cli_now();
    fa_status st = fa_diagnose(&in->q_t, &in->k_t, &in->v_t, o_t, lse_t, &attn->opt, &dopt, &rep);
    if (st != FA_OK) return cli_die_status(st);
    const double t = cli_now() - t0;
    size_t len = fa_diagnose_report_format(&rep, NULL, 0);
    char *text = malloc(len + 1);
    if (!text) {
        fa_diagnose_report_free(&rep);
        return cli_die("check: out of memory formatting the diagnosis");
    }
    fa_diagnose_report_format(&rep, text, len + 1);
    fputs(text, stdout);
    printf("time: diagnose %.2f s\n", t);
    free(text);
    fa_diagnose_report_free(&rep);
    return 0;
}

static int check_main(int argc, char **argv)
{
    const char *q_path = NULL, *k_path = NULL, *v_path = NULL, *o_path = NULL, *lse_path = NULL;
    const char *dtype_text = NULL, *atol_text = NULL, *rtol_text = NULL, *rows_text = NULL;
    const char *seed_text = NULL, *threads_text = NULL, *splits_text = NULL;
    const char *model_text = NULL;
    int diagnose = 0;
    cli_attn attn;
    cli_attn_init(&attn);
    cli_lowprec lp;
    cli_lowprec_init(&lp);

    for (int i = 1; i < argc; i++) {
        int r;
        if (cli_is_help(argv[i])) {
            printf(check_usage, cli_mask_help, cli_varlen_help, cli_kvcache_help, cli_lowprec_help);
            return CLI_EXIT_OK;
        }
        if ((r = cli_opt_flag(argv, i, "--diagnose")) != 0) {
            if (r < 0) return CLI_EXIT_USAGE;
            diagnose = 1;
            continue;
        }
        if ((r = cli_parse_mask_option(argc, argv, &i, &attn)) != 0 ||
            (r = cli_parse_varlen_option(argc, argv, &i, &attn)) != 0 ||
            (r = cli_parse_kvcache_option(argc, argv, &i, &attn)) != 0 ||
            (r = cli_lowprec_parse(argc, argv, &i, &lp)) != 0 ||
            (r = cli_opt_value(argc, argv, &i, "--kernel-model", &model_text)) != 0 ||
            (r = cli_opt_value(argc, argv, &i, "-q", &q_path)) != 0 ||
            (r = cli_opt_value(argc, argv, &i, "-k", &k_path)) != 0 ||
            (r = cli_opt_value(argc, argv, &i, "-v", &v_path)) != 0 ||
            (r = cli_opt_value_alias(argc, argv, &i, "--out", "-o", &o_path)) != 0 ||
            (r = cli_opt_value_alias(argc, argv, &i, "-o", "--out", &o_path)) != 0 ||
            (r = cli_opt_value(argc, argv, &i, "--lse", &lse_path)) != 0 ||
            (r = cli_opt_value(argc, argv, &i, "--dtype", &dtype_text)) != 0 ||
            (r = cli_opt_value(argc, argv, &i, "--atol", &atol_text)) != 0 ||
            (r = cli_opt_value(argc, argv, &i, "--rtol", &rtol_text)) != 0 ||
            (r = cli_opt_value(argc, argv, &i, "--sample-rows", &rows_text)) != 0 ||
            (r = cli_opt_value(argc, argv, &i, "--seed", &seed_text)) != 0 ||
            (r = cli_opt_value(argc, argv, &i, "--threads", &threads_text)) != 0 ||
            (r = cli_opt_value(argc, argv, &i, "--num-splits", &splits_text)) != 0) {
            if (r < 0) return CLI_EXIT_USAGE;
            continue;
        }
        return cli_unknown_option("check", argv[i]);
    }
    if (!q_path || !k_path || !v_path || !o_path)
        return cli_die("check: missing %s (see flashattn check --help)",
                       !q_path ? "-q Q.npy" : !k_path ? "-k K.npy" : !v_path ? "-v V.npy" : "--out O_TEST.npy");

    /* Options first: a typo should not cost a 3 GB load. */
    fa_check_options co = fa_check_options_default();
    if (dtype_text) {
        fa_dtype dt;
        if (cli_parse_dtype("--dtype", dtype_text, &dt) != 0) return CLI_EXIT_USAGE;
        if (dt == FA_F64)
            return cli_die("--dtype: the tested kernel's precision must be bf16, f16 or f32, got 'f64'");
        co.dtype = dt;
    }
    if (atol_text || rtol_text) {
        co.use_tolerance = 1;
        if (atol_text && cli_parse_double("--atol", atol_text, &co.atol) != 0) return CLI_EXIT_USAGE;
        if (rtol_text && cli_parse_double("--rtol", rtol_text, &co.rtol) != 0) return CLI_EXIT_USAGE;
        if (co.atol < 0) return cli_die("--atol: must be >= 0, got '%s'", atol_text);
        if (co.rtol < 0) return cli_die("--rtol: must be >= 0, got '%s'", rtol_text);
    }
    long long n;
    if (rows_text) {
        if (cli_parse_int("--sample-rows", rows_text, 1, INT64_MAX, &n) != 0) return CLI_EXIT_USAGE;
        co.sample_rows = n;
    }
    if (seed_text && parse_seed(seed_text, &co.seed) != 0) return CLI_EXIT_USAGE;
    if (splits_text && cli_parse_int("--num-splits", splits_text, 0, 65536, &n) != 0) return CLI_EXIT_USAGE;
    if (threads_text) {
        if (cli_parse_int("--threads", threads_text, 1, 4096, &n) != 0) return CLI_EXIT_USAGE;
        co.num_threads = (int)n;
    }
    if (cli_lowprec_validate(&lp, &attn)) return CLI_EXIT_USAGE;
    co.qkv_format = lp.format;
    if (model_text) {
        if (strcmp(model_text, "fa3") != 0 && strcmp(model_text, "sage") != 0)
            return cli_die("--kernel-model: expected fa3 or sage, got '%s'", model_text);
        if (!lp.format) return cli_die("--kernel-model %s needs --qkv-format", model_text);
        co.kernel_model = strcmp(model_text, "fa3") == 0 ? FA_KERNEL_MODEL_FA3 : FA_KERNEL_MODEL_SAGE;
        if (lp.format == FA_QF_E2M1 && co.kernel_model == FA_KERNEL_MODEL_FA3)
            return cli_die("--kernel-model fa3 is FlashAttention-3's FP8 path; for e2m1 use --kernel-model sage");
    }
    if (lp.format && dtype_text) return cli_die("--dtype: the low-precision rule (--qkv-format) fixes the output to bf16");
    co.q_name = q_path;
    co.k_name = k_path;
    co.v_name = v_path;
    co.out_name = o_path;
    co.lse_name = lse_path;

    double t0 = cli_now();
    cli_qkv in;
    if (lp.format ? cli_lowprec_load_qkv(&in, q_path, k_path, v_path, &lp) : cli_load_inputs(&in, &attn, q_path, k_path, v_path)) {
        cli_attn_free(&attn);
        return CLI_EXIT_USAGE;
    }
    int rc = CLI_EXIT_USAGE;
    fa_npy o_arr, lse_arr;
    fa_tensor o_t, lse_t;
    memset(&o_arr, 0, sizeof o_arr);
    memset(&lse_arr, 0, sizeof lse_arr);
    char sh[96];
    if (cli_attn_load_varlen(&attn, &in) || cli_attn_load_kvcache(&attn, &in) || cli_attn_load_alibi(&attn, &in))
        goto done;

    /* The tested output: NaN/Inf are findings, not bad input. (varlen: without the batch of 1) */
    const int skip = cli_skip(&in);
    const int64_t o_want[4] = {in.batch, in.seqlen_q, in.heads, in.dv}, lse_want[3] = {in.batch, in.heads, in.seqlen_q};
    const char *o_role = skip ? "O [total_q, heads, d_v] (varlen)" : "O [batch, seqlen_q, heads, d_v]";
    const char *lse_role = skip ? "LSE [heads, total_q] (varlen)" : "LSE [batch, heads, seqlen_q]";
    if (cli_load_array(o_path, 4 - skip, 0, o_role, &o_arr, &o_t)) goto done;
    if (memcmp(o_arr.shape, o_want + skip, (size_t)(4 - skip) * sizeof(int64_t)) != 0) {
        char want[96];
        cli_die("%s: shape %s should be %s = %s (from %s and %s)", o_path,
                cli_shape(4 - skip, o_arr.shape, sh, sizeof sh),
                skip ? "[total_q, heads, d_v]" : "[batch, seqlen_q, heads, d_v]",
                cli_shape(4 - skip, o_want + skip, want, sizeof want), q_path, v_path);
        goto done;
    }
    if (lse_path) {
        if (cli_load_array(lse_path, 3 - skip, 0, lse_role, &lse_arr, &lse_t)) goto done;
        if (lse_arr.dtype != FA_F32 && lse_arr.dtype != FA_F64) {
            cli_die("%s: LSE must be float32 or float64, got %s", lse_path, fa_dtype_name(lse_arr.dtype));
            goto done;
        }
        if (memcmp(lse_arr.shape, lse_want + skip, (size_t)(3 - skip) * sizeof(int64_t)) != 0) {
            char want[96];
            cli_die("%s: shape %s should be %s = %s (from %s)", lse_path,
                    cli_shape(3 - skip, lse_arr.shape, sh, sizeof sh),
                    skip ? "[heads, total_q]" : "[batch, heads, seqlen_q]",
                    cli_shape(3 - skip, lse_want + skip, want, sizeof want), q_path);
            goto done;
        }
    }
    /* varlen and KV-cache problems: the library checks the rows in use (a value no sequence reads may
     * overflow the dtype, as it may be NaN) */
    if (!co.use_tolerance && !attn.opt.varlen && !attn.opt.kvcache && check_emulation_range(&co, &in, &o_arr))
        goto done;
    double t_load = cli_now() - t0;

    fa_check_report rep = fa_check_report_init();
    t0 = cli_now();
    fa_status st = fa_check(&in.q_t, &in.k_t, &in.v_t, &o_t, lse_path ? &lse_t : NULL, &attn.opt, &co, &rep);
    double t_check = cli_now() - t0;
    if (st != FA_OK) {
        cli_die_status(st);
        goto done;
    }
    size_t len = fa_check_report_format(&rep, NULL, 0);
    char *text = malloc(len + 1);
    if (!text) {
        fa_check_report_free(&rep);
        cli_die("check: out of memory formatting the report");
        goto done;
    }
    fa_check_report_format(&rep, text, len + 1);
    printf("flashattn check: %s (%s)%s%s against the float64 reference from %s, %s, %s\n", o_path,
           fa_dtype_name(o_arr.dtype), lse_path ? " and " : "", lse_path ? lse_path : "", q_path,
           k_path, v_path);
    fputs(text, stdout);
    fa_cpu_info info;
    fa_get_cpu_info(&info);
    printf("time: load %.2f s, check %.2f s (%d threads)\n", t_load, t_check,
           co.num_threads > 0 ? co.num_threads : info.max_threads);
    free(text);
    if (!rep.pass && !dtype_text && !co.use_tolerance && !lp.format && rep.dtype == FA_F32 &&
        o_arr.dtype != FA_BF16 && o_arr.dtype != FA_F16) {
        const fa_dtype narrow = narrow_output_dtype(&o_arr);
        if (narrow != FA_F32)
            printf("hint: every value of %s is %s %s value, but the rule applied is float32's (no file is "
                   "bf16 or f16): if the kernel computed in %s, check with --dtype %s\n",
                   o_path, narrow == FA_F16 ? "an" : "a", fa_dtype_name(narrow), fa_dtype_name(narrow),
                   fa_dtype_name(narrow));
    }
    if (rep.rows_checked == 0)
        fprintf(stderr, "flashattn: warning: no output row was compared (every sequence is empty); "
                        "the verdict says nothing about the kernel\n");
    rc = rep.pass ? CLI_EXIT_OK : CLI_EXIT_MISMATCH;
    fa_check_report_free(&rep);
    if (diagnose && print_diagnosis(&in, &o_t, lse_path ? &lse_t : NULL, &attn, &co) != 0) rc = CLI_EXIT_USAGE;
done:
    fa_npy_free(&o_arr);
    fa_npy_free(&lse_arr);
    cli_attn_free(&attn);
    cli_qkv_free(&in);
    return rc;
}

int cmd_check(int argc, char **argv)
{
    cli_guard_runtime_exit();
    return cli_finish(check_main(argc, argv));
}
