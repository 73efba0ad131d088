/*
 * test_amx.c — the bf16 forward on AMX tiles (src/kernels/amx.c, FA_AMX=1) against the
 * float64 reference, held to the float32 flash path's own error on the same
 * inputs (test_forward.c's factors with that path in place of fa_check's
 * emulation, which for bf16 inputs emulates bf16 arithmetic and would allow
 * ~1e-3): max e <= 8 max e_f32 + 2^-20 max|O_ref|, mean e <= 4 mean e_f32 +
 * 2^-24 max|O_ref|, LSE within 4 e_f32(LSE) + 2^-20 max(1, |LSE_ref|) — so P's
 * three bf16 parts must keep the result float32-class.
 * Every case draws fresh bf16 inputs, poisons the outputs, and checks that the
 * AMX path ran (fa_amx_runs), not flash.c's. Also: the same bits on 1, 2 and 3
 * threads; Inf/NaN inputs and problems it does not take hand over to flash.c
 * (the float32 path's bits exactly). Skipped where the CPU, kernel or build has
 * no AMX (fa_amx_usable). Varlen batches, a KV cache with appended keys and cache_batch_idx, and
 * paged caches (pages of 16 and 3: the same bits as contiguous) run on the tiles too.
 */
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "amx.h"
#include "internal.h"
#include "kernels/kernels.h"

typedef struct acase {
    int64_t B, Sq, Sk, H, Hk, d, dv;
    int causal;
    int64_t wl, wr;
    double softcap;
    int alibi;
    double range;  /* Q, K uniform in [-range, range) */
    double vrange; /* V likewise (0: 1) */
    double scale;  /* 0: the default 1/sqrt(d) */
    int away;      /* 1: bf16 magnitudes below range/4 raised to range/4 (no value near 0) */
    int bhsd;      /* strided BHSD layout for q, k, v, o */
    int sinks;     /* 1: a learnable sink logit per head */
} acase;

/* Every bf16 value of t with magnitude below m set to +-m (bf16-rounded), sign kept. */
static void bound_away(tu_tensor *t, double m)
{
    float mf = (float)m;
    uint32_t mb;
    memcpy(&mb, &mf, 4);
    const uint16_t mh = (uint16_t)((mb + 0x7fffu + ((mb >> 16) & 1u)) >> 16);
    const int64_t n = t->t.shape[0] * t->t.shape[1] * t->t.shape[2] * t->t.shape[3];
    uint16_t *x = t->t.data;
    for (int64_t i = 0; i < n; i++)
        if ((x[i] & 0x7fffu) < mh) x[i] = (uint16_t)((x[i] & 0x8000u) | mh);
}

static acase base(int64_t Sq, int64_t Sk, int64_t d, int64_t dv)
{
    acase c;
    memset(&c, 0, sizeof c);
    c.B = 1; c.Sq = Sq; c.Sk = Sk; c.H = 2; c.Hk = 2; c.d = d; c.dv = dv;
    c.wl = -1; c.wr = -1;
    c.range = 1.0;
    return c;
}

/* Skip unless this CPU, kernel and build can run AMX at all. */
static void need_amx_cpu(void)
{
    if (!fa_amx_usable()) {
        print_message("  (no AMX here: %s; skipped)\n", fa_amx_why_not());
        skip();
    }
}

/* ... and the default kernel table is the one the AMX path runs on. */
static void need_amx(void)
{
    need_amx_cpu();
    /* the path runs on the AVX-512 table only (fa_amx_applies): FA_ISA=avx2 or scalar keeps it off */
    fa_status kst;
    const fa_kernels *kern = fa_kernels_get(&kst);
    if (!kern || strcmp(kern->name, "avx512") != 0) {
        print_message("  (the kernel table is %s; the AMX path needs avx512; skipped)\n", kern ? kern->name : "none");
        skip();
    }
}

typedef struct run {
    tu_tensor q, k, v, o, lse, slopes, sinks;
    fa_options opt;
    char what[256];
} run;

static void setup(run *r, const acase *c, fa_dtype dt, uint64_t *rng)
{
    memset(r, 0, sizeof *r);
    r->q = tu_alloc4(dt, c->B, c->Sq, c->H, c->d, c->bhsd);
    r->k = tu_alloc4(dt, c->B, c->Sk, c->Hk, c->d, c->bhsd);
    r->v = tu_alloc4(dt, c->B, c->Sk, c->Hk, c->dv, c->bhsd);
    r->o = tu_alloc4(FA_F32, c->B, c->Sq, c->H, c->dv, 0);
    const int64_t ls[3] = {c->B, c->H, c->Sq};
    r->lse = tu_alloc(FA_F32, 3, ls);
    tu_fill(&r->q, rng, -c->range, c->range);
    tu_fill(&r->k, rng, -c->range, c->range);
    tu_fill(&r->v, rng, c->vrange > 0 ? -c->vrange : -1.0, c->vrange > 0 ? c->vrange : 1.0);
    if (c->away && dt == FA_BF16) {
        bound_away(&r->q, c->range / 4);
        bound_away(&r->k, c->range / 4);
        bound_away(&r->v, (c->vrange > 0 ? c->vrange : 1.0) / 4);
    }
    r->opt = fa_options_default();
    r->opt.scale = c->scale;
    r->opt.causal = c->causal;
    r->opt.window_left = c->wl;
    r->opt.window_right = c->wr;
    r->opt.softcap = c->softcap;
    if (c->alibi) {
        const int64_t sh[1] = {c->H};
        r->slopes = tu_alloc(FA_F32, 1, sh);
        tu_fill(&r->slopes, rng, 0.0, 0.5);
        r->opt.alibi_slopes = &r->slopes.t;
    }
    if (c->sinks) {
        const int64_t sh[1] = {c->H};
        r->sinks = tu_alloc(FA_F32, 1, sh);
        tu_fill(&r->sinks, rng, -1.0, 2.0);
        r->opt.sinks = &r->sinks.t;
    }
    snprintf(r->what, sizeof r->what,
             "B=%lld Sq=%lld Sk=%lld H=%lld Hk=%lld d=%lld dv=%lld causal=%d window=(%lld,%lld) softcap=%g alibi=%d "
             "bhsd=%d sinks=%d",
             (long long)c->B, (long long)c->Sq, (long long)c->Sk, (long long)c->H, (long long)c->Hk,
             (long long)c->d, (long long)c->dv, c->causal, (long long)c->wl, (long long)c->wr, c->softcap, c->alibi,
             c->bhsd, c->sinks);
}

static void teardown(run *r)
{
    tu_free(&r->q); tu_free(&r->k); tu_free(&r->v); tu_free(&r->o); tu_free(&r->lse);
    if (r->slopes.t.data) tu_free(&r->slopes);
    if (r->sinks.t.data) tu_free(&r->sinks);
}

/* flash with FA_AMX on (`amx` "1") or off (NULL), through the tests' override; returns the AMX runs it added. With
 * `finite`, every output must have been written (no poison left). */
static long forward_x(run *r, const char *amx, int threads, int finite)
{
    fa_amx_test = amx ? 1 : 0; /* FA_AMX=1 or off, for the problems resolved from now on */
    tu_poison(&r->o);
    tu_poison(&r->lse);
    r->opt.impl = FA_IMPL_FLASH;
    r->opt.num_threads = threads;
    const long before = atomic_load(&fa_amx_runs);
    const fa_status st = fa_forward(&r->q.t, &r->k.t, &r->v.t, &r->o.t, &r->lse.t, &r->opt);
    fa_amx_test = -1;
    if (st != FA_OK) fail_msg("flash failed: %s (%s)", fa_last_error(), r->what);
    if (finite && (tu_count_nan(&r->o) || tu_count_nan(&r->lse)))
        fail_msg("unwritten (NaN) outputs: O %lld, LSE %lld (%s)", (long long)tu_count_nan(&r->o),
                 (long long)tu_count_nan(&r->lse), r->what);
    return atomic_load(&fa_amx_runs) - before;
}

static long forward(run *r, const char *amx, int threads) { return forward_x(r, amx, threads, 1); }

/* max and mean |O - O_ref| over every element of two same-shaped tensors of any rank (O
 * float32, O_ref float64), and max |O_ref| */
static void errors(const tu_tensor *o, const tu_tensor *o_ref, double *mx, double *mean, double *omax)
{
    int64_t n = 1;
    for (int x = 0; x < o->t.rank; x++) n *= o->t.shape[x];
    const float *a = o->t.data;
    const double *b = o_ref->t.data;
    double m = 0.0, s = 0.0, om = 0.0;
    for (int64_t i = 0; i < n; i++) {
        const double e = fabs((double)a[i] - b[i]);
        if (!(e <= m)) m = e;
        s += e;
        if (fabs(b[i]) > om) om = fabs(b[i]);
    }
    *mx = m;
    *mean = s / (double)n;
    *omax = om;
}

/* The AMX errors (eo, mo, el: O max, O mean, LSE max against float64) held to the float32
 * path's on the same inputs (e32, m32, l32): max e <= 8 e32 + 2^-20 max|O_ref|, mean e <= 4 m32
 * + 2^-24 max|O_ref|, LSE within 4 l32 + 2^-20 max(1, finite |LSE_ref|). */
static void expect_within_f32_path(double eo, double mo, double el, double e32, double m32, double l32, double omax,
                                   const tu_tensor *lse_ref, const char *what)
{
    int64_t nl = 1;
    for (int x = 0; x < lse_ref->t.rank; x++) nl *= lse_ref->t.shape[x];
    double lmax = 1.0;
    for (int64_t i = 0; i < nl; i++) {
        const double y = fabs(((const double *)lse_ref->t.data)[i]);
        if (isfinite(y) && y > lmax) lmax = y;
    }
    const double max_bound = 8.0 * e32 + 0x1p-20 * omax, mean_bound = 4.0 * m32 + 0x1p-24 * omax;
    const double lse_bound = 4.0 * l32 + 0x1p-20 * lmax;
    if (getenv("FA_TEST_VERBOSE"))
        printf("  amx O max %.2e (f32 path %.2e, bound %.2e) mean %.2e (%.2e, %.2e) LSE %.2e (%.2e, %.2e) %s\n", eo,
               e32, max_bound, mo, m32, mean_bound, el, l32, lse_bound, what);
    if (!(eo <= max_bound) || !(mo <= mean_bound))
        fail_msg("O error max %.3g (bound %.3g), mean %.3g (bound %.3g) (%s)", eo, max_bound, mo, mean_bound, what);
    if (!(el <= lse_bound)) fail_msg("LSE error %.3g exceeds %.3g (%s)", el, lse_bound, what);
}

/* AMX against the float64 reference, test_forward.c's bounds. */
static void check_case(const acase *c)
{
    static uint64_t counter;
    uint64_t rng = tu_seed() + 104729 * ++counter;
    run r;
    setup(&r, c, FA_BF16, &rng);
    tu_tensor o_ref = tu_alloc4(FA_F64, c->B, c->Sq, c->H, c->dv, 0);
    const int64_t ls[3] = {c->B, c->H, c->Sq};
    tu_tensor lse_ref = tu_alloc(FA_F64, 3, ls);
    fa_options ro = r.opt;
    ro.impl = FA_IMPL_REFERENCE;
    assert_int_equal(fa_forward(&r.q.t, &r.k.t, &r.v.t, &o_ref.t, &lse_ref.t, &ro), FA_OK);
    /* the float32 path on the same inputs: the error a float32-class result may have */
    assert_int_equal(forward(&r, NULL, 2), 0);
    double e32, m32, omax;
    errors(&r.o, &o_ref, &e32, &m32, &omax);
    int64_t where;
    const double l32 = tu_max_abs_diff(&r.lse, &lse_ref, &where);
    if (forward(&r, "1", 2) != 1) fail_msg("the AMX path did not run (%s)", r.what);
    double eo, mo, unused;
    errors(&r.o, &o_ref, &eo, &mo, &unused);
    const double el = tu_max_abs_diff(&r.lse, &lse_ref, &where);
    expect_within_f32_path(eo, mo, el, e32, m32, l32, omax, &lse_ref, r.what);
    tu_free(&o_ref);
    tu_free(&lse_ref);
    teardown(&r);
}

/* Ensure the AMX forward matches the reference over lengths that straddle its 32-row steps,
 * 128-row tasks and 64-key blocks, and over head dims (d != d_v too). */
static void test_amx_matches_reference_over_shapes(void **state)
{
    (void)state;
    need_amx();
    const int64_t shapes[][4] = {{17, 17, 32, 32},   {31, 65, 64, 64},    {33, 63, 64, 64},
                                 {129, 300, 128, 128}, {300, 129, 64, 128}, {257, 1000, 32, 96},
                                 {200, 311, 256, 64}};
    for (size_t a = 0; a < sizeof shapes / sizeof shapes[0]; a++) {
        acase c = base(shapes[a][0], shapes[a][1], shapes[a][2], shapes[a][3]);
        check_case(&c);
        c.causal = 1;
        c.range = 3.0;
        check_case(&c);
    }
}

/* Ensure masks, softcap, ALiBi, GQA and batches go through the same transform as flash.c. */
static void test_amx_matches_reference_with_masks_and_heads(void **state)
{
    (void)state;
    need_amx();
    acase c = base(300, 333, 64, 64);
    c.wl = 3; c.wr = 9;
    check_case(&c);
    c = base(333, 100, 64, 64);
    c.wl = 64; c.wr = 0;
    check_case(&c);
    c = base(200, 311, 128, 128);
    c.softcap = 5.0;
    c.range = 4.0;
    check_case(&c);
    c.causal = 1;
    c.alibi = 1;
    check_case(&c);
    c = base(150, 230, 64, 64);
    c.B = 2; c.H = 8; c.Hk = 2;
    c.causal = 1;
    check_case(&c);
    c = base(100, 17, 64, 64); /* causal with Sq > Sk: the first rows see no key (O = 0, LSE = -inf) */
    c.causal = 1;
    check_case(&c);
    c = base(150, 230, 64, 128); /* strided BHSD inputs (rows still contiguous) */
    c.bhsd = 1;
    c.causal = 1;
    check_case(&c);
    c = base(150, 230, 128, 128); /* sinks: the denominator only, in fa_finish_row */
    c.sinks = 1;
    check_case(&c);
}

/* Ensure the AMX forward gives the same bits on 1, 2, 3, 7 and 16 threads (one pair per pass,
 * uneven passes, every pair in one pass). */
static void test_amx_bits_independent_of_threads(void **state)
{
    (void)state;
    need_amx();
    uint64_t rng = tu_seed() + 31;
    acase c = base(300, 500, 128, 128);
    c.B = 2; c.H = 4; c.Hk = 2; c.causal = 1; /* 4 (batch, kv head) pairs of 6 tasks each */
    run r;
    setup(&r, &c, FA_BF16, &rng);
    assert_int_equal(forward(&r, "1", 1), 1);
    const size_t ob = (size_t)(c.B * c.Sq * c.H * c.dv) * 4, lb = (size_t)(c.B * c.H * c.Sq) * 4;
    float *o1 = malloc(ob), *l1 = malloc(lb);
    assert_non_null(o1); assert_non_null(l1);
    memcpy(o1, r.o.t.data, ob);
    memcpy(l1, r.lse.t.data, lb);
    /* 7 threads: passes of 3 pairs and 1 (fa_amx_pass_pairs); 16: all 4 pairs in one pass */
    static const int threads[4] = {2, 3, 7, 16};
    for (int x = 0; x < 4; x++) {
        assert_int_equal(forward(&r, "1", threads[x]), 1);
        if (memcmp(o1, r.o.t.data, ob) || memcmp(l1, r.lse.t.data, lb))
            fail_msg("bits differ at %d threads", threads[x]);
    }
    free(o1); free(l1);
    teardown(&r);
}

/* The float32 path's outputs with and without FA_AMX=1 must be the same bits, and the AMX
 * path must not have run. */
static void expect_handover(run *r)
{
    assert_int_equal(forward_x(r, NULL, 2, 0), 0);
    const int64_t on = r->o.t.shape[0] * r->o.t.shape[1] * r->o.t.shape[2] * r->o.t.shape[3];
    const int64_t ln = r->lse.t.shape[0] * r->lse.t.shape[1] * r->lse.t.shape[2];
    float *o = malloc((size_t)on * 4), *l = malloc((size_t)ln * 4);
    assert_non_null(o); assert_non_null(l);
    memcpy(o, r->o.t.data, (size_t)on * 4);
    memcpy(l, r->lse.t.data, (size_t)ln * 4);
    if (forward_x(r, "1", 2, 0) != 0) fail_msg("the AMX path ran (%s)", r->what);
    if (memcmp(o, r->o.t.data, (size_t)on * 4) || memcmp(l, r->lse.t.data, (size_t)ln * 4))
        fail_msg("FA_AMX=1 changed the float32 path's bits (%s)", r->what);
    free(o); free(l);
}

/* Ensure Inf/NaN in Q, K or V, and problems the AMX path does not take (float32, d not a
 * multiple of 32), give the float32 path's bits exactly. */
static void test_amx_hands_over_nonfinite_and_other_problems(void **state)
{
    (void)state;
    need_amx();
    uint64_t rng = tu_seed() + 77;
    const uint16_t inf = 0x7f80, nan = 0x7fc1;
    for (int which = 0; which < 4; which++) {
        acase c = base(100, 150, 64, 64);
        c.causal = 1;
        run r;
        setup(&r, &c, FA_BF16, &rng);
        tu_tensor *t = which == 0 ? &r.q : which == 1 ? &r.k : &r.v;
        /* a value at a masked position for V (key 149, seen by no query row but the last ones) */
        ((uint16_t *)t->t.data)[which == 3 ? 149 * 2 * 64 + 5 : 37 * 2 * 64 + 3] = which == 2 ? nan : inf;
        expect_handover(&r);
        teardown(&r);
    }
    acase c = base(100, 150, 64, 64);
    run r;
    setup(&r, &c, FA_F32, &rng);
    expect_handover(&r);
    teardown(&r);
    c = base(100, 150, 40, 40);
    setup(&r, &c, FA_BF16, &rng);
    expect_handover(&r);
    teardown(&r);
}

/* Ensure values near the edges of the tiles' range still give float32-class results: Q, K
 * of magnitude 2.5e-12 to 1e-11 (products ~1e-23, far from AMX's flush to zero below 2^-126)
 * with a scale that makes the logits O(1), V likewise; then around 1e9 (products ~1e18). */
static void test_amx_small_magnitudes_inside_the_range(void **state)
{
    (void)state;
    need_amx();
    acase c = base(200, 311, 64, 64);
    c.away = 1; /* uniform values near 0 would fall below 2^-40 and hand over */
    c.range = 1e-11;
    c.scale = 1e22;
    c.vrange = 1e-11;
    check_case(&c);
    c.causal = 1;
    c.range = 1e9; /* products ~1e18 */
    c.scale = 1e-18;
    c.vrange = 1e9;
    check_case(&c);
}

/* Ensure a value the tiles would not compute to float32's standard (a product that AMX would
 * flush to zero, a magnitude from 2^40) sends the call to the float32 path. */
static void test_amx_hands_over_values_outside_its_range(void **state)
{
    (void)state;
    need_amx();
    uint64_t rng = tu_seed() + 91;
    const uint16_t tiny = 0x2100, /* 2^-61: q.k products below 2^-120 once K is small too */
        sub = 0x0001,             /* a subnormal bf16 */
        huge = 0x5480;            /* 2^42 */
    const uint16_t vals[3] = {tiny, sub, huge};
    for (int which = 0; which < 3; which++)
        for (int x = 0; x < 3; x++) {
            acase c = base(100, 150, 64, 64);
            run r;
            setup(&r, &c, FA_BF16, &rng);
            tu_tensor *t = which == 0 ? &r.q : which == 1 ? &r.k : &r.v;
            ((uint16_t *)t->t.data)[(size_t)(41 * 2 * 64 + 7)] = vals[x];
            expect_handover(&r);
            teardown(&r);
        }
}

/* Ensure a Q row with NaN in the first of many tasks hands over on several threads without
 * the team splitting across worksharing loops (the hostile review's deadlock: a thread that
 * read the flag after another had set it skipped the task loop the others were in). */
static void test_amx_nan_in_an_early_task_on_many_threads(void **state)
{
    (void)state;
    need_amx();
    uint64_t rng = tu_seed() + 5;
    acase c = base(2000, 256, 64, 64);
    c.H = 1; c.Hk = 1;
    run r;
    setup(&r, &c, FA_BF16, &rng);
    ((uint16_t *)r.q.t.data)[5] = 0x7fc1;
    for (int t = 2; t <= 7; t += 5)
        for (int i = 0; i < 5; i++) assert_int_equal(forward_x(&r, "1", t, 0), 0);
    teardown(&r);
    /* several passes of (batch, kv head) pairs (8 pairs of 2 tasks, 2 threads: 2 pairs a pass),
     * the NaN in the first: the later passes are skipped, and the float32 path's bits result */
    c = base(256, 256, 64, 64);
    c.H = 8; c.Hk = 8;
    setup(&r, &c, FA_BF16, &rng);
    ((uint16_t *)r.q.t.data)[5] = 0x7fc1;
    for (int t = 2; t <= 7; t += 5) {
        assert_int_equal(forward_x(&r, NULL, t, 0), 0);
        tu_tensor o0 = tu_alloc(FA_F32, r.o.t.rank, r.o.t.shape);
        memcpy(o0.mem, r.o.mem, o0.bytes);
        fa_count_test = 1;
        fa_count_packed = 0;
        assert_int_equal(forward_x(&r, "1", t, 0), 0);
        fa_count_test = 0;
        /* only the first pass packed (2 key blocks a pair): fa_amx_pass_pairs gives 2 pairs a
         * pass on 2 threads (2 tasks a thread, 2 a pair), and 8 pairs in 2 even passes of 4 on 7 */
        const long one_pass = t == 2 ? 2 * 2 : 4 * 2;
        if (fa_count_packed != one_pass)
            fail_msg("%d threads: %ld key blocks packed after the NaN pass's tasks, want one pass's %ld", t,
                     (long)fa_count_packed, one_pass);
        assert_memory_equal(o0.mem, r.o.mem, o0.bytes);
        tu_free(&o0);
    }
    teardown(&r);
}

/* One AMX forward (FA_AMX=1) must run and allocate no more than fa_workspace_bytes planned. */
static void expect_workspace_covers(const fa_tensor *q, const fa_tensor *k, const fa_tensor *v, fa_tensor *o,
                                    fa_tensor *lse, const fa_options *opt)
{
    fa_amx_test = 1;
    size_t planned = 0;
    assert_int_equal(fa_workspace_bytes(q, k, v, opt, &planned), FA_OK);
    fa_alloc_stats before, after;
    fa_alloc_stats_reset();
    fa_alloc_stats_get(&before);
    const long runs = fa_amx_calls();
    assert_int_equal(fa_forward(q, k, v, o, lse, opt), FA_OK);
    fa_alloc_stats_get(&after);
    fa_amx_test = -1;
    assert_int_equal(fa_amx_calls() - runs, 1);
    const size_t peak = after.peak_bytes - before.current_bytes;
    if (peak > planned) fail_msg("the AMX path allocated %zu bytes, fa_workspace_bytes said %zu", peak, planned);
}

/* Ensure fa_workspace_bytes covers what the AMX path allocates, with more threads than tasks. */
static void test_amx_workspace_covers_its_allocations(void **state)
{
    (void)state;
    need_amx();
    uint64_t rng = tu_seed() + 3;
    acase c = base(40, 300, 1024, 1024);
    run r;
    setup(&r, &c, FA_BF16, &rng);
    r.opt.num_threads = 64;
    r.opt.impl = FA_IMPL_FLASH;
    expect_workspace_covers(&r.q.t, &r.k.t, &r.v.t, &r.o.t, &r.lse.t, &r.opt);
    teardown(&r);
}

/* Ensure fa_workspace_bytes covers the AMX path where its plan is the larger one: many short
 * varlen sequences (the float32 path packs per task there, not in a shared pass) on 16 threads,
 * so a pass holds several (batch, kv head) pairs. */
static void test_amx_workspace_covers_varlen_passes(void **state)
{
    (void)state;
    need_amx();
    uint64_t rng = tu_seed() + 5;
    enum { NB = 32, H = 4, D = 128 };
    int32_t cu_q[NB + 1], cu_k[NB + 1];
    cu_q[0] = cu_k[0] = 0;
    for (int b = 0; b < NB; b++) {
        cu_q[b + 1] = cu_q[b] + 1 + (int32_t)(tu_next(&rng) % 130);
        cu_k[b + 1] = cu_k[b] + 1 + (int32_t)(tu_next(&rng) % 600);
    }
    const int64_t qs[3] = {cu_q[NB], H, D}, ks[3] = {cu_k[NB], H, D}, ls[2] = {H, cu_q[NB]};
    tu_tensor q = tu_alloc(FA_BF16, 3, qs), k = tu_alloc(FA_BF16, 3, ks), v = tu_alloc(FA_BF16, 3, ks);
    tu_tensor o = tu_alloc(FA_F32, 3, qs), lse = tu_alloc(FA_F32, 2, ls);
    tu_fill(&q, &rng, -1.0, 1.0);
    tu_fill(&k, &rng, -1.0, 1.0);
    tu_fill(&v, &rng, -1.0, 1.0);
    fa_varlen vl = fa_varlen_default();
    vl.batch = NB;
    vl.cu_seqlens_q = cu_q;
    vl.cu_seqlens_k = cu_k;
    fa_options opt = fa_options_default();
    opt.varlen = &vl;
    opt.causal = 1;
    opt.num_threads = 16;
    opt.impl = FA_IMPL_FLASH;
    expect_workspace_covers(&q.t, &k.t, &v.t, &o.t, &lse.t, &opt);
    tu_free(&q); tu_free(&k); tu_free(&v); tu_free(&o); tu_free(&lse);
}

/* Ensure a kernel table other than AVX-512's (a context made for "avx2" or "scalar") keeps the
 * AMX path off, and gives that table's float32 bits with FA_AMX=1 as without. */
static void test_amx_off_with_another_kernel_table(void **state)
{
    (void)state;
    need_amx_cpu(); /* any default table: the contexts below pick avx2 and scalar */
    uint64_t rng = tu_seed() + 17;
    const char *isas[2] = {"avx2", "scalar"};
    for (int x = 0; x < 2; x++) {
        if (!fa_isa_supported(isas[x])) continue;
        acase c = base(100, 150, 64, 64);
        run r;
        setup(&r, &c, FA_BF16, &rng);
        assert_int_equal(fa_context_create(&r.opt.context, isas[x], 2), FA_OK);
        expect_handover(&r);
        fa_context_destroy(r.opt.context);
        teardown(&r);
    }
}

/* Ensure fa_amx_why_not() agrees with fa_amx_available() (NULL exactly when available, else a
 * non-empty reason) and gives the same answer on every call. Runs on every machine. */
static void test_amx_why_not_agrees_with_available(void **state)
{
    (void)state;
    const char *why = fa_amx_why_not();
    assert_int_equal(why == NULL, fa_amx_available() != 0);
    assert_int_equal(fa_amx_available() != 0, fa_amx_usable() != 0);
    if (why) assert_true(why[0] != '\0');
    assert_ptr_equal(fa_amx_why_not(), why);
    print_message("  amx: %s\n", why ? why : "available");
}

/* ---- serving geometries: varlen, KV cache with appended keys, paged KV ---------------------- */

/* One serving call (opt carries varlen or kvcache) on bf16 q, k, v: the reference (float64),
 * the float32 path, then AMX, which must run and stay within check_case's bounds of the
 * float32 path's own error. The AMX output is left in o, lse. */
static void check_serving(const fa_tensor *q, const fa_tensor *k, const fa_tensor *v, tu_tensor *o, tu_tensor *lse,
                          const fa_options *opt, const char *what)
{
    tu_tensor o_ref = tu_alloc(FA_F64, o->t.rank, o->t.shape), lse_ref = tu_alloc(FA_F64, lse->t.rank, lse->t.shape);
    fa_options ro = *opt, fo = *opt;
    ro.impl = FA_IMPL_REFERENCE;
    if (fa_forward(q, k, v, &o_ref.t, &lse_ref.t, &ro) != FA_OK) fail_msg("reference: %s (%s)", fa_last_error(), what);
    fo.impl = FA_IMPL_FLASH;
    fo.num_threads = 2;
    double e[2], m[2], omax = 0.0, l[2];
    for (int amx = 0; amx < 2; amx++) {
        fa_amx_test = amx;
        tu_poison(o);
        tu_poison(lse);
        const long before = fa_amx_calls();
        const fa_status st = fa_forward(q, k, v, &o->t, &lse->t, &fo);
        fa_amx_test = -1;
        if (st != FA_OK) fail_msg("flash (amx %d): %s (%s)", amx, fa_last_error(), what);
        if (fa_amx_calls() - before != amx) fail_msg("AMX runs %ld, want %d (%s)", fa_amx_calls() - before, amx, what);
        if (tu_count_nan(o) || tu_count_nan(lse)) fail_msg("unwritten outputs (amx %d) (%s)", amx, what);
        errors(o, &o_ref, &e[amx], &m[amx], &omax);
        int64_t where;
        l[amx] = tu_max_abs_diff(lse, &lse_ref, &where);
    }
    /* AMX on 16 threads: several (batch, kv head) pairs per pass, sequences of other lengths
     * side by side in one pass; the same bits as on 2 */
    tu_tensor o2 = tu_alloc(FA_F32, o->t.rank, o->t.shape), l2 = tu_alloc(FA_F32, lse->t.rank, lse->t.shape);
    memcpy(o2.mem, o->mem, o->bytes);
    memcpy(l2.mem, lse->mem, lse->bytes);
    fo.num_threads = 16;
    fa_amx_test = 1;
    tu_poison(o);
    tu_poison(lse);
    const long before16 = fa_amx_calls();
    const fa_status st16 = fa_forward(q, k, v, &o->t, &lse->t, &fo);
    fa_amx_test = -1;
    if (st16 != FA_OK || fa_amx_calls() - before16 != 1) fail_msg("AMX on 16 threads did not run (%s)", what);
    if (memcmp(o2.mem, o->mem, o->bytes) || memcmp(l2.mem, lse->mem, lse->bytes))
        fail_msg("AMX: 16 threads gave other bits than 2 (%s)", what);
    tu_free(&o2);
    tu_free(&l2);
    expect_within_f32_path(e[1], m[1], l[1], e[0], m[0], l[0], omax, &lse_ref, what);
    /* and on its own, not only relative to the float32 path (a fault both paths shared) */
    if (!(e[0] <= 0x1p-16 * omax) || !(e[1] <= 0x1p-16 * omax))
        fail_msg("O error %.3g (float32 path %.3g) above 2^-16 max|O_ref| = %.3g (%s)", e[1], e[0], 0x1p-16 * omax, what);
    tu_free(&o_ref);
    tu_free(&lse_ref);
}

/* Ensure the AMX forward serves varlen batches (a zero-length sequence, seqused_k, lengths that
 * straddle its 32-row steps and 128-key blocks; causal and a window; GQA) to the float32 path's
 * error against float64. */
static void test_amx_varlen(void **state)
{
    (void)state;
    need_amx();
    uint64_t rng = tu_seed() + 7;
    enum { NB = 4, H = 4, HK = 2, D = 64 };
    const int32_t cu_q[NB + 1] = {0, 37, 37, 170, 203}, cu_k[NB + 1] = {0, 150, 151, 420, 455};
    const int32_t used[NB] = {150, 1, 200, 35};
    const int64_t qs[3] = {cu_q[NB], H, D}, ks[3] = {cu_k[NB], HK, D}, ls[2] = {H, cu_q[NB]};
    tu_tensor q = tu_alloc(FA_BF16, 3, qs), k = tu_alloc(FA_BF16, 3, ks), v = tu_alloc(FA_BF16, 3, ks);
    tu_tensor o = tu_alloc(FA_F32, 3, qs), lse = tu_alloc(FA_F32, 2, ls);
    tu_fill(&q, &rng, -1.0, 1.0);
    tu_fill(&k, &rng, -1.0, 1.0);
    tu_fill(&v, &rng, -1.0, 1.0);
    for (int mode = 0; mode < 3; mode++) {
        fa_varlen vl = fa_varlen_default();
        vl.batch = NB;
        vl.cu_seqlens_q = cu_q;
        vl.cu_seqlens_k = cu_k;
        vl.seqused_k = mode == 2 ? used : NULL;
        fa_options opt = fa_options_default();
        opt.varlen = &vl;
        opt.causal = mode != 1;
        if (mode == 1) {
            opt.window_left = 40;
            opt.window_right = 7;
        }
        char what[64];
        snprintf(what, sizeof what, "varlen, %s", mode == 0 ? "causal" : mode == 1 ? "window (40, 7)" : "causal, seqused_k");
        check_serving(&q.t, &k.t, &v.t, &o, &lse, &opt, what);
    }
    tu_free(&q); tu_free(&k); tu_free(&v); tu_free(&o); tu_free(&lse);
}

/* Ensure the AMX forward serves a KV cache with new keys appended (cache_batch_idx, causal) and
 * the same cache paged (pages of 16 and of 3 rows, pages shuffled): the float32 path's error
 * against float64, and the paged outputs bit-identical to the contiguous cache's, as the
 * library promises for every path. */
static void test_amx_kvcache_and_pages(void **state)
{
    (void)state;
    need_amx();
    uint64_t rng = tu_seed() + 11;
    enum { B = 3, SQ = 40, SC = 300, SN = 5, H = 4, HK = 2, D = 64 };
    const int32_t cs[B] = {0, 131, 290}, cbi[B] = {2, 0, 1};
    tu_tensor q = tu_alloc4(FA_BF16, B, SQ, H, D, 0);
    tu_tensor kc = tu_alloc4(FA_BF16, B, SC, HK, D, 0), vc = tu_alloc4(FA_BF16, B, SC, HK, D, 0);
    tu_tensor kn = tu_alloc4(FA_BF16, B, SN, HK, D, 0), vn = tu_alloc4(FA_BF16, B, SN, HK, D, 0);
    tu_tensor o = tu_alloc4(FA_F32, B, SQ, H, D, 0), oc = tu_alloc4(FA_F32, B, SQ, H, D, 0);
    const int64_t ls[3] = {B, H, SQ};
    tu_tensor lse = tu_alloc(FA_F32, 3, ls), lc = tu_alloc(FA_F32, 3, ls);
    tu_tensor *fill[5] = {&q, &kc, &vc, &kn, &vn};
    for (int x = 0; x < 5; x++) tu_fill(fill[x], &rng, -1.0, 1.0);

    /* contiguous, with cache_batch_idx (the appends land in cache rows cs[b].. of cache cbi[b]) */
    fa_kvcache kv = fa_kvcache_default();
    kv.cache_seqlens = cs;
    kv.k_new = &kn.t;
    kv.v_new = &vn.t;
    kv.cache_batch_idx = cbi;
    fa_options opt = fa_options_default();
    opt.kvcache = &kv;
    opt.causal = 1;
    check_serving(&q.t, &kc.t, &vc.t, &o, &lse, &opt, "kv cache, cache_batch_idx, causal");

    /* without cache_batch_idx, contiguous: the outputs the paged runs must reproduce */
    kv.cache_batch_idx = NULL;
    check_serving(&q.t, &kc.t, &vc.t, &oc, &lc, &opt, "kv cache, causal");
    static const int page_sizes[2] = {16, 3};
    for (int pi = 0; pi < 2; pi++) {
        const int ps = page_sizes[pi], per = (SC + ps - 1) / ps, npages = B * per;
        tu_tensor kp = tu_alloc4(FA_BF16, npages, ps, HK, D, 0), vp = tu_alloc4(FA_BF16, npages, ps, HK, D, 0);
        int32_t *table = malloc(sizeof(int32_t) * (size_t)npages);
        assert_non_null(table);
        /* page e of sequence b is physical page (e * B + b) reversed: shuffled, every page used once */
        for (int b = 0; b < B; b++)
            for (int e = 0; e < per; e++) table[b * per + e] = npages - 1 - (e * B + b);
        memset(kp.mem, 0, kp.bytes);
        memset(vp.mem, 0, vp.bytes);
        const size_t row = (size_t)HK * D * 2;
        for (int b = 0; b < B; b++)
            for (int r = 0; r < cs[b]; r++) { /* the cached rows (the appends write the new ones) */
                const int64_t pg = table[b * per + r / ps], at = (pg * ps + r % ps) * (int64_t)row;
                memcpy((char *)kp.mem + at, (const char *)kc.mem + ((size_t)b * SC + (size_t)r) * row, row);
                memcpy((char *)vp.mem + at, (const char *)vc.mem + ((size_t)b * SC + (size_t)r) * row, row);
            }
        kv.block_table = table;
        kv.max_pages = per;
        char what[64];
        snprintf(what, sizeof what, "paged kv cache, page %d, causal", ps);
        check_serving(&q.t, &kp.t, &vp.t, &o, &lse, &opt, what);
        if (memcmp(o.mem, oc.mem, o.bytes) || memcmp(lse.mem, lc.mem, lse.bytes))
            fail_msg("AMX: the paged cache (page %d) gave other bits than the contiguous one", ps);
        kv.block_table = NULL;
        kv.max_pages = 0;
        free(table);
        tu_free(&kp);
        tu_free(&vp);
    }
    for (int x = 0; x < 5; x++) tu_free(fill[x]);
    tu_free(&o); tu_free(&oc); tu_free(&lse); tu_free(&lc);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_amx_why_not_agrees_with_available),
        cmocka_unit_test(test_amx_matches_reference_over_shapes),
        cmocka_unit_test(test_amx_matches_reference_with_masks_and_heads),
        cmocka_unit_test(test_amx_bits_independent_of_threads),
        cmocka_unit_test(test_amx_hands_over_nonfinite_and_other_problems),
        cmocka_unit_test(test_amx_small_magnitudes_inside_the_range),
        cmocka_unit_test(test_amx_hands_over_values_outside_its_range),
        cmocka_unit_test(test_amx_nan_in_an_early_task_on_many_threads),
        cmocka_unit_test(test_amx_workspace_covers_its_allocations),
        cmocka_unit_test(test_amx_workspace_covers_varlen_passes),
        cmocka_unit_test(test_amx_off_with_another_kernel_table),
        cmocka_unit_test(test_amx_varlen),
        cmocka_unit_test(test_amx_kvcache_and_pages),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
