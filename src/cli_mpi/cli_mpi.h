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
int mpi_check_judge(const fa_tensor *test, const fa_tensor *test_lse, const double *ref, const double *ref_lse,
                    const float *fl, const float *fl_lse, int64_t n_o, int64_t n_l, fa_dtype dt, int use_tol,
                    double atol, double rtol, int64_t rows_total, int64_t elems_total);
int mpi_check_dtype_default(const mpi_dims *d, fa_dtype *dt);

#endif /* FA_CLI_MPI_H */
