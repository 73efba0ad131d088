/*
 * internal.h — what the implementations share, never installed.
 *
 * The public API (api.c) validates a request once and turns it into an
 * fa_problem: plain integers, the mask folded into a [window_left,
 * window_right] band, the scale resolved. Implementations (reference.c,
 * standard.c, flash.c) receive only checked problems and never re-validate.
 *
 * Indexing convention, used everywhere:
 *   Q: [B][Sq][H][d]     element (b, i, h, c)  at  q->data + b*st0 + i*st1 + h*st2 + c*st3
 *   K: [B][Sk][Hk][d]    V: [B][Sk][Hk][dv]    O: [B][Sq][H][dv]    LSE: [B][H][Sq]
 * Strides are in elements and may be anything (BSHD, BHSD, ...).
 */
#ifndef FA_INTERNAL_H
#define FA_INTERNAL_H

#include "flashattn.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* The checked problem                                                       */
/* ------------------------------------------------------------------------ */

typedef struct fa_problem {
    int64_t batch, seqlen_q, seqlen_k, heads, heads_k, d, dv;
    fa_tensor q, k, v, o;        /* copies of the caller's descriptors */
    fa_tensor lse;               /* lse.data == NULL when not requested */
    double scale;                /* resolved (never 0 unless the caller asked 0... see api.c) */
    int64_t window_left;         /* < 0: unbounded */
    int64_t window_right;        /* < 0: unbounded; causal folded in as 0 */
    double softcap;              /* 0: off */
    fa_tensor alibi;             /* alibi.data == NULL when off; rank 1 [H] or rank 2 [B][H] */
    int num_threads;             /* resolved: >= 1 */
    int block_q, block_k;        /* flash blocks (resolved by api.c) */
    size_t standard_max_bytes;   /* resolved cap */
} fa_problem;

/* Offset of element (i0, i1, i2, i3) of a rank-4 tensor. */
static inline int64_t fa_off4(const fa_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3)
{
    return i0 * t->stride[0] + i1 * t->stride[1] + i2 * t->stride[2] + i3 * t->stride[3];
}

/* Offset of LSE element (b, h, i) of LSE [B][H][Sq]. */
static inline int64_t fa_lse_off(const fa_problem *p, int64_t b, int64_t h, int64_t i)
{
    return b * p->lse.stride[0] + h * p->lse.stride[1] + i * p->lse.stride[2];
}

/* ALiBi slope of (batch b, query head h); 0 when ALiBi is off. */
double fa_alibi_slope(const fa_problem *p, int64_t b, int64_t h);

/* KV head read by query head h (GQA/MQA). */
static inline int64_t fa_kv_head(const fa_problem *p, int64_t h)
{
    return h / (p->heads / p->heads_k);
}

/*
 * Visible keys of query row i are the half-open range [*lo, *hi), possibly
 * empty (*lo >= *hi). The band is aligned to the bottom-right corner:
 *   j >= i + Sk - Sq - window_left   (if window_left >= 0)
 *   j <= i + Sk - Sq + window_right  (if window_right >= 0)
 */
static inline void fa_key_range(const fa_problem *p, int64_t i, int64_t *lo, int64_t *hi)
{
    int64_t diag = i + p->seqlen_k - p->seqlen_q;
    int64_t l = 0, h = p->seqlen_k;
    /* Written as comparisons of differences that cannot overflow, so that any
     * window up to INT64_MAX means what it says: diag - 0 and (Sk - 1) - diag =
     * Sq - 1 - i are in range, and each bound is computed only when it binds. */
    if (p->window_left >= 0 && diag > p->window_left) l = diag - p->window_left;
    if (p->window_right >= 0 && p->window_right < h - 1 - diag) h = diag + p->window_right + 1;
    if (h < l) h = l;
    *lo = l;
    *hi = h;
}

/* The score transform after the dot product: scale, softcap, ALiBi (double). */
static inline double fa_score_transform(const fa_problem *p, double dot, double slope,
                                        int64_t i, int64_t j)
{
    double s = p->scale * dot;
    if (p->softcap > 0.0) s = p->softcap * tanh(s / p->softcap);
    if (slope != 0.0) {
        int64_t rel = i + p->seqlen_k - p->seqlen_q - j;
        s -= slope * (double)(rel < 0 ? -rel : rel);
    }
    return s;
}

/* ------------------------------------------------------------------------ */
/* Element conversion                                                        */
/* ------------------------------------------------------------------------ */

static inline float fa_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: normalize */
            int e = -1;
            do { e++; man <<= 1; } while ((man & 0x400u) == 0);
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* Round-to-nearest-even float32 -> float16 (overflow to inf, NaN kept quiet). */
static inline uint16_t fa_f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) /* inf or nan */
        return (uint16_t)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0));
    if (ax >= 0x477ff000u) /* >= 65520 rounds to inf */
        return (uint16_t)(sign | 0x7c00u);
    if (ax < 0x38800000u) { /* below the smallest normal half: subnormal or zero */
        if (ax < 0x33000000u) return (uint16_t)sign; /* < 2^-25 rounds to 0 */
        uint32_t e = ax >> 23;
        uint32_t m = (ax & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - e; /* 14 + (112 - e) + ... bits dropped */
        uint32_t r = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1))) r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = ax - 0x38000000u; /* rebias exponent 127 -> 15 */
    uint32_t lsb = (r >> 13) & 1u;
    r += 0xfffu + lsb;
    return (uint16_t)(sign | (r >> 13));
}

static inline float fa_bf16_to_f32(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline uint16_t fa_f32_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u); /* quiet NaN */
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

/* Load element at offset `off` (elements) of a tensor as double / float. */
static inline double fa_load_f64(const fa_tensor *t, int64_t off)
{
    switch (t->dtype) {
    case FA_F32: return (double)((const float *)t->data)[off];
    case FA_F64: return ((const double *)t->data)[off];
    case FA_F16: return (double)fa_f16_to_f32(((const uint16_t *)t->data)[off]);
    case FA_BF16: return (double)fa_bf16_to_f32(((const uint16_t *)t->data)[off]);
    default: return NAN;
    }
}

static inline float fa_load_f32(const fa_tensor *t, int64_t off)
{
    switch (t->dtype) {
    case FA_F32: return ((const float *)t->data)[off];
    case FA_F64: return (float)((const double *)t->data)[off];
    case FA_F16: return fa_f16_to_f32(((const uint16_t *)t->data)[off]);
    case FA_BF16: return fa_bf16_to_f32(((const uint16_t *)t->data)[off]);
    default: return NAN;
    }
}

static inline void fa_store_f64(const fa_tensor *t, int64_t off, double x)
{
    switch (t->dtype) {
    case FA_F32: ((float *)t->data)[off] = (float)x; break;
    case FA_F64: ((double *)t->data)[off] = x; break;
    case FA_F16: ((uint16_t *)t->data)[off] = fa_f32_to_f16((float)x); break;
    case FA_BF16: ((uint16_t *)t->data)[off] = fa_f32_to_bf16((float)x); break;
    default: break;
    }
}

/*
 * Gather n elements starting at offset `off` with stride `inc` into float32.
 * Fast path for contiguous float32.
 */
void fa_gather_f32(const fa_tensor *t, int64_t off, int64_t inc, int64_t n, float *dst);

/* ------------------------------------------------------------------------ */
/* Errors and memory                                                         */
/* ------------------------------------------------------------------------ */

/* Record a message for fa_last_error() and return `status`. printf-style. */
fa_status fa_fail(fa_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Clear the thread's last error message. */
void fa_clear_error(void);

/* 64-byte aligned, counted allocation (see fa_alloc_stats_get). NULL on failure. */
void *fa_malloc(size_t bytes);
void *fa_calloc(size_t bytes);
void fa_free(void *ptr);

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

/* api.c's argument validation (make_problem), for fa_backward. */
fa_status fa_make_problem(const fa_tensor *q, const fa_tensor *k, const fa_tensor *v,
                          const fa_tensor *o, const fa_tensor *lse, const fa_options *opt,
                          fa_problem *p);

/* Scratch bytes each one will allocate. */
size_t fa_reference_workspace(const fa_problem *p);
size_t fa_standard_workspace(const fa_problem *p);
size_t fa_flash_workspace(const fa_problem *p);

/* Detected caches (cpuinfo.c); cached after the first call. */
void fa_detect_caches(size_t *l1d, size_t *l2, size_t *l3, size_t *line, int *source);

/* Number of OpenMP threads a parallel region gets by default. */
int fa_default_threads(void);

#endif /* FA_INTERNAL_H */
