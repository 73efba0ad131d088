/*
 * cmd_mpi_check.c — flashattn-mpi check: a tested output (say, a GPU kernel's
 * on a sequence too long to validate on one machine) against the float64
 * reference computed over the ring (--impl reference, distributed).
 *
 * The rule: with --atol/--rtol, |test - ref| <= atol + rtol |ref| everywhere.
 * Otherwise FlashAttention's form, 2 x a baseline's max error plus an absolute
 * floor a * max|ref| (a = 2^-9 bf16, 2^-12 f16, 2^-18 f32), where the baseline
 * is the float32 ring's output rounded to the tested dtype — for bf16/f16, on
 * the inputs rounded to that dtype, as a kernel of that precision sees them.
 * For bf16/f16 the rest of flashattn check's emulation rule comes too
 * (validate.c, docs/validation.md "The row rule"), with P's rounding — which
 * the float32 baseline does not do — added to the baseline's error (in
 * quadrature for rows) rather than taken as the larger (flashattn check's
 * emulation rounds P, so there the two are one draw): each element may pass up to |its baseline error| +
 * 3u sqrt(sum_j P_j^2 v_jc^2) + ulp(ref_c), and each row's L2 error must be within
 * sqrt((K x the baseline's on that row)^2 + 9u^2 sum_j P_j^2 |v_j|^2) + a |ref row|
 * (K = 2 sqrt(max(1, 64/d_v))), so that a long row that lost keys cannot hide
 * under a bound the short rows set. sum_j P_j^2 v_jc^2 comes from a
 * second float64 ring pass: attention with every score doubled (scale and
 * softcap x2) over V^2 gives exp(LSE2 - 2 LSE) O2 = it, exactly.
 * NaN or Inf in the tested output always fails.
 */
#include "cli_mpi.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Round x to p significant bits, exponent >= emin, overflow beyond maxv to inf (round to nearest even). */
static double round_sig(double x, int p, int emin, double maxv)
{
    if (!isfinite(x) || x == 0) return x;
    int e;
    frexp(x, &e);
    int ee = e - 1 < emin ? emin : e - 1;
    const double ulp = ldexp(1.0, ee - (p - 1));
    const double r = nearbyint(x / ulp) * ulp;
    return fabs(r) > maxv ? copysign(INFINITY, x) : r;
}

static double round_to(double x, fa_dtype dt)
{
    switch (dt) {
    case FA_BF16: return round_sig(x, 8, -126, 3.3895313892515355e38);
    case FA_F16: return round_sig(x, 11, -14, 65504.0);
    case FA_F32: return (double)(float)x;
    default: return x;
    }
}

static int dtype_rank(fa_dtype d) { return d == FA_BF16 ? 0 : d == FA_F16 ? 1 : d == FA_F32 ? 2 : 3; }

static const char check_usage[] =
    "usage: mpirun -np P flashattn-mpi check -q Q.npy -k K.npy -v V.npy --out O_TEST.npy [--lse LSE_TEST.npy]\n"
    "                     [MASK OPTIONS] [--dtype f32|f16|bf16] [--atol A --rtol R] [--threads T]\n"
    "                     [--layout contiguous|zigzag|auto] [--stats]\n"
    "\n"
    "flashattn check with the float64 reference computed over the ranks (the sequence split as\n"
    "in flashattn-mpi run --impl reference): each rank judges its rows, rank 0 reports.\n"
    "\n"
    "  --out O_TEST.npy   the output to check [batch, seqlen_q, heads, d_v] (-o is a synonym)\n"
    "  --lse LSE.npy      also check a log-sum-exp [batch, heads, seqlen_q] (f32/f64)\n"
    "  --dtype T          precision the tested kernel ran in (default: the lowest among the files)\n"
    "  --atol A --rtol R  the rule |test - ref| <= A + R*|ref| (either one given; the other is 0)\n"
    "\n"
    "Default rule: max|test - ref| <= 2 x the max error of a baseline + a * max|ref| (a = 2^-9\n"
    "bf16, 2^-12 f16, 2^-18 f32); the baseline is the float32 ring's output rounded to the dtype\n"
    "(bf16/f16: on the inputs rounded to it). For bf16/f16 also, as in flashattn check, P's\n"
    "rounding (which that baseline does not do) is allowed for: an element may pass up to its\n"
    "baseline error + 3u sqrt(sum_j P_j^2 v_jc^2) + ulp(ref), and each row's L2 error must be\n"
    "within sqrt((K x the baseline's on that row)^2 + 9u^2 sum_j P_j^2 |v_j|^2) + a |ref row| (the\n"
    "row rule, K = 2 sqrt(max(1, 64/d_v))); the sums come from a second float64 pass over the ring.\n"
    "(flashattn check's baseline rounds P itself and has an allowance for the scores' rounding.)\n"
    "Not here: --sample-rows, --seed, --diagnose, --qkv-format, --kernel-model.\n"
    "\n%s\n%s\n%s"
    "Exit status: 0 within tolerance; 1 mismatch; 2 bad usage or bad input (every rank).\n";

int mpi_cmd_check(int argc, char **argv) { return mpi_check_main(argc, argv, check_usage); }

/* The dtype's unit roundoff (2^-8 bf16, 2^-11 f16, 2^-24 f32), as validate.c's. */
static double unit_roundoff(fa_dtype dt) { return dt == FA_BF16 ? 0x1p-8 : dt == FA_F16 ? 0x1p-11 : 0x1p-24; }

/* The row rule's factor for rows of dv elements (validate.c's fa_check_row_k). */
static double row_k(int64_t dv) { return dv >= 64 ? 2.0 : 2.0 * sqrt(64.0 / (double)(dv > 0 ? dv : 1)); }

int mpi_check_emulable(const fa_npy *a, const char *path, fa_dtype dt)
{
    const int64_t *sh = a->shape;
    for (int64_t x = 0; x < a->numel; x++) {
        const double v = cli_element(a->data, a->dtype, x);
        if (isfinite(round_to((double)(float)v, dt))) continue;
        const int64_t e = x % sh[3], c = x / sh[3] % sh[2], b = x / (sh[3] * sh[2]) % sh[1], w = x / (sh[3] * sh[2] * sh[1]);
        return cli_die("%s: element [%lld,%lld,%lld,%lld] = %g overflows %s (largest finite %s): the %s baseline of the "
                       "default rule would be inf/NaN; check with --atol/--rtol or a wider --dtype",
                       path, (long long)w, (long long)b, (long long)c, (long long)e, v, fa_dtype_name(dt),
                       dt == FA_F16 ? "65504" : dt == FA_BF16 ? "3.39e38" : "3.40e38", fa_dtype_name(dt));
    }
    return 0;
}

/* One unit in the last place of x in dt (bf16 / f16: 2^(exponent - 7 or - 10), at least the
 * subnormal step). */
static double ulp_in(double x, fa_dtype dt)
{
    const int p = dt == FA_BF16 ? 8 : 11, emin = dt == FA_BF16 ? -126 : -14;
    int e = emin + 1;
    if (x != 0.0 && isfinite(x)) frexp(x, &e);
    return ldexp(1.0, (e - 1 < emin ? emin : e - 1) - (p - 1));
}

int mpi_check_round_input(const fa_tensor *in, fa_dtype dt, float **buf, fa_tensor *out)
{
    *buf = NULL;
    *out = *in;
    if (in->dtype == dt) return 0;
    const int64_t n = fa_tensor_numel(in);
    float *x = malloc((size_t)n * sizeof(float) + 1);
    if (!x) return -1;
    for (int64_t i = 0; i < n; i++) x[i] = (float)round_to(cli_element(in->data, in->dtype, i), dt);
    fa_tensor_make(out, x, FA_F32, in->rank, in->shape, NULL);
    *buf = x;
    return 0;
}

int mpi_check_p2(fa_ring_layout layout, const fa_tensor *q, const fa_tensor *k, const fa_tensor *v,
                 const fa_options *ref_opt, const double *ref_lse, double *pv2, fa_ring_stats *stats)
{
    const int64_t B = q->shape[0], cq = q->shape[1], H = q->shape[2], d = q->shape[3], dv = v->shape[3];
    const int64_t nv = fa_tensor_numel(v), n_l = B * H * cq;
    fa_options o = *ref_opt;
    /* exact only for what the ring accepts: ALiBi's slopes and a sink's logit would have to be
     * doubled too (the ring refuses both today) */
    o.scale = 2.0 * (o.scale != 0.0 ? o.scale : 1.0 / sqrt((double)d)); /* every score doubled, exactly */
    o.softcap = 2.0 * o.softcap; /* 2c tanh(2 s / 2c) = 2 (c tanh(s / c)) */
    double *v2 = malloc((size_t)nv * sizeof(double) + 1), *l2 = malloc((size_t)n_l * sizeof(double) + 1);
    fa_status st = FA_ERR_NOMEM;
    int ok = v2 && l2, all_ok;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (all_ok) {
        for (int64_t i = 0; i < nv; i++) {
            const double x = cli_element(v->data, v->dtype, i);
            v2[i] = x * x;
        }
        fa_tensor v2t, o2t, l2t;
        const int64_t os[4] = {B, cq, H, dv}, ls[3] = {B, H, cq};
        fa_tensor_make(&v2t, v2, FA_F64, 4, v->shape, NULL);
        fa_tensor_make(&o2t, pv2, FA_F64, 4, os, NULL);
        fa_tensor_make(&l2t, l2, FA_F64, 3, ls, NULL);
        st = fa_ring_forward(MPI_COMM_WORLD, layout, q, k, &v2t, &o2t, &l2t, &o, stats);
    }
    int rc = 0;
    if (!all_ok)
        rc = mpi_rank == 0 ? cli_die("check: out of memory for the P^2 pass (V^2 and its LSE) on a rank")
                           : CLI_EXIT_USAGE;
    else if (st != FA_OK)
        rc = mpi_die_ring(st);
    if (st == FA_OK) /* O2 [b][i][h][c] scaled in place by exp(LSE2 - 2 LSE) of its row */
        for (int64_t b = 0; b < B; b++)
            for (int64_t i = 0; i < cq; i++)
                for (int64_t h = 0; h < H; h++) {
                    const int64_t r = (b * H + h) * cq + i;
                    const double w = isfinite(ref_lse[r]) && isfinite(l2[r]) ? exp(l2[r] - 2.0 * ref_lse[r]) : 0.0;
                    double *x = pv2 + ((b * cq + i) * H + h) * dv;
                    for (int64_t c = 0; c < dv; c++) x[c] = w > 0.0 ? w * x[c] : 0.0;
                }
    free(v2);
    free(l2);
    return rc;
}

/* Judging, after the ring: per-rank maxima reduced over the ranks. */
int mpi_check_judge(const mpi_check_in *in)
{
    const fa_tensor *test = in->test, *test_lse = in->test_lse;
    const double *ref = in->ref, *ref_lse = in->ref_lse, *pv2 = in->pv2;
    const float *fl = in->fl, *fl_lse = in->fl_lse;
    const fa_dtype dt = in->dt;
    const int use_tol = in->use_tol;
    const int64_t dv = in->dv, n_o = in->batch * in->cq * in->heads * dv, n_l = in->batch * in->heads * in->cq;
    /* pass 1: maxima */
    double loc[5] = {0, 0, 0, 0, 0}; /* max|ref|, max err baseline, max|lse_ref|, max lse err of flash, n non-finite */
    for (int64_t i = 0; i < n_o; i++) {
        const double r = ref[i], b = round_to(fl[i], dt);
        if (isfinite(r) && fabs(r) > loc[0]) loc[0] = fabs(r);
        const double e = fabs(b - r);
        if (!isfinite(e)) {
            loc[4]++; /* the baseline overflowed (float32 sums near FLT_MAX): no bound from it */
            continue;
        }
        if (e > loc[1]) loc[1] = e;
    }
    for (int64_t i = 0; i < n_l; i++) {
        if (isfinite(ref_lse[i]) && fabs(ref_lse[i]) > loc[2]) loc[2] = fabs(ref_lse[i]);
        const double e = ref_lse[i] == fl_lse[i] ? 0.0 : fabs(ref_lse[i] - fl_lse[i]);
        if (!(e <= loc[3])) loc[3] = e;
    }
    double glob[5];
    MPI_Allreduce(loc, glob, 4, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(loc + 4, glob + 4, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    if (!use_tol && glob[4] > 0) {
        if (mpi_rank == 0)
            cli_die("check: the float32 baseline is not finite at %.0f elements (values near float32's range "
                    "overflow its sums), so the default rule has no bound; check with --atol/--rtol",
                    glob[4]);
        return CLI_EXIT_USAGE;
    }
    const double a = dt == FA_BF16 ? 0x1p-9 : dt == FA_F16 ? 0x1p-12 : 0x1p-18;
    const double bound = use_tol ? in->atol : 2 * glob[1] + a * glob[0];
    const double lse_bound = 2 * glob[3] + 0x1p-18 * glob[2];
    const double u = unit_roundoff(dt), kr = row_k(dv);
    const int rows_on = !use_tol && pv2 != NULL;
    /* pass 2: errors and failures, element by element and row by row */
    double e2[4] = {0, 0, 0, 0}; /* max err, sum err, max lse err, largest allowance over the bound */
    long long f2[3] = {0, 0, 0}; /* failing elements, failing lse rows, rows over the row rule */
    double worst[4] = {-1, -1, -1, -1}; /* the row rule's worst row: ratio, batch, global row, head */
    for (int64_t row = 0; row < n_o / (dv > 0 ? dv : 1); row++) {
        double ee = 0, bb = 0, rr = 0, pp = 0, aa = 0;
        int finite = 1;
        for (int64_t c = 0; c < dv; c++) {
            const int64_t i = row * dv + c;
            const double t = cli_element(in->test->data, test->dtype, i), r = ref[i];
            double e = fabs(t - r);
            if (!isfinite(t)) {
                e = INFINITY;
                finite = 0;
            }
            if (!(e <= e2[0])) e2[0] = e;
            if (isfinite(e)) e2[1] += e;
            double lim = use_tol ? in->atol + in->rtol * fabs(r) : bound;
            const double bse = round_to(fl[i], dt) - r;
            if (rows_on) { /* the baseline's error (shared: the inputs' rounding), P's rounding, O's */
                /* (a V past ~1e154 overflows V^2: no allowance there rather than an infinite one) */
                const double pv = isfinite(pv2[i]) && pv2[i] > 0.0 ? pv2[i] : 0.0;
                /* one ulp of ref, not u |ref|: the kernel and the baseline round values P's rounding
                 * moved apart, so they may land on neighbouring grid points (a review's point) */
                const double al = fabs(bse) + 3.0 * u * sqrt(pv) + ulp_in(r, dt);
                if (al > bound && al > e2[3]) e2[3] = al;
                if (al > lim) lim = al;
                aa += al * al;
                pp += pv;
            }
            if (!(e <= lim)) f2[0]++;
            if (finite) ee += e * e;
            bb += bse * bse;
            rr += r * r;
        }
        if (!rows_on || !finite) continue; /* a non-finite row has failed element by element */
        /* K x the baseline's error (what the kernel shares with it: the inputs' rounding, and a draw of
         * O's) and the P floor, in quadrature: the baseline does not round P, so the kernel's
         * P-rounding error is an independent part beside the shared one (flashattn check, whose
         * emulation rounds P, takes the larger of the two; the larger alone reached 0.92 of the
         * bound on correct models here, the sum 0.64, this 0.63 — docs/distributed.md) */
        double b_row = sqrt(kr * kr * bb + 9.0 * u * u * pp) + a * sqrt(rr);
        if (sqrt(aa) > b_row) b_row = sqrt(aa);
        const double e_row = sqrt(ee), ratio = b_row > 0.0 ? e_row / b_row : (e_row > 0.0 ? INFINITY : 0.0);
        if (ratio > 1.0) f2[2]++;
        if (ratio > worst[0]) { /* row = (b cq + i) H + h */
            const int64_t h = row % in->heads, bi = row / in->heads, i = bi % in->cq, b = bi / in->cq;
            worst[0] = ratio;
            worst[1] = (double)b;
            worst[2] = (double)fa_ring_global_row(in->seqlen_q, mpi_size, mpi_rank, in->layout, i);
            worst[3] = (double)h;
        }
    }
    for (int64_t i = 0; test_lse && i < n_l; i++) {
        const double t = cli_element(test_lse->data, test_lse->dtype, i), r = ref_lse[i];
        double e;
        if (r == -INFINITY) e = isinf(t) ? 0.0 : INFINITY; /* an empty row: -inf (or +inf) */
        else e = isfinite(t) ? fabs(t - r) : INFINITY;
        if (!(e <= e2[2])) e2[2] = e;
        if (!(e <= lse_bound)) f2[1]++;
    }
    double g2[4];
    long long gf[3];
    MPI_Reduce(e2, g2, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    MPI_Reduce(e2 + 1, g2 + 1, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
    MPI_Reduce(e2 + 2, g2 + 2, 2, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    MPI_Reduce(f2, gf, 3, MPI_LONG_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
    double *all_worst = mpi_rank == 0 ? malloc((size_t)mpi_size * 4 * sizeof(double)) : NULL;
    MPI_Gather(worst, 4, MPI_DOUBLE, all_worst, 4, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    int rc = 0;
    if (mpi_rank == 0) {
        const int pass = gf[0] == 0 && gf[1] == 0 && gf[2] == 0;
        if (!pass && gf[0] == 0 && gf[1] == 0)
            printf("check over %d ranks: FAIL (the row rule: %lld rows; no element over the bound)\n", mpi_size, gf[2]);
        else
            printf("check over %d ranks: %s\n", mpi_size, pass ? "PASS" : "FAIL");
        printf("  rule: %s (dtype %s)\n",
               use_tol ? "|test - ref| <= atol + rtol |ref|" : "max|test - ref| <= 2 x baseline + a max|ref|",
               fa_dtype_name(dt));
        if (use_tol)
            printf("  atol %.3e  rtol %.3e\n", in->atol, in->rtol);
        else
            printf("  baseline (float32 ring%s%s, output rounded to %s) max error %.3e; a max|ref| %.3e; bound %.3e\n",
                   dt == FA_BF16 || dt == FA_F16 ? " on inputs rounded to " : "",
                   dt == FA_BF16 || dt == FA_F16 ? fa_dtype_name(dt) : "", fa_dtype_name(dt), glob[1], a * glob[0],
                   bound);
        if (rows_on && g2[3] > 0)
            printf("  rounding allowance: an element may pass above the bound up to its own allowance, its "
                   "baseline error + 3u sqrt(sum_j P_j^2 v_jc^2) + one ulp of ref (largest %.3e)\n",
                   g2[3]);
        printf("  output: max |test - ref| %.3e, mean %.3e over %lld elements (%lld rows); %lld out of tolerance\n",
               g2[0], in->elems_total ? g2[1] / (double)in->elems_total : 0.0, (long long)in->elems_total,
               (long long)in->rows_total, gf[0]);
        if (rows_on) {
            int wr = 0;
            for (int r = 1; all_worst && r < mpi_size; r++)
                if (all_worst[4 * r] > all_worst[4 * wr]) wr = r;
            printf("  row rule: %lld of %lld rows over it (each row's L2 error <= sqrt((%.3g x the baseline's on "
                   "that row)^2 + (3 u)^2 sum_j P_j^2 |v_j|^2) + a |ref row|)",
                   gf[2], (long long)in->rows_total, kr);
            if (all_worst && all_worst[4 * wr] >= 0)
                printf("; worst (batch, row, head) = (%.0f, %.0f, %.0f) at %.3g of its bound", all_worst[4 * wr + 1],
                       all_worst[4 * wr + 2], all_worst[4 * wr + 3], all_worst[4 * wr]);
            printf("\n");
        } else if (!use_tol && in->row_rule_off) {
            printf("  row rule: not applied (%s)\n", in->row_rule_off);
        }
        if (test_lse)
            printf("  lse: max |test - ref| %.3e (bound %.3e); %lld rows out of tolerance\n", g2[2], lse_bound, gf[1]);
        rc = pass ? CLI_EXIT_OK : CLI_EXIT_MISMATCH;
    }
    free(all_worst);
    return mpi_share_rc(rc);
}

int mpi_check_dtype_default(const mpi_dims *d, fa_dtype *dt)
{
    int lo = 3;
    const int all[4] = {d->q_dtype, d->k_dtype, d->v_dtype, d->extra_dtype};
    for (int i = 0; i < 4; i++)
        if (dtype_rank((fa_dtype)all[i]) < lo) lo = dtype_rank((fa_dtype)all[i]);
    *dt = lo == 0 ? FA_BF16 : lo == 1 ? FA_F16 : FA_F32;
    return 0;
}
