/*
 * context.c — fa_context: an ISA, a thread count and a scratch arena that a
 * caller keeps across calls (a decode loop calls attention thousands of
 * times on the same shapes: with a context it stops paying malloc per call).
 */
#include "context.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "alloc.h"
#include "kernels/kernels.h"
#include "status.h"

struct fa_arena {
    pthread_mutex_t lock;
    char *base;            /* [cap] bytes, 64-byte aligned */
    size_t cap;
    atomic_size_t used;    /* bump offset within this call */
    atomic_size_t want;    /* bytes this call asked for (arena + fallbacks) */
};

struct fa_context {
    const fa_kernels *kern;
    int num_threads;
    fa_arena arena;
};

fa_status fa_context_create(fa_context **out, const char *isa, int num_threads)
{
    if (!out) return fa_fail(FA_ERR_NULL_ARG, "fa_context_create: ctx is NULL");
    *out = NULL;
    if (num_threads < 0 || num_threads > FA_MAX_THREADS)
        return fa_fail(FA_ERR_OPTION, "fa_context_create: num_threads must be in [0, %d] (got %d)", FA_MAX_THREADS,
                       num_threads);
    const fa_kernels *kern;
    fa_status st = FA_OK;
    if (isa && *isa) {
        kern = fa_kernels_by_name(isa);
        if (!kern)
            return fa_fail(FA_ERR_ISA, "fa_context_create: ISA '%s' is unknown, not built, or not supported by this CPU", isa);
    } else {
        kern = fa_kernels_get(&st);
        if (!kern) return st;
    }
    fa_context *c = fa_calloc(sizeof *c);
    if (!c) return fa_fail(FA_ERR_NOMEM, "fa_context_create: out of memory");
    c->kern = kern;
    c->num_threads = num_threads;
    pthread_mutex_init(&c->arena.lock, NULL);
    *out = c;
    return FA_OK;
}

void fa_context_destroy(fa_context *ctx)
{
    if (!ctx) return;
    pthread_mutex_destroy(&ctx->arena.lock);
    fa_free(ctx->arena.base);
    fa_free(ctx);
}

const char *fa_context_isa(const fa_context *ctx) { return ctx ? ctx->kern->name : NULL; }

size_t fa_context_arena_bytes(const fa_context *ctx) { return ctx ? ctx->arena.cap : 0; }

int fa_context_threads_(const fa_context *ctx) { return ctx->num_threads; }

const fa_kernels *fa_context_kernels_(const fa_context *ctx) { return ctx->kern; }

fa_arena *fa_arena_begin(const fa_context *ctx)
{
    if (!ctx) return NULL;
    fa_arena *a = (fa_arena *)&ctx->arena; /* the arena is the mutable part of a const context */
    if (pthread_mutex_trylock(&a->lock) != 0) return NULL;
    atomic_store(&a->used, 0);
    atomic_store(&a->want, 0);
    return a;
}

void fa_arena_end(fa_arena *a)
{
    if (!a) return;
    const size_t want = atomic_load(&a->want);
    if (want > a->cap) {
        fa_free(a->base);
        a->base = fa_malloc(want);
        a->cap = a->base ? want : 0;
    }
    pthread_mutex_unlock(&a->lock);
}

static size_t round64(size_t x) { return x > SIZE_MAX - 63 ? SIZE_MAX : (x + 63) & ~(size_t)63; }

void *fa_scratch_alloc(const fa_problem *p, size_t bytes)
{
    fa_arena *a = p->arena;
    if (!a) return fa_malloc(bytes);
    const size_t r = round64(bytes ? bytes : 1);
    if (r == SIZE_MAX) return NULL;
    const size_t off = atomic_fetch_add(&a->used, r);
    const size_t end = off > SIZE_MAX - r ? SIZE_MAX : off + r;
    size_t w = atomic_load(&a->want);
    while (end > w && !atomic_compare_exchange_weak(&a->want, &w, end)) {
    }
    if (end <= a->cap) return a->base + off;
    return fa_malloc(bytes);
}

void fa_scratch_free(const fa_problem *p, void *ptr)
{
    const fa_arena *a = p->arena;
    if (a && ptr && a->base && (char *)ptr >= a->base && (char *)ptr < a->base + a->cap) return;
    fa_free(ptr);
}
