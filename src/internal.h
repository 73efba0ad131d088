/*
 * internal.h — what the implementations share, never installed.
 *
 * The layers, top to bottom (a file only calls into layers below it):
 *
 *   api.c                        entry points: resolve once, run one implementation
 *   reference.c standard.c       implementations (forward)
 *   flash.c backward.c           implementations (forward, backward)
 *   validate.c                   fa_check (an implementation of checking)
 *   pack.c                       the one packer: rows and transposed panels of a KV source
 *   problem.c                    the one validator: arguments + options -> fa_problem
 *   context.c                    fa_context and its scratch arena
 *   cpuinfo.c                    detected caches
 *   config.c                     environment (read once, strictly), threads
 *   kernels/                     micro-kernel tables and their dispatch
 *   tensor.c mask.h transform.c  element access and conversion; mask band, ALiBi, score transforms
 *   alloc.c status.c             the counting allocator; errors as values
 *
 * This header gathers the shared ones for the implementation files.
 */
#ifndef FA_INTERNAL_H
#define FA_INTERNAL_H

#include "flashattn.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "alloc.h"
#include "config.h"
#include "context.h"
#include "mask.h"
#include "problem.h"
#include "status.h"
#include "tensor.h"

/* Threads for a parallel loop of `tasks` tasks: never more than the tasks. */
static inline int fa_threads_for(const fa_problem *p, int64_t tasks)
{
    if (tasks < 1) return 1;
    return tasks < p->num_threads ? (int)tasks : p->num_threads;
}

/*
 * Rows (or keys) per task when `tasks` blocks of `blk` rows are all a parallel
 * loop has for `threads` threads (row_block: the kernel table's): `blk` itself
 * when there are at least FA_TASKS_PER_THREAD per thread (FA_TASKS_PER_THREAD_FEW
 * on a few threads; see fa_piece_rows); else each block is cut into pieces of a
 * multiple of the kernel's row block (at least 4 row blocks) so that about that
 * many exist. With 20-30 blocks per packing pass and 16 threads, whole blocks
 * leave a second round in which most threads wait at the pass's barrier.
 * The bits cannot change: every kernel computes each row (each key line in
 * the backward pass) on its own, in an order that depends on the key blocks
 * only, and a piece that skips a key block its rows cannot see skips exact
 * no-ops (alpha = 1, P = 0). tests/test_determinism.c checks it on every ISA.
 */
/*
 * Rows per block when n rows go in blocks of at most `blk` rows, spread
 * evenly: the same number of blocks, ceil(n / blk), each a multiple of
 * `row_block` rows (the kernels' register block), none larger than blk, so the
 * last one is not a sliver (n = 1024, blk = 204, row_block 6: 174, the last
 * block 154 rows, not 4). blk itself when n <= blk or nothing smaller fits.
 */
static inline int fa_even_block(int64_t n, int blk, int row_block)
{
    if (blk < 1 || n <= blk) return blk;
    const int rb = row_block > 0 ? row_block : 1;
    const int64_t nb = (n - 1) / blk + 1;
    int64_t even = (n - 1) / nb + 1;
    even = (even + rb - 1) / rb * rb;
    return even < blk ? (int)even : blk;
}

/*
 * How many tasks a thread should have before blocks are left whole: 8 on many
 * threads (16-thread device host: 1.09-1.16x over whole blocks at N = 1024,
 * 16 per thread no better), 4 on up to FA_FEW_THREADS (2 threads: a piece
 * re-streams its block's K/V for fewer rows, and cutting 6 blocks a thread
 * into 12 pieces cost 5-6% at N = 1024, d = 128 and 2% at N = 2048, causal or
 * not, against nothing gained on the other rows; docs/performance.md). Between
 * 5 and 15 threads 8 is kept, not measured.
 */
#define FA_TASKS_PER_THREAD 8
#define FA_TASKS_PER_THREAD_FEW 4
#define FA_FEW_THREADS 4
static inline int fa_piece_rows(int64_t tasks, int threads, int blk, int row_block)
{
    const int per = threads <= FA_FEW_THREADS ? FA_TASKS_PER_THREAD_FEW : FA_TASKS_PER_THREAD;
    const int64_t want = (int64_t)per * threads;
    if (threads <= 1 || tasks < 1 || tasks >= want) return blk;
    const int rb = row_block > 0 ? row_block : 8;
    const int64_t k = (want + tasks - 1) / tasks;
    int64_t piece = (blk + k - 1) / k;
    piece = (piece + rb - 1) / rb * rb;
    if (piece < 4 * rb) piece = 4 * rb;
    return piece < blk ? (int)piece : blk;
}

/*
 * The caller's progress hook (fa_options::progress), run after a task by thread 0
 * of the team only — OpenMP makes the thread that opens a parallel region its
 * thread 0, nested or not, so this is the thread that made the call, and an
 * MPI_THREAD_FUNNELED rank's transfers advance on its main thread while the
 * other threads compute. Only in the dynamically scheduled task loops: in a
 * static loop (packing) the other threads would wait for the burst at its
 * barrier.
 */
static inline void fa_progress(const fa_problem *p)
{
    if (!p->progress) return;
#ifdef _OPENMP
    if (omp_get_thread_num() != 0) return;
#endif
    p->progress(p->progress_arg);
}

/* ------------------------------------------------------------------------ */
/* Implementations                                                           */
/* ------------------------------------------------------------------------ */

fa_status fa_reference_forward(const fa_problem *p);
fa_status fa_standard_forward(const fa_problem *p);
fa_status fa_flash_forward(const fa_problem *p);
/* Rows per strip of a whole br x bc tile (flash.c, strip_rows): setting is
 * FA_STRIP_ROWS's (-1 unset: from L1d, 0 whole tiles, N rows); br when whole. */
int fa_strip_rows_for(const struct fa_kernels *kern, int setting, int br, int bc);
/* The same without the decode and AMX paths (the backward's recompute of O and LSE). */
fa_status fa_flash_forward_for_backward(const fa_problem *p);

/* Backward (backward.c). The problem's o/lse hold O and LSE (never NULL
 * here: fa_backward recomputes them when the caller passes none); dout, dq,
 * dk, dv are checked against it by fa_backward. */
fa_status fa_reference_backward(const fa_problem *p, const fa_tensor *dout, const fa_tensor *dq,
                                const fa_tensor *dk, const fa_tensor *dv);
/* A plain backward in bf16 or f16 (autograd's rounding points; backward.c): check-grad's baseline.
 * dsinks: NULL, or the sinks' gradient [heads] (p->sinks set), written. */
fa_status fa_emulated_backward(const fa_problem *p, fa_dtype dt, const fa_tensor *dout, const fa_tensor *dq,
                               const fa_tensor *dk, const fa_tensor *dv, const fa_tensor *dsinks);
fa_status fa_flash_backward(const fa_problem *p, const fa_tensor *dout, const fa_tensor *dq,
                            const fa_tensor *dk, const fa_tensor *dv);

/* Scratch bytes each one will allocate. */
size_t fa_reference_workspace(const fa_problem *p);
size_t fa_standard_workspace(const fa_problem *p);
size_t fa_flash_workspace(const fa_problem *p);

#endif /* FA_INTERNAL_H */
