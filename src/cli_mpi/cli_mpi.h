/*
 * cli_mpi.h — what the flashattn-mpi commands share (main.c): rank 0 speaks,
 * decisions are broadcast, rows are scattered from and gathered to rank 0.
 */
#ifndef FA_CLI_MPI_H
#define FA_CLI_MPI_H

#include "cli.h"
#include "flashattn_mpi.h"

extern int mpi_rank, mpi_size;

/* Silence stdout/stderr on ranks other than 0 (parsing prints the same on every rank). */
void mpi_quiet_begin(void);
void mpi_quiet_end(void);

/* rank 0's exit status, on every rank. */
int mpi_share_rc(int rc);
/* After parsing: the largest status (or help flag) of every rank, so that a rank
 * given other arguments (an MPMD launch) stops every rank instead of leaving them
 * waiting. mpi_agree_rc prints one line on rank 0 when only another rank failed. */
int mpi_agree_rc(int rc);
int mpi_any(int flag);

/* Rank 0 prints the ring's message (the same on every rank); returns 2. */
int mpi_die_ring(fa_status st);

/* Rows of a [outer][S][row bytes] array on rank 0 <-> each rank's [outer][S/P][row] shard in layout L.
 * Collective; returns 0 or 2 (on every rank). */
int mpi_scatter_rows(const void *full, void *mine, int64_t outer, int64_t S, size_t row, fa_ring_layout L);
int mpi_gather_rows(void *full, const void *mine, int64_t outer, int64_t S, size_t row, fa_ring_layout L);

typedef struct mpi_ring_opts {
    fa_ring_layout layout;
    int stats;
} mpi_ring_opts;

/* --layout L, --stats at argv[*i]: 1 consumed, 0 not ours, -1 error (printed). */
int mpi_parse_ring_option(int argc, char **argv, int *i, mpi_ring_opts *r);
extern const char mpi_ring_help[];

/* The problem's geometry and dtypes, loaded on rank 0. */
typedef struct mpi_dims {
    int64_t batch, seqlen_q, seqlen_k, heads, heads_k, d, dv;
    int q_dtype, k_dtype, v_dtype, extra_dtype; /* extra: dO (grad) or O_TEST (check) */
    int extra_lse_dtype;                        /* check: LSE_TEST's dtype, -1 when none */
} mpi_dims;
void mpi_share_dims(mpi_dims *d);

/* Every rank's stats, printed by rank 0 in rank order. Collective. */
void mpi_print_stats(const char *what, const fa_ring_stats *s);

int mpi_cmd_run(int argc, char **argv);
int mpi_cmd_grad(int argc, char **argv);
int mpi_cmd_check(int argc, char **argv);
int mpi_cmd_bench(int argc, char **argv);

/* check (cmd_mpi.c parses and loads, cmd_mpi_check.c judges) */
int mpi_check_main(int argc, char **argv, const char *usage);
/* What the judge reads: this rank's rows of the test, the float64 reference, the float32
 * baseline (and sum_j P_j^2 v_jc^2 per element for the bf16/f16 rules, or NULL). */
typedef struct mpi_check_in {
    const fa_tensor *test, *test_lse;     /* test_lse: NULL when none */
    const double *ref, *ref_lse, *pv2;    /* pv2: NULL = no P-rounding allowance, no row rule */
    const float *fl, *fl_lse;
    int64_t batch, cq, heads, dv, seqlen_q; /* cq: this rank's query rows; seqlen_q: global */
    fa_ring_layout layout;
    fa_dtype dt;
    int use_tol;
    double atol, rtol;
    int64_t rows_total, elems_total;
    const char *row_rule_off; /* bf16/f16 without pv2: why (printed) */
} mpi_check_in;
int mpi_check_judge(const mpi_check_in *in);
/* Rank 0: 0 when every element of `a` (4-d) is finite in dt, else one line naming `path` and the
 * element (as flashattn check's refusal) and 2. */
int mpi_check_emulable(const fa_npy *a, const char *path, fa_dtype dt);
/* A bf16/f16 kernel's view of an input shard: `out` = `in` when it already has dtype dt, else
 * a float32 copy (*buf, to free) rounded to dt. 0, or -1 out of memory. */
int mpi_check_round_input(const fa_tensor *in, fa_dtype dt, float **buf, fa_tensor *out);
/* sum_j P_ij^2 v_jc^2 for every element of this rank's rows (pv2, [B][cq][H][dv], float64),
 * from a second float64 ring pass with every score doubled over V^2; ref_lse: the reference's
 * LSE [B][H][cq]. Collective; 0, or 2 on every rank (rank 0 printed why). */
int mpi_check_p2(fa_ring_layout layout, const fa_tensor *q, const fa_tensor *k, const fa_tensor *v,
                 const fa_options *ref_opt, const double *ref_lse, double *pv2, fa_ring_stats *stats);
int mpi_check_dtype_default(const mpi_dims *d, fa_dtype *dt);

#endif /* FA_CLI_MPI_H */
