/*
 * test_robustness.c — numerical edge cases: huge logits, extreme scales,
 * NaN/Inf inputs, rows with no visible key, d = 1, seqlen 1, and sequence
 * lengths whose index arithmetic needs 64 bits.
 *
 * The policy these tests pin down is written in docs/robustness.md:
 *   - no overflow: every exp() argument is <= 0 (scores are shifted by the
 *     running max), so logits of +-1e4 and scales of 1e-30..1e30 give the
 *     float64 reference's answer;
 *   - the library never refuses or crashes on NaN/Inf inputs; a non-finite
 *     value reaches exactly the query rows that read it (its own query row, or
 *     the rows whose mask makes the key visible); every other row is the same
 *     as the reference computed on the same inputs (the CLI, unlike the
 *     library, refuses non-finite inputs: see test_corpus.sh);
 *   - a row with no visible key is O = 0, LSE = -inf, never NaN.
 */
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOL 5e-5

static const fa_impl all_impls[3] = {FA_IMPL_REFERENCE, FA_IMPL_FLASH, FA_IMPL_STANDARD};

/* A problem with its own buffers: q, k, v, o (f32 unless said), lse f64. */
typedef struct problem {
    tu_tensor q, k, v, o, lse;
    int64_t B, Sq, Sk, H, Hk, d, dv;
} problem;

static problem problem_alloc(int64_t B, int64_t Sq, int64_t Sk, int64_t H, int64_t Hk, int64_t d,
                             int64_t dv)
{
    problem p;
    p.B = B; p.Sq = Sq; p.Sk = Sk; p.H = H; p.Hk = Hk; p.d = d; p.dv = dv;
    p.q = tu_alloc4(FA_F32, B, Sq, H, d, 0);
    p.k = tu_alloc4(FA_F32, B, Sk, Hk, d, 0);
    p.v = tu_alloc4(FA_F32, B, Sk, Hk, dv, 0);
    p.o = tu_alloc4(FA_F64, B, Sq, H, dv, 0);
    int64_t ls[3] = {B, H, Sq};
    p.lse = tu_alloc(FA_F64, 3, ls);
    return p;
}

static void problem_free(problem *p)
{
    tu_free(&p->q); tu_free(&p->k); tu_free(&p->v); tu_free(&p->o); tu_free(&p->lse);
}

/* Run `impl` into fresh (poisoned) outputs owned by the caller. */
static void run(problem *p, fa_options opt, fa_impl impl, tu_tensor *o, tu_tensor *lse)
{
    *o = tu_alloc4(FA_F64, p->B, p->Sq, p->H, p->dv, 0);
    int64_t ls[3] = {p->B, p->H, p->Sq};
    *lse = tu_alloc(FA_F64, 3, ls);
    tu_poison(o);
    tu_poison(lse);
    opt.impl = impl;
    fa_status st = fa_forward(&p->q.t, &p->k.t, &p->v.t, &o->t, &lse->t, &opt);
    if (st != FA_OK) fail_msg("%s: %s: %s", fa_impl_name(impl), fa_status_string(st), fa_last_error());
}

/* float32 value of element (b, s, h, c) of a rank-4 f32 tensor. */
static float *at4(tu_tensor *t, int64_t b, int64_t s, int64_t h, int64_t c)
{
    return (float *)t->mem + b * t->t.stride[0] + s * t->t.stride[1] + h * t->t.stride[2] + c * t->t.stride[3];
}

/* Fill with small integers in [-r, r]: float32 dot products of them are exact. */
static void fill_integers(tu_tensor *t, uint64_t *rng, int r)
{
    float *x = t->mem;
    int64_t n = fa_tensor_numel(&t->t);
    for (int64_t i = 0; i < n; i++) x[i] = (float)((int64_t)(tu_next(rng) % (uint64_t)(2 * r + 1)) - r);
}

/* Max error of O and LSE (relative to |LSE| beyond 1) of every implementation vs reference. */
static void expect_all_match_reference(problem *p, fa_options opt, const char *what)
{
    tu_tensor o_ref, l_ref;
    run(p, opt, FA_IMPL_REFERENCE, &o_ref, &l_ref);
    assert_int_equal(tu_count_nan(&o_ref), 0);
    for (int i = 1; i < 3; i++) {
        tu_tensor o, l;
        run(p, opt, all_impls[i], &o, &l);
        int64_t where;
        double eo = tu_max_abs_diff(&o, &o_ref, &where);
        if (!(eo <= TOL)) fail_msg("%s: %s O error %g at flat %lld", what, fa_impl_name(all_impls[i]), eo, (long long)where);
        int64_t n = fa_tensor_numel(&l.t);
        for (int64_t e = 0; e < n; e++) {
            double a = ((double *)l.mem)[e], r = ((double *)l_ref.mem)[e];
            if (isinf(r) && a == r) continue;
            double tol = TOL + 2e-7 * fabs(r); /* float32 holds a logit of 1e4 to ~5e-4 */
            if (!(fabs(a - r) <= tol))
                fail_msg("%s: %s LSE %.9g vs reference %.9g at flat %lld", what,
                         fa_impl_name(all_impls[i]), a, r, (long long)e);
        }
        tu_free(&o); tu_free(&l);
    }
    tu_free(&o_ref); tu_free(&l_ref);
}

/* ------------------------------------------------------------------------ */
/* Huge logits and extreme scales                                            */
/* ------------------------------------------------------------------------ */

/* Ensure no implementation overflows when logits reach +-1e4. */
static void test_all_match_reference_when_logits_reach_1e4(void **state)
{
    (void)state;
    uint64_t rng = tu_seed() ^ 0x1e4;
    /* integers in [-25, 25], d = 16, scale 1: |q.k| <= 10000, computed exactly in float32 */
    problem p = problem_alloc(1, 70, 90, 2, 2, 16, 8);
    fill_integers(&p.q, &rng, 25);
    fill_integers(&p.k, &rng, 25);
    tu_fill(&p.v, &rng, -1, 1);
    fa_options opt = fa_options_default();
    opt.scale = 1.0;
    expect_all_match_reference(&p, opt, "logits 1e4");
    opt.causal = 1;
    expect_all_match_reference(&p, opt, "logits 1e4, causal");
    /* every logit hugely negative: the max shift must keep exp() from underflowing to 0/0 */
    for (int64_t i = 0; i < fa_tensor_numel(&p.k.t); i++) ((float *)p.k.mem)[i] = 0.0f;
    for (int64_t i = 0; i < fa_tensor_numel(&p.q.t); i++) ((float *)p.q.mem)[i] = -1.0f;
    for (int64_t j = 0; j < p.Sk; j++)
        for (int64_t c = 0; c < p.d; c++) *at4(&p.k, 0, j, 0, c) = *at4(&p.k, 0, j, 1, c) = 40.0f;
    opt.scale = 15.625; /* q.k = -640 per key, logit -1e4 */
    expect_all_match_reference(&p, opt, "all logits -1e4");
    problem_free(&p);
}

/* Ensure scales from 1e-30 to 1e30 give the reference's answer. */
static void test_all_match_reference_when_scale_is_extreme(void **state)
{
    (void)state;
    static const double scales[] = {1e-30, 1e-8, 1e8, 1e30};
    uint64_t rng = tu_seed() ^ 0x5ca1e;
    problem p = problem_alloc(1, 33, 47, 2, 1, 4, 5);
    fill_integers(&p.q, &rng, 1); /* q.k in {-4..4}: scale * q.k is exact in float32 */
    fill_integers(&p.k, &rng, 1);
    tu_fill(&p.v, &rng, -1, 1);
    for (size_t s = 0; s < sizeof scales / sizeof scales[0]; s++) {
        char what[64];
        snprintf(what, sizeof what, "scale %g", scales[s]);
        fa_options opt = fa_options_default();
        opt.scale = scales[s];
        expect_all_match_reference(&p, opt, what);
        opt.causal = 1;
        opt.softcap = 30.0; /* capped: a huge scale saturates tanh instead */
        expect_all_match_reference(&p, opt, what);
    }
    problem_free(&p);
}

/* ------------------------------------------------------------------------ */
/* NaN and Inf inputs                                                        */
/* ------------------------------------------------------------------------ */

/* Is any element of row (b, i, h) of O NaN? All of them finite? */
static int row_has_nan(const tu_tensor *o, int64_t b, int64_t i, int64_t h, int64_t dv)
{
    for (int64_t c = 0; c < dv; c++) {
        int64_t idx[4] = {b, i, h, c};
        if (isnan(tu_get(o, idx))) return 1;
    }
    return 0;
}

/* Ensure a NaN in one key reaches only the rows that see that key, in every implementation. */
static void test_nan_key_is_confined_to_rows_that_see_it(void **state)
{
    (void)state;
    uint64_t rng = tu_seed() ^ 0x4a4;
    const int64_t Sq = 80, Sk = 80, j_bad = 37;
    problem p = problem_alloc(1, Sq, Sk, 2, 1, 16, 16);
    tu_fill(&p.q, &rng, -1, 1);
    tu_fill(&p.k, &rng, -1, 1);
    tu_fill(&p.v, &rng, -1, 1);
    *at4(&p.k, 0, j_bad, 0, 3) = NAN;
    fa_options opt = fa_options_default();
    opt.causal = 1;
    opt.window_left = 20; /* rows 37..57 see key 37 */
    tu_tensor o_ref, l_ref;
    run(&p, opt, FA_IMPL_REFERENCE, &o_ref, &l_ref);
    for (int m = 0; m < 3; m++) {
        tu_tensor o, l;
        run(&p, opt, all_impls[m], &o, &l);
        for (int64_t h = 0; h < 2; h++)
            for (int64_t i = 0; i < Sq; i++) {
                const int sees = i >= j_bad && i <= j_bad + 20;
                const int nan = row_has_nan(&o, 0, i, h, p.dv);
                int64_t li[3] = {0, h, i};
                if (sees && !nan)
                    fail_msg("%s: row %lld sees the NaN key but O is finite", fa_impl_name(all_impls[m]), (long long)i);
                if (sees && !isnan(tu_get(&l, li)))
                    fail_msg("%s: row %lld sees the NaN key but LSE is not NaN", fa_impl_name(all_impls[m]), (long long)i);
                if (!sees && nan)
                    fail_msg("%s: NaN leaked into row %lld (head %lld), which cannot see key %lld",
                             fa_impl_name(all_impls[m]), (long long)i, (long long)h, (long long)j_bad);
                if (!sees) {
                    for (int64_t c = 0; c < p.dv; c++) {
                        int64_t idx[4] = {0, i, h, c};
                        assert_true(fabs(tu_get(&o, idx) - tu_get(&o_ref, idx)) <= TOL);
                    }
                    assert_true(fabs(tu_get(&l, li) - tu_get(&l_ref, li)) <= TOL);
                }
            }
        tu_free(&o); tu_free(&l);
    }
    tu_free(&o_ref); tu_free(&l_ref);
    problem_free(&p);
}

/*
 * Ensure a NaN in one value element reaches only that column of the rows that
 * see it. (Masked keys have P = 0, and 0 * NaN is NaN: an implementation that
 * multiplies masked probabilities into V leaks it.) Several key positions and
 * tile sizes, so the NaN sits inside partly masked tiles.
 */
static void test_nan_value_is_confined_to_rows_that_see_it(void **state)
{
    (void)state;
    static const int64_t bad_keys[] = {50, 31, 64, 89};
    static const int blocks[][2] = {{0, 0}, {16, 16}, {8, 32}, {64, 64}};
    uint64_t rng = tu_seed() ^ 0x4a5;
    const int64_t Sq = 70, Sk = 90, c_bad = 5; /* diag offset Sk - Sq = 20 */
    for (size_t kb = 0; kb < sizeof bad_keys / sizeof bad_keys[0]; kb++)
        for (size_t bl = 0; bl < sizeof blocks / sizeof blocks[0]; bl++) {
            const int64_t j_bad = bad_keys[kb];
            problem p = problem_alloc(1, Sq, Sk, 1, 1, 8, 12);
            tu_fill(&p.q, &rng, -1, 1);
            tu_fill(&p.k, &rng, -1, 1);
            tu_fill(&p.v, &rng, -1, 1);
            *at4(&p.v, 0, j_bad, 0, c_bad) = NAN;
            fa_options opt = fa_options_default();
            opt.causal = 1; /* row i sees keys j <= i + 20 */
            opt.block_q = blocks[bl][0];
            opt.block_k = blocks[bl][1];
            for (int m = 0; m < 3; m++) {
                tu_tensor o, l;
                run(&p, opt, all_impls[m], &o, &l);
                for (int64_t i = 0; i < Sq; i++) {
                    const int sees = i + 20 >= j_bad;
                    for (int64_t c = 0; c < p.dv; c++) {
                        int64_t idx[4] = {0, i, 0, c};
                        const int nan = isnan(tu_get(&o, idx));
                        if (nan != (sees && c == c_bad))
                            fail_msg("%s (NaN at V[%lld][%lld], blocks %d x %d): O[%lld][%lld] is %s",
                                     fa_impl_name(all_impls[m]), (long long)j_bad, (long long)c_bad,
                                     blocks[bl][0], blocks[bl][1], (long long)i, (long long)c,
                                     nan ? "NaN but cannot see the NaN value" : "finite but sees the NaN value");
                    }
                    int64_t li[3] = {0, 0, i};
                    assert_true(isfinite(tu_get(&l, li))); /* V never enters the LSE */
                }
                tu_free(&o); tu_free(&l);
            }
            problem_free(&p);
        }
}

/* Ensure a NaN or Inf in one query row poisons that row only, and that row the way the
 * reference does: a NaN query row sees keys, so it is NaN (O and LSE), never the
 * O = 0, LSE = -inf of a row with no visible key. */
static void test_nonfinite_query_is_confined_to_its_row(void **state)
{
    (void)state;
    uint64_t rng = tu_seed() ^ 0x4a6;
    const float bad[3] = {NAN, INFINITY, -INFINITY};
    for (int t = 0; t < 3; t++) {
        problem p = problem_alloc(2, 40, 40, 2, 2, 16, 16);
        tu_fill(&p.q, &rng, -1, 1);
        tu_fill(&p.k, &rng, -1, 1);
        tu_fill(&p.v, &rng, -1, 1);
        *at4(&p.q, 1, 17, 0, 2) = bad[t];
        fa_options opt = fa_options_default();
        tu_tensor o_ref, l_ref;
        run(&p, opt, FA_IMPL_REFERENCE, &o_ref, &l_ref);
        for (int m = 0; m < 3; m++) {
            tu_tensor o, l;
            run(&p, opt, all_impls[m], &o, &l);
            for (int64_t b = 0; b < 2; b++)
                for (int64_t h = 0; h < 2; h++)
                    for (int64_t i = 0; i < 40; i++) {
                        if (b == 1 && i == 17 && h == 0) { /* the poisoned row: NaN exactly where the reference has NaN */
                            const int64_t li[3] = {b, h, i};
                            if (isnan(tu_get(&l, li)) != isnan(tu_get(&l_ref, li)))
                                fail_msg("%s: %g in q[1][17][0]: LSE %g, reference %g", fa_impl_name(all_impls[m]),
                                         (double)bad[t], tu_get(&l, li), tu_get(&l_ref, li));
                            if (t == 0 && !isnan(tu_get(&l, li)))
                                fail_msg("%s: NaN in q[1][17][0] gave LSE %g, not NaN", fa_impl_name(all_impls[m]),
                                         tu_get(&l, li));
                            for (int64_t c = 0; c < p.dv; c++) {
                                int64_t idx[4] = {b, i, h, c};
                                if (isnan(tu_get(&o, idx)) != isnan(tu_get(&o_ref, idx)) || (t == 0 && !isnan(tu_get(&o, idx))))
                                    fail_msg("%s: %g in q[1][17][0]: O[%lld] = %g, reference %g", fa_impl_name(all_impls[m]),
                                             (double)bad[t], (long long)c, tu_get(&o, idx), tu_get(&o_ref, idx));
                            }
                            continue;
                        }
                        if (row_has_nan(&o, b, i, h, p.dv))
                            fail_msg("%s: %g in q[1][17][0] leaked into row (%lld,%lld,%lld)",
                                     fa_impl_name(all_impls[m]), (double)bad[t], (long long)b, (long long)i, (long long)h);
                        for (int64_t c = 0; c < p.dv; c++) {
                            int64_t idx[4] = {b, i, h, c};
                            assert_true(fabs(tu_get(&o, idx) - tu_get(&o_ref, idx)) <= TOL);
                        }
                    }
            tu_free(&o); tu_free(&l);
        }
        tu_free(&o_ref); tu_free(&l_ref);
        problem_free(&p);
    }
}

/*
 * Ensure a row that sees keys whose logits are all -inf is reported like an empty row by
 * every implementation (O = 0, LSE = -inf; with a sink, LSE = the sink), as the reference
 * does (docs/semantics.md, section 8), while a row with a NaN or +inf logit is NaN in all.
 * k[.][j][0][0] = -inf for every key; q[..][0] > 0 gives -inf logits (head 0), < 0 +inf
 * (head 1); head 2 sees a NaN in key 5 on top of the -inf. Sq = 1 (the decoder, split over
 * the keys) and Sq = 40 (tiles, standard); with and without a sink.
 */
static void test_all_minus_inf_row_is_empty(void **state)
{
    (void)state;
    uint64_t rng = tu_seed() ^ 0x4a9;
    for (int sq_case = 0; sq_case < 2; sq_case++)
        for (int sinked = 0; sinked < 2; sinked++) {
            const int64_t Sq = sq_case ? 40 : 1, Sk = 300, H = 3;
            problem p = problem_alloc(1, Sq, Sk, H, 1, 16, 8);
            tu_fill(&p.q, &rng, -1, 1);
            tu_fill(&p.k, &rng, -1, 1);
            tu_fill(&p.v, &rng, -1, 1);
            for (int64_t j = 0; j < Sk; j++) *at4(&p.k, 0, j, 0, 0) = -INFINITY;
            for (int64_t i = 0; i < Sq; i++) {
                *at4(&p.q, 0, i, 0, 0) = 0.5f + (float)(i % 3);
                *at4(&p.q, 0, i, 1, 0) = -0.5f;
                *at4(&p.q, 0, i, 2, 0) = 0.25f;
                *at4(&p.q, 0, i, 2, 1) = NAN; /* head 2: NaN logits */
            }
            const int64_t sshape[1] = {H};
            tu_tensor sk = tu_alloc(FA_F32, 1, sshape);
            const float sink_val[3] = {0.5f, -1.25f, 2.0f};
            memcpy(sk.mem, sink_val, sizeof sink_val);
            fa_options opt = fa_options_default();
            opt.sinks = sinked ? &sk.t : NULL;
            opt.num_splits = 3; /* the decoder's split-KV combine too */
            for (int m = 0; m < 3; m++) {
                tu_tensor o, l;
                run(&p, opt, all_impls[m], &o, &l);
                for (int64_t i = 0; i < Sq; i++) {
                    const int64_t li0[3] = {0, 0, i}, li1[3] = {0, 1, i}, li2[3] = {0, 2, i};
                    const double want0 = sinked ? (double)sink_val[0] : -INFINITY;
                    if (tu_get(&l, li0) != want0)
                        fail_msg("%s Sq %lld sink %d: row %lld of all -inf logits has LSE %g, want %g",
                                 fa_impl_name(all_impls[m]), (long long)Sq, sinked, (long long)i, tu_get(&l, li0), want0);
                    for (int64_t c = 0; c < p.dv; c++) {
                        const int64_t o0[4] = {0, i, 0, c}, o1[4] = {0, i, 1, c}, o2[4] = {0, i, 2, c};
                        if (tu_get(&o, o0) != 0.0)
                            fail_msg("%s Sq %lld sink %d: row %lld of all -inf logits has O[%lld] = %g, want 0",
                                     fa_impl_name(all_impls[m]), (long long)Sq, sinked, (long long)i, (long long)c,
                                     tu_get(&o, o0));
                        if (!isnan(tu_get(&o, o1)) || !isnan(tu_get(&o, o2)))
                            fail_msg("%s Sq %lld sink %d: row %lld with +inf / NaN logits: O %g / %g, want NaN",
                                     fa_impl_name(all_impls[m]), (long long)Sq, sinked, (long long)i, tu_get(&o, o1),
                                     tu_get(&o, o2));
                    }
                    if (!isnan(tu_get(&l, li1)) || !isnan(tu_get(&l, li2)))
                        fail_msg("%s Sq %lld sink %d: row %lld with +inf / NaN logits: LSE %g / %g, want NaN",
                                 fa_impl_name(all_impls[m]), (long long)Sq, sinked, (long long)i, tu_get(&l, li1),
                                 tu_get(&l, li2));
                }
                tu_free(&o); tu_free(&l);
            }
            tu_free(&sk);
            problem_free(&p);
        }
}

/* Ensure one infinite key does not make a row empty-like when another key it sees is finite
 * and its float32 score only overflowed: q = (1e20, 1), k0 = (-1e20, 0) (score -1e40, -inf in
 * float32), k1 = (0, -inf): NaN in flash (decode and tiles) and standard, not O = 0 (the
 * reference gives O = v0). */
static void test_overflow_beside_an_infinite_key_stays_nan(void **state)
{
    (void)state;
    uint64_t rng = tu_seed() ^ 0x4ab;
    for (int64_t Sq = 1; Sq <= 2; Sq++) {
        problem p = problem_alloc(1, Sq, 2, 1, 1, 2, 2);
        tu_fill(&p.v, &rng, -1, 1);
        for (int64_t i = 0; i < Sq; i++) {
            *at4(&p.q, 0, i, 0, 0) = 1e20f;
            *at4(&p.q, 0, i, 0, 1) = 1.0f;
        }
        *at4(&p.k, 0, 0, 0, 0) = -1e20f;
        *at4(&p.k, 0, 0, 0, 1) = 0.0f;
        *at4(&p.k, 0, 1, 0, 0) = 0.0f;
        *at4(&p.k, 0, 1, 0, 1) = -INFINITY;
        fa_options opt = fa_options_default();
        opt.scale = 1.0;
        for (int m = 1; m < 3; m++) {
            tu_tensor o, l;
            run(&p, opt, all_impls[m], &o, &l);
            const int64_t li[3] = {0, 0, 0}, oi[4] = {0, 0, 0, 0};
            if (!isnan(tu_get(&l, li)) || !isnan(tu_get(&o, oi)))
                fail_msg("%s Sq %lld: an overflowed finite key beside an infinite one gave LSE %g, O %g, want NaN",
                         fa_impl_name(all_impls[m]), (long long)Sq, tu_get(&l, li), tu_get(&o, oi));
            tu_free(&o); tu_free(&l);
        }
        problem_free(&p);
    }
}

/* Ensure a NaN confined to the keys of one decode split (every other score of that split
 * -inf) still makes the row NaN: the max skips NaN, so the split's l carries it (it was
 * lost: the split reported m = -inf, l = 0, and the combine passed over it). */
static void test_nan_in_one_split_reaches_the_row(void **state)
{
    (void)state;
    uint64_t rng = tu_seed() ^ 0x4aa;
    const int64_t Sk = 600;
    problem p = problem_alloc(1, 1, Sk, 2, 1, 16, 8);
    tu_fill(&p.q, &rng, -1, 1);
    tu_fill(&p.k, &rng, -1, 1);
    tu_fill(&p.v, &rng, -1, 1);
    *at4(&p.q, 0, 0, 0, 0) = 1.0f;
    *at4(&p.q, 0, 0, 1, 0) = 1.0f;
    for (int64_t j = 300; j < Sk; j++) { /* the last half: -inf logits, one NaN among them */
        *at4(&p.k, 0, j, 0, 0) = -INFINITY;
        if (j == 500) *at4(&p.k, 0, j, 0, 1) = NAN;
    }
    for (int splits = 1; splits <= 4; splits++) {
        fa_options opt = fa_options_default();
        opt.num_splits = splits;
        opt.block_k = 100; /* the decoder's key blocks: with 2-4 splits the last split is keys 300.. or 400.. */
        for (int m = 0; m < 3; m++) {
            tu_tensor o, l;
            run(&p, opt, all_impls[m], &o, &l);
            for (int64_t h = 0; h < 2; h++) {
                const int64_t li[3] = {0, h, 0}, oi[4] = {0, 0, h, 0};
                if (!isnan(tu_get(&l, li)) || !isnan(tu_get(&o, oi)))
                    fail_msg("%s, %d splits: head %lld sees a NaN logit among -inf ones: LSE %g, O %g, want NaN",
                             fa_impl_name(all_impls[m]), splits, (long long)h, tu_get(&l, li), tu_get(&o, oi));
            }
            tu_free(&o); tu_free(&l);
        }
    }
    problem_free(&p);
}

/* Ensure an infinite key is confined to the rows that see it, like a NaN. */
static void test_infinite_key_is_confined_to_rows_that_see_it(void **state)
{
    (void)state;
    uint64_t rng = tu_seed() ^ 0x4a7;
    const int64_t S = 64, j_bad = 20;
    problem p = problem_alloc(1, S, S, 1, 1, 8, 8);
    tu_fill(&p.q, &rng, -1, 1);
    tu_fill(&p.k, &rng, -1, 1);
    tu_fill(&p.v, &rng, -1, 1);
    *at4(&p.k, 0, j_bad, 0, 0) = INFINITY;
    fa_options opt = fa_options_default();
    opt.causal = 1;
    for (int m = 0; m < 3; m++) {
        tu_tensor o, l;
        run(&p, opt, all_impls[m], &o, &l);
        for (int64_t i = 0; i < j_bad; i++)
            if (row_has_nan(&o, 0, i, 0, p.dv))
                fail_msg("%s: +inf in key %lld leaked into row %lld", fa_impl_name(all_impls[m]),
                         (long long)j_bad, (long long)i);
        tu_free(&o); tu_free(&l);
    }
    problem_free(&p);
}

/* ------------------------------------------------------------------------ */
/* Rows with no visible key, tiny shapes                                     */
/* ------------------------------------------------------------------------ */

/* Ensure rows with no visible key are O = 0, LSE = -inf (never NaN) in every implementation. */
static void test_empty_rows_are_zero_with_minus_infinite_lse(void **state)
{
    (void)state;
    /* {Sq, Sk, causal, wl, wr}: each leaves some rows with no visible key */
    static const int64_t cases[][5] = {
        {50, 20, 1, -1, -1},  /* causal, Sq > Sk: the first 30 rows */
        {30, 20, 0, 0, 0},    /* diagonal only, Sq > Sk */
        {40, 10, 0, 3, 0},    /* window (3, 0) */
        {25, 0, 0, -1, -1},   /* no keys at all */
        {33, 1, 1, -1, -1},   /* one key, causal */
    };
    uint64_t rng = tu_seed() ^ 0xe3;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int64_t Sq = cases[c][0], Sk = cases[c][1];
        problem p = problem_alloc(2, Sq, Sk, 2, 1, 24, 16);
        tu_fill(&p.q, &rng, -2, 2);
        tu_fill(&p.k, &rng, -2, 2);
        tu_fill(&p.v, &rng, -1, 1);
        fa_options opt = fa_options_default();
        opt.causal = (int)cases[c][2];
        opt.window_left = cases[c][3];
        opt.window_right = cases[c][4];
        int64_t n_empty = 0;
        for (int m = 0; m < 3; m++) {
            tu_tensor o, l;
            run(&p, opt, all_impls[m], &o, &l);
            assert_int_equal(tu_count_nan(&o), 0);
            assert_int_equal(tu_count_nan(&l), 0);
            n_empty = 0;
            for (int64_t b = 0; b < 2; b++)
                for (int64_t h = 0; h < 2; h++)
                    for (int64_t i = 0; i < Sq; i++) {
                        int64_t diag = i + Sk - Sq, lo = 0, hi = Sk - 1;
                        if (opt.window_left >= 0 && diag - opt.window_left > lo) lo = diag - opt.window_left;
                        int64_t wr = opt.causal ? 0 : opt.window_right;
                        if (wr >= 0 && diag + wr < hi) hi = diag + wr;
                        int64_t li[3] = {b, h, i};
                        if (lo <= hi) {
                            assert_true(isfinite(tu_get(&l, li)));
                            continue;
                        }
                        n_empty++;
                        if (tu_get(&l, li) != -INFINITY)
                            fail_msg("%s case %zu: empty row %lld has LSE %g", fa_impl_name(all_impls[m]),
                                     c, (long long)i, tu_get(&l, li));
                        for (int64_t col = 0; col < p.dv; col++) {
                            int64_t idx[4] = {b, i, h, col};
                            assert_true(tu_get(&o, idx) == 0.0);
                        }
                    }
            tu_free(&o); tu_free(&l);
        }
        assert_true(n_empty > 0);
        problem_free(&p);
    }
}

/*
 * Ensure a row that sees keys but whose float32 scores all overflow to -inf
 * (q = (1e20, 0, 0, 0), keys (-1e20, 0, 0, 0): finite inputs) is NaN in flash
 * and standard, never the empty-row answer O = 0, LSE = -inf: emptiness comes
 * from the key range, and such a row cannot be computed in float32. The
 * float64 reference gives the mean of v.
 */
static void test_row_whose_scores_all_overflow_is_nan_not_empty(void **state)
{
    (void)state;
    uint64_t rng = tu_seed() ^ 0x0f1;
    problem p = problem_alloc(1, 2, 2, 1, 1, 4, 4);
    tu_fill(&p.q, &rng, -1, 1);
    tu_fill(&p.v, &rng, -1, 1);
    for (int64_t j = 0; j < 2; j++)
        for (int64_t c = 0; c < 4; c++) *at4(&p.k, 0, j, 0, c) = c == 0 ? -1e20f : 0.0f;
    *at4(&p.q, 0, 0, 0, 0) = 1e20f; /* row 0: every score is -1e40 * scale, -inf in float32 */
    for (int64_t c = 1; c < 4; c++) *at4(&p.q, 0, 0, 0, c) = 0.0f;
    *at4(&p.q, 0, 1, 0, 0) = 0.0f; /* row 1: q . k = 0 for both keys, finite */
    fa_options opt = fa_options_default();
    tu_tensor o_ref, l_ref;
    run(&p, opt, FA_IMPL_REFERENCE, &o_ref, &l_ref);
    for (int64_t c = 0; c < 4; c++) { /* the reference: both scores equal, O = mean of v */
        const int64_t idx[4] = {0, 0, 0, c};
        const double mean = 0.5 * ((double)*at4(&p.v, 0, 0, 0, c) + (double)*at4(&p.v, 0, 1, 0, c));
        assert_true(fabs(tu_get(&o_ref, idx) - mean) <= 1e-12);
    }
    for (int m = 1; m < 3; m++) {
        tu_tensor o, l;
        run(&p, opt, all_impls[m], &o, &l);
        const int64_t l0[3] = {0, 0, 0}, l1[3] = {0, 0, 1};
        if (!isnan(tu_get(&l, l0)))
            fail_msg("%s: overflowed row has LSE %g, not NaN", fa_impl_name(all_impls[m]), tu_get(&l, l0));
        for (int64_t c = 0; c < 4; c++) {
            const int64_t i0[4] = {0, 0, 0, c}, i1[4] = {0, 1, 0, c};
            if (!isnan(tu_get(&o, i0)))
                fail_msg("%s: overflowed row has O[%lld] = %g, not NaN", fa_impl_name(all_impls[m]),
                         (long long)c, tu_get(&o, i0));
            assert_true(fabs(tu_get(&o, i1) - tu_get(&o_ref, i1)) <= TOL);
        }
        assert_true(fabs(tu_get(&l, l1) - tu_get(&l_ref, l1)) <= TOL);
        tu_free(&o); tu_free(&l);
    }
    tu_free(&o_ref); tu_free(&l_ref);
    problem_free(&p);
}

/* Ensure d = 1, d_v = 1 and seqlen 1 (each side) match the reference. */
static void test_all_match_reference_when_dims_are_one(void **state)
{
    (void)state;
    static const int64_t cases[][4] = {/* Sq, Sk, d, dv */
                                       {1, 1, 1, 1}, {1, 1, 64, 64}, {1, 300, 1, 1}, {300, 1, 1, 7},
                                       {37, 41, 1, 1}, {1, 77, 33, 1}, {77, 1, 1, 33}};
    uint64_t rng = tu_seed() ^ 0xd1;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        problem p = problem_alloc(1, cases[c][0], cases[c][1], 3, 1, cases[c][2], cases[c][3]);
        tu_fill(&p.q, &rng, -2, 2);
        tu_fill(&p.k, &rng, -2, 2);
        tu_fill(&p.v, &rng, -1, 1);
        fa_options opt = fa_options_default();
        char what[64];
        snprintf(what, sizeof what, "Sq=%lld Sk=%lld d=%lld dv=%lld", (long long)cases[c][0],
                 (long long)cases[c][1], (long long)cases[c][2], (long long)cases[c][3]);
        expect_all_match_reference(&p, opt, what);
        opt.causal = 1;
        expect_all_match_reference(&p, opt, what);
        problem_free(&p);
    }
}

/* ------------------------------------------------------------------------ */
/* 64-bit sizes                                                              */
/* ------------------------------------------------------------------------ */

/*
 * Ensure flash handles seqlen_k > 2^32 (seqlen_q x seqlen_k ~ 2^38) with
 * 64-bit index arithmetic throughout: keys j near 2^32 are visible, ALiBi
 * distances and the bottom-right diagonal are computed without wrapping.
 *
 * Cheap by construction: K and V are zero-stride views over one row each (a
 * legal strided tensor), and a window (W, 0) leaves W + 1 visible keys per
 * query row, so flash skips all but a few tiles. With identical keys every
 * visible logit is s0 - slope * t for t = 0..W, so the expected LSE is
 * s0 + ln sum_t exp(-slope t) and O = v, in closed form.
 */
static void test_flash_is_exact_when_seqlen_k_exceeds_2_pow_32(void **state)
{
    (void)state;
    const int64_t Sq = 100, Sk = ((int64_t)1 << 32) + 37, d = 4, dv = 3, W = 20;
    float qbuf[100 * 4], kbuf[4] = {0.5f, -0.25f, 1.0f, 0.75f}, vbuf[3] = {0.3f, -1.5f, 2.0f};
    for (int i = 0; i < Sq * d; i++) qbuf[i] = (float)((i % 7) - 3) * 0.25f;
    fa_tensor q, k, v, o, lse;
    int64_t qs[4] = {1, Sq, 1, d}, ks[4] = {1, Sk, 1, d}, vs[4] = {1, Sk, 1, dv};
    int64_t kst[4] = {0, 0, 0, 1}, vst[4] = {0, 0, 0, 1};
    assert_int_equal(fa_tensor_make(&q, qbuf, FA_F32, 4, qs, NULL), FA_OK);
    assert_int_equal(fa_tensor_make(&k, kbuf, FA_F32, 4, ks, kst), FA_OK);
    assert_int_equal(fa_tensor_make(&v, vbuf, FA_F32, 4, vs, vst), FA_OK);
    double obuf[100 * 3], lbuf[100];
    int64_t os[4] = {1, Sq, 1, dv}, ls[3] = {1, 1, Sq};
    assert_int_equal(fa_tensor_make(&o, obuf, FA_F64, 4, os, NULL), FA_OK);
    assert_int_equal(fa_tensor_make(&lse, lbuf, FA_F64, 3, ls, NULL), FA_OK);
    double slope_v = 0.125;
    fa_tensor slope;
    int64_t ss[1] = {1};
    assert_int_equal(fa_tensor_make(&slope, &slope_v, FA_F64, 1, ss, NULL), FA_OK);

    for (int with_alibi = 0; with_alibi < 2; with_alibi++) {
        fa_options opt = fa_options_default();
        opt.causal = 1;
        opt.window_left = W;
        opt.alibi_slopes = with_alibi ? &slope : NULL;
        opt.num_threads = 2;
        memset(obuf, 0xff, sizeof obuf);
        memset(lbuf, 0xff, sizeof lbuf);
        fa_status st = fa_forward(&q, &k, &v, &o, &lse, &opt);
        if (st != FA_OK) fail_msg("flash: %s: %s", fa_status_string(st), fa_last_error());
        for (int64_t i = 0; i < Sq; i++) {
            double dot = 0;
            for (int c = 0; c < d; c++) dot += (double)qbuf[i * d + c] * kbuf[c];
            double s0 = dot / 2.0, sum = 0; /* default scale 1/sqrt(4) */
            for (int64_t t = 0; t <= W; t++) sum += exp(-(with_alibi ? slope_v : 0.0) * (double)t);
            double want = s0 + log(sum);
            if (!(fabs(lbuf[i] - want) <= TOL))
                fail_msg("alibi=%d row %lld: LSE %.9g, want %.9g", with_alibi, (long long)i, lbuf[i], want);
            for (int c = 0; c < dv; c++)
                if (!(fabs(obuf[i * dv + c] - vbuf[c]) <= 1e-6))
                    fail_msg("row %lld col %d: O %.9g, want %.9g", (long long)i, c, obuf[i * dv + c], (double)vbuf[c]);
        }
    }
}

/*
 * Ensure a seqlen_k near 2^61 (a zero-stride view) never wraps a size: flash
 * computes the one visible key, reference (which keeps a row of seqlen_k
 * scores) refuses with FA_ERR_NOMEM, and its planned workspace saturates
 * instead of wrapping to a few bytes.
 */
static void test_sizes_do_not_wrap_when_seqlen_k_is_2_pow_61(void **state)
{
    (void)state;
    float qb[2] = {1.0f, -1.0f}, kb[2] = {0.5f, 0.25f}, vb[3] = {1.5f, -2.0f, 0.25f};
    double ob[3], lb[1];
    fa_tensor q, k, v, o, lse;
    int64_t qs[4] = {1, 1, 1, 2}, ks[4] = {1, (int64_t)1 << 61, 1, 2}, vs[4] = {1, (int64_t)1 << 61, 1, 3};
    int64_t os[4] = {1, 1, 1, 3}, ls[3] = {1, 1, 1}, zero[4] = {0, 0, 0, 1};
    assert_int_equal(fa_tensor_make(&q, qb, FA_F32, 4, qs, NULL), FA_OK);
    assert_int_equal(fa_tensor_make(&k, kb, FA_F32, 4, ks, zero), FA_OK);
    assert_int_equal(fa_tensor_make(&v, vb, FA_F32, 4, vs, zero), FA_OK);
    assert_int_equal(fa_tensor_make(&o, ob, FA_F64, 4, os, NULL), FA_OK);
    assert_int_equal(fa_tensor_make(&lse, lb, FA_F64, 3, ls, NULL), FA_OK);
    fa_options opt = fa_options_default();
    opt.window_left = 0;
    opt.window_right = 0; /* only key j = i + Sk - Sq is visible */
    opt.num_threads = 1;
    opt.impl = FA_IMPL_FLASH;
    assert_int_equal(fa_forward(&q, &k, &v, &o, &lse, &opt), FA_OK);
    for (int c = 0; c < 3; c++) assert_true(ob[c] == (double)vb[c]);
    assert_true(fabs(lb[0] - (0.25 / sqrt(2.0))) <= 1e-6); /* q.k = 0.25, one key: LSE = s */
    opt.impl = FA_IMPL_REFERENCE;
    assert_int_equal(fa_forward(&q, &k, &v, &o, &lse, &opt), FA_ERR_NOMEM);
    size_t bytes = 0;
    assert_int_equal(fa_workspace_bytes(&q, &k, &v, &opt, &bytes), FA_OK);
    assert_true(bytes >= ((size_t)1 << 61)); /* saturated, not wrapped */

    /*
     * flash's shared K/V packing is sized nkb * (d*ldk + Bc*ldv) floats; for
     * this seqlen_k (found by search) and Bc = 16 that product wraps to 1536
     * bytes modulo 2^64, which "fits" the 8 MiB budget: flash must not believe it.
     */
    const int64_t sk_wrap = 813079628593258496LL;
    int64_t ks1[4] = {1, sk_wrap, 1, 1}, qs1[4] = {1, 1, 1, 1};
    fa_tensor q1, k1, v1, o1;
    double o1b[1];
    assert_int_equal(fa_tensor_make(&q1, qb, FA_F32, 4, qs1, NULL), FA_OK);
    assert_int_equal(fa_tensor_make(&k1, kb, FA_F32, 4, ks1, zero), FA_OK);
    assert_int_equal(fa_tensor_make(&v1, vb, FA_F32, 4, ks1, zero), FA_OK);
    assert_int_equal(fa_tensor_make(&o1, o1b, FA_F64, 4, qs1, NULL), FA_OK);
    opt.impl = FA_IMPL_FLASH;
    opt.block_k = 16;
    assert_int_equal(fa_workspace_bytes(&q1, &k1, &v1, &opt, &bytes), FA_OK);
    assert_true(bytes < ((size_t)16 << 20));
    assert_int_equal(fa_forward(&q1, &k1, &v1, &o1, NULL, &opt), FA_OK);
    assert_true(o1b[0] == (double)vb[0]);
}

/*
 * Ensure windows as wide as INT64_MAX mean "unbounded" rather than
 * overflowing the diagonal arithmetic (i + Sk - Sq +- window).
 */
static void test_all_match_reference_when_window_is_int64_max(void **state)
{
    (void)state;
    uint64_t rng = tu_seed() ^ 0x7fff;
    problem p = problem_alloc(1, 30, 20, 1, 1, 8, 8);
    tu_fill(&p.q, &rng, -1, 1);
    tu_fill(&p.k, &rng, -1, 1);
    tu_fill(&p.v, &rng, -1, 1);
    fa_options opt = fa_options_default();
    opt.window_left = INT64_MAX;
    opt.window_right = INT64_MAX;
    expect_all_match_reference(&p, opt, "window (INT64_MAX, INT64_MAX)");
    tu_tensor o_ref, l_ref, o_unb, l_unb;
    run(&p, opt, FA_IMPL_REFERENCE, &o_ref, &l_ref);
    run(&p, fa_options_default(), FA_IMPL_REFERENCE, &o_unb, &l_unb);
    int64_t where;
    assert_true(tu_max_abs_diff(&o_ref, &o_unb, &where) == 0.0);
    tu_free(&o_ref); tu_free(&l_ref); tu_free(&o_unb); tu_free(&l_unb);
    problem_free(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_all_match_reference_when_logits_reach_1e4),
        cmocka_unit_test(test_all_match_reference_when_scale_is_extreme),
        cmocka_unit_test(test_nan_key_is_confined_to_rows_that_see_it),
        cmocka_unit_test(test_nan_value_is_confined_to_rows_that_see_it),
        cmocka_unit_test(test_nonfinite_query_is_confined_to_its_row),
        cmocka_unit_test(test_all_minus_inf_row_is_empty),
        cmocka_unit_test(test_overflow_beside_an_infinite_key_stays_nan),
        cmocka_unit_test(test_nan_in_one_split_reaches_the_row),
        cmocka_unit_test(test_infinite_key_is_confined_to_rows_that_see_it),
        cmocka_unit_test(test_empty_rows_are_zero_with_minus_infinite_lse),
        cmocka_unit_test(test_row_whose_scores_all_overflow_is_nan_not_empty),
        cmocka_unit_test(test_all_match_reference_when_dims_are_one),
        cmocka_unit_test(test_flash_is_exact_when_seqlen_k_exceeds_2_pow_32),
        cmocka_unit_test(test_all_match_reference_when_window_is_int64_max),
        cmocka_unit_test(test_sizes_do_not_wrap_when_seqlen_k_is_2_pow_61),
    };
    tu_seed();
    return cmocka_run_group_tests_name("robustness", tests, NULL, NULL);
}
