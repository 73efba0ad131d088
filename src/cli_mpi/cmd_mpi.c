/*
 * cmd_mpi.c — flashattn-mpi run, grad and check: the flags of flashattn's
 * commands (src/cli parses them), the work done by the ring (src/mpi).
 */
#include "cli_mpi.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* What the three commands share: options, rank 0's files, this rank's shards. */
typedef struct job {
    cli_attn attn;
    mpi_ring_opts ring;
    fa_ring_layout layout;   /* resolved */
    cli_qkv in;              /* rank 0 only */
    int in_loaded;
    fa_npy extra, extra_lse; /* rank 0: dO (grad) or O_TEST and LSE_TEST (check) */
    mpi_dims dm;
    int64_t cq, ck;          /* rows per rank */
    void *q, *k, *v, *x, *xl; /* shards (x: dO or O_TEST; xl: LSE_TEST) */
    fa_tensor qt, kt, vt, xt, xlt;
} job;

static void job_init(job *j)
{
    memset(j, 0, sizeof *j);
    cli_attn_init(&j->attn);
    j->ring.layout = FA_RING_AUTO;
}

static void job_free(job *j)
{
    if (j->in_loaded) cli_qkv_free(&j->in);
    fa_npy_free(&j->extra);
    fa_npy_free(&j->extra_lse);
    cli_attn_free(&j->attn);
    free(j->q), free(j->k), free(j->v), free(j->x), free(j->xl);
}

static int64_t numel4(int64_t a, int64_t b, int64_t c, int64_t d) { return a * b * c * d; }

/* Rank 0: load an array that must have `want` shape (rank n), finite if `finite`. */
static int load_shaped(const char *path, const char *role, int n, const int64_t *want, int finite, fa_npy *arr)
{
    if (cli_load_array(path, n, finite, role, arr, NULL)) return CLI_EXIT_USAGE;
    if (memcmp(arr->shape, want, (size_t)n * sizeof(int64_t)) != 0) {
        char sh[96], ws[96];
        cli_die("%s: shape %s should be %s %s", path, cli_shape(n, arr->shape, sh, sizeof sh), role,
                cli_shape(n, want, ws, sizeof ws));
        fa_npy_free(arr);
        return CLI_EXIT_USAGE;
    }
    return 0;
}

/*
 * Rank 0 loads Q, K, V (and the extra [B][Sq][H][dv] array, and an LSE
 * [B][H][Sq]), refuses what the ring cannot do; the decision and the dims go
 * to every rank, then each rank's rows. Returns 0 or 2 on every rank. A dO must
 * be finite; a tested output and LSE may not be (check fails them, exit 1).
 */
static int load_and_scatter(job *j, const char *q_path, const char *k_path, const char *v_path, const char *x_path,
                            const char *x_role, const char *xl_path)
{
    int rc = 0;
    j->layout = mpi_size == 1 ? FA_RING_CONTIGUOUS : fa_ring_resolve_layout(j->ring.layout, &j->attn.opt);
    if (mpi_rank == 0) {
        const cli_attn *a = &j->attn;
        const char *unsupported = a->alibi_path ? "--alibi: ALiBi"
                                  : a->sinks_path ? "--sinks: attention sinks"
                                  : a->dropout_p_text || a->dropout_mask_path ? "--dropout-p/--dropout-mask: dropout"
                                  : a->rotary_cos_path || a->rotary_sin_path ? "--rotary-cos/--rotary-sin: rotary"
                                  : a->cu_q_path || a->cu_k_path || a->seqused_path ? "varlen (--cu-seqlens-q/-k)"
                                  : a->cache_seqlens_path || a->k_new_path || a->block_table_path ? "a KV cache"
                                  : NULL;
        if (unsupported) {
            /* parsed by the shared option parser, so refused here, never silently dropped */
            rc = cli_die("%s is not supported over the ring (use flashattn)", unsupported);
        } else if ((rc = cli_load_qkv(&j->in, q_path, k_path, v_path)) == 0) {
            j->in_loaded = 1;
            const cli_qkv *in = &j->in;
            fa_status st;
            if ((st = fa_ring_check_split(in->seqlen_q, mpi_size, j->layout)) != FA_OK)
                rc = cli_die("%s: %s (layout %s)", q_path, fa_ring_last_error(), fa_ring_layout_name(j->layout));
            else if ((st = fa_ring_check_split(in->seqlen_k, mpi_size, j->layout)) != FA_OK)
                rc = cli_die("%s: %s (layout %s)", k_path, fa_ring_last_error(), fa_ring_layout_name(j->layout));
            if (!rc && x_path) {
                const int64_t want[4] = {in->batch, in->seqlen_q, in->heads, in->dv};
                rc = load_shaped(x_path, x_role, 4, want, !strncmp(x_role, "dO", 2), &j->extra); /* dO: finite */
            }
            if (!rc && xl_path) {
                const int64_t want[3] = {in->batch, in->heads, in->seqlen_q};
                rc = load_shaped(xl_path, "LSE [batch, heads, seqlen_q]", 3, want, 0, &j->extra_lse);
                if (!rc && j->extra_lse.dtype != FA_F32 && j->extra_lse.dtype != FA_F64)
                    rc = cli_die("%s: the LSE must be float32 or float64", xl_path);
            }
            j->dm = (mpi_dims){in->batch, in->seqlen_q, in->seqlen_k, in->heads, in->heads_k, in->d, in->dv,
                               in->q.dtype, in->k.dtype, in->v.dtype, x_path ? (int)j->extra.dtype : -1,
                               xl_path ? (int)j->extra_lse.dtype : -1};
        }
    }
    if ((rc = mpi_share_rc(rc)) != 0) return rc;
    mpi_share_dims(&j->dm);
    const mpi_dims *d = &j->dm;
    j->cq = d->seqlen_q / mpi_size;
    j->ck = d->seqlen_k / mpi_size;
    const size_t qe = fa_dtype_size(d->q_dtype), ke = fa_dtype_size(d->k_dtype), ve = fa_dtype_size(d->v_dtype);
    j->q = malloc((size_t)numel4(d->batch, j->cq, d->heads, d->d) * qe + 1);
    j->k = malloc((size_t)numel4(d->batch, j->ck, d->heads_k, d->d) * ke + 1);
    j->v = malloc((size_t)numel4(d->batch, j->ck, d->heads_k, d->dv) * ve + 1);
    if (x_path) j->x = malloc((size_t)numel4(d->batch, j->cq, d->heads, d->dv) * fa_dtype_size(d->extra_dtype) + 1);
    if (xl_path) j->xl = malloc((size_t)(d->batch * d->heads * j->cq) * fa_dtype_size(d->extra_lse_dtype) + 1);
    int ok = j->q && j->k && j->v && (!x_path || j->x) && (!xl_path || j->xl), all_ok;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!all_ok) {
        if (mpi_rank == 0) cli_die("out of memory for the shards on a rank");
        return CLI_EXIT_USAGE;
    }
    const cli_qkv *in = &j->in;
    if (mpi_scatter_rows(mpi_rank == 0 ? in->q.data : NULL, j->q, d->batch, d->seqlen_q, (size_t)(d->heads * d->d) * qe,
                         j->layout) ||
        mpi_scatter_rows(mpi_rank == 0 ? in->k.data : NULL, j->k, d->batch, d->seqlen_k,
                         (size_t)(d->heads_k * d->d) * ke, j->layout) ||
        mpi_scatter_rows(mpi_rank == 0 ? in->v.data : NULL, j->v, d->batch, d->seqlen_k,
                         (size_t)(d->heads_k * d->dv) * ve, j->layout) ||
        (x_path && mpi_scatter_rows(mpi_rank == 0 ? j->extra.data : NULL, j->x, d->batch, d->seqlen_q,
                                    (size_t)(d->heads * d->dv) * fa_dtype_size(d->extra_dtype), j->layout)) ||
        (xl_path && mpi_scatter_rows(mpi_rank == 0 ? j->extra_lse.data : NULL, j->xl, d->batch * d->heads,
                                     d->seqlen_q, fa_dtype_size(d->extra_lse_dtype), j->layout)))
        return CLI_EXIT_USAGE;
    const int64_t qs[4] = {d->batch, j->cq, d->heads, d->d}, ks[4] = {d->batch, j->ck, d->heads_k, d->d};
    const int64_t vs[4] = {d->batch, j->ck, d->heads_k, d->dv}, os[4] = {d->batch, j->cq, d->heads, d->dv};
    const int64_t ls[3] = {d->batch, d->heads, j->cq};
    fa_tensor_make(&j->qt, j->q, d->q_dtype, 4, qs, NULL);
    fa_tensor_make(&j->kt, j->k, d->k_dtype, 4, ks, NULL);
    fa_tensor_make(&j->vt, j->v, d->v_dtype, 4, vs, NULL);
    if (x_path) fa_tensor_make(&j->xt, j->x, d->extra_dtype, 4, os, NULL);
    if (xl_path) fa_tensor_make(&j->xlt, j->xl, d->extra_lse_dtype, 3, ls, NULL);
    return 0;
}

static int parse_out_dtype(const char *text, fa_dtype *dt)
{
    *dt = FA_F32;
    if (!text) return 0;
    if (cli_parse_dtype("--dtype-out", text, dt) != 0) return CLI_EXIT_USAGE;
    if (*dt != FA_F32 && *dt != FA_F64)
        return cli_die("--dtype-out %s: the ring writes f32 or f64 (convert afterwards, or use flashattn)", text);
    return 0;
}

/* ------------------------------------------------------------------------ */
/* run                                                                       */
/* ------------------------------------------------------------------------ */

static const char run_usage[] =
    "usage: mpirun -np P flashattn-mpi run -q Q.npy -k K.npy -v V.npy -o O.npy [--lse LSE.npy]\n"
    "                     [MASK OPTIONS] [--impl NAME] [--threads T] [--dtype-out f32|f64]\n"
    "                     [--layout contiguous|zigzag|auto] [--stats]\n"
    "\n"
    "flashattn run with the sequence split over the ranks: each rank computes its shard of the\n"
    "queries against every shard of the keys as the K/V shards travel around the ring, and the\n"
    "partial results merge exactly. seqlen_q and seqlen_k must split into P (zigzag: 2P) equal parts.\n"
    "--impl reference gives the float64 result, distributed.\n"
    "\n%s\n%s\n%s"
    "Exit status: 0 ok; 2 bad usage or bad input (one line on stderr; no output written; every rank).\n";

int mpi_cmd_run(int argc, char **argv)
{
    const char *q_path = NULL, *k_path = NULL, *v_path = NULL, *o_path = NULL, *lse_path = NULL, *dt_text = NULL;
    job j;
    job_init(&j);
    int rc = 0, help = 0;
    mpi_quiet_begin();
    for (int i = 1; i < argc && !rc && !help; i++) {
        int r;
        if (cli_is_help(argv[i])) {
            printf(run_usage, cli_mask_help, cli_exec_help, mpi_ring_help);
            help = 1;
            break;
        }
        if ((r = cli_parse_mask_option(argc, argv, &i, &j.attn)) != 0 ||
            (r = cli_parse_exec_option(argc, argv, &i, &j.attn)) != 0 ||
            (r = mpi_parse_ring_option(argc, argv, &i, &j.ring)) != 0 ||
            (r = cli_opt_value(argc, argv, &i, "-q", &q_path)) != 0 ||
            (r = cli_opt_value(argc, argv, &i, "-k", &k_path)) != 0 ||
            (r = cli_opt_value(argc, argv, &i, "-v", &v_path)) != 0 ||
            (r = cli_opt_value(argc, argv, &i, "-o", &o_path)) != 0 ||
            (r = cli_opt_value(argc, argv, &i, "--lse", &lse_path)) != 0 ||
            (r = cli_opt_value(argc, argv, &i, "--dtype-out", &dt_text)) != 0) {
            if (r < 0) rc = CLI_EXIT_USAGE;
            continue;
        }
        rc = cli_unknown_option("run", argv[i]);
    }
    if (!rc && !help && (!q_path || !k_path || !v_path || !o_path))
        rc = cli_die("run: missing %s (see flashattn-mpi run --help)",
                     !q_path ? "-q Q.npy" : !k_path ? "-k K.npy" : !v_path ? "-v V.npy" : "-o O.npy");
    fa_dtype out_dt = FA_F32;
    if (!rc && !help) rc = parse_out_dtype(dt_text, &out_dt);
    mpi_quiet_end();
    rc = mpi_agree_rc(rc);
    help = rc ? 0 : mpi_any(help);
    if (help || rc) {
        job_free(&j);
        return rc;
    }
    if (mpi_rank == 0) {
        const cli_named outs[2] = {{"-o", o_path}, {"--lse", lse_path}};
        const cli_named ins[3] = {{"-q", q_path}, {"-k", k_path}, {"-v", v_path}};
        rc = cli_check_files("run", outs, 2, ins, 3);
    }
    if ((rc = mpi_share_rc(rc)) != 0 || (rc = load_and_scatter(&j, q_path, k_path, v_path, NULL, NULL, NULL)) != 0) {
        job_free(&j);
        return rc;
    }
    const mpi_dims *d = &j.dm;
    const size_t on = (size_t)numel4(d->batch, j.cq, d->heads, d->dv), ln = (size_t)(d->batch * d->heads * j.cq);
    void *o = calloc(on + 1, fa_dtype_size(out_dt));
    float *lse = calloc(ln + 1, sizeof(float));
    void *o_all = NULL;
    float *lse_all = NULL;
    fa_tensor ot, lt;
    const int64_t os[4] = {d->batch, j.cq, d->heads, d->dv}, ls[3] = {d->batch, d->heads, j.cq};
    fa_tensor_make(&ot, o, out_dt, 4, os, NULL);
    fa_tensor_make(&lt, lse, FA_F32, 3, ls, NULL);
    fa_ring_stats stats;
    const double t0 = MPI_Wtime();
    fa_status st = (o && lse) ? fa_ring_forward(MPI_COMM_WORLD, j.layout, &j.qt, &j.kt, &j.vt, &ot, &lt, &j.attn.opt,
                                                &stats)
                              : FA_ERR_NOMEM;
    const double secs = MPI_Wtime() - t0;
    if (st != FA_OK) {
        rc = mpi_die_ring(st);
        goto done;
    }
    const int64_t o_full[4] = {d->batch, d->seqlen_q, d->heads, d->dv}, l_full[3] = {d->batch, d->heads, d->seqlen_q};
    if (mpi_rank == 0) {
        o_all = calloc((size_t)numel4(o_full[0], o_full[1], o_full[2], o_full[3]) + 1, fa_dtype_size(out_dt));
        lse_all = calloc((size_t)(l_full[0] * l_full[1] * l_full[2]) + 1, sizeof(float));
        if (!o_all || !lse_all) rc = cli_die("run: out of memory for the gathered output");
    }
    if ((rc = mpi_share_rc(rc)) != 0) goto done;
    if ((rc = mpi_gather_rows(o_all, o, d->batch, d->seqlen_q, (size_t)(d->heads * d->dv) * fa_dtype_size(out_dt),
                              j.layout)) != 0 ||
        (rc = mpi_gather_rows(lse_all, lse, d->batch * d->heads, d->seqlen_q, sizeof(float), j.layout)) != 0)
        goto done;
    if (mpi_rank == 0) {
        cli_warn_nonfinite(o_path, o_all, out_dt, numel4(o_full[0], o_full[1], o_full[2], o_full[3]), 0);
        const cli_output outs[2] = {{o_path, o_all, out_dt, 4, o_full}, {lse_path, lse_all, FA_F32, 3, l_full}};
        rc = cli_save_outputs(outs, 2);
        if (!rc) {
            char sh[96];
            printf("wrote %s %s %s%s%s (%s over %d ranks, layout %s, %.1f ms)\n", o_path,
                   cli_shape(4, o_full, sh, sizeof sh), fa_dtype_name(out_dt), lse_path ? " and " : "",
                   lse_path ? lse_path : "", fa_impl_name(j.attn.opt.impl), mpi_size, fa_ring_layout_name(j.layout),
                   secs * 1e3);
        }
    }
    if ((rc = mpi_share_rc(rc)) == 0 && j.ring.stats) mpi_print_stats("run", &stats);
done:
    free(o), free(lse), free(o_all), free(lse_all);
    job_free(&j);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* grad                                                                      */
/* ------------------------------------------------------------------------ */

static const char grad_usage[] =
    "usage: mpirun -np P flashattn-mpi grad -q Q.npy -k K.npy -v V.npy --dout DO.npy\n"
    "                     --dq DQ.npy --dk DK.npy --dv DV.npy [MASK OPTIONS] [--impl NAME] [--threads T]\n"
    "                     [--dtype-out f32|f64] [--layout contiguous|zigzag|auto] [--stats]\n"
    "\n"
    "flashattn grad with the sequence split over the ranks: O and LSE are recomputed over the\n"
    "ring; each rank's dQ accumulates locally while the dK/dV accumulators travel with their\n"
    "K/V shard and come back to their owner.\n"
    "\n%s\n%s\n%s"
    "Exit status: 0 ok; 2 bad usage or bad input (one line on stderr; no output written; every rank).\n";

int mpi_cmd_grad(int argc, char **argv)
{
    const char *q_path = NULL, *k_path = NULL, *v_path = NULL, *do_path = NULL, *dq_path = NULL, *dk_path = NULL,
               *dv_path = NULL, *dt_text = NULL;
    job j;
    job_init(&j);
    int rc = 0, help = 0;
    mpi_quiet_begin();
    for (int i = 1; i < argc && !rc && !help; i++) {
        int r;
        if (cli_is_help(argv[i])) {
            printf(grad_usage, cli_mask_help, cli_exec_help, mpi_ring_help);
            help = 1;
            break;
        }
        if ((r = cli_parse_mask_option(argc, argv, &i, &j.attn)) != 0 ||
            (r = cli_parse_exec_option(argc, argv, &i, &j.attn)) != 0 ||
            (r = mpi_parse_ring_option(argc, argv, &i, &j.ring)) != 0 ||
            (r = cli_opt_value(argc, argv, &i, "-q", &q_path)) != 0 ||
            (r = cli_opt_value(argc, argv, &i, "-k", &k_path)) != 0 ||
            (r = cli_opt_value(argc, argv, &i, "-v", &v_path)) != 0 ||
            (r = cli_opt_value(argc, argv, &i, "--dout", &do_path)) != 0 ||
            (r = cli_opt_value(argc, argv, &i, "--dq", &dq_path)) != 0 ||
            (r = cli_opt_value(argc, argv, &i, "--dk", &dk_path)) != 0 ||
            (r = cli_opt_value(argc, argv, &i, "--dv", &dv_path)) != 0 ||
            (r = cli_opt_value(argc, argv, &i, "--dtype-out", &dt_text)) != 0) {
            if (r < 0) rc = CLI_EXIT_USAGE;
            continue;
        }
        rc = cli_unknown_option("grad", argv[i]);
    }
    if (!rc && !help && (!q_path || !k_path || !v_path || !do_path || !dq_path || !dk_path || !dv_path))
        rc = cli_die("grad: missing %s (see flashattn-mpi grad --help)",
                     !q_path ? "-q Q.npy" : !k_path ? "-k K.npy" : !v_path ? "-v V.npy" : !do_path ? "--dout DO.npy"
                     : !dq_path ? "--dq DQ.npy" : !dk_path ? "--dk DK.npy" : "--dv DV.npy");
    fa_dtype out_dt = FA_F32;
    if (!rc && !help) rc = parse_out_dtype(dt_text, &out_dt);
    mpi_quiet_end();
    rc = mpi_agree_rc(rc);
    help = rc ? 0 : mpi_any(help);
    if (help || rc) {
        job_free(&j);
        return rc;
    }
    if (mpi_rank == 0) {
        const cli_named outs[3] = {{"--dq", dq_path}, {"--dk", dk_path}, {"--dv", dv_path}};
        const cli_named ins[4] = {{"-q", q_path}, {"-k", k_path}, {"-v", v_path}, {"--dout", do_path}};
        rc = cli_check_files("grad", outs, 3, ins, 4);
    }
    if ((rc = mpi_share_rc(rc)) != 0 ||
        (rc = load_and_scatter(&j, q_path, k_path, v_path, do_path, "dO [batch, seqlen_q, heads, d_v]", NULL)) != 0) {
        job_free(&j);
        return rc;
    }
    const mpi_dims *d = &j.dm;
    const int64_t sh[3][4] = {{d->batch, j.cq, d->heads, d->d}, {d->batch, j.ck, d->heads_k, d->d},
                              {d->batch, j.ck, d->heads_k, d->dv}};
    const int64_t full[3][4] = {{d->batch, d->seqlen_q, d->heads, d->d}, {d->batch, d->seqlen_k, d->heads_k, d->d},
                                {d->batch, d->seqlen_k, d->heads_k, d->dv}};
    void *g[3] = {NULL, NULL, NULL}, *g_all[3] = {NULL, NULL, NULL};
    fa_tensor gt[3];
    int ok = 1;
    for (int x = 0; x < 3; x++) {
        g[x] = calloc((size_t)numel4(sh[x][0], sh[x][1], sh[x][2], sh[x][3]) + 1, fa_dtype_size(out_dt));
        ok &= g[x] != NULL;
        fa_tensor_make(&gt[x], g[x], out_dt, 4, sh[x], NULL);
    }
    fa_ring_stats stats;
    const double t0 = MPI_Wtime();
    fa_status st = ok ? fa_ring_backward(MPI_COMM_WORLD, j.layout, &j.qt, &j.kt, &j.vt, NULL, NULL, &j.xt, &gt[0],
                                         &gt[1], &gt[2], &j.attn.opt, &stats)
                      : FA_ERR_NOMEM;
    const double secs = MPI_Wtime() - t0;
    if (st != FA_OK) {
        rc = mpi_die_ring(st);
        goto done;
    }
    if (mpi_rank == 0)
        for (int x = 0; x < 3; x++)
            if (!(g_all[x] = calloc((size_t)numel4(full[x][0], full[x][1], full[x][2], full[x][3]) + 1,
                                    fa_dtype_size(out_dt))))
                rc = cli_die("grad: out of memory for the gathered gradients");
    if ((rc = mpi_share_rc(rc)) != 0) goto done;
    for (int x = 0; x < 3 && !rc; x++)
        rc = mpi_gather_rows(g_all[x], g[x], d->batch, full[x][1], (size_t)(full[x][2] * full[x][3]) * fa_dtype_size(out_dt),
                             j.layout);
    if (rc) goto done;
    if (mpi_rank == 0) {
        const cli_output outs[3] = {{dq_path, g_all[0], out_dt, 4, full[0]},
                                    {dk_path, g_all[1], out_dt, 4, full[1]},
                                    {dv_path, g_all[2], out_dt, 4, full[2]}};
        rc = cli_save_outputs(outs, 3);
        if (!rc)
            printf("wrote %s, %s, %s (%s; %s over %d ranks, layout %s, %.1f ms)\n", dq_path, dk_path, dv_path,
                   fa_dtype_name(out_dt), fa_impl_name(j.attn.opt.impl), mpi_size, fa_ring_layout_name(j.layout),
                   secs * 1e3);
    }
    if ((rc = mpi_share_rc(rc)) == 0 && j.ring.stats) mpi_print_stats("grad", &stats);
done:
    for (int x = 0; x < 3; x++) free(g[x]), free(g_all[x]);
    job_free(&j);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* check (the rule and the report: cmd_mpi_check.c)                          */
/* ------------------------------------------------------------------------ */

int mpi_check_main(int argc, char **argv, const char *usage)
{
    const char *q_path = NULL, *k_path = NULL, *v_path = NULL, *t_path = NULL, *lse_path = NULL, *dt_text = NULL;
    const char *atol_text = NULL, *rtol_text = NULL;
    job j;
    job_init(&j);
    int rc = 0, help = 0;
    double atol = 0, rtol = 0;
    mpi_quiet_begin();
    for (int i = 1; i < argc && !rc && !help; i++) {
        int r;
        if (cli_is_help(argv[i])) {
            printf(usage, cli_mask_help, cli_exec_help, mpi_ring_help);
            help = 1;
            break;
        }
        if ((r = cli_parse_mask_option(argc, argv, &i, &j.attn)) != 0 ||
            (r = cli_parse_exec_option(argc, argv, &i, &j.attn)) != 0 ||
            (r = mpi_parse_ring_option(argc, argv, &i, &j.ring)) != 0 ||
            (r = cli_opt_value(argc, argv, &i, "-q", &q_path)) != 0 ||
            (r = cli_opt_value(argc, argv, &i, "-k", &k_path)) != 0 ||
            (r = cli_opt_value(argc, argv, &i, "-v", &v_path)) != 0 ||
            (r = cli_opt_value_alias(argc, argv, &i, "--out", "-o", &t_path)) != 0 ||
            (r = cli_opt_value_alias(argc, argv, &i, "-o", "--out", &t_path)) != 0 ||
            (r = cli_opt_value(argc, argv, &i, "--lse", &lse_path)) != 0 ||
            (r = cli_opt_value(argc, argv, &i, "--dtype", &dt_text)) != 0 ||
            (r = cli_opt_value(argc, argv, &i, "--atol", &atol_text)) != 0 ||
            (r = cli_opt_value(argc, argv, &i, "--rtol", &rtol_text)) != 0) {
            if (r < 0) rc = CLI_EXIT_USAGE;
            continue;
        }
        rc = cli_unknown_option("check", argv[i]);
    }
    if (!rc && !help && (!q_path || !k_path || !v_path || !t_path))
        rc = cli_die("check: missing %s (see flashattn-mpi check --help)",
                     !q_path ? "-q Q.npy" : !k_path ? "-k K.npy" : !v_path ? "-v V.npy" : "--out O_TEST.npy");
    if (!rc && !help && atol_text && (cli_parse_double("--atol", atol_text, &atol) || atol < 0))
        rc = atol < 0 ? cli_die("--atol: must be >= 0 (got %s)", atol_text) : CLI_EXIT_USAGE;
    if (!rc && !help && rtol_text && (cli_parse_double("--rtol", rtol_text, &rtol) || rtol < 0))
        rc = rtol < 0 ? cli_die("--rtol: must be >= 0 (got %s)", rtol_text) : CLI_EXIT_USAGE;
    fa_dtype dt = FA_F32;
    if (!rc && !help && dt_text) {
        if (cli_parse_dtype("--dtype", dt_text, &dt) != 0) rc = CLI_EXIT_USAGE;
        else if (dt == FA_F64) rc = cli_die("--dtype: expected f32, f16 or bf16 (the tested kernel's precision)");
    }
    mpi_quiet_end();
    rc = mpi_agree_rc(rc);
    help = rc ? 0 : mpi_any(help);
    if (help || rc) {
        job_free(&j);
        return rc;
    }
    if (mpi_rank == 0) {
        const cli_named ins[5] = {{"-q", q_path}, {"-k", k_path}, {"-v", v_path}, {"--out", t_path}, {"--lse", lse_path}};
        rc = cli_check_files("check", NULL, 0, ins, 5);
    }
    if ((rc = mpi_share_rc(rc)) != 0 ||
        (rc = load_and_scatter(&j, q_path, k_path, v_path, t_path, "O_TEST [batch, seqlen_q, heads, d_v]", lse_path)) != 0) {
        job_free(&j);
        return rc;
    }
    const mpi_dims *d = &j.dm;
    if (!dt_text) mpi_check_dtype_default(d, &dt);
    const int64_t n_o = numel4(d->batch, j.cq, d->heads, d->dv), n_l = d->batch * d->heads * j.cq;
    const int use_tol = atol_text != NULL || rtol_text != NULL;
    if (!use_tol) { /* inputs the tested dtype cannot hold: the default rule's baseline would be inf/NaN */
        if (mpi_rank == 0)
            rc = mpi_check_emulable(&j.in.q, q_path, dt) ? CLI_EXIT_USAGE
                 : mpi_check_emulable(&j.in.k, k_path, dt) ? CLI_EXIT_USAGE
                 : mpi_check_emulable(&j.in.v, v_path, dt) ? CLI_EXIT_USAGE
                                                            : 0;
        if ((rc = mpi_share_rc(rc)) != 0) {
            job_free(&j);
            return rc;
        }
    }
    const int lowp = !use_tol && (dt == FA_BF16 || dt == FA_F16); /* the bf16/f16 rules */
    double *ref = malloc((size_t)(n_o + 1) * sizeof(double)), *ref_l = malloc((size_t)(n_l + 1) * sizeof(double));
    float *fl = malloc((size_t)(n_o + 1) * sizeof(float)), *fl_l = malloc((size_t)(n_l + 1) * sizeof(float));
    double *pv2 = lowp ? malloc((size_t)(n_o + 1) * sizeof(double)) : NULL;
    float *qr = NULL, *kr = NULL, *vr = NULL; /* the inputs rounded to dt for the baseline, where wider */
    fa_tensor qb = j.qt, kb = j.kt, vb = j.vt;
    const int64_t os[4] = {d->batch, j.cq, d->heads, d->dv}, ls[3] = {d->batch, d->heads, j.cq};
    fa_tensor rt, rlt, ft, flt;
    fa_tensor_make(&rt, ref, FA_F64, 4, os, NULL);
    fa_tensor_make(&rlt, ref_l, FA_F64, 3, ls, NULL);
    fa_tensor_make(&ft, fl, FA_F32, 4, os, NULL);
    fa_tensor_make(&flt, fl_l, FA_F32, 3, ls, NULL);
    fa_options ro = j.attn.opt, fo = j.attn.opt;
    ro.impl = FA_IMPL_REFERENCE;
    fo.impl = FA_IMPL_FLASH;
    fa_ring_stats rs, fs;
    int ok = ref && ref_l && fl && fl_l && (!lowp || pv2), all_ok;
    if (ok && lowp)
        ok = !mpi_check_round_input(&j.qt, dt, &qr, &qb) && !mpi_check_round_input(&j.kt, dt, &kr, &kb) &&
             !mpi_check_round_input(&j.vt, dt, &vr, &vb);
    fa_status st = ok ? FA_OK : FA_ERR_NOMEM;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!all_ok) {
        if (mpi_rank == 0) cli_die("check: out of memory for the reference on a rank");
        rc = CLI_EXIT_USAGE;
        goto done;
    }
    /* the P^2 pass doubles every score: out of range only for absurd scales or caps */
    const double scale = ro.scale != 0.0 ? ro.scale : 1.0 / sqrt((double)d->d);
    const char *row_off = NULL;
    if (lowp && (fabs(2.0 * scale) > FA_SCALE_MAX || 2.0 * ro.softcap > FA_SOFTCAP_MAX)) {
        row_off = "the scale or softcap doubled is out of range, so sum_j P_j^2 |v_j|^2 cannot be computed";
        free(pv2);
        pv2 = NULL;
    }
    const double t0 = MPI_Wtime();
    if ((st = fa_ring_forward(MPI_COMM_WORLD, j.layout, &j.qt, &j.kt, &j.vt, &rt, &rlt, &ro, &rs)) != FA_OK ||
        (st = fa_ring_forward(MPI_COMM_WORLD, j.layout, &qb, &kb, &vb, &ft, &flt, &fo, &fs)) != FA_OK) {
        rc = mpi_die_ring(st);
        goto done;
    }
    fa_ring_stats ps;
    if (pv2 && (rc = mpi_check_p2(j.layout, &j.qt, &j.kt, &j.vt, &ro, ref_l, pv2, &ps)) != 0) goto done;
    const double secs = MPI_Wtime() - t0;
    const mpi_check_in ci = {&j.xt, lse_path ? &j.xlt : NULL, ref, ref_l, pv2, fl, fl_l,
                             d->batch, j.cq, d->heads, d->dv, d->seqlen_q, j.layout, dt, use_tol, atol, rtol,
                             d->batch * d->heads * d->seqlen_q, numel4(d->batch, d->seqlen_q, d->heads, d->dv),
                             row_off};
    rc = mpi_check_judge(&ci);
    if (mpi_rank == 0 && rc != CLI_EXIT_USAGE)
        printf("  reference (float64%s) and baseline over %d ranks, layout %s: %.1f ms\n",
               pv2 ? ", with the P^2 pass" : "", mpi_size, fa_ring_layout_name(j.layout), secs * 1e3);
    if (j.ring.stats && rc != CLI_EXIT_USAGE) {
        mpi_print_stats("check (reference)", &rs);
        if (pv2) mpi_print_stats("check (P^2 pass)", &ps);
    }
done:
    free(ref), free(ref_l), free(fl), free(fl_l), free(pv2), free(qr), free(kr), free(vr);
    job_free(&j);
    return rc;
}
