/*
 * test_rotary.c — rotary embedding inside the call (fa_options::rotary;
 * FlashAttention's flash_attn_with_kvcache rotary_cos / rotary_sin).
 *
 * What must hold:
 *   - the call with rotary gives what the same call without rotary gives on
 *     q and k_new rotated here (a plain float64 rotation written in this file:
 *     pairs (2i, 2i+1) interleaved or (i, i + rd/2), new key t at
 *     cache_seqlens[b] + t, queries at cache_seqlens[b] + i when causal or
 *     windowed, else all at cache_seqlens[b]), for every implementation, with
 *     leftpad and cache_batch_idx, and paged;
 *   - the cache rows appended are the rotated keys, and dims past rotary_dim
 *     are the caller's bits;
 *   - fa_check with rotary passes flash's output (the caches as before the
 *     append) and fails an output computed without rotary or with the other
 *     pairing;
 *   - rotary without a KV cache or without k_new, tables too short for the
 *     largest position, rotary_dim > d, and mismatched tables are refused.
 */
#include "test_util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define B 3
#define H 4
#define HK 2
#define D 16
#define DV 8
#define SC 24  /* seqlen_cache */
#define BC 4   /* batch_cache */
#define SQ 3
#define SN 3
#define RO 40  /* seqlen_ro */

typedef struct rot_data {
    tu_tensor q, kc, vc, kn, vn, cos, sin;
    int32_t seqlens[B], idx[B], pad[B];
} rot_data;

static void make_data(rot_data *g, uint64_t *rng, int64_t rd)
{
    g->q = tu_alloc4(FA_F32, B, SQ, H, D, 0);
    g->kc = tu_alloc4(FA_F32, BC, SC, HK, D, 0);
    g->vc = tu_alloc4(FA_F32, BC, SC, HK, DV, 0);
    g->kn = tu_alloc4(FA_F32, B, SN, HK, D, 0);
    g->vn = tu_alloc4(FA_F32, B, SN, HK, DV, 0);
    const int64_t cs[2] = {RO, rd / 2};
    g->cos = tu_alloc(FA_F64, 2, cs);
    g->sin = tu_alloc(FA_F64, 2, cs);
    tu_fill(&g->q, rng, -2, 2);
    tu_fill(&g->kc, rng, -2, 2);
    tu_fill(&g->vc, rng, -1, 1);
    tu_fill(&g->kn, rng, -2, 2);
    tu_fill(&g->vn, rng, -1, 1);
    for (int64_t pos = 0; pos < RO; pos++) /* the usual table: angle pos * base^(-2i/rd) */
        for (int64_t x = 0; x < rd / 2; x++) {
            const double a = (double)pos * pow(100.0, -2.0 * (double)x / (double)rd);
            ((double *)g->cos.mem)[pos * (rd / 2) + x] = cos(a);
            ((double *)g->sin.mem)[pos * (rd / 2) + x] = sin(a);
        }
    const int32_t n[B] = {7, 0, 15}, idx[B] = {2, 0, 3}, pad[B] = {2, 0, 4};
    memcpy(g->seqlens, n, sizeof n);
    memcpy(g->idx, idx, sizeof idx);
    memcpy(g->pad, pad, sizeof pad);
}

static void free_data(rot_data *g)
{
    tu_free(&g->q); tu_free(&g->kc); tu_free(&g->vc); tu_free(&g->kn); tu_free(&g->vn);
    tu_free(&g->cos); tu_free(&g->sin);
}

/* Rotate rows [B][S][heads][D] of `src` into `dst` (float32), at position
 * seqlens[b] + (per_row ? i : 0). */
static void rotate(const tu_tensor *src, tu_tensor *dst, const rot_data *g, int64_t rd, int interleaved, int per_row,
                   int64_t heads)
{
    const int64_t S = src->t.shape[1], half = rd / 2;
    memcpy(dst->mem, src->mem, src->bytes);
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < S; i++) {
            const int64_t pos = g->seqlens[b] + (per_row ? i : 0);
            for (int64_t h = 0; h < heads; h++) {
                const float *x = (const float *)src->mem + ((b * S + i) * heads + h) * D;
                float *y = (float *)dst->mem + ((b * S + i) * heads + h) * D;
                for (int64_t c = 0; c < half; c++) {
                    const int64_t c1 = interleaved ? 2 * c : c, c2 = interleaved ? 2 * c + 1 : c + half;
                    const double cs = ((const double *)g->cos.mem)[pos * half + c];
                    const double sn = ((const double *)g->sin.mem)[pos * half + c];
                    y[c1] = (float)((double)x[c1] * cs - (double)x[c2] * sn);
                    y[c2] = (float)((double)x[c1] * sn + (double)x[c2] * cs);
                }
            }
        }
}

typedef struct run_out {
    tu_tensor o, lse, kc, vc;
} run_out;

static run_out run(const rot_data *g, const tu_tensor *q, const tu_tensor *kn, const fa_rotary *rot, fa_impl impl,
                   int causal, int64_t wl, int use_idx, int use_pad)
{
    run_out r;
    r.kc = tu_alloc4(FA_F32, BC, SC, HK, D, 0);
    r.vc = tu_alloc4(FA_F32, BC, SC, HK, DV, 0);
    memcpy(r.kc.mem, g->kc.mem, r.kc.bytes);
    memcpy(r.vc.mem, g->vc.mem, r.vc.bytes);
    r.o = tu_alloc4(FA_F32, B, SQ, H, DV, 0);
    const int64_t ls[3] = {B, H, SQ};
    r.lse = tu_alloc(FA_F32, 3, ls);
    fa_kvcache kv = fa_kvcache_default();
    kv.cache_seqlens = g->seqlens;
    kv.cache_batch_idx = use_idx ? g->idx : NULL;
    kv.cache_leftpad = use_pad ? g->pad : NULL;
    kv.k_new = &kn->t;
    kv.v_new = &g->vn.t;
    fa_options opt = fa_options_default();
    opt.kvcache = &kv;
    opt.rotary = rot;
    opt.causal = causal;
    opt.window_left = wl;
    opt.impl = impl;
    opt.block_q = 4;
    opt.block_k = 8;
    if (fa_forward(&q->t, &r.kc.t, &r.vc.t, &r.o.t, &r.lse.t, &opt) != FA_OK)
        fail_msg("forward (%s): %s", fa_impl_name(impl), fa_last_error());
    return r;
}

static void free_run(run_out *r)
{
    tu_free(&r->o); tu_free(&r->lse); tu_free(&r->kc); tu_free(&r->vc);
}

static void expect_close(const tu_tensor *a, const tu_tensor *b, double tol, const char *what)
{
    int64_t where;
    const double err = tu_max_abs_diff(a, b, &where);
    if (!(err <= tol)) fail_msg("%s: max difference %g at %lld", what, err, (long long)where);
}

static void rotary_case(int64_t rd, int interleaved)
{
    uint64_t rng = tu_seed() ^ (uint64_t)(rd * 7 + interleaved);
    rot_data g;
    make_data(&g, &rng, rd);
    fa_rotary rot = fa_rotary_default();
    rot.cos = &g.cos.t;
    rot.sin = &g.sin.t;
    rot.interleaved = interleaved;
    /* mask cases: none (queries all at cache_seqlens[b]), causal, a window (per row) */
    const struct { int causal; int64_t wl; } masks[3] = {{0, -1}, {1, -1}, {0, 5}};
    for (int mi = 0; mi < 3; mi++)
        for (int impl = 0; impl < FA_IMPL_COUNT; impl++)
            for (int layout = 0; layout < 2; layout++) {
                const int per_row = masks[mi].causal || masks[mi].wl >= 0;
                tu_tensor qr = tu_alloc4(FA_F32, B, SQ, H, D, 0), knr = tu_alloc4(FA_F32, B, SN, HK, D, 0);
                rotate(&g.q, &qr, &g, rd, interleaved, per_row, H);
                rotate(&g.kn, &knr, &g, rd, interleaved, 1, HK);
                run_out a = run(&g, &g.q, &g.kn, &rot, (fa_impl)impl, masks[mi].causal, masks[mi].wl, layout, layout);
                run_out b = run(&g, &qr, &knr, NULL, (fa_impl)impl, masks[mi].causal, masks[mi].wl, layout, layout);
                expect_close(&a.o, &b.o, 2e-6, "O with rotary vs pre-rotated inputs");
                expect_close(&a.lse, &b.lse, 4e-6, "LSE with rotary vs pre-rotated inputs");
                expect_close(&a.kc, &b.kc, 1e-6, "k cache after the append (rotated keys)");
                assert_memory_equal(a.vc.mem, b.vc.mem, a.vc.bytes);
                /* dims past rotary_dim of the appended keys: the caller's bits */
                for (int64_t bb = 0; bb < B; bb++)
                    for (int64_t t = 0; t < SN; t++)
                        for (int64_t hk = 0; hk < HK; hk++) {
                            const int64_t row = layout ? g.idx[bb] : bb;
                            const float *got = (const float *)a.kc.mem + ((row * SC + g.seqlens[bb] + t) * HK + hk) * D;
                            const float *src = (const float *)g.kn.mem + ((bb * SN + t) * HK + hk) * D;
                            if (memcmp(got + rd, src + rd, (size_t)(D - rd) * sizeof(float)) != 0)
                                fail_msg("dims past rotary_dim changed in the cache");
                            if (rd > 0 && memcmp(got, src, (size_t)rd * sizeof(float)) == 0 && g.seqlens[bb] + t > 0)
                                fail_msg("the appended key was not rotated");
                        }
                free_run(&a);
                free_run(&b);
                tu_free(&qr);
                tu_free(&knr);
            }
    free_data(&g);
}

/* Ensure rotary with GPT-NeoX pairs over all of d, and over part of it, equals pre-rotated inputs. */
static void test_rotary_half_split_matches_pre_rotated_inputs(void **state)
{
    (void)state;
    rotary_case(D, 0);
    rotary_case(8, 0);
}

/* Ensure rotary with GPT-J pairs (interleaved) equals pre-rotated inputs. */
static void test_rotary_interleaved_matches_pre_rotated_inputs(void **state)
{
    (void)state;
    rotary_case(D, 1);
    rotary_case(6, 1);
}

/* Ensure fa_check with rotary passes flash and fails an output without rotary or with the other pairing. */
static void test_check_judges_rotary(void **state)
{
    (void)state;
    uint64_t rng = tu_seed() ^ 0x71;
    rot_data g;
    make_data(&g, &rng, D);
    fa_rotary rot = fa_rotary_default();
    rot.cos = &g.cos.t;
    rot.sin = &g.sin.t;
    fa_kvcache kv = fa_kvcache_default();
    kv.cache_seqlens = g.seqlens;
    kv.k_new = &g.kn.t;
    kv.v_new = &g.vn.t;
    fa_options opt = fa_options_default();
    opt.kvcache = &kv;
    opt.rotary = &rot;
    opt.causal = 1;
    fa_check_options co = fa_check_options_default();
    for (int variant = 0; variant < 3; variant++) {
        run_out r;
        if (variant == 0) r = run(&g, &g.q, &g.kn, &rot, FA_IMPL_FLASH, 1, -1, 0, 0);
        else if (variant == 1) r = run(&g, &g.q, &g.kn, NULL, FA_IMPL_FLASH, 1, -1, 0, 0);
        else {
            fa_rotary other = rot;
            other.interleaved = 1;
            r = run(&g, &g.q, &g.kn, &other, FA_IMPL_FLASH, 1, -1, 0, 0);
        }
        fa_check_report rep = fa_check_report_init();
        assert_int_equal(fa_check(&g.q.t, &g.kc.t, &g.vc.t, &r.o.t, &r.lse.t, &opt, &co, &rep), FA_OK);
        if (variant == 0 && !rep.pass) fail_msg("flash with rotary fails check (max err %g, bound %g)", rep.max_abs_err, rep.bound);
        if (variant != 0 && rep.out_pass) fail_msg("check passes an output %s", variant == 1 ? "without rotary" : "with the wrong pairing");
        fa_check_report_free(&rep);
        /* fa_diagnose with rotary (the API; the independent injections are tests/test_diagnose_rotary.py):
         * none for flash's output, rotary-offset (not applied) and rotary-pairing for the others */
        fa_diagnose_report dr = fa_diagnose_report_init();
        if (fa_diagnose(&g.q.t, &g.kc.t, &g.vc.t, &r.o.t, &r.lse.t, &opt, NULL, &dr) != FA_OK)
            fail_msg("fa_diagnose with rotary: %s", fa_last_error());
        static const char *const want_id[3] = {NULL, "rotary-offset", "rotary-pairing"};
        static const char *const want_detail[3] = {NULL, "rotary not applied to q nor k_new", "on q and k_new"};
        if (variant == 0 && dr.n != 0) fail_msg("flash with rotary diagnosed as %s (%s)", dr.items[0].id, dr.items[0].detail);
        if (variant != 0 && (dr.n < 1 || strcmp(dr.items[0].id, want_id[variant]) != 0 ||
                             !strstr(dr.items[0].detail, want_detail[variant]) || !(dr.items[0].explained > 0.99)))
            fail_msg("variant %d: want %s (%s) first, got %s (%s, %.3f)", variant, want_id[variant], want_detail[variant],
                     dr.n ? dr.items[0].id : "none", dr.n ? dr.items[0].detail : "", dr.n ? dr.items[0].explained : 0.0);
        if (variant == 2 && dr.items[0].param != 1.0) fail_msg("rotary-pairing param %g, want 1 (interleaved used)", dr.items[0].param);
        fa_diagnose_report_free(&dr);
        free_run(&r);
    }
    free_data(&g);
}

static void expect_refused(const rot_data *g, const fa_options *opt, fa_status want, const char *text)
{
    tu_tensor kc = tu_alloc4(FA_F32, BC, SC, HK, D, 0), vc = tu_alloc4(FA_F32, BC, SC, HK, DV, 0);
    memcpy(kc.mem, g->kc.mem, kc.bytes);
    tu_tensor o = tu_alloc4(FA_F32, B, SQ, H, DV, 0);
    const fa_status st = fa_forward(&g->q.t, opt->kvcache ? &kc.t : &g->kn.t, opt->kvcache ? &vc.t : &g->vn.t, &o.t,
                                    NULL, opt);
    if (st != want || !strstr(fa_last_error(), text))
        fail_msg("expected %s with '%s', got %s: %s", fa_status_string(want), text, fa_status_string(st), fa_last_error());
    assert_null(strchr(fa_last_error(), '\n'));
    assert_memory_equal(kc.mem, g->kc.mem, kc.bytes); /* nothing appended */
    tu_free(&kc); tu_free(&vc); tu_free(&o);
}

/* Ensure rotary is refused without a cache or new keys, with short tables, rotary_dim > d, mismatched tables. */
static void test_bad_rotary_is_refused(void **state)
{
    (void)state;
    uint64_t rng = tu_seed() ^ 0x72;
    rot_data g;
    make_data(&g, &rng, D);
    fa_rotary rot = fa_rotary_default();
    rot.cos = &g.cos.t;
    rot.sin = &g.sin.t;
    fa_kvcache kv = fa_kvcache_default();
    kv.cache_seqlens = g.seqlens;
    kv.k_new = &g.kn.t;
    kv.v_new = &g.vn.t;
    fa_options opt = fa_options_default();
    opt.rotary = &rot;
    opt.kvcache = NULL;
    /* no cache: q [B][SQ] against k_new-shaped keys */
    {
        tu_tensor o = tu_alloc4(FA_F32, B, SQ, H, DV, 0);
        assert_int_equal(fa_forward(&g.q.t, &g.kn.t, &g.vn.t, &o.t, NULL, &opt), FA_ERR_OPTION);
        assert_non_null(strstr(fa_last_error(), "rotary needs a KV cache with new keys"));
        tu_free(&o);
    }
    opt.kvcache = &kv;
    kv.k_new = kv.v_new = NULL;
    expect_refused(&g, &opt, FA_ERR_OPTION, "rotary needs a KV cache with new keys");
    kv.k_new = &g.kn.t;
    kv.v_new = &g.vn.t;
    /* tables too short: sequence 2 appends at 15..17 */
    fa_tensor short_cos = g.cos.t, short_sin = g.sin.t;
    short_cos.shape[0] = short_sin.shape[0] = 17;
    rot.cos = &short_cos;
    rot.sin = &short_sin;
    expect_refused(&g, &opt, FA_ERR_SHAPE, "rotary cos: cos/sin have 17 positions, but sequence 2 needs position 17");
    /* rotary_dim > d */
    const int64_t wide[2] = {RO, D / 2 + 1};
    tu_tensor wc = tu_alloc(FA_F64, 2, wide), ws = tu_alloc(FA_F64, 2, wide);
    tu_fill(&wc, &rng, -1, 1); tu_fill(&ws, &rng, -1, 1);
    rot.cos = &wc.t;
    rot.sin = &ws.t;
    expect_refused(&g, &opt, FA_ERR_SHAPE, "rotary_dim = 2 x 9 = 18 must be in 2..d = 16");
    /* cos and sin of different shapes; a NaN in the table */
    rot.cos = &g.cos.t;
    expect_refused(&g, &opt, FA_ERR_SHAPE, "rotary sin: shape [40,9] differs from rotary cos [40,8]");
    rot.sin = &g.sin.t;
    ((double *)g.sin.mem)[3 * (D / 2) + 1] = NAN;
    expect_refused(&g, &opt, FA_ERR_NONFINITE, "rotary sin: element [3,1] is not finite");
    tu_free(&wc); tu_free(&ws);
    free_data(&g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rotary_half_split_matches_pre_rotated_inputs),
        cmocka_unit_test(test_rotary_interleaved_matches_pre_rotated_inputs),
        cmocka_unit_test(test_check_judges_rotary),
        cmocka_unit_test(test_bad_rotary_is_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
