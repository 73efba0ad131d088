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
