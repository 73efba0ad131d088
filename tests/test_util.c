/* test_util.c — see test_util.h. */
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"

uint64_t tu_seed(void)
{
    static uint64_t seed;
    static int have;
    if (!have) {
        const char *env = getenv("FA_TEST_SEED");
        if (env && *env) {
            seed = strtoull(env, NULL, 0);
        } else {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            seed = (uint64_t)ts.tv_sec * 1000003u ^ (uint64_t)ts.tv_nsec;
        }
        have = 1;
        fprintf(stderr, "[ seed     ] FA_TEST_SEED=%llu\n", (unsigned long long)seed);
    }
    return seed;
}

uint64_t tu_next(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

double tu_uniform(uint64_t *state, double lo, double hi)
{
    return lo + (hi - lo) * ((double)(tu_next(state) >> 11) * 0x1.0p-53);
}

static tu_tensor tu_make(fa_dtype dtype, int rank, const int64_t *shape, const int64_t *stride,
                         int64_t numel)
{
    tu_tensor r;
    memset(&r, 0, sizeof r);
    r.bytes = (size_t)(numel > 0 ? numel : 1) * fa_dtype_size(dtype);
    r.mem = malloc(r.bytes);
    assert_non_null(r.mem);
    assert_int_equal(fa_tensor_make(&r.t, r.mem, dtype, rank, shape, stride), FA_OK);
    return r;
}

tu_tensor tu_alloc4(fa_dtype dtype, int64_t d0, int64_t d1, int64_t d2, int64_t d3, int bhsd)
{
    int64_t shape[4] = {d0, d1, d2, d3};
    int64_t stride[4];
    if (bhsd) { /* memory [d0][d2][d1][d3] */
        stride[3] = 1;
        stride[1] = d3;
        stride[2] = d1 * d3;
        stride[0] = d2 * d1 * d3;
    } else {
        stride[3] = 1;
        stride[2] = d3;
        stride[1] = d2 * d3;
        stride[0] = d1 * d2 * d3;
    }
    return tu_make(dtype, 4, shape, stride, d0 * d1 * d2 * d3);
}

tu_tensor tu_alloc(fa_dtype dtype, int rank, const int64_t *shape)
{
    int64_t n = 1;
    for (int i = 0; i < rank; i++) n *= shape[i];
    return tu_make(dtype, rank, shape, NULL, n);
}

void tu_free(tu_tensor *t)
{
    free(t->mem);
    memset(t, 0, sizeof *t);
}

/* Visit every logical element: calls f(t, flat, offset, ctx). */
typedef void (*tu_visit_fn)(tu_tensor *t, int64_t flat, int64_t off, void *ctx);
static void tu_visit(tu_tensor *t, tu_visit_fn f, void *ctx)
{
    int64_t idx[FA_MAX_RANK] = {0};
    int64_t n = fa_tensor_numel(&t->t);
    for (int64_t flat = 0; flat < n; flat++) {
        int64_t off = 0;
        for (int r = 0; r < t->t.rank; r++) off += idx[r] * t->t.stride[r];
        f(t, flat, off, ctx);
        for (int r = t->t.rank - 1; r >= 0; r--) {
            if (++idx[r] < t->t.shape[r]) break;
            idx[r] = 0;
        }
    }
}

typedef struct { uint64_t *state; double lo, hi; } fill_ctx;
static void fill_one(tu_tensor *t, int64_t flat, int64_t off, void *vctx)
{
    fill_ctx *c = vctx;
    (void)flat;
    fa_store_f64(&t->t, off, tu_uniform(c->state, c->lo, c->hi));
}

void tu_fill(tu_tensor *t, uint64_t *state, double lo, double hi)
{
    fill_ctx c = {state, lo, hi};
    tu_visit(t, fill_one, &c);
}

void tu_poison(tu_tensor *t)
{
    /* 0xFF bytes are NaN in every floating format we support */
    memset(t->mem, 0xff, t->bytes);
}

double tu_get(const tu_tensor *t, const int64_t *idx)
{
    int64_t off = 0;
    for (int r = 0; r < t->t.rank; r++) off += idx[r] * t->t.stride[r];
    return fa_load_f64(&t->t, off);
}

static void count_nan_one(tu_tensor *t, int64_t flat, int64_t off, void *ctx)
{
    (void)flat;
    if (isnan(fa_load_f64(&t->t, off))) (*(int64_t *)ctx)++;
}

int64_t tu_count_nan(const tu_tensor *t)
{
    int64_t n = 0;
    tu_visit((tu_tensor *)t, count_nan_one, &n);
    return n;
}

typedef struct { const tu_tensor *b; double worst; int64_t where; int64_t flat_b_idx; } diff_ctx;
static void diff_one(tu_tensor *a, int64_t flat, int64_t off, void *vctx)
{
    diff_ctx *c = vctx;
    /* recover logical index from flat for b */
    int64_t rem = flat, offb = 0;
    for (int r = c->b->t.rank - 1; r >= 0; r--) {
        int64_t i = rem % c->b->t.shape[r];
        rem /= c->b->t.shape[r];
        offb += i * c->b->t.stride[r];
    }
    double x = fa_load_f64(&a->t, off), y = fa_load_f64(&c->b->t, offb);
    double e;
    if (isnan(x) || isnan(y)) e = INFINITY;
    else if (isinf(x) || isinf(y)) e = (x == y) ? 0.0 : INFINITY;
    else e = fabs(x - y);
    if (e > c->worst || (c->where < 0)) {
        if (e > c->worst) c->worst = e;
        if (c->where < 0 || e >= c->worst) c->where = flat;
    }
}

double tu_max_abs_diff(const tu_tensor *a, const tu_tensor *b, int64_t *where)
{
    assert_int_equal(a->t.rank, b->t.rank);
    for (int r = 0; r < a->t.rank; r++) assert_int_equal(a->t.shape[r], b->t.shape[r]);
    diff_ctx c = {b, 0.0, -1, 0};
    tu_visit((tu_tensor *)a, diff_one, &c);
    if (where) *where = c.where;
    return c.worst;
}

void tu_backward(const tu_tensor *q, const tu_tensor *k, const tu_tensor *v, const tu_tensor *dout,
                 const fa_options *opt, tu_grads *gr)
{
    gr->dq = tu_alloc(FA_F64, q->t.rank, q->t.shape);
    gr->dk = tu_alloc(FA_F64, k->t.rank, k->t.shape);
    gr->dv = tu_alloc(FA_F64, v->t.rank, v->t.shape);
    const int64_t heads[1] = {q->t.shape[2]};
    gr->dsinks = tu_alloc(FA_F64, 1, heads);
    tu_poison(&gr->dq);
    tu_poison(&gr->dk);
    tu_poison(&gr->dv);
    tu_poison(&gr->dsinks);
    fa_backward_extra ex;
    fa_backward_extra_init(&ex, sizeof ex);
    ex.dsinks = opt->sinks ? &gr->dsinks.t : NULL;
    if (fa_backward_ex(&q->t, &k->t, &v->t, NULL, NULL, &dout->t, &gr->dq.t, &gr->dk.t, &gr->dv.t, opt, &ex) != FA_OK)
        fail_msg("backward (%s): %s", fa_impl_name(opt->impl), fa_last_error());
}

/* max |x| of a float64 tensor allocated by tu_alloc (contiguous) */
static double max_abs_f64(const tu_tensor *t)
{
    const int64_t n = fa_tensor_numel(&t->t);
    double m = 0.0;
    for (int64_t x = 0; x < n; x++) m = fmax(m, fabs(((const double *)t->mem)[x]));
    return m;
}

void tu_expect_emulated(const tu_tensor *q, const tu_tensor *k, const tu_tensor *v, const tu_tensor *dout,
                        const fa_options *opt, fa_dtype dt, const tu_grads *ref, const tu_grads *off, double rel,
                        const char *what)
{
    tu_tensor g[3] = {tu_alloc(FA_F64, q->t.rank, q->t.shape), tu_alloc(FA_F64, k->t.rank, k->t.shape),
                      tu_alloc(FA_F64, v->t.rank, v->t.shape)};
    for (int x = 0; x < 3; x++) tu_poison(&g[x]);
    const int64_t heads[1] = {q->t.shape[2]};
    tu_tensor gs = tu_alloc(FA_F64, 1, heads);
    tu_poison(&gs);
    fa_backward_extra ex;
    fa_backward_extra_init(&ex, sizeof ex);
    ex.emulate_dtype = dt;
    ex.dsinks = opt->sinks ? &gs.t : NULL;
    if (fa_backward_ex(&q->t, &k->t, &v->t, NULL, NULL, &dout->t, &g[0].t, &g[1].t, &g[2].t, opt, &ex) != FA_OK)
        fail_msg("%s: emulated %s backward: %s", what, fa_dtype_name(dt), fa_last_error());
    if (opt->sinks) { /* the sinks' gradient: within the noise too (ref->dsinks is the reference's) */
        int64_t where = -1;
        const double mx = max_abs_f64(&ref->dsinks), e = tu_max_abs_diff(&gs, &ref->dsinks, &where) / mx;
        if (!(mx > 0.0) || !(e > 0.0) || !(e <= rel))
            fail_msg("%s: emulated %s dsinks: error %.3g of max|ref| %.3g (at %lld): want 0 < error <= %.3g", what,
                     fa_dtype_name(dt), e, mx, (long long)where, rel);
    }
    tu_free(&gs);
    const tu_tensor *r[3] = {&ref->dq, &ref->dk, &ref->dv}, *o[3] = {&off->dq, &off->dk, &off->dv};
    static const char *const name[3] = {"dq", "dk", "dv"};
    for (int x = 0; x < 3; x++) {
        int64_t where = -1, w2 = -1;
        const double mx = max_abs_f64(r[x]);
        const double e = tu_max_abs_diff(&g[x], r[x], &where) / mx, eo = tu_max_abs_diff(o[x], r[x], &w2) / mx;
        if (!(mx > 0.0) || !(e > 0.0) || !(e <= rel) || !(e < 0.5 * eo))
            fail_msg("%s: emulated %s %s: error %.3g of max|ref| %.3g (at %lld): want 0 < error <= %.3g and "
                     "< half the %.3g the reference without the feature is off",
                     what, fa_dtype_name(dt), name[x], e, mx, (long long)where, rel, eo);
    }
    for (int x = 0; x < 3; x++) tu_free(&g[x]);
}

void tu_expect_emulated_feature(const tu_tensor *q, const tu_tensor *k, const tu_tensor *v, const tu_tensor *dout,
                                const fa_options *with, const fa_options *without, const char *what)
{
    tu_grads r, off;
    tu_backward(q, k, v, dout, with, &r);
    tu_backward(q, k, v, dout, without, &off);
    tu_expect_emulated(q, k, v, dout, with, FA_BF16, &r, &off, 0x1p-4, what);
    tu_expect_emulated(q, k, v, dout, with, FA_F16, &r, &off, 0x1p-7, what);
    tu_free_grads(&r);
    tu_free_grads(&off);
}

void tu_free_grads(tu_grads *gr)
{
    tu_free(&gr->dq);
    tu_free(&gr->dk);
    tu_free(&gr->dv);
    tu_free(&gr->dsinks);
}

void tu_expect_fd(tu_loss_fn loss, const void *ctx, const fa_options *opt, tu_tensor *x,
                  const tu_tensor *grad, const char *what)
{
    const int64_t n = fa_tensor_numel(&x->t);
    double *p = (double *)x->mem;
    for (int64_t e = 0; e < n; e++) {
        const double keep = p[e], hstep = 1e-5;
        p[e] = keep + hstep;
        const double lp = loss(ctx, opt);
        p[e] = keep - hstep;
        const double lm = loss(ctx, opt);
        p[e] = keep;
        const double fd = (lp - lm) / (2 * hstep), got = ((const double *)grad->mem)[e];
        if (!(fabs(fd - got) <= 1e-7 + 1e-6 * fabs(fd)))
            fail_msg("%s[%lld]: backward %.12g, finite difference %.12g", what, (long long)e, got, fd);
    }
}

void tu_expect_close(const tu_tensor *a, const tu_tensor *ref, double rtol, const char *what)
{
    int64_t where;
    double mx = 0.0;
    const int64_t n = fa_tensor_numel(&ref->t);
    for (int64_t e = 0; e < n; e++) mx = fmax(mx, fabs(((const double *)ref->mem)[e]));
    const double err = tu_max_abs_diff(a, ref, &where);
    if (!(err <= rtol * (mx > 1.0 ? mx : 1.0)))
        fail_msg("%s: max error %g at %lld (max|ref| %g)", what, err, (long long)where, mx);
}
