/*
 * cachesim.h — a deterministic two-level data-cache simulator for the tutorials.
 *
 * Design: the tutorials want cache-miss counts that are the same on every
 * machine, in CI, and under a debugger, so they feed every array access of a
 * kernel (inputs, outputs, the score tile, the row statistics) to this model
 * instead of (or beside) hardware counters. The model is deliberately the one
 * valgrind's cachegrind implements, so that `make cachegrind STEP=NN` can
 * cross-check it:
 *
 *   - L1 and L2 are set-associative with true LRU replacement; the set of a
 *     line is (address / line) mod sets, plain bit selection, so the number of
 *     sets must be a power of two;
 *   - write-allocate: a write miss loads the line like a read miss does;
 *   - L2 is looked up only on an L1 miss (no back-invalidation, no prefetch);
 *   - an access that straddles two lines touches both, but counts as ONE
 *     access, and as ONE miss if either line missed (cachegrind's rule).
 *
 * Beyond cachegrind, the model keeps a dirty bit per line so that it can also
 * report write-backs: slow-tier traffic = (misses + write-backs) x line bytes,
 * which is what the IO-complexity step compares with the paper's bounds.
 * Write-backs never change hit/miss behaviour (an evicted dirty L1 line marks
 * its L2 copy dirty without touching L2's LRU order), so miss counts still
 * match cachegrind's.
 */
#ifndef TUT_CACHESIM_H
#define TUT_CACHESIM_H

#include <stddef.h>
#include <stdint.h>

/* Geometry of one cache level. size = sets * ways * line_bytes. */
typedef struct cachesim_level {
    size_t size_bytes;   /* total capacity */
    int ways;            /* associativity */
    int line_bytes;      /* line (block) size, a power of two */
} cachesim_level;

/* Geometry of the whole hierarchy, with a name for tables ("detected", "teaching"). */
typedef struct cachesim_config {
    cachesim_level l1;
    cachesim_level l2;   /* size_bytes == 0 disables L2 */
    char name[32];
} cachesim_config;

/* Counters of one level. An access is one load or store (a straddling one counts once). */
typedef struct cachesim_stats {
    uint64_t reads, writes;            /* accesses seen by this level */
    uint64_t read_misses, write_misses;
    uint64_t fills;                    /* lines loaded from the tier below (>= misses: straddles) */
    uint64_t writebacks;               /* dirty lines evicted towards the next tier */
} cachesim_stats;

typedef struct cachesim cachesim;

/* The fixed "teaching" geometry: L1 32 KiB 8-way, L2 256 KiB 8-way, 64-byte lines. */
cachesim_config cachesim_config_teaching(void);

/*
 * Parse a geometry: "teaching", or "L1SIZE,WAYS,LINE[:L2SIZE,WAYS,LINE]" with
 * sizes in bytes or with a K/M suffix (e.g. "48K,12,64:1M,16,64").
 * Returns 0 on success, -1 (with *err set to a message) otherwise.
 */
int cachesim_config_parse(const char *spec, cachesim_config *cfg, const char **err);

/* Check that a geometry is one both this model and cachegrind accept. 0 = ok. */
int cachesim_config_check(const cachesim_config *cfg, const char **err);

/* Create a simulator with cold caches; NULL on a bad geometry or no memory. */
cachesim *cachesim_create(const cachesim_config *cfg);
void cachesim_free(cachesim *cs);

/* Empty both levels and zero all counters ("cold caches"). */
void cachesim_reset(cachesim *cs);

/* Simulate one access of `bytes` bytes at `addr`; is_write selects the counter. */
void cachesim_access(cachesim *cs, const void *addr, size_t bytes, int is_write);

/* Counters of level 1 or 2. */
void cachesim_get_stats(const cachesim *cs, int level, cachesim_stats *st);

/* Convenience totals. */
uint64_t cachesim_misses(const cachesim *cs, int level);      /* read + write misses */
uint64_t cachesim_accesses(const cachesim *cs, int level);    /* reads + writes */
/* Bytes moved between `level` and the tier below it: (line fills + write-backs) x line. */
uint64_t cachesim_traffic_bytes(const cachesim *cs, int level);

/* The geometry the simulator was created with. */
const cachesim_config *cachesim_get_config(const cachesim *cs);

/* "48K,12,64:1M,16,64" — the geometry in the form cachesim_config_parse reads. */
void cachesim_config_format(const cachesim_config *cfg, char *buf, size_t len);

#endif /* TUT_CACHESIM_H */
