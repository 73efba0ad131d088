/*
 * alloc.c — 64-byte aligned allocations, counted (current, peak, number).
 */
#include "alloc.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "flashattn.h"

/* Each block carries its size in a 64-byte header so fa_free can un-count it. */
#define FA_ALLOC_HEADER 64

static atomic_size_t fa_alloc_current;
static atomic_size_t fa_alloc_peak;
static atomic_size_t fa_alloc_count;

void *fa_malloc(size_t bytes)
{
    if (bytes > SIZE_MAX - FA_ALLOC_HEADER) return NULL;
    void *raw = NULL;
    if (posix_memalign(&raw, 64, bytes + FA_ALLOC_HEADER) != 0) return NULL;
    *(size_t *)raw = bytes;
    size_t now = atomic_fetch_add(&fa_alloc_current, bytes) + bytes;
    size_t peak = atomic_load(&fa_alloc_peak);
    while (now > peak && !atomic_compare_exchange_weak(&fa_alloc_peak, &peak, now)) {
    }
    atomic_fetch_add(&fa_alloc_count, 1);
    return (char *)raw + FA_ALLOC_HEADER;
}

void *fa_calloc(size_t bytes)
{
    void *p = fa_malloc(bytes);
    if (p) memset(p, 0, bytes);
    return p;
}

void fa_free(void *ptr)
{
    if (!ptr) return;
    char *raw = (char *)ptr - FA_ALLOC_HEADER;
    atomic_fetch_sub(&fa_alloc_current, *(size_t *)raw);
    free(raw);
}

void fa_alloc_stats_get(fa_alloc_stats *stats)
{
    if (!stats) return;
    stats->current_bytes = atomic_load(&fa_alloc_current);
    stats->peak_bytes = atomic_load(&fa_alloc_peak);
    stats->total_allocs = atomic_load(&fa_alloc_count);
}

void fa_alloc_stats_reset(void)
{
    atomic_store(&fa_alloc_peak, atomic_load(&fa_alloc_current));
    atomic_store(&fa_alloc_count, 0);
}
