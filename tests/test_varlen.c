/*
 * test_varlen.c — variable-length batches through the public API
 * (fa_options.varlen: FlashAttention's flash_attn_varlen_func layout).
 *
 * Q [total_q][H][d], K/V [total_k][Hk][d|dv], O [total_q][H][dv], LSE
 * [H][total_q]; sequence b owns query rows cu_seqlens_q[b].. and keys
 * cu_seqlens_k[b].. (the first seqused_k[b] of them when given). What must
 * hold:
 *   - each sequence's O and LSE rows (and dQ, dK, dV rows) are bit for bit
 *     what the same implementation gives that sequence alone as a uniform
 *     batch of one (whose correctness the other suites establish), for
 *     every implementation (and check-grad's emulated bf16/f16 backward),
 *     masks aligned per sequence, zero-length sequences included; the
 *     reference also matches a plain dense float64 model written here;
 *   - rows no sequence owns get O = 0, LSE = -inf, and zero gradients;
 *   - fa_check accepts the flash output and pinpoints a wrong element by
 *     (sequence, row within the sequence);
 *   - bad index arrays are refused with FA_ERR_INDEX and a message naming
 *     the array and the index.
 */
#include "test_util.h"

#include "problem.h" /* fa_count_test: the rows the forward ran */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAXB 8

typedef struct vl_case {
    const char *name;
    int64_t batch, H, Hk, d, dv;
    int32_t q_len[MAXB], k_len[MAXB];
    int32_t used[MAXB];      /* seqused_k, when use_used */
    int use_used;
    int64_t pad_q, pad_k;    /* rows after the last sequence, owned by none */
} vl_case;

static const vl_case CASES[] = {
    {"mixed", 5, 4, 2, 16, 8, {5, 0, 13, 6, 1}, {9, 4, 7, 0, 19}, {0}, 0, 2, 3},
    {"seqused", 4, 3, 1, 24, 24, {7, 3, 1, 10}, {12, 3, 8, 10}, {5, 0, 8, 10}, 1, 0, 0},
    {"long", 2, 2, 2, 32, 16, {70, 33}, {45, 90}, {0}, 0, 1, 0},
};

typedef struct opt_case {
    int causal;
    int64_t wl, wr;
    double softcap;
    int alibi; /* 0 off, 1 [H], 2 [batch][H] */
} opt_case;

static const opt_case OPTS[] = {
    {0, -1, -1, 0.0, 0}, {1, -1, -1, 0.0, 0}, {0, 3, 2, 20.0, 1}, {1, 4, -1, 0.0, 2},
};

typedef struct vl_data {
    int32_t cu_q[MAXB + 1], cu_k[MAXB + 1];
    int64_t total_q, total_k;
    tu_tensor q, k, v, dout, slopes1, slopes2;
    fa_varlen vl;
} vl_data;

static void make_data(const vl_case *c, uint64_t *rng, vl_data *g)
{
    g->cu_q[0] = g->cu_k[0] = 0;
    for (int64_t b = 0; b < c->batch; b++) {
        g->cu_q[b + 1] = g->cu_q[b] + c->q_len[b];
        g->cu_k[b + 1] = g->cu_k[b] + c->k_len[b];
    }
    g->total_q = g->cu_q[c->batch] + c->pad_q;
    g->total_k = g->cu_k[c->batch] + c->pad_k;
    const int64_t qs[3] = {g->total_q, c->H, c->d}, ks[3] = {g->total_k, c->Hk, c->d};
    const int64_t vs[3] = {g->total_k, c->Hk, c->dv}, ds[3] = {g->total_q, c->H, c->dv};
    const int64_t s1[1] = {c->H}, s2[2] = {c->batch, c->H};
    g->q = tu_alloc(FA_F32, 3, qs);
    g->k = tu_alloc(FA_F32, 3, ks);
    g->v = tu_alloc(FA_F32, 3, vs);
    g->dout = tu_alloc(FA_F32, 3, ds);
    g->slopes1 = tu_alloc(FA_F32, 1, s1);
    g->slopes2 = tu_alloc(FA_F32, 2, s2);
    tu_fill(&g->q, rng, -2.0, 2.0);
    tu_fill(&g->k, rng, -2.0, 2.0);
    tu_fill(&g->v, rng, -1.0, 1.0);
    tu_fill(&g->dout, rng, -1.0, 1.0);
    tu_fill(&g->slopes1, rng, 0.05, 0.5);
    tu_fill(&g->slopes2, rng, 0.05, 0.5);
    g->vl = fa_varlen_default();
    g->vl.batch = c->batch;
    g->vl.cu_seqlens_q = g->cu_q;
    g->vl.cu_seqlens_k = g->cu_k;
    g->vl.seqused_k = c->use_used ? c->used : NULL;
}

static void free_data(vl_data *g)
{
    tu_free(&g->q); tu_free(&g->k); tu_free(&g->v); tu_free(&g->dout);
    tu_free(&g->slopes1); tu_free(&g->slopes2);
}

static fa_options make_opt(const opt_case *oc, vl_data *g, fa_impl impl, int varlen)
{
    fa_options opt = fa_options_default();
    opt.causal = oc->causal;
    opt.window_left = oc->wl;
    opt.window_right = oc->wr;
    opt.softcap = oc->softcap;
    opt.alibi_slopes = oc->alibi == 1 ? &g->slopes1.t : oc->alibi == 2 ? &g->slopes2.t : NULL;
    opt.impl = impl;
    opt.block_q = 8; /* several blocks and ragged tails per sequence */
    opt.block_k = 16;
    opt.num_threads = 2;
    opt.varlen = varlen ? &g->vl : NULL;
    return opt;
}

/* Keys sequence b uses. */
static int64_t klen(const vl_case *c, int64_t b) { return c->use_used ? c->used[b] : c->k_len[b]; }

/* Rank-4 view [1][len][x1][x2] of rows row0.. of a rank-3 packed tensor. */
static fa_tensor rows_view(const fa_tensor *t, int64_t row0, int64_t len)
{
    fa_tensor v;
    const int64_t sh[4] = {1, len, t->shape[1], t->shape[2]};
    const int64_t st[4] = {0, t->stride[0], t->stride[1], t->stride[2]};
    fa_tensor_make(&v, (char *)t->data + (size_t)(row0 * t->stride[0]) * fa_dtype_size(t->dtype), t->dtype, 4,
                   sh, st);
    return v;
}

/* Rank-3 view [1][H][len] of columns row0.. of LSE [H][total_q]. */
static fa_tensor lse_view(const fa_tensor *t, int64_t row0, int64_t len)
{
    fa_tensor v;
    const int64_t sh[3] = {1, t->shape[0], len};
    const int64_t st[3] = {0, t->stride[0], t->stride[1]};
    fa_tensor_make(&v, (char *)t->data + (size_t)(row0 * t->stride[1]) * fa_dtype_size(t->dtype), t->dtype, 3,
                   sh, st);
    return v;
}

/* Options for sequence b alone: the same, with row b of [batch][H] slopes. */
static fa_options seq_opt(const fa_options *opt, const opt_case *oc, const vl_data *g, int64_t b,
                          fa_tensor *slope_row)
{
    fa_options o = *opt;
    o.varlen = NULL;
    if (oc->alibi == 2) {
        const int64_t sh[1] = {g->slopes2.t.shape[1]};
        fa_tensor_make(slope_row, (float *)g->slopes2.t.data + b * g->slopes2.t.stride[0], FA_F32, 1, sh, NULL);
        o.alibi_slopes = slope_row;
    }
    return o;
}

static void expect_same_named(const tu_tensor *a, const tu_tensor *b, const char *what, const char *cname,
                              const char *impl, size_t oi)
{
    if (a->bytes != b->bytes || memcmp(a->mem, b->mem, a->bytes) != 0) {
        int64_t where = -1;
        const double e = tu_max_abs_diff(a, b, &where);
        fail_msg("%s, %s, options %zu: varlen %s differs from the per-sequence run (max diff %g at flat %lld)",
                 cname, impl, oi, what, e, (long long)where);
    }
}

static void expect_same(const tu_tensor *a, const tu_tensor *b, const char *what, const char *cname, fa_impl impl,
                        size_t oi)
{
    expect_same_named(a, b, what, cname, fa_impl_name(impl), oi);
}

/* Backwards the varlen test runs: the reference, flash, and check-grad's emulated bf16 and f16
 * baselines (fa_backward_extra.emulate_dtype; o and lse unused). */
#define BWD_KINDS 4
static const char *const BWD_NAME[BWD_KINDS] = {"reference", "flash", "emulated bf16", "emulated f16"};

static fa_status run_backward(int kind, const fa_tensor *q, const fa_tensor *k, const fa_tensor *v,
                              const fa_tensor *o, const fa_tensor *lse, const fa_tensor *dout, fa_tensor *dq,
                              fa_tensor *dk, fa_tensor *dv, const fa_options *opt)
{
    if (kind < 2) return fa_backward(q, k, v, o, lse, dout, dq, dk, dv, opt);
    fa_backward_extra ex;
    fa_backward_extra_init(&ex, sizeof ex);
    ex.emulate_dtype = kind == 2 ? FA_BF16 : FA_F16;
    return fa_backward_ex(q, k, v, o, lse, dout, dq, dk, dv, opt, &ex);
}

/* A plain dense float64 model of row i, head h of sequence b (no library code). */
static void dense_row(const vl_data *g, const vl_case *c, const opt_case *oc, int64_t b, int64_t i, int64_t h,
                      double *out, double *lse)
{
    const int64_t q0 = g->cu_q[b], k0 = g->cu_k[b], nq = c->q_len[b], nk = klen(c, b);
    const int64_t hk = h / (c->H / c->Hk), off = nk - nq, right = oc->causal ? 0 : oc->wr;
    const double scale = 1.0 / sqrt((double)c->d);
    double m = -INFINITY, l = 0.0, sc[256];
    int vis[256];
    for (int64_t j = 0; j < nk; j++) {
        vis[j] = !(oc->wl >= 0 && j < i + off - oc->wl) && !(right >= 0 && j > i + off + right);
        if (!vis[j]) continue;
        double dot = 0.0;
        for (int64_t x = 0; x < c->d; x++) {
            const int64_t qi[3] = {q0 + i, h, x}, ki[3] = {k0 + j, hk, x};
            dot += tu_get(&g->q, qi) * tu_get(&g->k, ki);
        }
        double t = scale * dot;
        if (oc->softcap > 0.0) t = oc->softcap * tanh(t / oc->softcap);
        if (oc->alibi) {
            const int64_t i1[1] = {h}, i2[2] = {b, h};
            const double slope = oc->alibi == 1 ? tu_get(&g->slopes1, i1) : tu_get(&g->slopes2, i2);
            t -= slope * fabs((double)(i + off - j));
        }
        sc[j] = t;
        if (t > m) m = t;
    }
    for (int64_t x = 0; x < c->dv; x++) out[x] = 0.0;
    for (int64_t j = 0; j < nk; j++) {
        if (!vis[j]) continue;
        const double e = exp(sc[j] - m);
        l += e;
        for (int64_t x = 0; x < c->dv; x++) {
            const int64_t vi[3] = {k0 + j, hk, x};
            out[x] += e * tu_get(&g->v, vi);
        }
    }
    for (int64_t x = 0; x < c->dv; x++) out[x] = l > 0.0 ? out[x] / l : 0.0;
    *lse = l > 0.0 ? m + log(l) : -INFINITY;
}

/* Ensure varlen forward gives every sequence the bits it gets alone, for every implementation and mask. */
static void test_varlen_forward_matches_each_sequence_alone(void **state)
{
    (void)state;
    uint64_t rng = tu_seed() ^ 0x7a1;
    for (size_t ci = 0; ci < sizeof CASES / sizeof CASES[0]; ci++) {
        const vl_case *c = &CASES[ci];
        vl_data g;
        make_data(c, &rng, &g);
        const int64_t os[3] = {g.total_q, c->H, c->dv}, ls[2] = {c->H, g.total_q};
        for (size_t oi = 0; oi < sizeof OPTS / sizeof OPTS[0]; oi++) {
            for (int impl = 0; impl < FA_IMPL_COUNT; impl++) {
                const fa_options opt = make_opt(&OPTS[oi], &g, (fa_impl)impl, 1);
                tu_tensor o = tu_alloc(FA_F32, 3, os), lse = tu_alloc(FA_F32, 2, ls);
                tu_tensor o2 = tu_alloc(FA_F32, 3, os), lse2 = tu_alloc(FA_F32, 2, ls);
                tu_poison(&o); tu_poison(&lse);
                if (fa_forward(&g.q.t, &g.k.t, &g.v.t, &o.t, &lse.t, &opt) != FA_OK)
                    fail_msg("%s: varlen %s forward: %s", c->name, fa_impl_name((fa_impl)impl), fa_last_error());
                /* the expectation: each sequence alone; unowned rows O = 0, LSE = -inf */
                memset(o2.mem, 0, o2.bytes);
                for (int64_t x = 0; x < c->H * g.total_q; x++) ((float *)lse2.mem)[x] = -INFINITY;
                for (int64_t b = 0; b < c->batch; b++) {
                    fa_tensor slope_row;
                    const fa_options so = seq_opt(&opt, &OPTS[oi], &g, b, &slope_row);
                    fa_tensor qv = rows_view(&g.q.t, g.cu_q[b], c->q_len[b]);
                    fa_tensor kv = rows_view(&g.k.t, g.cu_k[b], klen(c, b));
                    fa_tensor vv = rows_view(&g.v.t, g.cu_k[b], klen(c, b));
                    fa_tensor ov = rows_view(&o2.t, g.cu_q[b], c->q_len[b]);
                    fa_tensor lv = lse_view(&lse2.t, g.cu_q[b], c->q_len[b]);
                    if (fa_forward(&qv, &kv, &vv, &ov, &lv, &so) != FA_OK)
                        fail_msg("%s seq %lld: %s", c->name, (long long)b, fa_last_error());
                }
                expect_same(&o, &o2, "O", c->name, (fa_impl)impl, oi);
                expect_same(&lse, &lse2, "LSE", c->name, (fa_impl)impl, oi);
                if (impl == FA_IMPL_REFERENCE) /* the reference against a plain dense model */
                    for (int64_t b = 0; b < c->batch; b++)
                        for (int64_t i = 0; i < c->q_len[b]; i++)
                            for (int64_t h = 0; h < c->H; h++) {
                                double out[64], l;
                                dense_row(&g, c, &OPTS[oi], b, i, h, out, &l);
                                for (int64_t x = 0; x < c->dv; x++) {
                                    const int64_t idx[3] = {g.cu_q[b] + i, h, x};
                                    const double got = tu_get(&o, idx);
                                    if (!(fabs(got - out[x]) <= 3e-7 * (1.0 + fabs(out[x]))))
                                        fail_msg("%s seq %lld row %lld head %lld: reference %.9g, dense model %.9g",
                                                 c->name, (long long)b, (long long)i, (long long)h, got, out[x]);
                                }
                                const int64_t li[2] = {h, g.cu_q[b] + i};
                                const double gl = tu_get(&lse, li);
                                if (!(gl == l || fabs(gl - l) <= 3e-7 * (1.0 + fabs(l))))
                                    fail_msg("%s seq %lld row %lld: reference LSE %.9g, dense model %.9g", c->name,
                                             (long long)b, (long long)i, gl, l);
                            }
                if (impl == FA_IMPL_FLASH) { /* fa_check, varlen, against the float64 reference */
                    fa_check_options co = fa_check_options_default();
                    fa_check_report r = fa_check_report_init();
                    if (fa_check(&g.q.t, &g.k.t, &g.v.t, &o.t, &lse.t, &opt, &co, &r) != FA_OK)
                        fail_msg("%s: varlen fa_check: %s", c->name, fa_last_error());
                    if (!r.pass) fail_msg("%s, options %zu: flash fails the varlen check (max err %g, bound %g)",
                                          c->name, oi, r.max_abs_err, r.bound);
                    int64_t rows = 0;
                    for (int64_t b = 0; b < c->batch; b++) rows += c->q_len[b];
                    assert_int_equal(r.rows_total, rows * c->H);
                    assert_int_equal(r.batch, c->batch);
                    fa_check_report_free(&r);
                }
                tu_free(&o); tu_free(&lse); tu_free(&o2); tu_free(&lse2);
            }
        }
        free_data(&g);
    }
}

/* Ensure Q blocks cut into pieces (16 threads, few blocks) under varlen still
 * write every row of every sequence, each with the bits of that sequence run
 * alone on one thread (whole blocks): pieces are counted from each sequence's
 * own end, and sequences end mid-block, are empty, or are one block. Also with
 * the last tasks of the pass cut into 3 and 64 pieces on 3 threads (flash.c's
 * tail_split: the last non-empty tasks, past the empty ones of the shorter
 * sequences), and with the packing in several passes over two sets of slots. */
static void test_varlen_pieces_cover_every_row(void **state)
{
    (void)state;
    uint64_t rng = tu_seed() ^ 0x9e3;
    static const vl_case c = {"pieces", 5, 2, 1, 32, 32, {300, 37, 0, 129, 200}, {310, 40, 5, 129, 180}, {0}, 0, 3, 0};
    vl_data g;
    make_data(&c, &rng, &g);
    const int64_t os[3] = {g.total_q, c.H, c.dv}, ls[2] = {c.H, g.total_q};
    int64_t rows = 0;
    for (int64_t b = 0; b < c.batch; b++) rows += c.q_len[b];
    for (int x = 0; x < 8; x++) {
        const int causal = x < 4 && (x & 1);
        const opt_case oc = {causal, -1, -1, 0.0, 0};
        fa_options opt = make_opt(&oc, &g, FA_IMPL_FLASH, 1);
        opt.block_q = 128; /* 6 blocks for 16 threads: pieces of a few row blocks */
        opt.block_k = 64;
        opt.num_threads = x < 4 || x == 6 ? 16 : 3;
        if (x == 2 || x == 3) opt.pack_max_bytes = 0; /* the per-tile loop, not the shared passes */
        /* a packing cap that makes several passes in two sets of slots (flash.c, pack_sync), one
         * pair a pass (x 6), or two (x 7: slots of ~82 KB here): passes whose sequences are empty included */
        if (x == 6) opt.pack_max_bytes = 300000;
        if (x == 7) opt.pack_max_bytes = 370000;
        fa_tail_split_test = x == 4 ? 3 : x == 5 ? 64 : -1;
        tu_tensor o = tu_alloc(FA_F32, 3, os), lse = tu_alloc(FA_F32, 2, ls);
        tu_tensor o2 = tu_alloc(FA_F32, 3, os), lse2 = tu_alloc(FA_F32, 2, ls);
        tu_poison(&o); tu_poison(&lse);
        fa_count_test = 1;
        fa_count_rows = 0;
        const fa_status st = fa_forward(&g.q.t, &g.k.t, &g.v.t, &o.t, &lse.t, &opt);
        fa_count_test = 0;
        fa_tail_split_test = -1;
        if (st != FA_OK) fail_msg("varlen pieces forward: %s", fa_last_error());
        /* each row once: a piece handed out twice writes the same bits */
        if (fa_count_rows != rows * c.H)
            fail_msg("causal %d, packing cap %zu: the forward's tasks ran %ld query rows, the sequences have %lld",
                     causal, opt.pack_max_bytes, (long)fa_count_rows, (long long)(rows * c.H));
        memset(o2.mem, 0, o2.bytes);
        for (int64_t e = 0; e < c.H * g.total_q; e++) ((float *)lse2.mem)[e] = -INFINITY;
        for (int64_t b = 0; b < c.batch; b++) {
            fa_tensor slope_row;
            fa_options so = seq_opt(&opt, &oc, &g, b, &slope_row);
            so.num_threads = 1;
            fa_tensor qv = rows_view(&g.q.t, g.cu_q[b], c.q_len[b]), kv = rows_view(&g.k.t, g.cu_k[b], c.k_len[b]);
            fa_tensor vv = rows_view(&g.v.t, g.cu_k[b], c.k_len[b]), ov = rows_view(&o2.t, g.cu_q[b], c.q_len[b]);
            fa_tensor lv = lse_view(&lse2.t, g.cu_q[b], c.q_len[b]);
            if (fa_forward(&qv, &kv, &vv, &ov, &lv, &so) != FA_OK)
                fail_msg("seq %lld alone: %s", (long long)b, fa_last_error());
        }
        expect_same(&o, &o2, "O", c.name, FA_IMPL_FLASH, (size_t)x);
        expect_same(&lse, &lse2, "LSE", c.name, FA_IMPL_FLASH, (size_t)x);
        fa_check_options co = fa_check_options_default();
        fa_check_report r = fa_check_report_init();
        if (fa_check(&g.q.t, &g.k.t, &g.v.t, &o.t, &lse.t, &opt, &co, &r) != FA_OK)
            fail_msg("varlen pieces fa_check: %s", fa_last_error());
        if (!r.pass) fail_msg("causal %d: varlen pieces fail the check (max err %g, bound %g)", causal, r.max_abs_err,
                              r.bound);
        fa_check_report_free(&r);
        tu_free(&o); tu_free(&lse); tu_free(&o2); tu_free(&lse2);
    }
    free_data(&g);
}

/* Ensure the overlapped packing's passes (flash.c, pack_sync) keep the bits when a pass's pairs
 * have no query rows (its units are never awaited, its tasks are all empty): two sets of slots
 * of one pair, sequences 2 and 6 empty, 3 and 16 threads on however few cores, 40 calls against
 * one thread's bits. (That set_hand_on waits for a unit still being packed, claimed ahead by
 * the pass before, is not something this can show: a stress run with delays injected into the
 * driver failed in this configuration without the wait, while 400 plain calls here passed.) */
static void test_varlen_empty_passes_keep_the_bits(void **state)
{
    (void)state;
    uint64_t rng = tu_seed() ^ 0x5e7;
    static const vl_case c = {"empty passes", 8, 2, 1, 32, 32, {200, 150, 0, 250, 180, 120, 0, 300},
                              {400, 400, 400, 400, 400, 400, 400, 400}, {0}, 0, 0, 0};
    vl_data g;
    make_data(&c, &rng, &g);
    const int64_t os[3] = {g.total_q, c.H, c.dv}, ls[2] = {c.H, g.total_q};
    const opt_case oc = {0, -1, -1, 0.0, 0};
    fa_options opt = make_opt(&oc, &g, FA_IMPL_FLASH, 1);
    opt.block_q = 64;
    opt.block_k = 64;
    /* 2-3 slots of ~115 KB (K^T and V of 400 keys, d 32, padded): two sets of one pair */
    opt.pack_max_bytes = 409600;
    tu_tensor o1 = tu_alloc(FA_F32, 3, os), l1 = tu_alloc(FA_F32, 2, ls);
    opt.num_threads = 1;
    if (fa_forward(&g.q.t, &g.k.t, &g.v.t, &o1.t, &l1.t, &opt) != FA_OK) fail_msg("1 thread: %s", fa_last_error());
    for (int it = 0; it < 40; it++) {
        tu_tensor o = tu_alloc(FA_F32, 3, os), l = tu_alloc(FA_F32, 2, ls);
        tu_poison(&o);
        tu_poison(&l);
        opt.num_threads = it % 2 ? 16 : 3;
        if (fa_forward(&g.q.t, &g.k.t, &g.v.t, &o.t, &l.t, &opt) != FA_OK) fail_msg("call %d: %s", it, fa_last_error());
        expect_same(&o, &o1, "O", c.name, FA_IMPL_FLASH, (size_t)it);
        expect_same(&l, &l1, "LSE", c.name, FA_IMPL_FLASH, (size_t)it);
        tu_free(&o);
        tu_free(&l);
    }
    tu_free(&o1);
    tu_free(&l1);
    free_data(&g);
}

/* Ensure varlen backward (flash, reference; O/LSE given or recomputed) matches each sequence alone. */
static void test_varlen_backward_matches_each_sequence_alone(void **state)
{
    (void)state;
    uint64_t rng = tu_seed() ^ 0xb1d;
    for (size_t ci = 0; ci < sizeof CASES / sizeof CASES[0]; ci++) {
        const vl_case *c = &CASES[ci];
        vl_data g;
        make_data(c, &rng, &g);
        const int64_t os[3] = {g.total_q, c->H, c->dv}, ls[2] = {c->H, g.total_q};
        const int64_t qs[3] = {g.total_q, c->H, c->d}, ks[3] = {g.total_k, c->Hk, c->d};
        const int64_t vs[3] = {g.total_k, c->Hk, c->dv};
        for (size_t oi = 0; oi < sizeof OPTS / sizeof OPTS[0]; oi++) {
            for (int kind = 0; kind < BWD_KINDS; kind++) {
                for (int given = 0; given < 2; given++) {
                    const fa_impl impl = kind == 1 ? FA_IMPL_FLASH : FA_IMPL_REFERENCE;
                    const fa_options opt = make_opt(&OPTS[oi], &g, impl, 1);
                    tu_tensor o = tu_alloc(FA_F32, 3, os), lse = tu_alloc(FA_F32, 2, ls);
                    if (fa_forward(&g.q.t, &g.k.t, &g.v.t, &o.t, &lse.t, &opt) != FA_OK)
                        fail_msg("%s: forward: %s", c->name, fa_last_error());
                    tu_tensor dq[2], dk[2], dv[2];
                    for (int x = 0; x < 2; x++) {
                        dq[x] = tu_alloc(FA_F32, 3, qs);
                        dk[x] = tu_alloc(FA_F32, 3, ks);
                        dv[x] = tu_alloc(FA_F32, 3, vs);
                    }
                    tu_poison(&dq[0]); tu_poison(&dk[0]); tu_poison(&dv[0]);
                    memset(dq[1].mem, 0, dq[1].bytes); /* unowned rows: zero gradients */
                    memset(dk[1].mem, 0, dk[1].bytes);
                    memset(dv[1].mem, 0, dv[1].bytes);
                    if (run_backward(kind, &g.q.t, &g.k.t, &g.v.t, given ? &o.t : NULL, given ? &lse.t : NULL,
                                     &g.dout.t, &dq[0].t, &dk[0].t, &dv[0].t, &opt) != FA_OK)
                        fail_msg("%s: varlen %s backward: %s", c->name, BWD_NAME[kind], fa_last_error());
                    for (int64_t b = 0; b < c->batch; b++) {
                        fa_tensor slope_row;
                        const fa_options so = seq_opt(&opt, &OPTS[oi], &g, b, &slope_row);
                        const int64_t q0 = g.cu_q[b], nq = c->q_len[b], k0 = g.cu_k[b], nk = klen(c, b);
                        fa_tensor qv = rows_view(&g.q.t, q0, nq), kv = rows_view(&g.k.t, k0, nk);
                        fa_tensor vv = rows_view(&g.v.t, k0, nk), ov = rows_view(&o.t, q0, nq);
                        fa_tensor lv = lse_view(&lse.t, q0, nq), dov = rows_view(&g.dout.t, q0, nq);
                        fa_tensor dqv = rows_view(&dq[1].t, q0, nq), dkv = rows_view(&dk[1].t, k0, nk);
                        fa_tensor dvv = rows_view(&dv[1].t, k0, nk);
                        if (run_backward(kind, &qv, &kv, &vv, given ? &ov : NULL, given ? &lv : NULL, &dov, &dqv,
                                         &dkv, &dvv, &so) != FA_OK)
                            fail_msg("%s seq %lld: backward: %s", c->name, (long long)b, fa_last_error());
                    }
                    expect_same_named(&dq[0], &dq[1], "dQ", c->name, BWD_NAME[kind], oi);
                    expect_same_named(&dk[0], &dk[1], "dK", c->name, BWD_NAME[kind], oi);
                    expect_same_named(&dv[0], &dv[1], "dV", c->name, BWD_NAME[kind], oi);
                    for (int x = 0; x < 2; x++) { tu_free(&dq[x]); tu_free(&dk[x]); tu_free(&dv[x]); }
                    tu_free(&o); tu_free(&lse);
                }
            }
        }
        free_data(&g);
    }
}

/* Ensure fa_check pinpoints a wrong element of a varlen output by sequence and row within it. */
static void test_varlen_check_names_the_sequence_and_row(void **state)
{
    (void)state;
    uint64_t rng = tu_seed() ^ 0xc4e;
    const vl_case *c = &CASES[0];
    vl_data g;
    make_data(c, &rng, &g);
    const int64_t os[3] = {g.total_q, c->H, c->dv};
    tu_tensor o = tu_alloc(FA_F32, 3, os);
    fa_options opt = make_opt(&OPTS[1], &g, FA_IMPL_FLASH, 1);
    assert_int_equal(fa_forward(&g.q.t, &g.k.t, &g.v.t, &o.t, NULL, &opt), FA_OK);
    /* sequence 2, row 7, head 1, column 3 */
    float *x = (float *)o.mem + ((g.cu_q[2] + 7) * c->H + 1) * c->dv + 3;
    *x += 0.01f;
    fa_check_options co = fa_check_options_default();
    fa_check_report r = fa_check_report_init();
    assert_int_equal(fa_check(&g.q.t, &g.k.t, &g.v.t, &o.t, NULL, &opt, &co, &r), FA_OK);
    assert_false(r.pass);
    assert_int_equal(r.n_fail, 1);
    assert_int_equal(r.worst_batch, 2);
    assert_int_equal(r.worst_row, 7);
    assert_int_equal(r.worst_head, 1);
    assert_int_equal(r.worst_col, 3);
    fa_check_report_free(&r);
    /* a sampled check still sees only rows of the sequences */
    co.sample_rows = 4;
    r = fa_check_report_init();
    assert_int_equal(fa_check(&g.q.t, &g.k.t, &g.v.t, &o.t, NULL, &opt, &co, &r), FA_OK);
    int64_t expect = 0;
    for (int64_t b = 0; b < c->batch; b++) expect += (c->q_len[b] < 4 ? c->q_len[b] : 4) * c->H;
    assert_int_equal(r.rows_checked, expect);
    fa_check_report_free(&r);
    tu_free(&o);
    free_data(&g);
}

/* Ensure fa_check reads only the rows sequences use: NaN in query rows past
 * cu_seqlens_q[batch], keys past cu_seqlens_k[batch] and keys past
 * seqused_k is no error, and NaN in a row in use is named [row, head, col]
 * in the caller's rank-3 layout. */
static void test_varlen_check_ignores_rows_no_sequence_reads(void **state)
{
    (void)state;
    uint64_t rng = tu_seed() ^ 0xa7f;
    for (size_t ci = 0; ci < 2; ci++) {
        const vl_case *c = &CASES[ci];
        vl_data g;
        make_data(c, &rng, &g);
        float *q = (float *)g.q.mem, *k = (float *)g.k.mem, *v = (float *)g.v.mem;
        if (ci == 0) { /* "mixed": padding rows after the last sequence */
            q[(g.total_q - 1) * c->H * c->d] = NAN;
            k[(g.total_k - 1) * c->Hk * c->d + 1] = NAN;
            v[(g.total_k - 2) * c->Hk * c->dv] = INFINITY;
        } else { /* "seqused": sequence 0 uses 5 of its 12 keys */
            k[(g.cu_k[0] + 7) * c->Hk * c->d] = NAN;
            v[(g.cu_k[0] + 11) * c->Hk * c->dv + 2] = NAN;
        }
        const int64_t os[3] = {g.total_q, c->H, c->dv};
        tu_tensor o = tu_alloc(FA_F32, 3, os);
        fa_options opt = make_opt(&OPTS[1], &g, FA_IMPL_FLASH, 1);
        assert_int_equal(fa_forward(&g.q.t, &g.k.t, &g.v.t, &o.t, NULL, &opt), FA_OK);
        for (int tol = 0; tol < 2; tol++) {
            fa_check_options co = fa_check_options_default();
            if (tol) {
                co.use_tolerance = 1;
                co.atol = 1e-4;
                co.rtol = 1e-4;
            }
            fa_check_report r = fa_check_report_init();
            if (fa_check(&g.q.t, &g.k.t, &g.v.t, &o.t, NULL, &opt, &co, &r) != FA_OK)
                fail_msg("%s: NaN in rows no sequence reads refused: %s", c->name, fa_last_error());
            assert_true(r.pass);
            fa_check_report_free(&r);
        }
        /* a row in use: sequence 2 (mixed) / 3 (seqused), its row 1, head 1, column 2 */
        const int64_t sb = ci == 0 ? 2 : 3, row = g.cu_q[sb] + 1;
        q[(row * c->H + 1) * c->d + 2] = NAN;
        fa_check_options co = fa_check_options_default();
        fa_check_report r = fa_check_report_init();
        assert_int_equal(fa_check(&g.q.t, &g.k.t, &g.v.t, &o.t, NULL, &opt, &co, &r), FA_ERR_NONFINITE);
        char want[64];
        snprintf(want, sizeof want, "q: element [%lld,1,2]", (long long)row);
        if (!strstr(fa_last_error(), want)) fail_msg("expected '%s' in: %s", want, fa_last_error());
        fa_check_report_free(&r);
        tu_free(&o);
        free_data(&g);
    }
}

/* Call fa_forward with varlen arrays cu_q/cu_k/used and expect `status` and `needle` in the message. */
static void expect_refusal(vl_data *g, const vl_case *c, const int32_t *cu_q, const int32_t *cu_k,
                           const int32_t *used, fa_status status, const char *needle)
{
    const int64_t os[3] = {g->total_q, c->H, c->dv};
    tu_tensor o = tu_alloc(FA_F32, 3, os);
    fa_varlen vl = g->vl;
    vl.cu_seqlens_q = cu_q;
    vl.cu_seqlens_k = cu_k;
    vl.seqused_k = used;
    fa_options opt = fa_options_default();
    opt.varlen = &vl;
    const fa_status st = fa_forward(&g->q.t, &g->k.t, &g->v.t, &o.t, NULL, &opt);
    if (st != status || !strstr(fa_last_error(), needle))
        fail_msg("expected status %d with '%s', got %d: %s", (int)status, needle, (int)st, fa_last_error());
    tu_free(&o);
}

/* Ensure bad cu_seqlens / seqused_k are refused with FA_ERR_INDEX, naming the array and the index. */
static void test_varlen_refuses_bad_index_arrays(void **state)
{
    (void)state;
    uint64_t rng = tu_seed() ^ 0xbad;
    const vl_case *c = &CASES[1]; /* batch 4, total_q 21, total_k 33 */
    vl_data g;
    make_data(c, &rng, &g);
    const int32_t ok_q[5] = {0, 7, 10, 11, 21}, ok_k[5] = {0, 12, 15, 23, 33};
    const int32_t start_q[5] = {1, 7, 10, 11, 21};
    const int32_t dec_q[5] = {0, 7, 6, 11, 21};
    const int32_t past_q[5] = {0, 7, 10, 11, 22};
    const int32_t past_k[5] = {0, 12, 15, 34, 34};
    const int32_t dec_k[5] = {0, 12, 15, 14, 33};
    const int32_t used_big[4] = {12, 4, 1, 1}, used_neg[4] = {1, 1, -1, 1};
    expect_refusal(&g, c, start_q, ok_k, NULL, FA_ERR_INDEX, "cu_seqlens_q[0] = 1");
    expect_refusal(&g, c, dec_q, ok_k, NULL, FA_ERR_INDEX, "cu_seqlens_q[2] = 6 is less than cu_seqlens_q[1] = 7");
    expect_refusal(&g, c, past_q, ok_k, NULL, FA_ERR_INDEX, "cu_seqlens_q[4] = 22 is past the end of q");
    expect_refusal(&g, c, ok_q, past_k, NULL, FA_ERR_INDEX, "cu_seqlens_k[3] = 34 is past the end of k");
    expect_refusal(&g, c, ok_q, dec_k, NULL, FA_ERR_INDEX, "cu_seqlens_k[3] = 14 is less than");
    expect_refusal(&g, c, ok_q, ok_k, used_big, FA_ERR_INDEX, "seqused_k[1] = 4 is outside 0..3");
    expect_refusal(&g, c, ok_q, ok_k, used_neg, FA_ERR_INDEX, "seqused_k[2] = -1");
    expect_refusal(&g, c, NULL, ok_k, NULL, FA_ERR_NULL_ARG, "cu_seqlens_q is NULL");
    /* the caller's names (e.g. files) lead the message */
    g.vl.cu_seqlens_q_name = "cu_q.npy";
    expect_refusal(&g, c, dec_q, ok_k, NULL, FA_ERR_INDEX, "cu_q.npy: cu_seqlens_q[2]");
    g.vl.cu_seqlens_q_name = NULL;
    /* and the good arrays pass */
    expect_refusal(&g, c, ok_q, ok_k, c->used, FA_OK, "");

    /* rank-4 tensors are not a varlen layout; an LSE must be [heads, total_q] */
    fa_options opt = fa_options_default();
    opt.varlen = &g.vl;
    tu_tensor q4 = tu_alloc4(FA_F32, 1, g.total_q, c->H, c->d, 0);
    const int64_t os[3] = {g.total_q, c->H, c->dv}, bad_ls[2] = {g.total_q, c->H};
    tu_tensor o = tu_alloc(FA_F32, 3, os), lse = tu_alloc(FA_F32, 2, bad_ls);
    assert_int_equal(fa_forward(&q4.t, &g.k.t, &g.v.t, &o.t, NULL, &opt), FA_ERR_SHAPE);
    assert_non_null(strstr(fa_last_error(), "rank 3"));
    assert_int_equal(fa_forward(&g.q.t, &g.k.t, &g.v.t, &o.t, &lse.t, &opt), FA_ERR_SHAPE);
    assert_non_null(strstr(fa_last_error(), "[heads="));
    /* [batch][heads] slopes are per sequence */
    const int64_t s2[2] = {1, c->H};
    tu_tensor sl = tu_alloc(FA_F32, 2, s2);
    tu_fill(&sl, &rng, 0.1, 0.2);
    opt.alibi_slopes = &sl.t;
    assert_int_equal(fa_forward(&g.q.t, &g.k.t, &g.v.t, &o.t, NULL, &opt), FA_ERR_ALIBI);
    tu_free(&sl);
    tu_free(&q4); tu_free(&o); tu_free(&lse);
    free_data(&g);
}

/* Ensure an empty varlen batch (batch 0) writes O = 0 and LSE = -inf everywhere, and dQ/dK/dV = 0. */
static void test_varlen_with_no_sequence_writes_empty_rows(void **state)
{
    (void)state;
    uint64_t rng = tu_seed() ^ 0xe0;
    const vl_case *c = &CASES[0];
    vl_data g;
    make_data(c, &rng, &g);
    g.vl.batch = 0;
    const int64_t os[3] = {g.total_q, c->H, c->dv}, ls[2] = {c->H, g.total_q};
    tu_tensor o = tu_alloc(FA_F32, 3, os), lse = tu_alloc(FA_F32, 2, ls);
    tu_poison(&o); tu_poison(&lse);
    fa_options opt = fa_options_default();
    opt.varlen = &g.vl;
    assert_int_equal(fa_forward(&g.q.t, &g.k.t, &g.v.t, &o.t, &lse.t, &opt), FA_OK);
    for (int64_t x = 0; x < g.total_q * c->H * c->dv; x++) assert_true(((float *)o.mem)[x] == 0.0f);
    for (int64_t x = 0; x < g.total_q * c->H; x++) assert_true(((float *)lse.mem)[x] == -INFINITY);
    const int64_t qs[3] = {g.total_q, c->H, c->d}, ks[3] = {g.total_k, c->Hk, c->d}, vs[3] = {g.total_k, c->Hk, c->dv};
    tu_tensor dq = tu_alloc(FA_F32, 3, qs), dk = tu_alloc(FA_F32, 3, ks), dv = tu_alloc(FA_F32, 3, vs);
    tu_poison(&dq); tu_poison(&dk); tu_poison(&dv);
    assert_int_equal(fa_backward(&g.q.t, &g.k.t, &g.v.t, NULL, NULL, &g.dout.t, &dq.t, &dk.t, &dv.t, &opt), FA_OK);
    assert_int_equal(tu_count_nan(&dq), 0);
    assert_int_equal(tu_count_nan(&dk), 0);
    assert_int_equal(tu_count_nan(&dv), 0);
    size_t bytes = 0;
    assert_int_equal(fa_workspace_bytes(&g.q.t, &g.k.t, &g.v.t, &opt, &bytes), FA_OK);
    tu_free(&o); tu_free(&lse); tu_free(&dq); tu_free(&dk); tu_free(&dv);
    free_data(&g);
}

/* A skewed varlen batch: sequence 0 has `long_len` query rows and keys, the
 * other batch - 1 sequences one row and one key each. */
typedef struct skew_data {
    int32_t *cu;
    int64_t total;
    tu_tensor q, k, v, o, lse, dout, dq, dk, dv;
    fa_varlen vl;
} skew_data;

static void make_skew(int64_t batch, int32_t long_len, int64_t H, int64_t d, uint64_t *rng, skew_data *s)
{
    s->cu = malloc(sizeof(int32_t) * (size_t)(batch + 1));
    assert_non_null(s->cu);
    s->cu[0] = 0;
    for (int64_t b = 0; b < batch; b++) s->cu[b + 1] = s->cu[b] + (b == 0 ? long_len : 1);
    s->total = s->cu[batch];
    const int64_t sh[3] = {s->total, H, d}, ls[2] = {H, s->total};
    s->q = tu_alloc(FA_F32, 3, sh); s->k = tu_alloc(FA_F32, 3, sh); s->v = tu_alloc(FA_F32, 3, sh);
    s->o = tu_alloc(FA_F32, 3, sh); s->dout = tu_alloc(FA_F32, 3, sh); s->lse = tu_alloc(FA_F32, 2, ls);
    s->dq = tu_alloc(FA_F32, 3, sh); s->dk = tu_alloc(FA_F32, 3, sh); s->dv = tu_alloc(FA_F32, 3, sh);
    tu_fill(&s->q, rng, -2.0, 2.0); tu_fill(&s->k, rng, -2.0, 2.0);
    tu_fill(&s->v, rng, -1.0, 1.0); tu_fill(&s->dout, rng, -1.0, 1.0);
    s->vl = fa_varlen_default();
    s->vl.batch = batch;
    s->vl.cu_seqlens_q = s->cu;
    s->vl.cu_seqlens_k = s->cu;
}

static void free_skew(skew_data *s)
{
    tu_free(&s->q); tu_free(&s->k); tu_free(&s->v); tu_free(&s->o); tu_free(&s->lse);
    tu_free(&s->dout); tu_free(&s->dq); tu_free(&s->dk); tu_free(&s->dv);
    free(s->cu);
}

/* Peak library allocation of a flash backward of the first `batch` sequences of s. */
static size_t backward_peak(skew_data *s, int64_t batch, fa_options opt)
{
    opt.varlen = &s->vl;
    s->vl.batch = batch;
    if (fa_forward(&s->q.t, &s->k.t, &s->v.t, &s->o.t, &s->lse.t, &opt) != FA_OK)
        fail_msg("skewed batch %lld: forward: %s", (long long)batch, fa_last_error());
    fa_alloc_stats st;
    fa_alloc_stats_reset();
    if (fa_backward(&s->q.t, &s->k.t, &s->v.t, &s->o.t, &s->lse.t, &s->dout.t, &s->dq.t, &s->dk.t, &s->dv.t,
                    &opt) != FA_OK)
        fail_msg("skewed batch %lld: backward: %s", (long long)batch, fa_last_error());
    fa_alloc_stats_get(&st);
    return st.peak_bytes;
}

/* Ensure the flash backward's memory grows with the rows in use, not with
 * batch x the longest sequence: many one-row sequences beside a long one
 * cost at most a few bytes per added row over the long sequence alone. */
static void test_varlen_backward_memory_follows_the_rows(void **state)
{
    (void)state;
    uint64_t rng = tu_seed() ^ 0x5e3;
    const int64_t batch = 1500, H = 2, d = 8;
    skew_data s;
    make_skew(batch, 512, H, d, &rng, &s);
    fa_options opt = fa_options_default();
    opt.impl = FA_IMPL_FLASH;
    opt.causal = 1;
    opt.num_threads = 2;
    const size_t alone = backward_peak(&s, 1, opt), many = backward_peak(&s, batch, opt);
    const size_t allowed = alone + (size_t)(64 * (batch - 1) * H);
    if (many > allowed)
        fail_msg("flash backward of 1 x 512 rows + %lld one-row sequences peaks at %zu bytes, the 512-row "
                 "sequence alone at %zu: more than 64 bytes per added row and head (%zu allowed)",
                 (long long)(batch - 1), many, alone, allowed);
    free_skew(&s);
}

/* Peak library allocation of a flash forward and backward of s. */
static void flash_peaks(skew_data *s, fa_options opt, size_t *fwd, size_t *bwd, tu_tensor *grads)
{
    fa_alloc_stats st;
    opt.varlen = &s->vl;
    fa_alloc_stats_reset();
    if (fa_forward(&s->q.t, &s->k.t, &s->v.t, &s->o.t, &s->lse.t, &opt) != FA_OK)
        fail_msg("many short sequences: forward: %s", fa_last_error());
    fa_alloc_stats_get(&st);
    *fwd = st.peak_bytes;
    fa_alloc_stats_reset();
    if (fa_backward(&s->q.t, &s->k.t, &s->v.t, &s->o.t, &s->lse.t, &s->dout.t, &grads[0].t, &grads[1].t,
                    &grads[2].t, &opt) != FA_OK)
        fail_msg("many short sequences: backward: %s", fa_last_error());
    fa_alloc_stats_get(&st);
    *bwd = st.peak_bytes;
}

/* Ensure many short varlen sequences beside a long one are packed per tile
 * (shared packing costs barriers per sequence): the default allocates what
 * pack_max_bytes = 0 allocates, and gives the same bits. */
static void test_varlen_many_short_sequences_pack_per_tile(void **state)
{
    (void)state;
    uint64_t rng = tu_seed() ^ 0x7a1;
    const int64_t batch = 2000, H = 2, d = 8;
    skew_data s;
    make_skew(batch, 512, H, d, &rng, &s);
    const int64_t sh[3] = {s.total, H, d};
    tu_tensor gr[2][3];
    for (int x = 0; x < 2; x++)
        for (int y = 0; y < 3; y++) gr[x][y] = tu_alloc(FA_F32, 3, sh);
    fa_options opt = fa_options_default();
    opt.impl = FA_IMPL_FLASH;
    opt.causal = 1;
    opt.num_threads = 2;
    size_t fwd[2], bwd[2];
    flash_peaks(&s, opt, &fwd[0], &bwd[0], gr[0]);
    tu_tensor o0 = tu_alloc(FA_F32, 3, sh);
    memcpy(o0.mem, s.o.mem, o0.bytes);
    opt.pack_max_bytes = 0;
    flash_peaks(&s, opt, &fwd[1], &bwd[1], gr[1]);
    if (fwd[0] != fwd[1] || bwd[0] != bwd[1])
        fail_msg("1 x 512 + %lld one-row sequences: default packing peaks at %zu / %zu bytes (forward / "
                 "backward), per-tile packing at %zu / %zu: the default shared the packing",
                 (long long)(batch - 1), fwd[0], bwd[0], fwd[1], bwd[1]);
    assert_memory_equal(o0.mem, s.o.mem, o0.bytes);
    for (int y = 0; y < 3; y++) assert_memory_equal(gr[0][y].mem, gr[1][y].mem, gr[0][y].bytes);
    for (int x = 0; x < 2; x++)
        for (int y = 0; y < 3; y++) tu_free(&gr[x][y]);
    tu_free(&o0);
    free_skew(&s);
}

/* Ensure the standard path's S/P cap applies per sequence: a 2048 x 1 and a
 * 1 x 2048 sequence each need 2048 x 16 floats (128 KiB), not 2048 x 2048,
 * so a 1 MiB cap accepts them; the result is each sequence's own. */
static void test_varlen_standard_cap_is_per_sequence(void **state)
{
    (void)state;
    uint64_t rng = tu_seed() ^ 0x57d;
    const int64_t H = 1, d = 8;
    int32_t cu_q[3] = {0, 2048, 2049}, cu_k[3] = {0, 1, 2049};
    const int64_t qs[3] = {2049, H, d}, ls[2] = {H, 2049};
    tu_tensor q = tu_alloc(FA_F32, 3, qs), k = tu_alloc(FA_F32, 3, qs), v = tu_alloc(FA_F32, 3, qs);
    tu_tensor o[2] = {tu_alloc(FA_F32, 3, qs), tu_alloc(FA_F32, 3, qs)};
    tu_tensor lse[2] = {tu_alloc(FA_F32, 2, ls), tu_alloc(FA_F32, 2, ls)};
    tu_fill(&q, &rng, -2.0, 2.0); tu_fill(&k, &rng, -2.0, 2.0); tu_fill(&v, &rng, -1.0, 1.0);
    fa_varlen vl = fa_varlen_default();
    vl.batch = 2;
    vl.cu_seqlens_q = cu_q;
    vl.cu_seqlens_k = cu_k;
    fa_options opt = fa_options_default();
    opt.impl = FA_IMPL_STANDARD;
    opt.standard_max_bytes = (size_t)1 << 20;
    opt.varlen = &vl;
    if (fa_forward(&q.t, &k.t, &v.t, &o[0].t, &lse[0].t, &opt) != FA_OK)
        fail_msg("standard, 2048 x 1 and 1 x 2048 under a 1 MiB cap: %s", fa_last_error());
    opt.varlen = NULL;
    for (int64_t b = 0; b < 2; b++) {
        fa_tensor qv = rows_view(&q.t, cu_q[b], cu_q[b + 1] - cu_q[b]), ov = rows_view(&o[1].t, cu_q[b], cu_q[b + 1] - cu_q[b]);
        fa_tensor kv = rows_view(&k.t, cu_k[b], cu_k[b + 1] - cu_k[b]), vv = rows_view(&v.t, cu_k[b], cu_k[b + 1] - cu_k[b]);
        fa_tensor lv = lse_view(&lse[1].t, cu_q[b], cu_q[b + 1] - cu_q[b]);
        if (fa_forward(&qv, &kv, &vv, &ov, &lv, &opt) != FA_OK)
            fail_msg("standard, sequence %lld alone: %s", (long long)b, fa_last_error());
    }
    expect_same(&o[0], &o[1], "O", "2048x1 + 1x2048", FA_IMPL_STANDARD, 0);
    expect_same(&lse[0], &lse[1], "LSE", "2048x1 + 1x2048", FA_IMPL_STANDARD, 0);
    /* a sequence that alone exceeds the cap is still refused, and named */
    cu_k[1] = 1024; /* sequence 0: 2048 x 1024 floats = 8 MiB */
    opt.varlen = &vl;
    assert_int_equal(fa_forward(&q.t, &k.t, &v.t, &o[0].t, &lse[0].t, &opt), FA_ERR_TOO_LARGE);
    assert_non_null(strstr(fa_last_error(), "sequence 0: seqlen_q 2048 x seqlen_k 1024"));
    tu_free(&q); tu_free(&k); tu_free(&v);
    for (int x = 0; x < 2; x++) { tu_free(&o[x]); tu_free(&lse[x]); }
}

/* Ensure a varlen batch whose batch x heads x longest sequence x (d + d_v)
 * overflows 64 bits is refused (implementations index with such products),
 * though each tensor alone is valid: 2^20 sequences, the last of 2^31 - 1
 * rows, 512 heads, d = d_v = 8 (zero-stride views: nothing is read). */
static void test_varlen_refuses_index_products_past_64_bits(void **state)
{
    (void)state;
    const int64_t batch = (int64_t)1 << 20, total = INT32_MAX, H = 512, d = 8;
    int32_t *cu = calloc((size_t)batch + 1, sizeof(int32_t));
    assert_non_null(cu);
    cu[batch] = (int32_t)total;
    float one = 1.0f;
    const int64_t sh[3] = {total, H, d}, zero[3] = {0, 0, 0};
    fa_tensor q, k, v;
    assert_int_equal(fa_tensor_make(&q, &one, FA_F32, 3, sh, zero), FA_OK);
    assert_int_equal(fa_tensor_make(&k, &one, FA_F32, 3, sh, zero), FA_OK);
    assert_int_equal(fa_tensor_make(&v, &one, FA_F32, 3, sh, zero), FA_OK);
    fa_varlen vl = fa_varlen_default();
    vl.batch = batch;
    vl.cu_seqlens_q = cu;
    vl.cu_seqlens_k = cu;
    fa_options opt = fa_options_default();
    opt.varlen = &vl;
    size_t bytes = 0;
    const fa_status st = fa_workspace_bytes(&q, &k, &v, &opt, &bytes);
    if (st != FA_ERR_SHAPE || !strstr(fa_last_error(), "overflows 64 bits"))
        fail_msg("expected FA_ERR_SHAPE '... overflows 64 bits', got %d: %s", (int)st,
                 st == FA_OK ? "(accepted)" : fa_last_error());
    free(cu);
}

/* Ensure a bad fa_varlen.struct_size is refused naming fa_varlen and its
 * initializer, without fa_options' 0.2 hint (`double scale`). */
static void test_varlen_bad_struct_size_names_fa_varlen(void **state)
{
    (void)state;
    uint64_t rng = tu_seed() ^ 0x55e;
    const vl_case *c = &CASES[0];
    vl_data g;
    make_data(c, &rng, &g);
    g.vl.struct_size = 3;
    const int64_t os[3] = {g.total_q, c->H, c->dv};
    tu_tensor o = tu_alloc(FA_F32, 3, os);
    fa_options opt = fa_options_default();
    opt.varlen = &g.vl;
    assert_int_equal(fa_forward(&g.q.t, &g.k.t, &g.v.t, &o.t, NULL, &opt), FA_ERR_OPTION);
    const char *msg = fa_last_error();
    if (!strstr(msg, "fa_varlen: struct_size 3") || !strstr(msg, "fa_varlen_init()") || strstr(msg, "scale"))
        fail_msg("unexpected message: %s", msg);
    tu_free(&o);
    free_data(&g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_varlen_forward_matches_each_sequence_alone),
        cmocka_unit_test(test_varlen_pieces_cover_every_row),
        cmocka_unit_test(test_varlen_empty_passes_keep_the_bits),
        cmocka_unit_test(test_varlen_backward_matches_each_sequence_alone),
        cmocka_unit_test(test_varlen_check_names_the_sequence_and_row),
        cmocka_unit_test(test_varlen_check_ignores_rows_no_sequence_reads),
        cmocka_unit_test(test_varlen_refuses_bad_index_arrays),
        cmocka_unit_test(test_varlen_refuses_index_products_past_64_bits),
        cmocka_unit_test(test_varlen_bad_struct_size_names_fa_varlen),
        cmocka_unit_test(test_varlen_with_no_sequence_writes_empty_rows),
        cmocka_unit_test(test_varlen_backward_memory_follows_the_rows),
        cmocka_unit_test(test_varlen_standard_cap_is_per_sequence),
        cmocka_unit_test(test_varlen_many_short_sequences_pack_per_tile),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
