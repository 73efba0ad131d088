/*
 * cmd_mpi_check.c — flashattn-mpi check: a tested output (say, a GPU kernel's
 * on a sequence too long to validate on one machine) against the float64
 * reference computed over the ring (--impl reference, distributed).
 *
 * The rule: with --atol/--rtol, |test - ref| <= atol + rtol |ref| everywhere.
 * Otherwise FlashAttention's form, 2 x a baseline's max error plus an absolute
 * floor a * max|ref| (a = 2^-9 bf16, 2^-12 f16, 2^-18 f32), where the baseline
 * is the float32 ring's output rounded to the tested dtype. flashattn check's
 * baseline also rounds the inputs and P (a low-precision emulation); that one
 * is not distributed, so this default is stricter for bf16/f16 kernels: pass
 * --atol/--rtol there, or use flashattn check on one machine.
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
    "bf16, 2^-12 f16, 2^-18 f32); the baseline is the float32 ring's output rounded to the dtype.\n"
    "(flashattn check's baseline also rounds inputs and P; for bf16/f16 kernels this default is\n"
    "stricter: give --atol/--rtol, or run flashattn check on one machine.) Not here: --sample-rows,\n"
    "--seed, --diagnose, --qkv-format, --kernel-model.\n"
    "\n%s\n%s\n%s"
    "Exit status: 0 within tolerance; 1 mismatch; 2 bad usage or bad input (every rank).\n";

int mpi_cmd_check(int argc, char **argv) { return mpi_check_main(argc, argv, check_usage); }

/* Judging, after the ring: per-rank maxima reduced over the ranks. */
int mpi_check_judge(const fa_tensor *test, const fa_tensor *test_lse, const double *ref, const double *ref_lse,
                    const float *fl, const float *fl_lse, int64_t n_o, int64_t n_l, fa_dtype dt, int use_tol,
                    double atol, double rtol, int64_t rows_total, int64_t elems_total)
{
    /* pass 1: maxima */
    double loc[5] = {0, 0, 0, 0, 0}; /* max|ref|, max err baseline, max|lse_ref|, max lse err of flash, n non-finite */
    for (int64_t i = 0; i < n_o; i++) {
        const double r = ref[i], b = round_to(fl[i], dt);
        if (isfinite(r) && fabs(r) > loc[0]) loc[0] = fabs(r);
        const double e = fabs(b - r);
        if (!(e <= loc[1])) loc[1] = e;
    }
    for (int64_t i = 0; i < n_l; i++) {
        if (isfinite(ref_lse[i]) && fabs(ref_lse[i]) > loc[2]) loc[2] = fabs(ref_lse[i]);
        const double e = ref_lse[i] == fl_lse[i] ? 0.0 : fabs(ref_lse[i] - fl_lse[i]);
        if (!(e <= loc[3])) loc[3] = e;
    }
    double glob[5];
    MPI_Allreduce(loc, glob, 4, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    const double a = dt == FA_BF16 ? 0x1p-9 : dt == FA_F16 ? 0x1p-12 : 0x1p-18;
    const double bound = use_tol ? atol : 2 * glob[1] + a * glob[0];
    const double lse_bound = 2 * glob[3] + 0x1p-18 * glob[2];
    /* pass 2: errors and failures */
    double e2[3] = {0, 0, 0}; /* max err, sum err, max lse err */
    long long f2[2] = {0, 0}; /* failing elements, failing lse rows */
    for (int64_t i = 0; i < n_o; i++) {
        const double t = cli_element(test->data, test->dtype, i), r = ref[i];
        double e = fabs(t - r);
        if (!isfinite(t)) e = INFINITY;
        if (!(e <= e2[0])) e2[0] = e;
        if (isfinite(e)) e2[1] += e;
        const double lim = use_tol ? atol + rtol * fabs(r) : bound;
        if (!(e <= lim)) f2[0]++;
    }
    for (int64_t i = 0; test_lse && i < n_l; i++) {
        const double t = cli_element(test_lse->data, test_lse->dtype, i), r = ref_lse[i];
        double e;
        if (r == -INFINITY) e = isinf(t) ? 0.0 : INFINITY; /* an empty row: -inf (or +inf) */
        else e = isfinite(t) ? fabs(t - r) : INFINITY;
        if (!(e <= e2[2])) e2[2] = e;
        if (!(e <= lse_bound)) f2[1]++;
    }
    double g2[3];
    long long gf[2];
    MPI_Reduce(e2, g2, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    MPI_Reduce(e2 + 1, g2 + 1, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
    MPI_Reduce(e2 + 2, g2 + 2, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    MPI_Reduce(f2, gf, 2, MPI_LONG_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
    int rc = 0;
    if (mpi_rank == 0) {
        const int pass = gf[0] == 0 && gf[1] == 0;
        printf("check over %d ranks: %s\n", mpi_size, pass ? "PASS" : "FAIL");
        printf("  rule: %s (dtype %s)\n",
               use_tol ? "|test - ref| <= atol + rtol |ref|" : "max|test - ref| <= 2 x baseline + a max|ref|",
               fa_dtype_name(dt));
        if (use_tol)
            printf("  atol %.3e  rtol %.3e\n", atol, rtol);
        else
            printf("  baseline (float32 ring rounded to %s) max error %.3e; a max|ref| %.3e; bound %.3e\n",
                   fa_dtype_name(dt), glob[1], a * glob[0], bound);
        printf("  output: max |test - ref| %.3e, mean %.3e over %lld elements (%lld rows); %lld out of tolerance\n",
               g2[0], elems_total ? g2[1] / (double)elems_total : 0.0, (long long)elems_total, (long long)rows_total,
               gf[0]);
        if (test_lse)
            printf("  lse: max |test - ref| %.3e (bound %.3e); %lld rows out of tolerance\n", g2[2], lse_bound, gf[1]);
        rc = pass ? CLI_EXIT_OK : CLI_EXIT_MISMATCH;
    }
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
