/*
 * test_sinks.c — attention sinks (fa_options::sinks; FlashAttention-4's
 * learnable sink): one logit per head in the final-score domain, added to
 * the softmax denominator only.
 *
 * What must hold:
 *   - the reference equals a plain dense float64 model written here
 *     (LSE = ln(sum_j e^{s_ij} + e^{sink_h}), O = sum_j e^{s_ij - LSE} v_j;
 *     a row with no visible key: O = 0, LSE = sink), under causal, window,
 *     softcap and ALiBi, rows with no visible key included;
 *   - flash and standard match the reference to float32 rounding;
 *   - the reference backward (dq, dk, dv and dsinks through fa_backward_ex)
 *     equals central finite differences of the float64 reference forward;
 *     flash's backward matches the reference backward;
 *   - varlen batches and KV caches take sinks (flash equals the reference);
 *   - fa_check with sinks passes the flash output and fails an output
 *     computed without them;
 *   - bad sinks are refused with one message naming the problem.
 */
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define B 2
#define SQ 7
#define SK 5   /* < SQ: under causal the first rows see no key */
#define H 4
#define HK 2
#define D 8
#define DV 6

typedef struct opt_case {
    int causal;
    int64_t wl, wr;
    double softcap;
    int alibi;
} opt_case;

static const opt_case OPTS[] = {
    {0, -1, -1, 0.0, 0}, {1, -1, -1, 0.0, 0}, {0, 1, 0, 3.0, 1}, {1, 2, -1, 0.0, 1},
};

typedef struct data {
    tu_tensor q, k, v, dout, sinks, slopes;
} data;

static void make_data(data *g, uint64_t *rng, fa_dtype dt)
{
    g->q = tu_alloc4(dt, B, SQ, H, D, 0);
    g->k = tu_alloc4(dt, B, SK, HK, D, 0);
    g->v = tu_alloc4(dt, B, SK, HK, DV, 0);
    g->dout = tu_alloc4(dt, B, SQ, H, DV, 0);
    const int64_t s1[1] = {H};
    g->sinks = tu_alloc(dt, 1, s1);
    g->slopes = tu_alloc(FA_F64, 1, s1);
    tu_fill(&g->q, rng, -1.5, 1.5);
    tu_fill(&g->k, rng, -1.5, 1.5);
    tu_fill(&g->v, rng, -1, 1);
    tu_fill(&g->dout, rng, -1, 1);
    tu_fill(&g->sinks, rng, -1, 2.5); /* comparable to the scores: the sink matters */
    tu_fill(&g->slopes, rng, 0.1, 0.6);
}

static void free_data(data *g)
{
    tu_free(&g->q); tu_free(&g->k); tu_free(&g->v); tu_free(&g->dout); tu_free(&g->sinks); tu_free(&g->slopes);
}

static fa_options make_opt(const opt_case *oc, const data *g, fa_impl impl)
{
    fa_options opt = fa_options_default();
    opt.causal = oc->causal;
    opt.window_left = oc->wl;
    opt.window_right = oc->wr;
    opt.softcap = oc->softcap;
    opt.alibi_slopes = oc->alibi ? &g->slopes.t : NULL;
    opt.sinks = &g->sinks.t;
    opt.impl = impl;
    opt.block_q = 4;
    opt.block_k = 4;
    opt.num_threads = 2;
    return opt;
}

static double at4(const tu_tensor *t, int64_t a, int64_t b, int64_t c, int64_t d)
{
    const int64_t idx[4] = {a, b, c, d};
    return tu_get(t, idx);
}

/* The dense model: O [B][SQ][H][DV] and LSE [B][H][SQ] in float64, written out
 * from the definition (no library code). */
static void dense_model(const data *g, const opt_case *oc, double *o, double *lse)
{
    const double scale = 1.0 / sqrt((double)D);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < SQ; i++) {
                const int64_t hk = h / (H / HK), diag = i + SK - SQ;
                const int64_t ix1[1] = {h};
                const double sink = tu_get(&g->sinks, ix1), slope = oc->alibi ? tu_get(&g->slopes, ix1) : 0.0;
                double s[SK];
                int vis[SK];
                double m = sink;
                for (int64_t j = 0; j < SK; j++) {
                    const int64_t wr = oc->causal ? 0 : oc->wr;
                    vis[j] = !(oc->wl >= 0 && j < diag - oc->wl) && !(wr >= 0 && j > diag + wr);
                    double dot = 0.0;
                    for (int64_t c = 0; c < D; c++) dot += at4(&g->q, b, i, h, c) * at4(&g->k, b, j, hk, c);
                    double x = scale * dot;
                    if (oc->softcap > 0) x = oc->softcap * tanh(x / oc->softcap);
                    x -= slope * fabs((double)(diag - j));
                    s[j] = x;
                    if (vis[j] && x > m) m = x;
                }
                double z = exp(sink - m);
                for (int64_t j = 0; j < SK; j++) if (vis[j]) z += exp(s[j] - m);
                const double L = m + log(z);
                lse[(b * H + h) * SQ + i] = L;
                for (int64_t c = 0; c < DV; c++) {
                    double acc = 0.0;
                    for (int64_t j = 0; j < SK; j++) if (vis[j]) acc += exp(s[j] - L) * at4(&g->v, b, j, hk, c);
                    o[((b * SQ + i) * H + h) * DV + c] = acc;
                }
            }
}

static void forward(const data *g, const fa_options *opt, tu_tensor *o, tu_tensor *lse, fa_dtype dt)
{
    *o = tu_alloc4(dt, B, SQ, H, DV, 0);
    const int64_t ls[3] = {B, H, SQ};
    *lse = tu_alloc(FA_F64, 3, ls);
    tu_poison(o);
    tu_poison(lse);
    if (fa_forward(&g->q.t, &g->k.t, &g->v.t, &o->t, &lse->t, opt) != FA_OK)
        fail_msg("forward (%s): %s", fa_impl_name(opt->impl), fa_last_error());
}

/* Ensure the reference, flash and standard give the dense model's O and LSE with sinks. */
static void test_forward_matches_dense_model_with_sinks(void **state)
{
    (void)state;
    uint64_t rng = tu_seed() ^ 0x51;
    data g;
    make_data(&g, &rng, FA_F64);
    for (size_t oi = 0; oi < sizeof OPTS / sizeof OPTS[0]; oi++) {
        double o_m[B * SQ * H * DV], l_m[B * H * SQ];
        dense_model(&g, &OPTS[oi], o_m, l_m);
        int empty_rows = 0;
        for (int impl = 0; impl < FA_IMPL_COUNT; impl++) {
            fa_options opt = make_opt(&OPTS[oi], &g, (fa_impl)impl);
            tu_tensor o, lse;
            forward(&g, &opt, &o, &lse, FA_F64);
            const double tol = impl == FA_IMPL_REFERENCE ? 1e-12 : 2e-6;
            for (int64_t x = 0; x < B * SQ * H * DV; x++)
                if (!(fabs(((double *)o.mem)[x] - o_m[x]) <= tol))
                    fail_msg("%s, options %zu: O[%lld] = %.17g, model %.17g", fa_impl_name((fa_impl)impl), oi,
                             (long long)x, ((double *)o.mem)[x], o_m[x]);
            for (int64_t x = 0; x < B * H * SQ; x++) {
                if (!(fabs(((double *)lse.mem)[x] - l_m[x]) <= tol * 4))
                    fail_msg("%s, options %zu: LSE[%lld] = %.17g, model %.17g", fa_impl_name((fa_impl)impl), oi,
                             (long long)x, ((double *)lse.mem)[x], l_m[x]);
            }
            /* rows with no visible key: O = 0 exactly, LSE = the sink exactly */
            if (OPTS[oi].causal)
                for (int64_t b = 0; b < B; b++)
                    for (int64_t h = 0; h < H; h++)
                        for (int64_t i = 0; i < SQ - SK; i++) {
                            const int64_t ix1[1] = {h};
                            if (((double *)lse.mem)[(b * H + h) * SQ + i] != tu_get(&g.sinks, ix1))
                                fail_msg("%s: empty row %lld: LSE is not the sink", fa_impl_name((fa_impl)impl), (long long)i);
                            for (int64_t c = 0; c < DV; c++)
                                if (((double *)o.mem)[((b * SQ + i) * H + h) * DV + c] != 0.0)
                                    fail_msg("%s: empty row %lld: O is not 0", fa_impl_name((fa_impl)impl), (long long)i);
                            empty_rows++;
                        }
            tu_free(&o);
            tu_free(&lse);
        }
        if (OPTS[oi].causal) assert_true(empty_rows > 0);
    }
    free_data(&g);
}

/* loss = sum O * dO of the float64 reference forward */
static double loss(const void *ctx, const fa_options *opt)
{
    const data *g = ctx;
    tu_tensor o, lse;
    forward(g, opt, &o, &lse, FA_F64);
    double acc = 0.0;
    for (int64_t x = 0; x < B * SQ * H * DV; x++) acc += ((double *)o.mem)[x] * ((double *)g->dout.mem)[x];
    tu_free(&o);
    tu_free(&lse);
    return acc;
}

static void backward(const data *g, const fa_options *opt, tu_grads *gr)
{
    tu_backward(&g->q, &g->k, &g->v, &g->dout, opt, gr);
}

/* Ensure the reference backward's dq, dk, dv and dsinks are the derivatives of its forward. */
static void test_reference_backward_matches_finite_differences(void **state)
{
    (void)state;
    uint64_t rng = tu_seed() ^ 0x52;
    data g;
    make_data(&g, &rng, FA_F64);
    for (size_t oi = 0; oi < sizeof OPTS / sizeof OPTS[0]; oi++) {
        fa_options opt = make_opt(&OPTS[oi], &g, FA_IMPL_REFERENCE);
        tu_grads gr;
        backward(&g, &opt, &gr);
        tu_expect_fd(loss, &g, &opt, &g.sinks, &gr.dsinks, "dsinks");
        tu_expect_fd(loss, &g, &opt, &g.q, &gr.dq, "dq");
        tu_expect_fd(loss, &g, &opt, &g.k, &gr.dk, "dk");
        tu_expect_fd(loss, &g, &opt, &g.v, &gr.dv, "dv");
        /* the sinks' gradient is not trivially 0 */
        double mx = 0.0;
        for (int64_t h = 0; h < H; h++) mx = fmax(mx, fabs(((double *)gr.dsinks.mem)[h]));
        assert_true(mx > 1e-3);
        tu_free_grads(&gr);
    }
    free_data(&g);
}

/* Ensure flash's backward (with dsinks) matches the reference backward. */
static void test_flash_backward_matches_reference_with_sinks(void **state)
{
    (void)state;
    uint64_t rng = tu_seed() ^ 0x53;
    data g;
    make_data(&g, &rng, FA_F64);
    for (size_t oi = 0; oi < sizeof OPTS / sizeof OPTS[0]; oi++) {
        fa_options ro = make_opt(&OPTS[oi], &g, FA_IMPL_REFERENCE), fo = make_opt(&OPTS[oi], &g, FA_IMPL_FLASH);
        tu_grads r, f;
        backward(&g, &ro, &r);
        backward(&g, &fo, &f);
        tu_expect_close(&f.dq, &r.dq, 1e-5, "flash dq");
        tu_expect_close(&f.dk, &r.dk, 1e-5, "flash dk");
        tu_expect_close(&f.dv, &r.dv, 1e-5, "flash dv");
        tu_expect_close(&f.dsinks, &r.dsinks, 1e-5, "flash dsinks");
        /* without sinks the gradients differ: the sink is really in the backward */
        fa_options nosink = fo;
        nosink.sinks = NULL;
        tu_tensor dq = tu_alloc4(FA_F64, B, SQ, H, D, 0), dk = tu_alloc4(FA_F64, B, SK, HK, D, 0),
                  dv = tu_alloc4(FA_F64, B, SK, HK, DV, 0);
        assert_int_equal(fa_backward(&g.q.t, &g.k.t, &g.v.t, NULL, NULL, &g.dout.t, &dq.t, &dk.t, &dv.t, &nosink), FA_OK);
        int64_t where;
        assert_true(tu_max_abs_diff(&dv, &r.dv, &where) > 1e-3);
        tu_free(&dq); tu_free(&dk); tu_free(&dv);
        tu_free_grads(&r);
        tu_free_grads(&f);
    }
    free_data(&g);
}

/* Ensure check-grad's bf16/f16 baseline (the emulated backward) applies the sinks: it is within the
 * dtype's noise of the reference with sinks, and far closer to it than the reference without. */
static void test_emulated_backward_takes_sinks(void **state)
{
    (void)state;
    uint64_t rng = tu_seed() ^ 0x5e;
    data g;
    make_data(&g, &rng, FA_F64);
    for (size_t oi = 0; oi < sizeof OPTS / sizeof OPTS[0]; oi++) {
        const fa_options ro = make_opt(&OPTS[oi], &g, FA_IMPL_REFERENCE);
        fa_options nosink = ro;
        nosink.sinks = NULL;
        char what[64];
        snprintf(what, sizeof what, "sinks, options %zu", oi);
        tu_expect_emulated_feature(&g.q, &g.k, &g.v, &g.dout, &ro, &nosink, what);
    }
    free_data(&g);
}

/* Ensure varlen batches and KV caches take sinks: flash equals the reference. */
static void test_sinks_combine_with_varlen_and_kvcache(void **state)
{
    (void)state;
    uint64_t rng = tu_seed() ^ 0x54;
    const int64_t s1[1] = {H};
    tu_tensor sinks = tu_alloc(FA_F32, 1, s1);
    tu_fill(&sinks, &rng, -1, 2);
    /* varlen: 3 sequences, one of them empty in keys */
    const int32_t cuq[4] = {0, 3, 7, 12}, cuk[4] = {0, 5, 5, 11};
    const int64_t qs[3] = {12, H, D}, ks[3] = {11, HK, D}, vs[3] = {11, HK, DV}, os[3] = {12, H, DV}, ls[2] = {H, 12};
    tu_tensor q = tu_alloc(FA_F32, 3, qs), k = tu_alloc(FA_F32, 3, ks), v = tu_alloc(FA_F32, 3, vs);
    tu_fill(&q, &rng, -1.5, 1.5); tu_fill(&k, &rng, -1.5, 1.5); tu_fill(&v, &rng, -1, 1);
    fa_varlen vl = fa_varlen_default();
    vl.batch = 3;
    vl.cu_seqlens_q = cuq;
    vl.cu_seqlens_k = cuk;
    tu_tensor o[2], l[2];
    for (int x = 0; x < 2; x++) {
        o[x] = tu_alloc(FA_F64, 3, os);
        l[x] = tu_alloc(FA_F64, 2, ls);
        fa_options opt = fa_options_default();
        opt.varlen = &vl;
        opt.sinks = &sinks.t;
        opt.causal = 1;
        opt.impl = x ? FA_IMPL_FLASH : FA_IMPL_REFERENCE;
        opt.block_q = opt.block_k = 4;
        if (fa_forward(&q.t, &k.t, &v.t, &o[x].t, &l[x].t, &opt) != FA_OK) fail_msg("varlen: %s", fa_last_error());
    }
    tu_expect_close(&o[1], &o[0], 2e-6, "varlen flash O");
    tu_expect_close(&l[1], &l[0], 2e-6, "varlen flash LSE");
    /* sequence 1 has no keys: its rows are O = 0, LSE = sink */
    for (int64_t h = 0; h < H; h++) {
        const int64_t ix[1] = {h};
        for (int64_t r = 3; r < 7; r++) assert_true(((double *)l[1].mem)[h * 12 + r] == (double)tu_get(&sinks, ix));
    }
    for (int x = 0; x < 2; x++) { tu_free(&o[x]); tu_free(&l[x]); }
    tu_free(&q); tu_free(&k); tu_free(&v);

    /* KV cache with an append */
    tu_tensor qc = tu_alloc4(FA_F32, 2, 3, H, D, 0), kn = tu_alloc4(FA_F32, 2, 3, HK, D, 0),
              vn = tu_alloc4(FA_F32, 2, 3, HK, DV, 0);
    tu_fill(&qc, &rng, -1.5, 1.5); tu_fill(&kn, &rng, -1.5, 1.5); tu_fill(&vn, &rng, -1, 1);
    tu_tensor kc0 = tu_alloc4(FA_F32, 2, 20, HK, D, 0), vc0 = tu_alloc4(FA_F32, 2, 20, HK, DV, 0);
    tu_fill(&kc0, &rng, -1.5, 1.5); tu_fill(&vc0, &rng, -1, 1);
    const int32_t seqlens[2] = {9, 0};
    const int64_t cos[4] = {2, 3, H, DV}, cls[3] = {2, H, 3};
    for (int x = 0; x < 2; x++) {
        tu_tensor kc = tu_alloc4(FA_F32, 2, 20, HK, D, 0), vc = tu_alloc4(FA_F32, 2, 20, HK, DV, 0);
        memcpy(kc.mem, kc0.mem, kc.bytes);
        memcpy(vc.mem, vc0.mem, vc.bytes);
        fa_kvcache kv = fa_kvcache_default();
        kv.cache_seqlens = seqlens;
        kv.k_new = &kn.t;
        kv.v_new = &vn.t;
        o[x] = tu_alloc(FA_F64, 4, cos);
        l[x] = tu_alloc(FA_F64, 3, cls);
        fa_options opt = fa_options_default();
        opt.kvcache = &kv;
        opt.sinks = &sinks.t;
        opt.causal = 1;
        opt.impl = x ? FA_IMPL_FLASH : FA_IMPL_REFERENCE;
        if (fa_forward(&qc.t, &kc.t, &vc.t, &o[x].t, &l[x].t, &opt) != FA_OK) fail_msg("kvcache: %s", fa_last_error());
        tu_free(&kc); tu_free(&vc);
    }
    tu_expect_close(&o[1], &o[0], 2e-6, "kvcache flash O");
    tu_expect_close(&l[1], &l[0], 2e-6, "kvcache flash LSE");
    for (int x = 0; x < 2; x++) { tu_free(&o[x]); tu_free(&l[x]); }
    tu_free(&qc); tu_free(&kn); tu_free(&vn); tu_free(&kc0); tu_free(&vc0); tu_free(&sinks);
}

/* Ensure fa_check with sinks passes flash's output and fails one computed without sinks. */
static void test_check_judges_sinks(void **state)
{
    (void)state;
    uint64_t rng = tu_seed() ^ 0x55;
    data g;
    make_data(&g, &rng, FA_F32);
    fa_options opt = make_opt(&OPTS[1], &g, FA_IMPL_FLASH);
    tu_tensor o, lse;
    forward(&g, &opt, &o, &lse, FA_F32);
    fa_check_options co = fa_check_options_default();
    fa_check_report r = fa_check_report_init();
    assert_int_equal(fa_check(&g.q.t, &g.k.t, &g.v.t, &o.t, &lse.t, &opt, &co, &r), FA_OK);
    if (!r.pass) fail_msg("flash with sinks fails check (max err %g, bound %g; lse %g)", r.max_abs_err, r.bound, r.lse_max_abs_err);
    fa_check_report_free(&r);
    tu_free(&o); tu_free(&lse);
    fa_options nosink = opt;
    nosink.sinks = NULL;
    forward(&g, &nosink, &o, &lse, FA_F32);
    r = fa_check_report_init();
    assert_int_equal(fa_check(&g.q.t, &g.k.t, &g.v.t, &o.t, &lse.t, &opt, &co, &r), FA_OK);
    assert_false(r.out_pass);
    assert_false(r.lse_pass);
    fa_check_report_free(&r);
    tu_free(&o); tu_free(&lse);
    free_data(&g);
}

static void expect_refused(const data *g, const fa_options *opt, fa_status want, const char *text)
{
    tu_tensor o = tu_alloc4(FA_F32, B, SQ, H, DV, 0);
    const fa_status st = fa_forward(&g->q.t, &g->k.t, &g->v.t, &o.t, NULL, opt);
    if (st != want || !strstr(fa_last_error(), text))
        fail_msg("expected %s with '%s', got %s: %s", fa_status_string(want), text, fa_status_string(st), fa_last_error());
    assert_null(strchr(fa_last_error(), '\n'));
    tu_free(&o);
}

/* Ensure sinks of the wrong shape, dtype or value, and dsinks without sinks, are refused. */
static void test_bad_sinks_are_refused(void **state)
{
    (void)state;
    uint64_t rng = tu_seed() ^ 0x56;
    data g;
    make_data(&g, &rng, FA_F32);
    fa_options opt = make_opt(&OPTS[0], &g, FA_IMPL_FLASH);
    const int64_t s3[1] = {3}, s22[2] = {2, H};
    tu_tensor short_s = tu_alloc(FA_F32, 1, s3), two = tu_alloc(FA_F32, 2, s22), half = tu_alloc(FA_F16, 1, s22 + 1);
    tu_fill(&short_s, &rng, 0, 1); tu_fill(&two, &rng, 0, 1); tu_fill(&half, &rng, 0, 1);
    opt.sinks = &short_s.t;
    expect_refused(&g, &opt, FA_ERR_SHAPE, "sinks: shape must be [heads=4]");
    opt.sinks = &two.t;
    expect_refused(&g, &opt, FA_ERR_SHAPE, "sinks: shape must be [heads=4]");
    opt.sinks = &half.t;
    expect_refused(&g, &opt, FA_ERR_DTYPE, "sinks: dtype must be f32 or f64");
    opt.sinks = &g.sinks.t;
    ((float *)g.sinks.mem)[2] = NAN;
    expect_refused(&g, &opt, FA_ERR_NONFINITE, "sinks: element [2] is nan");
    ((float *)g.sinks.mem)[2] = INFINITY;
    expect_refused(&g, &opt, FA_ERR_NONFINITE, "sinks: element [2] is inf");
    ((float *)g.sinks.mem)[2] = 0.5f;
    { /* a finite float64 sink past FLT_MAX: said so, with digits that show it is past */
        const int64_t s4[1] = {H};
        tu_tensor big = tu_alloc(FA_F64, 1, s4);
        tu_fill(&big, &rng, 0, 1);
        ((double *)big.mem)[1] = 3.4028235e38;
        opt.sinks = &big.t;
        expect_refused(&g, &opt, FA_ERR_NONFINITE, "sinks: element [1] is 3.4028234999999999e+38, outside the float32 range");
        opt.sinks = &g.sinks.t;
        tu_free(&big);
    }
    /* dsinks without sinks; dsinks of the wrong shape */
    tu_tensor dq = tu_alloc4(FA_F32, B, SQ, H, D, 0), dk = tu_alloc4(FA_F32, B, SK, HK, D, 0),
              dv = tu_alloc4(FA_F32, B, SK, HK, DV, 0);
    fa_backward_extra ex;
    fa_backward_extra_init(&ex, sizeof ex);
    ex.dsinks = &short_s.t;
    assert_int_equal(fa_backward_ex(&g.q.t, &g.k.t, &g.v.t, NULL, NULL, &g.dout.t, &dq.t, &dk.t, &dv.t, &opt, &ex),
                     FA_ERR_SHAPE);
    assert_non_null(strstr(fa_last_error(), "dsinks: shape must be [heads=4]"));
    opt.sinks = NULL;
    ex.dsinks = &half.t;
    assert_int_equal(fa_backward_ex(&g.q.t, &g.k.t, &g.v.t, NULL, NULL, &g.dout.t, &dq.t, &dk.t, &dv.t, &opt, &ex),
                     FA_ERR_OPTION);
    assert_non_null(strstr(fa_last_error(), "fa_options.sinks is NULL"));
    ex.struct_size = 3;
    assert_int_equal(fa_backward_ex(&g.q.t, &g.k.t, &g.v.t, NULL, NULL, &g.dout.t, &dq.t, &dk.t, &dv.t, &opt, &ex),
                     FA_ERR_OPTION);
    assert_non_null(strstr(fa_last_error(), "fa_backward_extra_init"));
    tu_free(&dq); tu_free(&dk); tu_free(&dv);
    tu_free(&short_s); tu_free(&two); tu_free(&half);
    free_data(&g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forward_matches_dense_model_with_sinks),
        cmocka_unit_test(test_reference_backward_matches_finite_differences),
        cmocka_unit_test(test_flash_backward_matches_reference_with_sinks),
        cmocka_unit_test(test_emulated_backward_takes_sinks),
        cmocka_unit_test(test_sinks_combine_with_varlen_and_kvcache),
        cmocka_unit_test(test_check_judges_sinks),
        cmocka_unit_test(test_bad_sinks_are_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
