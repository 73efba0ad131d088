/*
 * test_backward.c — the backward pass (fa_backward): flash against the
 * float64 reference, and the reference against finite differences.
 *
 * Two independent checks, because a reference that only agrees with itself
 * proves nothing:
 *
 *  1. The reference backward against central differences of the float64
 *     reference FORWARD: for loss L = sum(dO o O(q, k, v)), dL/dx for a few
 *     random elements x of q, k and v is (L(x + h) - L(x - h)) / 2h, with
 *     h = 1e-4 on inputs of size ~1. Truncation error is h^2/6 |L'''| ~ 1e-9
 *     and rounding ~ eps |L| / h ~ 1e-11, so we require
 *         |fd - grad| <= 1e-6 * max(1, |grad|).
 *     This pins down the math itself: softmax Jacobian, softcap derivative,
 *     ALiBi, masks, GQA sums, scale.
 *
 *  2. flash (float32, tiled, P recomputed from the LSE) against the reference
 *     (float64) on fresh random inputs over a grid of shapes and options, with
 *     outputs poisoned with NaN so every element must be written. For each of
 *     dQ, dK, dV we require
 *         max |flash - ref| <= 2e-5 * max(1, max |ref|)
 *     plus, for f16/bf16 gradient outputs, the worst rounding of the largest
 *     value: max|ref| * 2^-11 (f16) or 2^-8 (bf16).
 *     Why 2e-5: float32 has eps = 6e-8; the gradients are sums over a few
 *     hundred keys (or queries x group heads) of products of d <= 72 terms,
 *     and dS = P (dP - D) subtracts nearly equal numbers; measured over many
 *     seeds the error stays below 1e-6 of max(1, max|ref|) (softcap and
 *     range-3 logits included), so 2e-5 is a 20x margin, while a wrong mask,
 *     a dropped tile, a missing head sum or a missing softcap derivative give
 *     errors of order max|ref| (each was injected once to see this test fail).
 *
 *  3. Both are deterministic: 1, 2 and 3 threads give identical bits, and
 *     flash's two ways of packing operands (shared per kv head, or per tile
 *     for long sequences: FA_FLASH_SHARED_MAX=0) give identical bits, as do
 *     its single pass and its two passes (FA_BWD_ONE_PASS=1 and 0), each
 *     checked against the other on every case above.
 *
 * Seeds are printed by test_util (FA_TEST_SEED replays a run).
 */
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "kernels/kernels.h"

#define FLASH_REL_TOL 2e-5
#define FD_TOL 1e-6
#define FD_STEP 1e-4

typedef struct bcase {
    int64_t B, Sq, Sk, H, Hk, d, dv;
    int causal;
    int64_t wl, wr;      /* < 0: unbounded */
    double softcap;
    int alibi;           /* 0 off, 1 per head, 2 per batch x head */
    fa_dtype in_dtype;   /* q, k, v, dout */
    fa_dtype grad_dtype; /* dq, dk, dv of the flash run */
    int bhsd;            /* BHSD strides for every rank-4 tensor */
    int bq, bk;          /* block overrides (0 = default) */
    double range;        /* q, k uniform in [-range, range) */
    double scale;        /* 0 = default */
    int pass_o_lse;      /* 1: hand O and LSE to fa_backward; 0: NULL (recomputed) */
} bcase;

static bcase base_case(int64_t Sq, int64_t Sk, int64_t d)
{
    bcase c;
    memset(&c, 0, sizeof c);
    c.B = 1; c.Sq = Sq; c.Sk = Sk; c.H = 2; c.Hk = 2; c.d = d; c.dv = d;
    c.wl = -1; c.wr = -1;
    c.in_dtype = FA_F32; c.grad_dtype = FA_F32;
    c.range = 1.0;
    c.pass_o_lse = 1;
    return c;
}

static void describe(const bcase *c, char *buf, size_t n)
{
    snprintf(buf, n,
             "B=%lld Sq=%lld Sk=%lld H=%lld Hk=%lld d=%lld dv=%lld causal=%d window=(%lld,%lld) "
             "softcap=%g alibi=%d in=%s grad=%s bhsd=%d blocks=(%d,%d) range=%g scale=%g o_lse=%d",
             (long long)c->B, (long long)c->Sq, (long long)c->Sk, (long long)c->H, (long long)c->Hk,
             (long long)c->d, (long long)c->dv, c->causal, (long long)c->wl, (long long)c->wr,
             c->softcap, c->alibi, fa_dtype_name(c->in_dtype), fa_dtype_name(c->grad_dtype), c->bhsd,
             c->bq, c->bk, c->range, c->scale, c->pass_o_lse);
}

/* Inputs of one case: q, k, v, dout, ALiBi slopes, options. */
typedef struct binputs {
    tu_tensor q, k, v, dout, slopes;
    fa_options opt;
} binputs;

/* Filled in place: in->opt.alibi_slopes points into *in. */
static void make_inputs(binputs *inp, const bcase *c, uint64_t *rng)
{
    binputs in;
    memset(&in, 0, sizeof in);
    in.q = tu_alloc4(c->in_dtype, c->B, c->Sq, c->H, c->d, c->bhsd);
    in.k = tu_alloc4(c->in_dtype, c->B, c->Sk, c->Hk, c->d, c->bhsd);
    in.v = tu_alloc4(c->in_dtype, c->B, c->Sk, c->Hk, c->dv, c->bhsd);
    in.dout = tu_alloc4(c->in_dtype, c->B, c->Sq, c->H, c->dv, c->bhsd);
    tu_fill(&in.q, rng, -c->range, c->range);
    tu_fill(&in.k, rng, -c->range, c->range);
    tu_fill(&in.v, rng, -1.0, 1.0);
    tu_fill(&in.dout, rng, -1.0, 1.0);
    in.opt = fa_options_default();
    in.opt.causal = c->causal;
    in.opt.window_left = c->wl;
    in.opt.window_right = c->wr;
    in.opt.softcap = c->softcap;
    in.opt.scale = c->scale;
    in.opt.block_q = c->bq;
    in.opt.block_k = c->bk;
    if (c->alibi) {
        int64_t shape[2] = {c->B, c->H};
        in.slopes = c->alibi == 1 ? tu_alloc(FA_F32, 1, shape + 1) : tu_alloc(FA_F32, 2, shape);
        tu_fill(&in.slopes, rng, 0.0, 0.5);
    }
    *inp = in;
    if (c->alibi) inp->opt.alibi_slopes = &inp->slopes.t;
}

static void free_inputs(binputs *in)
{
    tu_free(&in->q); tu_free(&in->k); tu_free(&in->v); tu_free(&in->dout);
    if (in->opt.alibi_slopes) tu_free(&in->slopes);
}

static double max_abs(const tu_tensor *t)
{
    /* max |x| via the diff against a zero tensor of the same layout */
    tu_tensor z = tu_alloc4(FA_F64, t->t.shape[0], t->t.shape[1], t->t.shape[2], t->t.shape[3], 0);
    memset(z.mem, 0, z.bytes);
    int64_t where;
    double m = tu_max_abs_diff(t, &z, &where);
    tu_free(&z);
    return m;
}

/* ------------------------------------------------------------------------ */
/* flash vs reference                                                         */
/* ------------------------------------------------------------------------ */

/* Run one case: reference backward (float64 O, LSE given) vs flash backward. */
static void run_case(const bcase *c)
{
    static uint64_t counter;
    uint64_t rng = tu_seed() + 104729 * ++counter;
    binputs in;
    make_inputs(&in, c, &rng);
    char what[600];
    describe(c, what, sizeof what);

    /* forward results: float64 reference for the reference backward, flash's own for flash */
    tu_tensor o_ref = tu_alloc4(FA_F64, c->B, c->Sq, c->H, c->dv, 0);
    tu_tensor o_fl = tu_alloc4(FA_F32, c->B, c->Sq, c->H, c->dv, c->bhsd);
    int64_t lse_shape[3] = {c->B, c->H, c->Sq};
    tu_tensor lse_ref = tu_alloc(FA_F64, 3, lse_shape);
    tu_tensor lse_fl = tu_alloc(FA_F32, 3, lse_shape);
    fa_options opt = in.opt;
    opt.impl = FA_IMPL_REFERENCE;
    if (fa_forward(&in.q.t, &in.k.t, &in.v.t, &o_ref.t, &lse_ref.t, &opt) != FA_OK)
        fail_msg("reference forward failed: %s (%s)", fa_last_error(), what);
    opt.impl = FA_IMPL_FLASH;
    if (fa_forward(&in.q.t, &in.k.t, &in.v.t, &o_fl.t, &lse_fl.t, &opt) != FA_OK)
        fail_msg("flash forward failed: %s (%s)", fa_last_error(), what);

    tu_tensor g_ref[3], g_fl[3];
    const int64_t shp[3][4] = {{c->B, c->Sq, c->H, c->d}, {c->B, c->Sk, c->Hk, c->d}, {c->B, c->Sk, c->Hk, c->dv}};
    for (int x = 0; x < 3; x++) {
        g_ref[x] = tu_alloc4(FA_F64, shp[x][0], shp[x][1], shp[x][2], shp[x][3], 0);
        g_fl[x] = tu_alloc4(c->grad_dtype, shp[x][0], shp[x][1], shp[x][2], shp[x][3], c->bhsd);
        tu_poison(&g_ref[x]);
        tu_poison(&g_fl[x]);
    }
    opt.impl = FA_IMPL_REFERENCE;
    fa_status st = fa_backward(&in.q.t, &in.k.t, &in.v.t, &o_ref.t, &lse_ref.t, &in.dout.t, &g_ref[0].t,
                               &g_ref[1].t, &g_ref[2].t, &opt);
    if (st != FA_OK) fail_msg("reference backward failed: %s (%s)", fa_last_error(), what);
    opt.impl = FA_IMPL_FLASH;
    st = fa_backward(&in.q.t, &in.k.t, &in.v.t, c->pass_o_lse ? &o_fl.t : NULL,
                     c->pass_o_lse ? &lse_fl.t : NULL, &in.dout.t, &g_fl[0].t, &g_fl[1].t, &g_fl[2].t, &opt);
    if (st != FA_OK) fail_msg("flash backward failed: %s (%s)", fa_last_error(), what);

    /* the per-tile packing path (long sequences) must give the same bits as the shared one, and
     * the single pass (FA_BWD_ONE_PASS=1) the bits of the two passes (0), either packing */
    for (int variant = 0; variant < 4; variant++) {
        tu_tensor g_pt[3];
        for (int x = 0; x < 3; x++) {
            g_pt[x] = tu_alloc4(c->grad_dtype, shp[x][0], shp[x][1], shp[x][2], shp[x][3], c->bhsd);
            tu_poison(&g_pt[x]);
        }
        opt.pack_max_bytes = variant & 1 ? 0 : -1;
        fa_bwd_one_pass_test = variant >> 1;
        st = fa_backward(&in.q.t, &in.k.t, &in.v.t, c->pass_o_lse ? &o_fl.t : NULL,
                         c->pass_o_lse ? &lse_fl.t : NULL, &in.dout.t, &g_pt[0].t, &g_pt[1].t, &g_pt[2].t, &opt);
        fa_bwd_one_pass_test = -1;
        opt.pack_max_bytes = -1;
        if (st != FA_OK)
            fail_msg("flash backward (%s, %s packing) failed: %s (%s)", variant >> 1 ? "one pass" : "two passes",
                     variant & 1 ? "per-tile" : "shared", fa_last_error(), what);
        for (int x = 0; x < 3; x++) {
            if (memcmp(g_pt[x].mem, g_fl[x].mem, g_fl[x].bytes) != 0)
                fail_msg("flash gradient %d: %s with %s packing differs from the default run in the bits (%s)", x,
                         variant >> 1 ? "one pass" : "two passes", variant & 1 ? "per-tile" : "shared", what);
            tu_free(&g_pt[x]);
        }
    }

    static const char *names[3] = {"dQ", "dK", "dV"};
    for (int x = 0; x < 3; x++) {
        if (tu_count_nan(&g_ref[x]) != 0)
            fail_msg("reference %s: %lld unwritten (NaN) elements (%s)", names[x],
                     (long long)tu_count_nan(&g_ref[x]), what);
        if (tu_count_nan(&g_fl[x]) != 0)
            fail_msg("flash %s: %lld unwritten (NaN) elements (%s)", names[x], (long long)tu_count_nan(&g_fl[x]),
                     what);
        const double mref = max_abs(&g_ref[x]);
        double tol = FLASH_REL_TOL * (mref > 1.0 ? mref : 1.0);
        if (c->grad_dtype == FA_F16) tol += mref / 2048; /* half an ulp: 2^-11 relative */
        if (c->grad_dtype == FA_BF16) tol += mref / 256; /* half an ulp: 2^-8 relative */
        int64_t where;
        const double err = tu_max_abs_diff(&g_fl[x], &g_ref[x], &where);
        if (!(err <= tol))
            fail_msg("flash %s error %.3g at flat index %lld exceeds %.3g (max|ref| %.3g) (%s)", names[x], err,
                     (long long)where, tol, mref, what);
    }
    for (int x = 0; x < 3; x++) {
        tu_free(&g_ref[x]);
        tu_free(&g_fl[x]);
    }
    tu_free(&o_ref); tu_free(&o_fl); tu_free(&lse_ref); tu_free(&lse_fl);
    free_inputs(&in);
}

/* Ensure flash matches the reference when seqlens straddle the backward block (128) and small blocks. */
static void test_flash_backward_matches_reference_over_seqlens(void **state)
{
    (void)state;
    const int64_t lens[] = {1, 17, 127, 128, 129, 300};
    for (size_t a = 0; a < sizeof lens / sizeof lens[0]; a++) {
        bcase c = base_case(lens[a], lens[a], 32);
        run_case(&c);
        c.causal = 1;
        run_case(&c);
    }
    /* several tiles each way, with blocks that are not multiples of 16 */
    bcase c = base_case(70, 90, 24);
    c.bq = 17; c.bk = 33;
    run_case(&c);
    c.causal = 1;
    run_case(&c);
    c.bq = 16; c.bk = 16; c.causal = 0;
    run_case(&c);
}

/* Ensure the bottom-right causal mask is followed when seqlen_q != seqlen_k, both ways. */
static void test_flash_backward_matches_reference_when_causal_with_unequal_seqlens(void **state)
{
    (void)state;
    const int64_t pairs[][2] = {{1, 300}, {17, 300}, {300, 17}, {300, 1}, {129, 40}, {40, 129}};
    for (size_t a = 0; a < sizeof pairs / sizeof pairs[0]; a++) {
        bcase c = base_case(pairs[a][0], pairs[a][1], 32);
        c.causal = 1;
        run_case(&c);
    }
}

/* Ensure local windows (left, right, both, narrow) give the reference's gradients. */
static void test_flash_backward_matches_reference_with_windows(void **state)
{
    (void)state;
    const int64_t win[][2] = {{16, 0}, {0, 16}, {8, 8}, {0, 0}, {100, -1}, {-1, 3}};
    for (size_t a = 0; a < sizeof win / sizeof win[0]; a++) {
        bcase c = base_case(150, 200, 32);
        c.wl = win[a][0];
        c.wr = win[a][1];
        c.bq = 32; c.bk = 48;
        run_case(&c);
        c.Sq = 200; c.Sk = 150;
        run_case(&c);
    }
}

/* Ensure the softcap derivative is applied (softcap alone and with causal, sharp logits). */
static void test_flash_backward_matches_reference_with_softcap(void **state)
{
    (void)state;
    const double caps[] = {1.0, 5.0, 30.0};
    for (size_t a = 0; a < sizeof caps / sizeof caps[0]; a++) {
        bcase c = base_case(100, 130, 32);
        c.softcap = caps[a];
        c.range = 3.0;
        run_case(&c);
        c.causal = 1;
        run_case(&c);
    }
}

/* Ensure ALiBi (per head and per batch x head) shapes P exactly as in the forward. */
static void test_flash_backward_matches_reference_with_alibi(void **state)
{
    (void)state;
    bcase c = base_case(90, 110, 32);
    c.B = 2;
    c.alibi = 1;
    run_case(&c);
    c.alibi = 2;
    c.causal = 1;
    run_case(&c);
    c.softcap = 4.0;
    run_case(&c);
}

/* Ensure dK and dV are summed over the query heads of a group (GQA, MQA). */
static void test_flash_backward_matches_reference_with_gqa_and_mqa(void **state)
{
    (void)state;
    bcase c = base_case(70, 90, 32);
    c.H = 6; c.Hk = 2; /* GQA: groups of 3 */
    run_case(&c);
    c.causal = 1;
    run_case(&c);
    c.H = 4; c.Hk = 1; /* MQA */
    c.causal = 0;
    run_case(&c);
    /* several Q and K blocks per head, batches: the packed panels of every group head */
    c.B = 2; c.H = 6; c.Hk = 2; c.bq = 16; c.bk = 24; c.causal = 1;
    run_case(&c);
    c.Hk = 1; c.causal = 0; c.wl = 10; c.wr = 5;
    run_case(&c);
}

/* Ensure d_v != d, BHSD strides, custom scale and recomputed O/LSE (NULL) are handled. */
static void test_flash_backward_matches_reference_with_strides_dv_and_recompute(void **state)
{
    (void)state;
    bcase c = base_case(80, 100, 40);
    c.dv = 24;
    run_case(&c);
    c.bhsd = 1;
    run_case(&c);
    c.d = 16; c.dv = 72; c.scale = 0.3; c.causal = 1;
    run_case(&c);
    c.pass_o_lse = 0;
    run_case(&c);
    c.bhsd = 0; c.H = 4; c.Hk = 2; c.softcap = 3.0;
    run_case(&c);
}

/* Ensure f16/bf16/f64 inputs and f16/bf16/f64 gradient outputs work. */
static void test_flash_backward_matches_reference_with_low_precision_dtypes(void **state)
{
    (void)state;
    const fa_dtype dts[] = {FA_F16, FA_BF16, FA_F64};
    for (size_t a = 0; a < 3; a++) {
        bcase c = base_case(60, 70, 32);
        c.in_dtype = dts[a];
        run_case(&c);
        c.grad_dtype = dts[a];
        c.causal = 1;
        run_case(&c);
    }
}

/* Ensure rows with no visible key give dQ = 0 and contribute nothing to dK, dV. */
static void test_backward_gives_zero_dq_for_rows_with_no_visible_key(void **state)
{
    (void)state;
    /* causal with Sq > Sk: the first Sq - Sk rows see nothing */
    bcase c = base_case(50, 20, 16);
    c.causal = 1;
    run_case(&c); /* flash vs reference, incl. those rows */
    c.pass_o_lse = 0;
    run_case(&c);

    uint64_t rng = tu_seed() + 77;
    binputs in;
    make_inputs(&in, &c, &rng);
    tu_tensor dq = tu_alloc4(FA_F32, 1, 50, 2, 16, 0), dk = tu_alloc4(FA_F32, 1, 20, 2, 16, 0),
              dv = tu_alloc4(FA_F32, 1, 20, 2, 16, 0);
    for (int impl = 0; impl < 2; impl++) {
        in.opt.impl = impl == 0 ? FA_IMPL_FLASH : FA_IMPL_REFERENCE;
        tu_poison(&dq);
        assert_int_equal(fa_backward(&in.q.t, &in.k.t, &in.v.t, NULL, NULL, &in.dout.t, &dq.t, &dk.t, &dv.t,
                                     &in.opt), FA_OK);
        for (int64_t i = 0; i < 50; i++)
            for (int64_t h = 0; h < 2; h++)
                for (int64_t x = 0; x < 16; x++) {
                    int64_t idx[4] = {0, i, h, x};
                    double g = tu_get(&dq, idx);
                    if (i < 30 && g != 0.0) fail_msg("dQ[0,%lld,%lld,%lld] = %g, want 0", (long long)i, (long long)h, (long long)x, g);
                    if (!isfinite(g)) fail_msg("dQ not finite at row %lld", (long long)i);
                }
    }
    tu_free(&dq); tu_free(&dk); tu_free(&dv);
    free_inputs(&in);
}

/* Ensure empty sequences work: Sq = 0 gives dK = dV = 0, Sk = 0 gives dQ = 0. */
static void test_backward_handles_empty_sequences(void **state)
{
    (void)state;
    const int64_t lens[][2] = {{0, 9}, {9, 0}, {0, 0}};
    for (size_t a = 0; a < 3; a++) {
        bcase c = base_case(lens[a][0], lens[a][1], 8);
        uint64_t rng = tu_seed() + 3 + a;
        binputs in;
        make_inputs(&in, &c, &rng);
        for (int impl = 0; impl < 2; impl++) {
            tu_tensor g[3] = {tu_alloc4(FA_F32, 1, c.Sq, 2, 8, 0), tu_alloc4(FA_F32, 1, c.Sk, 2, 8, 0),
                              tu_alloc4(FA_F32, 1, c.Sk, 2, 8, 0)};
            for (int x = 0; x < 3; x++) tu_poison(&g[x]);
            in.opt.impl = impl == 0 ? FA_IMPL_FLASH : FA_IMPL_REFERENCE;
            assert_int_equal(fa_backward(&in.q.t, &in.k.t, &in.v.t, NULL, NULL, &in.dout.t, &g[0].t, &g[1].t,
                                         &g[2].t, &in.opt), FA_OK);
            for (int x = 0; x < 3; x++) {
                assert_int_equal(tu_count_nan(&g[x]), 0);
                tu_tensor z = tu_alloc4(FA_F64, g[x].t.shape[0], g[x].t.shape[1], g[x].t.shape[2], g[x].t.shape[3], 0);
                memset(z.mem, 0, z.bytes);
                int64_t where;
                if (fa_tensor_numel(&g[x].t) > 0) assert_true(tu_max_abs_diff(&g[x], &z, &where) == 0.0);
                tu_free(&z);
                tu_free(&g[x]);
            }
        }
        free_inputs(&in);
    }
}

/* ------------------------------------------------------------------------ */
/* reference vs finite differences                                           */
/* ------------------------------------------------------------------------ */

/* L = sum(dO o O) with the float64 reference forward. */
static double loss(const binputs *in, tu_tensor *o)
{
    fa_options opt = in->opt;
    opt.impl = FA_IMPL_REFERENCE;
    assert_int_equal(fa_forward(&in->q.t, &in->k.t, &in->v.t, &o->t, NULL, &opt), FA_OK);
    const double *od = o->mem, *dd = in->dout.mem; /* both contiguous BSHD float64 */
    double s = 0.0;
    for (size_t x = 0; x < o->bytes / sizeof(double); x++) s += od[x] * dd[x];
    return s;
}

static void fd_case(const bcase *c0)
{
    bcase c = *c0;
    c.in_dtype = FA_F64;
    c.bhsd = 0;
    static uint64_t counter;
    uint64_t rng = tu_seed() + 15485863 * ++counter;
    binputs in;
    make_inputs(&in, &c, &rng);
    char what[600];
    describe(&c, what, sizeof what);
    tu_tensor o = tu_alloc4(FA_F64, c.B, c.Sq, c.H, c.dv, 0);
    tu_tensor g[3] = {tu_alloc4(FA_F64, c.B, c.Sq, c.H, c.d, 0), tu_alloc4(FA_F64, c.B, c.Sk, c.Hk, c.d, 0),
                      tu_alloc4(FA_F64, c.B, c.Sk, c.Hk, c.dv, 0)};
    fa_options opt = in.opt;
    opt.impl = FA_IMPL_REFERENCE;
    opt.num_threads = 1;
    /* the reference recomputes O and LSE itself (NULL): the path a user without them takes */
    if (fa_backward(&in.q.t, &in.k.t, &in.v.t, NULL, NULL, &in.dout.t, &g[0].t, &g[1].t, &g[2].t, &opt) != FA_OK)
        fail_msg("reference backward failed: %s (%s)", fa_last_error(), what);

    tu_tensor *x_of[3] = {&in.q, &in.k, &in.v};
    static const char *names[3] = {"q", "k", "v"};
    for (int which = 0; which < 3; which++) {
        double *xd = x_of[which]->mem;
        const double *gd = g[which].mem;
        const size_t n = x_of[which]->bytes / sizeof(double);
        for (int trial = 0; trial < 6; trial++) {
            const size_t e = (size_t)(tu_next(&rng) % n);
            const double x0 = xd[e];
            xd[e] = x0 + FD_STEP;
            const double lp = loss(&in, &o);
            xd[e] = x0 - FD_STEP;
            const double lm = loss(&in, &o);
            xd[e] = x0;
            const double fd = (lp - lm) / (2 * FD_STEP);
            const double tol = FD_TOL * (fabs(gd[e]) > 1.0 ? fabs(gd[e]) : 1.0);
            if (!(fabs(fd - gd[e]) <= tol))
                fail_msg("d%s[%zu]: backward %.12g, finite difference %.12g (diff %.3g > %.3g) (%s)", names[which],
                         e, gd[e], fd, fabs(fd - gd[e]), tol, what);
        }
    }
    for (int x = 0; x < 3; x++) tu_free(&g[x]);
    tu_free(&o);
    free_inputs(&in);
}

/* Ensure the reference backward is the derivative of the reference forward (plain, scaled, d_v != d). */
static void test_reference_backward_matches_finite_differences(void **state)
{
    (void)state;
    bcase c = base_case(5, 7, 4);
    c.range = 1.5;
    fd_case(&c);
    c.scale = 0.8; c.dv = 3;
    fd_case(&c);
    c.B = 2;
    fd_case(&c);
}

/* Ensure the finite-difference check also holds under masks, windows and empty rows. */
static void test_reference_backward_matches_finite_differences_with_masks(void **state)
{
    (void)state;
    bcase c = base_case(6, 9, 4);
    c.range = 1.5;
    c.causal = 1;
    fd_case(&c);
    c.Sq = 9; c.Sk = 5; /* first 4 rows see nothing */
    fd_case(&c);
    c.causal = 0; c.wl = 2; c.wr = 1; c.Sq = 8; c.Sk = 8;
    fd_case(&c);
}

/* Ensure the finite-difference check holds through the softcap, ALiBi and GQA/MQA sums. */
static void test_reference_backward_matches_finite_differences_with_softcap_alibi_gqa(void **state)
{
    (void)state;
    bcase c = base_case(6, 7, 4);
    c.range = 2.0;
    c.softcap = 1.5;
    fd_case(&c);
    c.softcap = 0.0; c.alibi = 1; c.causal = 1;
    fd_case(&c);
    c.alibi = 2; c.B = 2; c.softcap = 2.5;
    fd_case(&c);
    c.alibi = 0; c.softcap = 0.0; c.causal = 0; c.H = 6; c.Hk = 2; c.B = 1;
    fd_case(&c);
    c.H = 3; c.Hk = 1; c.causal = 1;
    fd_case(&c);
}

/* ------------------------------------------------------------------------ */
/* determinism, errors, memory                                               */
/* ------------------------------------------------------------------------ */

/*
 * Ensure the backward's own recompute of O and LSE (o = lse = NULL) takes the tiled
 * forward even for few query rows, where fa_forward takes the decode path: P = exp(s - LSE)
 * must see the scores its LSE was summed from. The tiled forward's O and LSE come from
 * fa_forward on the same rows plus more (Sq > FA_DECODE_MAX_Q keeps it off the decode path;
 * rows are computed on their own, so the shared rows have the bits the tiled forward gives
 * them alone); with the forward's own key block (Bc: the online softmax's order) the O and
 * LSE are those bits, and so the gradients are too. Logits up to ~10^3 (q, k in [-30, 30)),
 * where the decoder's other summation order moved dV by ~1e-3, past check-grad's bound, and
 * the backward's smaller Bc (FA_BWD_BLOCK_MAX), once used for the recompute as well, moved
 * an LSE by one float32 step (~6e-5 at 10^3) for some seeds.
 */
static void recompute_matches_the_tiled_forward(double qk_range)
{
    uint64_t rng = tu_seed() ^ 0x5eed;
    const int64_t Sq = 5, Sk = 500, H = 4, Hk = 2, d = 33, dv = 16;
    tu_tensor q = tu_alloc4(FA_F32, 1, Sq, H, d, 0), k = tu_alloc4(FA_F32, 1, Sk, Hk, d, 0);
    tu_tensor v = tu_alloc4(FA_F32, 1, Sk, Hk, dv, 0), dout = tu_alloc4(FA_F32, 1, Sq, H, dv, 0);
    tu_fill(&q, &rng, -qk_range, qk_range);
    tu_fill(&k, &rng, -qk_range, qk_range);
    tu_fill(&v, &rng, -1.0, 1.0);
    tu_fill(&dout, &rng, -1.0, 1.0);
    /* the rows again, plus 24 more: a forward of 29 rows is tiled */
    const int64_t Sx = Sq + 24, lse_shape[3] = {1, H, Sq}, lsex_shape[3] = {1, H, Sx};
    tu_tensor qx = tu_alloc4(FA_F32, 1, Sx, H, d, 0);
    tu_fill(&qx, &rng, -qk_range, qk_range);
    memcpy(qx.mem, q.mem, q.bytes); /* BSHD, batch 1: the first Sq rows */
    tu_tensor ox = tu_alloc4(FA_F32, 1, Sx, H, dv, 0), lsex = tu_alloc(FA_F32, 3, lsex_shape);
    fa_options opt = fa_options_default();
    assert_int_equal(fa_forward(&qx.t, &k.t, &v.t, &ox.t, &lsex.t, &opt), FA_OK);
    tu_tensor o = tu_alloc4(FA_F32, 1, Sq, H, dv, 0), lse = tu_alloc(FA_F32, 3, lse_shape);
    memcpy(o.mem, ox.mem, o.bytes);
    for (int64_t h = 0; h < H; h++)
        memcpy((float *)lse.mem + h * Sq, (const float *)lsex.mem + h * Sx, (size_t)Sq * sizeof(float));
    const int64_t shp[3][4] = {{1, Sq, H, d}, {1, Sk, Hk, d}, {1, Sk, Hk, dv}};
    tu_tensor ga[3], gb[3];
    for (int x = 0; x < 3; x++) {
        ga[x] = tu_alloc4(FA_F32, shp[x][0], shp[x][1], shp[x][2], shp[x][3], 0);
        gb[x] = tu_alloc4(FA_F32, shp[x][0], shp[x][1], shp[x][2], shp[x][3], 0);
        tu_poison(&ga[x]);
        tu_poison(&gb[x]);
    }
    assert_int_equal(fa_backward(&q.t, &k.t, &v.t, NULL, NULL, &dout.t, &ga[0].t, &ga[1].t, &ga[2].t, &opt), FA_OK);
    assert_int_equal(fa_backward(&q.t, &k.t, &v.t, &o.t, &lse.t, &dout.t, &gb[0].t, &gb[1].t, &gb[2].t, &opt), FA_OK);
    static const char *names[3] = {"dQ", "dK", "dV"};
    for (int x = 0; x < 3; x++) {
        if (tu_count_nan(&ga[x]) != 0) fail_msg("%s: unwritten (NaN) elements", names[x]);
        /* bits: the recompute is the tiled forward with the forward's own blocks, so its
         * O and LSE are the 29-row forward's, and so are the gradients. (The decoder's
         * summation order moved dV by ~1e-3; the backward's smaller key block, once
         * used for the recompute too, moved the LSE by an ulp, ~6e-5 of P at |s| ~ 1e3.) */
        if (memcmp(ga[x].mem, gb[x].mem, ga[x].bytes) != 0) {
            int64_t where;
            const double e = tu_max_abs_diff(&ga[x], &gb[x], &where);
            fail_msg("%s from the backward's own recompute differs from the tiled forward's O and LSE "
                     "(max %.3g at %lld)", names[x], e, (long long)where);
        }
        tu_free(&ga[x]);
        tu_free(&gb[x]);
    }
    tu_free(&q); tu_free(&k); tu_free(&v); tu_free(&dout); tu_free(&o); tu_free(&lse);
    tu_free(&qx); tu_free(&ox); tu_free(&lsex);
}

static void test_backward_recompute_takes_the_tiled_forward_for_few_rows(void **state)
{
    (void)state;
    recompute_matches_the_tiled_forward(30.0);
}

/* The same at logits of ~10 (q, k in [-3, 3)), where the softmax is far from one-hot and
 * l and O sum many terms: another key block than the forward's changes their bits for
 * nearly every seed (the large logits above catch it for a few seeds in 20). */
static void test_backward_recompute_gives_the_forward_bits_at_moderate_logits(void **state)
{
    (void)state;
    recompute_matches_the_tiled_forward(3.0);
}

/* Ensure 1, 2 and 3 threads give identical bits (flash and reference). */
static void test_backward_is_deterministic_across_thread_counts(void **state)
{
    (void)state;
    bcase c = base_case(150, 170, 32);
    c.H = 4; c.Hk = 2; c.causal = 1; c.bq = 32; c.bk = 48;
    uint64_t rng = tu_seed() + 31;
    binputs in;
    make_inputs(&in, &c, &rng);
    for (int impl = 0; impl < 2; impl++) {
        in.opt.impl = impl == 0 ? FA_IMPL_FLASH : FA_IMPL_REFERENCE;
        tu_tensor first[3];
        for (int nt = 1; nt <= 3; nt++) {
            tu_tensor g[3] = {tu_alloc4(FA_F32, 1, 150, 4, 32, 0), tu_alloc4(FA_F32, 1, 170, 2, 32, 0),
                              tu_alloc4(FA_F32, 1, 170, 2, 32, 0)};
            in.opt.num_threads = nt;
            assert_int_equal(fa_backward(&in.q.t, &in.k.t, &in.v.t, NULL, NULL, &in.dout.t, &g[0].t, &g[1].t,
                                         &g[2].t, &in.opt), FA_OK);
            for (int x = 0; x < 3; x++) {
                if (nt == 1) {
                    first[x] = g[x];
                } else {
                    if (memcmp(first[x].mem, g[x].mem, g[x].bytes) != 0)
                        fail_msg("%s backward: gradient %d differs between 1 and %d threads",
                                 impl == 0 ? "flash" : "reference", x, nt);
                    tu_free(&g[x]);
                }
            }
        }
        for (int x = 0; x < 3; x++) tu_free(&first[x]);
    }
    free_inputs(&in);
}

/* Ensure bad arguments are rejected with the right status and a message naming the tensor. */
static void test_backward_rejects_bad_arguments(void **state)
{
    (void)state;
    bcase c = base_case(8, 8, 4);
    uint64_t rng = tu_seed() + 5;
    binputs in;
    make_inputs(&in, &c, &rng);
    tu_tensor dq = tu_alloc4(FA_F32, 1, 8, 2, 4, 0), dk = tu_alloc4(FA_F32, 1, 8, 2, 4, 0),
              dv = tu_alloc4(FA_F32, 1, 8, 2, 4, 0), bad = tu_alloc4(FA_F32, 1, 8, 2, 5, 0);
    fa_options opt = in.opt;
    assert_int_equal(fa_backward(&in.q.t, &in.k.t, &in.v.t, NULL, NULL, NULL, &dq.t, &dk.t, &dv.t, &opt),
                     FA_ERR_NULL_ARG);
    assert_non_null(strstr(fa_last_error(), "dout"));
    assert_int_equal(fa_backward(&in.q.t, &in.k.t, &in.v.t, NULL, NULL, &in.dout.t, &bad.t, &dk.t, &dv.t, &opt),
                     FA_ERR_SHAPE);
    assert_non_null(strstr(fa_last_error(), "dq"));
    assert_int_equal(fa_backward(&in.q.t, &in.k.t, &in.v.t, NULL, NULL, &in.dout.t, &dq.t, &dk.t, &bad.t, &opt),
                     FA_ERR_SHAPE);
    assert_non_null(strstr(fa_last_error(), "dv"));
    assert_int_equal(fa_backward(&in.q.t, &in.k.t, &in.v.t, NULL, NULL, &bad.t, &dq.t, &dk.t, &dv.t, &opt),
                     FA_ERR_SHAPE);
    assert_int_equal(fa_backward(&in.q.t, &in.k.t, &in.v.t, NULL, NULL, &in.dout.t, &dq.t, NULL, &dv.t, &opt),
                     FA_ERR_NULL_ARG);
    int64_t lshape[3] = {1, 2, 8};
    tu_tensor lse16 = tu_alloc(FA_F16, 3, lshape);
    assert_int_equal(fa_backward(&in.q.t, &in.k.t, &in.v.t, NULL, &lse16.t, &in.dout.t, &dq.t, &dk.t, &dv.t, &opt),
                     FA_ERR_DTYPE);
    opt.impl = FA_IMPL_STANDARD;
    assert_int_equal(fa_backward(&in.q.t, &in.k.t, &in.v.t, NULL, NULL, &in.dout.t, &dq.t, &dk.t, &dv.t, &opt),
                     FA_ERR_IMPL);
    assert_non_null(strstr(fa_last_error(), "standard"));
    opt.impl = FA_IMPL_FLASH;
    assert_int_equal(fa_backward(&in.q.t, &in.k.t, &in.v.t, NULL, NULL, &in.dout.t, &dq.t, &dk.t, &dv.t, &opt),
                     FA_OK);
    assert_string_equal(fa_last_error(), "");
    tu_free(&dq); tu_free(&dk); tu_free(&dv); tu_free(&bad); tu_free(&lse16);
    free_inputs(&in);
}

/* Ensure zero-stride gradient views of a huge seqlen_k are refused (STRIDE: every key would
 * write one element), not written by several threads or overrun through a wrapped size. */
static void test_reference_backward_refuses_huge_strided_views(void **state)
{
    (void)state;
    float zeros[64] = {0};
    const int64_t huge = (int64_t)1 << 59; /* numel 2^61 fits int64; 2 Sk (d + dv) doubles do not fit size_t */
    const int64_t qs[4] = {1, 2, 1, 4}, ks[4] = {1, huge, 1, 4}, zs[4] = {0, 0, 0, 0}, ls[3] = {1, 1, 2};
    fa_tensor q, k, v, o, lse, dout, dq, dk, dv;
    float dq_mem[8], lse_mem[2];
    assert_int_equal(fa_tensor_make(&q, zeros, FA_F32, 4, qs, NULL), FA_OK);
    assert_int_equal(fa_tensor_make(&k, zeros, FA_F32, 4, ks, zs), FA_OK);
    assert_int_equal(fa_tensor_make(&v, zeros, FA_F32, 4, ks, zs), FA_OK);
    assert_int_equal(fa_tensor_make(&o, zeros, FA_F32, 4, qs, NULL), FA_OK);
    assert_int_equal(fa_tensor_make(&dout, zeros, FA_F32, 4, qs, NULL), FA_OK);
    assert_int_equal(fa_tensor_make(&lse, lse_mem, FA_F32, 3, ls, NULL), FA_OK);
    assert_int_equal(fa_tensor_make(&dq, dq_mem, FA_F32, 4, qs, NULL), FA_OK);
    assert_int_equal(fa_tensor_make(&dk, zeros + 32, FA_F32, 4, ks, zs), FA_OK);
    assert_int_equal(fa_tensor_make(&dv, zeros + 48, FA_F32, 4, ks, zs), FA_OK);
    fa_options opt = fa_options_default();
    opt.impl = FA_IMPL_REFERENCE;
    opt.num_threads = 1;
    assert_int_equal(fa_backward(&q, &k, &v, &o, &lse, &dout, &dq, &dk, &dv, &opt), FA_ERR_STRIDE);
    assert_non_null(strstr(fa_last_error(), "dk: stride"));
    assert_int_equal(fa_backward(&q, &k, &v, NULL, NULL, &dout, &dq, &dk, &dv, &opt), FA_ERR_STRIDE);
}

/* Ensure the flash backward never allocates anything proportional to seqlen_q x seqlen_k. */
static void test_flash_backward_memory_is_linear(void **state)
{
    (void)state;
    bcase c = base_case(2048, 2048, 16);
    c.H = 1; c.Hk = 1;
    uint64_t rng = tu_seed() + 99;
    binputs in;
    make_inputs(&in, &c, &rng);
    tu_tensor o = tu_alloc4(FA_F32, 1, 2048, 1, 16, 0);
    int64_t lshape[3] = {1, 1, 2048};
    tu_tensor lse = tu_alloc(FA_F32, 3, lshape);
    assert_int_equal(fa_forward(&in.q.t, &in.k.t, &in.v.t, &o.t, &lse.t, &in.opt), FA_OK);
    /* the default path, then the single pass forced (its Q panels packed per thread; dQ in the
     * output, or with f16 gradients in group x Sq x d floats of scratch) */
    for (int run = 0; run < 3; run++) {
        const fa_dtype gd = run == 2 ? FA_F16 : FA_F32;
        tu_tensor g[3] = {tu_alloc4(gd, 1, 2048, 1, 16, 0), tu_alloc4(gd, 1, 2048, 1, 16, 0),
                          tu_alloc4(gd, 1, 2048, 1, 16, 0)};
        fa_alloc_stats s0, s1;
        fa_alloc_stats_reset();
        fa_alloc_stats_get(&s0);
        fa_bwd_one_pass_test = run == 0 ? -1 : 1;
        const fa_status st = fa_backward(&in.q.t, &in.k.t, &in.v.t, &o.t, &lse.t, &in.dout.t, &g[0].t, &g[1].t,
                                         &g[2].t, &in.opt);
        fa_bwd_one_pass_test = -1;
        assert_int_equal(st, FA_OK);
        fa_alloc_stats_get(&s1);
        const size_t extra = s1.peak_bytes - s0.current_bytes;
        const size_t sxs = (size_t)2048 * 2048 * sizeof(float); /* one S matrix: 16 MiB */
        /* measured ~1.2 MiB: 2 threads x scratch + shared Q panels + D; the single pass 0.85 MiB
         * (0.97 with the f16 gradients' dQ scratch) */
        if (extra > sxs / 8)
            fail_msg("flash backward (run %d) allocated %zu bytes at its peak (S alone would be %zu)", run, extra, sxs);
        assert_int_equal(s1.current_bytes, s0.current_bytes); /* and freed it all */
        for (int x = 0; x < 3; x++) tu_free(&g[x]);
    }
    tu_free(&o); tu_free(&lse);
    free_inputs(&in);
}

/* ------------------------------------------------------------------------ */
/* Cut tiles (src/backward.c, cut_group): the bits of the whole-tile path     */
/* ------------------------------------------------------------------------ */

typedef struct cutcase {
    const char *name;
    int64_t Sq, Sk, H, Hk, d, dv;
    int causal;
    int64_t wl, wr;
    double softcap;
    int alibi, sinks, dropout, varlen, per_tile;
    int bq, bk; /* 0: derived */
} cutcase;

/* dQ, dK, dV of one flash backward (O and LSE recomputed) on `isa`: cut & 1 cuts tiles (else
 * whole tiles), cut >> 1 runs the single pass (else the two passes). */
static void run_bwd_cut(const cutcase *c, const char *isa, int cut, int threads, tu_tensor *in, const tu_tensor *slopes,
                        const tu_tensor *sinks, const fa_dropout *dr, const fa_varlen *vl, tu_tensor *gr)
{
    fa_context *ctx = NULL;
    if (fa_context_create(&ctx, isa, threads) != FA_OK) fail_msg("context %s: %s", isa, fa_last_error());
    fa_options opt = fa_options_default();
    opt.context = ctx;
    opt.causal = c->causal;
    opt.window_left = c->wl;
    opt.window_right = c->wr;
    opt.softcap = c->softcap;
    opt.block_q = c->bq;
    opt.block_k = c->bk;
    opt.pack_max_bytes = c->per_tile ? 0 : -1;
    if (c->alibi) opt.alibi_slopes = &slopes->t;
    if (c->sinks) opt.sinks = &sinks->t;
    if (c->dropout) opt.dropout = dr;
    if (c->varlen) opt.varlen = vl;
    for (int x = 0; x < 3; x++) tu_poison(&gr[x]);
    fa_tile_cut_test = cut & 1;
    fa_bwd_one_pass_test = cut >> 1;
    const fa_status st = fa_backward(&in[0].t, &in[1].t, &in[2].t, NULL, NULL, &in[3].t, &gr[0].t, &gr[1].t,
                                     &gr[2].t, &opt);
    fa_tile_cut_test = -1;
    fa_bwd_one_pass_test = -1;
    fa_context_destroy(ctx);
    if (st != FA_OK) fail_msg("%s (%s, cut %d): %s", c->name, isa, cut, fa_last_error());
}

/* A rank-4 [1][S][H][w] tensor viewed as rank 3 [S][H][w] (varlen). */
static void drop_batch_dim(fa_tensor *t)
{
    t->rank = 3;
    for (int a = 0; a < 3; a++) {
        t->shape[a] = t->shape[a + 1];
        t->stride[a] = t->stride[a + 1];
    }
}

static void run_bwd_cut_case(const cutcase *c, uint64_t *rng)
{
    const int64_t H = c->H, Hk = c->Hk;
    int32_t cuq[4], cuk[4];
    fa_varlen vl = fa_varlen_default();
    int64_t B = 2, tq = c->Sq, tk = c->Sk;
    if (c->varlen) { /* 3 sequences: (Sq, Sk), (Sq/3, Sk), (Sq, Sk/2) */
        const int64_t lq[3] = {c->Sq, c->Sq / 3, c->Sq}, lk[3] = {c->Sk, c->Sk, c->Sk / 2};
        cuq[0] = cuk[0] = 0;
        for (int i = 0; i < 3; i++) {
            cuq[i + 1] = cuq[i] + (int32_t)lq[i];
            cuk[i + 1] = cuk[i] + (int32_t)lk[i];
        }
        vl.batch = 3;
        vl.cu_seqlens_q = cuq;
        vl.cu_seqlens_k = cuk;
        B = 1;
        tq = cuq[3];
        tk = cuk[3];
    }
    tu_tensor in[4] = {tu_alloc4(FA_F32, B, tq, H, c->d, 0), tu_alloc4(FA_F32, B, tk, Hk, c->d, 0),
                       tu_alloc4(FA_F32, B, tk, Hk, c->dv, 0), tu_alloc4(FA_F32, B, tq, H, c->dv, 0)};
    tu_tensor gr[2][3];
    for (int w = 0; w < 2; w++) {
        gr[w][0] = tu_alloc4(FA_F32, B, tq, H, c->d, 0);
        gr[w][1] = tu_alloc4(FA_F32, B, tk, Hk, c->d, 0);
        gr[w][2] = tu_alloc4(FA_F32, B, tk, Hk, c->dv, 0);
    }
    if (c->varlen) {
        for (int x = 0; x < 4; x++) drop_batch_dim(&in[x].t);
        for (int w = 0; w < 2; w++)
            for (int x = 0; x < 3; x++) drop_batch_dim(&gr[w][x].t);
    }
    tu_fill(&in[0], rng, -1.5, 1.5);
    tu_fill(&in[1], rng, -1.5, 1.5);
    tu_fill(&in[2], rng, -1.0, 1.0);
    tu_fill(&in[3], rng, -1.0, 1.0);
    const int64_t hs[1] = {H}, bh[2] = {B, H};
    tu_tensor slopes = tu_alloc(FA_F32, 2, bh), sinks = tu_alloc(FA_F32, 1, hs);
    tu_fill(&slopes, rng, 0.0, 0.5);
    tu_fill(&sinks, rng, -1.0, 2.0);
    const size_t nkeep = (size_t)(c->varlen ? 3 : B) * (size_t)H * (size_t)c->Sq * (size_t)c->Sk;
    uint8_t *keep = malloc(nkeep);
    assert_non_null(keep);
    for (size_t x = 0; x < nkeep; x++) keep[x] = tu_uniform(rng, 0.0, 1.0) >= 0.2;
    fa_dropout dr = fa_dropout_default();
    dr.p = 0.2;
    dr.keep_mask = keep;
    dr.keep_shape[0] = c->varlen ? 3 : B;
    dr.keep_shape[1] = H;
    dr.keep_shape[2] = c->Sq;
    dr.keep_shape[3] = c->Sk;
    static const char *const isas[] = {"scalar", "avx2", "avx512", "neon"};
    static const char *const names[3] = {"dQ", "dK", "dV"};
    for (size_t ii = 0; ii < sizeof isas / sizeof isas[0]; ii++) {
        if (!fa_kernels_by_name(isas[ii])) continue; /* not in this build or CPU */
        const int threads = ii % 2 ? 1 : 3;
        run_bwd_cut(c, isas[ii], 0, threads, in, &slopes, &sinks, &dr, &vl, gr[0]);
        /* cut two passes, whole-tile one pass, cut one pass: each the bits of whole-tile two passes */
        static const char *const ways[4] = {"", "the cut two passes", "the whole-tile single pass",
                                            "the cut single pass"};
        for (int way = 1; way < 4; way++) {
            run_bwd_cut(c, isas[ii], way, way == 1 ? 4 - threads : threads + way - 1, in, &slopes, &sinks, &dr, &vl,
                        gr[1]);
            for (int x = 0; x < 3; x++) {
                if (tu_count_nan(&gr[1][x]) != 0)
                    fail_msg("%s on %s: NaN in %s (%s)", c->name, isas[ii], names[x], ways[way]);
                if (memcmp(gr[0][x].mem, gr[1][x].mem, gr[0][x].bytes) != 0) {
                    int64_t where;
                    const double e = tu_max_abs_diff(&gr[1][x], &gr[0][x], &where);
                    fail_msg("%s on %s: %s of %s differs from the whole-tile two passes (max %.3g at %lld)", c->name,
                             isas[ii], names[x], ways[way], e, (long long)where);
                }
            }
        }
    }
    free(keep);
    for (int x = 0; x < 4; x++) tu_free(&in[x]);
    for (int w = 0; w < 2; w++)
        for (int x = 0; x < 3; x++) tu_free(&gr[w][x]);
    tu_free(&slopes);
    tu_free(&sinks);
}

/*
 * Ensure the backward pass's cut tiles (causal or windowed tiles computed per
 * line group over only the visible columns: pass (b) cuts the end of each
 * query row, pass (a) both ends of each key line) give the whole tile's dQ, dK,
 * dV bit for bit (FA_TILE_CUT=0 is the whole-tile path), on every ISA here:
 * odd lengths, blocks that do not divide them, windows that start and end inside
 * a group, seqlen_q above and below seqlen_k, GQA, softcap, ALiBi, sinks,
 * dropout, varlen, per-tile packing, and pinned blocks above the kernels' pv
 * key chunks (128 keys on AVX-512, 256 on AVX2). The single pass
 * (FA_BWD_ONE_PASS=1), cut and whole, must give the same bits. Fresh random inputs.
 */
static void test_flash_backward_cut_tiles_give_the_whole_tile_bits(void **state)
{
    (void)state;
    uint64_t rng = tu_seed() ^ 0xbc07;
    /* name, Sq, Sk, H, Hk, d, dv, causal, wl, wr, softcap, alibi, sinks, dropout, varlen, per_tile, bq, bk */
    const cutcase cases[] = {
        {"causal odd N, derived blocks", 203, 203, 2, 2, 24, 24, 1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0},
        {"causal Br < Bc", 150, 150, 2, 1, 16, 20, 1, -1, -1, 0, 0, 0, 0, 0, 0, 40, 64},
        {"causal Br > Bc, odd Bc", 157, 157, 1, 1, 16, 16, 1, -1, -1, 0, 0, 0, 0, 0, 0, 72, 37},
        {"causal Sq < Sk", 97, 150, 2, 2, 16, 16, 1, -1, -1, 0, 0, 0, 0, 0, 0, 24, 48},
        {"causal Sq > Sk", 150, 97, 2, 2, 16, 16, 1, -1, -1, 0, 0, 0, 0, 0, 0, 36, 40},
        {"window left and right mid group", 200, 200, 2, 2, 16, 24, 0, 37, 5, 0, 0, 0, 0, 0, 0, 30, 32},
        {"GQA softcap ALiBi", 130, 130, 4, 2, 16, 16, 1, -1, -1, 30.0, 1, 0, 0, 0, 0, 0, 70},
        {"sinks and dropout", 100, 100, 2, 1, 16, 16, 1, -1, -1, 0, 0, 1, 1, 0, 0, 32, 32},
        {"varlen", 60, 80, 2, 2, 16, 16, 1, -1, -1, 0, 0, 0, 0, 1, 0, 24, 32},
        {"per-tile packing", 130, 130, 2, 2, 16, 16, 1, -1, -1, 0, 0, 0, 0, 0, 1, 48, 64},
        {"blocks above the pv chunks", 620, 620, 1, 1, 16, 16, 1, 300, -1, 0, 0, 0, 0, 0, 0, 300, 320},
        /* d, dv and blocks of 128: the single pass's padded strides (144 floats) differ from the
         * two passes' (128), so a stride mixed up between them changes the bits */
        {"d 128, blocks 128 (padded strides)", 150, 150, 2, 1, 128, 128, 1, -1, -1, 0, 0, 0, 0, 0, 0, 128, 128},
        {"d 128, dv 64, window", 150, 170, 2, 2, 128, 64, 0, 60, 10, 0, 0, 0, 0, 0, 1, 128, 128},
    };
    for (size_t x = 0; x < sizeof cases / sizeof cases[0]; x++) run_bwd_cut_case(&cases[x], &rng);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reference_backward_matches_finite_differences),
        cmocka_unit_test(test_reference_backward_matches_finite_differences_with_masks),
        cmocka_unit_test(test_reference_backward_matches_finite_differences_with_softcap_alibi_gqa),
        cmocka_unit_test(test_flash_backward_matches_reference_over_seqlens),
        cmocka_unit_test(test_flash_backward_matches_reference_when_causal_with_unequal_seqlens),
        cmocka_unit_test(test_flash_backward_matches_reference_with_windows),
        cmocka_unit_test(test_flash_backward_matches_reference_with_softcap),
        cmocka_unit_test(test_flash_backward_matches_reference_with_alibi),
        cmocka_unit_test(test_flash_backward_matches_reference_with_gqa_and_mqa),
        cmocka_unit_test(test_flash_backward_matches_reference_with_strides_dv_and_recompute),
        cmocka_unit_test(test_flash_backward_matches_reference_with_low_precision_dtypes),
        cmocka_unit_test(test_backward_gives_zero_dq_for_rows_with_no_visible_key),
        cmocka_unit_test(test_backward_handles_empty_sequences),
        cmocka_unit_test(test_backward_is_deterministic_across_thread_counts),
        cmocka_unit_test(test_backward_recompute_takes_the_tiled_forward_for_few_rows),
        cmocka_unit_test(test_backward_recompute_gives_the_forward_bits_at_moderate_logits),
        cmocka_unit_test(test_flash_backward_cut_tiles_give_the_whole_tile_bits),
        cmocka_unit_test(test_backward_rejects_bad_arguments),
        cmocka_unit_test(test_flash_backward_memory_is_linear),
        cmocka_unit_test(test_reference_backward_refuses_huge_strided_views),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
