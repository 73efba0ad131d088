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
 * loop has for `threads` threads (row_block: the kernel table's): `blk` itself when there are at least
 * FA_TASKS_PER_THREAD per thread; else each block is cut into pieces of a
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
/*
 * The leading dimension of a packed tile whose rows a kernel walks down (flash.c's Kt
 * [d][ldk] and V [bc][ldv]): x rounded up to 16 floats, plus
 * one 64-byte line when the stride would be a multiple of 8 lines. qk walks down a
 * 32-column panel of Kt (d rows, one stride apart) for every row block, pv down a
 * [128][32] sub-panel of V. With a stride of 8k lines those rows fall into at most 8 line
 * pairs of a 64-set L1 (ldk = 512 floats, 2 KiB: a d = 64 panel's 128 lines in 4 sets of
 * 12 ways; ldv = 128: a sub-panel's 256 lines in 16 sets) and evict each other, so every
 * row block re-reads its panel from L2; one more line spreads them over every set. Other
 * strides already spread a panel over 32 sets or more (ldk = 416: 26 lines; 320: 20) and
 * are left alone, so packed memory does not grow for nothing (dv = 64 stays 64).
 * Measured with bench_kernels (one core, AVX-512, tiles in L2): qk at ldk = 512 84-86% ->
 * 90-93% of the FMA loop, pv at dv = 128 85% -> 91-92%, the qk+softmax+pv chain at
 * d = 128 188-190 -> 200-204 GFLOP/s (docs/performance.md, "Leading dimensions"). Padding
 * columns are never read (qk reads Kt up to bc rounded to 16) and no result depends on a
 * leading dimension, so the bits do not move. (backward.c keeps plain round16: the same
 * rule there measured 0.97-1.04x at 2 threads, no gain; docs/performance.md.)
 */
static inline size_t fa_ld_spread(size_t x)
{
    const size_t r = (x + 15) & ~(size_t)15;
    return (r / 16) % 8 == 0 ? r + 16 : r;
}

static inline int fa_even_block(int64_t n, int blk, int row_block)
{
    if (blk < 1 || n <= blk) return blk;
    const int rb = row_block > 0 ? row_block : 1;
    const int64_t nb = (n - 1) / blk + 1;
    int64_t even = (n - 1) / nb + 1;
    even = (even + rb - 1) / rb * rb;
    return even < blk ? (int)even : blk;
}

#define FA_TASKS_PER_THREAD 8
static inline int fa_piece_rows(int64_t tasks, int threads, int blk, int row_block)
{
    const int64_t want = (int64_t)FA_TASKS_PER_THREAD * threads;
    if (threads <= 1 || tasks < 1 || tasks >= want) return blk;
    const int rb = row_block > 0 ? row_block : 8;
    const int64_t k = (want + tasks - 1) / tasks;
    int64_t piece = (blk + k - 1) / k;
    piece = (piece + rb - 1) / rb * rb;
    if (piece < 4 * rb) piece = 4 * rb;
    return piece < blk ? (int)piece : blk;
}

/* ------------------------------------------------------------------------ */
/* Implementations                                                           */
/* ------------------------------------------------------------------------ */

fa_status fa_reference_forward(const fa_problem *p);
fa_status fa_standard_forward(const fa_problem *p);
fa_status fa_flash_forward(const fa_problem *p);

/* Backward (backward.c). The problem's o/lse hold O and LSE (never NULL
 * here: fa_backward recomputes them when the caller passes none); dout, dq,
 * dk, dv are checked against it by fa_backward. */
fa_status fa_reference_backward(const fa_problem *p, const fa_tensor *dout, const fa_tensor *dq,
                                const fa_tensor *dk, const fa_tensor *dv);
fa_status fa_flash_backward(const fa_problem *p, const fa_tensor *dout, const fa_tensor *dq,
                            const fa_tensor *dk, const fa_tensor *dv);

/* Scratch bytes each one will allocate. */
size_t fa_reference_workspace(const fa_problem *p);
size_t fa_standard_workspace(const fa_problem *p);
size_t fa_flash_workspace(const fa_problem *p);

#endif /* FA_INTERNAL_H */
