/*
 * context.h — fa_context internals: the pinned kernel table, the default
 * thread count, and the scratch arena reused across calls.
 *
 * The arena is a bump allocator over one buffer. A call takes it with
 * fa_arena_begin (a try-lock: a context used by two threads at once gives
 * the arena to one, the other allocates as usual), allocations bump an
 * atomic offset (any thread of the call), fa_arena_free is a no-op for
 * arena memory, and fa_arena_end grows the buffer to the call's high-water
 * mark, so the next call of the same shape allocates nothing.
 */
#ifndef FA_CONTEXT_H
#define FA_CONTEXT_H

#include <stddef.h>

#include "flashattn.h"
#include "problem.h"

struct fa_kernels;
typedef struct fa_arena fa_arena;

/* For fa_resolve. */
int fa_context_threads_(const fa_context *ctx);
const struct fa_kernels *fa_context_kernels_(const fa_context *ctx);

/* The context's arena for one call, or NULL (no context, or busy). */
fa_arena *fa_arena_begin(const fa_context *ctx);
void fa_arena_end(fa_arena *a);

/* Scratch for problem p: from its arena when it has one, else fa_malloc. */
void *fa_scratch_alloc(const fa_problem *p, size_t bytes);
void fa_scratch_free(const fa_problem *p, void *ptr);

#endif /* FA_CONTEXT_H */
