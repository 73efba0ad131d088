/*
 * cmd_check_grad.c — `flashattn check-grad`: are tested gradients (say, from
 * a GPU backward kernel) right, against the float64 reference backward?
 *
 *   Q.npy, K.npy, V.npy, DO.npy (as for `grad`) and the tested
 *   DQ_TEST.npy [B][Sq][H][d], DK_TEST.npy [B][Sk][Hk][d], DV_TEST.npy [B][Sk][Hk][dv]
 *     -> one line per gradient on stdout; exit 0 all within tolerance,
 *        1 mismatch, 2 bad usage or bad input.
 *
 * The rule is stated in full: a gradient G passes iff
 *     max |G_test - G_ref| <= a * max|G_ref| + T + 3 * e32,
 *     T = 2 * e_lp (bf16, f16)  or  rtol * max|G_ref| (f32, or when the emulation fails)
 * over all its elements (NaN or Inf in G_test always fails), with the float64
 * reference backward (fa_backward, FA_IMPL_REFERENCE, O and LSE recomputed in
 * float64) as G_ref. Defaults by the precision the tested kernel ran in
 * (--dtype, else the lowest precision among the three tested files):
 *     f32: rtol 1e-4, a 2^-18    f16: rtol 1e-2, a 2^-12    bf16: rtol 5e-2, a 2^-9
 * a is the forward check's floor (half a unit roundoff of the dtype): relative, so
 * the rule does not loosen when every gradient is small (a fixed atol of 1e-6
 * passed all-zero gradients once dO was ~1e-7), and it keeps a correct kernel
 * off by a fraction of an ulp from failing where e_lp happens to be tiny. e_lp
 * (bf16, f16) is the error of the same backward run plainly in that dtype
 * (below): FlashAttention's own test rule. It replaced the fixed rtol, which alone
 * passed a bf16 dQ 4% off and dV rows never written (and, taken as a cap on
 * 2 e_lp, failed the exact gradients rounded to f16 once they lay in f16's
 * subnormal range, below 6.1e-5, where plain f16 arithmetic itself errs by
 * percents). dsinks is judged alike.
 * The rtol term is a normwise bound relative to the largest gradient, as in the
 * FlashAttention backward tests' spirit: low-precision kernels round P, dS and
 * the operands to the dtype (unit roundoff 2^-11 f16, 2^-8 bf16), and errors of
 * a few units of roundoff relative to max|G| are expected; a wrong mask or a
 * missing head sum gives errors of order max|G|.
 *
 * e32 is what the arithmetic itself gets wrong on these inputs: the max error
 * of this library's float32 flash backward (FA_IMPL_FLASH, tested against the
 * reference on random inputs) against G_ref, the largest over four orders of its
 * float32 sums (the SIMD kernels with key blocks of its own choice, 16 and 32;
 * the scalar kernels). For a bf16 or f16 kernel the backward is given O as its
 * forward stored it, in the tested dtype (FlashAttention computes D = dO . O from
 * that stored O), so e32 also carries O's rounding. A normwise bound alone fails correct
 * kernels whenever G is small by cancellation: dS = P o (dP - D) subtracts two
 * dot products of size |dO||V| (V rows alike, a converged model), so dQ and dK
 * are tiny while any float32 kernel's rounding of dP and D is not (measured: a
 * correct float32 dQ 5e-5 off where max|dQ_ref| is 2e-13, against a bound of
 * 1e-6). Every kernel that accumulates dP and D in float32 pays that error, and a
 * bf16/f16 FlashAttention kernel also O's rounding to its dtype; e32 measures both
 * instead of guessing them. On random inputs at ordinary logits e32 is a few units of
 * float32 roundoff of max|G| and changes nothing; at large logits it is larger, and so
 * is every float32 kernel's error. e32 comes from this library's own backward, so this
 * rule cannot judge that backward (tests/test_backward.c compares it with the float64
 * reference). e_lp: fa_backward_extra.emulate_dtype, PyTorch autograd's rounding points
 * (FlashAttention's tests allow twice its error). --atol/--rtol replace the whole rule by
 * atol + rtol * max|G_ref| (atol 1e-6 unless given; no e32, no e_lp).
 */
#include "cli.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char check_grad_usage[] =
    "usage: flashattn check-grad -q Q.npy -k K.npy -v V.npy --dout DO.npy\n"
    "                            --dq DQ_TEST.npy --dk DK_TEST.npy --dv DV_TEST.npy\n"
    "                            [MASK OPTIONS] [--dtype f32|f16|bf16] [--atol A] [--rtol R] [--threads T]\n"
    "\n"
    "Compares tested gradients against the float64 reference backward computed from the same\n"
    "Q, K, V, dO and mask options (FlashAttention semantics).\n"
    "\n"
    "  -q, -k, -v, --dout     inputs, as for flashattn grad\n"
    "  --dq/--dk/--dv FILE    the tested gradients (any float dtype; bf16 as <u2)\n"
    "  --dsinks FILE          with --sinks: the tested gradient of the sinks [heads], judged by the same rule\n"
    "  --dtype T              precision the tested kernel ran in (default: lowest among the tested files)\n"
    "  --atol A  --rtol R     replace the default rule by max|G_test - G_ref| <= A + R * max|G_ref|\n"
    "                         (either one given; the other keeps its default: A 1e-6, R as below)\n"
    "  --threads T            OpenMP threads (default: all cores)\n"
    "\n"
    "Default rule: G passes iff max|G_test - G_ref| <= a*max|G_ref| + T + 3*e32, with a = 2^-18 f32,\n"
    "2^-12 f16, 2^-9 bf16; T = 2*e_lp for bf16 and f16, e_lp the max error of the same backward run\n"
    "plainly in that dtype (PyTorch autograd's rounding points: FlashAttention's own test rule), and\n"
    "T = rtol*max|G_ref| for f32 (rtol 1e-4; 1e-2 f16, 5e-2 bf16 if the emulation cannot run);\n"
    "e32 the max error of this library's\n"
    "float32 flash backward on the same inputs (the largest over four summation orders: key\n"
    "blocks of its choice, 16 and 32, and its scalar kernels; for bf16/f16, given O stored in that\n"
    "dtype, from which FlashAttention computes D = dO.O): what the arithmetic gets wrong here, large\n"
    "only when G is small by cancellation (dS = P o (dP - D) with V rows alike), where a bound\n"
    "relative to max|G_ref| alone would fail every correct kernel. NaN or Inf in a tested\n"
    "gradient always fails.\n"
    "\n"
    "%s\n%s\n"
    "Exit status: 0 within tolerance; 1 mismatch; 2 bad usage or bad input (one line on\n"
    "stderr naming the file).\n";

/* Precision rank: lower is less precise. */
static int precision_rank(fa_dtype t)
{
    switch (t) {
    case FA_BF16: return 0;
    case FA_F16: return 1;
    case FA_F32: return 2;
    default: return 3;
    }
}

/* What one gradient's comparison found. */
typedef struct grad_cmp {
    double max_err, max_ref, bound;
    int64_t n_fail, worst;   /* flat C-order index of the largest error, -1 if none */
} grad_cmp;

/*
 * test and ref (float64) are C-order arrays of the same shape, of rows of
 * row_elems elements. owned: NULL (every row), or [rows] flags: rows no
 * sequence owns (varlen: past cu_seqlens_q[batch], keys past seqused_k) are
 * not judged, as `check` skips them: the library leaves them zero, another
 * implementation may leave them as they were. The bound: atol + atol_rel * max|ref| + extra
 * plus lp_term when it is finite (twice the emulated low-precision backward's error), else
 * rtol * max|ref|.
 */
static grad_cmp compare(const fa_tensor *test, const fa_tensor *ref, double atol, double atol_rel, double rtol,
                        double lp_term, double extra, const unsigned char *owned, int64_t row_elems,
                        int64_t *n_judged)
{
    grad_cmp c = {0.0, 0.0, 0.0, 0, -1};
    const int64_t n = fa_tensor_numel(ref);
    const double *r = ref->data;
    *n_judged = 0;
    for (int64_t x = 0; x < n; x++)
        if ((!owned || owned[x / row_elems]) && fabs(r[x]) > c.max_ref) c.max_ref = fabs(r[x]);
    const double rel = rtol * c.max_ref;
    c.bound = atol + atol_rel * c.max_ref + (isfinite(lp_term) ? lp_term : rel) + extra;
    for (int64_t x = 0; x < n; x++) {
        if (owned && !owned[x / row_elems]) continue;
        ++*n_judged;
        const double t = cli_element(test->data, test->dtype, x);
        const double err = isfinite(t) ? fabs(t - r[x]) : INFINITY;
        if (err > c.bound) c.n_fail++;
        if (c.worst < 0 || err > c.max_err) {
            c.max_err = err;
            c.worst = x;
        }
    }
    return c;
}

/* max |base - ref| over the judged elements (owned as for compare); +inf if base holds NaN or Inf there. */
static double base_error(const float *base, const double *ref, int64_t n, const unsigned char *owned, int64_t row_elems)
{
    double e = 0.0;
    for (int64_t x = 0; x < n; x++) {
        if (owned && !owned[x / row_elems]) continue;
        const double d = isfinite(base[x]) ? fabs((double)base[x] - ref[x]) : INFINITY;
        if (!(d <= e)) e = d;
    }
    return e;
}

/* Rows of a varlen Q (kside 0) or K/V (kside 1) that some sequence owns; NULL if out of memory. */
static unsigned char *owned_rows(const fa_varlen *vl, int64_t rows, int kside)
{
    unsigned char *own = calloc((size_t)(rows > 0 ? rows : 1), 1);
    if (!own) return NULL;
    for (int64_t b = 0; b < vl->batch; b++) {
        const int32_t *cu = kside ? vl->cu_seqlens_k : vl->cu_seqlens_q;
        const int64_t r0 = cu[b];
        const int64_t len = kside && vl->seqused_k ? vl->seqused_k[b] : (int64_t)cu[b + 1] - cu[b];
        for (int64_t r = r0; r < r0 + len && r < rows; r++) own[r] = 1;
    }
    return own;
}

static int check_grad_main(int argc, char **argv)
{
    const char *q_path = NULL, *k_path = NULL, *v_path = NULL, *do_path = NULL;
    const char *paths[3] = {NULL, NULL, NULL};
    const char *dtype_text = NULL, *atol_text = NULL, *rtol_text = NULL, *threads_text = NULL, *ds_path = NULL;
    cli_attn attn;
    cli_attn_init(&attn);

    for (int i = 1; i < argc; i++) {
        int r;
        if (cli_is_help(argv[i])) {
            printf(check_grad_usage, cli_mask_help, cli_varlen_help);
            return CLI_EXIT_OK;
        }
        if ((r = cli_parse_mask_option(argc, argv, &i, &attn)) != 0 ||
            (r = cli_parse_varlen_option(argc, argv, &i, &attn)) != 0 ||
            (r = cli_opt_value(argc, argv, &i, "-q", &q_path)) != 0 ||
            (r = cli_opt_value(argc, argv, &i, "-k", &k_path)) != 0 ||
            (r = cli_opt_value(argc, argv, &i, "-v", &v_path)) != 0 ||
            (r = cli_opt_value(argc, argv, &i, "--dout", &do_path)) != 0 ||
            (r = cli_opt_value(argc, argv, &i, "--dq", &paths[0])) != 0 ||
            (r = cli_opt_value(argc, argv, &i, "--dk", &paths[1])) != 0 ||
            (r = cli_opt_value(argc, argv, &i, "--dv", &paths[2])) != 0 ||
            (r = cli_opt_value(argc, argv, &i, "--dsinks", &ds_path)) != 0 ||
            (r = cli_opt_value(argc, argv, &i, "--dtype", &dtype_text)) != 0 ||
            (r = cli_opt_value(argc, argv, &i, "--atol", &atol_text)) != 0 ||
            (r = cli_opt_value(argc, argv, &i, "--rtol", &rtol_text)) != 0 ||
            (r = cli_opt_value(argc, argv, &i, "--threads", &threads_text)) != 0) {
            if (r < 0) return CLI_EXIT_USAGE;
            continue;
        }
        return cli_unknown_option("check-grad", argv[i]);
    }
    if (!q_path || !k_path || !v_path || !do_path || !paths[0] || !paths[1] || !paths[2])
        return cli_die("check-grad: missing %s (see flashattn check-grad --help)",
                       !q_path ? "-q Q.npy" : !k_path ? "-k K.npy" : !v_path ? "-v V.npy"
                       : !do_path ? "--dout DO.npy" : !paths[0] ? "--dq DQ_TEST.npy"
                       : !paths[1] ? "--dk DK_TEST.npy" : "--dv DV_TEST.npy");
    fa_dtype dtype = FA_DTYPE_COUNT; /* auto */
    if (dtype_text) {
        if (cli_parse_dtype("--dtype", dtype_text, &dtype) != 0) return CLI_EXIT_USAGE;
        if (dtype == FA_F64) return cli_die("--dtype: the tested kernel's precision must be bf16, f16 or f32, got 'f64'");
    }
    double atol = 1e-6, rtol = -1.0;
    if (atol_text && (cli_parse_double("--atol", atol_text, &atol) != 0)) return CLI_EXIT_USAGE;
    if (rtol_text && (cli_parse_double("--rtol", rtol_text, &rtol) != 0)) return CLI_EXIT_USAGE;
    if (atol < 0) return cli_die("--atol: must be >= 0, got '%s'", atol_text);
    if (rtol_text && rtol < 0) return cli_die("--rtol: must be >= 0, got '%s'", rtol_text);
    if (threads_text) {
        long long t;
        if (cli_parse_int("--threads", threads_text, 1, 4096, &t) != 0) return CLI_EXIT_USAGE;
        attn.opt.num_threads = (int)t;
    }
    attn.opt.impl = FA_IMPL_REFERENCE;
    if (ds_path && !attn.sinks_path) return cli_die("--dsinks needs --sinks (the sinks it is the gradient of)");

    cli_qkv in;
    if (cli_load_inputs(&in, &attn, q_path, k_path, v_path)) return CLI_EXIT_USAGE;
    int rc = CLI_EXIT_USAGE;
    fa_npy do_arr, test[3], ds_arr;
    fa_tensor do_t, test_t[3], ref_t[3], ds_t, ds_ref_t;
    void *ref_mem[3] = {NULL, NULL, NULL};
    float *base_mem[3] = {NULL, NULL, NULL}; /* the float32 baseline (e32) */
    float *ds_base = NULL;                   /* its dsinks */
    unsigned char *own[3] = {NULL, NULL, NULL}; /* varlen: the rows some sequence owns (owned_rows) */
    double base_t0 = 0.0, base_secs = 0.0;
    fa_tensor base_t[3], o_t, lse_t;
    void *o_mem = NULL, *lse_mem = NULL; /* the baseline's O (tested dtype) and LSE, bf16/f16 only */
    double *ds_ref = NULL;
    memset(&do_arr, 0, sizeof do_arr);
    memset(&ds_arr, 0, sizeof ds_arr);
    memset(test, 0, sizeof test);
    char sh[96];
    const int64_t shapes[3][4] = {{in.batch, in.seqlen_q, in.heads, in.d},
                                  {in.batch, in.seqlen_k, in.heads_k, in.d},
                                  {in.batch, in.seqlen_k, in.heads_k, in.dv}};
    static const char *const names[3] = {"dQ", "dK", "dV"};
    static const char *const dims4[3] = {"[batch, seqlen_q, heads, d]", "[batch, seqlen_k, heads_k, d]",
                                         "[batch, seqlen_k, heads_k, d_v]"};
    static const char *const dims3[3] = {"[total_q, heads, d]", "[total_k, heads_k, d]", "[total_k, heads_k, d_v]"};
    const int skip = cli_skip(&in); /* varlen: rank 3, without the batch of 1 */
    const char *const *dims = skip ? dims3 : dims4;
    char ws[96];
    if (cli_attn_load_varlen(&attn, &in) || cli_attn_load_alibi(&attn, &in)) goto done;
    /* varlen: rows of dO no sequence owns may hold anything (cli_varlen_rows_finite below) */
    if (cli_load_array(do_path, 4 - skip, !skip, skip ? "dO [total_q, heads, d_v]" : "dO [batch, seqlen_q, heads, d_v]",
                       &do_arr, &do_t))
        goto done;
    const int64_t do_want[4] = {in.batch, in.seqlen_q, in.heads, in.dv};
    if (memcmp(do_arr.shape, do_want + skip, (size_t)(4 - skip) * sizeof(int64_t)) != 0) {
        cli_die("%s: shape %s should be %s = %s (from %s and %s)", do_path,
                cli_shape(4 - skip, do_arr.shape, sh, sizeof sh),
                skip ? "[total_q, heads, d_v]" : "[batch, seqlen_q, heads, d_v]",
                cli_shape(4 - skip, do_want + skip, ws, sizeof ws), q_path, v_path);
        goto done;
    }
    if (skip && cli_varlen_rows_finite(do_path, &do_arr, attn.opt.varlen)) goto done;
    for (int x = 0; x < 3; x++) {
        /* NaN/Inf in a tested gradient are findings, not bad input */
        if (cli_load_array(paths[x], 4 - skip, 0, dims[x], &test[x], &test_t[x])) goto done;
        if (memcmp(test[x].shape, shapes[x] + skip, (size_t)(4 - skip) * sizeof(int64_t)) != 0) {
            cli_die("%s: shape %s should be %s = %s (from %s, %s and %s)", paths[x],
                    cli_shape(4 - skip, test[x].shape, sh, sizeof sh), dims[x],
                    cli_shape(4 - skip, shapes[x] + skip, ws, sizeof ws), q_path, k_path, v_path);
            goto done;
        }
        const size_t n = (size_t)(shapes[x][0] * shapes[x][1] * shapes[x][2] * shapes[x][3]);
        ref_mem[x] = calloc(n ? n : 1, sizeof(double));
        if (!ref_mem[x]) {
            cli_die("check-grad: out of memory allocating the reference (%zu elements)", n);
            goto done;
        }
        fa_tensor_make(&ref_t[x], ref_mem[x], FA_F64, 4 - skip, shapes[x] + skip, NULL);
    }
    fa_backward_extra extra;
    fa_backward_extra_init(&extra, sizeof extra);
    if (ds_path) { /* the tested dsinks [heads] */
        if (cli_load_array(ds_path, 1, 0, "dsinks [heads]", &ds_arr, &ds_t)) goto done;
        if (ds_arr.shape[0] != in.heads) {
            cli_die("%s: shape %s should be [heads] = [%lld] (from %s)", ds_path,
                    cli_shape(1, ds_arr.shape, sh, sizeof sh), (long long)in.heads, q_path);
            goto done;
        }
        ds_ref = calloc((size_t)in.heads, sizeof(double));
        if (!ds_ref) {
            cli_die("check-grad: out of memory");
            goto done;
        }
        const int64_t hs[1] = {in.heads};
        fa_tensor_make(&ds_ref_t, ds_ref, FA_F64, 1, hs, NULL);
        extra.dsinks = &ds_ref_t;
    }
    if (dtype == FA_DTYPE_COUNT) {
        dtype = FA_F32;
        for (int x = 0; x < 3; x++)
            if (precision_rank(test[x].dtype) < precision_rank(dtype)) dtype = test[x].dtype;
    }
    if (rtol < 0) rtol = dtype == FA_BF16 ? 5e-2 : dtype == FA_F16 ? 1e-2 : 1e-4;
    /* the default rule's atol, relative to max|G_ref| as the forward check's: half the unit roundoff
     * of bf16 and f16, 2^-18 for f32 (a fixed 1e-6 passed all-zero gradients once dO was ~1e-7) */
    const double atol_rel = dtype == FA_BF16 ? 0x1p-9 : dtype == FA_F16 ? 0x1p-12 : 0x1p-18;

    if (cli_inputs_in_use_finite(&in, &attn)) goto done; /* varlen: the rows sequences read */
    double t0 = cli_now();
    fa_status st = fa_backward_ex(&in.q_t, &in.k_t, &in.v_t, NULL, NULL, &do_t, &ref_t[0], &ref_t[1], &ref_t[2],
                                  &attn.opt, &extra);
    double secs = cli_now() - t0;
    if (st != FA_OK) {
        cli_die_status(st);
        goto done;
    }

    /* varlen: rank 3 [rows][heads][width]; judge (and measure e32 on) the rows sequences own */
    const fa_varlen *vl = attn.opt.varlen;
    int64_t row_elems[3];
    for (int x = 0; x < 3; x++) {
        row_elems[x] = vl ? ref_t[x].shape[1] * ref_t[x].shape[2] : 1;
        if (vl && !(own[x] = owned_rows(vl, ref_t[x].shape[0], x > 0))) {
            cli_die("check-grad: out of memory");
            goto done;
        }
    }

    /* e32 (default rule only): the float32 flash backward's own error on these inputs */
    const int use_e32 = !atol_text && !rtol_text;
    double e32[4] = {0.0, 0.0, 0.0, 0.0};
    /* the low-precision emulation's error (bf16/f16, default rule) and the term 2 e_lp that replaces rtol's */
    double lp_err[4] = {0.0, 0.0, 0.0, 0.0}, lp_term[4] = {INFINITY, INFINITY, INFINITY, INFINITY}, lp_secs = 0.0;
    const char *lp_note = NULL;
    const char *e32_note = NULL; /* why e32 is 0 when the rule wants it */
    if (use_e32) {
        for (int x = 0; x < 3; x++) {
            const size_t n = (size_t)fa_tensor_numel(&ref_t[x]);
            base_mem[x] = malloc((n ? n : 1) * sizeof(float));
            if (!base_mem[x]) {
                cli_die("check-grad: out of memory allocating the float32 baseline (%zu elements)", n);
                goto done;
            }
            fa_tensor_make(&base_t[x], base_mem[x], FA_F32, ref_t[x].rank, ref_t[x].shape, NULL);
        }
        fa_backward_extra bextra = extra;
        fa_tensor ds_base_t;
        bextra.dsinks = NULL;
        if (ds_path) {
            const int64_t hs[1] = {in.heads};
            ds_base = malloc((size_t)in.heads * sizeof(float));
            if (!ds_base) {
                cli_die("check-grad: out of memory");
                goto done;
            }
            fa_tensor_make(&ds_base_t, ds_base, FA_F32, 1, hs, NULL);
            bextra.dsinks = &ds_base_t;
        }
        base_t0 = cli_now();
        /* The error moves with the order of the float32 sums: O's over the key blocks (and with
         * it D = dO . O), the dot products' over d. On one input with V rows alike, dK was off by
         * 1.4e-5 .. 4.5e-5 over key blocks 16, 32 and 64 where numpy's float32 backward made
         * 3.0e-5. So e32 is the largest over four orders: the SIMD kernels with the library's key
         * block, 16 and 32, and the scalar kernels (plain sequential sums). Over 800 such cases
         * (`python3 tools/check_grad_e32.py 100`: 4 shapes, V rows alike to 1e-4, dQ and dK)
         * numpy's float32 error reached at most 1.96 e32 and the AVX2 kernels' 1.36 e32 (Zen 4;
         * with the three SIMD runs alone, 3.05 and 2.47): the rule allows 3 e32. */
        if (dtype == FA_BF16 || dtype == FA_F16) { /* O in the tested dtype, LSE float32 (see below) */
            const int64_t osh[4] = {in.batch, in.seqlen_q, in.heads, in.dv};
            const int64_t lsh[3] = {in.batch, in.heads, in.seqlen_q};
            const size_t on = (size_t)(in.batch * in.seqlen_q * in.heads * in.dv);
            const size_t ln = (size_t)(in.batch * in.heads * in.seqlen_q);
            o_mem = malloc((on ? on : 1) * 2);
            lse_mem = malloc((ln ? ln : 1) * sizeof(float));
            if (!o_mem || !lse_mem) {
                cli_die("check-grad: out of memory allocating the baseline's O and LSE");
                goto done;
            }
            fa_tensor_make(&o_t, o_mem, dtype, 4 - skip, osh + skip, NULL);
            fa_tensor_make(&lse_t, lse_mem, FA_F32, 3 - skip, skip ? lsh + 1 : lsh, NULL);
        }
        static const int blocks_k[4] = {0, 16, 32, 0}; /* 0: the library's own choice */
        fa_context *scalar_ctx = NULL;
        for (int run = 0; run < 4 && !e32_note; run++) {
            fa_options bopt = attn.opt;
            bopt.impl = FA_IMPL_FLASH;
            bopt.block_k = blocks_k[run];
            if (run == 3) {
                if (fa_context_create(&scalar_ctx, "scalar", attn.opt.num_threads) != FA_OK) {
                    e32_note = fa_last_error();
                    break;
                }
                bopt.context = scalar_ctx;
            }
            /* a float32 kernel's O is float32; a bf16/f16 kernel stores O in its dtype and computes
             * D = dO . O from that (FlashAttention does): the forward here writes O in the tested
             * dtype, so the baseline carries that rounding too, which dominates D's error when dQ
             * and dK cancel (measured on an H100: PyTorch's bf16 flash and cuDNN backwards 1.7e-2
             * off in dQ where float32 arithmetic alone made 4e-4) */
            const fa_tensor *o_arg = NULL, *lse_arg = NULL;
            if (o_mem) {
                if (fa_forward(&in.q_t, &in.k_t, &in.v_t, &o_t, &lse_t, &bopt) != FA_OK) {
                    e32_note = fa_last_error();
                    break;
                }
                o_arg = &o_t;
                lse_arg = &lse_t;
            }
            if (fa_backward_ex(&in.q_t, &in.k_t, &in.v_t, o_arg, lse_arg, &do_t, &base_t[0], &base_t[1],
                               &base_t[2], &bopt, &bextra) != FA_OK) {
                e32_note = fa_last_error();
                break;
            }
            for (int x = 0; x < 3; x++) {
                const double e = base_error(base_mem[x], ref_mem[x], fa_tensor_numel(&ref_t[x]), own[x], row_elems[x]);
                if (!(e <= e32[x])) e32[x] = e;
            }
            if (bextra.dsinks) {
                const double e = base_error(ds_base, ds_ref, in.heads, NULL, 1);
                if (!(e <= e32[3])) e32[3] = e;
            }
            for (int x = 0; x < 4; x++)
                if (!isfinite(e32[x])) e32_note = "the float32 baseline overflowed or was not measured";
        }
        fa_context_destroy(scalar_ctx);
        base_secs = cli_now() - base_t0;
        if (e32_note)
            for (int x = 0; x < 4; x++) e32[x] = 0.0; /* no allowance rather than an unbounded one */
        /* bf16 / f16: FlashAttention's own test rule — twice the error of the same backward run
         * plainly in that precision (autograd's rounding points, fa_backward_extra.emulate_dtype)
         * — in place of the fixed rtol, which alone passed a dQ 4% off and dV rows never written */
        if (dtype == FA_BF16 || dtype == FA_F16) {
            fa_backward_extra eextra;
            fa_backward_extra_init(&eextra, sizeof eextra);
            eextra.emulate_dtype = dtype;
            eextra.dsinks = ds_path ? &ds_base_t : NULL; /* the sinks' gradient too: dsinks by the same rule */
            const double e0 = cli_now();
            if (fa_backward_ex(&in.q_t, &in.k_t, &in.v_t, NULL, NULL, &do_t, &base_t[0], &base_t[1], &base_t[2],
                               &attn.opt, &eextra) != FA_OK) {
                lp_note = fa_last_error();
            } else {
                for (int x = 0; x < 3; x++) {
                    lp_err[x] = base_error(base_mem[x], ref_mem[x], fa_tensor_numel(&ref_t[x]), own[x], row_elems[x]);
                    if (!isfinite(lp_err[x])) lp_note = "the emulated backward overflowed";
                }
                if (ds_path && !isfinite(lp_err[3] = base_error(ds_base, ds_ref, in.heads, NULL, 1)))
                    lp_note = "the emulated backward overflowed";
            }
            lp_secs = cli_now() - e0;
            if (!lp_note)
                for (int x = 0; x < 4; x++) lp_term[x] = 2.0 * lp_err[x];
        }
    }

    char rtol_text_buf[48];
    snprintf(rtol_text_buf, sizeof rtol_text_buf, "rtol * max|G_ref|, rtol %.3g", rtol);
    printf("flashattn check-grad: %s, %s, %s against the float64 reference backward (%.2f s)\n", paths[0],
           paths[1], paths[2], secs);
    if (use_e32) {
        printf("rule: max|G_test - G_ref| <= a * max|G_ref| + T + 3 * e32, a %.3g, T = %s (%s); "
               "e32 = this library's float32 flash backward's max error on these inputs, the largest over "
               "four summation orders (SIMD kernels, key blocks of its choice, 16 and 32; scalar kernels)%s\n",
               atol_rel, lp_note || dtype == FA_F32 ? rtol_text_buf : "2 * e_lp", fa_dtype_name(dtype),
               dtype == FA_F32 ? "" : ", given O stored in the tested dtype as its forward would");
        printf("e32 measured in %.2f s; it is this library's own backward's error, so check-grad does not judge "
               "that backward itself (tests/test_backward.c compares it with the reference)\n", base_secs);
        if (e32_note) printf("e32: not used (%s): the rule is a * max|G_ref| + T alone\n", e32_note);
        if (dtype == FA_BF16 || dtype == FA_F16) {
            if (lp_note)
                printf("%s emulation: not used (%s): the rtol term stands\n", fa_dtype_name(dtype), lp_note);
            else
                printf("%s emulation (%.2f s): T = 2 * e_lp, e_lp the error of the same backward run "
                       "plainly in %s (PyTorch autograd's rounding points, as FlashAttention's tests): dq %.3e, "
                       "dk %.3e, dv %.3e%s", fa_dtype_name(dtype), lp_secs, fa_dtype_name(dtype), lp_err[0],
                       lp_err[1], lp_err[2], ds_path ? "" : "\n");
            if (!lp_note && ds_path) printf(", dsinks %.3e\n", lp_err[3]);
        }
    } else {
        printf("rule: max|G_test - G_ref| <= atol + rtol * max|G_ref|, atol %.3g, rtol %.3g (given)\n", atol, rtol);
    }
    int all_pass = 1;
    for (int x = 0; x < 3; x++) {
        int64_t judged = 0;
        grad_cmp c = compare(&test_t[x], &ref_t[x], use_e32 ? 0.0 : atol, use_e32 ? atol_rel : 0.0, rtol, lp_term[x],
                             3.0 * e32[x], own[x], row_elems[x], &judged);
        const int pass = c.n_fail == 0 && c.max_err <= c.bound;
        all_pass &= pass;
        printf("%s %-4s max abs err %.3e  bound %.3e  max|ref| %.3e", names[x], pass ? "ok" : "FAIL", c.max_err,
               c.bound, c.max_ref);
        if (use_e32) printf("  e32 %.3e", e32[x]);
        printf("  failing %lld of %lld", (long long)c.n_fail, (long long)judged);
        if (vl && judged < fa_tensor_numel(&ref_t[x]))
            printf(" (%lld in rows no sequence owns not judged)", (long long)(fa_tensor_numel(&ref_t[x]) - judged));
        if (!pass && c.worst >= 0) {
            int64_t idx[4], rem = c.worst;
            for (int r = 3; r >= 0; r--) {
                idx[r] = rem % shapes[x][r];
                rem /= shapes[x][r];
            }
            if (skip) /* varlen: the caller's rank 3 [row, head, col] */
                printf("; worst at (%lld, %lld, %lld)", (long long)idx[1], (long long)idx[2], (long long)idx[3]);
            else
                printf("; worst at (%lld, %lld, %lld, %lld)", (long long)idx[0], (long long)idx[1],
                       (long long)idx[2], (long long)idx[3]);
            printf(": test %.6g, ref %.6g", cli_element(test_t[x].data, test_t[x].dtype, c.worst), ((const double *)ref_mem[x])[c.worst]);
        }
        printf("\n");
    }
    if (ds_path) {
        int64_t judged = 0;
        grad_cmp c = compare(&ds_t, &ds_ref_t, use_e32 ? 0.0 : atol, use_e32 ? atol_rel : 0.0, rtol, lp_term[3],
                             3.0 * e32[3], NULL, 1, &judged);
        const int pass = c.n_fail == 0 && c.max_err <= c.bound;
        all_pass &= pass;
        printf("dsinks %-4s max abs err %.3e  bound %.3e  max|ref| %.3e", pass ? "ok" : "FAIL", c.max_err, c.bound,
               c.max_ref);
        if (use_e32) printf("  e32 %.3e", e32[3]);
        printf("  failing %lld of %lld", (long long)c.n_fail, (long long)judged);
        if (!pass && c.worst >= 0)
            printf("; worst at (%lld): test %.6g, ref %.6g", (long long)c.worst,
                   cli_element(ds_t.data, ds_t.dtype, c.worst), ds_ref[c.worst]);
        printf("\n");
    }
    printf("%s\n", all_pass ? "PASS" : "FAIL");
    rc = all_pass ? CLI_EXIT_OK : CLI_EXIT_MISMATCH;
done:
    for (int x = 0; x < 3; x++) free(own[x]);
    free(o_mem);
    free(lse_mem);
    free(ds_base);
    for (int x = 0; x < 3; x++) {
        free(ref_mem[x]);
        free(base_mem[x]);
        fa_npy_free(&test[x]);
    }
    fa_npy_free(&do_arr);
    fa_npy_free(&ds_arr);
    free(ds_ref);
    cli_attn_free(&attn);
    cli_qkv_free(&in);
    return rc;
}

int cmd_check_grad(int argc, char **argv)
{
    cli_guard_runtime_exit();
    return cli_finish(check_grad_main(argc, argv));
}
