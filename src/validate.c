/*
 * validate.c — fa_check(): is a tested attention output right, and if not,
 * where and how wrong?
 *
 * The one validator of the project: the CLI (`flashattn check`), the Python
 * wrapper, the tests and the CUDA harness all call this, so there is one
 * tolerance model. The design, in order:
 *
 *   1. Validate the arguments (shapes through the same rules as fa_forward,
 *      then the tested output and LSE, then finiteness of the inputs).
 *   2. Choose the rows: all of them, or K per (batch, head) drawn without
 *      replacement by a seeded generator (Floyd's algorithm), sorted.
 *   3. Pass 1, in parallel over rows: for each checked query row compute,
 *      straight from the semantics (no slicing of Q: the bottom-right mask
 *      alignment needs the full seqlen_q), two results at once —
 *        ref: float64 everywhere, inputs as given (the trusted result);
 *        emu: the way a plain low-precision attention computes it — inputs
 *             rounded to the dtype, scores accumulated in float32, softmax in
 *             float32, P rounded to the dtype before P·V (accumulated in
 *             float32), the output rounded to the dtype (FlashAttention's
 *             own tests call this out_pt, the reference out_ref).
 *      and record, per element, |O_test - O_ref| and |O_ref|.
 *   4. Pass 2, serial over the recorded errors: the bound (2 * e_emu + atol,
 *      or atol + rtol |ref|), the elements and rows out of tolerance, the
 *      per-head summary, the LSE verdict.
 *
 * The cost is O(rows_checked * seqlen_k * (d + d_v)) time and
 * O(rows_checked * d_v) memory for the recorded errors, plus O(seqlen_k) per
 * thread. Rejected alternative: recomputing the reference in pass 2 instead
 * of recording errors (halves memory, doubles the dominant cost).
 *
 * Like the rest of the library, nothing here prints or exits: findings go in
 * the report, and fa_check_report_format() renders the text that the CLI
 * prints and Python returns.
 */
#include "internal.h"
#include "lowprec.h"
#include "pack.h"
#include "serve.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#if defined(__SSE2__)
#include <xmmintrin.h>
#endif

#ifdef _OPENMP
#include <omp.h>
#endif

/* ------------------------------------------------------------------------ */
/* Precision helpers                                                         */
/* ------------------------------------------------------------------------ */

/* Significand bits (including the implicit one): orders dtypes by precision. */
static int dtype_bits(fa_dtype dt)
{
    switch (dt) {
    case FA_BF16: return 8;
    case FA_F16: return 11;
    case FA_F32: return 24;
    case FA_F64: return 53;
    default: return 0;
    }
}

/* Unit roundoff u = 2^-bits of the rule's dtype (f64 is checked as f32). */
static double unit_roundoff(fa_dtype dt)
{
    return ldexp(1.0, -dtype_bits(dt == FA_F64 ? FA_F32 : dt));
}

/*
 * The emulation rule's atol is atol_unit(dtype) * max|O_ref|: half the unit
 * roundoff for bf16 (2^-9) and f16 (2^-12) — a guard against a degenerate,
 * near-zero emulation error, well under one output rounding; for f32 it is
 * floored at 2^-18. A plain float32 attention rounds neither P nor O to a
 * coarser type, so its max error is pure accumulation noise — a noisy
 * statistic — and SIMD kernels with polynomial exp are measurably (about
 * 1.5x on average) less accurate than expf: the floor keeps correct float32
 * kernels from failing by chance, and still rejects anything off by more
 * than ~4e-6 relative.
 */
static double atol_unit(fa_dtype dt)
{
    double a = 0.5 * unit_roundoff(dt);
    return a > 0x1p-18 ? a : 0x1p-18;
}

/*
 * Does converting a `src` element to float32 and rounding to `dt` change it?
 * No when every value of src is exactly representable in dt (bf16 -> f32,
 * f16 -> f32, bf16 -> bf16, ...); then the emulation can skip the rounding.
 */
static int needs_rounding(fa_dtype src, fa_dtype dt)
{
    if (src == dt) return src == FA_F64;
    if (dt == FA_F32) return src == FA_F64;
    return 1; /* f16 <-> bf16 and f32/f64 -> 16-bit all lose something */
}

/*
 * The row rule (bf16 / f16 emulation rules). The element rule's bound is one number for the
 * whole problem, set by the rows with the largest errors: in a causal, windowed or varlen
 * problem the short rows (|O| ~ |v|) set it, and a long row (|O| ~ |v| / sqrt(keys)) can then
 * lose keys, or see a few keys it must not, and stay under it (a window of 2000 keys instead of
 * a causal mask at 2048 passed with errors 44x a correct kernel's on the rows it changed). So
 * each checked row is also held to its own emulation: its L2 error at most FA_CHECK_ROW_K x
 * the emulation's L2 error on that row (or the floor below) + a |ref row|_2 (a: the rule's atol
 * unit), or the L2 norm of the row's elements' allowances where that is larger. Over d_v elements an L2
 * norm is a steady statistic where a row's max is not; a low-precision output's error is
 * mostly its own final rounding, which a correct kernel shares with the emulation. Not for
 * float32 outputs: their error is accumulation noise, in which one correct kernel's row can
 * be several times another's, and the element rule's bound is already ~4e-6 relative there.
 * Margin measured on correct kernels: docs/validation.md, "The row rule".
 */
#ifndef FA_CHECK_ROW_K /* a build may set it to measure the margin */
#define FA_CHECK_ROW_K 2.0
#endif
/*
 * The row rule's floor: a kernel rounds its own P (FlashAttention rounds exp(s - running max),
 * the emulation the normalized P), so its P-rounding error is another draw than the
 * emulation's, of expected squared L2 norm up to u^2/3 sum_j P_j^2 |v_j|^2 (u the dtype's unit
 * roundoff). Where one column of V dominates (an outlier channel, common in LLMs) the row's
 * error is that one column's, a one-degree-of-freedom statistic, and the emulation's draw can
 * be small by chance: correct kernels then reached 9.5x the bound without a floor. The bound
 * takes at least FA_CHECK_ROW_P u sqrt(sum_j P_j^2 |v_j|^2), 5.2 standard deviations of that
 * noise at 3 (a 1-dof tail of 2e-7).
 */
#ifndef FA_CHECK_ROW_P
#define FA_CHECK_ROW_P 3.0
#endif

/* The row rule's factor for rows of dv elements: FA_CHECK_ROW_K from 64 elements on, and
 * sqrt(64 / dv) times that for shorter rows, as an L2 norm over fewer elements spreads more
 * (under a flat factor correct kernels' worst rows reached at most 0.61 of the bound at d_v
 * 32-256, 0.73 at 16 and 1.21 at 8: docs/validation.md). */
static double fa_check_row_k(int64_t dv)
{
    return dv >= 64 ? FA_CHECK_ROW_K : FA_CHECK_ROW_K * sqrt(64.0 / (double)(dv > 0 ? dv : 1));
}

/*
 * The score-rounding allowance (emulation rules). At logits of 10^2 .. 10^4 a float32
 * kernel's output error is its scores' own rounding, and how that lands on the worst element
 * differs from the emulation's by a random factor that the rule's 2x does not cover (the
 * ratio of two such errors is heavy-tailed). A score error ds_j moves O_c, to first order, by
 * sum_j P_j (ds_j - sum_k P_k ds_k) v_jc = sum_j P_j ds_j (v_jc - O_c). With independent
 * errors of the size sigma_j that the emulation itself measures — |its float32 score - the
 * float64 one| + u (|s_j| + |s_j - m|) for the exp's argument, u = 2^-24 — that sum has the
 * standard deviation
 *     rss_c = sqrt(sum_j (P_j sigma_j)^2 (v_jc - O_c)^2),
 * and each element passes iff |test - ref| <= max(bound, FA_CHECK_SCORE_K * rss_c).
 * Measured, not a worst case over summation orders: inputs whose dot products cancel huge
 * terms (q = k = (A, A) against (A, -A)) give sequential float32 sums that are exact, and
 * the allowance stays ~1e-6 there (a magnitude bound u * sum_c |q_c k_jc| let an all-zero
 * output pass at A = 1e4). Measured with `sh tools/check_score_allow.sh BUILD 3` (180
 * correct float32 outputs at logits 30 .. 10^4: numpy's and this library's on three ISAs, 3
 * shapes): the previous rule (tree-summed emulation, no allowance) failed 74 of them, the
 * sequential emulation alone 13, with the allowance at K = 2 3, at K = 4 and 6 none; at
 * ordinary logits (N(0,1), d = 128) K = 6 gives at most ~1.05x the bound. None under dropout
 * (not modeled) or an explicit atol/rtol.
 */
#ifndef FA_CHECK_SCORE_K /* a build may set it to measure the margin (tools/check_score_allow.sh) */
#define FA_CHECK_SCORE_K 6.0
#endif

/* The emulation's copy of a row: float32, rounded to dt when that changes it. */
static void emu_row(const double *src, int64_t n, fa_dtype dt, int round, float *dst)
{
    if (round)
        for (int64_t c = 0; c < n; c++) dst[c] = fa_round_to(dt, (float)src[c]);
    else
        for (int64_t c = 0; c < n; c++) dst[c] = (float)src[c];
}

/* ------------------------------------------------------------------------ */
/* Options and argument checking                                             */
/* ------------------------------------------------------------------------ */

void fa_check_options_init(fa_check_options *opt, size_t struct_size)
{
    if (!opt) return;
    memset(opt, 0, struct_size);
    fa_check_options o;
    memset(&o, 0, sizeof o);
    o.struct_size = struct_size;
    o.dtype = FA_CHECK_DTYPE_AUTO;
    memcpy(opt, &o, struct_size < sizeof o ? struct_size : sizeof o);
}

fa_check_options fa_check_options_default(void)
{
    fa_check_options o;
    fa_check_options_init(&o, sizeof o);
    return o;
}

/* The first published sizes with struct_size (0.3.0); later versions append. */
#define CHECK_OPTIONS_MIN_SIZE (offsetof(fa_check_options, lse_name) + sizeof(const char *))
#define CHECK_REPORT_MIN_SIZE (offsetof(fa_check_report, lse_worst_ref) + sizeof(double))

size_t fa_check_abi_size(int which)
{
    switch (which) {
    case FA_ABI_TENSOR: return sizeof(fa_tensor);
    case FA_ABI_OPTIONS: return sizeof(fa_options);
    case FA_ABI_CHECK_OPTIONS: return sizeof(fa_check_options);
    case FA_ABI_CHECK_REPORT: return sizeof(fa_check_report);
    case FA_ABI_DIAGNOSE_OPTIONS: return sizeof(fa_diagnose_options);
    case FA_ABI_DIAGNOSE_REPORT: return sizeof(fa_diagnose_report);
    case FA_ABI_VARLEN: return sizeof(fa_varlen);
    case FA_ABI_KVCACHE: return sizeof(fa_kvcache);
    case FA_ABI_BACKWARD_EXTRA: return sizeof(fa_backward_extra);
    case FA_ABI_DROPOUT: return sizeof(fa_dropout);
    case FA_ABI_ROTARY: return sizeof(fa_rotary);
    default: return 0;
    }
}

#define DIM(x) ((long long)(x))

static const char *name_or(const char *name, const char *fallback)
{
    return name && *name ? name : fallback;
}

/* Labels of the five tensors, for messages. */
typedef struct check_names {
    const char *q, *k, *v, *out, *lse;
} check_names;

/* Index of the first non-finite element of a rank-4 tensor, or -1. */
static int64_t find_nonfinite4(const fa_tensor *t, int64_t idx[4])
{
    for (int64_t a = 0; a < t->shape[0]; a++)
        for (int64_t b = 0; b < t->shape[1]; b++)
            for (int64_t c = 0; c < t->shape[2]; c++)
                for (int64_t e = 0; e < t->shape[3]; e++) {
                    double x = fa_load_f64(t, fa_off4(t, a, b, c, e));
                    if (!isfinite(x)) {
                        idx[0] = a; idx[1] = b; idx[2] = c; idx[3] = e;
                        return 1;
                    }
                }
    return -1;
}

static fa_status require_finite(const fa_tensor *t, const char *name)
{
    int64_t idx[4];
    if (find_nonfinite4(t, idx) < 0) return FA_OK;
    double x = fa_load_f64(t, fa_off4(t, idx[0], idx[1], idx[2], idx[3]));
    return fa_fail(FA_ERR_NONFINITE, "%s: element [%lld,%lld,%lld,%lld] is %s; inputs must be finite",
                   name, DIM(idx[0]), DIM(idx[1]), DIM(idx[2]), DIM(idx[3]),
                   isnan(x) ? "NaN" : "Inf");
}

/*
 * The default rule's emulation rounds Q, K and V to the tested precision `dt`;
 * a value that rounds to infinity there (|x| > 65504 for f16, about 3.39e38
 * for bf16, beyond FLT_MAX for f32 from f64) would make the emulated error NaN
 * and its bound infinite, so that any output "passes". Refuse it by name.
 */
static fa_status require_emulable(const fa_tensor *t, const char *name, fa_dtype dt)
{
    for (int64_t a = 0; a < t->shape[0]; a++)
        for (int64_t b = 0; b < t->shape[1]; b++)
            for (int64_t c = 0; c < t->shape[2]; c++)
                for (int64_t e = 0; e < t->shape[3]; e++) {
                    const double x = fa_load_f64(t, fa_off4(t, a, b, c, e));
                    if (isfinite(fa_round_to(dt, (float)x))) continue;
                    return fa_fail(FA_ERR_NONFINITE,
                                   "%s: element [%lld,%lld,%lld,%lld] = %g overflows %s (largest finite %s): "
                                   "the %s emulation of the default rule would be inf/NaN; check with an "
                                   "explicit atol/rtol or a wider dtype",
                                   name, DIM(a), DIM(b), DIM(c), DIM(e), x, fa_dtype_name(dt),
                                   dt == FA_F16 ? "65504" : dt == FA_BF16 ? "3.39e38" : "3.40e38",
                                   fa_dtype_name(dt));
                }
    return FA_OK;
}

/*
 * A KV cache holds rows no sequence uses (often never written): only the keys
 * and values the sequences attend to (cache rows and new keys, through the row
 * accessor) must be finite, and, under the default rule, emulable in `dt`
 * (dt == FA_DTYPE_COUNT: finiteness only).
 */
static fa_status require_kv_rows(const fa_problem *p, const char *kname, const char *vname, fa_dtype dt)
{
    for (int64_t b = 0; b < p->batch; b++) {
        const fa_seq s = fa_problem_seq(p, b);
        for (int64_t hk = 0; hk < p->heads_k; hk++)
            for (int vside = 0; vside < 2; vside++) {
                const fa_rows r = fa_rows_kv(p, &s, hk, vside);
                for (int64_t j = 0; j < s.k_len; j++)
                    for (int64_t c = 0; c < r.width; c++) {
                        const double x = fa_rows_get(&r, j, c);
                        const int bad = dt == FA_DTYPE_COUNT ? !isfinite(x) : !isfinite(fa_round_to(dt, (float)x));
                        if (!bad) continue;
                        if (r.tail && j >= r.tail_from) { /* a new key, not appended yet: k_new/v_new's */
                            const char *nn = vside ? p->v_new_name : p->k_new_name;
                            if (dt == FA_DTYPE_COUNT)
                                return fa_fail(FA_ERR_NONFINITE, "%s: batch %lld, new key %lld, head %lld, element "
                                               "%lld is %s; inputs must be finite", nn ? nn : vside ? "v_new" : "k_new",
                                               DIM(r.tail_batch), DIM(j - r.tail_from), DIM(hk), DIM(c),
                                               isnan(x) ? "NaN" : "Inf");
                            return fa_fail(FA_ERR_NONFINITE, "%s: batch %lld, new key %lld, head %lld, element %lld "
                                           "= %g overflows %s: the %s emulation of the default rule would be "
                                           "inf/NaN; check with an explicit atol/rtol or a wider dtype",
                                           nn ? nn : vside ? "v_new" : "k_new", DIM(r.tail_batch),
                                           DIM(j - r.tail_from), DIM(hk), DIM(c), x, fa_dtype_name(dt),
                                           fa_dtype_name(dt));
                        }
                        /* where the key lies in the cache's file: [cache batch, row] or [page, slot] */
                        const int64_t row = s.k_start + j;
                        const int64_t f0 = s.k_pages ? (int64_t)s.k_pages[row / s.k_page_size] : s.k_batch;
                        const int64_t f1 = s.k_pages ? row % s.k_page_size : row;
                        if (dt == FA_DTYPE_COUNT)
                            return fa_fail(FA_ERR_NONFINITE, "%s: sequence %lld, key %lld, head %lld, element %lld "
                                           "(element [%lld,%lld,%lld,%lld] of the %s) is %s; inputs must be finite",
                                           vside ? vname : kname, DIM(b), DIM(j), DIM(hk), DIM(c), DIM(f0), DIM(f1),
                                           DIM(hk), DIM(c), s.k_pages ? "pages" : "cache", isnan(x) ? "NaN" : "Inf");
                        return fa_fail(FA_ERR_NONFINITE, "%s: sequence %lld, key %lld, head %lld, element %lld "
                                       "(element [%lld,%lld,%lld,%lld] of the %s) = %g overflows %s: the %s emulation "
                                       "of the default rule would be inf/NaN; check with an explicit atol/rtol or a "
                                       "wider dtype", vside ? vname : kname, DIM(b), DIM(j), DIM(hk), DIM(c), DIM(f0),
                                       DIM(f1), DIM(hk), DIM(c), s.k_pages ? "pages" : "cache", x, fa_dtype_name(dt),
                                       fa_dtype_name(dt));
                    }
            }
    }
    return FA_OK;
}

/*
 * A varlen batch's packed Q, K, V may hold rows no sequence reads (past
 * cu_seqlens_q[batch], keys past seqused_k): only the rows in use must be
 * finite and (dt != FA_DTYPE_COUNT) emulable in dt. Elements are named in the
 * caller's rank-3 layout [row, head, col].
 */
static fa_status require_varlen_rows(const fa_problem *p, const char *qname, const char *kname,
                                     const char *vname, fa_dtype dt)
{
    for (int side = 0; side < 3; side++) {
        const char *name = side == 0 ? qname : side == 1 ? kname : vname;
        for (int64_t b = 0; b < p->batch; b++) {
            const fa_seq s = fa_problem_seq(p, b);
            const int64_t nh = side == 0 ? p->heads : p->heads_k;
            const int64_t len = side == 0 ? s.q_len : s.k_len, start = side == 0 ? s.q_start : s.k_start;
            for (int64_t h = 0; h < nh; h++) {
                const fa_rows r = side == 0 ? fa_rows_q(&p->q, &s, h) : fa_rows_kv(p, &s, h, side == 2);
                for (int64_t i = 0; i < len; i++)
                    for (int64_t c = 0; c < r.width; c++) {
                        const double x = fa_rows_get(&r, i, c);
                        const int bad = dt == FA_DTYPE_COUNT ? !isfinite(x) : !isfinite(fa_round_to(dt, (float)x));
                        if (!bad) continue;
                        if (dt == FA_DTYPE_COUNT)
                            return fa_fail(FA_ERR_NONFINITE, "%s: element [%lld,%lld,%lld] (sequence %lld) is %s; "
                                           "inputs must be finite", name, DIM(start + i), DIM(h), DIM(c), DIM(b),
                                           isnan(x) ? "NaN" : "Inf");
                        return fa_fail(FA_ERR_NONFINITE, "%s: element [%lld,%lld,%lld] (sequence %lld) = %g overflows "
                                       "%s: the %s emulation of the default rule would be inf/NaN; check with an "
                                       "explicit atol/rtol or a wider dtype", name, DIM(start + i), DIM(h), DIM(c),
                                       DIM(b), x, fa_dtype_name(dt), fa_dtype_name(dt));
                    }
            }
        }
    }
    return FA_OK;
}

/* Every element the attention reads finite: the rows in use of a varlen batch or a KV cache
 * (p->q, k, v: the rank-4 views fa_resolve made of varlen's packed tensors), else all of q, k, v. */
static fa_status inputs_finite(const fa_problem *p, const check_names *nm)
{
    fa_status st;
    if (p->cu_seqlens_q) return require_varlen_rows(p, nm->q, nm->k, nm->v, FA_DTYPE_COUNT);
    if ((st = require_finite(&p->q, nm->q)) != FA_OK) return st;
    if (p->cache_seqlens) return require_kv_rows(p, nm->k, nm->v, FA_DTYPE_COUNT);
    if ((st = require_finite(&p->k, nm->k)) != FA_OK) return st;
    return require_finite(&p->v, nm->v);
}

/*
 * Validate everything and fill the problem: q, k, v, the tested output and
 * LSE and the attention options go through the one validator (problem.c), so
 * check and forward accept exactly the same problems and resolve the options
 * (window clamp included) the same way; then the check options and the
 * finiteness of the inputs.
 */
static fa_status check_setup(const fa_tensor *q, const fa_tensor *k, const fa_tensor *v,
                             const fa_tensor *out, const fa_tensor *lse, const fa_options *attn,
                             const fa_check_options *co, const check_names *nm, fa_problem *p)
{
    if (!out) {
        /* q, k, v first, so their messages come before the output's */
        const fa_names n0 = {nm->q, nm->k, nm->v, nm->out, nm->lse};
        fa_status st0 = fa_resolve(FA_PURPOSE_CHECK, q, k, v, NULL, NULL, attn, &n0, p);
        if (st0 != FA_OK) return st0;
        return fa_fail(FA_ERR_NULL_ARG, "%s: tested output is NULL", nm->out);
    }
    const fa_names names = {nm->q, nm->k, nm->v, nm->out, nm->lse};
    fa_status st = fa_resolve(FA_PURPOSE_CHECK, q, k, v, out, lse, attn, &names, p);
    if (st != FA_OK) return st;

    if (co->dtype != FA_CHECK_DTYPE_AUTO && dtype_bits(co->dtype) == 0)
        return fa_fail(FA_ERR_DTYPE, "check: dtype %d is not f32, f16, bf16 or f64", (int)co->dtype);
    if (co->use_tolerance) {
        if (!(co->atol >= 0.0) || !isfinite(co->atol))
            return fa_fail(FA_ERR_OPTION, "check: atol must be finite and >= 0 (got %g)", co->atol);
        if (!(co->rtol >= 0.0) || !isfinite(co->rtol))
            return fa_fail(FA_ERR_OPTION, "check: rtol must be finite and >= 0 (got %g)", co->rtol);
    }
    if (co->qkv_format < FA_QF_NONE || co->qkv_format >= FA_QF_E8M0)
        return fa_fail(FA_ERR_OPTION, "check: qkv_format %d is not e4m3, e5m2, e2m1 or int8", co->qkv_format);
    if (co->kernel_model < 0 || co->kernel_model >= FA_KERNEL_MODEL_COUNT)
        return fa_fail(FA_ERR_OPTION, "check: unknown kernel model %d", co->kernel_model);
    if (co->kernel_model && !co->qkv_format)
        return fa_fail(FA_ERR_OPTION, "check: a kernel model needs the low-precision format of q, k, v "
                       "(qkv_format)");
    if (co->kernel_model == FA_KERNEL_MODEL_FA3 && co->qkv_format == FA_QF_E2M1)
        return fa_fail(FA_ERR_OPTION, "check: the fa3 kernel model is FP8 (e4m3, e5m2; int8 Q/K), not e2m1 "
                       "(the sage model covers FP4)");
    if (co->kernel_model && (p->sinks.data || p->keep))
        return fa_fail(FA_ERR_OPTION, "check: the kernel models (fa3, sage) do not emulate %s; "
                       "check without a kernel model", p->sinks.data ? "attention sinks" : "dropout");
    if (co->sample_rows < 0)
        return fa_fail(FA_ERR_OPTION, "check: sample_rows must be >= 0 (got %lld)", DIM(co->sample_rows));
    if (co->num_threads < 0 || co->num_threads > FA_MAX_THREADS)
        return fa_fail(FA_ERR_OPTION, "check: num_threads must be in [0, %d] (got %d)", FA_MAX_THREADS,
                       co->num_threads);

    if ((st = inputs_finite(p, nm)) != FA_OK) return st;
    if (co->num_threads > 0) p->num_threads = co->num_threads;
    return FA_OK;
}

fa_status fa_check_inputs(const fa_tensor *q, const fa_tensor *k, const fa_tensor *v, const fa_options *attn,
                          const char *q_name, const char *k_name, const char *v_name)
{
    fa_clear_error();
    const check_names nm = {q_name ? q_name : "q", k_name ? k_name : "k", v_name ? v_name : "v", "o", "lse"};
    const fa_names names = {nm.q, nm.k, nm.v, NULL, NULL};
    fa_problem p;
    fa_status st = fa_resolve(FA_PURPOSE_WORKSPACE, q, k, v, NULL, NULL, attn, &names, &p);
    if (st != FA_OK) return st;
    return inputs_finite(&p, &nm);
}

/* ------------------------------------------------------------------------ */
/* Row sampling                                                              */
/* ------------------------------------------------------------------------ */

static uint64_t splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/*
 * K distinct rows of [0, n), sorted, for (batch b, head h): Floyd's algorithm
 * (each K-subset equally likely, O(K^2) membership tests, no O(n) memory).
 * The stream depends only on (seed, b, h), so a sample is reproducible and
 * independent of the thread count.
 */
static void sample_rows(uint64_t seed, int64_t b, int64_t h, int64_t n, int64_t K, int64_t *rows)
{
    uint64_t st = seed ^ (0x5851f42d4c957f2dull * (uint64_t)(b + 1)) ^
                  (0x2545f4914f6cdd1dull * (uint64_t)(h + 1));
    splitmix64(&st);
    int64_t m = 0;
    for (int64_t j = n - K; j < n; j++) {
        int64_t t = (int64_t)(splitmix64(&st) % (uint64_t)(j + 1));
        int dup = 0;
        for (int64_t x = 0; x < m; x++)
            if (rows[x] == t) { dup = 1; break; }
        rows[m++] = dup ? j : t;
    }
    qsort(rows, (size_t)K, sizeof *rows, cmp_i64);
}

/* ------------------------------------------------------------------------ */
/* Pass 1: one query row, reference and emulation side by side               */
/* ------------------------------------------------------------------------ */

/* Per-thread scratch. */
typedef struct row_scratch {
    double *sd;  /* [Sk] reference scores */
    double *sa;  /* [Sk] sigma_j, the size of score j's rounding (FA_CHECK_SCORE_K) */
    double *ov2; /* [3][dv] sum_j (P_j sigma_j)^2 v_jc^2, then sum_j (P_j sigma_j)^2 v_jc, then sum_j P_j^2 v_jc^2
                  * (P unnormalized; the last for the P-rounding allowance, FA_CHECK_ROW_P) */
    float *sf;   /* [Sk] emulated scores */
    double *qd;  /* [d]  query row, as given */
    float *qf;   /* [d]  query row, rounded */
    double *xd;  /* [max(d, dv)] one key or value row, as given (f64 inputs only) */
    float *xe;   /* [max(d, dv)] the same row as float32 (exact unless the input is f64) */
    float *xf;   /* [max(d, dv)] the emulation's copy: rounded to the dtype */
    float *kb;   /* [EMU_KEYS][d] the emulation's K rows of one batch of scores (emu_scores) */
    double *od;  /* [dv] reference output accumulator */
    float *of;   /* [dv] emulated output accumulator */
    const float *f16; /* [65536] float16 -> float32 table (shared, read-only), or NULL */
    fa_lp_model_scratch lp; /* kernel model (low-precision rule with a model) */
    double *om;  /* [dv] kernel model's output row */
} row_scratch;

/*
 * The emulation's float32 scores of n <= EMU_KEYS keys: out[k] = the dot product of q and
 * row k of kb, each one sequential chain over c = 0, 1, ..., d-1 (multiply, round, add,
 * round): the k-loop order of a GEMM micro-kernel, without its FMA — a deliberately
 * unfavourable order. The keys' chains run side by side only so that they overlap in time;
 * each key's steps are the same as alone.
 */
#define EMU_KEYS 8

static void emu_scores(const float *q, const float *kb, int64_t d, int n, float *out)
{
    float acc[EMU_KEYS] = {0};
    int64_t c = 0;
#if defined(__SSE2__)
    /* four keys a vector: 4x4 blocks of kb transposed in registers; _mm_mul_ps and
     * _mm_add_ps round separately, the same steps as the scalar loop below */
    __m128 a0 = _mm_setzero_ps(), a1 = _mm_setzero_ps();
    for (; c + 4 <= d; c += 4) {
        __m128 r0 = _mm_loadu_ps(kb + 0 * d + c), r1 = _mm_loadu_ps(kb + 1 * d + c);
        __m128 r2 = _mm_loadu_ps(kb + 2 * d + c), r3 = _mm_loadu_ps(kb + 3 * d + c);
        __m128 r4 = _mm_loadu_ps(kb + 4 * d + c), r5 = _mm_loadu_ps(kb + 5 * d + c);
        __m128 r6 = _mm_loadu_ps(kb + 6 * d + c), r7 = _mm_loadu_ps(kb + 7 * d + c);
        _MM_TRANSPOSE4_PS(r0, r1, r2, r3); /* r_t = element c+t of keys 0..3 */
        _MM_TRANSPOSE4_PS(r4, r5, r6, r7);
        const __m128 x[4][2] = {{r0, r4}, {r1, r5}, {r2, r6}, {r3, r7}};
        for (int t = 0; t < 4; t++) {
            const __m128 qc = _mm_set1_ps(q[c + t]);
            a0 = _mm_add_ps(a0, _mm_mul_ps(qc, x[t][0]));
            a1 = _mm_add_ps(a1, _mm_mul_ps(qc, x[t][1]));
        }
    }
    _mm_storeu_ps(acc, a0);
    _mm_storeu_ps(acc + 4, a1);
#endif
    for (; c < d; c++) /* kb[k][c]: element c of key k (rows past n hold zeros) */
        for (int k = 0; k < EMU_KEYS; k++) {
            const float prod = q[c] * kb[k * d + c]; /* its own statement: never fused */
            acc[k] += prod;
        }
    for (int k = 0; k < n; k++) out[k] = acc[k];
}

/* What pass 1 keeps per checked row (besides the per-element arrays). */
typedef struct row_result {
    double lse_ref;     /* float64 LSE (-inf: no visible key) */
    double lse_emu;     /* float32-emulated LSE */
    double lse_emu2;    /* the same, its row sum in FlashAttention-2's order */
    double lse_test;    /* tested LSE (NAN if none given) */
    double lse_offset;  /* FlashAttention-2's causal-ALiBi offset slope*(i+Sk-Sq), else 0 */
    /* the row rule's sums over the row's d_v elements (verdict_out): squared tested error (+inf when
     * an element is not finite), squared emulation error, squared reference, squared allowance */
    double row_err2, row_emu2, row_ref2, row_allow2;
    double row_pv2;     /* sum_j P_j^2 |v_j|^2 (P normalized): the row rule's P-rounding floor */
} row_result;

/*
 * Load one key or value row for both computations. Inputs in f32/f16/bf16
 * convert to float32 exactly, so the reference reads them from s->xe (widened
 * to double in the dot product) and only f64 inputs need the double copy
 * s->xd. The emulation reads s->xf: the row rounded to the dtype, or s->xe
 * itself when rounding changes nothing. Returns 1 when s->xd holds the row.
 */
static int load_kv_row(const fa_rows *src, int64_t j, fa_dtype dt, int round, row_scratch *s,
                       const float **emu)
{
    int64_t off;
    const fa_tensor *t = fa_rows_src(src, j, &off);
    const int64_t inc = t->stride[3], n = src->width;
    if (t->dtype == FA_F64) {
        fa_rows_gather_f64(src, j, s->xd);
        emu_row(s->xd, n, dt, round, s->xf);
        *emu = s->xf;
        return 1;
    }
    const uint16_t *h = (const uint16_t *)t->data + off;
    if (t->dtype == FA_F16 && s->f16) { /* the table beats the branchy bit conversion */
        for (int64_t c = 0; c < n; c++) s->xe[c] = s->f16[h[c * inc]];
    } else if (t->dtype == FA_BF16) {
        uint32_t *dst = (uint32_t *)s->xe; /* bfloat16 is the top half of a float32 */
        for (int64_t c = 0; c < n; c++) dst[c] = (uint32_t)h[c * inc] << 16;
    } else {
        fa_gather_f32(t, off, inc, n, s->xe);
    }
    if (round) {
        for (int64_t c = 0; c < n; c++) s->xf[c] = fa_round_to(dt, s->xe[c]);
        *emu = s->xf;
    } else {
        *emu = s->xe;
    }
    return 0;
}

/* Per-thread running statistics of pass 1. */
typedef struct pass1_stats {
    double sum_abs;        /* over finite tested elements */
    int64_t n_finite;
    int64_t n_nonfinite;
    double max_abs_ref;
    double emu_max, emu_sum;
    double worst_err;      /* -1: none yet */
    int64_t worst_item, worst_col;
    double worst_test, worst_ref, worst_emu;
    /* portable metrics, over finite tested elements */
    double m_tr, m_tt, m_rr, m_abs_ref, m_sq;
    /* low-precision rule: the kernel model, and per-row scale factors */
    double model_max;
    int64_t model_sat;
    double alpha_test, alpha_ref_model; /* the row factor farthest from 1 (test), and the model's */
    double row_res, row_err;     /* over finite rows: squared error left after a per-row factor, and before */
} pass1_stats;

typedef struct check_ctx {
    const fa_problem *p;
    fa_dtype dt;                 /* the rule's precision; f64 treated as f32 */
    int round_q, round_k, round_v;
    const int64_t *first;        /* [B*H + 1]: items of (sequence, head) bh are first[bh] .. first[bh+1]-1 */
    const int64_t *rows;         /* [items] query rows, or NULL for all */
    double *err;                 /* [items][dv] |O_test - O_ref| (inf: non-finite) */
    float *absref;               /* [items][dv] |O_ref| */
    float *allow;                /* [items][dv] the score-rounding allowance (FA_CHECK_SCORE_K), 0 when off */
    row_result *rr;              /* [items] */
    int pfmt;                    /* low-precision rule: format of P (fa_qformat), 0 when off */
    int model;                   /* fa_kernel_model, 0 when off */
} check_ctx;

/* The (sequence, head) index bh of item w: the last bh with first[bh] <= w. */
static int64_t item_bh(const check_ctx *cx, int64_t w)
{
    int64_t lo = 0, hi = cx->p->batch * cx->p->heads; /* first[lo] <= w < first[hi] */
    while (hi - lo > 1) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (cx->first[mid] <= w) lo = mid;
        else hi = mid;
    }
    return lo;
}

static inline int64_t item_row(const check_ctx *cx, int64_t w)
{
    return cx->rows ? cx->rows[w] : w - cx->first[item_bh(cx, w)];
}

/* Compute reference and emulation for checked row `w` and compare the tested one. */
static void check_row(const check_ctx *cx, int64_t w, row_scratch *s, pass1_stats *ps)
{
    const fa_problem *p = cx->p;
    const int64_t bh = item_bh(cx, w), b = bh / p->heads, h = bh % p->heads;
    const int64_t i = item_row(cx, w), hk = fa_kv_head(p, h);
    const int64_t d = p->d, dv = p->dv;
    const fa_seq seq = fa_problem_seq(p, b);
    const fa_rows qs = fa_rows_q(&p->q, &seq, h), os = fa_rows_q(&p->o, &seq, h);
    const fa_rows ks = fa_rows_kv(p, &seq, hk, 0), vs = fa_rows_kv(p, &seq, hk, 1);
    const fa_dtype dt = cx->dt;
    const double slope = fa_alibi_slope(p, b, h);
    const float scale_f = (float)p->scale, softcap_f = (float)p->softcap, slope_f = (float)slope;
    int64_t lo, hi;
    fa_key_range(p, b, i, &lo, &hi);

    fa_rows_gather_f64(&qs, i, s->qd);
    emu_row(s->qd, d, dt, cx->round_q, s->qf);
    for (int64_t c = 0; c < d; c++) s->qf[c] *= scale_f; /* scale folded into q, in float32 */

    /* Scores: reference in float64; the emulation in float32 (emu_scores), each score one
     * sequential chain over d (c = 0, 1, ...: multiply, round, add, round) — the k-loop order
     * of a GEMM micro-kernel (BLAS sgemm under PyTorch's reference attention, which
     * FlashAttention's own rule compares against; this library's qk), without its FMA. A
     * tree of partial sums (what a vectorized reduction does) is more accurate than that by a
     * factor growing with d; at logits of 10^2 .. 10^4, where the scores' rounding is the
     * output's error, it held correct float32 kernels to 2x an error they cannot reach
     * (docs/validation.md). */
    double md = -INFINITY;
    float mf = -INFINITY;
    for (int64_t j = lo; j < hi; j++) {
        const float *xf;
        /* the emulation's copy of the row lands in its slot of the batch (emu_scores) */
        const int kk = (int)((j - lo) % EMU_KEYS);
        float *const xe_buf = s->xe, *const xf_buf = s->xf, *const slot = s->kb + (size_t)kk * (size_t)d;
        if (cx->round_k) s->xf = slot;
        else s->xe = slot;
        const int wide = load_kv_row(&ks, j, dt, cx->round_k, s, &xf);
        s->xe = xe_buf;
        s->xf = xf_buf;
        if (xf != slot) memcpy(slot, xf, (size_t)d * sizeof(float)); /* f64 inputs: their own copy */
        double dd = 0.0;
        const double *qd = s->qd, *xd = s->xd;
        const float *xe = cx->round_k || wide ? s->xe : slot; /* the row as float32 (f32/f16/bf16 inputs) */
        if (wide) {
#ifdef _OPENMP
#pragma omp simd reduction(+ : dd)
#endif
            for (int64_t c = 0; c < d; c++) dd += qd[c] * xd[c];
        } else {
#ifdef _OPENMP
#pragma omp simd reduction(+ : dd)
#endif
            for (int64_t c = 0; c < d; c++) dd += qd[c] * (double)xe[c];
        }
        const double sdj = fa_score_transform(p, dd, slope, b, i, j);
        s->sd[j] = sdj;
        if (sdj > md) md = sdj;
        /* the emulated scores, a batch of EMU_KEYS keys at a time */
        if (kk + 1 < EMU_KEYS && j + 1 < hi) {
            continue;
        } else if (kk + 1 < EMU_KEYS) { /* the last, partial batch: zero rows, never stored */
            memset(s->kb + (size_t)(kk + 1) * (size_t)d, 0, (size_t)(EMU_KEYS - kk - 1) * (size_t)d * sizeof(float));
        }
        const int64_t j0 = j - kk;
        emu_scores(s->qf, s->kb, d, kk + 1, s->sf + j0);
        for (int64_t jj = j0; jj <= j; jj++) {
            float sfj = s->sf[jj];
            if (softcap_f > 0.0f) sfj = softcap_f * tanhf(sfj / softcap_f);
            if (slope != 0.0) {
                int64_t rel = i + fa_diag_offset(p, b) - jj;
                sfj -= slope_f * (float)(rel < 0 ? -rel : rel);
            }
            s->sf[jj] = sfj;
            if (sfj > mf) mf = sfj;
        }
    }

    if (cx->model)
        fa_lp_model_row(cx->model, cx->pfmt, &vs, dv, s->sf, lo, hi, &s->lp, s->om, &ps->model_sat);

    /* Attention sink: one more logit in both denominators (no value row); an
     * empty row then has O = 0 and LSE = sink. (A NaN max stays NaN.) */
    const int sinked = p->sinks.data != NULL;
    const double sink = fa_sink(p, h);
    const float sink_f = (float)sink;
    if (sinked) {
        if (sink > md) md = sink;
        if (sink_f > mf) mf = sink_f;
    }

    /* Softmax and P·V. Reference normalizes at the end; the emulation, like a
     * plain implementation, materializes P = softmax(S) in the dtype first
     * (in the low-precision format under the low-precision rule). */
    double ld = 0.0, wsum = 0.0; /* wsum: sum_j (P_j sigma_j)^2, P unnormalized (FA_CHECK_SCORE_K) */
    float lf = 0.0f;
    for (int64_t j = lo; j < hi; j++) {
        /* sigma_j: the emulation's own score error, measured, plus the exp argument's rounding */
        s->sa[j] = fabs((double)s->sf[j] - s->sd[j]) + 0x1p-24 * (fabs(s->sd[j]) + fabs(s->sd[j] - md));
        s->sd[j] = exp(s->sd[j] - md);
        s->sf[j] = expf(s->sf[j] - mf);
        ld += s->sd[j];
        lf += s->sf[j];
        const double psg = s->sd[j] * s->sa[j];
        wsum += psg * psg;
    }
    /* The row sum again in FlashAttention-2's order: key blocks of 128 from the last to the
     * first, each thread of a quad keeping its own running sum of its columns (2 of every 8),
     * the quad's four added at the end. A row whose dominant key comes last loses its small
     * terms there (each below half an ulp of the running sum) where the sum above, first to
     * last, keeps them: real kernels' LSEs differ by that much (~N u / 2 at worst), so the
     * LSE rule takes the larger of the two orders' errors. */
    float lq[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (hi > lo)
        for (int64_t blk = (hi - 1) / 128; blk >= lo / 128; blk--) { /* each term straight into the running sum */
            const int64_t j0 = blk * 128 > lo ? blk * 128 : lo, j1 = blk * 128 + 128 < hi ? blk * 128 + 128 : hi;
            for (int64_t j = j0; j < j1; j++) lq[(j % 8) / 2] += s->sf[j];
        }
    float lf2 = (lq[0] + lq[1]) + (lq[2] + lq[3]);
    if (sinked) { /* a key with v = 0 */
        const double psg = exp(sink - md) * 0x1p-24 * (fabs(sink) + fabs(sink - md));
        ld += exp(sink - md);
        lf += expf(sink_f - mf);
        lf2 += expf(sink_f - mf);
        wsum += psg * psg;
    }
    if (cx->pfmt && hi > lo) fa_lp_round_p(cx->pfmt, s->sf + lo, hi - lo, lf);
    for (int64_t c = 0; c < dv; c++) {
        s->od[c] = 0.0;
        s->ov2[c] = 0.0;
        s->ov2[dv + c] = 0.0;
        s->ov2[2 * dv + c] = 0.0;
        s->of[c] = 0.0f;
    }
    const uint8_t *keep = p->keep ? fa_keep_row(p, b, h, i) : NULL;
    for (int64_t j = lo; j < hi; j++) {
        const float *xf;
        double pd = s->sd[j];
        float pf = cx->pfmt ? s->sf[j] : fa_round_to(dt, s->sf[j] / lf);
        if (keep) { /* dropout: P o Z / (1 - p) (the sums above are undropped) */
            if (!keep[j * p->keep_stride[3]]) continue;
            pd *= p->keep_scale;
            pf *= (float)p->keep_scale;
        }
        const int wide = load_kv_row(&vs, j, dt, cx->round_v, s, &xf);
        double *od = s->od, *ov2 = s->ov2, *ov1 = s->ov2 + dv, *opp = s->ov2 + 2 * dv;
        const double pd2 = pd * pd;
        const double w2 = (pd * s->sa[j]) * (pd * s->sa[j]); /* (P_j sigma_j)^2, dropout never reaches it */
        float *of = s->of;
        const double *xd = s->xd;
        const float *xe = s->xe;
        if (wide) {
#ifdef _OPENMP
#pragma omp simd
#endif
            for (int64_t c = 0; c < dv; c++) {
                od[c] += pd * xd[c];
                ov2[c] += w2 * xd[c] * xd[c];
                ov1[c] += w2 * xd[c];
                opp[c] += pd2 * xd[c] * xd[c];
                of[c] += pf * xf[c];
            }
        } else {
#ifdef _OPENMP
#pragma omp simd
#endif
            for (int64_t c = 0; c < dv; c++) {
                od[c] += pd * (double)xe[c];
                ov2[c] += w2 * (double)xe[c] * (double)xe[c];
                ov1[c] += w2 * (double)xe[c];
                opp[c] += pd2 * (double)xe[c] * (double)xe[c];
                of[c] += pf * xf[c];
            }
        }
    }
    const int empty = hi <= lo;

    row_result *rr = &cx->rr[w];
    rr->lse_ref = empty && !sinked ? -INFINITY : md + log(ld);
    rr->lse_emu = empty && !sinked ? -INFINITY : (double)(mf + logf(lf));
    rr->lse_emu2 = empty && !sinked ? -INFINITY : (double)(mf + logf(lf2));
    rr->lse_offset = slope * (double)(i + fa_diag_offset(p, b));
    rr->lse_test = NAN;
    if (p->lse.data)
        rr->lse_test = fa_load_f64(&p->lse, fa_lse_off(p, b, h, i));

    /* Compare. */
    double *err = cx->err + w * dv;
    float *absref = cx->absref + w * dv;
    float *allow = cx->allow + w * dv;
    const int allow_on = !empty && !keep && ld > 0.0; /* none under dropout, which it does not model */
    /* bf16 / f16 rules: P's rounding as an allowance too (FA_CHECK_ROW_P) */
    const int p_allow = !cx->pfmt && (dt == FA_BF16 || dt == FA_F16);
    const double u = unit_roundoff(dt);
    double pv2 = 0.0;
    double row_tr = 0.0, row_rr = 0.0, row_mr = 0.0, row_tt = 0.0, row_ee = 0.0, row_emu2 = 0.0, row_allow2 = 0.0;
    int row_finite = 1;
    for (int64_t c = 0; c < dv; c++) {
        const double ref = empty ? 0.0 : s->od[c] / ld;
        const double emu = empty ? 0.0 : (double)fa_round_to(dt, s->of[c]);
        const double test = fa_rows_get(&os, i, c);
        /* the same with the row sum in FlashAttention-2's order (lf2, above): O = acc / l moves
         * with l, by up to ~N u / 2 where the dominant key comes last; the larger error counts
         * (bf16 / f16 outputs: a float32 O with that error would let half the keys go missing
         * on such a row — a review's case — and no FA2 kernel writes one) */
        const double emu2 = empty || cx->pfmt || !(lf2 > 0.0f) || (dt != FA_BF16 && dt != FA_F16)
                                ? emu /* FA2 writes O in bf16 / f16 only: a float32 O keeps the strict order */
                                : (double)fa_round_to(dt, s->of[c] * (lf / lf2));
        const double e_emu = fabs(emu - ref) > fabs(emu2 - ref) ? fabs(emu - ref) : fabs(emu2 - ref);
        const double mod = cx->model ? s->om[c] : emu; /* what the row factor of a sound kernel looks like */
        if (cx->model && fabs(mod - ref) > ps->model_max) ps->model_max = fabs(mod - ref);
        row_rr += ref * ref;
        row_mr += mod * ref;
        if (isfinite(test)) {
            row_tr += test * ref;
            row_tt += test * test;
            row_ee += (test - ref) * (test - ref);
            ps->m_tr += test * ref;
            ps->m_tt += test * test;
            ps->m_rr += ref * ref;
            ps->m_abs_ref += fabs(ref);
            ps->m_sq += (test - ref) * (test - ref);
        } else {
            row_finite = 0;
        }
        if (e_emu > ps->emu_max) ps->emu_max = e_emu;
        ps->emu_sum += e_emu;
        row_emu2 += e_emu * e_emu;
        if (fabs(ref) > ps->max_abs_ref) ps->max_abs_ref = fabs(ref);
        double e;
        if (isfinite(test)) {
            e = fabs(test - ref);
            ps->sum_abs += e;
            ps->n_finite++;
        } else {
            e = INFINITY;
            ps->n_nonfinite++;
        }
        err[c] = e;
        absref[c] = (float)fabs(ref);
        /* sum_j (P_j sigma_j)^2 (v_jc - O_c)^2, expanded; P normalized by 1/ld^2 */
        const double ss = allow_on ? (s->ov2[c] - 2.0 * ref * s->ov2[dv + c] + ref * ref * wsum) / (ld * ld) : 0.0;
        double al = FA_CHECK_SCORE_K * sqrt(ss > 0.0 ? ss : 0.0);
        if (p_allow && !empty && ld > 0.0) { /* P's rounding, drawn apart from the emulation's, then O's */
            const double pa = FA_CHECK_ROW_P * u * sqrt(s->ov2[2 * dv + c]) / ld + u * fabs(ref);
            if (pa > al) al = pa;
        }
        allow[c] = (float)al;
        pv2 += s->ov2[2 * dv + c];
        row_allow2 += (double)allow[c] * (double)allow[c];
        /* Items are visited in increasing order per thread; ties keep the first. */
        if (e > ps->worst_err) {
            ps->worst_err = e;
            ps->worst_item = w;
            ps->worst_col = c;
            ps->worst_test = test;
            ps->worst_ref = ref;
            ps->worst_emu = emu;
        }
    }
    rr->row_err2 = row_finite ? row_ee : INFINITY;
    rr->row_emu2 = row_emu2;
    rr->row_ref2 = row_rr;
    rr->row_allow2 = row_allow2;
    rr->row_pv2 = ld > 0.0 ? pv2 / (ld * ld) : 0.0; /* sum over the row's columns */
    if (row_finite) {
        const double res = row_rr > 0.0 ? row_tt - row_tr * row_tr / row_rr : row_tt;
        ps->row_res += res > 0.0 ? res : 0.0;
        ps->row_err += row_ee;
    }
    if (row_rr > 0.0) {
        const double at = row_tr / row_rr, am = row_mr / row_rr;
        if (row_finite && fabs(at - 1.0) > fabs(ps->alpha_test - 1.0)) ps->alpha_test = at;
        if (fabs(am - 1.0) > fabs(ps->alpha_ref_model - 1.0)) ps->alpha_ref_model = am;
    }
}

/* Fold thread statistics `t` into `a`; ties on the worst element go to the earlier one. */
static void merge_stats(pass1_stats *a, const pass1_stats *t)
{
    a->sum_abs += t->sum_abs;
    a->n_finite += t->n_finite;
    a->n_nonfinite += t->n_nonfinite;
    if (t->max_abs_ref > a->max_abs_ref) a->max_abs_ref = t->max_abs_ref;
    if (t->emu_max > a->emu_max) a->emu_max = t->emu_max;
    a->emu_sum += t->emu_sum;
    a->m_tr += t->m_tr;
    a->m_tt += t->m_tt;
    a->m_rr += t->m_rr;
    a->m_abs_ref += t->m_abs_ref;
    a->m_sq += t->m_sq;
    if (t->model_max > a->model_max) a->model_max = t->model_max;
    a->model_sat += t->model_sat;
    a->row_res += t->row_res;
    a->row_err += t->row_err;
    if (fabs(t->alpha_test - 1.0) > fabs(a->alpha_test - 1.0)) a->alpha_test = t->alpha_test;
    if (fabs(t->alpha_ref_model - 1.0) > fabs(a->alpha_ref_model - 1.0)) a->alpha_ref_model = t->alpha_ref_model;
    if (t->worst_err > a->worst_err ||
        (t->worst_err == a->worst_err && t->worst_err >= 0 &&
         (t->worst_item < a->worst_item ||
          (t->worst_item == a->worst_item && t->worst_col < a->worst_col)))) {
        a->worst_err = t->worst_err;
        a->worst_item = t->worst_item;
        a->worst_col = t->worst_col;
        a->worst_test = t->worst_test;
        a->worst_ref = t->worst_ref;
        a->worst_emu = t->worst_emu;
    }
}

static void init_stats(pass1_stats *s)
{
    memset(s, 0, sizeof *s);
    s->worst_err = -1.0;
    s->worst_item = INT64_MAX;
    s->worst_col = INT64_MAX;
    s->alpha_test = 1.0;
    s->alpha_ref_model = 1.0;
}

static void scratch_free(row_scratch *s)
{
    fa_free(s->sd); fa_free(s->sa); fa_free(s->ov2); fa_free(s->sf); fa_free(s->qd); fa_free(s->qf);
    fa_free(s->xd); fa_free(s->xe); fa_free(s->xf); fa_free(s->kb); fa_free(s->od); fa_free(s->of);
    fa_free(s->om); fa_lp_model_scratch_free(&s->lp);
    memset(s, 0, sizeof *s); /* s->f16 is owned by fa_check */
}

static int scratch_alloc(row_scratch *s, const fa_problem *p, int model)
{
    memset(s, 0, sizeof *s);
    if (model && (!fa_lp_model_scratch_alloc(&s->lp, p) ||
                  !(s->om = fa_malloc((size_t)p->dv * sizeof(double))))) {
        scratch_free(s);
        return 0;
    }
    const size_t sk = (size_t)p->seqlen_k + 1, d = (size_t)p->d, dv = (size_t)p->dv;
    const size_t x = d > dv ? d : dv;
    s->sd = fa_malloc(sk * sizeof(double));
    s->sa = fa_malloc(sk * sizeof(double));
    s->ov2 = fa_malloc(3 * dv * sizeof(double));
    s->sf = fa_malloc(sk * sizeof(float));
    s->qd = fa_malloc(d * sizeof(double));
    s->qf = fa_malloc(d * sizeof(float));
    s->xd = fa_malloc(x * sizeof(double));
    s->xe = fa_malloc(x * sizeof(float));
    s->xf = fa_malloc(x * sizeof(float));
    s->kb = fa_malloc(EMU_KEYS * d * sizeof(float));
    s->od = fa_malloc(dv * sizeof(double));
    s->of = fa_malloc(dv * sizeof(float));
    if (s->sd && s->sa && s->ov2 && s->sf && s->qd && s->qf && s->xd && s->xe && s->xf && s->kb && s->od && s->of) return 1;
    scratch_free(s);
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Pass 2: the verdict                                                       */
/* ------------------------------------------------------------------------ */

/* Insert a failing row into the report's list, kept sorted by (batch, row, head). */
static void note_fail_row(fa_check_report *r, const fa_check_row *row)
{
    int n = r->n_fail_rows, pos = n;
    while (pos > 0) {
        const fa_check_row *x = &r->fail_rows[pos - 1];
        int later = x->batch > row->batch ||
                    (x->batch == row->batch && (x->row > row->row ||
                                                (x->row == row->row && x->head > row->head)));
        if (!later) break;
        pos--;
    }
    if (pos >= FA_CHECK_MAX_FAIL_ROWS) return;
    if (n == FA_CHECK_MAX_FAIL_ROWS) n--; /* drop the last */
    memmove(&r->fail_rows[pos + 1], &r->fail_rows[pos], (size_t)(n - pos) * sizeof *row);
    r->fail_rows[pos] = *row;
    r->n_fail_rows = n + 1;
}

static void verdict_out(const check_ctx *cx, const fa_check_options *co, fa_check_report *r,
                        int64_t items)
{
    const fa_problem *p = cx->p;
    const int64_t dv = p->dv;
    const double floor = 1e-3 * r->max_abs_ref;
    const double row_k = fa_check_row_k(dv), u = unit_roundoff(r->dtype);
    double sum_rel = 0.0;
    int64_t n_rel = 0;
    for (int64_t w = 0; w < items; w++) {
        const int64_t bh = item_bh(cx, w), b = bh / p->heads, h = bh % p->heads;
        const double *err = cx->err + w * dv;
        const float *absref = cx->absref + w * dv;
        const float *allow = cx->allow + w * dv;
        fa_check_row row = {b, item_row(cx, w), h, 0, -1, -1.0};
        for (int64_t c = 0; c < dv; c++) {
            const double e = err[c], ar = absref[c];
            double denom = ar > floor ? ar : floor;
            double rel = denom > 0.0 ? e / denom : (e == 0.0 ? 0.0 : INFINITY);
            if (isfinite(e)) {
                sum_rel += rel;
                n_rel++;
            }
            if (rel > r->max_rel_err) r->max_rel_err = rel;
            const double tol = co->use_tolerance ? co->atol + co->rtol * ar
                                                 : (r->bound > (double)allow[c] ? r->bound : (double)allow[c]);
            if (!co->use_tolerance && allow[c] > r->score_allow_max) r->score_allow_max = allow[c];
            if (!(e <= tol)) {
                row.n_fail++;
                r->head_fail[h]++;
            }
            if (e > r->head_max_abs_err[h]) r->head_max_abs_err[h] = e;
            if (e > row.max_abs_err) {
                row.max_abs_err = e;
                row.worst_col = c;
            }
        }
        if (row.n_fail > 0) {
            r->n_fail += row.n_fail;
            r->rows_failed++;
            note_fail_row(r, &row);
        }
        if (r->row_rule) { /* the row rule (FA_CHECK_ROW_K); a non-finite row has failed above */
            const row_result *rr = &cx->rr[w];
            if (!isfinite(rr->row_err2)) continue;
            const double e_row = sqrt(rr->row_err2);
            const double e_emu = sqrt(rr->row_emu2), floor_p = FA_CHECK_ROW_P * u * sqrt(rr->row_pv2);
            double b_row = (row_k * e_emu > floor_p ? row_k * e_emu : floor_p) + atol_unit(r->dtype) * sqrt(rr->row_ref2);
            if (sqrt(rr->row_allow2) > b_row) b_row = sqrt(rr->row_allow2);
            const double ratio = b_row > 0.0 ? e_row / b_row : (e_row > 0.0 ? INFINITY : 0.0);
            if (ratio > 1.0) r->row_n_fail++;
            if (ratio > r->row_ratio) {
                r->row_ratio = ratio;
                r->row_worst_batch = b;
                r->row_worst_row = row.row;
                r->row_worst_head = h;
            }
        }
    }
    r->mean_rel_err = n_rel ? sum_rel / (double)n_rel : 0.0;
    r->fail_fraction = r->elements_checked ? (double)r->n_fail / (double)r->elements_checked : 0.0;
    r->out_pass = r->n_fail == 0 && r->n_nonfinite == 0 && r->row_n_fail == 0;
}

/*
 * The LSE verdict. Rows with no visible key must be +-inf. Other rows must be
 * finite and close to the reference — or, under causal ALiBi, to the
 * reference plus FlashAttention-2's offset, whichever convention fits better.
 */
static void verdict_lse(const check_ctx *cx, const fa_check_options *co, fa_check_report *r,
                        int64_t items)
{
    const fa_problem *p = cx->p;
    double max_ref = 0.0, max_stored = 0.0, emu_max = 0.0, err_doc = 0.0, err_fa2 = 0.0;
    int have_offset = 0;
    for (int64_t w = 0; w < items; w++) {
        const row_result *rr = &cx->rr[w];
        if (rr->lse_ref == -INFINITY) continue;
        if (fabs(rr->lse_ref) > max_ref) max_ref = fabs(rr->lse_ref);
        double ee = fabs(rr->lse_emu - rr->lse_ref), ee2 = fabs(rr->lse_emu2 - rr->lse_ref);
        if (ee2 > ee) ee = ee2;
        if (!(ee <= emu_max)) emu_max = ee;
        /* the size of the LSE as the kernel stores it: with FlashAttention-2's causal-ALiBi
         * convention that is lse_ref + offset (float32 rounds |LSE| ~ 2048 in steps of 2.4e-4) */
        if (fabs(rr->lse_ref + rr->lse_offset) > max_stored) max_stored = fabs(rr->lse_ref + rr->lse_offset);
        double t = rr->lse_test;
        double e1 = isfinite(t) ? fabs(t - rr->lse_ref) : INFINITY;
        double e2 = isfinite(t) ? fabs(t - (rr->lse_ref + rr->lse_offset)) : INFINITY;
        if (e1 > err_doc) err_doc = e1;
        if (e2 > err_fa2) err_fa2 = e2;
        if (rr->lse_offset != 0.0) have_offset = 1;
    }
    /* FA2's kernel takes the +slope*j form only on its causal path: right 0 and no left bound once
     * it has set a left window covering every key to -1 (mha_fwd); a sliding window (L, 0) runs its
     * local path, the docstring's -slope*|i + Sk - Sq - j|, whose LSE has no offset */
    /* (FA2 compares with seqlen_k: the longest sequence's keys in varlen, the cache's capacity
     * in mha_fwd_kvcache) */
    const int64_t fa2_sk = p->cache_seqlens ? (p->block_table ? p->max_pages * p->page_size : p->k.shape[1])
                                            : p->seqlen_k;
    const int fa2_causal = p->window_right == 0 && (p->window_left < 0 || p->window_left >= fa2_sk);
    const int fa2 = have_offset && fa2_causal && err_fa2 < err_doc;
    r->lse_fa2_alibi_offset = fa2;
    r->lse_emu_max_abs_err = emu_max;
    /* 2 x the emulation's own error, plus a floor for the summation orders and
     * approximate exp/log that kernels use in float32: 2^-24 (16 sqrt(seqlen_k) + 16
     * max(1, |LSE|)) — a row sum's rounding grows like sqrt(keys) (real GPU LSEs: 2.6e-5 off
     * at 16384 keys, 5.8 x this emulation's error; the floor there is 1.3e-4), the rest is the
     * rounding of m scale and of the final sum. The floor was 1e-4 max(1, |LSE|), which
     * passed an LSE missing one key of 4096 (6.5e-4 off; now 7e-5 allowed). */
    const double mag = fa2 ? (max_stored > max_ref ? max_stored : max_ref) : max_ref;
    double floor = 0x1p-24 * (16.0 * sqrt((double)(p->seqlen_k > 1 ? p->seqlen_k : 1)) + 16.0 * (mag > 1.0 ? mag : 1.0));
    /* FP8 / INT8 kernels accumulate Q K^T in the tensor cores' narrower accumulators (14-22
     * bits: DeepSeek-V3, SageAttention), which moves the scores and the LSE by more than
     * float32 would; their LSE keeps the old floor, 1e-4 max(1, |LSE|) (a model of a
     * truncating 14-bit accumulator: 1.5e-4 off at 4096 keys) */
    if (cx->pfmt && floor < 1e-4 * (mag > 1.0 ? mag : 1.0)) floor = 1e-4 * (mag > 1.0 ? mag : 1.0);
    const double bound = 2.0 * emu_max + floor;
    r->lse_bound = co->use_tolerance ? 0.0 : bound;
    r->lse_max_abs_err = 0.0;
    double worst = -1.0;
    for (int64_t w = 0; w < items; w++) {
        const row_result *rr = &cx->rr[w];
        const int64_t bh = item_bh(cx, w);
        const double t = rr->lse_test;
        double ref = rr->lse_ref, e;
        int bad;
        if (ref == -INFINITY) {
            r->lse_n_empty++;
            e = isinf(t) ? 0.0 : INFINITY; /* either infinity is accepted */
            bad = !isinf(t);
        } else {
            if (fa2) ref += rr->lse_offset;
            e = isfinite(t) ? fabs(t - ref) : INFINITY;
            double tol = co->use_tolerance ? co->atol + co->rtol * fabs(ref) : bound;
            if (co->use_tolerance && tol > r->lse_bound) r->lse_bound = tol;
            bad = !(e <= tol);
            if (e > r->lse_max_abs_err) r->lse_max_abs_err = e;
        }
        if (bad) r->lse_n_fail++;
        if (e > worst) {
            worst = e;
            r->lse_worst_batch = bh / p->heads;
            r->lse_worst_head = bh % p->heads;
            r->lse_worst_row = item_row(cx, w);
            r->lse_worst_test = t;
            r->lse_worst_ref = ref;
        }
    }
    r->lse_pass = r->lse_n_fail == 0;
}

/* ------------------------------------------------------------------------ */
/* fa_check                                                                  */
/* ------------------------------------------------------------------------ */

void fa_check_report_free(fa_check_report *report)
{
    if (!report || report->struct_size < CHECK_REPORT_MIN_SIZE) return;
    const size_t rsize = report->struct_size;
    fa_free(report->head_fail);
    fa_free(report->head_max_abs_err);
    memset(report, 0, rsize < sizeof *report ? rsize : sizeof *report);
    report->struct_size = rsize;
}

static fa_status check_resolved(const fa_tensor *q, const fa_tensor *k, const fa_tensor *v, const fa_tensor *out,
                                const fa_tensor *lse, const fa_check_options co, fa_check_report *report,
                                const check_names nm, fa_problem p);

static fa_status check_run(const fa_tensor *q, const fa_tensor *k, const fa_tensor *v,
                           const fa_tensor *out, const fa_tensor *lse, const fa_options *attn,
                           const fa_check_options co, fa_check_report *report)
{
    const check_names nm = {name_or(co.q_name, "q"), name_or(co.k_name, "k"), name_or(co.v_name, "v"),
                            name_or(co.out_name, "out"), name_or(co.lse_name, "lse")};
    fa_problem p;
    fa_status st = check_setup(q, k, v, out, lse, attn, &co, &nm, &p);
    if (st != FA_OK) return st;
    void *rot_mem = NULL; /* rotary: judge against the rotated q and k_new (serve.c) */
    if ((st = fa_rotary_apply(&p, &rot_mem)) != FA_OK) return st;
    st = check_resolved(q, k, v, out, lse, co, report, nm, p);
    fa_free(rot_mem);
    return st;
}

/* check_run, once the problem is resolved (and q, k_new rotated). */
static fa_status check_resolved(const fa_tensor *q, const fa_tensor *k, const fa_tensor *v, const fa_tensor *out,
                                const fa_tensor *lse, const fa_check_options co, fa_check_report *report,
                                const check_names nm, fa_problem p)
{
    fa_status st;
    fa_check_report *r = report;
    fa_dtype dt = co.dtype;
    if (dt == FA_CHECK_DTYPE_AUTO) {
        const fa_dtype all[4] = {q->dtype, k->dtype, v->dtype, out->dtype};
        dt = all[0];
        for (int x = 1; x < 4; x++)
            if (dtype_bits(all[x]) < dtype_bits(dt)) dt = all[x];
    }
    if (dt == FA_F64) dt = FA_F32;
    if (co.qkv_format) dt = FA_BF16; /* low-precision kernels write bf16 (FlashAttention-3's FP8 output) */
    if (!co.use_tolerance && p.cu_seqlens_q) {
        if ((st = require_varlen_rows(&p, nm.q, nm.k, nm.v, dt)) != FA_OK) return st;
    } else if (!co.use_tolerance) {
        if ((st = require_emulable(&p.q, nm.q, dt)) != FA_OK) return st;
        if (p.cache_seqlens) {
            if ((st = require_kv_rows(&p, nm.k, nm.v, dt)) != FA_OK) return st;
        } else {
            if ((st = require_emulable(&p.k, nm.k, dt)) != FA_OK) return st;
            if ((st = require_emulable(&p.v, nm.v, dt)) != FA_OK) return st;
        }
    }
    r->dtype = dt;
    r->use_tolerance = co.use_tolerance != 0;
    r->batch = p.batch;
    r->seqlen_q = p.seqlen_q;
    r->seqlen_k = p.seqlen_k;
    r->heads = p.heads;
    r->heads_k = p.heads_k;
    r->d = p.d;
    r->dv = p.dv;
    r->seed = co.seed;
    r->lse_checked = lse != NULL;
    r->worst_batch = r->worst_row = r->worst_head = r->worst_col = -1;
    r->lse_worst_batch = r->lse_worst_head = r->lse_worst_row = -1;
    r->row_worst_batch = r->row_worst_row = r->row_worst_head = -1;
    r->n_heads = p.heads;
    r->head_fail = fa_calloc((size_t)p.heads * sizeof(int64_t));
    r->head_max_abs_err = fa_calloc((size_t)p.heads * sizeof(double));
    if (!r->head_fail || !r->head_max_abs_err) {
        fa_check_report_free(r);
        return fa_fail(FA_ERR_NOMEM, "fa_check: out of memory");
    }

    check_ctx cx;
    memset(&cx, 0, sizeof cx);
    cx.p = &p;
    cx.dt = dt;
    /* the low-precision rule takes q, k, v as dequantized: not rounded again */
    cx.round_q = !co.qkv_format && needs_rounding(q->dtype, dt);
    cx.round_k = !co.qkv_format && needs_rounding(k->dtype, dt);
    cx.round_v = !co.qkv_format && needs_rounding(v->dtype, dt);
    cx.pfmt = co.qkv_format ? fa_lp_p_format(co.qkv_format) : 0;
    cx.model = co.qkv_format ? co.kernel_model : 0;
    r->qkv_format = co.qkv_format;
    r->p_format = cx.pfmt;
    r->kernel_model = cx.model;
    const int64_t BH = p.batch * p.heads;
    /* Items: the checked rows of each (sequence, head) in turn, all of them or
     * K sampled ones (a sequence with at most K rows is checked whole). */
    const int sampling = co.sample_rows > 0 && co.sample_rows < p.seqlen_q;
    r->sample_rows = sampling ? co.sample_rows : 0;
    int64_t *first = fa_malloc((size_t)(BH + 1) * sizeof(int64_t));
    if (!first) {
        fa_check_report_free(r);
        return fa_fail(FA_ERR_NOMEM, "fa_check: out of memory");
    }
    first[0] = 0;
    r->rows_total = 0;
    for (int64_t bh = 0; bh < BH; bh++) {
        const int64_t n = fa_problem_seq(&p, bh / p.heads).q_len;
        first[bh + 1] = first[bh] + (sampling && co.sample_rows < n ? co.sample_rows : n);
        r->rows_total += n;
    }
    cx.first = first;
    const int64_t items = first[BH];
    r->rows_checked = items;
    r->elements_checked = items * p.dv;

    int64_t *rows = NULL;
    if (sampling) {
        rows = fa_malloc((size_t)(items + 1) * sizeof(int64_t));
        if (!rows) {
            fa_free(first);
            fa_check_report_free(r);
            return fa_fail(FA_ERR_NOMEM, "fa_check: out of memory");
        }
        for (int64_t bh = 0; bh < BH; bh++) {
            const int64_t n = fa_problem_seq(&p, bh / p.heads).q_len, K = first[bh + 1] - first[bh];
            if (K < n)
                sample_rows(co.seed, bh / p.heads, bh % p.heads, n, K, rows + first[bh]);
            else
                for (int64_t x = 0; x < K; x++) rows[first[bh] + x] = x;
        }
        cx.rows = rows;
    }
    const size_t nel = (size_t)(items * p.dv) + 1;
    cx.err = fa_malloc(nel * sizeof(double));
    cx.absref = fa_malloc(nel * sizeof(float));
    cx.allow = fa_malloc(nel * sizeof(float));
    cx.rr = fa_malloc(((size_t)items + 1) * sizeof(row_result));
    if (!cx.err || !cx.absref || !cx.allow || !cx.rr) {
        fa_free(rows); fa_free(first); fa_free(cx.err); fa_free(cx.absref); fa_free(cx.allow); fa_free(cx.rr);
        fa_check_report_free(r);
        return fa_fail(FA_ERR_NOMEM, "fa_check: out of memory for %lld checked elements",
                       DIM(items * p.dv));
    }

    /* float16 inputs are widened through a table (256 KiB, per call: no global state). */
    float *f16 = NULL;
    if (k->dtype == FA_F16 || v->dtype == FA_F16) {
        f16 = fa_malloc(65536 * sizeof(float));
        if (f16)
            for (uint32_t x = 0; x < 65536; x++) f16[x] = fa_f16_to_f32((uint16_t)x);
    }

    /* Pass 1. */
    pass1_stats tot;
    init_stats(&tot);
    int nomem = 0;
#ifdef _OPENMP
    /* A local lock, not a named `omp critical`: a named one is a global symbol
     * (.gomp_critical_user_NAME) that libflashattn.so would export. */
    omp_lock_t merge_lock;
    omp_init_lock(&merge_lock);
#pragma omp parallel num_threads(fa_threads_for(&p, items))
#endif
    {
        row_scratch s;
        pass1_stats ps;
        init_stats(&ps);
        int ok = scratch_alloc(&s, &p, cx.model);
        s.f16 = f16;
        if (!ok) {
#ifdef _OPENMP
#pragma omp atomic write
#endif
            nomem = 1;
        }
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
        for (int64_t w = 0; w < items; w++)
            if (ok) check_row(&cx, w, &s, &ps);
        if (ok) scratch_free(&s);
#ifdef _OPENMP
        omp_set_lock(&merge_lock);
#endif
        merge_stats(&tot, &ps);
#ifdef _OPENMP
        omp_unset_lock(&merge_lock);
#endif
    }
#ifdef _OPENMP
    omp_destroy_lock(&merge_lock);
#endif
    fa_free(f16);
    if (nomem) {
        fa_free(rows); fa_free(first); fa_free(cx.err); fa_free(cx.absref); fa_free(cx.allow); fa_free(cx.rr);
        fa_check_report_free(r);
        return fa_fail(FA_ERR_NOMEM, "fa_check: out of memory for per-thread scratch");
    }

    /* Summary of pass 1. */
    r->max_abs_ref = tot.max_abs_ref;
    r->emu_max_abs_err = tot.emu_max;
    r->emu_mean_abs_err = r->elements_checked ? tot.emu_sum / (double)r->elements_checked : 0.0;
    r->n_nonfinite = tot.n_nonfinite;
    r->max_abs_err = tot.worst_err > 0.0 ? tot.worst_err : 0.0;
    r->mean_abs_err = tot.n_finite ? tot.sum_abs / (double)tot.n_finite : 0.0;
    if (co.use_tolerance) {
        r->atol = co.atol;
        r->rtol = co.rtol;
        r->bound = co.atol;
    } else {
        r->atol = atol_unit(dt) * tot.max_abs_ref;
        r->rtol = 0.0;
        r->bound = 2.0 * tot.emu_max + r->atol;
    }
    if (cx.model) {
        r->model_max_abs_err = tot.model_max;
        r->model_bound = 2.0 * tot.model_max + r->atol;
        if (!co.use_tolerance) r->bound = r->model_bound; /* the kernel's own data path: the tighter baseline */
    }
    /* portable metrics (thu-ml's CosSim / Rel-L1 / RMSE, torchao's SQNR) */
    r->cos_sim = tot.m_tt > 0.0 && tot.m_rr > 0.0 ? tot.m_tr / sqrt(tot.m_tt * tot.m_rr)
                                                  : (tot.m_tt == tot.m_rr ? 1.0 : 0.0);
    r->rel_l1 = tot.m_abs_ref > 0.0 ? tot.sum_abs / tot.m_abs_ref : (tot.sum_abs > 0.0 ? INFINITY : 0.0);
    r->rmse = tot.n_finite ? sqrt(tot.m_sq / (double)tot.n_finite) : 0.0;
    r->sqnr_db = tot.m_sq > 0.0 ? 10.0 * log10(tot.m_rr / tot.m_sq) : INFINITY;
    r->row_scale_test = tot.alpha_test;
    r->row_scale_model = tot.alpha_ref_model;
    r->row_scale_explained = tot.row_err > 0.0 ? 1.0 - tot.row_res / tot.row_err : 0.0;
    if (r->row_scale_explained < 0.0) r->row_scale_explained = 0.0;
    /* rows scaled (not reshaped): saturated P, row sums from another P, a wrong V descale; a wrong Q or K
     * descale reshapes the softmax and leaves most of its error unexplained by one factor per row */
    if (co.qkv_format)
        r->p_mismatch = fabs(tot.alpha_test - 1.0) > 2.0 * fabs(tot.alpha_ref_model - 1.0) + 0x1p-7 &&
                        r->row_scale_explained >= 0.8;
    r->ratio = tot.emu_max > 0.0 ? r->max_abs_err / tot.emu_max
                                 : (r->max_abs_err > 0.0 ? INFINITY : 0.0);
    if (tot.worst_err >= 0.0 && tot.worst_item != INT64_MAX) {
        const int64_t bh = item_bh(&cx, tot.worst_item);
        r->worst_batch = bh / p.heads;
        r->worst_head = bh % p.heads;
        r->worst_row = item_row(&cx, tot.worst_item);
        r->worst_col = tot.worst_col;
        r->worst_test = tot.worst_test;
        r->worst_ref = tot.worst_ref;
        r->worst_emu = tot.worst_emu;
    }

    /* Pass 2. */
    r->row_rule = !co.use_tolerance && !cx.pfmt && (dt == FA_BF16 || dt == FA_F16);
    verdict_out(&cx, &co, r, items);
    if (cx.model) r->model_n_fail = r->n_fail;
    r->lse_pass = 1;
    if (lse) verdict_lse(&cx, &co, r, items);
    r->pass = r->out_pass && r->lse_pass;

    fa_free(rows);
    fa_free(first);
    fa_free(cx.err);
    fa_free(cx.absref);
    fa_free(cx.allow);
    fa_free(cx.rr);
    fa_clear_error();
    return FA_OK;
}

fa_status fa_check(const fa_tensor *q, const fa_tensor *k, const fa_tensor *v,
                   const fa_tensor *out, const fa_tensor *lse, const fa_options *attn,
                   const fa_check_options *copt, fa_check_report *report)
{
    if (!report) return fa_fail(FA_ERR_NULL_ARG, "fa_check: report is NULL");
    const size_t rsize = report->struct_size;
    /* the report is written, not read: any size from the first published one up
     * to FA_STRUCT_SIZE_MAX is taken, and only its known part is written */
    if (rsize < CHECK_REPORT_MIN_SIZE || rsize > FA_STRUCT_SIZE_MAX)
        return fa_fail(FA_ERR_OPTION,
                       "fa_check: report->struct_size is %zu, not the size of any fa_check_report (this "
                       "library's is %zu); initialize the report with fa_check_report_init()",
                       rsize, sizeof *report);
    const size_t wsize = rsize < sizeof *report ? rsize : sizeof *report;
    memset(report, 0, wsize);
    report->struct_size = wsize;
    fa_check_options co;
    fa_check_options_init(&co, sizeof co);
    if (copt) {
        static const size_t known[] = {CHECK_OPTIONS_MIN_SIZE, sizeof(fa_check_options)};
        fa_status st0 = fa_struct_size_check(copt, sizeof co, known, (int)(sizeof known / sizeof known[0]),
                                             "fa_check_options", "fa_check_options_default");
        if (st0 != FA_OK) return st0;
        memcpy(&co, copt, copt->struct_size < sizeof co ? copt->struct_size : sizeof co);
        co.struct_size = sizeof co;
    }
    /* the findings go into a full, current report, then the caller's part of it */
    fa_check_report full;
    memset(&full, 0, sizeof full);
    full.struct_size = sizeof full;
    fa_status st = check_run(q, k, v, out, lse, attn, co, &full);
    memcpy(report, &full, wsize);
    report->struct_size = wsize; /* what was written: min(the caller's size, the library's) */
    return st;
}

/* ------------------------------------------------------------------------ */
/* The text report                                                           */
/* ------------------------------------------------------------------------ */

/* snprintf into a growing buffer that may be too small; tracks the full length. */
typedef struct text {
    char *buf;
    size_t size, len;
} text;

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static void put(text *t, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *dst = t->len < t->size ? t->buf + t->len : NULL;
    size_t room = t->len < t->size ? t->size - t->len : 0;
    int n = vsnprintf(dst, room, fmt, ap);
    va_end(ap);
    if (n > 0) t->len += (size_t)n;
}

size_t fa_check_report_format(const fa_check_report *report, char *buf, size_t size)
{
    text t = {buf, buf ? size : 0, 0};
    if (t.size) t.buf[0] = '\0';
    if (!report || report->struct_size < CHECK_REPORT_MIN_SIZE) return 0;
    fa_check_report full; /* fields the caller's (older) report lacks read as 0 */
    memset(&full, 0, sizeof full);
    memcpy(&full, report, report->struct_size < sizeof full ? report->struct_size : sizeof full);
    const fa_check_report *r = &full;
    put(&t, "problem: batch=%lld seqlen_q=%lld seqlen_k=%lld heads=%lld heads_k=%lld d=%lld d_v=%lld\n",
        DIM(r->batch), DIM(r->seqlen_q), DIM(r->seqlen_k), DIM(r->heads), DIM(r->heads_k), DIM(r->d),
        DIM(r->dv));
    if (r->sample_rows)
        put(&t, "rows checked: %lld of %lld (%lld sampled rows per (batch, head), seed %llu)\n",
            DIM(r->rows_checked), DIM(r->rows_total), DIM(r->sample_rows),
            (unsigned long long)r->seed);
    else
        put(&t, "rows checked: all %lld\n", DIM(r->rows_checked));
    if (r->qkv_format && !r->use_tolerance)
        put(&t, "rule: low-precision (%s inputs), FlashAttention-3's FP8 rule: max |test - ref| <= 2 * error of "
                "a plain attention with the normalized P rounded to %s%s + atol (atol = %.3g = 2^-9 * max|ref|, "
                "bf16 output)\n",
            fa_qformat_name(r->qkv_format), fa_qformat_name(r->p_format),
            r->p_format == FA_QF_E2M1 ? " in blocks of 16 with e4m3 scales"
                                      : " after a power-of-two row scale (row max in [128, 256): no underflow)",
            r->atol);
    else if (r->use_tolerance)
        put(&t, "rule: explicit, |test - ref| <= atol + rtol*|ref| with atol=%.3g rtol=%.3g\n",
            r->atol, r->rtol);
    else
        put(&t, "rule: %s emulation, max |test - ref| <= 2 * emulation error + atol "
                "(atol = %.3g = 2^-%d * max|ref|)\n",
            fa_dtype_name(r->dtype), r->atol, -(int)round(log2(atol_unit(r->dtype))));
    put(&t, "output  max abs err %.6g   mean abs err %.6g   max rel err %.6g   mean rel err %.6g\n",
        r->max_abs_err, r->mean_abs_err, r->max_rel_err, r->mean_rel_err);
    put(&t, "metrics: cos sim %.8f   rel L1 %.4g   RMSE %.4g   SQNR %.2f dB\n", r->cos_sim, r->rel_l1, r->rmse,
        r->sqnr_db);
    put(&t, "emulated %s baseline: max abs err %.6g   mean abs err %.6g   (max |ref| %.6g)\n",
        r->qkv_format ? fa_qformat_name(r->p_format) : fa_dtype_name(r->dtype), r->emu_max_abs_err,
        r->emu_mean_abs_err, r->max_abs_ref);
    if (r->kernel_model == FA_KERNEL_MODEL_FA3)
        put(&t, "kernel model fa3 (P*256 rounded to %s, row sums unrounded, key blocks last to first): max abs "
                "err %.6g; bound 2 * that + atol = %.6g applies\n",
            fa_qformat_name(r->p_format), r->model_max_abs_err, r->model_bound);
    else if (r->kernel_model == FA_KERNEL_MODEL_SAGE)
        put(&t, "kernel model sage (%s, row sums unrounded, key blocks first to last): max abs err %.6g; "
                "bound 2 * that + atol = %.6g applies\n",
            r->p_format == FA_QF_E2M1 ? "P*2688 in e2m1 under an e4m3 scale per 16 keys" : "P*448 rounded to e4m3",
            r->model_max_abs_err, r->model_bound);
    if (r->qkv_format)
        put(&t, "row scale (test ~ a * ref, worst row): a = %.6f; %s: a = %.6f; a factor per row explains "
                "%.1f%% of the squared error%s\n", r->row_scale_test,
            r->kernel_model ? "kernel model" : "baseline", r->row_scale_model, 100.0 * r->row_scale_explained,
            r->p_mismatch ? "  -> P/ROW-SUM MISMATCH or a wrong V descale: rows are scaled beyond what P "
                            "rounding explains (P saturated at the format's max, or the row sum not from the P "
                            "used in P.V)"
                          : "");
    if (!r->use_tolerance && r->kernel_model)
        put(&t, "tested / emulated max error: %.3g   (bound %.6g, from the kernel model)\n", r->ratio, r->bound);
    else if (!r->use_tolerance)
        put(&t, "tested / emulated max error: %.3g   (bound %.6g; pass needs ratio <= ~2)\n",
            r->ratio, r->bound);
    if (!r->use_tolerance && r->score_allow_max > r->bound)
        put(&t, "rounding allowance: an element may pass above the bound up to its own allowance, "
                "6 sqrt(sum_j (P_j sigma_j)^2 (v_j - O)^2) with sigma_j the emulation's score error%s; "
                "here up to %.3g (docs/validation.md)\n",
            !r->qkv_format && (r->dtype == FA_BF16 || r->dtype == FA_F16)
                ? ", or 3 u sqrt(sum_j P_j^2 v_j^2) + u |ref| for P's and O's rounding (u the dtype's unit roundoff)"
                : "",
            r->score_allow_max);
    if (r->worst_batch >= 0)
        put(&t, "worst element (batch, row, head, col) = (%lld, %lld, %lld, %lld): "
                "test %.8g  ref %.8g  emulated %.8g  |err| %.6g\n",
            DIM(r->worst_batch), DIM(r->worst_row), DIM(r->worst_head), DIM(r->worst_col),
            r->worst_test, r->worst_ref, r->worst_emu, r->max_abs_err);
    if (r->row_rule && r->row_worst_batch >= 0)
        put(&t, "row rule: %lld of %lld rows over it (each row's L2 error <= max(%.3g * the emulation's on that "
                "row, 3 u sqrt(sum_j P_j^2 |v_j|^2)) + atol unit * |ref row|); worst (batch, row, head) = (%lld, "
                "%lld, %lld) at %.3g of its bound\n",
            DIM(r->row_n_fail), DIM(r->rows_checked), fa_check_row_k(r->dv), DIM(r->row_worst_batch),
            DIM(r->row_worst_row), DIM(r->row_worst_head), r->row_ratio);
    put(&t, "out of tolerance: %lld of %lld elements (%.4g%%) in %lld rows\n", DIM(r->n_fail),
        DIM(r->elements_checked), 100.0 * r->fail_fraction, DIM(r->rows_failed));
    if (r->n_nonfinite)
        put(&t, "NON-FINITE: %lld tested elements are NaN or Inf\n", DIM(r->n_nonfinite));
    for (int x = 0; x < r->n_fail_rows; x++) {
        const fa_check_row *row = &r->fail_rows[x];
        put(&t, "  failing row (batch %lld, row %lld, head %lld): %lld bad, max err %.6g at col %lld\n",
            DIM(row->batch), DIM(row->row), DIM(row->head), DIM(row->n_fail), row->max_abs_err,
            DIM(row->worst_col));
    }
    if (r->rows_failed > r->n_fail_rows)
        put(&t, "  ... and %lld more failing rows\n", DIM(r->rows_failed - r->n_fail_rows));
    if (r->n_fail > 0 && r->head_fail) {
        int64_t heads_bad = 0;
        for (int64_t h = 0; h < r->n_heads; h++) heads_bad += r->head_fail[h] > 0;
        if (heads_bad < r->n_heads) {
            put(&t, "failures cluster in %lld of %lld heads:\n", DIM(heads_bad), DIM(r->n_heads));
            for (int64_t h = 0; h < r->n_heads; h++)
                if (r->head_fail[h] > 0)
                    put(&t, "  head %lld: %lld bad elements, max err %.6g\n", DIM(h),
                        DIM(r->head_fail[h]), r->head_max_abs_err[h]);
        } else {
            put(&t, "failures in all %lld heads\n", DIM(r->n_heads));
        }
    }
    if (r->lse_checked) {
        put(&t, "lse max abs err %.6g (emulated %.6g, bound %.6g): %lld of %lld rows out of tolerance; "
                "%lld rows with no visible key\n",
            r->lse_max_abs_err, r->lse_emu_max_abs_err, r->lse_bound, DIM(r->lse_n_fail),
            DIM(r->rows_checked), DIM(r->lse_n_empty));
        if (r->lse_fa2_alibi_offset)
            put(&t, "lse follows FlashAttention-2's causal-ALiBi convention "
                    "(higher by slope*(i + seqlen_k - seqlen_q)); accepted\n");
        if (r->lse_n_fail > 0 && r->lse_worst_batch >= 0)
            put(&t, "lse worst (batch, head, row) = (%lld, %lld, %lld): test %.8g  ref %.8g\n",
                DIM(r->lse_worst_batch), DIM(r->lse_worst_head), DIM(r->lse_worst_row),
                r->lse_worst_test, r->lse_worst_ref);
    }
    if (!r->pass && r->n_fail == 0 && r->n_nonfinite == 0 && r->row_n_fail > 0 && r->lse_pass)
        put(&t, "verdict: FAIL (the row rule: %lld rows; no element over the bound)\n", DIM(r->row_n_fail));
    else
        put(&t, "verdict: %s\n", r->pass ? "PASS" : "FAIL");
    return t.len;
}
