/*
 * amx.h — the bf16 forward on Intel AMX tiles (opt-in: FA_AMX=1). The tile code
 * is src/kernels/amx.c (built with the AMX flags, run only where the probe says
 * so); src/amx.c, built without ISA flags, decides whether it may run.
 */
#ifndef FA_AMX_H
#define FA_AMX_H

#include "problem.h"

#include <stdatomic.h>
#include <stddef.h>

#define AMX_BR 32  /* query rows per tile step: two 16-row tiles */
#define AMX_TR 128 /* query rows per task: four steps share each K/V block while it is in L1/L2 */
#define AMX_BC 128 /* keys per block: eight 16-key tiles of S, four 32-key chunks of P V (64: 8-14% slower, 256: 5-10%) */

/* Tests only: forward calls the AMX path completed (fa_amx_forward returned 1),
 * so a test can tell it ran rather than handed over to flash.c. */
extern _Atomic long fa_amx_runs;

/* 1 when this build has the AMX path and this CPU and kernel let it run. */
int fa_amx_usable(void);

/* 1 when FA_AMX=1 (p->amx), the kernel table is AVX-512's, and the problem is one the AMX
 * path computes (src/kernels/amx.c's header). */
int fa_amx_applies(const fa_problem *p);

/* Bytes of one (batch, kv head)'s packed K and V, and their leading dimensions (words). */
size_t fa_amx_packed_bytes(const fa_problem *p, size_t *ldkt, size_t *ldvv, size_t *npad);

/* Bytes of a thread's row buffer: 16 K rows gathered for the transpose, or two zero V rows. */
static inline size_t fa_amx_rows_bytes(const fa_problem *p)
{
    return 16 * (size_t)(p->d > 2 * p->dv ? p->d : 2 * p->dv) * 2;
}

/* Bytes of one thread's scratch, and the leading dimensions of its Q rows (bf16) and Õ (floats). */
size_t fa_amx_scratch_bytes(const fa_problem *p, size_t *ldq, size_t *ldo);

/* (batch, kv head) pairs packed and served together in one pass: enough that the pass has two
 * tasks per thread (a task: 128 query rows of one head), at most what the packing cap
 * (pack_max_bytes) holds, at least 1. Does not change a bit of the result. */
int64_t fa_amx_pass_pairs(const fa_problem *p);

/* Threads of the path's parallel region: no more than one pass's tasks. */
int fa_amx_threads(const fa_problem *p);

/* Bytes the AMX forward allocates (a pass's packed K/V and its threads' scratch). */
size_t fa_amx_workspace(const fa_problem *p);

/* The forward of a problem fa_amx_applies accepted: 1 when every output is
 * written; 0 when the caller must run flash.c's path instead (a non-finite
 * input, or no memory), which overwrites whatever was written. */
int fa_amx_forward(const fa_problem *p);

#endif /* FA_AMX_H */
