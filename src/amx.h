/*
 * amx.h — the bf16 forward on Intel AMX tiles (src/amx.c; opt-in: FA_AMX=1).
 */
#ifndef FA_AMX_H
#define FA_AMX_H

#include "problem.h"

#include <stdatomic.h>

/* Tests only: forward calls the AMX path completed (fa_amx_forward returned 1),
 * so a test can tell it ran rather than handed over to flash.c. */
extern _Atomic long fa_amx_runs;

/* 1 when this build has the AMX path and this CPU and kernel let it run. */
int fa_amx_usable(void);

/* 1 when FA_AMX=1 and the problem is one the AMX path computes (amx.c's header). */
int fa_amx_applies(const fa_problem *p);

/* Bytes the AMX forward allocates (packed K/V and its threads' scratch). */
size_t fa_amx_workspace(const fa_problem *p);

/* The forward of a problem fa_amx_applies accepted: 1 when every output is
 * written; 0 when the caller must run flash.c's path instead (a non-finite
 * input, or no memory), which overwrites whatever was written. */
int fa_amx_forward(const fa_problem *p);

#endif /* FA_AMX_H */
