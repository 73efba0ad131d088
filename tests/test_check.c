/*
 * test_check.c — fa_check, the validator behind `flashattn check`, against
 * cases whose verdict is known in advance.
 *
 * Accepted: outputs a correct low-precision kernel could produce — the
 * reference rounded to bf16/f16, a plain bf16/f16 attention written here
 * independently of src/validate.c, the library's own flash path in float32.
 * Rejected: one row perturbed, the softmax scale off by 1%, causal aligned
 * top-left instead of bottom-right, NaN or Inf anywhere.
 * Plus: row sampling agrees with the full check row for row, the LSE rules
 * (either infinity for empty rows, FlashAttention-2's causal-ALiBi offset),
 * the explicit atol/rtol rule, argument errors, and the text report.
 *
 * Seeded random inputs (seed printed; FA_TEST_SEED replays).
 */
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* ------------------------------------------------------------------------ */
/* Fixtures                                                                  */
/* ------------------------------------------------------------------------ */

typedef struct problem {
    int64_t B, Sq, Sk, H, Hk, d, dv;
    tu_tensor q, k, v;
} problem;

/* Random q, k, v in `dtype`; q is drawn in [-qr, qr) (qr > 1 sharpens the softmax). */
static problem make_problem(int64_t B, int64_t Sq, int64_t Sk, int64_t H, int64_t Hk, int64_t d,
                            fa_dtype dtype, double qr, int bhsd)
{
    static uint64_t counter;
    uint64_t rng = tu_seed() + 104729 * ++counter;
    problem p;
    memset(&p, 0, sizeof p);
    p.B = B; p.Sq = Sq; p.Sk = Sk; p.H = H; p.Hk = Hk; p.d = d; p.dv = d;
    p.q = tu_alloc4(dtype, B, Sq, H, d, bhsd);
    p.k = tu_alloc4(dtype, B, Sk, Hk, d, bhsd);
    p.v = tu_alloc4(dtype, B, Sk, Hk, d, bhsd);
    tu_fill(&p.q, &rng, -qr, qr);
    tu_fill(&p.k, &rng, -1.0, 1.0);
    tu_fill(&p.v, &rng, -1.0, 1.0);
    return p;
}

static void free_problem(problem *p)
{
    tu_free(&p->q);
    tu_free(&p->k);
    tu_free(&p->v);
}

static tu_tensor alloc_out(const problem *p, fa_dtype dtype)
{
    tu_tensor o = tu_alloc4(dtype, p->B, p->Sq, p->H, p->dv, 0);
    tu_poison(&o);
    return o;
}

static tu_tensor alloc_lse(const problem *p)
{
    int64_t shape[3] = {p->B, p->H, p->Sq};
    tu_tensor l = tu_alloc(FA_F32, 3, shape);
    tu_poison(&l);
    return l;
}

/* The library's float64 reference, stored into o (and lse) in their dtypes. */
static void reference(const problem *p, tu_tensor *o, tu_tensor *lse, const fa_options *opt_in)
{
    fa_options opt = opt_in ? *opt_in : fa_options_default();
    opt.impl = FA_IMPL_REFERENCE;
    assert_int_equal(fa_forward(&p->q.t, &p->k.t, &p->v.t, &o->t, lse ? &lse->t : NULL, &opt), FA_OK);
}

static float round_dt(fa_dtype dt, float x)
{
    if (dt == FA_BF16) return fa_bf16_to_f32(fa_f32_to_bf16(x));
    if (dt == FA_F16) return fa_f16_to_f32(fa_f32_to_f16(x));
    return x;
}

/*
 * A plain low-precision attention, written here independently of the
 * validator's emulation (different loop order, scale applied after the dot
 * product): inputs rounded to dt, scores in float32, softmax in float32,
 * P rounded to dt, P·V in float32 summed from the last key down, the output
 * rounded to dt. Causal with query i seeing keys j <= i + diag: diag =
 * Sk - Sq is the correct bottom-right alignment, diag = 0 top-left.
 * scale_mult perturbs the scale (1.0 = correct).
 */
static void plain_attention(const problem *p, tu_tensor *o, fa_dtype dt, int causal, int64_t diag,
                            double scale_mult)
{
    const float scale = (float)(scale_mult / sqrt((double)p->d));
    float *s = malloc((size_t)p->Sk * sizeof(float));
    float *acc = malloc((size_t)p->dv * sizeof(float));
    assert_non_null(s);
    assert_non_null(acc);
    for (int64_t b = 0; b < p->B; b++)
        for (int64_t h = 0; h < p->H; h++)
            for (int64_t i = 0; i < p->Sq; i++) {
                const int64_t hk = h / (p->H / p->Hk);
                int64_t hi = p->Sk;
                if (causal && i + diag + 1 < hi) hi = i + diag + 1;
                if (hi < 0) hi = 0;
                float m = -INFINITY, l = 0.0f;
                for (int64_t j = 0; j < hi; j++) {
                    float dot = 0.0f;
                    for (int64_t c = 0; c < p->d; c++)
                        dot += round_dt(dt, (float)tu_get(&p->q, (int64_t[]){b, i, h, c})) *
                               round_dt(dt, (float)tu_get(&p->k, (int64_t[]){b, j, hk, c}));
                    s[j] = scale * dot;
                    if (s[j] > m) m = s[j];
                }
                for (int64_t j = 0; j < hi; j++) {
                    s[j] = expf(s[j] - m);
                    l += s[j];
                }
                for (int64_t c = 0; c < p->dv; c++) acc[c] = 0.0f;
                for (int64_t j = hi - 1; j >= 0; j--) {
                    float pj = round_dt(dt, s[j] / l);
                    for (int64_t c = 0; c < p->dv; c++)
                        acc[c] += pj * round_dt(dt, (float)tu_get(&p->v, (int64_t[]){b, j, hk, c}));
                }
                for (int64_t c = 0; c < p->dv; c++)
                    fa_store_f64(&o->t, fa_off4(&o->t, b, i, h, c), (double)round_dt(dt, acc[c]));
            }
    free(s);
    free(acc);
}

/* Run fa_check and return the report (status must be FA_OK). */
static fa_check_report run_check(const problem *p, const tu_tensor *o, const tu_tensor *lse,
                                 const fa_options *opt, const fa_check_options *co)
{
    fa_check_report r = fa_check_report_init();
    fa_status st = fa_check(&p->q.t, &p->k.t, &p->v.t, &o->t, lse ? &lse->t : NULL, opt, co, &r);
    if (st != FA_OK) fail_msg("fa_check: %s", fa_last_error());
    return r;
}

static fa_check_options with_dtype(fa_dtype dt)
{
    fa_check_options co = fa_check_options_default();
    co.dtype = dt;
    return co;
}

/* Print the report when a verdict is not the expected one. */
static void expect_verdict(fa_check_report *r, int pass, const char *what)
{
    if (r->pass != pass) {
        char buf[8192];
        fa_check_report_format(r, buf, sizeof buf);
        fprintf(stderr, "%s: expected %s\n%s", what, pass ? "PASS" : "FAIL", buf);
    }
    assert_int_equal(r->pass, pass);
}

/* ------------------------------------------------------------------------ */
/* Accepted                                                                  */
/* ------------------------------------------------------------------------ */

/* Ensure the reference rounded to bf16 and to f16 passes under that dtype's rule. */
static void test_check_passes_when_output_is_reference_rounded(void **state)
{
    (void)state;
    const fa_dtype dts[2] = {FA_BF16, FA_F16};
    for (int t = 0; t < 2; t++) {
        problem p = make_problem(2, 37, 53, 4, 2, 32, dts[t], 1.0, 0);
        tu_tensor o = alloc_out(&p, dts[t]);
        fa_options opt = fa_options_default();
        opt.causal = 1;
        reference(&p, &o, NULL, &opt);
        fa_check_options co = with_dtype(dts[t]);
        fa_check_report r = run_check(&p, &o, NULL, &opt, &co);
        expect_verdict(&r, 1, "reference rounded");
        assert_int_equal(r.n_fail, 0);
        assert_int_equal(r.rows_checked, 2 * 4 * 37);
        assert_true(r.ratio <= 2.0);
        fa_check_report_free(&r);
        tu_free(&o);
        free_problem(&p);
    }
}

/* Ensure an independently written plain bf16/f16 attention passes (FA's out_pt). */
static void test_check_passes_when_output_is_plain_low_precision_attention(void **state)
{
    (void)state;
    const fa_dtype dts[2] = {FA_BF16, FA_F16};
    for (int t = 0; t < 2; t++) {
        /* causal, seqlen_q != seqlen_k, GQA; float32 inputs, rounded by the kernel */
        problem p = make_problem(1, 29, 64, 4, 1, 64, FA_F32, 2.0, 0);
        tu_tensor o = alloc_out(&p, dts[t]);
        plain_attention(&p, &o, dts[t], 1, p.Sk - p.Sq, 1.0);
        fa_options opt = fa_options_default();
        opt.causal = 1;
        fa_check_options co = with_dtype(dts[t]);
        fa_check_report r = run_check(&p, &o, NULL, &opt, &co);
        expect_verdict(&r, 1, "plain low-precision attention");
        assert_true(r.emu_max_abs_err > 0.0);
        fa_check_report_free(&r);
        tu_free(&o);
        free_problem(&p);
    }
}

/* Ensure the library's flash path passes in float32, in BHSD layout, with every mask. */
static void test_check_passes_flash_f32_output_with_masks(void **state)
{
    (void)state;
    problem p = make_problem(2, 45, 70, 4, 2, 64, FA_F32, 1.5, 1);
    double slopes_mem[4] = {0.5, 0.25, 0.125, 0.0625};
    fa_tensor slopes;
    int64_t sh = 4;
    assert_int_equal(fa_tensor_make(&slopes, slopes_mem, FA_F64, 1, &sh, NULL), FA_OK);
    for (int m = 0; m < 4; m++) {
        fa_options opt = fa_options_default();
        if (m == 0) opt.causal = 1;
        if (m == 1) { opt.window_left = 9; opt.window_right = 3; }
        if (m == 2) opt.softcap = 5.0;
        if (m == 3) { opt.alibi_slopes = &slopes; opt.causal = 1; }
        tu_tensor o = alloc_out(&p, FA_F32);
        tu_tensor lse = alloc_lse(&p);
        assert_int_equal(fa_forward(&p.q.t, &p.k.t, &p.v.t, &o.t, &lse.t, &opt), FA_OK);
        fa_check_options co = fa_check_options_default(); /* auto: f32 */
        fa_check_report r = run_check(&p, &o, &lse, &opt, &co);
        expect_verdict(&r, 1, "flash f32");
        assert_int_equal(r.dtype, FA_F32);
        assert_true(r.lse_checked);
        assert_false(r.lse_fa2_alibi_offset);
        fa_check_report_free(&r);
        tu_free(&o);
        tu_free(&lse);
    }
    free_problem(&p);
}

/* Ensure correct float32 outputs pass at logits of ~10^3, where the scores' own rounding is
 * most of the output's error (a float32 dot product of 64 terms of size ~10^2: ~2e-4 in each
 * score), and a scale 1% off still fails there. (0.3% already slipped under the old rule on
 * some of these inputs, 0.1% under the new one: they move the scores that decide the softmax
 * by a few times float32's own rounding of them, which no rule can tell from a correct
 * kernel.) Before the score-rounding allowance and the emulation's sequential dot products,
 * this library's flash output failed on about half of such inputs. At these logits most rows
 * are one-hot and a 1% scale moves only rows whose top scores nearly tie, so the control needs
 * rows: with 4 heads (192 rows) it passed on 3 of 900 random problems (one seed in 50 failed
 * the test), with 8 heads (384) on none of 1800, and no correct output failed either. */
static void test_check_passes_float32_outputs_at_large_logits(void **state)
{
    (void)state;
    double regime = 0.0; /* the largest flash error seen: the regime is reached */
    for (int rep = 0; rep < 6; rep++) {
        problem p = make_problem(1, 48, 96, 8, 2, 64, FA_F32, 2000.0, rep & 1);
        tu_tensor o = alloc_out(&p, FA_F32);
        fa_options opt = fa_options_default();
        opt.causal = rep >= 3;
        assert_int_equal(fa_forward(&p.q.t, &p.k.t, &p.v.t, &o.t, NULL, &opt), FA_OK);
        fa_check_options co = fa_check_options_default();
        fa_check_report r = run_check(&p, &o, NULL, &opt, &co);
        expect_verdict(&r, 1, "flash f32 at logits ~1e3");
        if (r.max_abs_err > regime) regime = r.max_abs_err;
        fa_check_report_free(&r);
        plain_attention(&p, &o, FA_F32, opt.causal, p.Sk - p.Sq, 1.0); /* another order of sums */
        r = run_check(&p, &o, NULL, &opt, &co);
        expect_verdict(&r, 1, "plain f32 attention at logits ~1e3");
        fa_check_report_free(&r);
        plain_attention(&p, &o, FA_F32, opt.causal, p.Sk - p.Sq, 1.01);
        r = run_check(&p, &o, NULL, &opt, &co);
        expect_verdict(&r, 0, "scale 1% off at logits ~1e3");
        fa_check_report_free(&r);
        tu_free(&o);
        free_problem(&p);
    }
    assert_true(regime > 1e-5); /* errors far above the ~1e-7 of ordinary logits */
}

/* Ensure the score-rounding allowance cannot be inflated by dot products that cancel huge
 * terms (q_0 = q_1 = A against k_0 = A, k_1 = -A in every key): their sequential float32 sums
 * are exact, so correct outputs are accurate there and a zero output must fail (a bound from
 * u * sum_c |q_c k_jc| let it pass at A = 1e4; found by review). */
static void test_check_fails_zero_output_when_dot_products_cancel(void **state)
{
    (void)state;
    problem p = make_problem(1, 64, 64, 1, 1, 32, FA_F32, 1.0, 0);
    for (int64_t i = 0; i < 64; i++) {
        fa_store_f64(&p.q.t, fa_off4(&p.q.t, 0, i, 0, 0), 1e4);
        fa_store_f64(&p.q.t, fa_off4(&p.q.t, 0, i, 0, 1), 1e4);
        fa_store_f64(&p.k.t, fa_off4(&p.k.t, 0, i, 0, 0), 1e4);
        fa_store_f64(&p.k.t, fa_off4(&p.k.t, 0, i, 0, 1), -1e4);
    }
    tu_tensor o = alloc_out(&p, FA_F32);
    assert_int_equal(fa_forward(&p.q.t, &p.k.t, &p.v.t, &o.t, NULL, NULL), FA_OK);
    fa_check_options co = fa_check_options_default();
    fa_check_report r = run_check(&p, &o, NULL, NULL, &co);
    expect_verdict(&r, 1, "flash f32, cancelling dot products");
    assert_true(r.score_allow_max < 1e-4);
    fa_check_report_free(&r);
    for (int64_t i = 0; i < 64; i++)
        for (int64_t c = 0; c < 32; c++) fa_store_f64(&o.t, fa_off4(&o.t, 0, i, 0, c), 0.0);
    r = run_check(&p, &o, NULL, NULL, &co);
    expect_verdict(&r, 0, "zero output, cancelling dot products");
    fa_check_report_free(&r);
    tu_free(&o);
    free_problem(&p);
}

/* ------------------------------------------------------------------------ */
/* Rejected                                                                  */
/* ------------------------------------------------------------------------ */

/* Ensure one perturbed row fails, and the report points at it and its head. */
static void test_check_fails_when_one_row_is_perturbed(void **state)
{
    (void)state;
    problem p = make_problem(2, 40, 40, 4, 4, 32, FA_BF16, 1.0, 0);
    tu_tensor o = alloc_out(&p, FA_BF16);
    reference(&p, &o, NULL, NULL);
    for (int64_t c = 0; c < p.dv; c += 4) {
        int64_t off = fa_off4(&o.t, 1, 17, 2, c);
        fa_store_f64(&o.t, off, fa_load_f64(&o.t, off) + 0.05);
    }
    fa_check_options co = with_dtype(FA_BF16);
    fa_check_report r = run_check(&p, &o, NULL, NULL, &co);
    expect_verdict(&r, 0, "perturbed row");
    assert_int_equal(r.rows_failed, 1);
    assert_int_equal(r.n_fail, p.dv / 4);
    assert_int_equal(r.n_fail_rows, 1);
    assert_int_equal(r.fail_rows[0].batch, 1);
    assert_int_equal(r.fail_rows[0].row, 17);
    assert_int_equal(r.fail_rows[0].head, 2);
    assert_int_equal(r.worst_batch, 1);
    assert_int_equal(r.worst_row, 17);
    assert_int_equal(r.worst_head, 2);
    assert_int_equal(r.worst_col % 4, 0);
    assert_int_equal(r.head_fail[2], p.dv / 4);
    assert_int_equal(r.head_fail[0] + r.head_fail[1] + r.head_fail[3], 0);
    assert_true(r.ratio > 2.0);
    fa_check_report_free(&r);
    tu_free(&o);
    free_problem(&p);
}

/* Ensure a softmax scale 1% off fails even in bf16. */
static void test_check_fails_when_scale_is_off_by_one_percent(void **state)
{
    (void)state;
    /* The effect of a scale error on O is ~ 1% x the spread of the scores under
     * P; bf16 resolves ~0.4%. So: scores with std ~3 over enough keys (1024)
     * that the softmax stays spread rather than one-hot. */
    problem p = make_problem(1, 16, 1024, 2, 2, 32, FA_BF16, 9.0, 0);
    tu_tensor o = alloc_out(&p, FA_BF16);
    fa_options opt = fa_options_default();
    opt.scale = 1.01 / sqrt((double)p.d);
    reference(&p, &o, NULL, &opt);
    fa_check_options co = with_dtype(FA_BF16);
    fa_check_report r = run_check(&p, &o, NULL, NULL, &co);
    expect_verdict(&r, 0, "scale off by 1%");
    assert_true(r.n_fail > 0);
    fa_check_report_free(&r);
    tu_free(&o);
    free_problem(&p);
}

/* Ensure causal aligned top-left (instead of bottom-right) fails when seqlen_q != seqlen_k. */
static void test_check_fails_when_causal_is_aligned_top_left(void **state)
{
    (void)state;
    problem p = make_problem(1, 24, 56, 2, 2, 32, FA_BF16, 1.0, 0);
    tu_tensor o = alloc_out(&p, FA_BF16);
    plain_attention(&p, &o, FA_BF16, 1, 0, 1.0);
    fa_options opt = fa_options_default();
    opt.causal = 1;
    fa_check_options co = with_dtype(FA_BF16);
    fa_check_report r = run_check(&p, &o, NULL, &opt, &co);
    expect_verdict(&r, 0, "top-left causal");
    /* every row sees fewer keys than it should except none: all rows are wrong */
    assert_true(r.rows_failed > p.Sq);
    fa_check_report_free(&r);

    /* and the same kernel aligned bottom-right passes */
    plain_attention(&p, &o, FA_BF16, 1, p.Sk - p.Sq, 1.0);
    r = run_check(&p, &o, NULL, &opt, &co);
    expect_verdict(&r, 1, "bottom-right causal");
    fa_check_report_free(&r);
    tu_free(&o);
    free_problem(&p);
}

/* Ensure NaN or Inf anywhere in the tested output fails and is counted. */
static void test_check_fails_when_output_has_nan_or_inf(void **state)
{
    (void)state;
    problem p = make_problem(1, 16, 16, 2, 2, 16, FA_F32, 1.0, 0);
    const double bad[2] = {NAN, INFINITY};
    for (int t = 0; t < 2; t++) {
        tu_tensor o = alloc_out(&p, FA_F32);
        reference(&p, &o, NULL, NULL);
        fa_store_f64(&o.t, fa_off4(&o.t, 0, 5, 1, 7), bad[t]);
        fa_check_options co = fa_check_options_default();
        co.use_tolerance = 1;
        co.atol = 1e30; /* even a huge tolerance does not excuse NaN/Inf */
        fa_check_report r = run_check(&p, &o, NULL, NULL, &co);
        expect_verdict(&r, 0, "non-finite output");
        assert_int_equal(r.n_nonfinite, 1);
        assert_int_equal(r.n_fail, 1);
        assert_int_equal(r.worst_row, 5);
        assert_int_equal(r.worst_head, 1);
        assert_int_equal(r.worst_col, 7);
        assert_true(isinf(r.max_abs_err));
        fa_check_report_free(&r);
        tu_free(&o);
    }
    free_problem(&p);
}

/* ------------------------------------------------------------------------ */
/* Row sampling                                                              */
/* ------------------------------------------------------------------------ */

/* Ensure sampled rows are distinct, reproducible, and judged exactly as in a full check. */
static void test_check_sampled_rows_agree_with_full_check(void **state)
{
    (void)state;
    /* causal with seqlen_q != seqlen_k: a row must be computed with the full geometry */
    problem p = make_problem(2, 50, 80, 3, 3, 16, FA_F32, 1.0, 0);
    fa_options opt = fa_options_default();
    opt.causal = 1;
    tu_tensor o = alloc_out(&p, FA_F32);
    reference(&p, &o, NULL, &opt);
    fa_check_options co = fa_check_options_default();
    co.sample_rows = 7;
    co.seed = 42;
    fa_check_report r = run_check(&p, &o, NULL, &opt, &co);
    expect_verdict(&r, 1, "sampled reference");
    assert_int_equal(r.rows_checked, 2 * 3 * 7);
    assert_int_equal(r.rows_total, 2 * 3 * 50);
    assert_int_equal(r.sample_rows, 7);
    fa_check_report_free(&r);

    /* perturb every row of head 1: the sample must find exactly its 7 rows per batch */
    for (int64_t b = 0; b < p.B; b++)
        for (int64_t i = 0; i < p.Sq; i++) {
            int64_t off = fa_off4(&o.t, b, i, 1, 0);
            fa_store_f64(&o.t, off, fa_load_f64(&o.t, off) + 1.0 + (double)i);
        }
    r = run_check(&p, &o, NULL, &opt, &co);
    expect_verdict(&r, 0, "sampled perturbed head");
    assert_int_equal(r.rows_failed, 2 * 7);
    assert_int_equal(r.head_fail[1], 2 * 7);
    assert_int_equal(r.head_fail[0] + r.head_fail[2], 0);
    /* the worst error is 1 + i at the largest sampled row of head 1 */
    const int64_t worst_row = r.worst_row;
    const double worst = r.max_abs_err;
    assert_true(fabs(worst - (1.0 + (double)worst_row)) < 1e-3);
    /* failing rows are listed in (batch, row, head) order and are distinct */
    for (int x = 1; x < r.n_fail_rows; x++) {
        const fa_check_row *a = &r.fail_rows[x - 1], *c = &r.fail_rows[x];
        assert_true(a->batch < c->batch || (a->batch == c->batch && a->row < c->row));
    }
    fa_check_report_free(&r);

    /* same seed, same rows */
    r = run_check(&p, &o, NULL, &opt, &co);
    assert_int_equal(r.worst_row, worst_row);
    fa_check_report_free(&r);

    /* K >= seqlen_q means all rows */
    co.sample_rows = 1000;
    r = run_check(&p, &o, NULL, &opt, &co);
    assert_int_equal(r.rows_checked, r.rows_total);
    assert_int_equal(r.sample_rows, 0);
    assert_int_equal(r.rows_failed, 2 * 50);
    fa_check_report_free(&r);
    tu_free(&o);
    free_problem(&p);
}

/* Ensure top-left causal is caught by a sampled check too (rows keep the bottom-right geometry). */
static void test_check_sampled_rows_catch_top_left_causal(void **state)
{
    (void)state;
    problem p = make_problem(1, 40, 100, 2, 2, 16, FA_BF16, 1.0, 0);
    tu_tensor o = alloc_out(&p, FA_BF16);
    plain_attention(&p, &o, FA_BF16, 1, 0, 1.0);
    fa_options opt = fa_options_default();
    opt.causal = 1;
    fa_check_options co = with_dtype(FA_BF16);
    co.sample_rows = 4;
    co.seed = 7;
    fa_check_report r = run_check(&p, &o, NULL, &opt, &co);
    expect_verdict(&r, 0, "sampled top-left causal");
    assert_int_equal(r.rows_failed, 2 * 4);
    fa_check_report_free(&r);
    tu_free(&o);
    free_problem(&p);
}

/* ------------------------------------------------------------------------ */
/* LSE                                                                       */
/* ------------------------------------------------------------------------ */

/* Ensure a row with no visible key may report -inf or +inf, but nothing finite. */
static void test_check_lse_accepts_either_infinity_for_empty_rows(void **state)
{
    (void)state;
    problem p = make_problem(1, 30, 20, 2, 2, 16, FA_F32, 1.0, 0); /* causal: rows 0..9 empty */
    fa_options opt = fa_options_default();
    opt.causal = 1;
    tu_tensor o = alloc_out(&p, FA_F32);
    tu_tensor lse = alloc_lse(&p);
    reference(&p, &o, &lse, &opt);
    fa_check_options co = fa_check_options_default();
    fa_check_report r = run_check(&p, &o, &lse, &opt, &co);
    expect_verdict(&r, 1, "-inf LSE");
    assert_int_equal(r.lse_n_empty, 2 * 10);
    fa_check_report_free(&r);

    float *l = lse.t.data;
    for (int64_t h = 0; h < p.H; h++) l[h * p.Sq + 3] = INFINITY; /* FlashAttention-2 style */
    r = run_check(&p, &o, &lse, &opt, &co);
    expect_verdict(&r, 1, "+inf LSE");
    fa_check_report_free(&r);

    l[4] = 0.0f;
    r = run_check(&p, &o, &lse, &opt, &co);
    expect_verdict(&r, 0, "finite LSE on an empty row");
    assert_int_equal(r.lse_n_fail, 1);
    assert_true(r.out_pass);
    assert_false(r.lse_pass);
    fa_check_report_free(&r);

    l[4] = -INFINITY;
    l[25] += 0.01f; /* a visible row off by 0.01 */
    r = run_check(&p, &o, &lse, &opt, &co);
    expect_verdict(&r, 0, "LSE off by 0.01");
    assert_int_equal(r.lse_worst_row, 25);
    fa_check_report_free(&r);
    tu_free(&o);
    tu_free(&lse);
    free_problem(&p);
}

/*
 * An LSE that leaves out one key of 4096 (the tail of a kernel's last key block dropped from
 * the row sum) moves by about P of that key, ~1e-4..1e-3 here, where float32's own error is
 * ~1e-6: it must fail, while the flash path's float32 LSE passes. (The old floor, 1e-4
 * max(1, |LSE|), passed it.)
 */
static void test_check_lse_fails_when_one_key_is_left_out(void **state)
{
    (void)state;
    problem p = make_problem(1, 16, 4096, 2, 2, 64, FA_F32, 1.0, 0);
    fa_options opt = fa_options_default();
    tu_tensor o = alloc_out(&p, FA_F32), lse = alloc_lse(&p), lse_miss = alloc_lse(&p);
    tu_tensor o_miss = alloc_out(&p, FA_F32);
    reference(&p, &o, &lse, &opt);
    fa_check_options co = fa_check_options_default();
    fa_check_report r = run_check(&p, &o, &lse, &opt, &co);
    expect_verdict(&r, 1, "reference LSE");
    fa_check_report_free(&r);

    opt.impl = FA_IMPL_FLASH; /* the float32 path's own LSE */
    assert_int_equal(fa_forward(&p.q.t, &p.k.t, &p.v.t, &o.t, &lse.t, &opt), FA_OK);
    opt.impl = FA_IMPL_REFERENCE;
    r = run_check(&p, &o, &lse, &opt, &co);
    expect_verdict(&r, 1, "flash LSE");
    fa_check_report_free(&r);

    fa_tensor k1 = p.k.t, v1 = p.v.t; /* the first 4095 keys: the same storage, one row shorter */
    k1.shape[1] = v1.shape[1] = p.Sk - 1;
    assert_int_equal(fa_forward(&p.q.t, &k1, &v1, &o_miss.t, &lse_miss.t, &opt), FA_OK);
    r = run_check(&p, &o, &lse_miss, &opt, &co);
    expect_verdict(&r, 0, "LSE without the last key");
    assert_true(r.out_pass);
    assert_false(r.lse_pass);
    assert_true(r.lse_n_fail > 0);
    fa_check_report_free(&r);
    tu_free(&o); tu_free(&o_miss); tu_free(&lse); tu_free(&lse_miss);
    free_problem(&p);
}

/*
 * Ensure the row rule catches what the element rule's one bound misses: a causal kernel that
 * applies a window of 250 keys (rows past 250 lose 1..5 of their ~250 keys). The short rows'
 * large |O| set the element bound; the long rows are each held to their own emulation. A
 * correct bf16 output stays under every row's bound; float32 and explicit rules have no row rule.
 */
static void test_check_row_rule_catches_keys_lost_on_long_rows(void **state)
{
    (void)state;
    problem p = make_problem(1, 256, 256, 2, 1, 32, FA_BF16, 3.0, 0);
    fa_options opt = fa_options_default();
    opt.causal = 1;
    tu_tensor good = alloc_out(&p, FA_BF16), bad = alloc_out(&p, FA_BF16);
    reference(&p, &good, NULL, &opt);
    fa_options win = opt;
    win.window_left = 250;
    win.window_right = 0;
    reference(&p, &bad, NULL, &win);
    fa_check_options co = fa_check_options_default();

    fa_check_report r = run_check(&p, &good, NULL, &opt, &co);
    expect_verdict(&r, 1, "correct causal bf16 output");
    assert_true(r.row_rule);
    assert_int_equal(r.row_n_fail, 0);
    assert_true(r.row_ratio > 0.0 && r.row_ratio < 1.0);
    fa_check_report_free(&r);

    r = run_check(&p, &bad, NULL, &opt, &co);
    expect_verdict(&r, 0, "a window of 250 instead of causal");
    assert_true(r.row_n_fail >= 1 && r.row_n_fail <= 2 * 5); /* rows 251..255 of 2 heads */
    assert_true(r.row_worst_row > 250);
    assert_true(r.row_ratio > 4.0);
    char text[8192];
    fa_check_report_format(&r, text, sizeof text);
    assert_non_null(strstr(text, "row rule: "));
    fa_check_report_free(&r);

    co.use_tolerance = 1; /* explicit tolerances: no row rule */
    co.atol = 1.0;
    r = run_check(&p, &bad, NULL, &opt, &co);
    assert_false(r.row_rule);
    expect_verdict(&r, 1, "explicit atol 1");
    fa_check_report_free(&r);
    tu_free(&good);
    tu_free(&bad);
    free_problem(&p);

    /* float32: no row rule (accumulation noise; the element bound is ~4e-6 relative there) */
    problem p32 = make_problem(1, 64, 64, 1, 1, 32, FA_F32, 3.0, 0);
    tu_tensor o32 = alloc_out(&p32, FA_F32);
    reference(&p32, &o32, NULL, &opt);
    co = fa_check_options_default();
    r = run_check(&p32, &o32, NULL, &opt, &co);
    expect_verdict(&r, 1, "float32 reference");
    assert_false(r.row_rule);
    assert_int_equal(r.row_worst_batch, -1);
    fa_check_report_free(&r);
    tu_free(&o32);
    free_problem(&p32);
}

/*
 * Ensure a correct bf16 kernel passes when one channel of V is 100x the others (LLMs' V have
 * such). The kernel below rounds P as FlashAttention does, exp(s - max) before the division
 * by the row sum, where the emulation rounds the divided P: independent draws of P's
 * rounding error, and with one dominant channel a row's error is that one channel's, so the
 * emulation's draw on a row can be small by chance. Without the P-rounding floor and
 * allowance (FA_CHECK_ROW_P) this failed 81 of 1024 rows at up to 5x their bound (a review's
 * case; a single decode row failed the element rule too).
 */
static void test_check_row_rule_passes_an_outlier_channel_in_v(void **state)
{
    (void)state;
    const int64_t S = 256, H = 2, d = 64;
    problem p = make_problem(1, S, S, H, 1, d, FA_F32, 3.0, 0);
    float *q = p.q.t.data, *k = p.k.t.data, *v = p.v.t.data;
    for (int64_t x = 0; x < S * H * d; x++) q[x] = round_dt(FA_BF16, q[x]);
    for (int64_t x = 0; x < S * d; x++) {
        k[x] = round_dt(FA_BF16, k[x]);
        v[x] = round_dt(FA_BF16, x % d == 5 ? 100.0f * v[x] : v[x]);
    }
    tu_tensor o = alloc_out(&p, FA_F32);
    float *out = o.t.data, sc[256], acc[64];
    for (int64_t i = 0; i < S; i++) /* causal, Sq = Sk */
        for (int64_t h = 0; h < H; h++) {
            const float *qi = q + (i * H + h) * d;
            float m = -INFINITY, l = 0.0f;
            for (int64_t j = 0; j <= i; j++) {
                float dot = 0.0f;
                for (int64_t c = 0; c < d; c++) dot += qi[c] * k[j * d + c];
                sc[j] = dot * (float)(1.0 / sqrt((double)d));
                if (sc[j] > m) m = sc[j];
            }
            for (int64_t c = 0; c < d; c++) acc[c] = 0.0f;
            for (int64_t j = 0; j <= i; j++) {
                const float pj = expf(sc[j] - m);
                l += pj;
                const float pr = round_dt(FA_BF16, pj);
                for (int64_t c = 0; c < d; c++) acc[c] += pr * v[j * d + c];
            }
            for (int64_t c = 0; c < d; c++) out[(i * H + h) * d + c] = round_dt(FA_BF16, acc[c] / l);
        }
    fa_options opt = fa_options_default();
    opt.causal = 1;
    fa_check_options co = fa_check_options_default();
    co.dtype = FA_BF16;
    fa_check_report r = run_check(&p, &o, NULL, &opt, &co);
    expect_verdict(&r, 1, "a correct bf16 kernel, V with an outlier channel");
    assert_true(r.row_rule);
    assert_true(r.row_ratio < 1.0);
    fa_check_report_free(&r);
    tu_free(&o);
    free_problem(&p);
}

/* Ensure FlashAttention-2's causal-ALiBi LSE (+ slope * (i + Sk - Sq)) is recognized. */
static void test_check_lse_accepts_flash_attention_2_alibi_offset(void **state)
{
    (void)state;
    problem p = make_problem(2, 24, 40, 2, 1, 16, FA_F32, 1.0, 0);
    float slopes_mem[2 * 2] = {0.5f, 0.125f, 0.25f, 0.0625f}; /* [batch][heads] */
    fa_tensor slopes;
    int64_t sh[2] = {2, 2};
    assert_int_equal(fa_tensor_make(&slopes, slopes_mem, FA_F32, 2, sh, NULL), FA_OK);
    fa_options opt = fa_options_default();
    opt.causal = 1;
    opt.alibi_slopes = &slopes;
    tu_tensor o = alloc_out(&p, FA_F32);
    tu_tensor lse = alloc_lse(&p);
    reference(&p, &o, &lse, &opt);
    float *l = lse.t.data;
    for (int64_t b = 0; b < p.B; b++)
        for (int64_t h = 0; h < p.H; h++)
            for (int64_t i = 0; i < p.Sq; i++)
                l[(b * p.H + h) * p.Sq + i] += slopes_mem[b * 2 + h] * (float)(i + p.Sk - p.Sq);
    fa_check_options co = fa_check_options_default();
    fa_check_report r = run_check(&p, &o, &lse, &opt, &co);
    expect_verdict(&r, 1, "FA2 ALiBi LSE");
    assert_true(r.lse_fa2_alibi_offset);
    fa_check_report_free(&r);

    /* a different offset is just wrong */
    l[5] += 1.0f;
    r = run_check(&p, &o, &lse, &opt, &co);
    expect_verdict(&r, 0, "wrong LSE offset");
    fa_check_report_free(&r);

    /* FA2 takes the offset form only on its causal path: a left window that covers every key
     * (>= Sk: FA2 sets it to -1) stays causal there; a sliding window (10, 0) runs its local
     * path, with no offset, so the same shifted LSE is wrong there (a per-row bias bug) */
    for (int wl = 0; wl < 2; wl++) {
        opt.window_left = wl ? 40 : 10; /* Sk = 40 */
        opt.window_right = 0;
        reference(&p, &o, &lse, &opt);
        for (int64_t b = 0; b < p.B; b++)
            for (int64_t h = 0; h < p.H; h++)
                for (int64_t i = 0; i < p.Sq; i++)
                    l[(b * p.H + h) * p.Sq + i] += slopes_mem[b * 2 + h] * (float)(i + p.Sk - p.Sq);
        r = run_check(&p, &o, &lse, &opt, &co);
        expect_verdict(&r, wl, wl ? "FA2 ALiBi LSE, window covering every key" : "offset LSE under a sliding window");
        assert_int_equal(r.lse_fa2_alibi_offset, wl);
        fa_check_report_free(&r);
    }
    tu_free(&o);
    tu_free(&lse);
    free_problem(&p);
}

/* ------------------------------------------------------------------------ */
/* Explicit tolerances, errors, report                                       */
/* ------------------------------------------------------------------------ */

/* Ensure --atol/--rtol replace the emulation rule. */
static void test_check_explicit_tolerance_replaces_the_rule(void **state)
{
    (void)state;
    problem p = make_problem(1, 20, 20, 2, 2, 16, FA_BF16, 1.0, 0);
    tu_tensor o = alloc_out(&p, FA_BF16);
    reference(&p, &o, NULL, NULL);
    fa_check_options co = fa_check_options_default();
    co.use_tolerance = 1;
    co.atol = 1e-7; /* tighter than bf16 rounding: fails */
    fa_check_report r = run_check(&p, &o, NULL, NULL, &co);
    expect_verdict(&r, 0, "atol 1e-7 on bf16");
    assert_true(r.use_tolerance);
    fa_check_report_free(&r);
    co.atol = 0.0;
    co.rtol = 1e-2; /* |err| <= 2^-9 |ref| for bf16 rounding */
    r = run_check(&p, &o, NULL, NULL, &co);
    expect_verdict(&r, 1, "rtol 1e-2 on bf16");
    fa_check_report_free(&r);
    tu_free(&o);
    free_problem(&p);
}

/* Ensure bad arguments are errors (not verdicts) and the message names the tensor. */
static void test_check_rejects_bad_arguments_naming_the_tensor(void **state)
{
    (void)state;
    problem p = make_problem(1, 8, 8, 2, 2, 8, FA_F32, 1.0, 0);
    fa_check_options co = fa_check_options_default();
    co.out_name = "o_gpu.npy";
    co.k_name = "k_gpu.npy";
    co.lse_name = "lse_gpu.npy";
    fa_check_report r = fa_check_report_init();

    tu_tensor wrong = tu_alloc4(FA_F32, 1, 7, 2, 8, 0);
    assert_int_equal(fa_check(&p.q.t, &p.k.t, &p.v.t, &wrong.t, NULL, NULL, &co, &r), FA_ERR_SHAPE);
    assert_non_null(strstr(fa_last_error(), "o_gpu.npy"));
    tu_free(&wrong);

    tu_tensor o = alloc_out(&p, FA_F32);
    reference(&p, &o, NULL, NULL);
    int64_t lsh[3] = {1, 2, 8};
    tu_tensor l16 = tu_alloc(FA_F16, 3, lsh);
    assert_int_equal(fa_check(&p.q.t, &p.k.t, &p.v.t, &o.t, &l16.t, NULL, &co, &r), FA_ERR_DTYPE);
    assert_non_null(strstr(fa_last_error(), "lse_gpu.npy"));
    tu_free(&l16);

    tu_tensor k2 = tu_alloc4(FA_F32, 1, 8, 2, 4, 0); /* head dim disagrees with q */
    tu_poison(&k2);
    assert_int_equal(fa_check(&p.q.t, &k2.t, &p.v.t, &o.t, NULL, NULL, &co, &r), FA_ERR_SHAPE);
    assert_non_null(strstr(fa_last_error(), "k_gpu.npy"));
    tu_free(&k2);

    float *kd = p.k.t.data;
    float saved = kd[3];
    kd[3] = NAN;
    assert_int_equal(fa_check(&p.q.t, &p.k.t, &p.v.t, &o.t, NULL, NULL, &co, &r), FA_ERR_NONFINITE);
    assert_non_null(strstr(fa_last_error(), "k_gpu.npy"));
    kd[3] = saved;

    co.use_tolerance = 1;
    co.atol = -1.0;
    assert_int_equal(fa_check(&p.q.t, &p.k.t, &p.v.t, &o.t, NULL, NULL, &co, &r), FA_ERR_OPTION);
    co.use_tolerance = 0;
    co.sample_rows = -3;
    assert_int_equal(fa_check(&p.q.t, &p.k.t, &p.v.t, &o.t, NULL, NULL, &co, &r), FA_ERR_OPTION);
    co.sample_rows = 0;
    assert_int_equal(fa_check(&p.q.t, &p.k.t, &p.v.t, &o.t, NULL, NULL, &co, NULL), FA_ERR_NULL_ARG);
    tu_free(&o);
    free_problem(&p);
}

/*
 * Ensure fa_check itself (not only the CLI) refuses inputs that overflow the
 * emulated precision under the default rule (beyond 65504 for f16, ~3.39e38
 * for bf16): the emulation would be inf/NaN and the bound infinite, so any
 * output would pass. In range (60000 in f16) the bound stays finite and a
 * wrong output fails; an explicit tolerance does not use the emulation.
 */
static void test_check_refuses_inputs_beyond_the_emulated_range(void **state)
{
    (void)state;
    const fa_dtype dts[2] = {FA_F16, FA_BF16};
    const float big[2] = {70000.0f, 3.4e38f};
    for (int t = 0; t < 2; t++) {
        problem p = make_problem(1, 9, 11, 2, 1, 8, FA_F32, 1.0, 0);
        tu_tensor o = alloc_out(&p, FA_F32);
        reference(&p, &o, NULL, NULL);
        float *od = o.t.data;
        od[5] += 0.25f; /* wrong: must never pass */
        float *kd = p.k.t.data;
        const float saved = kd[7];
        kd[7] = -big[t];
        fa_check_options co = fa_check_options_default();
        co.dtype = dts[t];
        co.k_name = "k_gpu.npy";
        fa_check_report r = fa_check_report_init();
        assert_int_equal(fa_check(&p.q.t, &p.k.t, &p.v.t, &o.t, NULL, NULL, &co, &r), FA_ERR_NONFINITE);
        assert_non_null(strstr(fa_last_error(), "k_gpu.npy"));
        assert_non_null(strstr(fa_last_error(), fa_dtype_name(dts[t])));
        assert_false(r.pass);
        fa_check_report_free(&r);
        /* an explicit tolerance does not rely on the emulation */
        co.use_tolerance = 1;
        co.atol = 1e-3;
        r = run_check(&p, &o, NULL, NULL, &co);
        expect_verdict(&r, 0, "explicit atol with a wrong output");
        fa_check_report_free(&r);
        if (dts[t] == FA_F16) { /* in range: a finite bound, and the wrong output fails */
            kd[7] = 60000.0f;
            co.use_tolerance = 0;
            co.atol = 0.0;
            reference(&p, &o, NULL, NULL);
            od[5] += 0.25f;
            r = run_check(&p, &o, NULL, NULL, &co);
            assert_true(isfinite(r.bound) && isfinite(r.emu_mean_abs_err));
            expect_verdict(&r, 0, "f16 at 60000 with a wrong output");
            fa_check_report_free(&r);
        }
        kd[7] = saved;
        tu_free(&o);
        free_problem(&p);
    }
}

/* Ensure the text report states the rule, both errors, the worst element and the verdict. */
static void test_check_report_text_explains_the_verdict(void **state)
{
    (void)state;
    problem p = make_problem(1, 12, 12, 2, 2, 8, FA_BF16, 1.0, 0);
    tu_tensor o = alloc_out(&p, FA_BF16);
    reference(&p, &o, NULL, NULL);
    int64_t off = fa_off4(&o.t, 0, 9, 1, 6);
    fa_store_f64(&o.t, off, fa_load_f64(&o.t, off) + 0.5);
    fa_check_options co = with_dtype(FA_BF16);
    fa_check_report r = run_check(&p, &o, NULL, NULL, &co);
    size_t need = fa_check_report_format(&r, NULL, 0);
    assert_true(need > 100);
    char *buf = malloc(need + 1);
    assert_int_equal(fa_check_report_format(&r, buf, need + 1), need);
    assert_int_equal(strlen(buf), need);
    assert_non_null(strstr(buf, "rule: bf16 emulation"));
    assert_non_null(strstr(buf, "emulated bf16 baseline"));
    assert_non_null(strstr(buf, "tested / emulated max error"));
    assert_non_null(strstr(buf, "(0, 9, 1, 6)"));
    assert_non_null(strstr(buf, "failing row (batch 0, row 9, head 1)"));
    assert_non_null(strstr(buf, "failures cluster in 1 of 2 heads"));
    assert_non_null(strstr(buf, "verdict: FAIL"));
    /* a short buffer is truncated, NUL-terminated, and the full length still returned */
    char small[16];
    assert_int_equal(fa_check_report_format(&r, small, sizeof small), need);
    assert_int_equal(strlen(small), sizeof small - 1);
    free(buf);
    fa_check_report_free(&r);
    fa_check_report_free(&r); /* safe twice */
    tu_free(&o);
    free_problem(&p);
}

int main(void)
{
    tu_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_check_passes_when_output_is_reference_rounded),
        cmocka_unit_test(test_check_passes_when_output_is_plain_low_precision_attention),
        cmocka_unit_test(test_check_passes_flash_f32_output_with_masks),
        cmocka_unit_test(test_check_passes_float32_outputs_at_large_logits),
        cmocka_unit_test(test_check_fails_zero_output_when_dot_products_cancel),
        cmocka_unit_test(test_check_fails_when_one_row_is_perturbed),
        cmocka_unit_test(test_check_fails_when_scale_is_off_by_one_percent),
        cmocka_unit_test(test_check_fails_when_causal_is_aligned_top_left),
        cmocka_unit_test(test_check_fails_when_output_has_nan_or_inf),
        cmocka_unit_test(test_check_sampled_rows_agree_with_full_check),
        cmocka_unit_test(test_check_sampled_rows_catch_top_left_causal),
        cmocka_unit_test(test_check_lse_accepts_either_infinity_for_empty_rows),
        cmocka_unit_test(test_check_lse_fails_when_one_key_is_left_out),
        cmocka_unit_test(test_check_lse_accepts_flash_attention_2_alibi_offset),
        cmocka_unit_test(test_check_row_rule_catches_keys_lost_on_long_rows),
        cmocka_unit_test(test_check_row_rule_passes_an_outlier_channel_in_v),
        cmocka_unit_test(test_check_explicit_tolerance_replaces_the_rule),
        cmocka_unit_test(test_check_rejects_bad_arguments_naming_the_tensor),
        cmocka_unit_test(test_check_refuses_inputs_beyond_the_emulated_range),
        cmocka_unit_test(test_check_report_text_explains_the_verdict),
    };
    return cmocka_run_group_tests_name("check", tests, NULL, NULL);
}
