/*
 * test_dropout.c — dropout with a caller-supplied keep-mask (fa_options::dropout,
 * fa_dropout): O = (P o Z / (1 - p)) V, the LSE of the undropped scores.
 *
 * What must hold:
 *   - the reference equals a plain dense float64 model written here, under
 *     causal, window, softcap and ALiBi (and with sinks);
 *   - flash and standard match the reference to float32 rounding, with a
 *     strided (BHSD-like) mask too;
 *   - the reference backward (same mask) equals central finite differences of
 *     the float64 reference forward; flash's backward matches the reference's;
 *   - varlen batches take a [batch, heads, max_q, max_k] mask;
 *   - fa_check with dropout passes flash's output and fails one computed with
 *     another mask;
 *   - bad p, a mask value other than 0/1 (named by its index), a wrong shape,
 *     dropout with a KV cache are refused.
 */
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define B 2
#define SQ 7
#define SK 5
#define H 4
#define HK 2
#define D 8
#define DV 6
#define P_DROP 0.3

typedef struct opt_case {
    int causal;
    int64_t wl, wr;
    double softcap;
    int alibi;
    int sinks;
} opt_case;

static const opt_case OPTS[] = {
    {0, -1, -1, 0.0, 0, 0}, {1, -1, -1, 0.0, 0, 0}, {0, 1, 0, 3.0, 1, 0}, {1, 2, -1, 0.0, 1, 1},
};

typedef struct data {
    tu_tensor q, k, v, dout, sinks, slopes;
    uint8_t keep[B * H * SQ * SK];
    fa_dropout drop;
} data;

static void make_data(data *g, uint64_t *rng, fa_dtype dt)
{
    g->q = tu_alloc4(dt, B, SQ, H, D, 0);
    g->k = tu_alloc4(dt, B, SK, HK, D, 0);
    g->v = tu_alloc4(dt, B, SK, HK, DV, 0);
    g->dout = tu_alloc4(dt, B, SQ, H, DV, 0);
    const int64_t s1[1] = {H};
    g->sinks = tu_alloc(FA_F64, 1, s1);
    g->slopes = tu_alloc(FA_F64, 1, s1);
    tu_fill(&g->q, rng, -1.5, 1.5);
    tu_fill(&g->k, rng, -1.5, 1.5);
    tu_fill(&g->v, rng, -1, 1);
    tu_fill(&g->dout, rng, -1, 1);
    tu_fill(&g->sinks, rng, -1, 2.5);
    tu_fill(&g->slopes, rng, 0.1, 0.6);
    for (size_t x = 0; x < sizeof g->keep; x++) g->keep[x] = tu_uniform(rng, 0, 1) >= P_DROP;
    fa_dropout_init(&g->drop, sizeof g->drop);
    g->drop.p = P_DROP;
    g->drop.keep_mask = g->keep;
    const int64_t ks[4] = {B, H, SQ, SK};
    memcpy(g->drop.keep_shape, ks, sizeof ks);
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
    opt.sinks = oc->sinks ? &g->sinks.t : NULL;
    opt.dropout = &g->drop;
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

/* The dense model, from the definition: O [B][SQ][H][DV], LSE [B][H][SQ] in float64. */
static void dense_model(const data *g, const opt_case *oc, double *o, double *lse)
{
    const double scale = 1.0 / sqrt((double)D);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < SQ; i++) {
                const int64_t hk = h / (H / HK), diag = i + SK - SQ;
                const int64_t ix1[1] = {h};
                const double sink = oc->sinks ? tu_get(&g->sinks, ix1) : -INFINITY;
                const double slope = oc->alibi ? tu_get(&g->slopes, ix1) : 0.0;
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
                double z = m == -INFINITY ? 0.0 : exp(sink - m);
                int any = 0;
                for (int64_t j = 0; j < SK; j++) if (vis[j]) { z += exp(s[j] - m); any = 1; }
                const double L = any || oc->sinks ? m + log(z) : -INFINITY;
                lse[(b * H + h) * SQ + i] = L;
                for (int64_t c = 0; c < DV; c++) {
                    double acc = 0.0;
                    for (int64_t j = 0; j < SK; j++)
                        if (vis[j] && g->keep[((b * H + h) * SQ + i) * SK + j])
                            acc += exp(s[j] - L) / (1.0 - P_DROP) * at4(&g->v, b, j, hk, c);
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

/* Ensure the reference, flash and standard give the dense model's O and LSE under dropout. */
static void test_forward_matches_dense_model_with_dropout(void **state)
{
    (void)state;
    uint64_t rng = tu_seed() ^ 0x61;
    data g;
    make_data(&g, &rng, FA_F64);
    for (size_t oi = 0; oi < sizeof OPTS / sizeof OPTS[0]; oi++) {
        double o_m[B * SQ * H * DV], l_m[B * H * SQ];
        dense_model(&g, &OPTS[oi], o_m, l_m);
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
                const double a = ((double *)lse.mem)[x];
                if (!(a == l_m[x] || fabs(a - l_m[x]) <= tol * 4))
                    fail_msg("%s, options %zu: LSE[%lld] = %.17g, model %.17g (undropped)", fa_impl_name((fa_impl)impl),
                             oi, (long long)x, a, l_m[x]);
            }
            tu_free(&o);
            tu_free(&lse);
        }
    }
    free_data(&g);
}

/* Ensure a strided keep-mask (BHSD bytes stored as [B][SQ][H][SK]) gives the contiguous mask's bits. */
static void test_strided_mask_is_the_same_mask(void **state)
{
    (void)state;
    uint64_t rng = tu_seed() ^ 0x62;
    data g;
    make_data(&g, &rng, FA_F32);
    uint8_t *bshd = malloc(sizeof g.keep);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < SQ; i++)
                for (int64_t j = 0; j < SK; j++)
                    bshd[((b * SQ + i) * H + h) * SK + j] = g.keep[((b * H + h) * SQ + i) * SK + j];
    for (int impl = 0; impl < FA_IMPL_COUNT; impl++) {
        fa_options opt = make_opt(&OPTS[1], &g, (fa_impl)impl);
        tu_tensor o1, l1, o2, l2;
        forward(&g, &opt, &o1, &l1, FA_F32);
        fa_dropout d2 = g.drop;
        d2.keep_mask = bshd;
        const int64_t st[4] = {SQ * H * SK, SK, H * SK, 1};
        memcpy(d2.keep_stride, st, sizeof st);
        opt.dropout = &d2;
        forward(&g, &opt, &o2, &l2, FA_F32);
        assert_memory_equal(o1.mem, o2.mem, o1.bytes);
        assert_memory_equal(l1.mem, l2.mem, l1.bytes);
        tu_free(&o1); tu_free(&l1); tu_free(&o2); tu_free(&l2);
    }
    free(bshd);
    free_data(&g);
}

/* Ensure the reference backward under dropout is the derivative of its forward (same mask). */
static void test_reference_backward_matches_finite_differences(void **state)
{
    (void)state;
    uint64_t rng = tu_seed() ^ 0x63;
    data g;
    make_data(&g, &rng, FA_F64);
    for (size_t oi = 0; oi < sizeof OPTS / sizeof OPTS[0]; oi++) {
        fa_options opt = make_opt(&OPTS[oi], &g, FA_IMPL_REFERENCE);
        tu_grads gr;
        backward(&g, &opt, &gr);
        tu_expect_fd(loss, &g, &opt, &g.q, &gr.dq, "dq");
        tu_expect_fd(loss, &g, &opt, &g.k, &gr.dk, "dk");
        tu_expect_fd(loss, &g, &opt, &g.v, &gr.dv, "dv");
        if (OPTS[oi].sinks) tu_expect_fd(loss, &g, &opt, &g.sinks, &gr.dsinks, "dsinks");
        tu_free_grads(&gr);
    }
    free_data(&g);
}

/* Ensure flash's backward under dropout matches the reference backward, and the mask matters. */
static void test_flash_backward_matches_reference_with_dropout(void **state)
{
    (void)state;
    uint64_t rng = tu_seed() ^ 0x64;
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
        if (OPTS[oi].sinks) tu_expect_close(&f.dsinks, &r.dsinks, 1e-5, "flash dsinks");
        /* without dropout the gradients differ */
        fa_options nodrop = fo;
        nodrop.dropout = NULL;
        nodrop.sinks = NULL;
        tu_tensor dq = tu_alloc4(FA_F64, B, SQ, H, D, 0), dk = tu_alloc4(FA_F64, B, SK, HK, D, 0),
                  dv = tu_alloc4(FA_F64, B, SK, HK, DV, 0);
        assert_int_equal(fa_backward(&g.q.t, &g.k.t, &g.v.t, NULL, NULL, &g.dout.t, &dq.t, &dk.t, &dv.t, &nodrop), FA_OK);
        int64_t where;
        assert_true(tu_max_abs_diff(&dv, &r.dv, &where) > 1e-3);
        assert_true(tu_max_abs_diff(&dq, &r.dq, &where) > 1e-4);
        tu_free(&dq); tu_free(&dk); tu_free(&dv);
        tu_free_grads(&r);
        tu_free_grads(&f);
    }
    free_data(&g);
}

/* Ensure check-grad's bf16/f16 baseline (the emulated backward) applies the keep-mask and its
 * 1/(1-p): within the dtype's noise of the reference with dropout, far closer to it than without. */
static void test_emulated_backward_takes_dropout(void **state)
{
    (void)state;
    uint64_t rng = tu_seed() ^ 0x6e;
    data g;
    make_data(&g, &rng, FA_F64);
    for (size_t oi = 0; oi < sizeof OPTS / sizeof OPTS[0]; oi++) {
        const fa_options ro = make_opt(&OPTS[oi], &g, FA_IMPL_REFERENCE);
        fa_options nodrop = ro;
        nodrop.dropout = NULL;
        char what[64];
        snprintf(what, sizeof what, "dropout, options %zu", oi);
        tu_expect_emulated_feature(&g.q, &g.k, &g.v, &g.dout, &ro, &nodrop, what);
    }
    free_data(&g);
}

/* Ensure a varlen batch takes a [batch, heads, max_q, max_k] mask: each sequence equals itself alone. */
static void test_dropout_with_varlen(void **state)
{
    (void)state;
    uint64_t rng = tu_seed() ^ 0x65;
    const int32_t cuq[4] = {0, 3, 7, 12}, cuk[4] = {0, 5, 5, 11};
    enum { NB = 3, MQ = 5, MK = 6 };
    const int64_t qs[3] = {12, H, D}, ks[3] = {11, HK, D}, vs[3] = {11, HK, DV}, os[3] = {12, H, DV}, ls[2] = {H, 12};
    tu_tensor q = tu_alloc(FA_F32, 3, qs), k = tu_alloc(FA_F32, 3, ks), v = tu_alloc(FA_F32, 3, vs);
    tu_fill(&q, &rng, -1.5, 1.5); tu_fill(&k, &rng, -1.5, 1.5); tu_fill(&v, &rng, -1, 1);
    uint8_t keep[NB * H * MQ * MK];
    for (size_t x = 0; x < sizeof keep; x++) keep[x] = tu_uniform(&rng, 0, 1) >= P_DROP;
    fa_dropout dr = fa_dropout_default();
    dr.p = P_DROP;
    dr.keep_mask = keep;
    const int64_t kshape[4] = {NB, H, MQ, MK};
    memcpy(dr.keep_shape, kshape, sizeof kshape);
    fa_varlen vl = fa_varlen_default();
    vl.batch = NB;
    vl.cu_seqlens_q = cuq;
    vl.cu_seqlens_k = cuk;
    for (int impl = 0; impl < 2; impl++) {
        tu_tensor o = tu_alloc(FA_F32, 3, os), l = tu_alloc(FA_F32, 2, ls);
        fa_options opt = fa_options_default();
        opt.varlen = &vl;
        opt.dropout = &dr;
        opt.causal = 1;
        opt.impl = impl ? FA_IMPL_FLASH : FA_IMPL_REFERENCE;
        opt.block_q = opt.block_k = 4;
        if (fa_forward(&q.t, &k.t, &v.t, &o.t, &l.t, &opt) != FA_OK) fail_msg("varlen: %s", fa_last_error());
        for (int64_t b = 0; b < NB; b++) {
            const int64_t nq = cuq[b + 1] - cuq[b], nk = cuk[b + 1] - cuk[b];
            if (nq == 0) continue;
            /* sequence b alone, with its corner of the mask */
            fa_tensor qb = q.t, kb = k.t, vb = v.t;
            qb.rank = kb.rank = vb.rank = 4;
            const int64_t q4[4] = {1, nq, H, D}, k4[4] = {1, nk, HK, D}, v4[4] = {1, nk, HK, DV};
            fa_tensor_make(&qb, (float *)q.mem + cuq[b] * H * D, FA_F32, 4, q4, NULL);
            fa_tensor_make(&kb, (float *)k.mem + cuk[b] * HK * D, FA_F32, 4, k4, NULL);
            fa_tensor_make(&vb, (float *)v.mem + cuk[b] * HK * DV, FA_F32, 4, v4, NULL);
            fa_dropout d1 = dr;
            d1.keep_mask = keep + b * H * MQ * MK;
            const int64_t sh1[4] = {1, H, nq, nk}, st1[4] = {H * MQ * MK, MQ * MK, MK, 1};
            memcpy(d1.keep_shape, sh1, sizeof sh1);
            memcpy(d1.keep_stride, st1, sizeof st1);
            tu_tensor ob = tu_alloc4(FA_F32, 1, nq, H, DV, 0);
            fa_options o1 = opt;
            o1.varlen = NULL;
            o1.dropout = &d1;
            if (fa_forward(&qb, &kb, &vb, &ob.t, NULL, &o1) != FA_OK) fail_msg("sequence alone: %s", fa_last_error());
            if (memcmp((float *)o.mem + cuq[b] * H * DV, ob.mem, ob.bytes) != 0)
                fail_msg("%s: varlen sequence %lld differs from itself alone", fa_impl_name(opt.impl), (long long)b);
            tu_free(&ob);
        }
        tu_free(&o); tu_free(&l);
    }
    /* the backward of the varlen batch: flash equals the reference (the same mask corners) */
    tu_tensor dout = tu_alloc(FA_F32, 3, os);
    tu_fill(&dout, &rng, -1, 1);
    tu_tensor g[2][3];
    for (int impl = 0; impl < 2; impl++) {
        g[impl][0] = tu_alloc(FA_F64, 3, qs);
        g[impl][1] = tu_alloc(FA_F64, 3, ks);
        g[impl][2] = tu_alloc(FA_F64, 3, vs);
        fa_options opt = fa_options_default();
        opt.varlen = &vl;
        opt.dropout = &dr;
        opt.causal = 1;
        opt.impl = impl ? FA_IMPL_FLASH : FA_IMPL_REFERENCE;
        opt.block_q = opt.block_k = 4;
        if (fa_backward(&q.t, &k.t, &v.t, NULL, NULL, &dout.t, &g[impl][0].t, &g[impl][1].t, &g[impl][2].t, &opt) != FA_OK)
            fail_msg("varlen backward: %s", fa_last_error());
    }
    tu_expect_close(&g[1][0], &g[0][0], 1e-5, "varlen flash dq");
    tu_expect_close(&g[1][1], &g[0][1], 1e-5, "varlen flash dk");
    tu_expect_close(&g[1][2], &g[0][2], 1e-5, "varlen flash dv");
    for (int impl = 0; impl < 2; impl++)
        for (int x = 0; x < 3; x++) tu_free(&g[impl][x]);
    tu_free(&dout);
    tu_free(&q); tu_free(&k); tu_free(&v);
}

/* Ensure fa_check with dropout passes flash's output and fails an output with another mask. */
static void test_check_judges_dropout(void **state)
{
    (void)state;
    uint64_t rng = tu_seed() ^ 0x66;
    data g;
    make_data(&g, &rng, FA_F32);
    fa_options opt = make_opt(&OPTS[1], &g, FA_IMPL_FLASH);
    tu_tensor o, lse;
    forward(&g, &opt, &o, &lse, FA_F32);
    fa_check_options co = fa_check_options_default();
    fa_check_report r = fa_check_report_init();
    assert_int_equal(fa_check(&g.q.t, &g.k.t, &g.v.t, &o.t, &lse.t, &opt, &co, &r), FA_OK);
    if (!r.pass) fail_msg("flash with dropout fails check (max err %g, bound %g)", r.max_abs_err, r.bound);
    fa_check_report_free(&r);
    tu_free(&o); tu_free(&lse);
    /* one kept element dropped: that row must fail, and only through O (the LSE is undropped).
     * The element: the first kept key of the last query row of some (batch, head) — a last row
     * sees every key under the causal mask, and all 5 of one row are dropped for 0.3^5 of the
     * seeds (FA_TEST_SEED=1796461307528732 dropped them all in the very last row) */
    data g2 = g;
    int64_t flip = -1;
    for (int64_t bh = B * H - 1; bh >= 0 && flip < 0; bh--)
        for (int64_t x = (bh * SQ + SQ - 1) * SK; x < (bh * SQ + SQ) * SK; x++)
            if (g2.keep[x]) { flip = x; break; }
    assert_true(flip >= 0);
    g2.keep[flip] = 0;
    g2.drop.keep_mask = g2.keep;
    fa_options opt2 = make_opt(&OPTS[1], &g2, FA_IMPL_FLASH);
    forward(&g2, &opt2, &o, &lse, FA_F32);
    r = fa_check_report_init();
    assert_int_equal(fa_check(&g.q.t, &g.k.t, &g.v.t, &o.t, &lse.t, &opt, &co, &r), FA_OK);
    assert_false(r.out_pass);
    assert_true(r.lse_pass);
    assert_int_equal(r.rows_failed, 1);
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

/* Ensure an Inf in a dropped key's V row is treated alike by every implementation: the dropped P
 * (0) still multiplies V, as (P o Z) V does on the GPU, so the column is NaN in the rows that see
 * the key, in reference, standard and flash; the other columns stay finite and agree. */
static void test_inf_in_dropped_v_is_the_same_everywhere(void **state)
{
    (void)state;
    uint64_t rng = tu_seed() ^ 0xd70b1fu;
    data g;
    make_data(&g, &rng, FA_F32);
    const int64_t key = 2, col = 3;
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < SQ; i++) g.keep[((b * H + h) * SQ + i) * SK + key] = 0; /* dropped everywhere */
    for (int64_t b = 0; b < B; b++)
        for (int64_t hk = 0; hk < HK; hk++) ((float *)g.v.mem)[((b * SK + key) * HK + hk) * DV + col] = INFINITY;
    static const fa_impl impls[] = {FA_IMPL_REFERENCE, FA_IMPL_STANDARD, FA_IMPL_FLASH};
    tu_tensor o[3], lse[3];
    for (int x = 0; x < 3; x++) {
        fa_options opt = make_opt(&OPTS[0], &g, impls[x]);
        forward(&g, &opt, &o[x], &lse[x], FA_F32);
    }
    for (int64_t e = 0; e < B * SQ * H * DV; e++) {
        const int nan0 = isnan(((float *)o[0].mem)[e]);
        if (e % DV == col && !nan0) fail_msg("reference: element %lld should be NaN (0 x Inf)", (long long)e);
        for (int x = 1; x < 3; x++) {
            const float a = ((float *)o[0].mem)[e], c = ((float *)o[x].mem)[e];
            if (isnan(c) != nan0)
                fail_msg("%s: element %lld is %g, reference %g", fa_impl_name(impls[x]), (long long)e, c, a);
            if (!nan0 && fabs(c - a) > 1e-5) fail_msg("%s: element %lld %g vs %g", fa_impl_name(impls[x]), (long long)e, c, a);
        }
    }
    for (int x = 0; x < 3; x++) { tu_free(&o[x]); tu_free(&lse[x]); }
    free_data(&g);
}

/* Ensure a bad p, a mask byte other than 0/1, a wrong mask shape and dropout with a KV cache are refused. */
static void test_bad_dropout_is_refused(void **state)
{
    (void)state;
    uint64_t rng = tu_seed() ^ 0x67;
    data g;
    make_data(&g, &rng, FA_F32);
    fa_options opt = make_opt(&OPTS[0], &g, FA_IMPL_FLASH);
    g.drop.p = 1.0;
    expect_refused(&g, &opt, FA_ERR_OPTION, "dropout p must be in [0, 1) (got 1)");
    g.drop.p = -0.1;
    expect_refused(&g, &opt, FA_ERR_OPTION, "dropout p must be in [0, 1)");
    g.drop.p = NAN;
    expect_refused(&g, &opt, FA_ERR_OPTION, "dropout p must be in [0, 1)");
    g.drop.p = P_DROP;
    g.keep[((1 * H + 2) * SQ + 3) * SK + 4] = 7;
    g.drop.keep_mask_name = "mask.npy";
    expect_refused(&g, &opt, FA_ERR_INDEX, "mask.npy: element [1,2,3,4] is 7; a keep-mask holds 0 (drop) or 1 (keep)");
    g.keep[((1 * H + 2) * SQ + 3) * SK + 4] = 1;
    g.drop.keep_shape[3] = SK + 1;
    expect_refused(&g, &opt, FA_ERR_SHAPE, "mask.npy: shape [2,4,7,6] should be [batch=2, heads=4, seqlen_q=7, seqlen_k=5]");
    g.drop.keep_shape[3] = SK;
    g.drop.keep_mask = NULL;
    expect_refused(&g, &opt, FA_ERR_NULL_ARG, "the keep-mask is NULL");
    g.drop.keep_mask = g.keep;
    g.drop.struct_size = 5;
    expect_refused(&g, &opt, FA_ERR_OPTION, "fa_dropout_init");
    g.drop.struct_size = sizeof g.drop;
    /* a KV cache takes no dropout */
    const int32_t seqlens[B] = {3, 4};
    fa_kvcache kv = fa_kvcache_default();
    kv.cache_seqlens = seqlens;
    opt.kvcache = &kv;
    expect_refused(&g, &opt, FA_ERR_OPTION, "dropout cannot be combined with a KV cache");
    free_data(&g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forward_matches_dense_model_with_dropout),
        cmocka_unit_test(test_strided_mask_is_the_same_mask),
        cmocka_unit_test(test_reference_backward_matches_finite_differences),
        cmocka_unit_test(test_flash_backward_matches_reference_with_dropout),
        cmocka_unit_test(test_emulated_backward_takes_dropout),
        cmocka_unit_test(test_dropout_with_varlen),
        cmocka_unit_test(test_check_judges_dropout),
        cmocka_unit_test(test_inf_in_dropped_v_is_the_same_everywhere),
        cmocka_unit_test(test_bad_dropout_is_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
