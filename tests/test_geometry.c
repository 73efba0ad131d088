/*
 * test_geometry.c — per-sequence geometry (fa_problem.seq) through the
 * internal API: every implementation indexes Q/K/V/O/LSE (and dO/dQ/dK/dV)
 * through it.
 *
 * Sequences of different lengths are carved out of one tensor (varlen's
 * layout: tensor batch 0, row offsets) or live at other tensor batches and row
 * offsets (the KV cache's layout: cache_batch_idx, leftpad). Each sequence b
 * is then also run as a plain uniform problem on views of the same memory,
 * through the public API, and the two must agree bit for bit: same
 * implementation, same blocks, same per-sequence masks. Outputs are poisoned
 * first, so rows no sequence owns must stay untouched and every owned row must
 * be written. fa_check compares each sequence's flash output with the float64
 * reference, and the reference itself against a plain dense float64 model
 * written here (no masks shared with the library).
 */
#include "test_util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define NSEQ_MAX 8
/* One sequence: Q rows (tensor batch, first row, count), K/V rows likewise; dense, no new keys. */
#define SEQ(qb, qs, ql, kb, ks, kl) {qb, qs, ql, kb, ks, kl, NULL, 0, 0, 0}

/* View of rows row0 .. row0 + len - 1 of tensor batch `batch` of a rank-4 [B][S][H][x] tensor. */
static fa_tensor view4(const fa_tensor *t, int64_t batch, int64_t row0, int64_t len)
{
    fa_tensor v = *t;
    v.data = (char *)t->data + (size_t)(batch * t->stride[0] + row0 * t->stride[1]) * fa_dtype_size(t->dtype);
    v.shape[0] = 1;
    v.shape[1] = len;
    return v;
}

/* View of LSE [B][H][S]: rows row0 .. row0 + len - 1 of tensor batch `batch`. */
static fa_tensor view_lse(const fa_tensor *t, int64_t batch, int64_t row0, int64_t len)
{
    fa_tensor v = *t;
    v.data = (char *)t->data + (size_t)(batch * t->stride[0] + row0 * t->stride[2]) * fa_dtype_size(t->dtype);
    v.shape[0] = 1;
    v.shape[2] = len;
    return v;
}

typedef struct geo_case {
    const char *name;
    int64_t qb, qs, kb, ks;   /* tensor shapes: Q [qb][qs][H][d], K/V [kb][ks][Hk][d|dv] */
    int64_t H, Hk, d, dv;
    int nseq;
    fa_seq seq[NSEQ_MAX];
} geo_case;

/* varlen-like: one packed tensor, rows not owned by any sequence at the end */
static const geo_case VARLEN = {
    "varlen", 1, 28, 1, 41, 4, 2, 16, 8, 5,
    {SEQ(0, 0, 5, 0, 0, 9), SEQ(0, 5, 0, 0, 9, 4), SEQ(0, 5, 13, 0, 13, 7), SEQ(0, 18, 6, 0, 20, 0),
     SEQ(0, 24, 3, 0, 20, 19)}};
/* cache-like: keys at other tensor batches (cache_batch_idx) and row offsets (leftpad) */
static const geo_case CACHE = {
    "cache", 3, 7, 3, 30, 4, 2, 24, 24, 3,
    {SEQ(0, 0, 7, 2, 3, 20), SEQ(1, 0, 7, 0, 0, 7), SEQ(2, 2, 5, 1, 5, 25)}};

typedef struct opt_case {
    int causal;
    int64_t wl, wr;
    double softcap;
    int alibi;
} opt_case;

static const opt_case OPTS[] = {
    {0, -1, -1, 0.0, 0},
    {1, -1, -1, 0.0, 0},
    {0, 3, 2, 20.0, 1},
    {1, 4, -1, 0.0, 1},
};

typedef struct geo_data {
    tu_tensor q, k, v, dout, slopes;
} geo_data;

static geo_data make_data(const geo_case *c, uint64_t *rng)
{
    geo_data g;
    g.q = tu_alloc4(FA_F32, c->qb, c->qs, c->H, c->d, 0);
    g.k = tu_alloc4(FA_F32, c->kb, c->ks, c->Hk, c->d, 0);
    g.v = tu_alloc4(FA_F32, c->kb, c->ks, c->Hk, c->dv, 0);
    g.dout = tu_alloc4(FA_F32, c->qb, c->qs, c->H, c->dv, 0);
    const int64_t sh[1] = {c->H};
    g.slopes = tu_alloc(FA_F32, 1, sh);
    tu_fill(&g.q, rng, -2.0, 2.0);
    tu_fill(&g.k, rng, -2.0, 2.0);
    tu_fill(&g.v, rng, -1.0, 1.0);
    tu_fill(&g.dout, rng, -1.0, 1.0);
    tu_fill(&g.slopes, rng, 0.05, 0.5);
    return g;
}

static void free_data(geo_data *g)
{
    tu_free(&g->q); tu_free(&g->k); tu_free(&g->v); tu_free(&g->dout); tu_free(&g->slopes);
}

static fa_options make_opt(const opt_case *oc, const geo_data *g, fa_impl impl)
{
    fa_options opt = fa_options_default();
    opt.causal = oc->causal;
    opt.window_left = oc->wl;
    opt.window_right = oc->wr;
    opt.softcap = oc->softcap;
    opt.alibi_slopes = oc->alibi ? &g->slopes.t : NULL;
    opt.impl = impl;
    opt.block_q = 4; /* small blocks: several blocks and ragged tails per sequence */
    opt.block_k = 8;
    opt.num_threads = 2;
    return opt;
}

/* The problem of case c with its geometry filled in (the internal API). */
static void resolve_geo(fa_purpose purpose, const geo_case *c, const geo_data *g, const fa_tensor *o,
                        const fa_tensor *lse, const fa_options *opt, fa_problem *p)
{
    fa_status st = fa_resolve(purpose, &g->q.t, &g->k.t, &g->v.t, o, lse, opt, NULL, p);
    if (st != FA_OK) fail_msg("%s: fa_resolve: %s", c->name, fa_last_error());
    p->seq = c->seq;
    p->batch = c->nseq;
    p->seqlen_q = p->seqlen_k = 0;
    for (int b = 0; b < c->nseq; b++) {
        if (c->seq[b].q_len > p->seqlen_q) p->seqlen_q = c->seq[b].q_len;
        if (c->seq[b].k_len > p->seqlen_k) p->seqlen_k = c->seq[b].k_len;
    }
}

static void expect_same_bytes(const tu_tensor *a, const tu_tensor *b, const char *what, const char *cname,
                              fa_impl impl, int oi)
{
    if (a->bytes != b->bytes || memcmp(a->mem, b->mem, a->bytes) != 0) {
        int64_t where = -1;
        const double e = tu_max_abs_diff(a, b, &where);
        fail_msg("%s, %s, options %d: %s differs from the per-sequence run (max diff %g at flat %lld)",
                 cname, fa_impl_name(impl), oi, what, e, (long long)where);
    }
}

/*
 * A plain dense float64 model of one sequence's row i, head h: every key of
 * the sequence, the mask written from docs/semantics.md directly (bottom-right
 * aligned with the sequence's own lengths), no library code.
 */
static void dense_row(const geo_data *g, const geo_case *c, const fa_seq *s, const opt_case *oc, int64_t i,
                      int64_t h, double scale, double *out, double *lse)
{
    const int64_t hk = h / (c->H / c->Hk), off = s->k_len - s->q_len;
    double m = -INFINITY, l = 0.0;
    double *sc = calloc((size_t)s->k_len + 1, sizeof(double));
    int *vis = calloc((size_t)s->k_len + 1, sizeof(int));
    for (int64_t j = 0; j < s->k_len; j++) {
        const int64_t right = oc->causal ? 0 : oc->wr;
        vis[j] = !(oc->wl >= 0 && j < i + off - oc->wl) && !(right >= 0 && j > i + off + right);
        if (!vis[j]) continue;
        double dot = 0.0;
        for (int64_t x = 0; x < c->d; x++) {
            const int64_t qi[4] = {s->q_batch, s->q_start + i, h, x}, ki[4] = {s->k_batch, s->k_start + j, hk, x};
            dot += tu_get(&g->q, qi) * tu_get(&g->k, ki);
        }
        double t = scale * dot;
        if (oc->softcap > 0.0) t = oc->softcap * tanh(t / oc->softcap);
        if (oc->alibi) {
            const int64_t hi[1] = {h};
            t -= tu_get(&g->slopes, hi) * fabs((double)(i + off - j));
        }
        sc[j] = t;
        if (t > m) m = t;
    }
    for (int64_t x = 0; x < c->dv; x++) out[x] = 0.0;
    for (int64_t j = 0; j < s->k_len; j++) {
        if (!vis[j]) continue;
        const double e = exp(sc[j] - m);
        l += e;
        for (int64_t x = 0; x < c->dv; x++) {
            const int64_t vi[4] = {s->k_batch, s->k_start + j, hk, x};
            out[x] += e * tu_get(&g->v, vi);
        }
    }
    for (int64_t x = 0; x < c->dv; x++) out[x] = l > 0.0 ? out[x] / l : 0.0;
    *lse = l > 0.0 ? m + log(l) : -INFINITY;
    free(sc);
    free(vis);
}

/* One forward run of every implementation on case c, every option set. */
static void forward_case(const geo_case *c)
{
    uint64_t rng = tu_seed() ^ 0x9e0;
    geo_data g = make_data(c, &rng);
    const int64_t lsh[3] = {c->qb, c->H, c->qs};
    for (size_t oi = 0; oi < sizeof OPTS / sizeof OPTS[0]; oi++) {
        for (int impl = 0; impl < FA_IMPL_COUNT; impl++) {
            const fa_options opt = make_opt(&OPTS[oi], &g, (fa_impl)impl);
            tu_tensor o = tu_alloc4(FA_F32, c->qb, c->qs, c->H, c->dv, 0), lse = tu_alloc(FA_F32, 3, lsh);
            tu_tensor o2 = tu_alloc4(FA_F32, c->qb, c->qs, c->H, c->dv, 0), lse2 = tu_alloc(FA_F32, 3, lsh);
            tu_poison(&o); tu_poison(&lse); tu_poison(&o2); tu_poison(&lse2);

            fa_problem p;
            resolve_geo(FA_PURPOSE_FORWARD, c, &g, &o.t, &lse.t, &opt, &p);
            fa_status st = impl == FA_IMPL_FLASH ? fa_flash_forward(&p)
                           : impl == FA_IMPL_REFERENCE ? fa_reference_forward(&p) : fa_standard_forward(&p);
            if (st != FA_OK) fail_msg("%s: %s forward: %s", c->name, fa_impl_name((fa_impl)impl), fa_last_error());

            /* each sequence alone, on views of the same memory, through the public API */
            for (int b = 0; b < c->nseq; b++) {
                const fa_seq *s = &c->seq[b];
                fa_tensor qv = view4(&g.q.t, s->q_batch, s->q_start, s->q_len);
                fa_tensor kv = view4(&g.k.t, s->k_batch, s->k_start, s->k_len);
                fa_tensor vv = view4(&g.v.t, s->k_batch, s->k_start, s->k_len);
                fa_tensor ov = view4(&o2.t, s->q_batch, s->q_start, s->q_len);
                fa_tensor lv = view_lse(&lse2.t, s->q_batch, s->q_start, s->q_len);
                if (fa_forward(&qv, &kv, &vv, &ov, &lv, &opt) != FA_OK)
                    fail_msg("%s seq %d: %s", c->name, b, fa_last_error());
                if (impl == FA_IMPL_FLASH && s->q_len > 0) { /* the float64 reference agrees */
                    fa_check_options co = fa_check_options_default();
                    fa_check_report r = fa_check_report_init();
                    if (fa_check(&qv, &kv, &vv, &ov, &lv, &opt, &co, &r) != FA_OK)
                        fail_msg("%s seq %d: fa_check: %s", c->name, b, fa_last_error());
                    if (!r.pass) fail_msg("%s seq %d, options %zu: flash fails fa_check (max err %g, bound %g)",
                                          c->name, b, oi, r.max_abs_err, r.bound);
                    fa_check_report_free(&r);
                }
                if (impl == FA_IMPL_REFERENCE) { /* the reference agrees with a plain dense model */
                    double out[64], l;
                    for (int64_t i = 0; i < s->q_len; i++)
                        for (int64_t h = 0; h < c->H; h++) {
                            dense_row(&g, c, s, &OPTS[oi], i, h, p.scale, out, &l);
                            for (int64_t x = 0; x < c->dv; x++) {
                                const int64_t idx[4] = {s->q_batch, s->q_start + i, h, x};
                                const double got = tu_get(&o, idx);
                                if (!(fabs(got - out[x]) <= 3e-7 * (1.0 + fabs(out[x]))))
                                    fail_msg("%s seq %d row %lld head %lld: reference O %.9g, dense model %.9g",
                                             c->name, b, (long long)i, (long long)h, got, out[x]);
                            }
                            const int64_t li[3] = {s->q_batch, h, s->q_start + i};
                            const double gl = tu_get(&lse, li);
                            if (!(gl == l || fabs(gl - l) <= 3e-7 * (1.0 + fabs(l))))
                                fail_msg("%s seq %d row %lld head %lld: reference LSE %.9g, dense model %.9g",
                                         c->name, b, (long long)i, (long long)h, gl, l);
                        }
                }
            }
            expect_same_bytes(&o, &o2, "O", c->name, (fa_impl)impl, (int)oi);
            expect_same_bytes(&lse, &lse2, "LSE", c->name, (fa_impl)impl, (int)oi);
            tu_free(&o); tu_free(&lse); tu_free(&o2); tu_free(&lse2);
        }
    }
    free_data(&g);
}

/* One backward run of flash and reference on case c, every option set. */
static void backward_case(const geo_case *c)
{
    uint64_t rng = tu_seed() ^ 0xb4c;
    geo_data g = make_data(c, &rng);
    const int64_t lsh[3] = {c->qb, c->H, c->qs};
    for (size_t oi = 0; oi < sizeof OPTS / sizeof OPTS[0]; oi++) {
        for (int impl = 0; impl < 2; impl++) { /* flash, reference */
            fa_options opt = make_opt(&OPTS[oi], &g, (fa_impl)impl);
            tu_tensor o = tu_alloc4(FA_F32, c->qb, c->qs, c->H, c->dv, 0), lse = tu_alloc(FA_F32, 3, lsh);
            tu_fill(&o, &rng, -1.0, 1.0); /* rows no sequence owns hold values, never read */
            tu_fill(&lse, &rng, -1.0, 1.0);
            fa_problem p;
            resolve_geo(FA_PURPOSE_FORWARD, c, &g, &o.t, &lse.t, &opt, &p);
            if ((impl == FA_IMPL_FLASH ? fa_flash_forward(&p) : fa_reference_forward(&p)) != FA_OK)
                fail_msg("%s: forward: %s", c->name, fa_last_error());

            tu_tensor dq[2], dk[2], dv[2];
            for (int x = 0; x < 2; x++) {
                dq[x] = tu_alloc4(FA_F32, c->qb, c->qs, c->H, c->d, 0);
                dk[x] = tu_alloc4(FA_F32, c->kb, c->ks, c->Hk, c->d, 0);
                dv[x] = tu_alloc4(FA_F32, c->kb, c->ks, c->Hk, c->dv, 0);
                tu_poison(&dq[x]); tu_poison(&dk[x]); tu_poison(&dv[x]);
            }
            resolve_geo(FA_PURPOSE_BACKWARD, c, &g, &o.t, &lse.t, &opt, &p);
            fa_status st = impl == FA_IMPL_FLASH
                               ? fa_flash_backward(&p, &g.dout.t, &dq[0].t, &dk[0].t, &dv[0].t)
                               : fa_reference_backward(&p, &g.dout.t, &dq[0].t, &dk[0].t, &dv[0].t);
            if (st != FA_OK) fail_msg("%s: backward: %s", c->name, fa_last_error());
            for (int b = 0; b < c->nseq; b++) {
                const fa_seq *s = &c->seq[b];
                fa_tensor qv = view4(&g.q.t, s->q_batch, s->q_start, s->q_len);
                fa_tensor kv = view4(&g.k.t, s->k_batch, s->k_start, s->k_len);
                fa_tensor vv = view4(&g.v.t, s->k_batch, s->k_start, s->k_len);
                fa_tensor ov = view4(&o.t, s->q_batch, s->q_start, s->q_len);
                fa_tensor lv = view_lse(&lse.t, s->q_batch, s->q_start, s->q_len);
                fa_tensor dov = view4(&g.dout.t, s->q_batch, s->q_start, s->q_len);
                fa_tensor dqv = view4(&dq[1].t, s->q_batch, s->q_start, s->q_len);
                fa_tensor dkv = view4(&dk[1].t, s->k_batch, s->k_start, s->k_len);
                fa_tensor dvv = view4(&dv[1].t, s->k_batch, s->k_start, s->k_len);
                if (fa_backward(&qv, &kv, &vv, &ov, &lv, &dov, &dqv, &dkv, &dvv, &opt) != FA_OK)
                    fail_msg("%s seq %d: backward: %s", c->name, b, fa_last_error());
            }
            expect_same_bytes(&dq[0], &dq[1], "dQ", c->name, (fa_impl)impl, (int)oi);
            expect_same_bytes(&dk[0], &dk[1], "dK", c->name, (fa_impl)impl, (int)oi);
            expect_same_bytes(&dv[0], &dv[1], "dV", c->name, (fa_impl)impl, (int)oi);
            for (int x = 0; x < 2; x++) { tu_free(&dq[x]); tu_free(&dk[x]); tu_free(&dv[x]); }
            tu_free(&o); tu_free(&lse);
        }
    }
    free_data(&g);
}

/* Ensure every forward implementation gives each packed sequence (varlen layout) the bits it gets alone. */
static void test_forward_geometry_matches_each_sequence_alone_when_packed(void **state)
{
    (void)state;
    forward_case(&VARLEN);
}

/* Ensure the same when keys sit at other tensor batches and row offsets (KV cache layout). */
static void test_forward_geometry_matches_each_sequence_alone_when_cached(void **state)
{
    (void)state;
    forward_case(&CACHE);
}

/* Ensure backward (flash, reference) writes each sequence's dQ/dK/dV as the sequence alone does. */
static void test_backward_geometry_matches_each_sequence_alone(void **state)
{
    (void)state;
    backward_case(&VARLEN);
    backward_case(&CACHE);
}

/* Ensure rows owned by no sequence stay untouched (poison survives) and owned rows are written. */
static void test_geometry_writes_exactly_the_rows_it_owns(void **state)
{
    (void)state;
    uint64_t rng = tu_seed() ^ 0x70;
    const geo_case *c = &VARLEN;
    geo_data g = make_data(c, &rng);
    const int64_t lsh[3] = {c->qb, c->H, c->qs};
    const fa_options opt = make_opt(&OPTS[1], &g, FA_IMPL_FLASH);
    tu_tensor o = tu_alloc4(FA_F32, c->qb, c->qs, c->H, c->dv, 0), lse = tu_alloc(FA_F32, 3, lsh);
    tu_poison(&o);
    tu_poison(&lse);
    fa_problem p;
    resolve_geo(FA_PURPOSE_FORWARD, c, &g, &o.t, &lse.t, &opt, &p);
    assert_int_equal(fa_flash_forward(&p), FA_OK);
    int64_t owned = 0;
    for (int b = 0; b < c->nseq; b++) owned += c->seq[b].q_len;
    /* rows 0..owned-1 are owned (the sequences tile them), the rest are not */
    for (int64_t i = 0; i < c->qs; i++)
        for (int64_t h = 0; h < c->H; h++) {
            const int64_t idx[4] = {0, i, h, 0};
            const double x = tu_get(&o, idx);
            if (i < owned) assert_false(isnan(x));
            else assert_true(isnan(x));
        }
    tu_free(&o);
    tu_free(&lse);
    free_data(&g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forward_geometry_matches_each_sequence_alone_when_packed),
        cmocka_unit_test(test_forward_geometry_matches_each_sequence_alone_when_cached),
        cmocka_unit_test(test_backward_geometry_matches_each_sequence_alone),
        cmocka_unit_test(test_geometry_writes_exactly_the_rows_it_owns),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
