/*
 * ab_common.h — the pieces tools/ab_time.c, tools/ab_chunk.c and tools/ab_decode.c share: a
 * monotonic clock, a double comparator for qsort (medians), float -> bfloat16 / binary16 bits
 * (round to nearest even; finite inputs), bfloat16 bits -> float, one step of the inputs' LCG
 * as a uniform value in [-1, 1), and a BSHD tensor of such values. Header-only so that each
 * tool still builds from one source file against any revision's libflashattn.a
 * (tools/ab_trees.sh, tools/ab_revisions.sh).
 */
#ifndef FA_AB_COMMON_H
#define FA_AB_COMMON_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "flashattn.h"

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

/* A [1][n][h][d] BSHD tensor of the dtype, values ab_uniform's (rounded to the dtype);
 * the caller frees the returned buffer. Exits with 2 when memory or the tensor fails. */
static inline void *ab_make_tensor(fa_tensor *t, fa_dtype dt, int64_t n, int64_t h, int64_t d, uint64_t *rng)
{
    const size_t count = (size_t)(n * h * d), es = dt == FA_F32 ? 4 : 2;
    void *p = malloc(count * es);
    if (!p) exit(2);
    for (size_t i = 0; i < count; i++) {
        const float x = ab_uniform(rng);
        if (dt == FA_F32) ((float *)p)[i] = x;
        else ((uint16_t *)p)[i] = dt == FA_BF16 ? ab_to_bf16(x) : ab_to_f16(x);
    }
    const int64_t shape[4] = {1, n, h, d};
    if (fa_tensor_make(t, p, dt, 4, shape, NULL) != FA_OK) exit(2);
    return p;
}

#endif
