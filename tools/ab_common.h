/*
 * ab_common.h — the pieces tools/ab_time.c and tools/ab_decode.c share: a monotonic clock,
 * a double comparator for qsort (medians), float -> bfloat16 / binary16 bits (round to
 * nearest even; finite inputs), bfloat16 bits -> float, and one step of the inputs' LCG as
 * a uniform value in [-1, 1). Header-only so that each tool still builds from one source file
 * against any revision's libflashattn.a (tools/ab_trees.sh, tools/ab_revisions.sh).
 */
#ifndef FA_AB_COMMON_H
#define FA_AB_COMMON_H

#include <stdint.h>
#include <string.h>
#include <time.h>

static inline double ab_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline int ab_cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static inline uint16_t ab_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static inline uint16_t ab_to_f16(float f)
{
    const _Float16 h = (_Float16)f;
    uint16_t u;
    memcpy(&u, &h, 2);
    return u;
}

static inline float ab_bf16_value(uint16_t h)
{
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* The next value of the inputs' generator, uniform in [-1, 1) (never all zeros). */
static inline float ab_uniform(uint64_t *rng)
{
    *rng = *rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(*rng >> 40) * 0x1.0p-24 * 2.0 - 1.0);
}

#endif
