/*
 * main.c — `flashattn-mpi`: the flashattn commands over MPI ranks (ring attention).
 *
 *   mpirun -np P build/flashattn-mpi run   -q Q.npy -k K.npy -v V.npy -o O.npy [--lse LSE.npy] ...
 *   mpirun -np P build/flashattn-mpi grad  -q ... --dout DO.npy --dq DQ.npy --dk DK.npy --dv DV.npy ...
 *   mpirun -np P build/flashattn-mpi check -q ... --out O_TEST.npy [--lse LSE_TEST.npy] ...
 *
 * The same flags and .npy files as `flashattn` (src/cli's parsing and file
 * layer, linked, not copied), plus --layout and --stats. Rank 0 parses, checks
 * the outputs, reads the files and scatters each rank's shard (fa_ring_global_row);
 * the ring (src/mpi) computes; rank 0 gathers and writes, all outputs or none.
 * Every rank parses the same argv (only rank 0 prints), and every decision
 * (bad usage, bad file, a failed call) is shared before anyone goes on, so bad
 * input ends every rank with status 2 and ONE message, never a hang.
 * Rank 0 holds whole arrays while reading and writing (O(N) there); every
 * other rank holds O(N/P).
 */
#include "cli.h"
#include "cli_mpi.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int mpi_rank, mpi_size;

/* ------------------------------------------------------------------------ */
/* Only rank 0 speaks                                                        */
/* ------------------------------------------------------------------------ */

static int saved_out = -1, saved_err = -1;

void mpi_quiet_begin(void)
{
    if (mpi_rank == 0 || saved_err >= 0) return;
    fflush(stdout);
    fflush(stderr);
    saved_out = dup(1);
    saved_err = dup(2);
    const int n = open("/dev/null", O_WRONLY);
    if (n >= 0) {
        dup2(n, 1);
        dup2(n, 2);
        close(n);
    }
}

void mpi_quiet_end(void)
{
    if (saved_err < 0) return;
    fflush(stdout);
    fflush(stderr);
    dup2(saved_out, 1);
    dup2(saved_err, 2);
    close(saved_out);
    close(saved_err);
    saved_out = saved_err = -1;
}

int mpi_share_rc(int rc)
{
    MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD);
    return rc;
}

int mpi_any(int flag)
{
    int all = flag;
    MPI_Allreduce(&flag, &all, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    return all;
}

int mpi_agree_rc(int rc)
{
    const int all = mpi_any(rc);
    if (all && !rc && mpi_rank == 0)
        cli_die("another rank refused its arguments (every rank must be given the same options)");
    return all;
}

int mpi_die_ring(fa_status st)
{
    if (mpi_rank == 0) {
        const char *m = fa_ring_last_error();
        cli_die("%s", m && *m ? m : fa_status_string(st));
    }
    return CLI_EXIT_USAGE;
}

/* ------------------------------------------------------------------------ */
/* Rows to and from rank 0                                                   */
/* ------------------------------------------------------------------------ */

enum { PIECE = 1 << 30 };

static void send_big(const void *p, size_t bytes, int to)
{
    for (size_t off = 0; off < bytes; off += PIECE)
        MPI_Send((const char *)p + off, (int)(bytes - off < PIECE ? bytes - off : PIECE), MPI_BYTE, to, 7,
                 MPI_COMM_WORLD);
}

static void recv_big(void *p, size_t bytes, int from)
{
    for (size_t off = 0; off < bytes; off += PIECE)
        MPI_Recv((char *)p + off, (int)(bytes - off < PIECE ? bytes - off : PIECE), MPI_BYTE, from, 7,
                 MPI_COMM_WORLD, MPI_STATUS_IGNORE);
}

/* Copy rank r's rows of a [outer][S][row] array into a [outer][S/P][row] shard (to_shard) or back. */
static void move_rows(char *full, char *shard, int64_t outer, int64_t S, size_t row, int r, fa_ring_layout L,
                      int to_shard)
{
    const int64_t c = S / mpi_size;
    for (int64_t a = 0; a < outer; a++)
        for (int64_t i = 0; i < c; i++) {
            char *f = full + ((size_t)(a * S + fa_ring_global_row(S, mpi_size, r, L, i))) * row;
            char *s = shard + (size_t)(a * c + i) * row;
            if (to_shard)
                memcpy(s, f, row);
            else
                memcpy(f, s, row);
        }
}

int mpi_scatter_rows(const void *full, void *mine, int64_t outer, int64_t S, size_t row, fa_ring_layout L)
{
    const size_t bytes = (size_t)(outer * (S / mpi_size)) * row;
    int ok = 1;
    if (mpi_rank == 0) {
        char *buf = malloc(bytes ? bytes : 1);
        ok = buf != NULL;
        MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
        if (!ok) return cli_die("out of memory for a shard (%zu bytes)", bytes);
        for (int r = 1; r < mpi_size; r++) {
            move_rows((char *)full, buf, outer, S, row, r, L, 1);
            send_big(buf, bytes, r);
        }
        move_rows((char *)full, mine, outer, S, row, 0, L, 1);
        free(buf);
    } else {
        MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
        if (!ok) return CLI_EXIT_USAGE;
        recv_big(mine, bytes, 0);
    }
    return 0;
}

int mpi_gather_rows(void *full, const void *mine, int64_t outer, int64_t S, size_t row, fa_ring_layout L)
{
    const size_t bytes = (size_t)(outer * (S / mpi_size)) * row;
    int ok = 1;
    if (mpi_rank == 0) {
        char *buf = malloc(bytes ? bytes : 1);
        ok = buf != NULL;
        MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
        if (!ok) return cli_die("out of memory for a shard (%zu bytes)", bytes);
        move_rows((char *)full, (char *)mine, outer, S, row, 0, L, 0);
        for (int r = 1; r < mpi_size; r++) {
            recv_big(buf, bytes, r);
            move_rows((char *)full, buf, outer, S, row, r, L, 0);
        }
        free(buf);
    } else {
        MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
        if (!ok) return CLI_EXIT_USAGE;
        send_big(mine, bytes, 0);
    }
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Shared options                                                            */
/* ------------------------------------------------------------------------ */

int mpi_parse_ring_option(int argc, char **argv, int *i, mpi_ring_opts *r)
{
    const char *text = NULL;
    int got;
    if (strcmp(argv[*i], "--stats") == 0) {
        r->stats = 1;
        return 1;
    }
    if ((got = cli_opt_value(argc, argv, i, "--layout", &text)) != 0) {
        if (got < 0) return -1;
        if (fa_ring_layout_from_name(text, &r->layout) != FA_OK) {
            cli_die("--layout: expected contiguous, zigzag or auto, got '%s'", text);
            return -1;
        }
        return 1;
    }
    return 0;
}

const char mpi_ring_help[] =
    "Ring options (flashattn-mpi only):\n"
    "  --layout L         contiguous (rank r holds rows [r N/P, (r+1) N/P)), zigzag (2P chunks;\n"
    "                     rank r holds chunks r and 2P-1-r: balances causal work) or auto\n"
    "                     (default: zigzag when --causal or --window is given, else contiguous)\n"
    "  --stats            print each rank's bytes sent, blocks computed and seconds\n"
    "Not over the ring: --alibi, --sinks, dropout, rotary, varlen and KV-cache options, --dtype-out f16/bf16.\n";

/* Dims of the loaded problem, rank 0 -> every rank. */
void mpi_share_dims(mpi_dims *d)
{
    MPI_Bcast(d, (int)sizeof *d, MPI_BYTE, 0, MPI_COMM_WORLD);
}

void mpi_print_stats(const char *what, const fa_ring_stats *s)
{
    fa_ring_stats *all = mpi_rank == 0 ? calloc((size_t)mpi_size, sizeof *all) : NULL;
    MPI_Gather(s, (int)sizeof *s, MPI_BYTE, all, (int)sizeof *s, MPI_BYTE, 0, MPI_COMM_WORLD);
    if (mpi_rank != 0 || !all) return;
    for (int r = 0; r < mpi_size; r++)
        printf("rank %d %s: layout %s, %d steps, sent %llu B (%llu B per step), received %llu B, "
               "blocks %lld computed %lld skipped, %.3g visible pairs, compute %.3f s, wait %.3f s, total %.3f s\n",
               r, what, fa_ring_layout_name(all[r].layout), all[r].steps, (unsigned long long)all[r].bytes_sent,
               (unsigned long long)all[r].step_bytes, (unsigned long long)all[r].bytes_recv,
               (long long)all[r].blocks_computed, (long long)all[r].blocks_skipped, all[r].visible_pairs,
               all[r].compute_s, all[r].wait_s, all[r].total_s);
    free(all);
}

/* ------------------------------------------------------------------------ */
/* main                                                                      */
/* ------------------------------------------------------------------------ */

static void usage(FILE *out)
{
    fprintf(out,
            "flashattn-mpi %s: exact attention over MPI ranks (ring attention)\n"
            "\n"
            "usage: mpirun -np P flashattn-mpi <command> [options]   (the flags of flashattn <command>)\n"
            "\n"
            "commands:\n"
            "  run        attention on .npy files: Q, K, V -> O (and LSE), the sequence split over the ranks\n"
            "  grad       backward pass: dO -> dQ, dK, dV over the ranks\n"
            "  check      a tested output against the float64 reference, computed over the ranks\n"
            "  bench      time the ring on generated inputs (CSV; tools/ring_bench.sh drives it)\n"
            "\n"
            "%s"
            "Exit status: 0 ok, 1 check found a mismatch, 2 bad usage or bad input (every rank).\n",
            FA_VERSION, mpi_ring_help);
}

int main(int argc, char **argv)
{
    int provided = 0;
    if (MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
        fprintf(stderr, "flashattn-mpi: MPI_Init_thread failed\n");
        return CLI_EXIT_USAGE;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &mpi_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &mpi_size);
    int rc = CLI_EXIT_USAGE;
    if (provided < MPI_THREAD_FUNNELED) {
        if (mpi_rank == 0) cli_die("this MPI library does not provide MPI_THREAD_FUNNELED (got level %d)", provided);
    } else if (argc < 2) {
        if (mpi_rank == 0) usage(stderr);
    } else if (cli_is_help(argv[1])) {
        if (mpi_rank == 0) usage(stdout);
        rc = CLI_EXIT_OK;
    } else if (strcmp(argv[1], "--version") == 0) {
        if (mpi_rank == 0) printf("flashattn-mpi %s (%d ranks)\n", fa_version(), mpi_size);
        rc = CLI_EXIT_OK;
    } else if (strcmp(argv[1], "run") == 0) {
        rc = mpi_cmd_run(argc - 1, argv + 1);
    } else if (strcmp(argv[1], "grad") == 0) {
        rc = mpi_cmd_grad(argc - 1, argv + 1);
    } else if (strcmp(argv[1], "check") == 0) {
        rc = mpi_cmd_check(argc - 1, argv + 1);
    } else if (strcmp(argv[1], "bench") == 0) {
        rc = mpi_cmd_bench(argc - 1, argv + 1);
    } else if (mpi_rank == 0) {
        cli_die("unknown command '%s' (see flashattn-mpi --help)", argv[1]);
    }
    fflush(stdout);
    MPI_Finalize();
    return rc;
}
