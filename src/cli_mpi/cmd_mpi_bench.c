/*
 * cmd_mpi_bench.c — flashattn-mpi bench: time the ring on generated inputs.
 *
 * Each rank generates its own shard in place (element values depend only on
 * their global index, so every P and layout sees the same problem), so every
 * rank, rank 0 included, holds O(N/P). One CSV line per pass:
 *   ranks,threads,batch,n,heads,heads_k,d,causal,layout,pass,seconds,gflops,
 *   compute_s,wait_s,bytes_per_step,rss_max_mib,rss_min_mib,rank_gflops,wait_mean_s,other_s
 * seconds: the median over --reps of the slowest rank's time; gflops by
 * FlashAttention's formula 4 B H N^2 d (/2 causal; backward x2.5);
 * compute_s/wait_s: the largest over the ranks (of the last repeat); rss:
 * peak resident set per rank (getrusage), the largest and smallest over the
 * ranks; rank_gflops: the slowest rank's compute rate, its own visible
 * (query, key) pairs x 4 d (x2.5 backward) over its compute seconds — the
 * rate of the library calls alone, without the waits; wait_mean_s: the
 * ranks' mean wait; other_s: the largest over the ranks of the call's time
 * outside compute and wait (setup, packing, stores, the tests that drive
 * the transfers).
 */
#include "cli_mpi.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

static const char bench_usage[] =
    "usage: mpirun -np P flashattn-mpi bench (--n N | --tokens-per-rank C) [--d D] [--heads H] [--heads-k HK]\n"
    "                     [--batch B] [--causal] [--layout contiguous|zigzag|auto] [--pass fwd|bwd|both]\n"
    "                     [--reps R] [--threads T] [--no-header]\n"
    "\n"
    "Times the ring on inputs each rank generates in place (O(N/P) memory on every rank) and\n"
    "prints CSV: ranks,threads,batch,n,heads,heads_k,d,causal,layout,pass,seconds,gflops,\n"
    "compute_s,wait_s,bytes_per_step,rss_max_mib,rss_min_mib,rank_gflops,wait_mean_s,other_s\n"
    "(seconds: "
    "median over the repeats of the slowest rank; gflops: 4 B H N^2 d, /2 causal, x2.5\n"
    "backward; compute_s, wait_s: the largest over the ranks; rank_gflops: the slowest rank's\n"
    "compute rate, its visible pairs x 4 d over its compute seconds; wait_mean_s: mean wait;\n"
    "other_s: the largest time outside compute and wait).\n";

/* Value of global element x (splitmix64 -> [-1, 1)). */
static float gen(uint64_t x, uint64_t salt)
{
    uint64_t z = x * 0x9e3779b97f4a7c15ull + salt;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (float)((double)(z >> 11) / 4503599627370496.0 - 1.0);
}

/* This rank's shard [B][c][Hx][w] of a global [B][S][Hx][w] array. */
static float *make_shard(int64_t B, int64_t S, int64_t hw, fa_ring_layout L, uint64_t salt)
{
    const int64_t c = S / mpi_size;
    float *x = malloc((size_t)(B * c * hw) * sizeof(float) + 1);
    if (!x) return NULL;
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < c; i++) {
            const int64_t g = fa_ring_global_row(S, mpi_size, mpi_rank, L, i);
            for (int64_t e = 0; e < hw; e++) x[(b * c + i) * hw + e] = gen((uint64_t)((b * S + g) * hw + e), salt);
        }
    return x;
}

static int cmp_d(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int mpi_cmd_bench(int argc, char **argv)
{
    long long n = 0, cpr = 0, d = 64, heads = 4, heads_k = 0, batch = 1, reps = 3;
    const char *pass = "fwd", *t = NULL;
    int header = 1, rc = 0, help = 0;
    cli_attn attn;
    cli_attn_init(&attn);
    mpi_ring_opts ro = {FA_RING_AUTO, 0};
    mpi_quiet_begin();
    for (int i = 1; i < argc && !rc && !help; i++) {
        int r;
        if (cli_is_help(argv[i])) {
            printf("%s\n%s\n%s", bench_usage, cli_exec_help, mpi_ring_help);
            help = 1;
            break;
        }
        if (strcmp(argv[i], "--causal") == 0) { attn.opt.causal = 1; continue; }
        if (strcmp(argv[i], "--no-header") == 0) { header = 0; continue; }
        if ((r = cli_parse_exec_option(argc, argv, &i, &attn)) != 0 || (r = mpi_parse_ring_option(argc, argv, &i, &ro)) != 0 ||
            (r = cli_opt_value(argc, argv, &i, "--pass", &pass)) != 0) {
            if (r < 0) rc = CLI_EXIT_USAGE;
            continue;
        }
        static const char *names[] = {"--n", "--tokens-per-rank", "--d", "--heads", "--heads-k", "--batch", "--reps"};
        long long *dst[] = {&n, &cpr, &d, &heads, &heads_k, &batch, &reps};
        int used = 0;
        for (int x = 0; x < 7 && !used; x++)
            if ((r = cli_opt_value(argc, argv, &i, names[x], &t)) != 0) {
                used = 1;
                if (r < 0 || cli_parse_int(names[x], t, 1, 1ll << 40, dst[x])) rc = CLI_EXIT_USAGE;
            }
        if (!used) rc = cli_unknown_option("bench", argv[i]);
    }
    if (!rc && !help && strcmp(pass, "fwd") && strcmp(pass, "bwd") && strcmp(pass, "both"))
        rc = cli_die("--pass: expected fwd, bwd or both, got '%s'", pass);
    if (!rc && !help && !n && !cpr) rc = cli_die("bench: give --n N or --tokens-per-rank C");
    if (!rc && !help && n && cpr) rc = cli_die("bench: give --n or --tokens-per-rank, not both");
    if (!heads_k) heads_k = heads;
    if (!rc && !help && heads % heads_k) rc = cli_die("--heads %lld is not a multiple of --heads-k %lld", heads, heads_k);
    const int64_t N = n ? n : cpr * mpi_size;
    const fa_ring_layout L = mpi_size == 1 ? FA_RING_CONTIGUOUS : fa_ring_resolve_layout(ro.layout, &attn.opt);
    if (!rc && !help && fa_ring_check_split(N, mpi_size, L) != FA_OK) rc = cli_die("bench: %s", fa_ring_last_error());
    mpi_quiet_end();
    rc = mpi_agree_rc(rc);
    help = rc ? 0 : mpi_any(help);
    if (help || rc) return rc;

    const int64_t c = N / mpi_size;
    float *q = make_shard(batch, N, heads * d, L, 1), *k = make_shard(batch, N, heads_k * d, L, 2);
    float *v = make_shard(batch, N, heads_k * d, L, 3), *g = make_shard(batch, N, heads * d, L, 4);
    float *o = malloc((size_t)(batch * c * heads * d) * 4 + 1), *lse = malloc((size_t)(batch * heads * c) * 4 + 1);
    float *dq = malloc((size_t)(batch * c * heads * d) * 4 + 1), *dk = malloc((size_t)(batch * c * heads_k * d) * 4 + 1);
    float *dv = malloc((size_t)(batch * c * heads_k * d) * 4 + 1);
    int ok = q && k && v && g && o && lse && dq && dk && dv, all;
    MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!all) {
        if (mpi_rank == 0) cli_die("bench: out of memory for the shards on a rank");
        rc = CLI_EXIT_USAGE;
        goto done;
    }
    fa_tensor tq, tk, tv, tg, to, tl, tdq, tdk, tdv;
    const int64_t sq[4] = {batch, c, heads, d}, sk[4] = {batch, c, heads_k, d}, sl[3] = {batch, heads, c};
    fa_tensor_make(&tq, q, FA_F32, 4, sq, NULL), fa_tensor_make(&tg, g, FA_F32, 4, sq, NULL);
    fa_tensor_make(&tk, k, FA_F32, 4, sk, NULL), fa_tensor_make(&tv, v, FA_F32, 4, sk, NULL);
    fa_tensor_make(&to, o, FA_F32, 4, sq, NULL), fa_tensor_make(&tl, lse, FA_F32, 3, sl, NULL);
    fa_tensor_make(&tdq, dq, FA_F32, 4, sq, NULL), fa_tensor_make(&tdk, dk, FA_F32, 4, sk, NULL);
    fa_tensor_make(&tdv, dv, FA_F32, 4, sk, NULL);
    if (header && mpi_rank == 0)
        printf("ranks,threads,batch,n,heads,heads_k,d,causal,layout,pass,seconds,gflops,compute_s,wait_s,"
               "bytes_per_step,rss_max_mib,rss_min_mib,rank_gflops,wait_mean_s,other_s\n");
    const int do_fwd = strcmp(pass, "bwd") != 0, do_bwd = strcmp(pass, "fwd") != 0;
    if (!do_fwd) { /* the backward needs O and LSE: one untimed forward */
        fa_status st = fa_ring_forward(MPI_COMM_WORLD, L, &tq, &tk, &tv, &to, &tl, &attn.opt, NULL);
        if (st != FA_OK) { rc = mpi_die_ring(st); goto done; }
    }
    for (int p = 0; p < 2; p++) {
        const int bwd = p == 1;
        if (bwd ? !do_bwd : !do_fwd) continue;
        double *times = calloc((size_t)reps, sizeof(double));
        fa_ring_stats s, worst;
        memset(&worst, 0, sizeof worst);
        for (long long r = -1; r < reps; r++) { /* r = -1: warm-up */
            MPI_Barrier(MPI_COMM_WORLD);
            const double t0 = MPI_Wtime();
            fa_status st = bwd ? fa_ring_backward(MPI_COMM_WORLD, L, &tq, &tk, &tv, &to, &tl, &tg, &tdq, &tdk, &tdv,
                                                  &attn.opt, &s)
                               : fa_ring_forward(MPI_COMM_WORLD, L, &tq, &tk, &tv, &to, &tl, &attn.opt, &s);
            double el = MPI_Wtime() - t0, slow;
            if (st != FA_OK) { free(times); rc = mpi_die_ring(st); goto done; }
            MPI_Allreduce(&el, &slow, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
            if (r >= 0) times[r] = slow;
        }
        MPI_Allreduce(&s.compute_s, &worst.compute_s, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        MPI_Allreduce(&s.wait_s, &worst.wait_s, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        double wait_sum = 0, rate = s.compute_s > 0 ? 4.0 * s.visible_pairs * (double)d * (bwd ? 2.5 : 1.0) /
                                                          s.compute_s / 1e9 : 0.0, rate_min = 0;
        MPI_Allreduce(&s.wait_s, &wait_sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        MPI_Allreduce(&rate, &rate_min, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
        double other = s.total_s - s.compute_s - s.wait_s, other_max = 0;
        MPI_Allreduce(&other, &other_max, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        double rss = (double)ru.ru_maxrss / 1024.0, rmax, rmin;
        MPI_Allreduce(&rss, &rmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        MPI_Allreduce(&rss, &rmin, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
        qsort(times, (size_t)reps, sizeof(double), cmp_d);
        const double med = times[reps / 2];
        double flops = 4.0 * (double)batch * (double)heads * (double)N * (double)N * (double)d;
        if (attn.opt.causal) flops /= 2;
        if (bwd) flops *= 2.5;
        fa_cpu_info info;
        fa_get_cpu_info(&info);
        if (mpi_rank == 0)
            printf("%d,%d,%lld,%lld,%lld,%lld,%lld,%d,%s,%s,%.6f,%.3f,%.6f,%.6f,%llu,%.1f,%.1f,%.3f,%.6f,%.6f\n",
                   mpi_size,
                   attn.opt.num_threads > 0 ? attn.opt.num_threads : info.max_threads, batch, (long long)N, heads,
                   heads_k, d, attn.opt.causal, fa_ring_layout_name(L), bwd ? "bwd" : "fwd", med, flops / med / 1e9,
                   worst.compute_s, worst.wait_s, (unsigned long long)s.step_bytes, rmax, rmin, rate_min,
                   wait_sum / mpi_size, other_max);
        free(times);
    }
done:
    free(q), free(k), free(v), free(g), free(o), free(lse), free(dq), free(dk), free(dv);
    cli_attn_free(&attn);
    fflush(stdout);
    return rc;
}
