/*
 * alloc.h — the counting allocator every library buffer goes through, so
 * tests can assert memory ceilings (fa_alloc_stats_get).
 */
#ifndef FA_ALLOC_H
#define FA_ALLOC_H

#include <stddef.h>

/* 64-byte aligned, counted allocation. NULL on failure (and for SIZE_MAX). */
void *fa_malloc(size_t bytes);
void *fa_calloc(size_t bytes);
void fa_free(void *ptr);

/* Sizes that saturate instead of wrapping: a zero-stride view can describe
 * ~2^62 elements with little memory behind it, and a wrapped size would
 * allocate a small buffer that the loops then overrun. SIZE_MAX makes
 * fa_malloc fail. */
static inline size_t fa_mul_sat(size_t a, size_t b)
{
    return b != 0 && a > (size_t)-1 / b ? (size_t)-1 : a * b;
}
static inline size_t fa_add_sat(size_t a, size_t b) { return a > (size_t)-1 - b ? (size_t)-1 : a + b; }

#endif /* FA_ALLOC_H */
